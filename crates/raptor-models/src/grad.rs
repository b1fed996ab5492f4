//! Per-sample gradients from one backward pass: per-record squared norms by parameter and by
//! caller-named group, clipped (optionally weighted) sums, role-wise or global clipping.
//!
//! After a forward pass in a private [`crate::ForwardCtx`], [`PerSampleGrads::compute`] asks
//! autograd once for `g = ∂L/∂z` of every recorded op output `z` (`L` = sum over records of
//! each record's loss, so `g` rows of record b are record b's own gradient). Then, per
//! parameter, without materializing B copies of large matrices:
//!
//! * linear weights: per-record grad `G_b = Σ_t g_t a_tᵀ`; squared norm by the ghost identity
//!   `‖G_b‖² = Σ_{t,t'} (a_t·a_t')(g_t·g_t')`, or by materializing `G_b` when that is cheaper
//!   (small `in·out`, e.g. LoRA); expert weights over their routed tokens only (rows padded per
//!   record);
//! * embeddings: the same identity with one-hot factors (`1[id_t = id_t']`), including the
//!   cross terms of a table used twice (GPT-2's tied LM head);
//! * biases, norm gains, the T5 relative-bias table: per-record grads directly (small);
//! * clipped sums `Σ_b c_b G_b` by one contraction over scaled output gradients (book-keeping).

use crate::error::{ModelError, Result};
use crate::tape::{Part, Rows, Site, Tape};
use raptor_clip::linear::{
    NormMethod, clip_coefficients, ghost_cost, linear_per_example_sq_norms_with,
    linear_weighted_grad_sum, materialized_cost,
};
use std::collections::BTreeMap;
use tch::{Kind, Tensor};

/// Materialize per-record weight gradients when `T·(in+out) > in·out` and `B·in·out` is at most
/// this many elements; otherwise use the ghost identity.
const MATERIALIZE_MAX_ELEMS: i64 = 1 << 26;

/// A site with its output gradient, rows padded per record to `[B, T, ·]`.
struct GradSite {
    site: Site,
    /// Output gradient in the site's own row layout.
    g: Tensor,
    /// `[B, T, out]` (dense: reshaped; routed: padded).
    g3: Tensor,
    /// For routed sites: flat position `rec·Tmax + pos` of each row, and Tmax.
    pad: Option<(Tensor, i64)>,
}

/// Per-record gradients of all trainable parameters used in one forward pass.
pub struct PerSampleGrads {
    batch_size: i64,
    kind: Kind,
    sites: Vec<GradSite>,
    /// param → (site, part) uses.
    uses: BTreeMap<String, Vec<(usize, usize)>>,
}

impl std::fmt::Debug for PerSampleGrads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerSampleGrads")
            .field("batch_size", &self.batch_size)
            .field("sites", &self.sites.len())
            .field("params", &self.uses.keys().collect::<Vec<_>>())
            .finish()
    }
}

