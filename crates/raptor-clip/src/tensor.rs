//! libtorch backend (feature `tch`): the clipping forms of the slice backend on tensors, on the
//! device of the inputs (CPU or CUDA).
//!
//! Norms are taken with libtorch's reductions in f32 at least (f64 for f64 input; bf16 and f16
//! gradients are widened first, so a norm rounded down in a 8- or 11-bit mantissa cannot let a
//! record through unclipped), factors are computed in f64 on the device, and the clipped sum is
//! one matrix-vector product per block (`Gᵀ f`), in f32 for bf16/f16 input (rounded to the
//! input dtype once, at the end). This is the two-pass schedule (norms, then a product) that
//! the slice backend's fused kernel is benchmarked against.
//!
//! As on the slice path, a record with a NaN or infinite entry contributes nothing (factor 0 in
//! every group, its entries replaced by 0 before the product) and is not reported by index.

use tch::{Kind, Tensor};

use crate::ClipError;
use crate::grouping::{ClipPolicy, GroupKey, ParamGroups};
use crate::slice::{Grouping, check_bound, resolve};

/// Result of [`clip_rows`] on tensors.
#[derive(Debug)]
pub struct TensorClipOutput {
    /// Σ_i factors_i · g_i, shape `[P…]` (the trailing shape of the input).
    pub sum: Tensor,
    /// `[B]`: ‖w_i g_i‖.
    pub norms: Tensor,
    /// `[B]`: multiplier applied to the raw record, w_i · min(1, C/(w_i‖g_i‖)).
    pub factors: Tensor,
    bound: f64,
}

impl TensorClipOutput {
    /// The bound C (the L2 sensitivity of `sum`).
    pub fn bound(&self) -> f64 {
        self.bound
    }
    /// The L2 sensitivity of `sum`: C.
    pub fn sensitivity(&self) -> f64 {
        self.bound
    }
}

/// Result of [`clip_blocks`] on tensors.
#[derive(Debug)]
pub struct TensorBlockClipOutput {
    /// Per block clipped sum (trailing shape of the block).
    pub sums: Vec<Tensor>,
    /// Group of each block (the groups are those of the [`Grouping`], by position).
    pub block_group: Vec<usize>,
    group_bounds: Vec<f64>,
    /// `[B, G]` norms of the weighted record per group.
    pub norms: Tensor,
    /// `[B]` norm of the weighted record over all blocks.
    pub total_norms: Tensor,
    /// `[B, G]` multipliers applied to the raw record per group.
    pub factors: Tensor,
    sensitivity: f64,
}

impl TensorBlockClipOutput {
    /// Number of groups.
    pub fn n_groups(&self) -> usize {
        self.group_bounds.len()
    }
    /// Per group bound.
    pub fn group_bounds(&self) -> &[f64] {
        &self.group_bounds
    }
    /// Joint L2 sensitivity of all sums (sqrt(Σ_g C_g²), or C for the one-bound forms).
    pub fn sensitivity(&self) -> f64 {
        self.sensitivity
    }
    /// L2 sensitivity of the sums of group `g` alone (`None` when `g` is not a group).
    pub fn group_sensitivity(&self, g: usize) -> Option<f64> {
        self.group_bounds.get(g).copied()
    }
}

fn shape_err(what: &str, expected: String, got: &[i64]) -> ClipError {
    ClipError::ShapeMismatch {
        what: what.into(),
        expected,
        got: format!("{got:?}"),
    }
}

/// Check that a `[n]` tensor of weights lies in [0, 1]; returns it as the given kind.
pub(crate) fn check_weights_tensor(
    w: &Tensor,
    batch: i64,
    kind: Kind,
) -> Result<Tensor, ClipError> {
    if w.size() != [batch] {
        return Err(shape_err("weights", format!("[{batch}]"), &w.size()));
    }
    let w = w.f_to_kind(Kind::Double)?;
    if batch > 0 {
        let bad = w
            .f_lt(0.0)?
            .f_logical_or(&w.f_gt(1.0)?)?
            .f_logical_or(&w.f_isnan()?)?;
        if bad.f_any()?.f_int64_value(&[])? != 0 {
            let idx = bad.f_nonzero()?.f_int64_value(&[0, 0])?;
            let value = w.f_double_value(&[idx])?;
            return Err(ClipError::InvalidWeight {
                index: idx as usize,
                value,
            });
        }
    }
    Ok(w.f_to_kind(kind)?)
}

