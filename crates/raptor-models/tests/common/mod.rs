//! Shared test helpers: the slow reference (a loop of single-record backward passes) and
//! comparison of the per-sample engine against it.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use raptor_models::{
    Batch, ClipPolicy, ClippedStep, EngineLimits, ForwardCtx, Model, ParamGroups, PerSampleGrads,
    trainable_params,
};
use std::collections::{BTreeMap, BTreeSet};
use tch::{Kind, Tensor};

/// Adds N(0, std²) noise to every variable (so LoRA B ≠ 0 and biases ≠ 0).
pub fn perturb<M: Model>(model: &M, std: f64) {
    // By name: `variables()` is a HashMap whose order changes from run to run.
    let mut vars: Vec<(String, Tensor)> = model.var_store().variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    tch::no_grad(|| {
        for (_, t) in vars {
            let mut t = t;
            let n = t.randn_like() * std;
            let _ = t.f_add_(&n).unwrap();
        }
    });
}

/// Per-record gradients of every trainable parameter by a loop of single-record backward
/// passes (the obviously correct reference).
pub fn reference_grads<M: Model>(
    model: &M,
    batch: &Batch,
    owners: &BTreeMap<usize, Tensor>,
) -> BTreeMap<String, Vec<Tensor>> {
    reference_grads_seeded(model, batch, owners, None)
}

/// Record ids used by the dropout tests (not the batch positions, so that the keying by id is
/// what is tested).
pub fn record_id(b: i64) -> u64 {
    1000 + 7 * b as u64
}

