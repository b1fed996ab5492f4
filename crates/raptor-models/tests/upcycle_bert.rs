//! MoE-BERT upcycling: a dense BERT classifier turned into a MoE-BERT whose experts are copies
//! of the dense FFNs gives the same logits (to 1e-5) whatever the router, E and k, with padding
//! and token types; it exports (`raptor_moe` in `config.json`) and loads back with the same
//! logits; changing one expert changes the output; and its per-sample gradients are exact
//! against the single-record loop, with owner masks that keep every record out of the experts
//! it does not own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use raptor_models::checkpoint::{LoadOptions, load_bert, save_pretrained};
use raptor_models::hf_config::HfConfig;
use raptor_models::upcycle::{
    RouterTokens, RouterTraining, UpcycleOptions, UpcycledLayout, upcycle_bert, upcycle_folder,
};
use raptor_models::{
    Batch, Bert, BertConfig, BertPooling, ForwardCtx, LoraConfig, Model, attach_lora, freeze_all,
    set_trainable,
};
use std::collections::BTreeMap;
use tch::{Device, Tensor};

fn dense(pooling: BertPooling) -> Bert {
    tch::manual_seed(31);
    let mut cfg = BertConfig::tiny(3);
    cfg.pooling = pooling;
    let m = Bert::new(cfg, Device::Cpu).unwrap();
    // Widen the weights so that attention, routing and the FFNs all move the logits.
    // In name order: `variables()` is a HashMap, whose order (and so which tensor gets which
    // draw) changes from process to process.
    let vars: std::collections::BTreeMap<String, Tensor> =
        m.var_store().variables().into_iter().collect();
    tch::no_grad(|| {
        for (_, t) in vars {
            let mut t = t;
            let n = t.randn_like() * 0.3;
            let _ = t.f_add_(&n).unwrap();
        }
    });
    m
}

fn batch() -> Batch {
    Batch::from_records(
        &[vec![3, 7, 11, 2, 39, 5], vec![1, 2, 3], vec![20, 21]],
        0,
        Some(&[0, 2, 1]),
        Device::Cpu,
    )
    .unwrap()
}

fn types() -> Tensor {
    Tensor::from_slice(&[0i64, 0, 0, 1, 1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0]).reshape([3, 6])
}

