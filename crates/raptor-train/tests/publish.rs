//! What a run folder may publish: the model, `record.json` and ε; everything computed from
//! private records without noise lives under `private/`, and the record says where the label
//! set and the validation metrics come from.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use raptor_run::PRIVATE_NOTICE;
use raptor_train::config::RunConfig;

mod common;

fn cfg(extra_data: &str) -> RunConfig {
    let text = common::toy_config(
        "dp-adam-lora",
        "batch_size = 32.0\nsteps = 3\nmicro_batch = 32\ninsecure_seed = 2",
    )
    .replace("[data]\n", &format!("[data]\n{extra_data}\n"));
    RunConfig::from_toml(&text).unwrap()
}

fn train(cfg: &RunConfig, dir: &Path) -> raptor_run::Result<(PathBuf, raptor_run::Record)> {
    common::train_quietly(cfg, dir)
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Declared labels: the head follows the declared order, the record says they were declared,
/// and private values go to `private/` only.
#[test]
fn declared_labels_and_the_private_folder() {
    let d = tempfile::tempdir().unwrap();
    let run = d.path().join("run");
    // Declared in the reverse of the order the training file shows them.
    let (_, rec) = train(&cfg(r#"labels = ["positive", "negative"]"#), &run).unwrap();
    assert_eq!(
        rec.labels.as_deref(),
        Some(&["positive".to_string(), "negative".to_string()][..])
    );
    assert_eq!(
        rec.labels_source.as_deref(),
        Some("declared in the config (data.labels)")
    );
    assert!(!rec.notes.iter().any(|n| n.contains("label set")));
    let labels: Vec<String> =
        serde_json::from_slice(&std::fs::read(run.join("labels.json")).unwrap()).unwrap();
    assert_eq!(labels, ["positive", "negative"]);
    // record.json holds nothing computed from private records without noise.
    let public = json(&run.join("record.json"));
    for key in ["metrics", "membership_inference", "diagnostics", "private"] {
        assert!(public.get(key).is_none(), "record.json has {key}");
    }
    assert!(public["epsilon"]["upper"].as_f64().unwrap() <= 8.0);
    assert!(
        public["validation"]["source"]
            .as_str()
            .unwrap()
            .contains("valid.csv")
    );
    // The validation file is not declared public: its metrics are private.
    assert_eq!(public["validation"]["public"], false);
    assert!(public.get("validation_metrics").is_none());
    // private/ has them, each file marked.
    let private = json(&run.join("private").join("record.json"));
    assert_eq!(private["notice"], PRIVATE_NOTICE);
    assert_eq!(private["metrics"].as_array().unwrap().len(), 3);
    assert!(private.get("membership_inference").is_some());
    assert_eq!(
        std::fs::read_to_string(run.join("private").join("metrics.jsonl"))
            .unwrap()
            .lines()
            .count(),
        3
    );
    // Nothing private sits at the top of the run folder.
    let top: Vec<String> = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert!(!top.iter().any(|n| n == "metrics.jsonl"), "{top:?}");
    // The in-memory record carries the private part apart from what is published.
    assert_eq!(rec.private.metrics.len(), 3);
}

/// Labels read from the private training file: the run notes it and the record says so.
#[test]
fn labels_read_from_private_data_are_announced() {
    let d = tempfile::tempdir().unwrap();
    let (_, rec) = train(&cfg(""), &d.path().join("run")).unwrap();
    assert!(
        rec.labels_source
            .as_deref()
            .unwrap()
            .starts_with("read from the private training file"),
        "{:?}",
        rec.labels_source
    );
    assert!(
        rec.notes
            .iter()
            .any(|n| n.contains("label set was read from the private training file")),
        "{:?}",
        rec.notes
    );
}

/// A training record whose label is not declared is a clear error, before anything trains.
#[test]
fn an_undeclared_label_is_an_error() {
    let d = tempfile::tempdir().unwrap();
    let err = train(
        &cfg(r#"labels = ["positive", "neutral"]"#),
        &d.path().join("run"),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("negative"), "{err}");
    // Fewer than two declared labels is refused too.
    let err = train(&cfg(r#"labels = ["positive"]"#), &d.path().join("run2"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("label"), "{err}");
}

/// `train.clip_from_public`: the bounds come from the labelled public file and are recorded
/// in the privacy plan; a public file without the label column is a clear error.
#[test]
fn clip_bounds_from_public_data_are_recorded() {
    let d = tempfile::tempdir().unwrap();
    let labelled = common::root().join("examples/toy/test.csv");
    let mut c = cfg("");
    c.data.public = Some(labelled);
    c.train.clip_from_public = Some(0.5);
    let (_, rec) = train(&c, &d.path().join("run")).unwrap();
    let pc = rec.privacy_plan.public_clip.as_ref().unwrap();
    assert_eq!(pc.quantile, 0.5);
    assert_eq!(pc.records, 200);
    assert!(!pc.bounds.is_empty());
    assert!(pc.bounds.iter().all(|b| b.2 > 0.0 && b.2.is_finite()));
    // The toy public file has no label column.
    let mut c = cfg("");
    c.train.clip_from_public = Some(0.5);
    let err = train(&c, &d.path().join("run2")).unwrap_err().to_string();
    assert!(err.contains("label"), "{err}");
}

/// Trains the toy run `cfg` in `dir`, stopping after `at` updates (checkpoint written).
fn train_until(cfg: &RunConfig, dir: &Path, at: u64) {
    let stop: raptor_run::StopFlag = Default::default();
    let flag = stop.clone();
    let mut progress =
        |done: u64, _: u64, _: &raptor_train::trainer::UpdateMetrics, _: Option<f64>| {
            if done >= at {
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        };
    let err = raptor_run::train_in(cfg, dir, &mut progress, Some(stop))
        .unwrap_err()
        .to_string();
    assert!(err.contains(&format!("stopped at update {at}")), "{err}");
}

fn resume(dir: &Path) -> raptor_run::Result<(PathBuf, raptor_run::Record)> {
    let mut quiet = |_: u64, _: u64, _: &raptor_train::trainer::UpdateMetrics, _: Option<f64>| {};
    raptor_run::train(
        &RunConfig::default(),
        dir.parent().unwrap(),
        Some(dir),
        &mut quiet,
        None,
    )
}

/// A resume whose ledger is missing or shorter than the checkpoint's updates is refused,
/// naming the ledger file (it would report ε for the updates after the resume only); with the
/// ledger intact the run resumes and certifies every update.
#[test]
fn a_resume_without_the_whole_ledger_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let c = RunConfig::from_toml(&common::toy_config(
        "dp-adam-lora",
        "batch_size = 32.0\nsteps = 4\nmicro_batch = 32\ninsecure_seed = 2\ncheckpoint_every = 1",
    ))
    .unwrap();
    let run = d.path().join("run");
    train_until(&c, &run, 2);
    let ledger = run.join("checkpoint").join("ledger.json");
    let kept = std::fs::read(&ledger).unwrap();
    // Missing.
    std::fs::remove_file(&ledger).unwrap();
    let err = resume(&run).unwrap_err().to_string();
    assert!(
        err.contains("ledger.json") && err.contains("is missing") && err.contains("update 2"),
        "{err}"
    );
    // Short: the ledger of one update (a valid checked file, as the loop writes it).
    let mut short = raptor_accountant::Ledger::new();
    short
        .charge(&raptor_accountant::SampleCharge::single(
            raptor_accountant::SubsampledGaussian::new(0.05, 1.0).unwrap(),
        ))
        .unwrap();
    raptor_run::write_checked_json(&ledger, &short).unwrap();
    let err = resume(&run).unwrap_err().to_string();
    assert!(
        err.contains("ledger.json") && err.contains("holds 1 charged steps"),
        "{err}"
    );
    // Intact: resumes, and the ledger covers all four updates.
    std::fs::write(&ledger, kept).unwrap();
    let (_, rec) = resume(&run).unwrap();
    assert_eq!(rec.updates, 4);
    assert_eq!(rec.epsilon.as_ref().unwrap().steps, 4);
}

/// A δ at or above 1/N is refused with the reason unless `privacy.allow_large_delta`, and then
/// the privacy plan records it; a public validation needs a validation file.
#[test]
fn a_large_delta_is_refused_unless_allowed_and_recorded() {
    let d = tempfile::tempdir().unwrap();
    let mut c = cfg("");
    // The toy training file has 600 records: 1/N ≈ 1.7e-3.
    c.privacy.delta = Some(0.01);
    let err = train(&c, &d.path().join("refused"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("privacy.delta")
            && err.contains("outright")
            && err.contains("allow_large_delta"),
        "{err}"
    );
    c.privacy.allow_large_delta = true;
    let (_, rec) = train(&c, &d.path().join("allowed")).unwrap();
    assert_eq!(rec.privacy_plan.delta, 0.01);
    assert!(
        rec.privacy_plan.delta_reason.contains("allow_large_delta"),
        "{}",
        rec.privacy_plan.delta_reason
    );
    // A δ below 1/N needs no key.
    let mut c = cfg("");
    c.privacy.delta = Some(1e-4);
    let (_, rec) = train(&c, &d.path().join("small")).unwrap();
    assert_eq!(
        rec.privacy_plan.delta_reason,
        "given in the config (privacy.delta)"
    );
    // Held-out validation records cannot be declared public.
    let mut c = cfg("");
    c.data.validation = None;
    c.data.validation_public = true;
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("data.validation_public"), "{err}");
}