/// Error if any entry of `sq` (shape `[B]` or `[B, G]`) is not finite (for inputs the caller
/// controls, such as clip coefficients; gradients are handled by [`finite_records`]).
pub(crate) fn check_finite_rows(sq: &Tensor, part: &str) -> Result<(), ClipError> {
    if sq.numel() == 0 {
        return Ok(());
    }
    let bad = sq.f_isfinite()?.f_logical_not()?;
    if bad.f_any()?.f_int64_value(&[])? != 0 {
        let nz = bad.f_nonzero()?;
        let record = nz.f_int64_value(&[0, 0])?;
        let value = if sq.dim() == 1 {
            sq.f_double_value(&[record])?
        } else {
            sq.f_double_value(&[record, nz.f_int64_value(&[0, 1])?])?
        };
        return Err(ClipError::NonFinite {
            record: record as usize,
            part: part.into(),
            value,
        });
    }
    Ok(())
}

/// The dtype norms and products are computed in: f64 for f64, f32 otherwise (bf16 and f16 are
/// widened).
pub(crate) fn compute_kind(kind: Kind) -> Kind {
    match kind {
        Kind::Double => Kind::Double,
        _ => Kind::Float,
    }
}

/// `[B]` f64 mask: 1 for records whose squared norms (`[B]` or `[B, G]`) are all finite, 0
/// otherwise, and whether any record is non-finite.
pub(crate) fn finite_records(sq: &Tensor) -> Result<(Tensor, bool), ClipError> {
    let fin = sq.f_isfinite()?;
    let fin = if sq.dim() == 2 {
        fin.f_all_dim(1, false)?
    } else {
        fin
    };
    let any_bad = sq.numel() > 0 && fin.f_logical_not()?.f_any()?.f_int64_value(&[])? != 0;
    Ok((fin.f_to_kind(Kind::Double)?, any_bad))
}

/// `g2` (`[B, P]`) in `kind` with the rows of non-finite records replaced by zeros (their
/// factor is 0, but 0 · NaN is NaN in the product).
fn zero_bad_rows(
    g2: &Tensor,
    kind: Kind,
    keep: &Tensor,
    any_bad: bool,
) -> Result<Tensor, ClipError> {
    let g = g2.f_to_kind(kind)?;
    if !any_bad {
        return Ok(g);
    }
    let keep = keep.f_to_kind(Kind::Bool)?.f_unsqueeze(1)?;
    let zero = Tensor::f_zeros([1], (kind, g.device()))?;
    Ok(g.f_where_self(&keep, &zero)?)
}

/// Factor min(1, C/n) from norms n (any shape), with n = 0 → 1.
fn factors_from_norms(norms: &Tensor, bound: f64) -> Result<Tensor, ClipError> {
    // C / max(n, C) equals min(1, C/n) and is 1 at n = 0.
    Ok(norms
        .f_clamp_min(bound)?
        .f_reciprocal()?
        .f_mul_scalar(bound)?)
}

