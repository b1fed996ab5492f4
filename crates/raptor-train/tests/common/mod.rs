//! Shared by the integration tests: the toy run (a tiny Switch encoder from scratch with the
//! bytes tokenizer over `examples/toy`, from `raptor_testkit::toy`) and an in-process trainer.
#![allow(dead_code, unused_imports)]

use std::path::{Path, PathBuf};

pub use raptor_testkit::paths::workspace_root as root;
pub use raptor_testkit::toy::toy_config;

/// Trains `cfg` into the run folder `dir` in this process, printing nothing.
pub fn train_quietly(
    cfg: &raptor_train::config::RunConfig,
    dir: &Path,
) -> raptor_run::Result<(PathBuf, raptor_run::Record)> {
    let mut quiet = |_: u64, _: u64, _: &raptor_train::trainer::UpdateMetrics, _: Option<f64>| {};
    raptor_run::train_in(cfg, dir, &mut quiet, None)
}
