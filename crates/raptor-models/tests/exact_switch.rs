//! Exactness of the per-sample engine on the Switch encoder against a loop of single-record
//! backward passes (f64 so that round-off does not mask real errors; the tolerance is 1e-9
//! relative), plus owner masks, the leak test, clipping, capacity and bad input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use raptor_models::{
    Batch, ClipPolicy, ClippedStep, ForwardCtx, LoraConfig, Model, ModelError, ParamGroups,
    SwitchConfig, SwitchEncoder, attach_lora, freeze_all, set_trainable, trainable_params,
};
use std::collections::BTreeMap;
use tch::{Device, Kind, Tensor};

const TOL: f64 = 1e-9;

fn model(cfg: SwitchConfig) -> SwitchEncoder {
    tch::manual_seed(7);
    let mut m = SwitchEncoder::new(cfg, Device::Cpu).unwrap();
    m.var_store_mut().double();
    m
}

fn batch(vocab: i64) -> Batch {
    let recs = records(&[7, 3, 5, 1, 7], vocab, 11);
    Batch::from_records(&recs, 0, Some(&[0, 2, 1, 1, 0]), Device::Cpu).unwrap()
}

#[test]
fn full_finetune_with_padding_is_exact() {
    let m = model(SwitchConfig::tiny());
    perturb(&m, 0.05);
    let b = batch(m.vocab_size());
    // Everything but the routers is trainable (routers are frozen by construction).
    let names = trainable_params(&m);
    assert!(names.iter().any(|n| n.contains("experts.expert_0.wi")));
    assert!(names.iter().any(|n| n.contains("relative_attention_bias")));
    assert!(!names.iter().any(|n| n.contains("router")));
    let worst = check_exact(&m, &b, &BTreeMap::new(), TOL);
    assert!(worst <= TOL);
}

