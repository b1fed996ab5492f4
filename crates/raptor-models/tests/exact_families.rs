//! Exactness of the per-sample engine on the shared-block Llama-family decoders (Llama,
//! Mixtral, Qwen2-MoE) against a loop of single-record backward passes (f64, tolerance 1e-9
//! relative): grouped-query attention, linear RoPE scaling, tied and untied heads, owner masks
//! on the routed experts (a record's gradient on an expert it does not own is exactly zero),
//! and the Qwen2-MoE shared expert in the shared stream (every record reaches it, never
//! owner-masked).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use raptor_models::{
    Batch, Bert, BertConfig, BertPooling, Decoder, DecoderConfig, DecoderFamily, DecoderHead,
    LoraConfig, Model, RopeScaling, attach_lora, freeze_all, set_trainable, trainable_params,
};
use std::collections::BTreeMap;
use tch::{Device, Tensor};

const TOL: f64 = 1e-9;

fn lm_batch(vocab: i64) -> Batch {
    Batch::from_records(&records(&[6, 2, 4, 6], vocab, 3), 0, None, Device::Cpu).unwrap()
}

fn cls_batch(vocab: i64) -> Batch {
    Batch::from_records(
        &records(&[5, 1, 3, 5], vocab, 9),
        0,
        Some(&[1, 0, 1, 0]),
        Device::Cpu,
    )
    .unwrap()
}

fn model(cfg: DecoderConfig) -> Decoder {
    let mut m = Decoder::new(cfg, Device::Cpu).unwrap();
    m.var_store_mut().double();
    m
}

