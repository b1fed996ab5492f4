//! A LoRA model leaves raptor in the forms Hugging Face tools read, checked against them:
//! `fixtures/peft/golden.json` holds the logits that HF PEFT (the adapter folder loaded onto the
//! base checkpoint, and PEFT's own merge of it) and transformers (the merged folder) computed
//! from the exports committed under `fixtures/peft/<case>/` (written by
//! `examples/peft_fixture.rs`, the model of `tests/common/peft_fixture.rs`; script
//! `fixtures/peft/generate.py`). Here raptor's own forward pass must give those logits, and a
//! fresh export of the same model must equal the committed one, so what PEFT loaded is what
//! raptor writes today.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/peft_fixture.rs"]
mod peft_fixture;

use raptor_models::checkpoint::{LoadOptions, load_bert, read_safetensors};
use raptor_models::peft::{
    ADAPTER_CONFIG, ADAPTER_WEIGHTS, CARD, ExportOptions, PEFT_PREFIX, merge_lora, save_adapter,
    save_merged,
};
use raptor_models::{Batch, Bert, BertPooling, ForwardCtx, Model};
use raptor_testkit::{golden, paths::fixture};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use tch::{Device, Kind, Tensor};

/// Raptor against PEFT / transformers (f32 on different kernels).
const TOL: f64 = 2e-5;

fn batch(g: &Value) -> Batch {
    let rows = |k: &str| -> Tensor {
        let v: Vec<Vec<i64>> = serde_json::from_value(g["batch"][k].clone()).unwrap();
        let (b, t) = (v.len() as i64, v[0].len() as i64);
        Tensor::from_slice(&v.concat()).reshape([b, t])
    };
    Batch {
        input_ids: rows("input_ids"),
        attention_mask: rows("attention_mask"),
        labels: None,
        loss_mask: None,
    }
}

fn logits(m: &Bert, b: &Batch) -> Tensor {
    let mut ctx = ForwardCtx::new(false);
    tch::no_grad(|| m.forward(b, &mut ctx).unwrap())
}

