//! `raptor train` accepts the shared-block families by `model.kind`: RAPTOR on from-scratch
//! Mixtral- and Qwen2-MoE-style classifiers (owner-masked routed experts; the Qwen2-MoE shared
//! expert in the shared stream), DP-Adam on a BERT-style classifier and on a Llama-style
//! language model, a few steps each on the toy data, with a finite certified ε.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("raptor-cli-families-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn config(dir: &Path, kind: &str, method: &str) -> PathBuf {
    let toy = root().join("examples/toy");
    let text = format!(
        r#"[data]
train = "{train}"
validation = "{valid}"
public = "{public}"
max_length = 40

[model]
kind = "{kind}"
tokenizer = "bytes"
d_model = 16
layers = 2
heads = 2
d_ff = 32
experts = 4

[method]
name = "{method}"

[privacy]
epsilon = 8.0

[train]
batch_size = 32.0
steps = 3
lr = 0.05
micro_batch = 32
insecure_seed = 5
"#,
        train = toy.join("train.csv").display(),
        valid = toy.join("valid.csv").display(),
        public = toy.join("public.csv").display(),
    );
    let p = dir.join(format!("{kind}-{method}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn new_families_train_privately_from_a_config() {
    let d = tmp("train");
    for (kind, method) in [
        ("mixtral", "raptor"),
        ("qwen2-moe", "raptor"),
        ("bert", "dp-adam"),
        ("llama", "dp-adam"),
    ] {
        let cfg = config(&d, kind, method);
        let runs = d.join(format!("{kind}-{method}"));
        let out = Command::new(env!("CARGO_BIN_EXE_raptor"))
            .args(["train", "--config"])
            .arg(&cfg)
            .arg("--runs-dir")
            .arg(&runs)
            .arg("--json")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{kind} / {method}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rec: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let e = rec["epsilon"]["upper"].as_f64().unwrap();
        assert!(e.is_finite() && e <= 8.0, "{kind}: epsilon {e}");
    }
    std::fs::remove_dir_all(&d).ok();
}