enum Factor<'a> {
    Dense(&'a Tensor),
    OneHot(&'a Tensor),
    Ones(i64),
}

fn pad_rows(x: &Tensor, pad: &(Tensor, i64), b: i64) -> Result<Tensor> {
    let (pos, tmax) = pad;
    let d = x.size()[1];
    let z = Tensor::f_zeros([b * tmax, d], (x.kind(), x.device()))?;
    Ok(z.f_index_copy(0, pos, x)?.f_reshape([b, *tmax, d])?)
}

impl PerSampleGrads {
    /// One backward pass of `loss` (a scalar: the sum over records of per-record losses) to
    /// the outputs of every op recorded in `tape`; `batch_size` is B.
    pub fn compute(tape: Tape, loss: &Tensor, batch_size: i64) -> Result<Self> {
        if loss.numel() != 1 {
            return Err(ModelError::ShapeMismatch {
                what: "loss (must be a scalar sum of per-record losses)".into(),
                expected: vec![],
                got: loss.size(),
            });
        }
        let kind = loss.kind();
        let zs: Vec<&Tensor> = tape.sites.iter().map(|s| &s.z).collect();
        let gs = if zs.is_empty() {
            Vec::new()
        } else {
            Tensor::f_run_backward(&[loss], &zs, false, false)?
        };
        let mut sites = Vec::with_capacity(gs.len());
        let mut uses: BTreeMap<String, Vec<(usize, usize)>> = BTreeMap::new();
        for (i, (site, g)) in tape.sites.into_iter().zip(gs).enumerate() {
            let g = if g.defined() {
                g
            } else {
                site.z.f_zeros_like()?
            };
            let (g3, pad) = match &site.rows {
                Rows::Dense => {
                    let g3 = if g.dim() == 4 {
                        g.shallow_clone()
                    } else {
                        let out = g.size().last().copied().unwrap_or(1);
                        g.f_reshape([batch_size, -1, out])?
                    };
                    (g3, None)
                }
                Rows::Routed { rec } => {
                    let counts = rec.f_bincount(None::<&Tensor>, batch_size)?;
                    let tmax = counts.f_max()?.int64_value(&[]).max(1);
                    let starts = counts.f_cumsum(0, Kind::Int64)?.f_sub(&counts)?;
                    let n = rec.size()[0];
                    let pos = Tensor::f_arange(n, (Kind::Int64, rec.device()))?
                        .f_sub(&starts.f_index_select(0, rec)?)?
                        .f_add(&rec.f_mul_scalar(tmax)?)?;
                    let pad = (pos, tmax);
                    (pad_rows(&g, &pad, batch_size)?, Some(pad))
                }
            };
            for (j, p) in site.parts.iter().enumerate() {
                uses.entry(p.param().to_string()).or_default().push((i, j));
            }
            sites.push(GradSite { site, g, g3, pad });
        }
        Ok(Self {
            batch_size,
            kind,
            sites,
            uses,
        })
    }

    /// Batch size B.
    pub fn batch_size(&self) -> i64 {
        self.batch_size
    }

    /// Names of the parameters that received gradient (trainable parameters used in the pass).
    pub fn params(&self) -> Vec<String> {
        self.uses.keys().cloned().collect()
    }

    fn part(&self, u: (usize, usize)) -> (&GradSite, &Part) {
        let s = &self.sites[u.0];
        (s, &s.site.parts[u.1])
    }

    /// Activation padded to `[B, T, in]`.
    fn a3(&self, s: &GradSite, a: &Tensor) -> Result<Tensor> {
        match &s.pad {
            None => {
                let d = a.size().last().copied().unwrap_or(1);
                Ok(a.f_reshape([self.batch_size, -1, d])?)
            }
            Some(p) => pad_rows(a, p, self.batch_size),
        }
    }

    /// Per-record gradient of a "direct" part, `[B, ...param shape]`, or None for factor parts.
    fn direct(&self, s: &GradSite, p: &Part) -> Result<Option<Tensor>> {
        Ok(match p {
            Part::Gain { n, .. } => {
                let n3 = self.a3(s, n)?;
                Some(s.g3.f_mul(&n3)?.f_sum_dim_intlist(1, false, None::<Kind>)?)
            }
            Part::Bias { .. } => Some(s.g3.f_sum_dim_intlist(1, false, None::<Kind>)?),
            Part::Buckets {
                buckets,
                num_buckets,
                ..
            } => {
                // g [B, H, Tq, Tk] → [B, nb, H].
                let sz = s.g.size();
                let (b, h) = (sz[0], sz[1]);
                let gq = s.g.f_permute([0, 2, 3, 1])?.f_reshape([b, -1, h])?;
                let z = Tensor::f_zeros([b, *num_buckets, h], (s.g.kind(), s.g.device()))?;
                Some(z.f_index_add(1, &buckets.f_reshape([-1])?, &gq)?)
            }
            Part::Weight { .. } | Part::Embedding { .. } => None,
        })
    }

    /// (u, v) factors with grad = Σ_t u_t v_tᵀ.
    fn factors<'a>(
        &self,
        s: &'a GradSite,
        p: &'a Part,
        a3: &'a Option<Tensor>,
    ) -> Result<(Factor<'a>, Factor<'a>)> {
        match (p, a3) {
            (Part::Weight { .. }, Some(a)) => Ok((Factor::Dense(&s.g3), Factor::Dense(a))),
            (Part::Embedding { ids, .. }, _) => Ok((Factor::OneHot(ids), Factor::Dense(&s.g3))),
            (Part::Bias { .. }, _) => Ok((Factor::Dense(&s.g3), Factor::Ones(s.g3.size()[1]))),
            _ => Err(ModelError::InvalidConfig(format!(
                "internal: no factor form for {}",
                p.param()
            ))),
        }
    }

    fn gram(&self, x: &Factor<'_>, y: &Factor<'_>) -> Result<Tensor> {
        let b = self.batch_size;
        Ok(match (x, y) {
            (Factor::Dense(x), Factor::Dense(y)) => x.f_bmm(&y.f_transpose(1, 2)?)?,
            (Factor::OneHot(i), Factor::OneHot(j)) => i
                .f_unsqueeze(2)?
                .f_eq_tensor(&j.f_unsqueeze(1)?)?
                .f_to_kind(self.kind)?,
            (Factor::OneHot(i), Factor::Dense(y)) => {
                let (t, s) = (i.size()[1], y.size()[1]);
                let idx = i.f_unsqueeze(1)?.f_expand([b, s, t], false)?;
                y.f_gather(2, &idx, false)?.f_transpose(1, 2)?
            }
            (Factor::Dense(_), Factor::OneHot(_)) => self.gram(y, x)?.f_transpose(1, 2)?,
            (Factor::Ones(t), Factor::Ones(s)) => {
                let dev = self
                    .sites
                    .first()
                    .map(|s| s.g.device())
                    .unwrap_or(tch::Device::Cpu);
                Tensor::f_ones([b, *t, *s], (self.kind, dev))?
            }
            _ => {
                return Err(ModelError::InvalidConfig(
                    "internal: incompatible factor kinds on one parameter".into(),
                ));
            }
        })
    }

    /// Per-record squared L2 norms `[B]` of parameter `param`'s gradient.
    pub fn sq_norms(&self, param: &str) -> Result<Tensor> {
        let uses = self
            .uses
            .get(param)
            .ok_or_else(|| ModelError::UnknownParameter {
                param: param.into(),
            })?;
        let b = self.batch_size;
        // Direct parts: sum per-record grads.
        let mut direct: Option<Tensor> = None;
        let mut factor_uses = Vec::new();
        for &u in uses {
            let (s, p) = self.part(u);
            match p {
                Part::Gain { .. } | Part::Buckets { .. } => {
                    let d = self
                        .direct(s, p)?
                        .ok_or_else(|| ModelError::InvalidConfig("internal: direct part".into()))?;
                    direct = Some(match direct {
                        Some(acc) => acc.f_add(&d)?,
                        None => d,
                    });
                }
                Part::Bias { .. } if uses.len() == 1 => {
                    direct = self.direct(s, p)?;
                }
                _ => factor_uses.push(u),
            }
        }
        if direct.is_some() && !factor_uses.is_empty() {
            return Err(ModelError::InvalidConfig(format!(
                "parameter {param} mixes direct and factored uses"
            )));
        }
        if let Some(d) = direct {
            return Ok(d.f_reshape([b, -1])?.f_square()?.f_sum_dim_intlist(
                1,
                false,
                None::<Kind>,
            )?);
        }
        // Single linear use: raptor-clip's ghost or materialized kernel, by cost (materialized
        // only while B·in·out stays under a memory cap).
        if factor_uses.len() == 1 {
            let (s, p) = self.part(factor_uses[0]);
            if let Part::Weight { a, .. } = p {
                let a3 = self.a3(s, a)?;
                let (t, din, dout) = (a3.size()[1], a3.size()[2], s.g3.size()[2]);
                let cheaper = materialized_cost(b, t, din, dout) < ghost_cost(b, t, din, dout);
                let method = if cheaper && b * din * dout <= MATERIALIZE_MAX_ELEMS {
                    NormMethod::Materialized
                } else {
                    NormMethod::Ghost
                };
                return Ok(linear_per_example_sq_norms_with(&a3, &s.g3, None, method)?);
            }
        }
        let a3s: Vec<Option<Tensor>> = factor_uses
            .iter()
            .map(|&u| {
                let (s, p) = self.part(u);
                match p {
                    Part::Weight { a, .. } => self.a3(s, a).map(Some),
                    _ => Ok(None),
                }
            })
            .collect::<Result<_>>()?;
        let mut total = Tensor::f_zeros([b], (self.kind, self.device()))?;
        for i in 0..factor_uses.len() {
            let (si, pi) = self.part(factor_uses[i]);
            let (ui, vi) = self.factors(si, pi, &a3s[i])?;
            for j in i..factor_uses.len() {
                let (sj, pj) = self.part(factor_uses[j]);
                let (uj, vj) = self.factors(sj, pj, &a3s[j])?;
                let c = self
                    .gram(&ui, &uj)?
                    .f_mul(&self.gram(&vi, &vj)?)?
                    .f_sum_dim_intlist([1i64, 2].as_slice(), false, None::<Kind>)?;
                total = if i == j {
                    total.f_add(&c)?
                } else {
                    total.f_add(&c.f_mul_scalar(2.0)?)?
                };
            }
        }
        Ok(total)
    }

    fn device(&self) -> tch::Device {
        self.sites
            .first()
            .map(|s| s.g.device())
            .unwrap_or(tch::Device::Cpu)
    }

    /// `Σ_b coeffs[b] · G_b` for parameter `param` (`coeffs` `[B]`), in the parameter's shape.
    /// With a one-hot `coeffs` this is one record's gradient.
    pub fn weighted_sum(&self, param: &str, coeffs: &Tensor) -> Result<Tensor> {
        let uses = self
            .uses
            .get(param)
            .ok_or_else(|| ModelError::UnknownParameter {
                param: param.into(),
            })?;
        if coeffs.size() != [self.batch_size] {
            return Err(ModelError::ShapeMismatch {
                what: format!("clip coefficients for {param}"),
                expected: vec![self.batch_size],
                got: coeffs.size(),
            });
        }
        let c = coeffs.f_to_kind(self.kind)?;
        let mut acc: Option<Tensor> = None;
        for &u in uses {
            let (s, p) = self.part(u);
            // Row coefficients in the site's own layout.
            let scaled_g = match &s.site.rows {
                Rows::Dense => {
                    let mut shape = vec![self.batch_size];
                    shape.extend(std::iter::repeat_n(1, s.g.dim().saturating_sub(1)));
                    s.g.f_mul(&c.f_reshape(shape.as_slice())?)?
                }
                Rows::Routed { rec } => s.g.f_mul(&c.f_index_select(0, rec)?.f_unsqueeze(1)?)?,
            };
            let term = match p {
                Part::Weight { a, .. } if matches!(s.site.rows, Rows::Dense) => {
                    linear_weighted_grad_sum(&self.a3(s, a)?, &s.g3, &c, None)?
                }
                Part::Weight { a, .. } => {
                    let dout = s.g.size().last().copied().unwrap_or(1);
                    let din = a.size().last().copied().unwrap_or(1);
                    scaled_g
                        .f_reshape([-1, dout])?
                        .f_transpose(0, 1)?
                        .f_mm(&a.f_reshape([-1, din])?)?
                }
                Part::Bias { .. } => {
                    let dout = s.g.size().last().copied().unwrap_or(1);
                    scaled_g
                        .f_reshape([-1, dout])?
                        .f_sum_dim_intlist(0, false, None::<Kind>)?
                }
                Part::Gain { n, .. } => {
                    let d = n.size().last().copied().unwrap_or(1);
                    scaled_g.f_mul(n)?.f_reshape([-1, d])?.f_sum_dim_intlist(
                        0,
                        false,
                        None::<Kind>,
                    )?
                }
                Part::Embedding { ids, vocab, .. } => {
                    let d = s.g.size().last().copied().unwrap_or(1);
                    Tensor::f_zeros([*vocab, d], (s.g.kind(), s.g.device()))?.f_index_add(
                        0,
                        &ids.f_reshape([-1])?,
                        &scaled_g.f_reshape([-1, d])?,
                    )?
                }
                Part::Buckets { .. } => {
                    let per = self
                        .direct(s, p)?
                        .ok_or_else(|| ModelError::InvalidConfig("internal: direct part".into()))?;
                    let mut shape = vec![self.batch_size];
                    shape.extend(std::iter::repeat_n(1, per.dim().saturating_sub(1)));
                    per.f_mul(&c.f_reshape(shape.as_slice())?)?
                        .f_sum_dim_intlist(0, false, None::<Kind>)?
                }
            };
            acc = Some(match acc {
                Some(x) => x.f_add(&term)?,
                None => term,
            });
        }
        acc.ok_or_else(|| ModelError::UnknownParameter {
            param: param.into(),
        })
    }

    /// Clips per record by group and returns the clipped, weighted sums of all parameters.
    ///
    /// `groups` maps every parameter to a caller-named group (an unassigned parameter is an
    /// error); `weights` optionally gives per-record weights `[B]` in `[0, 1]` per group,
    /// applied to the record's gradient before clipping (RAPTOR's residual weights).
    pub fn clip(
        &self,
        groups: &ParamGroups,
        policy: &ClipPolicy,
        weights: &BTreeMap<String, Tensor>,
    ) -> Result<ClipOutput> {
        let b = self.batch_size;
        let dev = self.device();
        let mut group_sq: BTreeMap<String, Tensor> = BTreeMap::new();
        let mut members: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for p in self.uses.keys() {
            let g = groups
                .group_of(p)
                .ok_or_else(|| ModelError::UngroupedParameter { param: p.clone() })?;
            let n = self.sq_norms(p)?;
            let e = group_sq
                .entry(g.to_string())
                .or_insert(Tensor::f_zeros([b], (self.kind, dev))?);
            *e = e.f_add(&n)?;
            members.entry(g.to_string()).or_default().push(p.clone());
        }
        // Weights before clipping.
        let mut w: BTreeMap<String, Tensor> = BTreeMap::new();
        for (g, sq) in group_sq.iter_mut() {
            if let Some(wt) = weights.get(g) {
                if wt.size() != [b] {
                    return Err(ModelError::ShapeMismatch {
                        what: format!("record weights of group {g}"),
                        expected: vec![b],
                        got: wt.size(),
                    });
                }
                let wt = wt.f_to_kind(self.kind)?.f_to(dev)?;
                *sq = sq.f_mul(&wt.f_square()?)?;
                w.insert(g.clone(), wt);
            }
        }
        for g in weights.keys() {
            if !group_sq.contains_key(g) {
                return Err(ModelError::InvalidClip(format!(
                    "record weights given for group {g}, which has no trainable parameter in this pass"
                )));
            }
        }
        let factor = |sq: &Tensor, bound: f64| -> Result<Tensor> {
            if !(bound.is_finite() && bound > 0.0) {
                return Err(ModelError::InvalidClip(format!(
                    "bound {bound} must be finite and > 0"
                )));
            }
            clip_factors(sq, bound)
        };
        let mut coeffs: BTreeMap<String, Tensor> = BTreeMap::new();
        match policy {
            ClipPolicy::RoleWise(bounds) => {
                for (g, sq) in &group_sq {
                    let c = bounds.get(g).ok_or_else(|| {
                        ModelError::InvalidClip(format!("no clipping bound for group {g}"))
                    })?;
                    coeffs.insert(g.clone(), factor(sq, *c)?);
                }
            }
            ClipPolicy::Global(c) => {
                let mut tot = Tensor::f_zeros([b], (self.kind, dev))?;
                for sq in group_sq.values() {
                    tot = tot.f_add(sq)?;
                }
                let f = factor(&tot, *c)?;
                for g in group_sq.keys() {
                    coeffs.insert(g.clone(), f.shallow_clone());
                }
            }
        }
        let mut sums = BTreeMap::new();
        for (g, ps) in &members {
            let mut c = coeffs[g].shallow_clone();
            if let Some(wt) = w.get(g) {
                c = c.f_mul(wt)?;
            }
            for p in ps {
                sums.insert(p.clone(), self.weighted_sum(p, &c)?);
            }
        }
        Ok(ClipOutput {
            group_sq_norms: group_sq,
            clip_factors: coeffs,
            sums,
        })
    }
}