/// Clip each record of `rows` (`[B, …]`, any trailing shape) to L2 norm `bound` and sum, with
/// optional weight-then-clip weights `[B]` in [0, 1]. Runs on the device of `rows`.
pub fn clip_rows(
    rows: &Tensor,
    bound: f64,
    weights: Option<&Tensor>,
) -> Result<TensorClipOutput, ClipError> {
    check_bound("bound", bound)?;
    let size = rows.size();
    if size.is_empty() {
        return Err(shape_err("rows", "[B, …]".into(), &size));
    }
    let b = size[0];
    let g2 = rows.f_reshape([b, -1])?;
    let kind = rows.kind();
    let ck = compute_kind(kind);
    // Norms in f32 (f64 for f64 input), then f64 for the factors.
    let raw = g2
        .f_linalg_norm(2, [1i64].as_slice(), false, Some(ck))?
        .f_to_kind(Kind::Double)?;
    let (keep, any_bad) = finite_records(&raw)?;
    let (norms, factors) = match weights {
        None => {
            let f = factors_from_norms(&raw, bound)?;
            (raw, f)
        }
        Some(w) => {
            let w = check_weights_tensor(w, b, Kind::Double)?.f_to_device(rows.device())?;
            let n = raw.f_mul(&w)?;
            let f = factors_from_norms(&n, bound)?.f_mul(&w)?;
            (n, f)
        }
    };
    // Non-finite records: factor 0 (NaN · 0 would be NaN, so select rather than multiply).
    let factors = if any_bad {
        let zero = Tensor::f_zeros([1], (Kind::Double, rows.device()))?;
        factors.f_where_self(&keep.f_to_kind(Kind::Bool)?, &zero)?
    } else {
        factors
    };
    let sum = if b == 0 {
        Tensor::f_zeros(&size[1..], (kind, rows.device()))?
    } else {
        zero_bad_rows(&g2, ck, &keep, any_bad)?
            .f_transpose(0, 1)?
            .f_mv(&factors.f_to_kind(ck)?)?
            .f_reshape(&size[1..])?
            .f_to_kind(kind)?
    };
    Ok(TensorClipOutput {
        sum,
        norms,
        factors,
        bound,
    })
}

