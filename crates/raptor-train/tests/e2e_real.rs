//! The DP-Muon family on the real E2E NLG data: a small GPT-2-style decoder trained for a few
//! dozen updates on the E2E development set (loss on the reference tokens only) lowers the
//! held-out NLL for every method (DP-SGD, DP-Adam, DP-Muon, DP-MuonBC and the non-private
//! Muon and Adam), and every private run spends at most its ε.
//!
//! The E2E files are not in the repository: the test reads `../shared/data/e2e/` beside the
//! checkout (or `$RAPTOR_E2E_DIR`) and prints one line saying it was skipped when neither exists.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use raptor_train::config::RunConfig;

fn e2e_file() -> Option<PathBuf> {
    let dir = std::env::var_os("RAPTOR_E2E_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/e2e"));
    let f = dir.join("devel-fixed.no-ol.csv");
    f.exists().then_some(f)
}

fn cfg(file: &Path, method: &str) -> RunConfig {
    let lr = if method == "dp-sgd" { 0.5 } else { 0.003 };
    RunConfig::from_toml(&format!(
        r#"[data]
format = "e2e"
train = "{}"
validation_fraction = 0.05
max_length = 120
[model]
kind = "gpt2"
tokenizer = "bytes"
d_model = 32
layers = 2
heads = 2
d_ff = 64
[method]
name = "{method}"
scope = "full"
[privacy]
epsilon = 8.0
[train]
batch_size = 64.0
steps = 40
lr = {lr}
clip = 1.0
micro_batch = 64
insecure_seed = 4
[eval]
beams = 1
max_new_tokens = 20
max_sources = 3
"#,
        file.display()
    ))
    .unwrap()
}

#[test]
fn every_method_lowers_the_eval_nll_on_real_e2e() {
    let Some(file) = e2e_file() else {
        eprintln!(
            "skipped every_method_lowers_the_eval_nll_on_real_e2e: no E2E data (../shared/data/e2e beside the checkout, or RAPTOR_E2E_DIR)"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for method in ["dp-sgd", "dp-adam", "dp-muon", "dp-muonbc", "muon", "adam"] {
        let c = cfg(&file, method);
        // The untrained model's NLL on the same validation records (same seed, same init).
        let s = raptor_run::session::prepare(&c).unwrap();
        assert!(
            s.train.len() > 1000,
            "E2E dev has thousands of (mr, ref) pairs"
        );
        let before = raptor_train::trainer::evaluate(
            s.model.as_ref(),
            &s.validation,
            64,
            s.pad_id,
            s.device,
        )
        .unwrap()
        .loss;
        drop(s);
        let mut quiet =
            |_: u64, _: u64, _: &raptor_train::trainer::UpdateMetrics, _: Option<f64>| {};
        let (_, rec) =
            raptor_run::train_in(&c, &dir.path().join(method), &mut quiet, None).unwrap();
        let after = rec.eval().unwrap().loss;
        assert!(
            after < before - 0.05,
            "{method}: eval NLL {before:.4} -> {after:.4}"
        );
        if let Some(e) = &rec.epsilon {
            assert!(e.upper <= 8.0 * (1.0 + 1e-9), "{method}: eps {}", e.upper);
        }
        let g = rec.generation().unwrap();
        assert!(g.sources > 0 && g.bleu.is_finite() && g.rouge_l.is_finite());
    }
}
