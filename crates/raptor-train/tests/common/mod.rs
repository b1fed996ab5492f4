//! Shared by the integration tests: a run config over the toy data shipped in `examples/toy`
//! (a tiny Switch encoder trained from scratch with the bytes tokenizer).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The TOML of a toy run of `method` at ε = 8 whose `[train]` table holds `train_lines`.
pub fn toy_config(method: &str, train_lines: &str) -> String {
    let toy = root().join("examples/toy");
    format!(
        r#"[data]
train = "{}"
validation = "{}"
public = "{}"
max_length = 40

[model]
kind = "switch"
tokenizer = "bytes"
d_model = 32
layers = 4
heads = 2
d_ff = 64
experts = 4

[method]
name = "{method}"

[privacy]
epsilon = 8.0

[train]
{train_lines}
"#,
        toy.join("train.csv").display(),
        toy.join("valid.csv").display(),
        toy.join("public.csv").display()
    )
}

/// Trains `cfg` into the run folder `dir` in this process, printing nothing.
pub fn train_quietly(
    cfg: &raptor_train::config::RunConfig,
    dir: &Path,
) -> raptor_train::Result<(PathBuf, raptor_train::run::Record)> {
    let mut quiet = |_: u64, _: u64, _: &raptor_train::trainer::UpdateMetrics, _: Option<f64>| {};
    raptor_train::run::train_in(cfg, dir, &mut quiet, None)
}