/// Clip factors `min(1, C / (‖g_b‖ + 1e-12))` from squared norms (raptor-clip's
/// `clip_coefficients`, so the slice and tensor paths agree).
pub fn clip_factors(sq_norms: &Tensor, bound: f64) -> Result<Tensor> {
    Ok(clip_coefficients(sq_norms, bound, None)?.f_to_kind(sq_norms.kind())?)
}

/// Assignment of parameters to caller-named groups (e.g. `shared`, `expert[3,5]`).
#[derive(Debug, Clone, Default)]
pub struct ParamGroups {
    map: BTreeMap<String, String>,
}

impl ParamGroups {
    /// Empty assignment.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts `param` in `group`.
    pub fn assign(&mut self, param: impl Into<String>, group: impl Into<String>) {
        self.map.insert(param.into(), group.into());
    }

    /// Groups every name in `params` by `f` (names for which `f` is None stay unassigned).
    pub fn from_fn<I, S, F>(params: I, f: F) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
        F: Fn(&str) -> Option<String>,
    {
        let mut g = Self::new();
        for p in params {
            let p: String = p.into();
            if let Some(name) = f(&p) {
                g.assign(p, name);
            }
        }
        g
    }

    /// The group of `param`.
    pub fn group_of(&self, param: &str) -> Option<&str> {
        self.map.get(param).map(String::as_str)
    }

    /// All (param, group) pairs.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.map.iter().map(|(a, b)| (a.as_str(), b.as_str()))
    }
}

/// How per-record gradients are clipped.
#[derive(Debug, Clone)]
pub enum ClipPolicy {
    /// Each group has its own bound (RAPTOR: `shared` and each `expert[l,e]` stream).
    RoleWise(BTreeMap<String, f64>),
    /// One bound over the concatenation of all groups (monolithic DP-SGD).
    Global(f64),
}

/// Result of [`PerSampleGrads::clip`].
#[derive(Debug)]
pub struct ClipOutput {
    /// Per-record squared norm `[B]` of each group's (weighted) gradient.
    pub group_sq_norms: BTreeMap<String, Tensor>,
    /// Per-record clip factor `[B]` of each group, `min(1, C/‖w_b g_b‖)`.
    pub clip_factors: BTreeMap<String, Tensor>,
    /// Per parameter: `Σ_b factor_b · w_b · G_b` (no noise, no denominator).
    pub sums: BTreeMap<String, Tensor>,
}
