//! Exactness of the per-sample engine on the OLMoE-style and GPT-2 decoders against a loop of
//! single-record backward passes (f64, tolerance 1e-9 relative): padding, top-k > 1,
//! `norm_topk_prob`, owner masks, LoRA and full fine-tuning, the tied GPT-2 LM head.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use raptor_models::{
    Batch, DecoderHead, ForwardCtx, Gpt2, Gpt2Config, LoraConfig, Model, ModelError, OlmoeConfig,
    OlmoeDecoder, attach_lora, freeze_all, set_trainable, trainable_params,
};
use std::collections::BTreeMap;
use tch::{Device, Kind, Tensor};

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

#[test]
fn olmoe_lm_full_finetune_topk2_with_padding_is_exact() {
    tch::manual_seed(1);
    let mut m =
        OlmoeDecoder::new(OlmoeConfig::tiny(DecoderHead::LanguageModel), Device::Cpu).unwrap();
    m.var_store_mut().double();
    perturb(&m, 0.05);
    assert!(
        !trainable_params(&m)
            .iter()
            .any(|n| n.ends_with("mlp.gate.weight"))
    );
    check_exact(&m, &lm_batch(m.vocab_size()), &BTreeMap::new(), TOL);
}

#[test]
fn olmoe_norm_topk_lora_owner_masks_classification_is_exact() {
    tch::manual_seed(2);
    let mut cfg = OlmoeConfig::tiny(DecoderHead::Classification { num_labels: 2 });
    cfg.norm_topk_prob = true;
    cfg.num_experts_per_tok = 3;
    cfg.num_key_value_heads = 2;
    let mut m = OlmoeDecoder::new(cfg, Device::Cpu).unwrap();
    freeze_all(&m).unwrap();
    let lora = LoraConfig {
        r: 2,
        alpha: 4.0,
        dropout: 0.0,
        targets: vec![
            "self_attn.q_proj".into(),
            "self_attn.v_proj".into(),
            "*.experts.*_proj".into(),
        ],
    };
    attach_lora(&mut m, &lora).unwrap();
    set_trainable(&m, &["score", "q_norm"], true).unwrap();
    m.var_store_mut().double();
    perturb(&m, 0.1);
    let b = cls_batch(m.vocab_size());
    let mut ctx = ForwardCtx::new(false);
    ctx.collect_routing = true;
    let _ = m.forward(&b, &mut ctx).unwrap();
    assert_eq!(ctx.routing.len(), 2);
    assert_eq!(ctx.routing[0].indices.size(), vec![4, 5, 3]);
    // norm_topk_prob: gate weights sum to one per token.
    let s = ctx.routing[0]
        .weights
        .sum_dim_intlist(-1, false, Kind::Double);
    assert!((s - 1.0).abs().max().double_value(&[]) < 1e-12);
    let owners: BTreeMap<usize, Tensor> = [
        (0usize, Tensor::from_slice(&[0i64, 3, 1, 3])),
        (1, Tensor::from_slice(&[2i64, 2, 0, 1])),
    ]
    .into();
    check_exact(&m, &b, &owners, TOL);
    // Leak test: non-owners contribute exactly zero to each expert.
    let eng = engine(&m, &b, &owners);
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
        for r in 0..4 {
            if own[r] != e {
                assert_eq!(sq[r], 0.0, "{p}: record {r} leaks");
                checked += 1;
            }
        }
    }
    assert!(checked > 0);
}

#[test]
fn gpt2_lm_full_finetune_tied_head_is_exact() {
    tch::manual_seed(3);
    let mut m = Gpt2::new(Gpt2Config::tiny(DecoderHead::LanguageModel), Device::Cpu).unwrap();
    m.var_store_mut().double();
    perturb(&m, 0.05);
    // wte gets gradient from the embedding lookup and from the tied head (cross terms).
    check_exact(&m, &lm_batch(m.vocab_size()), &BTreeMap::new(), TOL);
}

#[test]
fn gpt2_lora_classification_is_exact() {
    tch::manual_seed(4);
    let mut m = Gpt2::new(
        Gpt2Config::tiny(DecoderHead::Classification { num_labels: 2 }),
        Device::Cpu,
    )
    .unwrap();
    freeze_all(&m).unwrap();
    attach_lora(
        &mut m,
        &LoraConfig {
            r: 4,
            alpha: 8.0,
            dropout: 0.0,
            targets: vec!["attn.c_attn".into(), "mlp.c_fc".into()],
        },
    )
    .unwrap();
    set_trainable(&m, &["score", "ln_f"], true).unwrap();
    m.var_store_mut().double();
    perturb(&m, 0.1);
    check_exact(&m, &cls_batch(m.vocab_size()), &BTreeMap::new(), TOL);
}