/// Per-example clipping of named blocks (`[B, …]` each, same B) in any [`Grouping`], with
/// optional weights `[B]`. Same semantics as [`crate::clip_blocks`].
pub fn clip_blocks(
    blocks: &[(&str, &Tensor)],
    grouping: &Grouping,
    weights: Option<&Tensor>,
) -> Result<TensorBlockClipOutput, ClipError> {
    if blocks.is_empty() {
        return Err(ClipError::InvalidGrouping {
            reason: "no blocks given".into(),
        });
    }
    let names: Vec<&str> = blocks.iter().map(|b| b.0).collect();
    let (block_group, group_bounds, joint) = resolve(grouping, &names)?;
    let ng = group_bounds.len() as i64;
    let first = blocks[0].1.size();
    if first.is_empty() {
        return Err(shape_err(blocks[0].0, "[B, …]".into(), &first));
    }
    let b = first[0];
    let device = blocks[0].1.device();
    let mut flat = Vec::with_capacity(blocks.len());
    for (name, t) in blocks {
        let s = t.size();
        if s.is_empty() || s[0] != b {
            return Err(shape_err(name, format!("[{b}, …]"), &s));
        }
        flat.push(t.f_reshape([b, -1])?);
    }
    // Squared norms per group, [B] each, accumulated in f64 across blocks.
    let mut per_group: Vec<Option<Tensor>> = (0..ng).map(|_| None).collect();
    for (k, g2) in flat.iter().enumerate() {
        let n = g2
            .f_linalg_norm(
                2,
                [1i64].as_slice(),
                false,
                Some(compute_kind(blocks[k].1.kind())),
            )?
            .f_to_kind(Kind::Double)?;
        let n2 = n.f_square()?;
        let slot = &mut per_group[block_group[k]];
        *slot = Some(match slot.take() {
            None => n2,
            Some(prev) => prev.f_add(&n2)?,
        });
    }
    let mut cols = Vec::with_capacity(per_group.len());
    for slot in per_group {
        cols.push(match slot {
            Some(t) => t,
            None => Tensor::f_zeros([b], (Kind::Double, device))?,
        });
    }
    let group_sq = Tensor::f_stack(&cols, 1)?;
    let (keep, any_bad) = finite_records(&group_sq)?;
    let raw_group = group_sq.f_sqrt()?;
    let raw_total = group_sq
        .f_sum_dim_intlist([1i64].as_slice(), false, None::<Kind>)?
        .f_sqrt()?;
    let w = match weights {
        Some(w) => Some(check_weights_tensor(w, b, Kind::Double)?.f_to_device(device)?),
        None => None,
    };
    let (norms, total_norms) = match &w {
        Some(w) => (raw_group.f_mul(&w.f_unsqueeze(1)?)?, raw_total.f_mul(w)?),
        None => (raw_group, raw_total),
    };
    let mut factors = match joint {
        Some(c) => factors_from_norms(&total_norms, c)?
            .f_unsqueeze(1)?
            .f_expand([b, ng], false)?
            .f_contiguous()?,
        None => {
            let bounds = Tensor::f_from_slice(&group_bounds)?
                .f_to_device(device)?
                .f_unsqueeze(0)?;
            // C_g / max(n, C_g)
            bounds.f_div(&norms.f_maximum(&bounds)?)?
        }
    };
    if let Some(w) = &w {
        factors = factors.f_mul(&w.f_unsqueeze(1)?)?;
    }
    if any_bad {
        // Non-finite records contribute nothing in any group.
        let zero = Tensor::f_zeros([1], (Kind::Double, device))?;
        factors = factors.f_where_self(&keep.f_to_kind(Kind::Bool)?.f_unsqueeze(1)?, &zero)?;
    }
    let mut sums = Vec::with_capacity(blocks.len());
    for (k, (g2, (_, t))) in flat.iter().zip(blocks).enumerate() {
        let s = t.size();
        let ck = compute_kind(t.kind());
        let f = factors.f_select(1, block_group[k] as i64)?.f_to_kind(ck)?;
        let sum = if b == 0 {
            Tensor::f_zeros(&s[1..], (t.kind(), device))?
        } else {
            zero_bad_rows(g2, ck, &keep, any_bad)?
                .f_transpose(0, 1)?
                .f_mv(&f)?
                .f_reshape(&s[1..])?
                .f_to_kind(t.kind())?
        };
        sums.push(sum);
    }
    let sensitivity = match joint {
        Some(c) => c,
        None => group_bounds.iter().map(|c| c * c).sum::<f64>().sqrt(),
    };
    Ok(TensorBlockClipOutput {
        sums,
        block_group,
        group_bounds,
        norms,
        total_norms,
        factors,
        sensitivity,
    })
}

/// The clipped sums of one release, named by parameter, with the groups they belong to and
/// the L2 sensitivity the [`ClipPolicy`] they were clipped under gives them: the only input of
/// [`crate::Privatizer::release_clipped`].
///
/// [`ClippedSum::new`] checks that the release is whole: every tensor belongs (by
/// [`ParamGroups`]) to one of the release's groups, and every parameter of those groups is
/// present, so a release can neither leave part of a group un-noised nor carry a parameter of
/// another group under this group's sensitivity. The sensitivity is computed from the policy
/// ([`ClipPolicy::sensitivity`]), never passed in.
#[derive(Debug)]
pub struct ClippedSum<K: GroupKey> {
    groups: Vec<K>,
    names: Vec<String>,
    tensors: Vec<Tensor>,
    sensitivity: f64,
}

/// `[a, b, …]` of the groups' names, for messages.
fn group_list<K: GroupKey>(groups: &[K]) -> String {
    let names: Vec<String> = groups.iter().map(ToString::to_string).collect();
    format!("[{}]", names.join(", "))
}

