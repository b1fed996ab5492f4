//! Faults that lose nothing: a full disk while checkpointing or while writing the ledger is a
//! clear error, the previous checkpoint stays intact and valid, the ledger is never behind the
//! applied updates, and the run resumes once there is space again.
//!
//! The full disk is real: the temporary file the next write goes to is a symbolic link to
//! `/dev/full`, where every write fails with ENOSPC ("No space left on device"), as it would on
//! a full file system (no mount or privileges needed).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use raptor_train::config::RunConfig;
use raptor_train::run::{read_checked_json, train_in};

mod common;

fn cfg(steps: u64) -> RunConfig {
    let train = format!(
        "batch_size = 64.0\nsteps = {steps}\nlr = 0.05\nmicro_batch = 64\ncheckpoint_every = 5\ninsecure_seed = 2"
    );
    RunConfig::from_toml(&common::toy_config("dp-adam", &train)).unwrap()
}

fn full_disk_at(path: &Path) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink("/dev/full", path).unwrap();
}

fn train(
    cfg: &RunConfig,
    dir: &Path,
) -> raptor_train::Result<(PathBuf, raptor_train::run::Record)> {
    let mut quiet = |_: u64, _: u64, _: &raptor_train::trainer::UpdateMetrics, _: Option<f64>| {};
    train_in(cfg, dir, &mut quiet, None)
}

#[test]
fn a_full_disk_while_checkpointing_keeps_the_previous_checkpoint() {
    let d = tempfile::tempdir().unwrap();
    let run = d.path().join("run");
    let cfg = cfg(10);
    // The checkpoint at update 5 is written; the one at update 10 hits a full disk.
    full_disk_at(&run.join("checkpoint/trainable-10.safetensors.tmp"));
    let err = train(&cfg, &run).unwrap_err().to_string();
    assert!(
        err.contains("trainable-10.safetensors.tmp") && err.contains("No space left"),
        "{err}"
    );
    let state: serde_json::Value = read_checked_json(&run.join("checkpoint/state.json")).unwrap();
    assert_eq!(state["update"].as_u64(), Some(5), "{state}");
    // The previous checkpoint's tensors are intact (their checksums verify).
    assert!(raptor_train::run::checkpoint_tensors(&run).is_ok());
    // The ledger was charged for all 10 updates before they were applied: never behind.
    let ledger: raptor_accountant::Ledger =
        read_checked_json(&run.join("checkpoint/ledger.json")).unwrap();
    assert_eq!(ledger.len(), 10);
    assert!(!run.join("record.json").exists());
    // Space again: the run resumes from update 5 and finishes, counting ε at least as much.
    std::fs::remove_file(run.join("checkpoint/trainable-10.safetensors.tmp")).unwrap();
    let (_, rec) = train(&cfg, &run).unwrap();
    assert_eq!(rec.updates, 10);
    assert_eq!(rec.resumed, 1);
    assert!(rec.epsilon.unwrap().steps >= 10);
}

#[test]
fn a_full_disk_while_charging_the_ledger_stops_before_the_update() {
    let d = tempfile::tempdir().unwrap();
    let run = d.path().join("run");
    let cfg = cfg(10);
    full_disk_at(&run.join("checkpoint/ledger.json.tmp"));
    let err = train(&cfg, &run).unwrap_err().to_string();
    assert!(
        err.contains("ledger.json.tmp") && err.contains("No space left"),
        "{err}"
    );
    // The first release could not be recorded, so no update was applied and nothing claims
    // otherwise: no checkpoint, no ledger, no record.
    assert!(!run.join("checkpoint/state.json").exists());
    assert!(!run.join("checkpoint/ledger.json").exists());
    assert!(!run.join("record.json").exists());
}
