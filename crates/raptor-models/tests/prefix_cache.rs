//! The frozen-prefix cache: which blocks a model may skip, and that a private step started from
//! the cached hidden states gives the per-record losses, norms and clipped sums of the full
//! forward pass (ragged records, LoRA dropout keyed by record id, memory and file stores).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{perturb, records};
use raptor_models::{
    Batch, Bert, BertConfig, BertMoeConfig, ClipPolicy, ClippedStep, ClippedStepOutput, LoraConfig,
    Model, ParamGroups, PrefixCache, PrefixPrecision, PrefixStore, attach_lora, freeze_all,
    precision_error, set_trainable, trainable_params,
};
use std::collections::BTreeMap;
use tch::{Device, Kind, Tensor};

fn bert(layers: i64, moe: Option<BertMoeConfig>) -> Bert {
    let _rng = raptor_models::rng::global_rng();
    tch::manual_seed(3);
    let mut cfg = BertConfig::tiny(3);
    cfg.num_hidden_layers = layers;
    cfg.moe = moe;
    Bert::new(cfg, Device::Cpu).unwrap()
}

/// LoRA on the attention of layers `from..`, the head trainable.
fn lora_from(m: &mut Bert, from: usize, layers: usize, dropout: f64) {
    freeze_all(m).unwrap();
    let targets = (from..layers)
        .map(|i| format!("layer.{i}.attention"))
        .collect();
    attach_lora(
        m,
        &LoraConfig {
            r: 2,
            alpha: 4.0,
            dropout,
            targets,
        },
    )
    .unwrap();
    set_trainable(m, &["classifier"], true).unwrap();
}

#[test]
fn the_frozen_prefix_ends_at_the_first_trained_or_adapted_block() {
    let mut m = bert(4, None);
    freeze_all(&m).unwrap();
    let head = vec!["classifier.weight".to_string()];
    // Only the head trains: every block is frozen.
    let p = m.frozen_prefix(&head).unwrap();
    assert_eq!((p.layers, p.width, p.of), (4, 16, 4));
    // A trained block (named in the scope, not yet requiring a gradient) ends it.
    let mut scope = head.clone();
    scope.push("bert.encoder.layer.2.output.dense.weight".into());
    assert_eq!(m.frozen_prefix(&scope).unwrap().layers, 2);
    // A parameter requiring a gradient ends it too, named or not.
    set_trainable(&m, &["layer.1.intermediate"], true).unwrap();
    assert_eq!(m.frozen_prefix(&head).unwrap().layers, 1);
    // Trained embeddings or a trained first block: nothing to cache.
    set_trainable(&m, &["layer.0.attention.self.query.bias"], true).unwrap();
    assert!(m.frozen_prefix(&head).is_none());
    freeze_all(&m).unwrap();
    assert!(
        m.frozen_prefix(&["bert.embeddings.LayerNorm.weight".into()])
            .is_none()
    );
    // An adapter ends it even when frozen (its dropout or switching off varies the output).
    lora_from(&mut m, 3, 4, 0.0);
    freeze_all(&m).unwrap();
    assert_eq!(m.frozen_prefix(&head).unwrap().layers, 3);
    // MoE-BERT: a trained expert of layer 1 ends it at 1.
    let moe = bert(
        3,
        Some(BertMoeConfig {
            num_experts: 2,
            num_experts_per_tok: 1,
            sparse_layers: vec![1, 2],
        }),
    );
    freeze_all(&moe).unwrap();
    set_trainable(&moe, &["layer.1.moe.experts.0"], true).unwrap();
    assert_eq!(moe.frozen_prefix(&head).unwrap().layers, 1);
}

fn step(
    m: &Bert,
    batch: &Batch,
    prefix: Option<(usize, Tensor)>,
    ids: &[u64],
) -> ClippedStepOutput<String> {
    let names = trainable_params(m);
    let groups = ParamGroups::from_fn(names.iter().cloned(), |n: &str| {
        Some(if n.starts_with("classifier") {
            "head".to_string()
        } else {
            "lora".to_string()
        })
    });
    let policy = ClipPolicy::RoleWise([("head".into(), 0.05), ("lora".into(), 0.02)].into());
    let mut s = ClippedStep::new(m)
        .unwrap()
        .with_dropout_seed(77)
        .with_record_ids(ids.to_vec());
    if let Some((k, h)) = prefix {
        s = s.with_prefix(k, h);
    }
    s.run(
        batch,
        &BTreeMap::new(),
        &groups,
        &policy,
        &BTreeMap::new(),
        true,
    )
    .unwrap()
}

fn max_rel(a: &Tensor, b: &Tensor) -> f64 {
    let a = a.to_kind(Kind::Double);
    let b = b.to_kind(Kind::Double);
    let scale = a.abs().max().double_value(&[]).max(1e-12);
    (a - b).abs().max().double_value(&[]) / scale
}

fn assert_same(a: &ClippedStepOutput<String>, b: &ClippedStepOutput<String>, tol: f64) {
    assert!(max_rel(&a.losses, &b.losses) <= tol, "losses");
    assert_eq!(
        a.clip.group_sq_norms.keys().collect::<Vec<_>>(),
        b.clip.group_sq_norms.keys().collect::<Vec<_>>()
    );
    for (g, n) in &a.clip.group_sq_norms {
        let r = max_rel(n, &b.clip.group_sq_norms[g]);
        assert!(r <= tol, "group {g}: squared norms differ by {r:e}");
    }
    assert_eq!(
        a.clip.sums.keys().collect::<Vec<_>>(),
        b.clip.sums.keys().collect::<Vec<_>>()
    );
    for (p, s) in &a.clip.sums {
        let r = max_rel(s, &b.clip.sums[p]);
        assert!(r <= tol, "{p}: clipped sums differ by {r:e}");
    }
}