impl<K: GroupKey> ClippedSum<K> {
    /// The sums `parts` (parameter name, clipped sum; in release order) of the groups
    /// `release_groups`, clipped under `policy` with the assignment `groups`.
    pub fn new(
        groups: &ParamGroups<K>,
        policy: &ClipPolicy<K>,
        release_groups: &[K],
        parts: Vec<(String, Tensor)>,
    ) -> Result<Self, ClipError> {
        // The release's own groups' bounds (the whole policy was checked before clipping;
        // checking it again per release would cost every parameter of the model each time).
        let sensitivity = policy.sensitivity(release_groups)?;
        let mut seen = std::collections::BTreeSet::new();
        for (name, _) in &parts {
            match groups.group_of(name) {
                Some(g) if release_groups.contains(g) => {}
                Some(g) => {
                    return Err(ClipError::InvalidGrouping {
                        reason: format!(
                            "parameter {name} of group {g} is not in this release's groups {}",
                            group_list(release_groups)
                        ),
                    });
                }
                None => {
                    return Err(ClipError::InvalidGrouping {
                        reason: format!("parameter {name} is in no group"),
                    });
                }
            }
            if !seen.insert(name.as_str()) {
                return Err(ClipError::InvalidGrouping {
                    reason: format!("parameter {name} is twice in one release"),
                });
            }
        }
        for g in release_groups {
            if !groups.has_group(g) {
                return Err(ClipError::InvalidGrouping {
                    reason: format!("release group {g} has no parameter"),
                });
            }
            if let Some(p) = groups.params_of(g).find(|p| !seen.contains(p)) {
                return Err(ClipError::InvalidGrouping {
                    reason: format!(
                        "parameter {p} of released group {g} is missing from the release"
                    ),
                });
            }
        }
        let (names, tensors) = parts.into_iter().unzip();
        Ok(ClippedSum {
            groups: release_groups.to_vec(),
            names,
            tensors,
            sensitivity,
        })
    }
    /// The L2 sensitivity of the release (from the policy).
    pub fn sensitivity(&self) -> f64 {
        self.sensitivity
    }
    /// The groups released together, as given.
    pub fn groups(&self) -> &[K] {
        &self.groups
    }
    /// The parameter names, in release order.
    pub fn names(&self) -> &[String] {
        &self.names
    }
    /// The clipped sums, in release order.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }
}

/// A differentially private release of tensors (the tensor path's [`crate::Release`]): only
/// [`crate::Privatizer::release_clipped`] makes one, so its values always carry noise
/// calibrated to the sensitivity of the [`ClippedSum`] they came from.
#[derive(Debug)]
pub struct TensorRelease<K: GroupKey> {
    groups: Vec<K>,
    names: Vec<String>,
    tensors: Vec<Tensor>,
    sensitivity: f64,
    noise_multiplier: f64,
    denominator: f64,
    seeded_insecure: bool,
}

impl<K: GroupKey> TensorRelease<K> {
    /// The groups released together (those of the [`ClippedSum`]).
    pub fn groups(&self) -> &[K] {
        &self.groups
    }
    /// The parameter names, in release order.
    pub fn names(&self) -> &[String] {
        &self.names
    }
    /// (clipped sum + noise) / denominator per parameter, in release order.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }
    /// The (name, released tensor) pairs, consuming the release.
    pub fn into_parts(self) -> Vec<(String, Tensor)> {
        self.names.into_iter().zip(self.tensors).collect()
    }
    /// The L2 sensitivity Δ the noise was calibrated to.
    pub fn sensitivity(&self) -> f64 {
        self.sensitivity
    }
    /// The noise multiplier σ.
    pub fn noise_multiplier(&self) -> f64 {
        self.noise_multiplier
    }
    /// The noise std per coordinate of the released (divided) values, σΔ / denominator.
    pub fn released_noise_std(&self) -> f64 {
        self.noise_multiplier * self.sensitivity / self.denominator
    }
    /// The public denominator used.
    pub fn denominator(&self) -> f64 {
        self.denominator
    }
    /// Whether the noise came from a user-given seed (then the release is not private).
    pub fn is_seeded_insecure(&self) -> bool {
        self.seeded_insecure
    }
}

