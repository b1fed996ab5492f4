//! The GPU path: RAPTOR and DP-Adam train on `cuda` with the same privacy as on the CPU. Runs
//! only where libtorch has CUDA and a device is present; elsewhere it prints one line saying it
//! was skipped and why (`scripts/gpu-check.sh` runs it on a GPU machine).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

// The trainer tests' shared helpers (one copy, in raptor-train's tests).
#[path = "../../raptor-train/tests/common/mod.rs"]
mod common;

/// Why the CUDA tests cannot run here, if they cannot.
fn no_cuda() -> Option<String> {
    if !raptor_models::CUDA_LINKED {
        return Some("this build links the CPU-only libtorch (cargo xtask setup --cuda installs the CUDA one)".into());
    }
    if !tch::Cuda::is_available() {
        return Some("libtorch has CUDA but no CUDA device is visible".into());
    }
    None
}

fn train(dir: &Path, method: &str, device: &str) -> serde_json::Value {
    let cfg = dir.join(format!("{method}-{device}.toml").replace(':', "_"));
    let train = format!(
        "batch_size = 64.0\nsteps = 30\nlr = 0.05\nmicro_batch = 64\ninsecure_seed = 5\ndevice = \"{device}\""
    );
    // The toy validation records are synthetic: declared public, their metrics are in the
    // record `--json` prints.
    let text = common::toy_config(method, &train)
        .replace("[data]\n", "[data]\nvalidation_public = true\n");
    std::fs::write(&cfg, text).unwrap();
    let runs = dir.join(format!("runs-{method}-{device}").replace(':', "_"));
    let o = Command::new(env!("CARGO_BIN_EXE_raptor"))
        .args(["train", "--json", "--config"])
        .arg(&cfg)
        .arg("--runs-dir")
        .arg(&runs)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{method} on {device}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn raptor_and_dp_adam_train_on_cuda_like_on_cpu() {
    if let Some(why) = no_cuda() {
        eprintln!("skipped raptor_and_dp_adam_train_on_cuda_like_on_cpu: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for method in ["raptor", "dp-adam"] {
        let gpu = train(dir.path(), method, "cuda");
        let cpu = train(dir.path(), method, "cpu");
        assert_eq!(gpu["device"], "cuda:0");
        assert!(gpu["noise_source"].as_str().unwrap().contains("cuda:0"));
        // The same mechanism: the same ledger, the same certified epsilon.
        assert_eq!(gpu["epsilon"], cpu["epsilon"], "{method}");
        let (ag, ac) = (
            gpu["validation_metrics"]["eval"]["accuracy"]
                .as_f64()
                .unwrap(),
            cpu["validation_metrics"]["eval"]["accuracy"]
                .as_f64()
                .unwrap(),
        );
        // Same data and seeds (the initialization may draw from the device generator): the GPU run
        // learns about as well.
        assert!(
            ag >= ac - 0.15,
            "{method}: accuracy {ag} on cuda, {ac} on cpu"
        );
    }
}
