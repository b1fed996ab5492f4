//! Clipping: clip factors from squared norms under raptor-clip's grouped-clipping policy
//! ([`ClipPolicy`] over [`ParamGroups`]: role-wise by parameter group, global, per matrix), the
//! borrowing `clip` and the consuming `into_clip` that frees each op after its sums, and the
//! clip output.

use super::PerSampleGrads;
use super::site::compute_kind;
use crate::error::{ModelError, Result};
use raptor_clip::ClipError;
use raptor_clip::linear::clip_coefficients;
/// Grouped clipping by parameter name: raptor-clip's one definition, which the engine uses
/// (groups keyed by any [`GroupKey`] of the caller's).
pub use raptor_clip::{ClipPolicy, GroupKey, ParamGroups};
use std::collections::{BTreeMap, BTreeSet};
use tch::{Kind, Tensor};

impl PerSampleGrads {
    /// Norms by group, clip factors and the per-parameter coefficients `factor · weight`.
    #[allow(clippy::type_complexity)]
    pub(super) fn clip_coeffs<K: GroupKey>(
        &self,
        groups: &ParamGroups<K>,
        policy: &ClipPolicy<K>,
        weights: &BTreeMap<K, Tensor>,
    ) -> Result<(
        BTreeMap<K, Tensor>,
        BTreeMap<K, Tensor>,
        BTreeMap<String, Tensor>,
        bool,
    )> {
        let b = self.batch_size;
        let dev = self.device;
        // The policy is checked whole, before any norm: every bound it holds, and (per group)
        // a bound for every group of `groups`, whether or not this batch reaches the group (a
        // routed expert no record chose is absent from the pass; an error that appeared only
        // when a record reaches it would depend on private data).
        policy.check(groups).map_err(|e| match e {
            ClipError::InvalidGrouping { reason } => ModelError::InvalidClip(reason),
            other => ModelError::InvalidClip(other.to_string()),
        })?;
        let mut group_sq: BTreeMap<K, Tensor> = BTreeMap::new();
        let mut members: BTreeMap<&K, Vec<String>> = BTreeMap::new();
        for p in self.uses.keys() {
            let g = groups
                .group_of(p)
                .ok_or_else(|| ModelError::UngroupedParameter { param: p.clone() })?;
            members.entry(g).or_default().push(p.clone());
        }
        // One parameter at a time (each one's temporaries are freed before the next), except
        // linear weights sharing an input, which share its Gram matrices.
        let mut shared = self.shared_input_norms()?;
        for p in self.uses.keys() {
            let g = groups
                .group_of(p)
                .ok_or_else(|| ModelError::UngroupedParameter { param: p.clone() })?;
            let n = match shared.remove(p) {
                Some(n) => n,
                None => self.sq_norms(p)?,
            };
            match group_sq.get_mut(g) {
                Some(e) => *e = e.f_add(&n)?,
                None => {
                    group_sq.insert(g.clone(), n);
                }
            }
        }
        // A record whose gradient has a NaN or infinite entry (a non-finite squared norm in any
        // group) contributes nothing in every group: coefficient 0, no error naming it (that
        // would be an event depending on one record's private data).
        let ck = compute_kind(self.kind);
        let mut keep = Tensor::f_ones([b], (Kind::Bool, dev))?;
        for sq in group_sq.values() {
            keep = keep.f_logical_and(&sq.f_isfinite()?)?;
        }
        let any_bad = b > 0 && keep.f_logical_not()?.f_any()?.f_int64_value(&[])? != 0;
        let zero = Tensor::f_zeros([1], (ck, dev))?;
        let drop_bad = |t: Tensor| -> Result<Tensor> {
            let t = t.f_to_kind(ck)?;
            Ok(if any_bad {
                t.f_where_self(&keep, &zero)?
            } else {
                t
            })
        };
        // Weights before clipping: w_b ∈ [0, 1] per record (checked, typed error otherwise).
        let mut w: BTreeMap<K, Tensor> = BTreeMap::new();
        for (g, wt) in weights {
            // (A group of `groups` that this batch does not reach is fine: its weights are
            // checked and then unused. Whether a routed expert is reached depends on the data.)
            if !groups.has_group(g) {
                return Err(ModelError::InvalidClip(format!(
                    "record weights given for group {g}, which no parameter belongs to"
                )));
            }
            if wt.size() != [b] {
                return Err(ModelError::ShapeMismatch {
                    what: format!("record weights of group {g}"),
                    expected: vec![b],
                    got: wt.size(),
                });
            }
            let v: Vec<f64> = Vec::try_from(wt.f_to_kind(Kind::Double)?.f_to(tch::Device::Cpu)?)?;
            if let Some((r, x)) = v
                .iter()
                .enumerate()
                .find(|(_, x)| !(0.0..=1.0).contains(*x))
            {
                return Err(ModelError::InvalidClip(format!(
                    "record weight {x} of record {r} in group {g} is outside [0, 1]"
                )));
            }
            if group_sq.contains_key(g) {
                w.insert(g.clone(), wt.f_to_kind(self.kind)?.f_to(dev)?);
            }
        }
        // Reported norms are those of the weighted gradients w_b·g_b.
        let mut weighted_sq: BTreeMap<K, Tensor> = BTreeMap::new();
        for (g, sq) in &group_sq {
            let v = match w.get(g) {
                Some(wt) => sq.f_mul(&wt.f_square()?)?,
                None => sq.shallow_clone(),
            };
            weighted_sq.insert(g.clone(), v);
        }
        let mut factors: BTreeMap<K, Tensor> = BTreeMap::new();
        let mut coeffs: BTreeMap<K, Tensor> = BTreeMap::new();
        match policy {
            ClipPolicy::RoleWise(bounds) => {
                for (g, sq) in &group_sq {
                    let c = *bounds.get(g).ok_or_else(|| {
                        ModelError::InvalidClip(format!("no clipping bound for group {g}"))
                    })?;
                    let weighted = weighted_sq.get(g).ok_or_else(|| {
                        ModelError::InvalidClip(format!("internal: no norm for group {g}"))
                    })?;
                    factors.insert(g.clone(), drop_bad(clip_coefficients(weighted, c, None)?)?);
                    // raptor-clip's weight-then-clip coefficients w_b·min(1, C/(w_b‖g_b‖)),
                    // in f32/f64 (never rounded to a bf16/f16 model dtype).
                    let coeff = drop_bad(clip_coefficients(sq, c, w.get(g))?)?;
                    coeffs.insert(g.clone(), coeff);
                }
            }
            ClipPolicy::Global(c) => {
                // Added in the order of the groups' names, so that the total's rounding does
                // not depend on how the key type orders the groups.
                let mut by_name: Vec<(String, &Tensor)> = weighted_sq
                    .iter()
                    .map(|(g, sq)| (g.to_string(), sq))
                    .collect();
                by_name.sort_by(|a, b| a.0.cmp(&b.0));
                let mut tot = Tensor::f_zeros([b], (ck, dev))?;
                for (_, sq) in by_name {
                    tot = tot.f_add(&sq.f_to_kind(ck)?)?;
                }
                let f = drop_bad(clip_coefficients(&tot, *c, None)?)?;
                for g in group_sq.keys() {
                    let coeff = match w.get(g) {
                        Some(wt) => f.f_mul(&wt.f_to_kind(ck)?)?,
                        None => f.shallow_clone(),
                    };
                    factors.insert(g.clone(), f.shallow_clone());
                    coeffs.insert(g.clone(), coeff);
                }
            }
        }
        let mut param_coeffs = BTreeMap::new();
        for (g, ps) in &members {
            let c = coeffs.get(*g).ok_or_else(|| {
                ModelError::InvalidClip(format!("internal: no clip coefficient for group {g}"))
            })?;
            for p in ps {
                param_coeffs.insert(p.clone(), c.shallow_clone());
            }
        }
        let group_sq = weighted_sq;
        Ok((group_sq, factors, param_coeffs, any_bad))
    }