fn golden_logits(g: &Value, case: &str, which: &str) -> Tensor {
    let v = &g[case][which];
    let shape: Vec<i64> = serde_json::from_value(v["shape"].clone()).unwrap();
    let data: Vec<f64> = serde_json::from_value(v["data"].clone()).unwrap();
    Tensor::from_slice(&data).reshape(shape)
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

fn tensors(path: &Path) -> BTreeMap<String, Tensor> {
    read_safetensors(path).unwrap().into_iter().collect()
}

/// Same names, shapes and values (to `tol`) in two safetensors files.
fn same_tensors(fresh: &Path, committed: &Path, tol: f64) {
    let (a, b) = (tensors(fresh), tensors(committed));
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "{} and {} hold other tensors",
        fresh.display(),
        committed.display()
    );
    for (n, t) in &a {
        let d = max_diff(t, &b[n]);
        assert!(
            d <= tol,
            "{n}: {} differs from the committed file by {d:e}",
            fresh.display()
        );
    }
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn opts(pooling: BertPooling) -> ExportOptions {
    ExportOptions {
        base_model: peft_fixture::BASE_NAME.into(),
        pooling: Some(pooling),
        tokenizer_from: None,
    }
}

/// Both forms of both poolings: raptor's logits are PEFT's and transformers', before and after
/// the merge; the adapter changes the logits (so the comparison can fail); a fresh export equals
/// the committed one; raptor reads its merged folder back to the same logits.
#[test]
fn exports_load_in_peft_and_transformers_to_raptors_logits() {
    let g = golden::json("peft/golden.json");
    let b = batch(&g);
    let base = fixture("peft/base");
    for (case, pooling) in peft_fixture::CASES {
        let committed = fixture("peft").join(case);
        let mut m = peft_fixture::build(&base, pooling).unwrap();
        let ours = logits(&m, &b);
        for which in ["peft", "peft_merged", "merged"] {
            let d = max_diff(&ours, &golden_logits(&g, case, which));
            assert!(d < TOL, "{case}: raptor vs {which}: {d:e}");
        }
        // Without its adapters the model is far from the golden logits.
        let plain = load_bert(
            &base,
            peft_fixture::LABELS,
            pooling,
            Device::Cpu,
            &LoadOptions::strict(),
        )
        .unwrap()
        .model;
        tch::no_grad(|| {
            for (n, t) in plain.var_store().variables() {
                if n.starts_with("classifier") {
                    let mut t = t;
                    t.copy_(&m.var_store().variables()[&n]);
                }
            }
        });
        let gap = max_diff(&logits(&plain, &b), &golden_logits(&g, case, "peft"));
        assert!(
            gap > 1e-2,
            "{case}: the adapters move the logits by only {gap:e}"
        );

        let dir = tempfile::tempdir().unwrap();
        let report = save_adapter(&mut m, dir.path().join("adapter"), &opts(pooling)).unwrap();
        assert_eq!(report.modules_to_save, ["classifier"]);
        assert_eq!(report.target_modules.len(), 4);
        assert_eq!((report.r, report.alpha), (4, 8.0));
        assert!(report.tensors.iter().all(|t| t.starts_with(PEFT_PREFIX)));
        same_tensors(
            &dir.path().join("adapter").join(ADAPTER_WEIGHTS),
            &committed.join("adapter").join(ADAPTER_WEIGHTS),
            0.0,
        );
        assert_eq!(
            json(&dir.path().join("adapter").join(ADAPTER_CONFIG)),
            json(&committed.join("adapter").join(ADAPTER_CONFIG))
        );
        let card = std::fs::read_to_string(dir.path().join("adapter").join(CARD)).unwrap();
        assert_eq!(
            card.contains("mean of the encoder"),
            pooling == BertPooling::Mean
        );

        let merged = save_merged(&mut m, dir.path().join("merged"), &[], &opts(pooling)).unwrap();
        assert_eq!(merged.len(), 4);
        let d = max_diff(&logits(&m, &b), &golden_logits(&g, case, "merged"));
        assert!(
            d < TOL,
            "{case}: raptor after the merge vs transformers: {d:e}"
        );
        same_tensors(
            &dir.path().join("merged").join("model.safetensors"),
            &committed.join("merged").join("model.safetensors"),
            1e-6,
        );
        let back = load_bert(
            committed.join("merged"),
            peft_fixture::LABELS,
            pooling,
            Device::Cpu,
            &LoadOptions::strict(),
        )
        .unwrap();
        assert!(back.report.missing.is_empty(), "{:?}", back.report.missing);
        let d = max_diff(&logits(&back.model, &b), &golden_logits(&g, case, "merged"));
        assert!(d < TOL, "{case}: raptor reading the merged folder: {d:e}");
    }
}

/// A merge leaves the logits as they were and is idempotent; typed errors for what the adapter
/// form does not take.
#[test]
fn merging_keeps_the_logits_and_the_adapter_form_refuses_what_peft_cannot_load() {
    let g = golden::json("peft/golden.json");
    let b = batch(&g);
    let base = fixture("peft/base");
    let mut m = peft_fixture::build(&base, BertPooling::Mean).unwrap();
    let before = logits(&m, &b);
    assert_eq!(merge_lora(&mut m).unwrap().len(), 4);
    assert!(max_diff(&before, &logits(&m, &b)) < 1e-5);
    assert!(
        merge_lora(&mut m).unwrap().is_empty(),
        "nothing left to merge"
    );
    let dir = tempfile::tempdir().unwrap();
    let e = save_adapter(&mut m, dir.path(), &opts(BertPooling::Mean)).unwrap_err();
    assert!(e.to_string().contains("no LoRA adapter"), "{e}");

    // A base weight trained whole beside its own adapter: PEFT cannot express it.
    let mut m = peft_fixture::build(&base, BertPooling::Mean).unwrap();
    raptor_models::set_trainable(&m, &["layer.1.attention.self.query.weight"], true).unwrap();
    let e = save_adapter(&mut m, dir.path(), &opts(BertPooling::Mean)).unwrap_err();
    assert!(e.to_string().contains("trained whole too"), "{e}");

    // Another family: the merged form is the way out.
    let mut gpt = raptor_models::Gpt2::new(
        raptor_models::Gpt2Config::tiny(raptor_models::DecoderHead::LanguageModel),
        Device::Cpu,
    )
    .unwrap();
    raptor_models::attach_lora(
        &mut gpt,
        &raptor_models::LoraConfig::raptor(vec!["attn.c_attn".into()]),
    )
    .unwrap();
    let e = save_adapter(&mut gpt, dir.path(), &ExportOptions::default()).unwrap_err();
    assert!(e.to_string().contains("merged folder"), "{e}");
}