impl crate::Privatizer {
    /// Releases a [`ClippedSum`]: (sum + N(0, (σΔ)²)) / denominator per tensor, with Δ the
    /// sum's own sensitivity; the noise is drawn as in [`Self::release_tensors`] (one draw for
    /// the whole release, the same values for the same seed).
    pub fn release_clipped<K: GroupKey>(
        &mut self,
        sum: ClippedSum<K>,
        denominator: crate::PublicDenominator,
    ) -> Result<TensorRelease<K>, ClipError> {
        let refs: Vec<&Tensor> = sum.tensors.iter().collect();
        let tensors = self.release_tensors(&refs, sum.sensitivity, denominator)?;
        Ok(TensorRelease {
            groups: sum.groups,
            names: sum.names,
            tensors,
            sensitivity: sum.sensitivity,
            noise_multiplier: self.noise_multiplier(),
            denominator: denominator.value(),
            seeded_insecure: self.is_seeded_insecure(),
        })
    }

    /// Release a tensor holding a clipped sum with L2 sensitivity `sensitivity`:
    /// (sum + N(0, (σΔ)²)) / denominator, on the device and dtype of `sum`. The noise is drawn
    /// on the CPU from this privatizer's generator (ChaCha20 from the OS unless seeded) with the
    /// same hardened sampler and in the same order as the slice path (see the privatizer's
    /// module docs), added in f64, then rounded once to the dtype of `sum`. A seeded privatizer
    /// warns once on stderr; check [`crate::Privatizer::is_seeded_insecure`] before recording
    /// the result as private.
    pub fn release_tensor(
        &mut self,
        sum: &Tensor,
        sensitivity: f64,
        denominator: crate::PublicDenominator,
    ) -> Result<Tensor, ClipError> {
        let mut out = self.release_tensors(&[sum], sensitivity, denominator)?;
        out.pop()
            .ok_or_else(|| ClipError::Torch("internal: no released tensor".into()))
    }

    /// [`Self::release_tensor`] for several tensors that form one release (the blocks of one
    /// clipped sum, with one joint sensitivity): the noise of all of them is drawn in one go,
    /// in the order given (the same draws as consecutive `release_tensor` calls for a total of
    /// at most [`crate::NOISE_CHUNK`] coordinates; a longer release is drawn in parallel
    /// chunks, see the privatizer's module docs). CPU tensors are noised in one pass in f64.
    pub fn release_tensors(
        &mut self,
        sums: &[&Tensor],
        sensitivity: f64,
        denominator: crate::PublicDenominator,
    ) -> Result<Vec<Tensor>, ClipError> {
        if !(sensitivity.is_finite() && sensitivity > 0.0) {
            return Err(ClipError::InvalidSensitivity { value: sensitivity });
        }
        let total: usize = sums.iter().map(|t| t.numel()).sum();
        let mut z = vec![0f64; total];
        self.standard_normals(&mut z);
        let std = self.noise_multiplier() * sensitivity;
        let d = denominator.value();
        let mut outs = Vec::with_capacity(sums.len());
        let mut at = 0usize;
        for sum in sums {
            let n = sum.numel();
            let zs = &z[at..at + n];
            at += n;
            let out = if sum.device() == tch::Device::Cpu {
                // (s + σΔ·z) / d in f64, rounded once: the same operations as the device path.
                let flat = sum
                    .f_to_kind(Kind::Double)?
                    .f_reshape([-1])?
                    .f_contiguous()?;
                let s: Vec<f64> = Vec::try_from(&flat)?;
                let v: Vec<f64> = s.iter().zip(zs).map(|(&s, &z)| (s + z * std) / d).collect();
                Tensor::f_from_slice(&v)?
                    .f_reshape(sum.size())?
                    .f_to_kind(sum.kind())?
            } else {
                let noise = Tensor::f_from_slice(zs)?
                    .f_reshape(sum.size())?
                    .f_to_device(sum.device())?;
                sum.f_to_kind(Kind::Double)?
                    .f_add(&noise.f_mul_scalar(std)?)?
                    .f_div_scalar(d)?
                    .f_to_kind(sum.kind())?
            };
            outs.push(out);
        }
        Ok(outs)
    }
}