    /// Clips per record by group and returns the clipped, weighted sums of all parameters.
    ///
    /// `groups` maps every parameter to a group keyed by the caller's `K` (an unassigned
    /// parameter is an error); `weights` optionally gives per-record weights `[B]` in `[0, 1]`
    /// per group, applied to the record's gradient before clipping (RAPTOR's residual weights).
    /// Keeps `self` (see [`Self::into_clip`] for the memory-frugal form).
    pub fn clip<K: GroupKey>(
        &self,
        groups: &ParamGroups<K>,
        policy: &ClipPolicy<K>,
        weights: &BTreeMap<K, Tensor>,
    ) -> Result<ClipOutput<K>> {
        self.start_cache();
        let out = self.clip_with_cache(groups, policy, weights);
        let served = self.end_cache();
        out.map(|mut o| {
            o.from_cache = served;
            o
        })
    }

    /// [`Self::clip`]'s work, with the materialized-gradient cache on.
    pub(super) fn clip_with_cache<K: GroupKey>(
        &self,
        groups: &ParamGroups<K>,
        policy: &ClipPolicy<K>,
        weights: &BTreeMap<K, Tensor>,
    ) -> Result<ClipOutput<K>> {
        let (group_sq_norms, clip_factors, coeffs, any_bad) =
            self.clip_coeffs(groups, policy, weights)?;
        let mut sums = BTreeMap::new();
        for (p, c) in &coeffs {
            let sum = match self.cached_sum(p, c, any_bad)? {
                Some(t) => t,
                None => self.weighted_sum_with(p, c, any_bad)?,
            };
            sums.insert(p.clone(), sum);
        }
        Ok(ClipOutput {
            group_sq_norms,
            clip_factors,
            sums,
            from_cache: BTreeSet::new(),
        })
    }