/// [`reference_grads`]; with `dropout_seed`, in training mode (LoRA dropout on) with that step
/// seed and record ids [`record_id`]: each record alone in its own pass.
pub fn reference_grads_seeded<M: Model>(
    model: &M,
    batch: &Batch,
    owners: &BTreeMap<usize, Tensor>,
    dropout_seed: Option<u64>,
) -> BTreeMap<String, Vec<Tensor>> {
    let params: Vec<(String, Tensor)> = {
        let vars = model.var_store().variables();
        trainable_params(model)
            .into_iter()
            .map(|n| {
                let t = vars[&n].shallow_clone();
                (n, t)
            })
            .collect()
    };
    let mut out: BTreeMap<String, Vec<Tensor>> = BTreeMap::new();
    for b in 0..batch.batch_size() {
        let sub = batch.narrow(b, 1).unwrap();
        let mut ctx = ForwardCtx::new(dropout_seed.is_some());
        ctx.dropout_seed = dropout_seed;
        ctx.record_ids = Some(vec![record_id(b)]);
        for (l, o) in owners {
            ctx.owners.insert(*l, o.narrow(0, b, 1));
        }
        for (_, p) in &params {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        let losses = model.per_record_loss(&sub, &mut ctx).unwrap();
        let loss = losses.sum(Kind::Double).to_kind(losses.kind());
        loss.backward();
        for (n, p) in &params {
            let g = p.grad();
            let g = if g.defined() {
                g.copy()
            } else {
                p.zeros_like()
            };
            out.entry(n.clone()).or_default().push(g);
        }
    }
    for (_, p) in &params {
        let mut g = p.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
    out
}

/// Engine output for the same batch.
pub fn engine<M: Model>(
    model: &M,
    batch: &Batch,
    owners: &BTreeMap<usize, Tensor>,
) -> PerSampleGrads {
    engine_seeded(model, batch, owners, None)
}

/// [`engine`]; with `dropout_seed`, in training mode with that step seed and ids [`record_id`].
pub fn engine_seeded<M: Model>(
    model: &M,
    batch: &Batch,
    owners: &BTreeMap<usize, Tensor>,
    dropout_seed: Option<u64>,
) -> PerSampleGrads {
    engine_full(model, batch, owners, dropout_seed, EngineLimits::default())
}

/// [`engine`] under `limits`.
pub fn engine_limits<M: Model>(
    model: &M,
    batch: &Batch,
    owners: &BTreeMap<usize, Tensor>,
    limits: EngineLimits,
) -> PerSampleGrads {
    engine_full(model, batch, owners, None, limits)
}

fn engine_full<M: Model>(
    model: &M,
    batch: &Batch,
    owners: &BTreeMap<usize, Tensor>,
    dropout_seed: Option<u64>,
    limits: EngineLimits,
) -> PerSampleGrads {
    let mut step = ClippedStep::new(model)
        .unwrap()
        .with_record_ids((0..batch.batch_size()).map(record_id).collect());
    if let Some(s) = dropout_seed {
        step = step.with_dropout_seed(s);
    }
    step.per_sample(batch, owners, dropout_seed.is_some())
        .unwrap()
        .1
        .with_limits(limits)
        .unwrap()
}

fn norm(t: &Tensor) -> f64 {
    t.to_kind(Kind::Double)
        .square()
        .sum(Kind::Double)
        .sqrt()
        .double_value(&[])
}

/// Checks every trainable parameter's per-record gradient and squared norm against the
/// reference; returns the worst relative error. `tol` is relative to the gradient's norm
/// (absolute `tol` when the reference gradient is zero).
pub fn check_exact<M: Model>(
    model: &M,
    batch: &Batch,
    owners: &BTreeMap<usize, Tensor>,
    tol: f64,
) -> f64 {
    check_exact_seeded(model, batch, owners, tol, None)
}

/// [`check_exact`]; with `dropout_seed`, in training mode (LoRA dropout on, see
/// [`reference_grads_seeded`]).
pub fn check_exact_seeded<M: Model>(
    model: &M,
    batch: &Batch,
    owners: &BTreeMap<usize, Tensor>,
    tol: f64,
    dropout_seed: Option<u64>,
) -> f64 {
    check_exact_full(
        model,
        batch,
        owners,
        tol,
        dropout_seed,
        EngineLimits::default(),
    )
}

/// [`check_exact`] with the engine under `limits`.
pub fn check_exact_limits<M: Model>(
    model: &M,
    batch: &Batch,
    owners: &BTreeMap<usize, Tensor>,
    tol: f64,
    limits: EngineLimits,
) -> f64 {
    check_exact_full(model, batch, owners, tol, None, limits)
}

fn check_exact_full<M: Model>(
    model: &M,
    batch: &Batch,
    owners: &BTreeMap<usize, Tensor>,
    tol: f64,
    dropout_seed: Option<u64>,
    limits: EngineLimits,
) -> f64 {
    let reference = reference_grads_seeded(model, batch, owners, dropout_seed);
    let eng = engine_full(model, batch, owners, dropout_seed, limits);
    let bsz = batch.batch_size();
    let eng_params = eng.params();
    let mut worst = 0.0f64;
    let mut nonzero = 0usize;
    for (name, per) in &reference {
        let any = per.iter().any(|g| norm(g) > 0.0);
        if !eng_params.contains(name) {
            // A trainable parameter unused in this pass: its reference must be zero.
            assert!(
                !any,
                "{name}: engine has no gradient but the reference is nonzero"
            );
            continue;
        }
        let sq = Vec::<f64>::try_from(eng.sq_norms(name).unwrap().to_kind(Kind::Double)).unwrap();
        // Errors are relative to the largest of this parameter's per-record gradients (a
        // normwise bound over the batch), not to each record's own: a record whose true
        // gradient is zero (a one-token record's query and key maps: attention over one key)
        // gets round-off of either sign from both sides, which no bound relative to its own
        // norm could hold (libtorch's fused attention leaves ~1e-8 there in f32, where the
        // explicit softmax backward happened to cancel to exactly 0).
        let scale = per.iter().map(norm).fold(0.0f64, f64::max);
        for b in 0..bsz {
            let onehot = Tensor::zeros([bsz], (Kind::Double, batch.input_ids.device())).index_fill(
                0,
                &Tensor::from_slice(&[b]),
                1.0,
            );
            let g = eng.weighted_sum(name, &onehot).unwrap();
            let r = &per[b as usize];
            assert_eq!(g.size(), r.size(), "{name}: shape");
            let rn = norm(r);
            let diff = norm(&(g.to_kind(Kind::Double) - r.to_kind(Kind::Double)));
            let rel = if scale > 0.0 { diff / scale } else { diff };
            assert!(
                rel <= tol,
                "{name} record {b}: grad rel err {rel:e} (ref norm {rn:e})"
            );
            let sq_ref = rn * rn;
            let sq_rel = if scale > 0.0 {
                (sq[b as usize] - sq_ref).abs() / (scale * scale)
            } else {
                sq[b as usize].abs()
            };
            assert!(
                sq_rel <= tol,
                "{name} record {b}: sq-norm rel err {sq_rel:e} ({} vs {sq_ref})",
                sq[b as usize]
            );
            worst = worst.max(rel).max(sq_rel);
            if rn > 0.0 {
                nonzero += 1;
            }
        }
    }
    assert!(
        nonzero > 0,
        "all reference gradients are zero: the test would prove nothing"
    );
    // The consuming clip (ClippedStep::run's path, which frees each op after its sums) over all
    // parameters with one global bound: its sums are the loop's gradients clipped and summed.
    let groups = ParamGroups::from_fn(eng_params.iter().cloned(), |_| Some("all"));
    let tot: Vec<f64> = (0..bsz as usize)
        .map(|b| {
            eng_params
                .iter()
                .map(|n| norm(&reference[n][b]).powi(2))
                .sum::<f64>()
                .sqrt()
        })
        .collect();
    let mut sorted = tot.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let bound = 0.5 * sorted[sorted.len() / 2] + 1e-30;
    let out = eng
        .into_clip(&groups, &ClipPolicy::Global(bound), &BTreeMap::new())
        .unwrap();
    for name in &eng_params {
        let per = &reference[name];
        let mut want = per[0].zeros_like().to_kind(Kind::Double);
        for (b, gb) in per.iter().enumerate() {
            let f = if tot[b] > 0.0 {
                (bound / tot[b]).min(1.0)
            } else {
                1.0
            };
            want += gb.to_kind(Kind::Double) * f;
        }
        let got = out.sums[name].to_kind(Kind::Double);
        let wn = norm(&want);
        let diff = norm(&(got - &want));
        let rel = if wn > 0.0 { diff / wn } else { diff };
        assert!(rel <= tol, "{name}: into_clip sum rel err {rel:e}");
        worst = worst.max(rel);
    }
    worst
}

/// Checks clipped sums (role-wise and global) against clipping the reference grads.
pub fn check_clip<M: Model>(
    model: &M,
    batch: &Batch,
    owners: &BTreeMap<usize, Tensor>,
    groups: &ParamGroups<String>,
    policy: &ClipPolicy<String>,
    weights: &BTreeMap<String, Tensor>,
    tol: f64,
) {
    check_clip_limits(
        model,
        batch,
        owners,
        groups,
        policy,
        weights,
        tol,
        EngineLimits::default(),
    );
}

/// [`check_clip`] with the engine under `limits`; returns the parameters whose sums came from
/// the engine's cache ([`raptor_models::ClipOutput::from_cache`]) in the borrowing and in the
/// consuming form.
#[allow(clippy::too_many_arguments)]
pub fn check_clip_limits<M: Model>(
    model: &M,
    batch: &Batch,
    owners: &BTreeMap<usize, Tensor>,
    groups: &ParamGroups<String>,
    policy: &ClipPolicy<String>,
    weights: &BTreeMap<String, Tensor>,
    tol: f64,
    limits: EngineLimits,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let reference = reference_grads(model, batch, owners);
    let eng = engine_limits(model, batch, owners, limits);
    // The borrowing form and the consuming one (ClippedStep::run's) must agree with the loop.
    let kept = eng.clip(groups, policy, weights).unwrap();
    let consumed = eng.into_clip(groups, policy, weights).unwrap();
    let served = (kept.from_cache.clone(), consumed.from_cache.clone());
    for out in [kept, consumed] {
        check_clip_output(&reference, &out, batch, groups, policy, weights, tol);
    }
    served
}

fn check_clip_output(
    reference: &BTreeMap<String, Vec<Tensor>>,
    out: &raptor_models::ClipOutput<String>,
    batch: &Batch,
    groups: &ParamGroups<String>,
    policy: &ClipPolicy<String>,
    weights: &BTreeMap<String, Tensor>,
    tol: f64,
) {
    let bsz = batch.batch_size() as usize;
    // Reference group norms (with weights).
    let mut gsq: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (name, per) in reference {
        let g = groups.group_of(name).unwrap().to_string();
        let e = gsq.entry(g).or_insert(vec![0.0; bsz]);
        for b in 0..bsz {
            let n = norm(&per[b]);
            e[b] += n * n;
        }
    }
    let w_of = |g: &str, b: usize| -> f64 {
        weights
            .get(g)
            .map(|w| w.double_value(&[b as i64]))
            .unwrap_or(1.0)
    };
    let mut fac: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    match policy {
        ClipPolicy::RoleWise(bounds) => {
            for (g, v) in &gsq {
                let c = bounds[g];
                fac.insert(
                    g.clone(),
                    (0..bsz)
                        .map(|b| {
                            let n = (v[b] * w_of(g, b).powi(2)).sqrt();
                            if n > 0.0 { (c / n).min(1.0) } else { 1.0 }
                        })
                        .collect(),
                );
            }
        }
        ClipPolicy::Global(c) => {
            let tot: Vec<f64> = (0..bsz)
                .map(|b| {
                    gsq.iter()
                        .map(|(g, v)| v[b] * w_of(g, b).powi(2))
                        .sum::<f64>()
                        .sqrt()
                })
                .collect();
            for g in gsq.keys() {
                fac.insert(
                    g.clone(),
                    tot.iter()
                        .map(|&n| if n > 0.0 { (c / n).min(1.0) } else { 1.0 })
                        .collect(),
                );
            }
        }
    }
    let mut clipped_any = false;
    for (name, per) in reference {
        let g = groups.group_of(name).unwrap();
        let mut want = per[0].zeros_like().to_kind(Kind::Double);
        for (b, gb) in per.iter().enumerate() {
            let f = fac[g][b];
            if f < 1.0 {
                clipped_any = true;
            }
            want += gb.to_kind(Kind::Double) * (f * w_of(g, b));
        }
        let got = match out.sums.get(name) {
            Some(t) => t.to_kind(Kind::Double),
            None => {
                assert!(norm(&want) == 0.0, "{name}: missing sum");
                continue;
            }
        };
        let wn = norm(&want);
        let diff = norm(&(got - &want));
        let rel = if wn > 0.0 { diff / wn } else { diff };
        assert!(rel <= tol, "{name}: clipped sum rel err {rel:e}");
    }
    assert!(clipped_any, "no record was clipped: pick smaller bounds");
    for (g, v) in &gsq {
        let Some(got) = out.group_sq_norms.get(g) else {
            // A group none of whose parameters was used in this pass (an expert that got no
            // token): absent from the engine's output, zero in the loop's.
            assert!(
                v.iter().all(|x| *x == 0.0),
                "group {g}: missing from the engine"
            );
            continue;
        };
        let got = Vec::<f64>::try_from(got.to_kind(Kind::Double)).unwrap();
        for b in 0..bsz {
            let want = v[b] * w_of(g, b).powi(2);
            let rel = if want > 0.0 {
                (got[b] - want).abs() / want
            } else {
                got[b].abs()
            };
            assert!(rel <= tol, "group {g} record {b}: sq norm rel err {rel:e}");
        }
    }
}

/// Random right-padded records of lengths `lens`.
pub fn records(lens: &[usize], vocab: i64, seed: u64) -> Vec<Vec<i64>> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    lens.iter()
        .map(|&l| {
            (0..l)
                .map(|_| {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((s >> 33) % (vocab as u64 - 1)) as i64 + 1
                })
                .collect()
        })
        .collect()
}