#[test]
fn decoder_bad_input() {
    let m = Gpt2::new(Gpt2Config::tiny(DecoderHead::LanguageModel), Device::Cpu).unwrap();
    // A one-token record has no next-token target.
    let b = Batch::from_records(&[vec![1, 2, 3], vec![4]], 0, None, Device::Cpu).unwrap();
    assert!(matches!(
        m.per_record_loss(&b, &mut ForwardCtx::new(false)),
        Err(ModelError::EmptyRecord { record: 1, .. })
    ));
    let long = Batch::from_records(&[vec![1; 40]], 0, None, Device::Cpu).unwrap();
    assert!(matches!(
        m.forward(&long, &mut ForwardCtx::new(false)),
        Err(ModelError::ShapeMismatch { .. })
    ));
    let o = OlmoeDecoder::new(OlmoeConfig::tiny(DecoderHead::LanguageModel), Device::Cpu).unwrap();
    let bad = Batch::from_records(&[vec![1, 2], vec![3, -1]], 0, None, Device::Cpu).unwrap();
    assert!(matches!(
        o.forward(&bad, &mut ForwardCtx::new(false)),
        Err(ModelError::TokenOutOfRange {
            record: 1,
            position: 1,
            id: -1,
            ..
        })
    ));
    let mut ctx = ForwardCtx::new(false).with_owners(0, Tensor::from_slice(&[0i64, 9]));
    let ok = Batch::from_records(&[vec![1, 2], vec![3, 4]], 0, None, Device::Cpu).unwrap();
    assert!(matches!(
        o.forward(&ok, &mut ctx),
        Err(ModelError::InvalidOwners { layer: 0, .. })
    ));
}

#[test]
fn f32_decoders_match_reference_to_1e5() {
    tch::manual_seed(5);
    let o = OlmoeDecoder::new(OlmoeConfig::tiny(DecoderHead::LanguageModel), Device::Cpu).unwrap();
    perturb(&o, 0.05);
    let w1 = check_exact(&o, &lm_batch(o.vocab_size()), &BTreeMap::new(), 1e-5);
    let g = Gpt2::new(Gpt2Config::tiny(DecoderHead::LanguageModel), Device::Cpu).unwrap();
    perturb(&g, 0.05);
    let w2 = check_exact(&g, &lm_batch(g.vocab_size()), &BTreeMap::new(), 1e-5);
    eprintln!("f32 worst relative error: olmoe {w1:e}, gpt2 {w2:e}");
}

#[test]
fn f32_lora_dropout_decoders_are_exact_per_record() {
    // Training mode with LoRA dropout 0.25: per-record masks keyed by (step seed, record id,
    // adapter) are replayed by the single-record loop. OLMoE: experts' routed rows (top-2);
    // GPT-2: dense rows with padding.
    tch::manual_seed(6);
    let mut o =
        OlmoeDecoder::new(OlmoeConfig::tiny(DecoderHead::LanguageModel), Device::Cpu).unwrap();
    freeze_all(&o).unwrap();
    let cfg = |targets: Vec<String>| LoraConfig {
        r: 3,
        alpha: 6.0,
        dropout: 0.25,
        targets,
    };
    attach_lora(
        &mut o,
        &cfg(vec![
            "self_attn.q_proj".into(),
            "*.experts.*.up_proj".into(),
        ]),
    )
    .unwrap();
    perturb(&o, 0.1);
    let w1 = check_exact_seeded(
        &o,
        &lm_batch(o.vocab_size()),
        &BTreeMap::new(),
        1e-5,
        Some(9),
    );
    let mut g = Gpt2::new(
        Gpt2Config::tiny(DecoderHead::Classification { num_labels: 2 }),
        Device::Cpu,
    )
    .unwrap();
    freeze_all(&g).unwrap();
    attach_lora(&mut g, &cfg(vec!["attn.c_attn".into(), "mlp.c_fc".into()])).unwrap();
    set_trainable(&g, &["score"], true).unwrap();
    perturb(&g, 0.1);
    let w2 = check_exact_seeded(
        &g,
        &cls_batch(g.vocab_size()),
        &BTreeMap::new(),
        1e-5,
        Some(10),
    );
    eprintln!("f32 LoRA dropout worst relative error: olmoe {w1:e}, gpt2 {w2:e}");
}