fn logits(m: &Bert) -> Tensor {
    tch::no_grad(|| {
        m.forward_with_token_types(&batch(), Some(&types()), &mut ForwardCtx::new(false))
    })
    .unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

#[test]
fn identical_experts_give_the_dense_logits() {
    for (pooling, e, k, seed, layers) in [
        (BertPooling::Mean, 8, 2, 0u64, None),
        (BertPooling::Pooler, 8, 1, 1, None),
        (BertPooling::Mean, 3, 3, 2, Some(vec![1])),
        (BertPooling::Pooler, 2, 2, 3, Some(vec![0])),
    ] {
        let d = dense(pooling);
        let mut opts = UpcycleOptions::new(e, k);
        opts.seed = seed;
        opts.router_std = 1.0; // a far-from-uniform router: the experts still agree
        opts.layers = layers.clone();
        let m = upcycle_bert(&d, &opts).unwrap();
        let want = layers.unwrap_or(vec![0, 1]);
        assert_eq!(m.sparse_layers(), want);
        assert_eq!((m.num_experts(), m.top_k()), (e, k));
        assert_eq!(m.router_params().len(), want.len());
        let diff = max_diff(&logits(&m), &logits(&d));
        assert!(diff < 1e-5, "E={e} k={k}: logits differ by {diff}");
        // The routers are frozen and the dense FFN names are gone from upcycled layers.
        let vars = m.var_store().variables();
        for r in m.router_params() {
            assert!(!vars[&r].requires_grad(), "{r}");
        }
        for l in &want {
            assert!(
                !vars.contains_key(&format!("bert.encoder.layer.{l}.intermediate.dense.weight"))
            );
            assert!(vars.contains_key(&format!(
                "bert.encoder.layer.{l}.moe.experts.{}.output.dense.bias",
                e - 1
            )));
        }
    }
}

#[test]
fn a_changed_expert_changes_the_output() {
    let d = dense(BertPooling::Mean);
    let m = upcycle_bert(&d, &UpcycleOptions::new(4, 1)).unwrap();
    let before = logits(&m);
    tch::no_grad(|| {
        for e in 0..4 {
            let mut w = m.var_store().variables()
                [&format!("bert.encoder.layer.1.moe.experts.{e}.output.dense.weight")]
                .shallow_clone();
            let _ = w.f_mul_scalar_(1.0 + 0.5 * (e as f64 + 1.0)).unwrap();
        }
    });
    assert!(max_diff(&logits(&m), &before) > 1e-3);
}

#[test]
fn upcycled_bert_exports_and_loads_back() {
    let d = dense(BertPooling::Pooler);
    let mut opts = UpcycleOptions::new(4, 2);
    opts.seed = 7;
    let m = upcycle_bert(&d, &opts).unwrap();
    let dir = std::env::temp_dir().join(format!("raptor-moe-bert-{}", std::process::id()));
    save_pretrained(&m, &dir).unwrap();
    let HfConfig::Bert(c) = HfConfig::from_file(&dir).unwrap() else {
        panic!("not a BERT config")
    };
    let moe = c.moe.clone().unwrap();
    assert_eq!(
        (moe.num_experts, moe.num_experts_per_tok, moe.sparse_layers),
        (4, 2, vec![0, 1])
    );
    let back = load_bert(
        &dir,
        3,
        BertPooling::Pooler,
        Device::Cpu,
        &LoadOptions::exact(),
    )
    .unwrap();
    assert!(back.report.missing.is_empty() && back.report.unexpected.is_empty());
    assert!(max_diff(&logits(&back.model), &logits(&m)) < 1e-6);
    // The same seed gives the same router; another seed another one.
    let again = upcycle_bert(&d, &opts).unwrap();
    let r = "bert.encoder.layer.0.moe.gate.weight";
    assert!(m.var_store().variables()[r].equal(&again.var_store().variables()[r]));
    opts.seed = 8;
    let other = upcycle_bert(&d, &opts).unwrap();
    assert!(!m.var_store().variables()[r].equal(&other.var_store().variables()[r]));
    std::fs::remove_dir_all(&dir).ok();
    // Bad options are typed errors.
    assert!(upcycle_bert(&d, &UpcycleOptions::new(2, 3)).is_err());
    let mut bad = UpcycleOptions::new(2, 1);
    bad.layers = Some(vec![2]);
    assert!(upcycle_bert(&d, &bad).is_err());
    assert!(upcycle_bert(&m, &UpcycleOptions::new(2, 1)).is_err());
}

/// Folder to folder: a dense BERT folder becomes a MoE-BERT folder with its side files, the
/// routers trained on public tokens spread them more evenly than before (the loads reported
/// are the model's own), and bad requests are typed errors with nothing trained.
#[test]
fn a_bert_folder_upcycles_into_a_moe_bert_folder_with_trained_routers() {
    let d = dense(BertPooling::Pooler);
    let base = std::env::temp_dir().join(format!("raptor-upcycle-folder-{}", std::process::id()));
    let (src, out) = (base.join("dense"), base.join("moe"));
    save_pretrained(&d, &src).unwrap();
    std::fs::write(src.join("vocab.txt"), "[PAD]\n[UNK]\n").unwrap();
    let mut opts = UpcycleOptions::new(4, 1);
    opts.seed = 5;
    let records: Vec<Vec<i64>> = (0..40)
        .map(|i| (0..8).map(|j| 1 + (i * 7 + j * 3) % 39).collect())
        .collect();
    let training = RouterTraining {
        steps: 60,
        lr: 0.05,
    };
    let tokens = RouterTokens {
        records: &records,
        training: &training,
    };
    let report = upcycle_folder(&src, &out, &opts, Some(tokens)).unwrap();
    assert_eq!(report.layout, UpcycledLayout::MoeBert);
    assert_eq!(report.layout.name(), "moe-bert");
    assert_eq!(report.router_records, 40);
    let (before, after) = report.router_loads.unwrap();
    assert_eq!(before.len(), after.len());
    let cv = |l: &[raptor_models::upcycle::RouterLoad]| l.iter().map(|x| x.load_cv).sum::<f64>();
    assert!(cv(&after) < cv(&before), "{before:?} -> {after:?}");
    assert!(out.join("vocab.txt").is_file());
    let HfConfig::Bert(c) = HfConfig::from_file(&out).unwrap() else {
        panic!("not a BERT config")
    };
    assert_eq!(c.moe.unwrap().num_experts, 4);
    // No public record, a token outside the vocabulary, or bad options: errors.
    let far = [vec![1, 2, 40]];
    let outside = RouterTokens {
        records: &far,
        training: &training,
    };
    assert!(upcycle_folder(&src, &base.join("w"), &opts, Some(outside)).is_err());
    let none = RouterTokens {
        records: &[],
        training: &training,
    };
    assert!(upcycle_folder(&src, &base.join("x"), &opts, Some(none)).is_err());
    assert!(upcycle_folder(&src, &base.join("y"), &UpcycleOptions::new(2, 3), None).is_err());
    assert!(upcycle_folder(&base.join("missing"), &base.join("z"), &opts, None).is_err());
    std::fs::remove_dir_all(&base).ok();
}

/// Every record's squared gradient norm on every parameter of an expert it does not own is
/// exactly zero; returns how many (record, parameter) pairs were checked.
fn assert_no_leak(m: &Bert, b: &Batch, owners: &BTreeMap<usize, Tensor>) -> usize {
    let eng = engine(m, b, owners);
    let mut checked = 0;
    for p in eng.params() {
        // bert.encoder.layer.{l}.moe.experts.{e}.…
        let parts: Vec<&str> = p.split('.').collect();
        let Some(i) = parts.iter().position(|s| *s == "experts") else {
            continue;
        };
        let layer: usize = parts[3].parse().unwrap();
        let e: i64 = parts[i + 1].parse().unwrap();
        let own = Vec::<i64>::try_from(&owners[&layer]).unwrap();
        let sq = Vec::<f64>::try_from(eng.sq_norms(&p).unwrap()).unwrap();
        for (r, &o) in own.iter().enumerate() {
            if o != e {
                assert_eq!(sq[r], 0.0, "{p}: record {r} leaks into expert {e}");
                checked += 1;
            }
        }
    }
    checked
}

#[test]
fn moe_bert_per_sample_gradients_are_exact_with_owner_masks() {
    let d = dense(BertPooling::Mean);
    let mut opts = UpcycleOptions::new(3, 2);
    opts.router_std = 1.0;
    let mut m = upcycle_bert(&d, &opts).unwrap();
    perturb(&m, 0.05); // experts no longer identical
    let b = Batch::from_records(
        &records(&[5, 1, 3, 5], m.vocab_size(), 9),
        0,
        Some(&[1, 0, 2, 0]),
        Device::Cpu,
    )
    .unwrap();
    let owners: BTreeMap<usize, Tensor> = [
        (0usize, Tensor::from_slice(&[0i64, 2, 1, 0])),
        (1usize, Tensor::from_slice(&[2i64, 2, 0, 1])),
    ]
    .into();
    // Full fine-tuning (routers stay frozen; key biases frozen: their true gradient is 0).
    set_trainable(&m, &["*"], true).unwrap();
    set_trainable(&m, &["*.attention.self.key.bias"], false).unwrap();
    m.var_store_mut().double();
    for r in m.router_params() {
        assert!(!m.var_store().variables()[&r].requires_grad(), "{r}");
    }
    check_exact(&m, &b, &owners, 1e-9);
    assert!(assert_no_leak(&m, &b, &owners) > 0);
    // RAPTOR's scope: LoRA on the attention and every expert, the head trainable.
    let mut l = upcycle_bert(&d, &opts).unwrap();
    freeze_all(&l).unwrap();
    attach_lora(
        &mut l,
        &LoraConfig {
            r: 2,
            alpha: 4.0,
            dropout: 0.0,
            targets: vec![
                "attention.self.query".into(),
                "*.moe.experts.*.intermediate.dense".into(),
                "*.moe.experts.*.output.dense".into(),
            ],
        },
    )
    .unwrap();
    set_trainable(&l, &["classifier"], true).unwrap();
    l.var_store_mut().double();
    perturb(&l, 0.1);
    check_exact(&l, &b, &owners, 1e-9);
    assert!(assert_no_leak(&l, &b, &owners) > 0);
}
