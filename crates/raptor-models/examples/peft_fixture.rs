//! Writes the exports of the PEFT fixture: for each case of `tests/common/peft_fixture.rs`,
//! `<fixtures>/peft/<case>/adapter/` (a PEFT adapter folder) and `<fixtures>/peft/<case>/merged/`
//! (the merged Hugging Face folder). Run by `fixtures/peft/generate.py`, which then loads both
//! with PEFT and transformers and writes the golden logits:
//!
//! ```sh
//! cargo run -p raptor-models --example peft_fixture -- fixtures/peft
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/peft_fixture.rs"]
mod peft_fixture;

use raptor_models::peft::{ExportOptions, save_adapter, save_merged};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(
        std::env::args()
            .nth(1)
            .ok_or("usage: peft_fixture <fixtures/peft folder>")?,
    );
    let base = root.join("base");
    for (case, pooling) in peft_fixture::CASES {
        let opts = ExportOptions {
            base_model: peft_fixture::BASE_NAME.into(),
            pooling: Some(pooling),
            tokenizer_from: None,
        };
        let mut m = peft_fixture::build(&base, pooling)?;
        let out = root.join(case);
        let report = save_adapter(&mut m, out.join("adapter"), &opts)?;
        let merged = save_merged(&mut m, out.join("merged"), &[], &opts)?;
        println!(
            "{case}: adapter of {} tensors ({} modules adapted, {:?} saved whole), {} merged",
            report.tensors.len(),
            report.target_modules.len(),
            report.modules_to_save,
            merged.len()
        );
    }
    Ok(())
}
