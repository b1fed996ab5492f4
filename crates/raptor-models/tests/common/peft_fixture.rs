//! The model state of the PEFT export fixture (`fixtures/peft/`): a tiny BERT read from the
//! committed base checkpoint `fixtures/peft/base/` (written by `fixtures/peft/generate.py`),
//! LoRA (r 4, α 8: scale 2) on the attention of its upper layer, and adapters and a 3-way
//! head set to fixed values by a formula (no random generator, so the example that writes
//! the fixture's exports and the test that checks them build the same model). Shared by
//! `examples/peft_fixture.rs` and `tests/peft_export.rs`.
#![allow(dead_code)]

use raptor_models::checkpoint::{LoadOptions, load_bert};
use raptor_models::{
    Bert, BertPooling, LoraConfig, Model, Result, attach_lora, freeze_all, set_trainable,
};
use std::path::Path;
use tch::{Device, Kind, Tensor};

/// Classes of the fixture's head.
pub const LABELS: i64 = 3;

/// The cases: a folder name under `fixtures/peft/` and the classifier's pooling.
pub const CASES: [(&str, BertPooling); 2] =
    [("mean", BertPooling::Mean), ("pooler", BertPooling::Pooler)];

/// What the exported adapter names as its base (`base_model_name_or_path`).
pub const BASE_NAME: &str = "fixtures/peft/base";

/// Fixed values for a tensor of `shape`: `amp · sin(0.37·k + phase)` over its elements in
/// row-major order.
fn fixed(shape: &[i64], amp: f64, phase: f64) -> Tensor {
    let n: i64 = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|k| (amp * (0.37 * k as f64 + phase).sin()) as f32)
        .collect();
    Tensor::from_slice(&v).reshape(shape)
}

/// The fixture's model: the base checkpoint of `base`, adapters on `layer.1.attention` (query,
/// key, value, output.dense), the head trainable (as a LoRA run leaves it), every adapter
/// factor and the head set by [`fixed`].
pub fn build(base: &Path, pooling: BertPooling) -> Result<Bert> {
    let mut m = load_bert(base, LABELS, pooling, Device::Cpu, &LoadOptions::strict())?.model;
    freeze_all(&m)?;
    attach_lora(
        &mut m,
        &LoraConfig {
            r: 4,
            alpha: 8.0,
            dropout: 0.05,
            targets: vec!["layer.1.attention".into()],
        },
    )?;
    set_trainable(&m, &["classifier"], true)?;
    let mut vars: Vec<(String, Tensor)> = m.var_store().variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    tch::no_grad(|| -> Result<()> {
        for (i, (name, t)) in vars.iter().enumerate() {
            let amp = if name.contains("lora_") {
                0.3
            } else if name.starts_with("classifier") {
                0.8
            } else {
                continue;
            };
            let mut t = t.shallow_clone();
            let v = fixed(&t.size(), amp, 0.5 * i as f64).to_kind(Kind::Float);
            t.f_copy_(&v)?;
        }
        Ok(())
    })?;
    Ok(m)
}
