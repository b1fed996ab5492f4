//! Faults that lose nothing: a full disk while checkpointing or while writing the ledger is a
//! clear error, the previous checkpoint stays intact and valid, the ledger is never behind the
//! applied updates, and the run resumes once there is space again.
//!
//! The full disk is real: the temporary file the next write goes to is a symbolic link to
//! `/dev/full`, where every write fails with ENOSPC ("No space left on device"), as it would on
//! a full file system (no mount or privileges needed). A read-only run folder is read-only for
//! the child `raptor` even when the tests run as root: it runs without the capabilities that
//! override file permissions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use raptor_run::{read_checked_json, train_in};
use raptor_train::config::RunConfig;

// The trainer tests' shared helpers (one copy, in raptor-train's tests).
#[path = "../../raptor-train/tests/common/mod.rs"]
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

fn train(cfg: &RunConfig, dir: &Path) -> raptor_run::Result<(PathBuf, raptor_run::Record)> {
    common::train_quietly(cfg, dir)
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
    assert!(raptor_run::checkpoint_tensors(&run).is_ok());
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

/// `raptor` run with the capabilities that override file permissions dropped from its bounding
/// set (`CAP_DAC_OVERRIDE`, `CAP_DAC_READ_SEARCH`, `CAP_FOWNER`), so that a read-only folder is
/// read-only for it even when the tests run as root. A process that does not hold them (not
/// root) cannot drop them (EPERM) and needs not.
fn raptor_without_permission_overrides(program: &str, args: &[&str]) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    // linux/capability.h
    const CAP_DAC_OVERRIDE: libc::c_ulong = 1;
    const CAP_DAC_READ_SEARCH: libc::c_ulong = 2;
    const CAP_FOWNER: libc::c_ulong = 3;
    let mut cmd = std::process::Command::new(program);
    cmd.args(args);
    // SAFETY: the closure only calls prctl(2), which is async-signal-safe, and touches no
    // memory shared with the parent.
    unsafe {
        cmd.pre_exec(|| {
            for cap in [CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER] {
                if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                    let e = std::io::Error::last_os_error();
                    if e.raw_os_error() != Some(libc::EPERM) {
                        return Err(e);
                    }
                }
            }
            Ok(())
        });
    }
    cmd.output().unwrap()
}

/// Sets the permissions of `dir` and of everything under it (folders `dir_mode`, files
/// `file_mode`).
fn chmod_tree(dir: &Path, dir_mode: u32, file_mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            chmod_tree(&p, dir_mode, file_mode);
        } else {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(file_mode)).unwrap();
        }
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(dir_mode)).unwrap();
}

/// Every file of the checkpoint folder, by name.
fn checkpoint_bytes(run: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(run.join("checkpoint"))
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_read_only_run_folder_is_a_clear_error_and_loses_nothing() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let d = tempfile::tempdir().unwrap();
    let run = d.path().join("run");
    let cfg = cfg(10);
    // A run stopped after update 4 (as SIGINT would stop it): checkpoint and ledger written.
    let stop: raptor_run::StopFlag = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let mut progress =
        move |done: u64, _: u64, _: &raptor_train::trainer::UpdateMetrics, _: Option<f64>| {
            // `done`: updates applied so far (the stop is seen before the next one).
            if done >= 4 {
                flag.store(true, Ordering::SeqCst);
            }
        };
    let err = train_in(&cfg, &run, &mut progress, Some(stop))
        .unwrap_err()
        .to_string();
    assert!(err.contains("stopped at update"), "{err}");
    let before = checkpoint_bytes(&run);
    // The interrupted run's record (an interrupted run writes one, saying where it stopped).
    let record_before = std::fs::read(run.join("record.json")).unwrap();
    let state: serde_json::Value = read_checked_json(&run.join("checkpoint/state.json")).unwrap();
    let applied = state["update"].as_u64().unwrap();
    assert!((4..10).contains(&applied), "{state}");
    let resume = ["train", "--resume", run.to_str().unwrap()];
    let bin = env!("CARGO_BIN_EXE_raptor");

    // 1. The whole run folder read-only: refused before anything is read or written.
    chmod_tree(&run, 0o555, 0o444);
    // The child really cannot write there (else this test would prove nothing).
    let probe = raptor_without_permission_overrides(
        "/bin/sh",
        &["-c", &format!("echo x > '{}/probe'", run.display())],
    );
    assert!(
        !probe.status.success(),
        "a child without CAP_DAC_OVERRIDE could still write into a 0555 folder"
    );
    let out = raptor_without_permission_overrides(bin, &resume);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&run.display().to_string()) && stderr.contains("ermission denied"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(checkpoint_bytes(&run), before);

    // 2. Only the checkpoint folder read-only (the lock and the metrics can be written): the
    //    first release cannot be charged to the ledger, so no update is applied.
    chmod_tree(&run, 0o755, 0o644);
    chmod_tree(&run.join("checkpoint"), 0o555, 0o444);
    let out = raptor_without_permission_overrides(bin, &resume);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("ledger.json") && stderr.contains("ermission denied"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    // The previous checkpoint is intact, byte for byte, and the ledger is not behind it.
    assert_eq!(checkpoint_bytes(&run), before);
    assert!(raptor_run::checkpoint_tensors(&run).is_ok());
    let ledger: raptor_accountant::Ledger =
        read_checked_json(&run.join("checkpoint/ledger.json")).unwrap();
    assert!(ledger.len() >= applied, "{} < {applied}", ledger.len());
    // Nothing was finished: the interrupted run's record is untouched.
    assert_eq!(
        std::fs::read(run.join("record.json")).unwrap(),
        record_before
    );

    // 3. Writable again: the run resumes and finishes, counting ε at least as much.
    chmod_tree(&run, 0o755, 0o644);
    let out = raptor_without_permission_overrides(
        bin,
        &["train", "--resume", run.to_str().unwrap(), "--json"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rec["updates"].as_u64(), Some(10));
    assert_eq!(rec["resumed"].as_u64(), Some(1));
    assert!(rec["epsilon"]["steps"].as_u64().unwrap() >= 10);
}