/// Every record's squared gradient norm on every parameter of a routed expert it does not own
/// is exactly zero; returns how many (record, parameter) pairs were checked.
fn assert_no_leak<M: Model>(m: &M, b: &Batch, owners: &BTreeMap<usize, Tensor>) -> usize {
    let eng = engine(m, b, owners);
    let mut checked = 0;
    for p in eng.params() {
        let parts: Vec<&str> = p.split('.').collect();
        let Some(i) = parts.iter().position(|s| *s == "experts") else {
            continue;
        };
        let layer: usize = parts[2].parse().unwrap();
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
fn llama_gqa_tied_head_linear_rope_full_finetune_is_exact() {
    tch::manual_seed(11);
    let mut cfg = DecoderConfig::tiny(DecoderFamily::Llama, DecoderHead::LanguageModel);
    cfg.tie_word_embeddings = true;
    cfg.rope_scaling = RopeScaling::Linear { factor: 2.0 };
    cfg.qkv_bias = true;
    cfg.o_bias = true;
    cfg.mlp_bias = true;
    let m = model(cfg);
    perturb(&m, 0.05);
    assert!(!m.var_store().variables().contains_key("lm_head.weight"));
    // The embedding gets gradient from the lookup and the tied head (cross terms).
    check_exact(&m, &lm_batch(m.vocab_size()), &BTreeMap::new(), TOL);
}

#[test]
fn llama_lora_classification_is_exact() {
    tch::manual_seed(12);
    let mut m = Decoder::new(
        DecoderConfig::tiny(
            DecoderFamily::Llama,
            DecoderHead::Classification { num_labels: 2 },
        ),
        Device::Cpu,
    )
    .unwrap();
    freeze_all(&m).unwrap();
    attach_lora(
        &mut m,
        &LoraConfig {
            r: 2,
            alpha: 4.0,
            dropout: 0.0,
            targets: vec!["self_attn.k_proj".into(), "mlp.up_proj".into()],
        },
    )
    .unwrap();
    set_trainable(&m, &["score", "model.norm"], true).unwrap();
    m.var_store_mut().double();
    perturb(&m, 0.1);
    check_exact(&m, &cls_batch(m.vocab_size()), &BTreeMap::new(), TOL);
}

#[test]
fn mixtral_full_finetune_owner_masks_are_exact_and_do_not_leak() {
    tch::manual_seed(13);
    let m = model(DecoderConfig::tiny(
        DecoderFamily::Mixtral,
        DecoderHead::LanguageModel,
    ));
    perturb(&m, 0.05);
    // Routers stay frozen even when everything is set trainable.
    set_trainable(&m, &["*"], true).unwrap();
    let tp = trainable_params(&m);
    assert!(
        !tp.iter()
            .any(|n| n.ends_with("block_sparse_moe.gate.weight"))
    );
    assert!(tp.iter().any(|n| n.ends_with("experts.3.w2.weight")));
    let b = lm_batch(m.vocab_size());
    let owners: BTreeMap<usize, Tensor> = [
        (0usize, Tensor::from_slice(&[1i64, 0, 3, 1])),
        (1, Tensor::from_slice(&[2i64, 2, 0, 3])),
    ]
    .into();
    check_exact(&m, &b, &owners, TOL);
    assert!(assert_no_leak(&m, &b, &owners) > 0);
    // Without owner maps, natural routing: still exact.
    check_exact(&m, &b, &BTreeMap::new(), TOL);
}

#[test]
fn mixtral_expert_lora_classification_with_owners_is_exact() {
    tch::manual_seed(14);
    let mut cfg = DecoderConfig::tiny(
        DecoderFamily::Mixtral,
        DecoderHead::Classification { num_labels: 2 },
    );
    cfg.num_key_value_heads = 1; // multi-query attention
    let mut m = Decoder::new(cfg, Device::Cpu).unwrap();
    freeze_all(&m).unwrap();
    attach_lora(
        &mut m,
        &LoraConfig {
            r: 2,
            alpha: 4.0,
            dropout: 0.0,
            targets: vec!["self_attn.v_proj".into(), "*.experts.*.w1".into()],
        },
    )
    .unwrap();
    set_trainable(&m, &["score"], true).unwrap();
    m.var_store_mut().double();
    perturb(&m, 0.1);
    let b = cls_batch(m.vocab_size());
    let owners: BTreeMap<usize, Tensor> = [
        (0usize, Tensor::from_slice(&[0i64, 3, 1, 3])),
        (1, Tensor::from_slice(&[2i64, 2, 0, 1])),
    ]
    .into();
    check_exact(&m, &b, &owners, TOL);
    assert!(assert_no_leak(&m, &b, &owners) > 0);
}

#[test]
fn qwen2_moe_shared_expert_is_shared_stream_and_routed_experts_do_not_leak() {
    tch::manual_seed(15);
    let m = model(DecoderConfig::tiny(
        DecoderFamily::Qwen2Moe,
        DecoderHead::LanguageModel,
    ));
    perturb(&m, 0.05);
    // Layer 0 sparse (routed + shared expert), layer 1 dense.
    assert_eq!(m.sparse_layers(), vec![0]);
    assert_eq!(
        m.router_params(),
        vec!["model.layers.0.mlp.gate.weight".to_string()]
    );
    let tp = trainable_params(&m);
    assert!(tp.contains(&"model.layers.0.mlp.shared_expert_gate.weight".to_string()));
    assert!(tp.contains(&"model.layers.0.mlp.shared_expert.up_proj.weight".to_string()));
    assert!(tp.contains(&"model.layers.1.mlp.up_proj.weight".to_string()));
    let b = lm_batch(m.vocab_size());
    let owners: BTreeMap<usize, Tensor> = [(0usize, Tensor::from_slice(&[3i64, 3, 0, 2]))].into();
    check_exact(&m, &b, &owners, TOL);
    assert!(assert_no_leak(&m, &b, &owners) > 0);
    // The shared expert and its gate are never owner-masked: every record reaches them.
    let eng = engine(&m, &b, &owners);
    for p in [
        "model.layers.0.mlp.shared_expert.gate_proj.weight",
        "model.layers.0.mlp.shared_expert.down_proj.weight",
        "model.layers.0.mlp.shared_expert_gate.weight",
    ] {
        let sq = Vec::<f64>::try_from(eng.sq_norms(p).unwrap()).unwrap();
        assert!(sq.iter().all(|&x| x > 0.0), "{p}: {sq:?}");
    }
}

#[test]
fn qwen2_moe_lora_everywhere_with_owners_is_exact() {
    tch::manual_seed(16);
    let mut m = Decoder::new(
        DecoderConfig::tiny(
            DecoderFamily::Qwen2Moe,
            DecoderHead::Classification { num_labels: 2 },
        ),
        Device::Cpu,
    )
    .unwrap();
    freeze_all(&m).unwrap();
    attach_lora(
        &mut m,
        &LoraConfig {
            r: 2,
            alpha: 4.0,
            dropout: 0.0,
            targets: vec![
                "self_attn.q_proj".into(),
                "*.experts.*_proj".into(),
                "*.shared_expert.*_proj".into(),
            ],
        },
    )
    .unwrap();
    set_trainable(&m, &["score", "shared_expert_gate"], true).unwrap();
    m.var_store_mut().double();
    perturb(&m, 0.1);
    let b = cls_batch(m.vocab_size());
    let owners: BTreeMap<usize, Tensor> = [(0usize, Tensor::from_slice(&[1i64, 0, 0, 2]))].into();
    check_exact(&m, &b, &owners, TOL);
    assert!(assert_no_leak(&m, &b, &owners) > 0);
}

#[test]
fn f32_families_match_reference_to_1e5() {
    tch::manual_seed(17);
    for family in [
        DecoderFamily::Llama,
        DecoderFamily::Mixtral,
        DecoderFamily::Qwen2Moe,
    ] {
        let m = Decoder::new(
            DecoderConfig::tiny(family, DecoderHead::LanguageModel),
            Device::Cpu,
        )
        .unwrap();
        perturb(&m, 0.05);
        let w = check_exact(&m, &lm_batch(m.vocab_size()), &BTreeMap::new(), 1e-5);
        eprintln!("f32 worst relative error: {family:?} {w:e}");
    }
}

#[test]
fn bad_family_configs_are_errors() {
    let mut c = DecoderConfig::tiny(DecoderFamily::Llama, DecoderHead::LanguageModel);
    c.num_key_value_heads = 3;
    assert!(Decoder::new(c, Device::Cpu).is_err());
    let mut c = DecoderConfig::tiny(DecoderFamily::Mixtral, DecoderHead::LanguageModel);
    c.moe = None;
    assert!(Decoder::new(c, Device::Cpu).is_err());
    let mut c = DecoderConfig::tiny(DecoderFamily::Mixtral, DecoderHead::LanguageModel);
    if let Some(m) = c.moe.as_mut() {
        m.shared_expert_intermediate_size = Some(4);
    }
    assert!(Decoder::new(c, Device::Cpu).is_err());
    let mut c = DecoderConfig::tiny(DecoderFamily::Qwen2Moe, DecoderHead::LanguageModel);
    if let Some(m) = c.moe.as_mut() {
        m.sparse_layers = vec![5];
    }
    assert!(Decoder::new(c, Device::Cpu).is_err());
    let mut c = DecoderConfig::tiny(DecoderFamily::Llama, DecoderHead::LanguageModel);
    c.rope_scaling = RopeScaling::Linear { factor: 0.0 };
    assert!(Decoder::new(c, Device::Cpu).is_err());
}

#[test]
fn bert_full_finetune_with_pooler_is_exact() {
    tch::manual_seed(18);
    let mut m = Bert::new(BertConfig::tiny(3), Device::Cpu).unwrap();
    // The key bias adds q·b_k to every key of a query: softmax ignores it, its true gradient
    // is 0 and both sides are rounding noise (~1e-20), so a relative check is meaningless.
    set_trainable(&m, &["*.attention.self.key.bias"], false).unwrap();
    m.var_store_mut().double();
    perturb(&m, 0.05);
    let b = Batch::from_records(
        &records(&[5, 1, 3, 5], m.vocab_size(), 9),
        0,
        Some(&[1, 0, 2, 0]),
        Device::Cpu,
    )
    .unwrap();
    check_exact(&m, &b, &BTreeMap::new(), TOL);
}

#[test]
fn bert_lora_mean_pooling_is_exact() {
    tch::manual_seed(19);
    let mut cfg = BertConfig::tiny(2);
    cfg.pooling = BertPooling::Mean;
    let mut m = Bert::new(cfg, Device::Cpu).unwrap();
    freeze_all(&m).unwrap();
    attach_lora(
        &mut m,
        &LoraConfig {
            r: 2,
            alpha: 4.0,
            dropout: 0.0,
            targets: vec!["attention.self.query".into(), "intermediate.dense".into()],
        },
    )
    .unwrap();
    set_trainable(&m, &["classifier", "LayerNorm"], true).unwrap();
    m.var_store_mut().double();
    perturb(&m, 0.1);
    check_exact(&m, &cls_batch(m.vocab_size()), &BTreeMap::new(), TOL);
}