    /// [`Self::clip`] consuming `self`: once the norms and clip factors are known, the recorded
    /// ops are visited last-recorded first and each op's output gradient and activations are
    /// freed as soon as its contribution to the clipped sums is added, so the peak memory is
    /// that of the backward pass's results, not results plus sums plus temporaries.
    pub fn into_clip<K: GroupKey>(
        mut self,
        groups: &ParamGroups<K>,
        policy: &ClipPolicy<K>,
        weights: &BTreeMap<K, Tensor>,
    ) -> Result<ClipOutput<K>> {
        self.start_cache();
        let (group_sq_norms, clip_factors, coeffs, any_bad) =
            self.clip_coeffs(groups, policy, weights)?;
        let mut sums: BTreeMap<String, Tensor> = BTreeMap::new();
        while let Some(s) = self.sites.pop() {
            for p in &s.parts {
                let c = coeffs
                    .get(p.param())
                    .ok_or_else(|| ModelError::UngroupedParameter {
                        param: p.param().to_string(),
                    })?;
                let term = self.use_sum(&s, p, c, any_bad)?;
                match sums.get_mut(p.param()) {
                    Some(acc) => *acc = acc.f_add(&term)?,
                    None => {
                        sums.insert(p.param().to_string(), term);
                    }
                }
            }
            drop(s);
        }
        Ok(ClipOutput {
            group_sq_norms,
            clip_factors,
            sums,
            from_cache: self.end_cache(),
        })
    }
}

/// Clip factors `min(1, C / (‖g_b‖ + 1e-12))` from squared norms (raptor-clip's
/// `clip_coefficients`, so the slice and tensor paths agree).
pub fn clip_factors(sq_norms: &Tensor, bound: f64) -> Result<Tensor> {
    Ok(clip_coefficients(sq_norms, bound, None)?.f_to_kind(sq_norms.kind())?)
}

/// Result of [`PerSampleGrads::clip`], with groups keyed as the caller's [`ParamGroups`].
#[derive(Debug)]
pub struct ClipOutput<K: GroupKey> {
    /// Per-record squared norm `[B]` of each group's (weighted) gradient.
    pub group_sq_norms: BTreeMap<K, Tensor>,
    /// Per-record clip factor `[B]` of each group, `min(1, C/‖w_b g_b‖)`.
    pub clip_factors: BTreeMap<K, Tensor>,
    /// Per parameter: `Σ_b factor_b · w_b · G_b` (no noise, no denominator).
    pub sums: BTreeMap<String, Tensor>,
    /// Parameters whose sum was taken from per-record gradients the norm pass materialized
    /// and kept (one `[1, B] × [B, out·in]` product instead of a contraction over every token
    /// row): a speed diagnostic; the sums are the same either way.
    pub from_cache: BTreeSet<String>,
}
