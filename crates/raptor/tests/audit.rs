//! `raptor audit` end to end on the toy text: the JSON report and `private/audit.json` (white-box
//! canaries by default for a private method, loss canaries on request), and bad input (exit
//! code 2, a message naming the problem, no panic).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn raptor(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_raptor"))
        .args(args)
        .output()
        .unwrap()
}

/// A tiny GPT-2 language model on the toy text, DP-Adam at ε = 4, seeded.
fn config(dir: &Path) -> PathBuf {
    let toy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/toy");
    let text = format!(
        r#"[data]
train = "{}"
validation_fraction = 0.0
max_length = 16

[model]
kind = "gpt2"
tokenizer = "bytes"
d_model = 16
layers = 1
heads = 2
d_ff = 32

[method]
name = "dp-adam"

[privacy]
epsilon = 4.0
delta = 1e-5
accuracy = 0.01

[train]
batch_size = 32.0
steps = 10
lr = 0.01
checkpoint_every = 0
insecure_seed = 3
"#,
        toy.join("train.csv").display()
    );
    let p = dir.join("run.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// The audit file of a run folder: under `private/` (the coins and the scores are not
/// differentially private), marked with the private notice; none at the top of the folder, and
/// the publishable record.json holds neither coins nor scores.
fn private_audit_file(run: &Path) -> serde_json::Value {
    assert!(
        !run.join("audit.json").exists(),
        "audit.json at the top of the run folder"
    );
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("private").join("audit.json")).unwrap())
            .unwrap();
    assert_eq!(file["notice"], raptor_run::PRIVATE_NOTICE);
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("record.json")).unwrap()).unwrap();
    for key in ["coins", "scores", "mia", "epsilon_lower"] {
        assert!(record.get(key).is_none(), "record.json has {key}");
    }
    file
}

#[test]
fn white_box_audit_is_the_default_for_a_private_method() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let runs = dir.path().join("runs");
    let out = raptor(&[
        "audit",
        "--config",
        cfg.to_str().unwrap(),
        "--runs-dir",
        runs.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["kind"], "dirac");
    assert_eq!(r["canaries"], 1000); // the default m
    let d = &r["dirac"];
    assert_eq!(d["plan_records"], 600 + 500);
    assert_eq!(d["index"].as_array().unwrap().len(), 1000);
    // Every canary's coordinate was released by each of the 10 updates.
    assert!(
        d["releases"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n.as_u64() == Some(10))
    );
    let stat = d["statistic"].as_str().unwrap();
    assert_eq!(r["scores"], d[format!("{stat}_scores").as_str()]);
    let q = r["sampling_rate"].as_f64().unwrap();
    assert!((q - 32.0 / 1100.0).abs() < 1e-12, "{q}");
    let lower = r["epsilon_lower"].as_f64().unwrap();
    let upper = r["epsilon_upper"].as_f64().unwrap();
    assert!((0.0..=upper).contains(&lower), "{lower} vs {upper}");
    let run = PathBuf::from(r["run"].as_str().unwrap());
    let file = private_audit_file(&run);
    assert_eq!(file["dirac"], r["dirac"]);
    assert_eq!(file["coins"], r["coins"]);
    // The human-readable report names the statistic.
    let text = raptor(&[
        "audit",
        "--config",
        cfg.to_str().unwrap(),
        "--canaries",
        "200",
        "--runs-dir",
        runs.to_str().unwrap(),
    ]);
    let so = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.status.success(),
        "{}",
        String::from_utf8_lossy(&text.stderr)
    );
    assert!(
        so.contains("white-box canaries") && so.contains("epsilon_lower"),
        "{so}"
    );
}

#[test]
fn audit_json_report_matches_audit_json_file() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let runs = dir.path().join("runs");
    let out = raptor(&[
        "audit",
        "--config",
        cfg.to_str().unwrap(),
        "--canaries",
        "40",
        "--kind",
        "random",
        "--runs-dir",
        runs.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["kind"], "random");
    assert_eq!(r["canaries"], 40);
    assert_eq!(r["coins"].as_array().unwrap().len(), 40);
    assert_eq!(r["scores"].as_array().unwrap().len(), 40);
    let included = r["coins"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c.as_bool().unwrap())
        .count();
    assert_eq!(r["included"], included);
    assert_eq!(r["train_records"], 600 + included);
    assert_eq!(r["delta"], 1e-5);
    let lower = r["epsilon_lower"].as_f64().unwrap();
    let upper = r["epsilon_upper"].as_f64().unwrap();
    assert!((0.0..=upper).contains(&lower), "{lower} vs {upper}");
    assert!(upper <= 4.0 + 1e-9);
    let run = PathBuf::from(r["run"].as_str().unwrap());
    let file = private_audit_file(&run);
    assert_eq!(file["coins"], r["coins"]);
    assert_eq!(file["search"], r["search"]);
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("record.json")).unwrap()).unwrap();
    assert_eq!(record["train_records"], r["train_records"]);
    assert!(
        record["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().starts_with("audit run"))
    );
}

#[test]
fn audit_rejects_bad_input_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let runs = dir.path().join("runs");
    let c = cfg.to_str().unwrap();
    let r = runs.to_str().unwrap();
    for (extra, want) in [
        (&["--confidence", "1.5"][..], "confidence"),
        (&["--kind", "mislabel"][..], "--kind random"),
        (&["--canaries", "1"][..], "at least 2 canaries"),
        (
            &["--kind", "random", "--canaries", "1"][..],
            "at least 2 canaries",
        ),
        (&["--expert", "0"][..], "no expert stream"),
        (&["--kind", "random", "--expert", "0"][..], "--kind dirac"),
        // More canaries than the tiny model has coordinates, yet few enough that the real
        // and canary records together stay below 1/δ (δ = 1e-5: a larger N would be refused
        // for its δ first).
        (&["--canaries", "50000"][..], "coordinates"),
    ] {
        let mut args = vec!["audit", "--config", c, "--runs-dir", r];
        args.extend_from_slice(extra);
        let out = raptor(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
