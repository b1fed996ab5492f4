//! A real pretrained model fine-tuned privately end to end: SmolLM2-135M-Instruct (GGUF Q4_1,
//! dequantized to f32) named by `model.path = "smollm2-135m-instruct"`, its own tokenizer
//! (`model.tokenizer = "gguf"`), two DP-Adam updates on LoRA adapters over E2E records; the run
//! spends at most its ε and every loss is finite. The pretrained model already knows English,
//! so its held-out NLL starts far below a random model's (ln 49152 ≈ 10.8).
//!
//! Needs the model in the cache (`cargo xtask setup --models`) and the E2E files
//! (`../shared/data/e2e` beside the checkout, or `$RAPTOR_E2E_DIR`); prints one line saying it
//! was skipped otherwise.
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

#[test]
fn smollm2_trains_privately_on_e2e() {
    let model = raptor_run::session::gguf_model_file(Path::new("smollm2-135m-instruct"));
    let (Some(file), Some(_)) = (e2e_file(), model.as_ref()) else {
        eprintln!(
            "skipped smollm2_trains_privately_on_e2e: needs SmolLM2-135M-Instruct in <cache>/models (cargo xtask setup --models) and the E2E data (../shared/data/e2e or RAPTOR_E2E_DIR)"
        );
        return;
    };
    let c = RunConfig::from_toml(&format!(
        r#"[data]
format = "e2e"
train = "{}"
validation_fraction = 0.002
max_length = 48
[model]
kind = "llama"
path = "smollm2-135m-instruct"
tokenizer = "gguf"
[method]
name = "dp-adam"
scope = "lora"
[privacy]
epsilon = 8.0
[train]
batch_size = 4.0
steps = 2
lr = 0.001
clip = 1.0
micro_batch = 8
insecure_seed = 3
checkpoint_every = 0
[eval]
beams = 1
max_new_tokens = 4
max_sources = 1
"#,
        file.display()
    ))
    .unwrap();
    let s = raptor_run::session::prepare(&c).unwrap();
    assert_eq!(s.model.vocab_size(), 49152);
    // The file's EOS (<|im_end|>) ends every record.
    assert!(s.train.iter().all(|e| e.tokens.last() == Some(&2)));
    drop(s);
    let dir = tempfile::tempdir().unwrap();
    let t = std::time::Instant::now();
    let mut quiet = |_: u64, _: u64, m: &raptor_train::trainer::UpdateMetrics, _: Option<f64>| {
        assert!(m.loss.is_finite() || m.sampled == 0);
    };
    let (_, rec) = raptor_run::train_in(&c, dir.path(), &mut quiet, None).unwrap();
    let eps = rec.epsilon.as_ref().unwrap();
    assert!(
        eps.upper.is_finite() && eps.upper <= 8.0 * (1.0 + 1e-9),
        "eps {}",
        eps.upper
    );
    let nll = rec.eval().unwrap().loss;
    assert!(nll.is_finite() && nll < 6.0, "held-out NLL {nll}");
    eprintln!(
        "smollm2 e2e: 2 DP-Adam LoRA updates + eval in {:.1} s, eps {:.3}, held-out NLL {nll:.3}",
        t.elapsed().as_secs_f64(),
        eps.upper
    );
}