#[test]
fn a_step_from_cached_states_equals_the_full_forward_pass() {
    let layers = 3;
    let mut m = bert(layers, None);
    lora_from(&mut m, 1, layers as usize, 0.2);
    perturb(&m, 0.05);
    let p = m.frozen_prefix(&trainable_params(&m)).unwrap();
    assert_eq!(p.layers, 1);
    // Ragged records: padding in the batch, different padding when first cached.
    let recs = records(&[7, 2, 5, 1, 6, 3], m.vocab_size(), 5);
    let labels = [0i64, 2, 1, 1, 0, 2];
    let ids: Vec<u64> = (0..6).map(|i| 500 + 3 * i).collect();
    let batch = Batch::from_records(&recs, 0, Some(&labels), Device::Cpu).unwrap();
    let full = step(&m, &batch, None, &ids);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prefix.bin");
    for store in [PrefixStore::Memory, PrefixStore::File(file.clone())] {
        let mut cache =
            PrefixCache::new(p.layers, p.width, 10, PrefixPrecision::F32, store.clone()).unwrap();
        // Cache records 1 and 4 first, in a batch of their own (another padding).
        let toks: Vec<&[i64]> = recs.iter().map(Vec::as_slice).collect();
        let _ = cache
            .hidden(&m, &[4, 1], &[toks[4], toks[1]], 0, Device::Cpu)
            .unwrap();
        assert_eq!(cache.stored_records(), 2);
        let idx: Vec<usize> = (0..6).collect();
        let h = cache.hidden(&m, &idx, &toks, 0, Device::Cpu).unwrap();
        assert_eq!(h.size(), [6, 7, 16]);
        // Zero past each record's length.
        let pad = h.get(1).narrow(0, 2, 5).abs().max().double_value(&[]);
        assert_eq!(pad, 0.0);
        let cached = step(&m, &batch, Some((p.layers, h)), &ids);
        assert_same(&full, &cached, 1e-4);
        // The second pass reads what the first stored.
        let again = cache.hidden(&m, &idx, &toks, 0, Device::Cpu).unwrap();
        assert_eq!(cache.stored_records(), 6);
        let cached2 = step(&m, &batch, Some((p.layers, again)), &ids);
        assert_same(&cached, &cached2, 0.0);
        if matches!(store, PrefixStore::File(_)) {
            assert!(file.exists());
            assert!(cache.stored_bytes() == (7 + 2 + 5 + 1 + 6 + 3) * 16 * 4);
            drop(cache);
            assert!(!file.exists(), "the file is deleted with the cache");
        }
    }
}

#[test]
fn reduced_precision_is_measured_and_bad_requests_are_errors() {
    let mut m = bert(2, None);
    lora_from(&mut m, 1, 2, 0.0);
    perturb(&m, 0.05);
    let recs = records(&[6, 4, 3], m.vocab_size(), 9);
    let batch = Batch::from_records(&recs, 0, Some(&[0, 1, 2]), Device::Cpu).unwrap();
    let f16 = precision_error(&m, &batch, 1, PrefixPrecision::F16).unwrap();
    let bf16 = precision_error(&m, &batch, 1, PrefixPrecision::Bf16).unwrap();
    let f32 = precision_error(&m, &batch, 1, PrefixPrecision::F32).unwrap();
    assert_eq!(f32, 0.0);
    assert!(f16 > 0.0 && f16 < 1e-2, "f16 {f16}");
    assert!(bf16 > f16, "bf16 {bf16} keeps fewer bits than f16 {f16}");
    let mut cache = PrefixCache::new(1, 16, 3, PrefixPrecision::F16, PrefixStore::Memory).unwrap();
    let toks: Vec<&[i64]> = recs.iter().map(Vec::as_slice).collect();
    let h = cache.hidden(&m, &[0, 1, 2], &toks, 0, Device::Cpu).unwrap();
    assert_eq!(h.kind(), Kind::Float);
    assert_eq!(cache.stored_bytes(), (6 + 4 + 3) * 16 * 2);
    // Another length for a cached record, an index past the set, mismatched lists.
    let short = &recs[0][..2];
    assert!(cache.hidden(&m, &[0], &[short], 0, Device::Cpu).is_err());
    assert!(cache.hidden(&m, &[3], &[toks[0]], 0, Device::Cpu).is_err());
    assert!(
        cache
            .hidden(&m, &[0, 1], &[toks[0]], 0, Device::Cpu)
            .is_err()
    );
    assert!(PrefixCache::new(0, 16, 3, PrefixPrecision::F32, PrefixStore::Memory).is_err());
    // A prefix longer than the model, or states of the wrong shape.
    assert!(m.prefix_hidden(&batch, 3).is_err());
    let mut ctx = raptor_models::ForwardCtx::new(false);
    ctx.prefix = Some((1, Tensor::zeros([3, 5, 16], (Kind::Float, Device::Cpu))));
    assert!(m.forward(&batch, &mut ctx).is_err());
}