#[test]
fn lora_with_owner_masks_is_exact_and_does_not_leak() {
    let mut m = model(SwitchConfig::tiny());
    freeze_all(&m).unwrap();
    let cfg = LoraConfig {
        r: 3,
        alpha: 6.0,
        dropout: 0.0,
        targets: vec![
            "SelfAttention.q".into(),
            "SelfAttention.k".into(),
            "SelfAttention.v".into(),
            "SelfAttention.o".into(),
            "*.experts.*.wi".into(),
            "*.experts.*.wo".into(),
        ],
    };
    let adapted = attach_lora(&mut m, &cfg).unwrap();
    assert_eq!(adapted.len(), 4 * 4 + 2 * 4 * 2);
    set_trainable(&m, &["classifier"], true).unwrap();
    m.var_store_mut().double();
    perturb(&m, 0.1);
    let b = batch(m.vocab_size());
    // Owner maps of both sparse layers (1 and 3) from the model's own routing.
    let mut ctx = ForwardCtx::new(false);
    ctx.collect_routing = true;
    let _ = m.forward(&b, &mut ctx).unwrap();
    assert_eq!(ctx.routing.len(), 2);
    let mut owners = BTreeMap::new();
    for r in &ctx.routing {
        assert_eq!(r.indices.size(), vec![5, 7, 1]);
        // Plurality of the routed valid tokens, ties to the lowest index.
        let own = plurality(&r.indices, &r.weights, &r.mask, 4);
        owners.insert(r.layer, Tensor::from_slice(&own));
    }
    // The same owner maps straight from the model through raptor-routing.
    let via_routing = raptor_models::owner_tensors(
        &m,
        [&b],
        raptor_routing::OwnerRule::GateWeighted,
        Device::Cpu,
    )
    .unwrap();
    assert_eq!(
        via_routing.keys().collect::<Vec<_>>(),
        owners.keys().collect::<Vec<_>>()
    );
    for (l, o) in &owners {
        assert_eq!(
            Vec::<i64>::try_from(o).unwrap(),
            Vec::<i64>::try_from(&via_routing[l]).unwrap()
        );
    }
    check_exact(&m, &b, &owners, TOL);

    // Leak test: a non-owner record contributes exactly zero to every expert group.
    let eng = engine(&m, &b, &owners);
    let bsz = b.batch_size();
    let mut checked = 0;
    for p in eng.params() {
        let Some((layer, e)) = expert_of(&p) else {
            continue;
        };
        let own = Vec::<i64>::try_from(&owners[&layer]).unwrap();
        let sq = Vec::<f64>::try_from(eng.sq_norms(&p).unwrap()).unwrap();
        for r in 0..bsz as usize {
            if own[r] != e {
                assert_eq!(sq[r], 0.0, "{p}: non-owner record {r} leaks");
                let onehot = Tensor::zeros([bsz], (Kind::Double, Device::Cpu)).index_fill(
                    0,
                    &Tensor::from_slice(&[r as i64]),
                    1.0,
                );
                let g = eng.weighted_sum(&p, &onehot).unwrap();
                assert_eq!(
                    g.abs().max().double_value(&[]),
                    0.0,
                    "{p}: record {r} leaks"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 0);
    // Without owner masks the same records do touch foreign experts (the mask matters).
    let eng2 = engine(&m, &b, &BTreeMap::new());
    let mut touched = false;
    for p in eng2.params() {
        let Some((layer, e)) = expert_of(&p) else {
            continue;
        };
        let own = Vec::<i64>::try_from(&owners[&layer]).unwrap();
        let sq = Vec::<f64>::try_from(eng2.sq_norms(&p).unwrap()).unwrap();
        touched |= (0..bsz as usize).any(|r| own[r] != e && sq[r] > 0.0);
    }
    assert!(
        touched,
        "routing never sends a token to a non-owning expert: leak test is vacuous"
    );
}

fn expert_of(p: &str) -> Option<(usize, i64)> {
    let parts: Vec<&str> = p.split('.').collect();
    let i = parts.iter().position(|s| *s == "experts")?;
    let layer: usize = parts[2].parse().ok()?;
    let e: i64 = parts[i + 1].trim_start_matches("expert_").parse().ok()?;
    Some((layer, e))
}

fn plurality(idx: &Tensor, w: &Tensor, mask: &Tensor, e: i64) -> Vec<i64> {
    let sz = idx.size();
    let (b, t, k) = (sz[0], sz[1], sz[2]);
    let idx = Vec::<i64>::try_from(idx.flatten(0, -1)).unwrap();
    let w = Vec::<f64>::try_from(w.to_kind(Kind::Double).flatten(0, -1)).unwrap();
    let m = Vec::<i64>::try_from(mask.flatten(0, -1)).unwrap();
    (0..b)
        .map(|r| {
            let mut score = vec![0.0; e as usize];
            for p in 0..t {
                if m[(r * t + p) as usize] == 1 {
                    for j in 0..k {
                        let q = ((r * t + p) * k + j) as usize;
                        score[idx[q] as usize] += w[q];
                    }
                }
            }
            let mut best = 0;
            for (i, s) in score.iter().enumerate() {
                if *s > score[best] {
                    best = i;
                }
            }
            best as i64
        })
        .collect()
}

#[test]
fn role_wise_and_global_clipping_match_the_reference() {
    let mut m = model(SwitchConfig::tiny());
    freeze_all(&m).unwrap();
    let cfg = LoraConfig {
        r: 2,
        alpha: 4.0,
        dropout: 0.0,
        targets: vec![
            "SelfAttention.q".into(),
            "SelfAttention.v".into(),
            "*.experts.*.w*".into(),
        ],
    };
    attach_lora(&mut m, &cfg).unwrap();
    set_trainable(&m, &["classifier"], true).unwrap();
    m.var_store_mut().double();
    perturb(&m, 0.2);
    let b = batch(m.vocab_size());
    let names = trainable_params(&m);
    let groups = ParamGroups::from_fn(names.iter().cloned(), |p| {
        Some(match expert_of(p) {
            Some((l, e)) => format!("expert[{l},{e}]"),
            None => "shared".into(),
        })
    });
    let mut bounds = BTreeMap::new();
    for (_, g) in groups.iter() {
        bounds.insert(g.to_string(), if g == "shared" { 0.05 } else { 0.02 });
    }
    let owners = BTreeMap::new();
    // Unweighted, then weighted before clipping (RAPTOR residual weights) on every expert group.
    let mut weights = BTreeMap::new();
    for g in bounds.keys().filter(|g| g.starts_with("expert")) {
        weights.insert(
            g.clone(),
            Tensor::from_slice(&[0.5f64, 1.0, 0.0, 0.25, 0.9]),
        );
    }
    assert!(!weights.is_empty(), "no expert group to weight");
    for w in [&BTreeMap::new(), &weights] {
        for policy in [
            ClipPolicy::RoleWise(bounds.clone()),
            ClipPolicy::Global(0.05),
        ] {
            check_clip(&m, &b, &owners, &groups, &policy, w, 1e-9);
        }
    }
    // A weight outside [0, 1] is a typed error naming the group and the record.
    let g = bounds
        .keys()
        .find(|g| g.starts_with("expert"))
        .unwrap()
        .clone();
    let mut bad = BTreeMap::new();
    bad.insert(
        g.clone(),
        Tensor::from_slice(&[0.5f64, 1.0, 1.5, 0.25, 0.9]),
    );
    let eng = engine(&m, &b, &owners);
    for policy in [ClipPolicy::RoleWise(bounds), ClipPolicy::Global(0.05)] {
        let err = eng.clip(&groups, &policy, &bad).unwrap_err();
        assert!(matches!(err, ModelError::InvalidClip(_)), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("record 2") && msg.contains(&g), "{msg}");
    }
}

#[test]
fn f32_engine_matches_reference_to_1e5() {
    tch::manual_seed(3);
    let m = SwitchEncoder::new(SwitchConfig::tiny(), Device::Cpu).unwrap();
    perturb(&m, 0.05);
    let b = batch(m.vocab_size());
    // f32: per-record grads and squared norms agree to 1e-5 relative (measured worst ≈ 2e-6).
    let worst = check_exact(&m, &b, &BTreeMap::new(), 1e-5);
    eprintln!("f32 worst relative error: {worst:e}");
}

#[test]
fn capacity_is_rejected_for_private_training() {
    let mut cfg = SwitchConfig::tiny();
    cfg.expert_capacity = Some(2);
    let m = SwitchEncoder::new(cfg, Device::Cpu).unwrap();
    let err = ClippedStep::new(&m).unwrap_err();
    assert!(matches!(
        err,
        ModelError::CapacityInPrivateTraining { capacity: 2 }
    ));
    let msg = err.to_string();
    // Capacity is per sequence here: the message must not claim it couples records in a batch.
    assert!(msg.contains("per sequence"), "{msg}");
    assert!(!msg.contains("depend on the other records"), "{msg}");
    // Capacity still works for inference: output shape fine, and some token is dropped.
    let b = batch(m.vocab_size());
    let logits = m.forward(&b, &mut ForwardCtx::new(false)).unwrap();
    assert_eq!(logits.size(), vec![5, 3]);
}

#[test]
fn bad_input_is_a_typed_error_naming_the_record() {
    let m = SwitchEncoder::new(SwitchConfig::tiny(), Device::Cpu).unwrap();
    let recs = vec![vec![1, 2, 3], vec![4, 99, 1]];
    let b = Batch::from_records(&recs, 0, Some(&[0, 1]), Device::Cpu).unwrap();
    match m.forward(&b, &mut ForwardCtx::new(false)) {
        Err(ModelError::TokenOutOfRange {
            record: 1,
            position: 1,
            id: 99,
            ..
        }) => {}
        other => panic!("unexpected {other:?}"),
    }
    let empty = Batch::from_records(&[vec![1], vec![]], 0, None, Device::Cpu);
    assert!(matches!(
        empty,
        Err(ModelError::EmptyRecord { record: 1, .. })
    ));
    // All-zero mask on record 0.
    let b2 = Batch {
        input_ids: Tensor::from_slice(&[1i64, 2, 3, 4]).reshape([2, 2]),
        attention_mask: Tensor::from_slice(&[0i64, 0, 1, 1]).reshape([2, 2]),
        labels: Some(Tensor::from_slice(&[0i64, 1])),
        loss_mask: None,
    };
    assert!(matches!(
        m.forward(&b2, &mut ForwardCtx::new(false)),
        Err(ModelError::EmptyRecord { record: 0, .. })
    ));
    // Shape mismatch between ids and mask.
    let b3 = Batch {
        input_ids: Tensor::from_slice(&[1i64, 2, 3, 4]).reshape([2, 2]),
        attention_mask: Tensor::from_slice(&[1i64, 1, 1]).reshape([1, 3]),
        labels: None,
        loss_mask: None,
    };
    assert!(matches!(
        m.forward(&b3, &mut ForwardCtx::new(false)),
        Err(ModelError::ShapeMismatch { .. })
    ));
    // Label out of range.
    let b4 = Batch::from_records(&[vec![1, 2]], 0, Some(&[7]), Device::Cpu).unwrap();
    assert!(matches!(
        m.per_record_loss(&b4, &mut ForwardCtx::new(false)),
        Err(ModelError::LabelOutOfRange {
            record: 0,
            label: 7,
            ..
        })
    ));
    // Owner map of the wrong length.
    let b5 = Batch::from_records(&[vec![1, 2], vec![3]], 0, Some(&[0, 1]), Device::Cpu).unwrap();
    let mut ctx = ForwardCtx::new(false).with_owners(1, Tensor::from_slice(&[0i64]));
    assert!(matches!(
        m.forward(&b5, &mut ctx),
        Err(ModelError::InvalidOwners { layer: 1, .. })
    ));
}

#[test]
fn full_finetune_experts_with_owner_masks_is_exact_and_does_not_leak() {
    let m = model(SwitchConfig::tiny());
    perturb(&m, 0.05);
    let b = batch(m.vocab_size());
    let owners: BTreeMap<usize, Tensor> = [
        (1usize, Tensor::from_slice(&[0i64, 1, 2, 3, 0])),
        (3usize, Tensor::from_slice(&[3i64, 3, 1, 0, 2])),
    ]
    .into();
    check_exact(&m, &b, &owners, TOL);
    let eng = engine(&m, &b, &owners);
    let mut checked = 0;
    for p in eng.params() {
        let Some((layer, e)) = expert_of(&p) else {
            continue;
        };
        let own = Vec::<i64>::try_from(&owners[&layer]).unwrap();
        let sq = Vec::<f64>::try_from(eng.sq_norms(&p).unwrap()).unwrap();
        for (r, o) in own.iter().enumerate() {
            if *o != e {
                assert_eq!(sq[r], 0.0, "{p}: non-owner record {r} leaks");
                checked += 1;
            }
        }
    }
    assert!(checked > 0);
}

/// Switch with LoRA (dropout 0.3) on attention q/v, expert wi/wo (routed rows) and the dense
/// FFN, plus the head, in f32.
fn lora_dropout_model() -> SwitchEncoder {
    tch::manual_seed(5);
    let mut m = SwitchEncoder::new(SwitchConfig::tiny(), Device::Cpu).unwrap();
    freeze_all(&m).unwrap();
    let cfg = LoraConfig {
        r: 3,
        alpha: 6.0,
        dropout: 0.3,
        targets: vec![
            "SelfAttention.q".into(),
            "SelfAttention.v".into(),
            "*.experts.*.w*".into(),
            "mlp.wi".into(),
        ],
    };
    attach_lora(&mut m, &cfg).unwrap();
    set_trainable(&m, &["classifier"], true).unwrap();
    perturb(&m, 0.1);
    m
}

#[test]
fn lora_dropout_is_exact_per_record_in_f32() {
    let m = lora_dropout_model();
    let b = batch(m.vocab_size());
    // Training mode, dropout p = 0.3: each record's masks are keyed by (step seed, record id,
    // adapter), so the single-record loop draws exactly the masks the batch drew.
    let worst = check_exact_seeded(&m, &b, &BTreeMap::new(), 1e-5, Some(42));
    eprintln!("f32 LoRA dropout worst relative error: {worst:e}");
}

#[test]
fn lora_dropout_masks_differ_across_records_and_steps() {
    let m = lora_dropout_model();
    // Five copies of one record: without dropout their gradients would be identical.
    let recs = vec![records(&[6], m.vocab_size(), 3)[0].clone(); 5];
    let b = Batch::from_records(&recs, 0, Some(&[1, 1, 1, 1, 1]), Device::Cpu).unwrap();
    let param = "encoder.block.0.layer.0.SelfAttention.q.lora_A.weight";
    let grads = |seed: Option<u64>| -> Vec<Tensor> {
        let eng = engine_seeded(&m, &b, &BTreeMap::new(), seed);
        (0..5)
            .map(|r| {
                let onehot = Tensor::zeros([5], (Kind::Float, Device::Cpu)).index_fill(
                    0,
                    &Tensor::from_slice(&[r as i64]),
                    1.0,
                );
                eng.weighted_sum(param, &onehot).unwrap()
            })
            .collect()
    };
    let dist = |a: &Tensor, b: &Tensor| (a - b).abs().max().double_value(&[]);
    let no_drop = grads(None);
    // The eval-mode gradients of the five copies are equal (the premise of the test)...
    for g in &no_drop[1..] {
        assert!(dist(g, &no_drop[0]) < 1e-6);
    }
    // ...with dropout, each copy (its own record id) gets its own mask,
    let s1 = grads(Some(1));
    for i in 0..5 {
        for j in i + 1..5 {
            assert!(
                dist(&s1[i], &s1[j]) > 1e-4,
                "records {i} and {j} share a mask"
            );
        }
    }
    // a new step seed gives new masks, and the same seed the same masks.
    let s2 = grads(Some(2));
    let s1_again = grads(Some(1));
    for r in 0..5 {
        assert!(
            dist(&s1[r], &s2[r]) > 1e-4,
            "record {r}: same mask at two steps"
        );
        assert_eq!(
            dist(&s1[r], &s1_again[r]),
            0.0,
            "record {r}: not reproducible"
        );
    }
}

#[test]
fn shared_input_gram_norms_are_exact() {
    // d_kv 8: q/k/v are [16, 16] maps over 7 tokens, for which the ghost norm is cheaper than
    // materializing, so their norms share the activation Gram of their common input. One group
    // per parameter: every group norm the clip reports is one parameter's, checked against the
    // loop.
    let m = model(SwitchConfig {
        d_kv: 8,
        ..SwitchConfig::tiny()
    });
    perturb(&m, 0.05);
    let b = batch(m.vocab_size());
    let names = trainable_params(&m);
    let groups = ParamGroups::from_fn(names.iter().cloned(), |p| Some(p.to_string()));
    let bounds = names.iter().map(|n| (n.clone(), 1e-3)).collect();
    check_clip(
        &m,
        &b,
        &BTreeMap::new(),
        &groups,
        &ClipPolicy::RoleWise(bounds),
        &BTreeMap::new(),
        TOL,
    );
    check_exact(&m, &b, &BTreeMap::new(), TOL);
}

#[test]
fn private_lora_dropout_without_record_ids_is_refused() {
    let m = lora_dropout_model();
    let b = batch(m.vocab_size());
    // Keyed by batch position, a record's mask would depend on who else was sampled.
    let err = ClippedStep::new(&m)
        .unwrap()
        .with_dropout_seed(3)
        .per_sample(&b, &BTreeMap::new(), true)
        .unwrap_err();
    assert!(err.to_string().contains("record"), "{err}");
    // With ids it runs; in eval mode (no dropout) ids are not needed.
    let ids: Vec<u64> = (0..b.batch_size() as u64).map(|i| 1000 + i).collect();
    assert!(
        ClippedStep::new(&m)
            .unwrap()
            .with_dropout_seed(3)
            .with_record_ids(ids)
            .per_sample(&b, &BTreeMap::new(), true)
            .is_ok()
    );
    assert!(
        ClippedStep::new(&m)
            .unwrap()
            .per_sample(&b, &BTreeMap::new(), false)
            .is_ok()
    );
}

/// Per-sample engine with record 1's loss scaled by `scale` (NaN makes its whole gradient
/// NaN; 0 removes it).
fn engine_scaled(m: &SwitchEncoder, b: &Batch, scale: f64) -> raptor_models::PerSampleGrads {
    let mut ctx = ForwardCtx::private(false);
    let losses = m.per_record_loss(b, &mut ctx).unwrap();
    let n = b.batch_size();
    let mut w = vec![1.0f64; n as usize];
    w[1] = scale;
    let w = Tensor::from_slice(&w).to_kind(losses.kind());
    let loss = (losses * w).sum(Kind::Double);
    let tape = ctx.take_tape().unwrap_or_default();
    raptor_models::PerSampleGrads::compute(tape, &loss, n).unwrap()
}

/// A record whose gradient is NaN does not abort the step (an error naming it would depend on
/// private data): it contributes zero in every group (factor 0), and the clipped sums equal
/// those of the batch in which that record's gradient is zero, for role-wise and global
/// clipping, with `clip` and `into_clip`.
#[test]
fn non_finite_record_contributes_zero() {
    let mut m = model(SwitchConfig::tiny());
    freeze_all(&m).unwrap();
    let cfg = LoraConfig {
        r: 2,
        alpha: 4.0,
        dropout: 0.0,
        targets: vec!["SelfAttention.q".into(), "*.experts.*.w*".into()],
    };
    attach_lora(&mut m, &cfg).unwrap();
    set_trainable(&m, &["classifier"], true).unwrap();
    m.var_store_mut().double();
    perturb(&m, 0.2);
    let b = batch(m.vocab_size());
    let names = trainable_params(&m);
    let groups = ParamGroups::from_fn(names.iter().cloned(), |p| {
        Some(match expert_of(p) {
            Some((l, e)) => format!("expert[{l},{e}]"),
            None => "shared".into(),
        })
    });
    let mut bounds = BTreeMap::new();
    for (_, g) in groups.iter() {
        bounds.insert(g.to_string(), 0.05);
    }
    let none = BTreeMap::new();
    for policy in [ClipPolicy::RoleWise(bounds), ClipPolicy::Global(0.05)] {
        let reference = engine_scaled(&m, &b, 0.0)
            .clip(&groups, &policy, &none)
            .unwrap();
        for into in [false, true] {
            let eng = engine_scaled(&m, &b, f64::NAN);
            let out = if into {
                eng.into_clip(&groups, &policy, &none)
            } else {
                eng.clip(&groups, &policy, &none)
            }
            .unwrap();
            for (g, f) in &out.clip_factors {
                let f = Vec::<f64>::try_from(f.to_kind(Kind::Double)).unwrap();
                assert_eq!(f[1], 0.0, "group {g}: the NaN record's factor");
            }
            for (p, s) in &out.sums {
                let got = Vec::<f64>::try_from(s.reshape([-1])).unwrap();
                let want = Vec::<f64>::try_from(reference.sums[p].reshape([-1])).unwrap();
                for (x, y) in got.iter().zip(&want) {
                    assert!(x.is_finite(), "{p}: non-finite sum");
                    assert!((x - y).abs() <= 1e-12 * (1.0 + y.abs()), "{p}: {x} vs {y}");
                }
            }
        }
    }
}

/// A LoRA Switch model (attention q, v and every expert matrix adapted, classifier trainable),
/// its batch, the role-wise groups and bounds small enough that records are clipped.
fn lora_switch() -> (
    SwitchEncoder,
    Batch,
    ParamGroups<String>,
    BTreeMap<String, f64>,
) {
    let mut m = model(SwitchConfig::tiny());
    freeze_all(&m).unwrap();
    let cfg = LoraConfig {
        r: 2,
        alpha: 4.0,
        dropout: 0.0,
        targets: vec![
            "SelfAttention.q".into(),
            "SelfAttention.v".into(),
            "*.experts.*.w*".into(),
        ],
    };
    attach_lora(&mut m, &cfg).unwrap();
    set_trainable(&m, &["classifier"], true).unwrap();
    m.var_store_mut().double();
    perturb(&m, 0.2);
    let b = batch(m.vocab_size());
    let names = trainable_params(&m);
    let groups = ParamGroups::from_fn(names.iter().cloned(), |p| {
        Some(match expert_of(p) {
            Some((l, e)) => format!("expert[{l},{e}]"),
            None => "shared".into(),
        })
    });
    let mut bounds = BTreeMap::new();
    for (_, g) in groups.iter() {
        bounds.insert(g.to_string(), if g == "shared" { 0.05 } else { 0.02 });
    }
    (m, b, groups, bounds)
}

/// The parameters the cache keeps under `budget` elements, by the rule it documents: the
/// materialized parameters in name order, chunk by chunk of `per_chunk` records; a parameter
/// whose next chunk does not fit is dropped whole (its kept chunks are given back).
fn expected_cache(
    materialized: &std::collections::BTreeSet<String>,
    numel: &BTreeMap<String, i64>,
    batch: i64,
    per_chunk: i64,
    budget: i64,
) -> std::collections::BTreeSet<String> {
    let mut used = 0i64;
    let mut kept = std::collections::BTreeSet::new();
    for p in materialized {
        let mut mine = 0i64;
        let mut fits = true;
        let mut r0 = 0;
        while r0 < batch {
            let n = per_chunk.min(batch - r0);
            let need = n * numel[p];
            if used + need > budget {
                used -= mine;
                fits = false;
                break;
            }
            used += need;
            mine += need;
            r0 += n;
        }
        if fits {
            kept.insert(p.clone());
        }
    }
    kept
}

/// Memory limits change how the engine cuts up its work and what it keeps between the norm
/// pass and the sums, never a result: per-record gradients, norms and clipped sums match the
/// loop of single-record passes with one record per chunk (routed expert rows padded chunk by
/// chunk), with the whole batch in one chunk, and with cache budgets from nothing to
/// everything; the cache serves exactly the parameters its budget rule admits.
#[test]
fn engine_limits_change_no_result_and_the_cache_keeps_what_fits() {
    use raptor_models::EngineLimits;
    let (m, b, groups, bounds) = lora_switch();
    let owners = BTreeMap::new();
    let policy = ClipPolicy::RoleWise(bounds);
    let none = BTreeMap::new();
    let bsz = b.batch_size();
    let vars: BTreeMap<String, Tensor> = m.var_store().variables().into_iter().collect();
    let numel: BTreeMap<String, i64> = vars
        .iter()
        .map(|(n, t)| (n.clone(), t.numel() as i64))
        .collect();
    // A budget no pass reaches: every materialized parameter is served from the cache.
    let unbounded = EngineLimits {
        chunk_elems: i64::MAX,
        cache_elems: Some(i64::MAX / 4),
    };
    let (all, all_consumed) =
        check_clip_limits(&m, &b, &owners, &groups, &policy, &none, 1e-9, unbounded);
    assert_eq!(all, all_consumed);
    assert!(
        all.iter().any(|p| p.contains("experts")) && all.iter().any(|p| p.contains("Attention")),
        "expected attention and expert LoRA factors to be materialized: {all:?}"
    );
    assert!(all.iter().all(|p| p.contains("lora")), "{all:?}");
    // The default budget (the pass's output gradients) keeps only materialized factors.
    let (default_kept, _) = check_clip_limits(
        &m,
        &b,
        &owners,
        &groups,
        &policy,
        &none,
        1e-9,
        EngineLimits::default(),
    );
    assert!(default_kept.is_subset(&all), "{default_kept:?}");
    let first = all.iter().next().unwrap().clone();
    let second = all.iter().nth(1).unwrap().clone();
    let one = numel[&first];
    for per_chunk in [1i64, bsz] {
        let chunk_elems = if per_chunk == 1 { 1 } else { i64::MAX };
        // Which parameters the norm pass materializes depends on the rows per chunk (one
        // record per chunk sends the routed expert factors down the ghost path): take the set
        // from an unbounded cache with the same chunking.
        let (materialized, _) = check_clip_limits(
            &m,
            &b,
            &owners,
            &groups,
            &policy,
            &none,
            1e-9,
            EngineLimits {
                chunk_elems,
                cache_elems: Some(i64::MAX / 4),
            },
        );
        assert!(materialized.is_subset(&all), "{materialized:?}");
        assert!(materialized.contains(&first) && materialized.contains(&second));
        let budgets = [
            0,
            bsz * one - 1,
            bsz * one,
            one * 5 / 2,
            bsz * one + bsz * numel[&second],
            i64::MAX / 4,
        ];
        for budget in budgets {
            let limits = EngineLimits {
                chunk_elems,
                cache_elems: Some(budget),
            };
            let want = expected_cache(&materialized, &numel, bsz, per_chunk, budget);
            let (kept, consumed) =
                check_clip_limits(&m, &b, &owners, &groups, &policy, &none, 1e-9, limits);
            assert_eq!(kept, want, "borrowing clip, {limits:?}");
            assert_eq!(consumed, want, "consuming clip, {limits:?}");
        }
        let worst = check_exact_limits(
            &m,
            &b,
            &owners,
            TOL,
            EngineLimits {
                chunk_elems,
                cache_elems: None,
            },
        );
        assert!(worst <= TOL);
    }
    // The budgets above do tell the rule apart: exactly one parameter's worth keeps it alone.
    assert_eq!(
        expected_cache(&all, &numel, bsz, 1, bsz * one),
        [first.clone()].into_iter().collect()
    );
    assert!(expected_cache(&all, &numel, bsz, 1, bsz * one - 1).len() < all.len());
    // Limits below their domain are errors, not a silent change.
    for bad in [
        EngineLimits {
            chunk_elems: 0,
            cache_elems: None,
        },
        EngineLimits {
            chunk_elems: 1,
            cache_elems: Some(-1),
        },
    ] {
        let err = engine(&m, &b, &owners).with_limits(bad).unwrap_err();
        assert!(matches!(err, ModelError::InvalidConfig(_)), "{err}");
    }
}

/// A clipping bound that is not finite and positive, or a group without a bound, is a typed
/// error from both clipping forms, whatever the policy.
#[test]
fn clip_bounds_must_be_finite_and_positive() {
    let (m, b, groups, bounds) = lora_switch();
    let owners = BTreeMap::new();
    let none = BTreeMap::new();
    let expert = bounds
        .keys()
        .find(|g| g.starts_with("expert"))
        .unwrap()
        .clone();
    // The engine's Debug form names its batch size and parameters.
    let dbg = format!("{:?}", engine(&m, &b, &owners));
    assert!(
        dbg.starts_with("PerSampleGrads")
            && dbg.contains(&format!("batch_size: {}", b.batch_size()))
            && dbg.contains("lora"),
        "{dbg}"
    );
    for bad in [0.0, -0.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let mut role = bounds.clone();
        role.insert(expert.clone(), bad);
        for policy in [ClipPolicy::RoleWise(role), ClipPolicy::Global(bad)] {
            let eng = engine(&m, &b, &owners);
            let err = eng.clip(&groups, &policy, &none).unwrap_err();
            assert!(
                matches!(err, ModelError::InvalidClip(_)),
                "{policy:?}: {err}"
            );
            assert!(err.to_string().contains("finite and > 0"), "{err}");
            let err = eng.into_clip(&groups, &policy, &none).unwrap_err();
            assert!(
                matches!(err, ModelError::InvalidClip(_)),
                "{policy:?}: {err}"
            );
        }
    }
    // The smallest positive bound is accepted (the check is `> 0`, not `≥ some margin`).
    let mut role = bounds.clone();
    role.insert(expert.clone(), f64::MIN_POSITIVE);
    for policy in [
        ClipPolicy::RoleWise(role),
        ClipPolicy::Global(f64::MIN_POSITIVE),
    ] {
        engine(&m, &b, &owners)
            .clip(&groups, &policy, &none)
            .unwrap();
    }
    let mut missing = bounds.clone();
    missing.remove(&expert);
    let err = engine(&m, &b, &owners)
        .clip(&groups, &ClipPolicy::RoleWise(missing), &none)
        .unwrap_err();
    assert!(
        matches!(&err, ModelError::InvalidClip(msg) if msg.contains(&expert)),
        "{err}"
    );
}

/// A record's owner is a function of that record alone: `owners_per_record` gives every
/// record the owner it gets when routed by itself, and adding or removing other records (which
/// changes the longest record, hence the padding of a shared micro-batch) changes no owner.
#[test]
fn owners_per_record_do_not_depend_on_the_other_records() {
    let m = {
        let _rng = raptor_models::rng::global_rng();
        model(SwitchConfig::tiny())
    };
    let vocab = m.vocab_size();
    let lens: Vec<usize> = (0..24).map(|i| 1 + (i * 7) % 13).collect();
    let recs = records(&lens, vocab, 29);
    let rule = raptor_routing::OwnerRule::GateWeighted;
    let all = raptor_models::owners_per_record(&m, &recs, 0, rule, Device::Cpu).unwrap();
    assert_eq!(all.keys().copied().collect::<Vec<_>>(), m.sparse_layers());
    // Alone.
    for (i, r) in recs.iter().enumerate() {
        let one =
            raptor_models::owners_per_record(&m, std::slice::from_ref(r), 0, rule, Device::Cpu)
                .unwrap();
        for (l, o) in &one {
            assert_eq!(o, &vec![all[l][i]], "record {i}, layer {l}");
        }
    }
    // Every third record removed, and a long record added in front.
    let mut sub: Vec<Vec<i64>> = vec![records(&[40], vocab, 3).remove(0)];
    let kept: Vec<usize> = (0..recs.len()).filter(|i| i % 3 != 0).collect();
    sub.extend(kept.iter().map(|&i| recs[i].clone()));
    let other = raptor_models::owners_per_record(&m, &sub, 0, rule, Device::Cpu).unwrap();
    for (l, o) in &other {
        for (j, &i) in kept.iter().enumerate() {
            assert_eq!(o[j + 1], all[l][i], "record {i}, layer {l}");
        }
    }
    // Owners are experts of the layer.
    let e = m.num_experts();
    assert!(all.values().flatten().all(|&o| (0..e).contains(&o)));
}

/// A Switch encoder whose router decisions depend on the other records of a padded batch, as
/// a near-tie of two router logits can when padding changes the shapes of the float
/// reductions: in a batch of several records, every record shorter than the batch's longest
/// has each routed token sent to the next expert. Routed alone (a batch of one, no padding),
/// every record gets the inner model's decisions.
struct PaddingSensitive(SwitchEncoder);

impl Model for PaddingSensitive {
    fn var_store(&self) -> &tch::nn::VarStore {
        self.0.var_store()
    }
    fn var_store_mut(&mut self) -> &mut tch::nn::VarStore {
        self.0.var_store_mut()
    }
    fn vocab_size(&self) -> i64 {
        self.0.vocab_size()
    }
    fn task(&self) -> raptor_models::Task {
        self.0.task()
    }
    fn num_labels(&self) -> Option<i64> {
        self.0.num_labels()
    }
    fn sparse_layers(&self) -> Vec<usize> {
        self.0.sparse_layers()
    }
    fn num_experts(&self) -> i64 {
        self.0.num_experts()
    }
    fn top_k(&self) -> i64 {
        self.0.top_k()
    }
    fn linears_mut(&mut self) -> (&tch::nn::VarStore, Vec<&mut raptor_models::Linear>) {
        self.0.linears_mut()
    }
    fn forward(&self, batch: &Batch, ctx: &mut ForwardCtx) -> raptor_models::Result<Tensor> {
        let out = self.0.forward(batch, ctx)?;
        let b = batch.input_ids.size()[0];
        if b > 1 {
            let e = self.0.num_experts();
            // Records with padding: those whose mask is not all ones.
            let padded = batch
                .attention_mask
                .min_dim(1, false)
                .0
                .eq(0)
                .view([b, 1, 1]);
            for r in &mut ctx.routing {
                let shifted = (&r.indices + 1).remainder(e);
                r.indices = shifted.where_self(&padded, &r.indices);
            }
        }
        Ok(out)
    }
}

/// Owners are computed per record: a model whose routing depends on a padded micro-batch's
/// other records (the wrapper above) gives every record, through `owners_per_record`, the owner
/// it gets alone — while the same model routed over one padded batch (what a regression to
/// batched routing would compute) gives other owners, so this test can fail.
#[test]
fn owners_are_routed_one_record_at_a_time() {
    let m = PaddingSensitive({
        let _rng = raptor_models::rng::global_rng();
        model(SwitchConfig::tiny())
    });
    let vocab = m.vocab_size();
    let lens: Vec<usize> = (0..12).map(|i| 2 + (i * 5) % 9).collect();
    let recs = records(&lens, vocab, 31);
    let rule = raptor_routing::OwnerRule::GateWeighted;
    let per_record = raptor_models::owners_per_record(&m, &recs, 0, rule, Device::Cpu).unwrap();
    let inner = raptor_models::owners_per_record(&m.0, &recs, 0, rule, Device::Cpu).unwrap();
    assert_eq!(per_record, inner);
    // Routed as one padded batch, the padded records' owners move.
    let batch = Batch::from_records(&recs, 0, None, Device::Cpu).unwrap();
    let batched =
        raptor_models::owner_tensors(&m, std::iter::once(&batch), rule, Device::Cpu).unwrap();
    let moved: usize = batched
        .iter()
        .map(|(l, t)| {
            let v: Vec<i64> = Vec::try_from(t).unwrap();
            v.iter().zip(&per_record[l]).filter(|(a, b)| a != b).count()
        })
        .sum();
    assert!(
        moved > 0,
        "batched routing of the padding-sensitive model moved no owner: the test could not see a regression"
    );
}
