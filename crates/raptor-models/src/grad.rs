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
//! * clipped sums `Σ_b c_b G_b` by one contraction per op, the narrower of the activation and
//!   the output gradient scaled by the record coefficients (book-keeping); for a linear weight
//!   whose norms materialized `G_b` (LoRA factors, small expert matrices) the norm pass keeps
//!   them (within a budget: the size of the pass's output gradients) and the sum is one
//!   `[1, B] × [B, out·in]` product instead of a contraction over every token row.

use crate::error::{ModelError, Result};
use crate::tape::{Part, Rows, Site, Tape};
use raptor_clip::linear::{
    NormMethod, clip_coefficients, ghost_cost, linear_per_example_sq_norms_with, materialized_cost,
    per_record_sq_sums,
};
use raptor_clip::routed::{ragged_cost, routed_linear_grads, routed_linear_sq_norms};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use tch::{Kind, Tensor};

/// Materialize per-record weight gradients when `T·(in+out) > in·out` and `B·in·out` is at most
/// this many elements; otherwise use the ghost identity.
const MATERIALIZE_MAX_ELEMS: i64 = 1 << 26;

/// Records are processed in chunks whose temporaries (Gram matrices, padded routed rows,
/// materialized per-record gradients) stay under about this many elements (the default of
/// [`EngineLimits::chunk_elems`]).
const CHUNK_ELEMS: i64 = 1 << 22;

/// Memory limits of the per-sample engine ([`PerSampleGrads::with_limits`]). They change how
/// the work is cut up and what is kept between the norm pass and the sums, never a result
/// beyond round-off (tested: the clipped sums agree with a loop of single-record passes under
/// every setting).
///
/// ```
/// use raptor_models::EngineLimits;
/// // One record per chunk, and nothing kept between the norm pass and the sums.
/// let frugal = EngineLimits { chunk_elems: 1, cache_elems: Some(0) };
/// assert!(frugal.chunk_elems < EngineLimits::default().chunk_elems);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineLimits {
    /// Records are processed in chunks whose temporaries (Gram matrices, padded routed rows,
    /// materialized per-record gradients) stay under about this many elements; a chunk holds
    /// at least one record. Default `2^22`.
    pub chunk_elems: i64,
    /// Elements of per-record gradients the norm pass may keep for the clipped sums
    /// ([`ClipOutput::from_cache`]); `None` (the default): as many as the pass's output
    /// gradients hold, so the cache at most doubles what the backward pass left.
    pub cache_elems: Option<i64>,
}

impl Default for EngineLimits {
    fn default() -> Self {
        Self {
            chunk_elems: CHUNK_ELEMS,
            cache_elems: None,
        }
    }
}

/// A site's output gradient (the op output `z` itself is dropped right after the backward).
struct GradSite {
    rows: Rows,
    parts: Vec<Part>,
    /// Output gradient `∂L/∂z` in the site's own row layout.
    g: Tensor,
    /// Routed sites: row offset of each record's rows (`B + 1` entries; rows sorted by record).
    offsets: Option<Vec<i64>>,
}

impl GradSite {
    /// Tokens per record: T for dense sites, the largest routed count for routed ones.
    fn tokens(&self) -> i64 {
        match &self.offsets {
            Some(off) => off
                .windows(2)
                .map(|w| w[1] - w[0])
                .max()
                .unwrap_or(1)
                .max(1),
            None => {
                let sz = self.g.size();
                let b = sz.first().copied().unwrap_or(1).max(1);
                let out = sz.last().copied().unwrap_or(1).max(1);
                (self.g.numel() as i64 / (b * out)).max(1)
            }
        }
    }

    fn out_dim(&self) -> i64 {
        self.g.size().last().copied().unwrap_or(1)
    }

    /// Rows of records `r0..r0+n` of `x` (`x` in the site's row layout: `[B, ...]` or
    /// `[N, d]` routed rows), as `[n, T, d]` (routed rows zero-padded within the chunk).
    fn chunk(&self, x: &Tensor, r0: i64, n: i64) -> Result<Tensor> {
        let d = x.size().last().copied().unwrap_or(1);
        match &self.offsets {
            None => Ok(x.f_narrow(0, r0, n)?.f_reshape([n, -1, d])?),
            Some(off) => {
                let (lo, hi) = (off[r0 as usize], off[(r0 + n) as usize]);
                let counts: Vec<i64> = (r0..r0 + n)
                    .map(|r| off[r as usize + 1] - off[r as usize])
                    .collect();
                let tmax = counts.iter().copied().max().unwrap_or(1).max(1);
                if x.device() == tch::Device::Cpu {
                    match x.kind() {
                        Kind::Float => return pad_rows::<f32>(x, lo, hi, &counts, tmax, d),
                        Kind::Double => return pad_rows::<f64>(x, lo, hi, &counts, tmax, d),
                        _ => {}
                    }
                }
                let mut pos = Vec::with_capacity((hi - lo) as usize);
                for (i, &c) in counts.iter().enumerate() {
                    pos.extend((0..c).map(|j| i as i64 * tmax + j));
                }
                let z = Tensor::f_zeros([n * tmax, d], (x.kind(), x.device()))?;
                if hi == lo {
                    return Ok(z.f_reshape([n, tmax, d])?);
                }
                let pos = Tensor::f_from_slice(&pos)?.f_to(x.device())?;
                Ok(z.f_index_copy(0, &pos, &x.f_narrow(0, lo, hi - lo)?)?
                    .f_reshape([n, tmax, d])?)
            }
        }
    }

    /// Per-row coefficients `[rows, 1]` from per-record ones `c` (`[B]`), rows as in
    /// `g.reshape([-1, out])`.
    fn row_coeffs(&self, c: &Tensor, b: i64) -> Result<Tensor> {
        Ok(match &self.rows {
            Rows::Dense => {
                let rows = self.g.numel() as i64 / self.out_dim().max(1);
                c.f_reshape([b, 1])?
                    .f_expand([b, rows / b.max(1)], false)?
                    .f_reshape([-1, 1])?
            }
            Rows::Routed { rec } => c.f_index_select(0, rec)?.f_unsqueeze(1)?,
        })
    }

    /// Output gradient scaled by per-record coefficients `c` (`[B]`), in the site's layout.
    fn scaled_g(&self, c: &Tensor, b: i64) -> Result<Tensor> {
        Ok(match &self.rows {
            Rows::Dense => {
                let mut shape = vec![b];
                shape.extend(std::iter::repeat_n(1, self.g.dim().saturating_sub(1)));
                self.g.f_mul(&c.f_reshape(shape.as_slice())?)?
            }
            Rows::Routed { rec } => self.g.f_mul(&c.f_index_select(0, rec)?.f_unsqueeze(1)?)?,
        })
    }
}

/// Routed rows `lo..hi` of `x` (`[N, d]`, rows sorted by record, `counts[i]` rows for the
/// i-th record of the chunk) as `[n, tmax, d]`, each record's rows first and zeros after: the
/// CPU form of `GradSite::chunk`'s zero-fill and `index_copy`. Every element of the result is
/// written once (a record's rows, then its padding), straight from `x`'s storage into the new
/// tensor's: the earlier form (a copy out of `x`, a zeroed buffer, a copy into a tensor) moved
/// each element three times.
fn pad_rows<T: tch::kind::Element + Copy + Default>(
    x: &Tensor,
    lo: i64,
    hi: i64,
    counts: &[i64],
    tmax: i64,
    d: i64,
) -> Result<Tensor> {
    let n = counts.len() as i64;
    let du = d as usize;
    let tm = tmax as usize;
    let total: i64 = counts.iter().sum();
    if total != hi - lo || lo < 0 || hi < lo || x.size().first().is_none_or(|&rows| hi > rows) {
        return Err(internal("routed row counts do not match the rows"));
    }
    if counts.iter().any(|&c| c < 0 || c > tmax) || d < 0 || x.dim() != 2 {
        return Err(internal("routed rows do not fit the padded layout"));
    }
    let out = Tensor::f_empty([n, tmax, d], (T::KIND, tch::Device::Cpu))?;
    let out_len = (n * tmax * d) as usize;
    if out_len == 0 {
        return Ok(out);
    }
    if out.kind() != T::KIND || !out.is_contiguous() || out.numel() != out_len {
        return Err(internal("a fresh tensor is not contiguous"));
    }
    // SAFETY: `out` is a fresh contiguous CPU tensor of `out_len` elements of type `T`,
    // aliased by nothing while `dst` lives; its memory is not yet initialized, hence
    // `MaybeUninit`, and every element is written below before `out` is returned.
    let dst: &mut [std::mem::MaybeUninit<T>] = unsafe {
        std::slice::from_raw_parts_mut(out.data_ptr().cast::<std::mem::MaybeUninit<T>>(), out_len)
    };
    with_cpu_slice(&x.f_narrow(0, lo, hi - lo)?, |from: &[T]| -> Result<()> {
        let mut at = 0usize;
        for (rec, &c) in dst.chunks_exact_mut(tm * du).zip(counts) {
            let len = c as usize * du;
            let (rows, pad) = rec.split_at_mut(len);
            let src = from
                .get(at..at + len)
                .ok_or_else(|| internal("routed row counts do not match the rows"))?;
            for (d, &v) in rows.iter_mut().zip(src) {
                d.write(v);
            }
            pad.fill(std::mem::MaybeUninit::new(T::default()));
            at += len;
        }
        Ok(())
    })??;
    Ok(out)
}

fn internal(what: &str) -> ModelError {
    ModelError::InvalidConfig(format!("internal: {what}"))
}

/// `f` on the elements of `t`, a CPU tensor of `T` (a contiguous copy first when it is not
/// contiguous), borrowed in place.
fn with_cpu_slice<T: tch::kind::Element, R>(t: &Tensor, f: impl FnOnce(&[T]) -> R) -> Result<R> {
    if t.kind() != T::KIND || t.device() != tch::Device::Cpu {
        return Err(internal("a CPU slice of another dtype or device"));
    }
    let c = t.f_contiguous()?;
    let len = c.numel();
    if len == 0 {
        return Ok(f(&[]));
    }
    // SAFETY: `c` is a contiguous CPU tensor of `len` initialized elements of type `T` (dtype
    // checked above), alive until the end of this function, and only read while `s` lives.
    let s = unsafe { std::slice::from_raw_parts(c.data_ptr().cast::<T>().cast_const(), len) };
    Ok(f(s))
}

/// A new zero-filled contiguous CPU tensor of `T` and shape `shape`, then handed to `f` as a
/// mutable slice (for kernels that write into it).
fn with_new_cpu_tensor<T: tch::kind::Element, R>(
    shape: &[i64],
    f: impl FnOnce(&mut [T]) -> Result<R>,
) -> Result<(Tensor, R)> {
    let out = Tensor::f_zeros(shape, (T::KIND, tch::Device::Cpu))?;
    let len = out.numel();
    if len == 0 {
        let r = f(&mut [])?;
        return Ok((out, r));
    }
    if out.kind() != T::KIND || !out.is_contiguous() {
        return Err(internal("a fresh tensor is not contiguous"));
    }
    // SAFETY: `out` is a fresh, zero-filled (initialized) contiguous CPU tensor of `len`
    // elements of type `T`, owned here and aliased by nothing while `s` lives.
    let s = unsafe { std::slice::from_raw_parts_mut(out.data_ptr().cast::<T>(), len) };
    let r = f(s)?;
    Ok((out, r))
}

/// Per-record gradients of all trainable parameters used in one forward pass.
///
/// Holds, per recorded op, only `∂L/∂z` and what turns it into per-record gradients (input
/// activations, ids); [`Self::into_clip`] frees each op's tensors as soon as its clipped sums
/// are taken.
pub struct PerSampleGrads {
    batch_size: i64,
    kind: Kind,
    device: tch::Device,
    sites: Vec<GradSite>,
    /// param → (site, part) uses.
    uses: BTreeMap<String, Vec<(usize, usize)>>,
    /// Per-record gradients materialized by the norm pass, kept for the clipped sums (only
    /// while [`Self::clip`] / [`Self::into_clip`] run).
    cache: RefCell<Option<MatCache>>,
    limits: EngineLimits,
}

/// Per-record gradients `[n, out, in]` of single-use linear weights whose norms were computed
/// by materializing them, chunk by chunk in record order, so that the clipped sum is one
/// `[1, n] × [n, out·in]` product per chunk instead of a contraction over every token row. At
/// most `budget` elements are kept (the size of the pass's output gradients: the cache at most
/// doubles what the backward pass left); a parameter that does not fit is not kept at all and
/// takes the token-row contraction.
struct MatCache {
    budget: i64,
    used: i64,
    grads: BTreeMap<String, Vec<Tensor>>,
    skipped: BTreeSet<String>,
    /// Parameters whose clipped sum came from the cache.
    served: BTreeSet<String>,
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

enum Factor {
    Dense(Tensor),
    OneHot(Tensor),
    Ones(i64),
}

/// The dtype clip coefficients and clipped-sum contractions are computed in: f64 for f64
/// models, f32 otherwise (a bf16/f16 coefficient could round up and let a record exceed its
/// bound).
fn compute_kind(kind: Kind) -> Kind {
    match kind {
        Kind::Double => Kind::Double,
        _ => Kind::Float,
    }
}

/// `t` in `kind`, with NaN and ±inf replaced by 0 when `sanitize` (only records of coefficient
/// 0 hold such entries, so this changes no contribution; it stops 0 · NaN = NaN).
fn prep(t: &Tensor, kind: Kind, sanitize: bool) -> Result<Tensor> {
    let t = if t.kind() == kind || !t.is_floating_point() {
        t.shallow_clone()
    } else {
        t.f_to_kind(kind)?
    };
    Ok(if sanitize && t.is_floating_point() {
        t.f_nan_to_num(0.0, 0.0, 0.0)?
    } else {
        t
    })
}

impl GradSite {
    /// This site with its float tensors in `kind` (and non-finite entries zeroed when
    /// `sanitize`), or `None` when nothing changes.
    fn prepared(&self, kind: Kind, sanitize: bool) -> Result<Option<GradSite>> {
        if self.g.kind() == kind && !sanitize {
            return Ok(None);
        }
        let rows = match &self.rows {
            Rows::Dense => Rows::Dense,
            Rows::Routed { rec } => Rows::Routed {
                rec: rec.shallow_clone(),
            },
        };
        let parts = self
            .parts
            .iter()
            .map(|p| {
                Ok(match p {
                    Part::Weight { param, a } => Part::Weight {
                        param: param.clone(),
                        a: prep(a, kind, sanitize)?,
                    },
                    Part::Bias { param } => Part::Bias {
                        param: param.clone(),
                    },
                    Part::Gain { param, n } => Part::Gain {
                        param: param.clone(),
                        n: prep(n, kind, sanitize)?,
                    },
                    Part::Embedding { param, ids, vocab } => Part::Embedding {
                        param: param.clone(),
                        ids: ids.shallow_clone(),
                        vocab: *vocab,
                    },
                    Part::Buckets {
                        param,
                        buckets,
                        num_buckets,
                    } => Part::Buckets {
                        param: param.clone(),
                        buckets: buckets.shallow_clone(),
                        num_buckets: *num_buckets,
                    },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(GradSite {
            rows,
            parts,
            g: prep(&self.g, kind, sanitize)?,
            offsets: self.offsets.clone(),
        }))
    }
}

impl PerSampleGrads {
    /// One backward pass of `loss` (a scalar: the sum over records of per-record losses) to
    /// the outputs of every op recorded in `tape`; `batch_size` is B. The recorded outputs
    /// are released as soon as the backward returns (only their gradients are kept).
    pub fn compute(tape: Tape, loss: &Tensor, batch_size: i64) -> Result<Self> {
        if loss.numel() != 1 {
            return Err(ModelError::ShapeMismatch {
                what: "loss (must be a scalar sum of per-record losses)".into(),
                expected: vec![],
                got: loss.size(),
            });
        }
        let kind = loss.kind();
        let device = loss.device();
        let mut zs = Vec::with_capacity(tape.sites.len());
        let mut rest = Vec::with_capacity(tape.sites.len());
        for Site { z, rows, parts } in tape.sites {
            zs.push(z);
            rest.push((rows, parts));
        }
        let gs = if zs.is_empty() {
            Vec::new()
        } else {
            let refs: Vec<&Tensor> = zs.iter().collect();
            Tensor::f_run_backward(&[loss], &refs, false, false)?
        };
        let mut sites = Vec::with_capacity(gs.len());
        let mut uses: BTreeMap<String, Vec<(usize, usize)>> = BTreeMap::new();
        for (i, ((z, (rows, parts)), g)) in zs.into_iter().zip(rest).zip(gs).enumerate() {
            let g = if g.defined() { g } else { z.f_zeros_like()? };
            drop(z);
            let offsets = match &rows {
                Rows::Dense => None,
                Rows::Routed { rec } => {
                    let counts: Vec<i64> = Vec::try_from(
                        rec.f_bincount(None::<&Tensor>, batch_size)?
                            .f_to(tch::Device::Cpu)?,
                    )?;
                    let mut off = Vec::with_capacity(counts.len() + 1);
                    off.push(0i64);
                    for c in counts.iter().take(batch_size as usize) {
                        off.push(off.last().copied().unwrap_or(0) + c);
                    }
                    Some(off)
                }
            };
            for (j, p) in parts.iter().enumerate() {
                uses.entry(p.param().to_string()).or_default().push((i, j));
            }
            sites.push(GradSite {
                rows,
                parts,
                g,
                offsets,
            });
        }
        Ok(Self {
            batch_size,
            kind,
            device,
            sites,
            uses,
            cache: RefCell::new(None),
            limits: EngineLimits::default(),
        })
    }

    /// The same gradients under other memory limits (see [`EngineLimits`]); an error for a
    /// `chunk_elems` below 1 or a negative `cache_elems`.
    pub fn with_limits(mut self, limits: EngineLimits) -> Result<Self> {
        if limits.chunk_elems < 1 {
            return Err(ModelError::InvalidConfig(format!(
                "engine chunk size {} must be at least 1 element",
                limits.chunk_elems
            )));
        }
        if let Some(c) = limits.cache_elems
            && c < 0
        {
            return Err(ModelError::InvalidConfig(format!(
                "engine cache budget {c} must be at least 0 elements"
            )));
        }
        self.limits = limits;
        Ok(self)
    }

    /// The memory limits in force.
    pub fn limits(&self) -> EngineLimits {
        self.limits
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
        (s, &s.parts[u.1])
    }

    fn uses_of(&self, param: &str) -> Result<&Vec<(usize, usize)>> {
        self.uses
            .get(param)
            .ok_or_else(|| ModelError::UnknownParameter {
                param: param.into(),
            })
    }

    /// Per-record gradient `[n, ...param shape]` of a "direct" part over records `r0..r0+n`.
    fn direct(&self, s: &GradSite, p: &Part, r0: i64, n: i64) -> Result<Tensor> {
        Ok(match p {
            Part::Gain { n: nt, .. } => s
                .chunk(&s.g, r0, n)?
                .f_mul(&s.chunk(nt, r0, n)?)?
                .f_sum_dim_intlist(1, false, None::<Kind>)?,
            Part::Bias { .. } => s
                .chunk(&s.g, r0, n)?
                .f_sum_dim_intlist(1, false, None::<Kind>)?,
            Part::Buckets {
                buckets,
                num_buckets,
                ..
            } => {
                // g [B, H, Tq, Tk] → [n, nb, H].
                let h = s.g.size()[1];
                let gq =
                    s.g.f_narrow(0, r0, n)?
                        .f_permute([0, 2, 3, 1])?
                        .f_reshape([n, -1, h])?;
                let z = Tensor::f_zeros([n, *num_buckets, h], (s.g.kind(), s.g.device()))?;
                z.f_index_add(1, &buckets.f_reshape([-1])?, &gq)?
            }
            Part::Weight { .. } | Part::Embedding { .. } => {
                return Err(ModelError::InvalidConfig(format!(
                    "internal: {} has no direct form",
                    p.param()
                )));
            }
        })
    }

    /// (u, v) factors over records `r0..r0+n` with grad = Σ_t u_t v_tᵀ.
    fn factors(&self, s: &GradSite, p: &Part, r0: i64, n: i64) -> Result<(Factor, Factor)> {
        match p {
            Part::Weight { a, .. } => Ok((
                Factor::Dense(s.chunk(&s.g, r0, n)?),
                Factor::Dense(s.chunk(a, r0, n)?),
            )),
            Part::Embedding { ids, .. } => Ok((
                Factor::OneHot(ids.f_narrow(0, r0, n)?.f_reshape([n, -1])?),
                Factor::Dense(s.chunk(&s.g, r0, n)?),
            )),
            Part::Bias { .. } => {
                let g3 = s.chunk(&s.g, r0, n)?;
                let t = g3.size()[1];
                Ok((Factor::Dense(g3), Factor::Ones(t)))
            }
            _ => Err(ModelError::InvalidConfig(format!(
                "internal: no factor form for {}",
                p.param()
            ))),
        }
    }

    fn gram(&self, x: &Factor, y: &Factor) -> Result<Tensor> {
        Ok(match (x, y) {
            // Norms in f32 at least: bf16/f16 factors are widened first.
            (Factor::Dense(x), Factor::Dense(y)) => {
                let ck = compute_kind(self.kind);
                x.f_to_kind(ck)?
                    .f_bmm(&y.f_to_kind(ck)?.f_transpose(1, 2)?)?
            }
            (Factor::OneHot(i), Factor::OneHot(j)) => i
                .f_unsqueeze(2)?
                .f_eq_tensor(&j.f_unsqueeze(1)?)?
                .f_to_kind(compute_kind(self.kind))?,
            (Factor::OneHot(i), Factor::Dense(y)) => {
                let (n, t, s) = (i.size()[0], i.size()[1], y.size()[1]);
                let idx = i.f_unsqueeze(1)?.f_expand([n, s, t], false)?;
                y.f_to_kind(compute_kind(self.kind))?
                    .f_gather(2, &idx, false)?
                    .f_transpose(1, 2)?
            }
            (Factor::Dense(_), Factor::OneHot(_)) => self.gram(y, x)?.f_transpose(1, 2)?,
            (Factor::Ones(t), Factor::Ones(s)) => {
                return Err(ModelError::InvalidConfig(format!(
                    "internal: ones-by-ones factor ({t}, {s}) needs the chunk size"
                )));
            }
            _ => {
                return Err(ModelError::InvalidConfig(
                    "internal: incompatible factor kinds on one parameter".into(),
                ));
            }
        })
    }

    /// Records per chunk for a parameter's norm computation (bounded temporaries: Gram
    /// matrices, padded copies of routed rows, materialized per-record gradients).
    fn chunk_records(&self, uses: &[(usize, usize)]) -> i64 {
        let mut per_record = 1i64;
        for &u in uses {
            let (s, p) = self.part(u);
            let t = s.tokens();
            let out = s.out_dim();
            let c = match p {
                Part::Buckets { .. } => 2 * (s.g.numel() as i64 / self.batch_size.max(1)),
                _ => {
                    let din = match p {
                        Part::Weight { a, .. } => a.size().last().copied().unwrap_or(1),
                        _ => out,
                    };
                    let mut c = 3 * t * t;
                    if s.offsets.is_some() {
                        c += t * (din + out);
                    }
                    if din * out < t * (din + out) {
                        c += din * out;
                    }
                    c
                }
            };
            per_record = per_record.max(c);
        }
        (self.limits.chunk_elems / per_record).clamp(1, self.batch_size.max(1))
    }

    /// Ghost norms of the single-use dense linear weights that read one same input activation
    /// (q, k, v of an attention block; LoRA A's of one input): each chunk's activation Gram
    /// `a aᵀ` is computed once for all of them. Same formula as raptor-clip's ghost kernel.
    fn shared_input_norms(&self) -> Result<BTreeMap<String, Tensor>> {
        // (data pointer, sizes, strides) of the activation → (param, use) reading it.
        type Key = (usize, Vec<i64>, Vec<i64>);
        type Readers = Vec<(String, (usize, usize))>;
        let b = self.batch_size;
        let mut by_input: BTreeMap<Key, Readers> = BTreeMap::new();
        for (p, uses) in &self.uses {
            if uses.len() != 1 {
                continue;
            }
            let (s, part) = self.part(uses[0]);
            let Part::Weight { a, .. } = part else {
                continue;
            };
            if s.offsets.is_some() {
                continue;
            }
            let (t, din, dout) = (
                s.tokens(),
                a.size().last().copied().unwrap_or(1),
                s.out_dim(),
            );
            if materialized_cost(b, t, din, dout) < ghost_cost(b, t, din, dout) {
                continue;
            }
            let key = (a.data_ptr() as usize, a.size(), a.stride());
            by_input.entry(key).or_default().push((p.clone(), uses[0]));
        }
        let mut out = BTreeMap::new();
        for members in by_input.into_values().filter(|m| m.len() > 1) {
            let c = members
                .iter()
                .map(|(_, u)| self.chunk_records(&[*u]))
                .min()
                .unwrap_or(1);
            let mut per: Vec<Vec<Tensor>> = members.iter().map(|_| Vec::new()).collect();
            let (s0, p0) = self.part(members[0].1);
            let Part::Weight { a, .. } = p0 else {
                continue;
            };
            let kind = match a.kind() {
                Kind::Double => Kind::Double,
                _ => Kind::Float,
            };
            let mut r0 = 0;
            while r0 < b {
                let n = c.min(b - r0);
                let a3 = s0.chunk(a, r0, n)?.f_to_kind(kind)?;
                let aa = a3.f_bmm(&a3.f_transpose(1, 2)?)?;
                for (i, (_, u)) in members.iter().enumerate() {
                    let s = &self.sites[u.0];
                    let g3 = s.chunk(&s.g, r0, n)?.f_to_kind(kind)?;
                    let gg = g3.f_bmm(&g3.f_transpose(1, 2)?)?;
                    per[i].push(
                        aa.f_mul(&gg)?
                            .f_sum_dim_intlist([1i64, 2].as_slice(), false, None::<Kind>)?
                            .f_clamp_min(0.0)?,
                    );
                }
                r0 += n;
            }
            for ((p, _), v) in members.into_iter().zip(per) {
                out.insert(p, Tensor::f_cat(&v, 0)?);
            }
        }
        Ok(out)
    }

    /// Per-record squared L2 norms `[B]` of parameter `param`'s gradient, computed in chunks
    /// of records so that Gram matrices, padded routed rows and materialized per-record
    /// gradients of the whole batch are never alive at once.
    pub fn sq_norms(&self, param: &str) -> Result<Tensor> {
        let uses = self.uses_of(param)?;
        let b = self.batch_size;
        let c = self.chunk_records(uses);
        let mut outs = Vec::new();
        let mut r0 = 0;
        while r0 < b {
            let n = c.min(b - r0);
            outs.push(self.sq_norms_chunk(param, uses, r0, n)?);
            r0 += n;
        }
        if outs.len() == 1 {
            return outs.pop().ok_or_else(|| ModelError::UnknownParameter {
                param: param.into(),
            });
        }
        Ok(Tensor::f_cat(&outs, 0)?)
    }

    fn sq_norms_chunk(
        &self,
        param: &str,
        uses: &[(usize, usize)],
        r0: i64,
        n: i64,
    ) -> Result<Tensor> {
        // Direct parts: sum per-record grads.
        let mut direct: Option<Tensor> = None;
        let mut factor_uses = Vec::new();
        for &u in uses {
            let (s, p) = self.part(u);
            let is_direct = match p {
                Part::Gain { .. } | Part::Buckets { .. } => true,
                Part::Bias { .. } => uses.len() == 1,
                _ => false,
            };
            if is_direct {
                let d = self.direct(s, p, r0, n)?;
                direct = Some(match direct {
                    Some(acc) => acc.f_add(&d)?,
                    None => d,
                });
            } else {
                factor_uses.push(u);
            }
        }
        if direct.is_some() && !factor_uses.is_empty() {
            return Err(ModelError::InvalidConfig(format!(
                "parameter {param} mixes direct and factored uses"
            )));
        }
        if let Some(d) = direct {
            let d = d.f_to_kind(compute_kind(self.kind))?;
            return Ok(d.f_reshape([n, -1])?.f_square()?.f_sum_dim_intlist(
                1,
                false,
                None::<Kind>,
            )?);
        }
        // Single linear use: raptor-clip's ghost or materialized kernel, by cost (materialized
        // only while n·in·out stays under a memory cap).
        if factor_uses.len() == 1 {
            let (s, p) = self.part(factor_uses[0]);
            if let Part::Weight { a, .. } = p {
                if let Some(sq) = self.routed_sq_norms(param, s, a, r0, n)? {
                    return Ok(sq);
                }
                let a3 = s.chunk(a, r0, n)?;
                let g3 = s.chunk(&s.g, r0, n)?;
                let (t, din, dout) = (a3.size()[1], a3.size()[2], g3.size()[2]);
                let cheaper = materialized_cost(n, t, din, dout) < ghost_cost(n, t, din, dout);
                let method = if cheaper && n * din * dout <= MATERIALIZE_MAX_ELEMS {
                    NormMethod::Materialized
                } else {
                    NormMethod::Ghost
                };
                if method == NormMethod::Materialized
                    && let Some(sq) = self.materialize_cached(param, &a3, &g3)?
                {
                    return Ok(sq);
                }
                return Ok(linear_per_example_sq_norms_with(&a3, &g3, None, method)?);
            }
        }
        let facs: Vec<(Factor, Factor)> = factor_uses
            .iter()
            .map(|&u| {
                let (s, p) = self.part(u);
                self.factors(s, p, r0, n)
            })
            .collect::<Result<_>>()?;
        let ck = compute_kind(self.kind);
        let mut total = Tensor::f_zeros([n], (ck, self.device))?;
        for i in 0..facs.len() {
            for j in i..facs.len() {
                let (ui, vi) = &facs[i];
                let (uj, vj) = &facs[j];
                let gv = match (vi, vj) {
                    (Factor::Ones(t), Factor::Ones(s)) => {
                        Tensor::f_ones([n, *t, *s], (ck, self.device))?
                    }
                    _ => self.gram(vi, vj)?,
                };
                let c = self.gram(ui, uj)?.f_mul(&gv)?.f_sum_dim_intlist(
                    [1i64, 2].as_slice(),
                    false,
                    None::<Kind>,
                )?;
                total = if i == j {
                    total.f_add(&c)?
                } else {
                    total.f_add(&c.f_mul_scalar(2.0)?)?
                };
            }
        }
        Ok(total)
    }

    /// Room in the materialized-gradient cache for `need` more elements of `param`: false (and
    /// `param` dropped from the cache for this pass, its sums then taken by the row
    /// contraction) when caching is off, `param` was dropped before, or the budget is spent.
    fn cache_admits(&self, param: &str, need: i64) -> bool {
        let mut guard = self.cache.borrow_mut();
        let Some(cache) = guard.as_mut() else {
            return false;
        };
        if cache.skipped.contains(param) {
            return false;
        }
        if cache.used + need > cache.budget {
            if let Some(v) = cache.grads.remove(param) {
                cache.used -= v.iter().map(|t| t.numel() as i64).sum::<i64>();
            }
            cache.skipped.insert(param.to_string());
            return false;
        }
        true
    }

    /// Keeps one chunk's per-record gradients `gi` of `param` for the clipped sums (after
    /// [`Self::cache_admits`] said yes).
    fn cache_keep(&self, param: &str, gi: Tensor) {
        if let Some(cache) = self.cache.borrow_mut().as_mut() {
            cache.used += gi.numel() as i64;
            cache.grads.entry(param.to_string()).or_default().push(gi);
        }
    }

    /// Squared norms `[n]` of one chunk's per-record gradients of a routed linear weight (an
    /// expert's, rows grouped by record) on the CPU in f32, over the records' own rows (no
    /// padding to the longest record) by raptor-clip's ragged kernels, whichever does less
    /// work ([`ragged_cost`]): the ghost identity ([`routed_linear_sq_norms`]; the clipped sums
    /// are then one row contraction), or materializing ([`routed_linear_grads`]) and keeping
    /// the gradients for the sums when the cache has room. `None` (nothing done) unless the
    /// site is routed and f32 on the CPU.
    fn routed_sq_norms(
        &self,
        param: &str,
        s: &GradSite,
        a: &Tensor,
        r0: i64,
        n: i64,
    ) -> Result<Option<Tensor>> {
        let Some(off) = &s.offsets else {
            return Ok(None);
        };
        let cpu = tch::Device::Cpu;
        if self.kind != Kind::Float
            || a.kind() != Kind::Float
            || s.g.kind() != Kind::Float
            || a.device() != cpu
            || s.g.device() != cpu
            || a.dim() != 2
            || s.g.dim() != 2
        {
            return Ok(None);
        }
        let (din, dout) = (a.size()[1], s.g.size()[1]);
        let window = off
            .get(r0 as usize..=(r0 + n) as usize)
            .ok_or_else(|| internal("routed chunk outside the batch"))?;
        let (lo, hi) = (window[0], window[window.len() - 1]);
        let rows: Vec<usize> = window.windows(2).map(|w| (w[1] - w[0]) as usize).collect();
        let (ghost, mat) = ragged_cost(&rows, din as usize, dout as usize);
        let materialize = mat < ghost
            && n * din * dout <= MATERIALIZE_MAX_ELEMS
            && self.cache_admits(param, n * din * dout);
        let offsets: Vec<usize> = window.iter().map(|&o| (o - lo) as usize).collect();
        let a_rows = a.f_narrow(0, lo, hi - lo)?;
        let g_rows = s.g.f_narrow(0, lo, hi - lo)?;
        let mut sq = vec![0f64; n as usize];
        // Spread over the rayon pool only when libtorch may use more than one thread too.
        let parallel = tch::get_num_threads() > 1;
        let ck = compute_kind(self.kind);
        let (d_in, d_out) = (din as usize, dout as usize);
        let kept = with_cpu_slice(&a_rows, |av: &[f32]| {
            with_cpu_slice(&g_rows, |gv: &[f32]| -> Result<Option<Tensor>> {
                if !materialize {
                    routed_linear_sq_norms(av, d_in, gv, d_out, &offsets, &mut sq, parallel)?;
                    return Ok(None);
                }
                let (gi, ()) = with_new_cpu_tensor::<f32, ()>(&[n, dout, din], |grads| {
                    Ok(routed_linear_grads(
                        av, d_in, gv, d_out, &offsets, grads, &mut sq, parallel,
                    )?)
                })?;
                Ok(Some(gi))
            })
        })???;
        if let Some(gi) = kept {
            self.cache_keep(param, gi);
        }
        Ok(Some(Tensor::f_from_slice(&sq)?.f_to_kind(ck)?))
    }

    /// Squared norms `[n]` of one chunk's per-record gradients `G_b = Σ_t g_t a_tᵀ` by
    /// materializing them (the same products as raptor-clip's materialized kernel), keeping
    /// `G` for the clipped sums when caching is on and the budget allows; `None` otherwise.
    fn materialize_cached(&self, param: &str, a3: &Tensor, g3: &Tensor) -> Result<Option<Tensor>> {
        let (n, din, dout) = (a3.size()[0], a3.size()[2], g3.size()[2]);
        if !self.cache_admits(param, n * din * dout) {
            return Ok(None);
        }
        let ck = compute_kind(self.kind);
        let gi = g3
            .f_to_kind(ck)?
            .f_transpose(1, 2)?
            .f_bmm(&a3.f_to_kind(ck)?)?; // [n, out, in]
        let sq = per_record_sq_sums(&gi)?;
        self.cache_keep(param, gi);
        Ok(Some(sq))
    }

    /// `Σ_b c[b] G_b` from the cached per-record gradients of `param` (removed from the cache),
    /// in the model's dtype; `None` when `param` has more than one use or its per-record
    /// gradients are not all cached. With `sanitize`, non-finite entries (only in records of
    /// coefficient 0) are zeroed first.
    fn cached_sum(&self, param: &str, c: &Tensor, sanitize: bool) -> Result<Option<Tensor>> {
        if self.uses.get(param).is_none_or(|u| u.len() != 1) {
            return Ok(None);
        }
        let mut guard = self.cache.borrow_mut();
        let Some(cache) = guard.as_mut() else {
            return Ok(None);
        };
        let complete = cache
            .grads
            .get(param)
            .is_some_and(|v| v.iter().map(|t| t.size()[0]).sum::<i64>() == self.batch_size);
        if !complete {
            return Ok(None);
        }
        let Some(chunks) = cache.grads.remove(param) else {
            return Ok(None);
        };
        cache.served.insert(param.to_string());
        let ck = compute_kind(self.kind);
        let c = c.f_to_kind(ck)?;
        let mut acc: Option<Tensor> = None;
        let mut r0 = 0i64;
        let mut shape = Vec::new();
        for g in chunks {
            let sz = g.size();
            let n = sz[0];
            shape = sz[1..].to_vec();
            cache.used -= g.numel() as i64;
            let g = if sanitize {
                g.f_nan_to_num(0.0, 0.0, 0.0)?
            } else {
                g
            };
            let term = c
                .f_narrow(0, r0, n)?
                .f_reshape([1, n])?
                .f_mm(&g.f_reshape([n, -1])?)?;
            acc = Some(match acc {
                Some(x) => x.f_add(&term)?,
                None => term,
            });
            r0 += n;
        }
        let Some(acc) = acc else {
            return Ok(None);
        };
        Ok(Some(acc.f_reshape(shape.as_slice())?.f_to_kind(self.kind)?))
    }

    /// Turns the materialized-gradient cache on for one clipping pass (budget: the elements of
    /// the pass's output gradients).
    fn start_cache(&self) {
        let budget = self
            .limits
            .cache_elems
            .unwrap_or_else(|| self.sites.iter().map(|s| s.g.numel() as i64).sum());
        *self.cache.borrow_mut() = Some(MatCache {
            budget,
            used: 0,
            grads: BTreeMap::new(),
            skipped: BTreeSet::new(),
            served: BTreeSet::new(),
        });
    }

    /// Ends a clipping pass: drops what the cache still holds and returns the parameters it
    /// served.
    fn end_cache(&self) -> BTreeSet<String> {
        self.cache
            .borrow_mut()
            .take()
            .map(|c| c.served)
            .unwrap_or_default()
    }

    /// The sum term of one use: from the cache ([`Self::cached_sum`]), else
    /// [`Self::part_sum_safe`].
    fn use_sum(&self, s: &GradSite, p: &Part, c: &Tensor, sanitize: bool) -> Result<Tensor> {
        match self.cached_sum(p.param(), c, sanitize)? {
            Some(t) => Ok(t),
            None => self.part_sum_safe(s, p, c, sanitize),
        }
    }

    /// `Σ_b c[b] · (part p's per-record gradient)` for one use of a parameter.
    fn part_sum(&self, s: &GradSite, p: &Part, c: &Tensor) -> Result<Tensor> {
        let b = self.batch_size;
        let dout = s.out_dim();
        Ok(match p {
            Part::Weight { a, .. } => {
                // One contraction Σ_rows c_row g_row a_rowᵀ (book-keeping), scaling the narrower
                // of the two factors by the record coefficients.
                let din = a.size().last().copied().unwrap_or(1);
                let a2 = a.f_reshape([-1, din])?;
                let g2 = s.g.f_reshape([-1, dout])?;
                let rc = s.row_coeffs(c, b)?;
                if din < dout {
                    g2.f_transpose(0, 1)?.f_mm(&a2.f_mul(&rc)?)?
                } else {
                    g2.f_mul(&rc)?.f_transpose(0, 1)?.f_mm(&a2)?
                }
            }
            Part::Bias { .. } if matches!(s.rows, Rows::Dense) => {
                // Per-record sums first, then one [1, B] × [B, out] product.
                let per =
                    s.g.f_reshape([b, -1, dout])?
                        .f_sum_dim_intlist(1, false, None::<Kind>)?;
                c.f_reshape([1, b])?.f_mm(&per)?.f_reshape([dout])?
            }
            Part::Bias { .. } => s.scaled_g(c, b)?.f_reshape([-1, dout])?.f_sum_dim_intlist(
                0,
                false,
                None::<Kind>,
            )?,
            Part::Gain { n, .. } if matches!(s.rows, Rows::Dense) => {
                let d = n.size().last().copied().unwrap_or(1);
                let per = s.g.f_mul(n)?.f_reshape([b, -1, d])?.f_sum_dim_intlist(
                    1,
                    false,
                    None::<Kind>,
                )?;
                c.f_reshape([1, b])?.f_mm(&per)?.f_reshape([d])?
            }
            Part::Gain { n, .. } => {
                let d = n.size().last().copied().unwrap_or(1);
                s.scaled_g(c, b)?
                    .f_mul(n)?
                    .f_reshape([-1, d])?
                    .f_sum_dim_intlist(0, false, None::<Kind>)?
            }
            Part::Embedding { ids, vocab, .. } => {
                Tensor::f_zeros([*vocab, dout], (s.g.kind(), s.g.device()))?.f_index_add(
                    0,
                    &ids.f_reshape([-1])?,
                    &s.scaled_g(c, b)?.f_reshape([-1, dout])?,
                )?
            }
            Part::Buckets {
                buckets,
                num_buckets,
                ..
            } => {
                // Σ_b c_b g_b [H, Tq, Tk] → [nb, H].
                let h = s.g.size()[1];
                let gs = s
                    .scaled_g(c, b)?
                    .f_sum_dim_intlist(0, false, None::<Kind>)?
                    .f_permute([1, 2, 0])?
                    .f_reshape([-1, h])?;
                Tensor::f_zeros([*num_buckets, h], (s.g.kind(), s.g.device()))?.f_index_add(
                    0,
                    &buckets.f_reshape([-1])?,
                    &gs,
                )?
            }
        })
    }

    fn check_coeffs(&self, param: &str, coeffs: &Tensor) -> Result<Tensor> {
        if coeffs.size() != [self.batch_size] {
            return Err(ModelError::ShapeMismatch {
                what: format!("clip coefficients for {param}"),
                expected: vec![self.batch_size],
                got: coeffs.size(),
            });
        }
        Ok(coeffs
            .f_to_kind(compute_kind(self.kind))?
            .f_to(self.device)?)
    }

    /// [`Self::part_sum`] in the compute dtype (bf16/f16 sites widened to f32), with the
    /// non-finite entries of records of coefficient 0 zeroed when `sanitize`; the result in the
    /// model's dtype.
    fn part_sum_safe(&self, s: &GradSite, p: &Part, c: &Tensor, sanitize: bool) -> Result<Tensor> {
        let ck = compute_kind(self.kind);
        let c = c.f_to_kind(ck)?;
        let out = match s.prepared(ck, sanitize)? {
            None => self.part_sum(s, p, &c)?,
            Some(site) => {
                let k = s
                    .parts
                    .iter()
                    .position(|q| std::ptr::eq(q, p))
                    .ok_or_else(|| ModelError::UnknownParameter {
                        param: p.param().to_string(),
                    })?;
                self.part_sum(&site, &site.parts[k], &c)?
            }
        };
        Ok(out.f_to_kind(self.kind)?)
    }

    /// `Σ_b coeffs[b] · G_b` for parameter `param` (`coeffs` `[B]`), in the parameter's shape.
    /// With a one-hot `coeffs` this is one record's gradient.
    pub fn weighted_sum(&self, param: &str, coeffs: &Tensor) -> Result<Tensor> {
        self.weighted_sum_with(param, coeffs, false)
    }

    /// [`Self::weighted_sum`]; `sanitize` zeroes non-finite entries first (set when some record
    /// has coefficient 0 because its gradient is not finite).
    fn weighted_sum_with(&self, param: &str, coeffs: &Tensor, sanitize: bool) -> Result<Tensor> {
        let uses = self.uses_of(param)?;
        let c = self.check_coeffs(param, coeffs)?;
        let mut acc: Option<Tensor> = None;
        for &u in uses {
            let (s, p) = self.part(u);
            let term = self.part_sum_safe(s, p, &c, sanitize)?;
            acc = Some(match acc {
                Some(x) => x.f_add(&term)?,
                None => term,
            });
        }
        acc.ok_or_else(|| ModelError::UnknownParameter {
            param: param.into(),
        })
    }

    /// Norms by group, clip factors and the per-parameter coefficients `factor · weight`.
    #[allow(clippy::type_complexity)]
    fn clip_coeffs(
        &self,
        groups: &ParamGroups,
        policy: &ClipPolicy,
        weights: &BTreeMap<String, Tensor>,
    ) -> Result<(
        BTreeMap<String, Tensor>,
        BTreeMap<String, Tensor>,
        BTreeMap<String, Tensor>,
        bool,
    )> {
        let b = self.batch_size;
        let dev = self.device;
        let check_bound = |bound: f64| -> Result<()> {
            if bound.is_finite() && bound > 0.0 {
                Ok(())
            } else {
                Err(ModelError::InvalidClip(format!(
                    "bound {bound} must be finite and > 0"
                )))
            }
        };
        // The policy is checked whole, before any norm: every bound it holds, and (per group)
        // a bound for every group of `groups`, whether or not this batch reaches the group (a
        // routed expert no record chose is absent from the pass; an error that appeared only
        // when a record reaches it would depend on private data).
        match policy {
            ClipPolicy::RoleWise(bounds) => {
                for &c in bounds.values() {
                    check_bound(c)?;
                }
                if let Some((_, g)) = groups.iter().find(|(_, g)| !bounds.contains_key(*g)) {
                    return Err(ModelError::InvalidClip(format!(
                        "no clipping bound for group {g}"
                    )));
                }
            }
            ClipPolicy::Global(c) => check_bound(*c)?,
        }
        let mut group_sq: BTreeMap<String, Tensor> = BTreeMap::new();
        let mut members: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for p in self.uses.keys() {
            let g = groups
                .group_of(p)
                .ok_or_else(|| ModelError::UngroupedParameter { param: p.clone() })?;
            members.entry(g.to_string()).or_default().push(p.clone());
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
                    group_sq.insert(g.to_string(), n);
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
        let mut w: BTreeMap<String, Tensor> = BTreeMap::new();
        for (g, wt) in weights {
            // (A group of `groups` that this batch does not reach is fine: its weights are
            // checked and then unused. Whether a routed expert is reached depends on the data.)
            if !groups.iter().any(|(_, x)| x == g.as_str()) {
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
        let mut weighted_sq: BTreeMap<String, Tensor> = BTreeMap::new();
        for (g, sq) in &group_sq {
            let v = match w.get(g) {
                Some(wt) => sq.f_mul(&wt.f_square()?)?,
                None => sq.shallow_clone(),
            };
            weighted_sq.insert(g.clone(), v);
        }
        let mut factors: BTreeMap<String, Tensor> = BTreeMap::new();
        let mut coeffs: BTreeMap<String, Tensor> = BTreeMap::new();
        match policy {
            ClipPolicy::RoleWise(bounds) => {
                for (g, sq) in &group_sq {
                    let c = *bounds.get(g).ok_or_else(|| {
                        ModelError::InvalidClip(format!("no clipping bound for group {g}"))
                    })?;
                    factors.insert(
                        g.clone(),
                        drop_bad(clip_coefficients(&weighted_sq[g], c, None)?)?,
                    );
                    // raptor-clip's weight-then-clip coefficients w_b·min(1, C/(w_b‖g_b‖)),
                    // in f32/f64 (never rounded to a bf16/f16 model dtype).
                    let coeff = drop_bad(clip_coefficients(sq, c, w.get(g))?)?;
                    coeffs.insert(g.clone(), coeff);
                }
            }
            ClipPolicy::Global(c) => {
                let mut tot = Tensor::f_zeros([b], (ck, dev))?;
                for sq in weighted_sq.values() {
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
            for p in ps {
                param_coeffs.insert(p.clone(), coeffs[g].shallow_clone());
            }
        }
        let group_sq = weighted_sq;
        Ok((group_sq, factors, param_coeffs, any_bad))
    }

    /// Clips per record by group and returns the clipped, weighted sums of all parameters.
    ///
    /// `groups` maps every parameter to a caller-named group (an unassigned parameter is an
    /// error); `weights` optionally gives per-record weights `[B]` in `[0, 1]` per group,
    /// applied to the record's gradient before clipping (RAPTOR's residual weights).
    /// Keeps `self` (see [`Self::into_clip`] for the memory-frugal form).
    pub fn clip(
        &self,
        groups: &ParamGroups,
        policy: &ClipPolicy,
        weights: &BTreeMap<String, Tensor>,
    ) -> Result<ClipOutput> {
        self.start_cache();
        let out = self.clip_with_cache(groups, policy, weights);
        let served = self.end_cache();
        out.map(|mut o| {
            o.from_cache = served;
            o
        })
    }

    /// [`Self::clip`]'s work, with the materialized-gradient cache on.
    fn clip_with_cache(
        &self,
        groups: &ParamGroups,
        policy: &ClipPolicy,
        weights: &BTreeMap<String, Tensor>,
    ) -> Result<ClipOutput> {
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
    pub fn into_clip(
        mut self,
        groups: &ParamGroups,
        policy: &ClipPolicy,
        weights: &BTreeMap<String, Tensor>,
    ) -> Result<ClipOutput> {
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
    /// Parameters whose sum was taken from per-record gradients the norm pass materialized
    /// and kept (one `[1, B] × [B, out·in]` product instead of a contraction over every token
    /// row): a speed diagnostic; the sums are the same either way.
    pub from_cache: BTreeSet<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(g: Tensor, offsets: Option<Vec<i64>>) -> GradSite {
        GradSite {
            rows: Rows::Dense,
            parts: vec![],
            g,
            offsets,
        }
    }

    /// Tokens per record (which sizes the record chunks of the norm pass, so bounds its
    /// temporaries): T of a dense `[B, T, out]` gradient, 1 for `[B, out]`, the largest
    /// record's row count of a routed site (at least 1).
    #[test]
    fn tokens_per_record_of_dense_and_routed_sites() -> Result<()> {
        let z = |sz: &[i64]| Tensor::f_zeros(sz, (Kind::Float, tch::Device::Cpu));
        assert_eq!(site(z(&[3, 5, 7])?, None).tokens(), 5);
        assert_eq!(site(z(&[4, 6, 2, 7])?, None).tokens(), 12);
        assert_eq!(site(z(&[3, 7])?, None).tokens(), 1);
        assert_eq!(site(z(&[0, 5, 7])?, None).tokens(), 1);
        assert_eq!(site(z(&[3, 5, 7])?, None).out_dim(), 7);
        // routed: records own rows 0..2, 2..2 (none), 2..6
        let routed = site(z(&[6, 7])?, Some(vec![0, 2, 2, 6]));
        assert_eq!(routed.tokens(), 4);
        assert_eq!(site(z(&[0, 7])?, Some(vec![0, 0, 0])).tokens(), 1);
        assert_eq!(site(z(&[0, 7])?, Some(vec![0])).tokens(), 1);
        Ok(())
    }

    /// `chunk` of a routed site: each record's rows zero-padded to the chunk's largest count,
    /// the same from the CPU copy (f32, f64) and from libtorch's generic path (other dtypes,
    /// and every dtype off the CPU), for chunks that start past record 0 and empty ones.
    #[test]
    fn routed_chunks_are_padded_alike_on_both_paths() -> Result<()> {
        // records own rows 0..2, 2..2 (none), 2..5, 5..6 of a [6, 2] row block
        let offsets = vec![0i64, 2, 2, 5, 6];
        let vals: Vec<f32> = (1..=12).map(|v| v as f32).collect();
        let x32 = Tensor::from_slice(&vals).reshape([6, 2]);
        let s = site(x32.shallow_clone(), Some(offsets));
        // the expected padded values, by hand: (r0, n) -> [n, tmax, 2]
        let want = |r0: i64, n: i64| -> Vec<f32> {
            let rows: [&[f32]; 4] = [&vals[0..4], &[], &vals[4..10], &vals[10..12]];
            let tmax = (r0..r0 + n)
                .map(|r| rows[r as usize].len() / 2)
                .max()
                .unwrap_or(1)
                .max(1);
            let mut v = Vec::new();
            for r in r0..r0 + n {
                let row = rows[r as usize];
                v.extend_from_slice(row);
                v.extend(std::iter::repeat_n(0.0, 2 * tmax - row.len()));
            }
            v
        };
        for (r0, n) in [(0i64, 4i64), (1, 3), (2, 2), (1, 1), (3, 1), (0, 2)] {
            for kind in [Kind::Float, Kind::Double, Kind::Half, Kind::BFloat16] {
                let x = x32.f_to_kind(kind)?;
                let got = s.chunk(&x, r0, n)?;
                assert_eq!(got.kind(), kind);
                let sz = got.size();
                assert_eq!((sz[0], sz[2]), (n, 2), "{kind:?} {r0} {n}");
                let got: Vec<f32> = Vec::try_from(got.f_to_kind(Kind::Float)?.f_flatten(0, -1)?)?;
                assert_eq!(got, want(r0, n), "{kind:?} records {r0}..{}", r0 + n);
            }
        }
        Ok(())
    }

    /// `routed_sq_norms` takes a routed site only in its fast form (f32 engine, 2-D f32 CPU
    /// rows and gradients) and declines (`None`: the generic path runs) anything else, each
    /// condition on its own; where it runs, its norms are those of the per-record loop, for a
    /// chunk from record 0 and one further in, and it materializes (keeping the gradients in
    /// the cache) exactly when `ragged_cost` says that is less work and the cache admits them.
    #[test]
    fn routed_norms_take_the_fast_form_only_and_choose_by_cost() -> Result<()> {
        let f = Kind::Float;
        // records own rows 0..1, none, 1..3, 3..4 (wide: ghost) or 0..9, none, 9..20, 20..30
        // (narrow: materialize)
        let (w_off, n_off) = ([0i64, 1, 1, 3, 4], [0i64, 9, 9, 20, 30]);
        let (wa, wg) = (randn(&[4, 40], f), randn(&[4, 48], f));
        let (na, ng) = (randn(&[30, 3], f), randn(&[30, 2], f));
        let wide = routed_site(&w_off, &wa, &wg, "wide");
        let narrow = routed_site(&n_off, &na, &ng, "narrow");
        // "mid": 5 rows for three of four records of a 4 → 4 weight, a ghost case that counting
        // rows from the offsets themselves (rather than their differences) would turn into a
        // materializing one.
        let m_off = [0i64, 5, 5, 10, 15];
        let (ma, mg) = (randn(&[15, 4], f), randn(&[15, 4], f));
        let mid = routed_site(&m_off, &ma, &mg, "mid");
        let (g_true, m_true) = ragged_cost(&[5, 0, 5, 5], 4, 4);
        let (g_cum, m_cum) = ragged_cost(&[5, 10, 15, 25], 4, 4);
        assert!(
            g_true < m_true && m_cum < g_cum,
            "precondition: mid sits between the two"
        );
        let a_of = |s: &GradSite| match &s.parts[0] {
            Part::Weight { a, .. } => a.shallow_clone(),
            _ => Tensor::new(),
        };
        // ‖Σ_{rows of r} g aᵀ‖² per record in f64, records r0..r0+n.
        let slow = |s: &GradSite, r0: usize, n: usize| -> Result<Vec<f64>> {
            let off = s.offsets.clone().unwrap_or_default();
            per_record_grads(&a_of(s), &s.g, &off)?[r0..r0 + n]
                .iter()
                .map(|t| Ok(t.f_square()?.f_sum(Kind::Double)?.f_double_value(&[])?))
                .collect()
        };
        let cached = |e: &PerSampleGrads, p: &str| {
            e.cache
                .borrow()
                .as_ref()
                .is_some_and(|c| c.grads.contains_key(p))
        };
        let e = engine(
            4,
            vec![
                routed_site(&w_off, &wa, &wg, "wide"),
                routed_site(&n_off, &na, &ng, "narrow"),
                routed_site(&m_off, &ma, &mg, "mid"),
            ],
            1 << 20,
        );
        e.start_cache();
        for (s, p, materialized) in [
            (&wide, "wide", false),
            (&narrow, "narrow", true),
            (&mid, "mid", false),
        ] {
            for (r0, n) in [(0usize, 4usize), (2, 2)] {
                let got = e
                    .routed_sq_norms(p, s, &a_of(s), r0 as i64, n as i64)?
                    .ok_or_else(|| ModelError::InvalidConfig(format!("{p}: declined")))?;
                let got: Vec<f64> = Vec::try_from(got.f_to_kind(Kind::Double)?)?;
                let want = slow(s, r0, n)?;
                assert_eq!(got.len(), n);
                for (x, y) in got.iter().zip(&want) {
                    assert!(
                        (x - y).abs() <= 1e-4 * y.abs().max(1.0),
                        "{p} {r0}+{n}: {got:?} vs {want:?}"
                    );
                }
            }
            assert_eq!(cached(&e, p), materialized, "{p}");
        }
        // Without a cache, or without room for the chunk's 4·3·2 = 24 gradient entries,
        // nothing is materialized: the ghost kernel runs.
        e.end_cache();
        let n0 = e.routed_sq_norms("narrow", &narrow, &a_of(&narrow), 0, 4)?;
        assert!(n0.is_some() && !cached(&e, "narrow"));
        for (room, fits) in [(23i64, false), (24, true)] {
            let e = engine(4, vec![routed_site(&n_off, &na, &ng, "narrow")], 1 << 20).with_limits(
                EngineLimits {
                    chunk_elems: 1 << 20,
                    cache_elems: Some(room),
                },
            )?;
            e.start_cache();
            assert!(e.routed_sq_norms("narrow", &narrow, &na, 0, 4)?.is_some());
            assert_eq!(cached(&e, "narrow"), fits, "cache room {room}");
        }
        // Declined, one condition at a time.
        let none = |e: &PerSampleGrads, s: &GradSite, a: &Tensor| -> Result<bool> {
            Ok(e.routed_sq_norms("wide", s, a, 0, 4)?.is_none())
        };
        let mut e64 = engine(4, vec![routed_site(&w_off, &wa, &wg, "wide")], 1 << 20);
        e64.kind = Kind::Double;
        assert!(none(&e64, &wide, &wa)?, "an f64 engine");
        assert!(none(&e, &wide, &wa.f_to_kind(Kind::Double)?)?, "f64 rows");
        let g64 = routed_site(&w_off, &wa, &wg.f_to_kind(Kind::Double)?, "wide");
        assert!(none(&e, &g64, &wa)?, "f64 output gradients");
        assert!(none(&e, &wide, &wa.f_unsqueeze(1)?)?, "3-D rows");
        let g3 = routed_site(&w_off, &wa, &wg.f_unsqueeze(1)?, "wide");
        assert!(none(&e, &g3, &wa)?, "3-D output gradients");
        let mut dense_site = routed_site(&w_off, &wa, &wg, "wide");
        dense_site.offsets = None;
        assert!(none(&e, &dense_site, &wa)?, "a dense site");
        Ok(())
    }

    /// The clipping policy is checked whole, whatever the batch reaches: a group whose
    /// parameters got no gradient in this pass (a routed expert no record chose; here a
    /// parameter that is never used) still needs a finite positive bound, and record weights
    /// for it are checked and then unused; weights for a group no parameter belongs to are an
    /// error. (Before, these checks ran only for the groups the batch reached, so whether a bad
    /// bound was noticed depended on the records' routing.)
    #[test]
    fn the_policy_is_checked_whole_whatever_the_batch_reaches() -> Result<()> {
        let f = Kind::Float;
        let b = 3i64;
        let e = {
            engine(
                b,
                vec![dense(
                    randn(&[b, 2, 4], f),
                    vec![weight("w", &randn(&[b, 2, 5], f))],
                )],
                1 << 20,
            )
        };
        let mut groups = ParamGroups::new();
        groups.assign("w", "used");
        groups.assign("never.used", "absent");
        let role = |absent: Option<f64>| {
            let mut m = BTreeMap::from([("used".to_string(), 1.0)]);
            if let Some(c) = absent {
                m.insert("absent".to_string(), c);
            }
            ClipPolicy::RoleWise(m)
        };
        let none = BTreeMap::new();
        let msg = |r: Result<ClipOutput>| match r {
            Err(ModelError::InvalidClip(m)) => m,
            other => format!("not an InvalidClip error: {other:?}"),
        };
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let m = msg(e.clip(&groups, &role(Some(bad)), &none));
            assert!(m.contains("must be finite and > 0"), "bound {bad}: {m}");
        }
        let m = msg(e.clip(&groups, &role(None), &none));
        assert_eq!(m, "no clipping bound for group absent");
        let out = e.clip(&groups, &role(Some(2.0)), &none)?;
        assert_eq!(out.group_sq_norms.keys().collect::<Vec<_>>(), ["used"]);
        // Weights of the unreached group: checked ([0, 1]) and unused.
        let half = BTreeMap::from([("absent".to_string(), Tensor::from_slice(&[0.5f32; 3]))]);
        let with = e.clip(&groups, &role(Some(2.0)), &half)?;
        let without: Vec<f64> = Vec::try_from(&out.group_sq_norms["used"])?;
        let got: Vec<f64> = Vec::try_from(&with.group_sq_norms["used"])?;
        assert_eq!(got, without);
        let over = BTreeMap::from([(
            "absent".to_string(),
            Tensor::from_slice(&[0.5f32, 2.0, 0.5]),
        )]);
        let m = msg(e.clip(&groups, &role(Some(2.0)), &over));
        assert!(m.contains("record 1") && m.contains("absent"), "{m}");
        let stray = BTreeMap::from([("nobody".to_string(), Tensor::from_slice(&[0.5f32; 3]))]);
        let m = msg(e.clip(&groups, &role(Some(2.0)), &stray));
        assert!(
            m.contains("nobody") && m.contains("no parameter belongs to"),
            "{m}"
        );
        Ok(())
    }

    /// The cache's budget: a parameter whose next chunk does not fit is dropped whole (its
    /// kept chunks freed, its later chunks refused), and the room it freed serves the others
    /// up to the budget exactly.
    #[test]
    fn the_cache_frees_a_dropped_parameter_for_the_others() -> Result<()> {
        let f = Kind::Float;
        let sites = vec![dense(
            randn(&[2, 1, 1], f),
            vec![weight("w", &randn(&[2, 1, 1], f))],
        )];
        let e = engine(2, sites, 1 << 20).with_limits(EngineLimits {
            chunk_elems: 1 << 20,
            cache_elems: Some(30),
        })?;
        let zeros = |n: i64| Tensor::zeros([n], (f, tch::Device::Cpu));
        assert!(!e.cache_admits("a", 1), "no cache before start_cache");
        e.start_cache();
        assert!(e.cache_admits("a", 24));
        e.cache_keep("a", zeros(24));
        assert!(!e.cache_admits("a", 24), "48 > 30: a is dropped");
        assert!(!e.cache_admits("a", 1), "and stays dropped");
        assert!(e.cache_admits("b", 30), "a's 24 were freed");
        e.cache_keep("b", zeros(30));
        assert!(!e.cache_admits("c", 1), "the budget is spent");
        Ok(())
    }

    /// The engine's accessors report what it was built with: the batch size, the parameters
    /// that received gradient (sorted, each once) and the memory limits, before and after
    /// `with_limits`. `with_cpu_slice` lends only a CPU tensor of the asked element type.
    #[test]
    fn accessors_report_the_batch_parameters_and_limits() -> Result<()> {
        let f = Kind::Float;
        let sites = vec![
            dense(
                randn(&[3, 2, 4], f),
                vec![weight("w2", &randn(&[3, 2, 5], f))],
            ),
            dense(
                randn(&[3, 2, 4], f),
                vec![
                    weight("w1", &randn(&[3, 2, 4], f)),
                    Part::Bias { param: "b".into() },
                ],
            ),
            dense(
                randn(&[3, 1, 5], f),
                vec![weight("w2", &randn(&[3, 1, 4], f))],
            ),
        ];
        let e = engine(3, sites, 1000);
        assert_eq!(e.batch_size(), 3);
        assert_eq!(e.params(), vec!["b", "w1", "w2"]);
        assert_eq!(e.limits().chunk_elems, 1000);
        assert_eq!(e.limits().cache_elems, None);
        let e = e.with_limits(EngineLimits {
            chunk_elems: 17,
            cache_elems: Some(5),
        })?;
        assert_eq!(
            (e.limits().chunk_elems, e.limits().cache_elems),
            (17, Some(5))
        );
        let v = Tensor::from_slice(&[1.0f32, 2.0, 3.0]);
        assert_eq!(
            with_cpu_slice(&v, |s: &[f32]| s.to_vec())?,
            vec![1.0, 2.0, 3.0]
        );
        assert!(with_cpu_slice(&v.f_to_kind(Kind::Double)?, |s: &[f32]| s.len()).is_err());
        assert_eq!(
            with_cpu_slice(&v.f_to_kind(Kind::Double)?, |s: &[f64]| s.len())?,
            3
        );
        Ok(())
    }

    /// `pad_rows` checks its layout before it writes into a fresh tensor: row counts that do
    /// not add up to the rows asked for, rows outside `x`, negative or too large counts, a
    /// negative width or an `x` that is not `[rows, d]` are errors, each on its own (every
    /// other argument valid), with the message of its check; zero-width rows are a valid
    /// (empty) layout.
    #[test]
    fn pad_rows_checks_each_condition_of_its_layout() -> Result<()> {
        let x = Tensor::from_slice(&(0..18).map(|v| v as f32).collect::<Vec<_>>()).reshape([6, 3]);
        let ok = pad_rows::<f32>(&x, 1, 5, &[1, 3], 3, 3)?;
        assert_eq!(ok.size(), [2, 3, 3]);
        let got: Vec<f32> = Vec::try_from(ok.f_flatten(0, -1)?)?;
        let mut want = vec![3.0, 4.0, 5.0];
        want.extend([0.0; 6]);
        want.extend((6..15).map(|v| v as f32));
        assert_eq!(got, want);
        let empty = Tensor::zeros([6, 0], (Kind::Float, tch::Device::Cpu));
        assert_eq!(
            pad_rows::<f32>(&empty, 1, 5, &[1, 3], 3, 0)?.size(),
            [2, 3, 0]
        );
        let counts_msg = "routed row counts do not match the rows";
        let layout_msg = "routed rows do not fit the padded layout";
        let cube = x.reshape([6, 3, 1]);
        // (x, lo, hi, counts, tmax, d, the message)
        type Case<'a> = (&'a Tensor, i64, i64, &'a [i64], i64, i64, &'a str);
        let cases: [Case<'_>; 8] = [
            (&x, 1, 5, &[1, 2], 3, 3, counts_msg), // counts sum to 3, not 4
            (&x, -1, 3, &[1, 3], 3, 3, counts_msg), // starts before row 0
            (&x, 3, 2, &[-1], 3, 3, counts_msg),   // ends before it starts
            (&x, 3, 8, &[2, 3], 3, 3, counts_msg), // past the 6 rows of x
            (&x, 1, 5, &[-1, 5], 5, 3, layout_msg), // a negative count
            (&x, 1, 5, &[1, 3], 2, 3, layout_msg), // a count above tmax
            (&x, 1, 5, &[1, 3], 3, -1, layout_msg), // a negative width
            (&cube, 1, 5, &[1, 3], 3, 3, layout_msg), // x is not [rows, d]
        ];
        for (i, (x, lo, hi, counts, tmax, d, msg)) in cases.into_iter().enumerate() {
            match pad_rows::<f32>(x, lo, hi, counts, tmax, d) {
                Err(ModelError::InvalidConfig(m)) => assert!(m.ends_with(msg), "case {i}: {m}"),
                other => panic!("case {i}: expected an error, got {other:?}"),
            }
        }
        Ok(())
    }

    /// Coefficients and contractions in f64 for f64 models, f32 for every other dtype (never
    /// a half-precision coefficient that could round up past the bound).
    #[test]
    fn compute_kind_is_f64_for_f64_and_f32_otherwise() {
        assert_eq!(compute_kind(Kind::Double), Kind::Double);
        for k in [Kind::Float, Kind::Half, Kind::BFloat16] {
            assert_eq!(compute_kind(k), Kind::Float, "{k:?}");
        }
    }

    /// `prep` converts floating tensors to the compute dtype, leaves integer ones alone, and
    /// zeroes non-finite entries only when asked.
    #[test]
    fn prep_converts_floats_only_and_sanitizes_on_request() -> Result<()> {
        let x = Tensor::from_slice(&[1.5f32, f32::NAN, f32::INFINITY]);
        let p = prep(&x, Kind::Double, true)?;
        assert_eq!(p.kind(), Kind::Double);
        assert_eq!(Vec::<f64>::try_from(&p)?, vec![1.5, 0.0, 0.0]);
        let kept = prep(&x, Kind::Float, false)?;
        assert_eq!(kept.f_isnan()?.f_sum(Kind::Int64)?.int64_value(&[]), 1);
        let ids = Tensor::from_slice(&[3i64, 4]);
        let p = prep(&ids, Kind::Float, true)?;
        assert_eq!(p.kind(), Kind::Int64);
        assert_eq!(Vec::<i64>::try_from(&p)?, vec![3, 4]);
        Ok(())
    }

    /// An engine built by hand from sites (parameter uses in site order), B records.
    fn engine(b: i64, sites: Vec<GradSite>, chunk_elems: i64) -> PerSampleGrads {
        let mut uses: BTreeMap<String, Vec<(usize, usize)>> = BTreeMap::new();
        for (i, s) in sites.iter().enumerate() {
            for (j, p) in s.parts.iter().enumerate() {
                uses.entry(p.param().to_string()).or_default().push((i, j));
            }
        }
        PerSampleGrads {
            batch_size: b,
            kind: Kind::Float,
            device: tch::Device::Cpu,
            sites,
            uses,
            cache: RefCell::new(None),
            limits: EngineLimits {
                chunk_elems,
                cache_elems: None,
            },
        }
    }

    /// A routed site of one weight `param` with input rows `a` and output gradient rows `g`,
    /// record r owning rows `off[r]..off[r + 1]`.
    fn routed_site(off: &[i64], a: &Tensor, g: &Tensor, param: &str) -> GradSite {
        let rec: Vec<i64> = off
            .windows(2)
            .enumerate()
            .flat_map(|(r, w)| std::iter::repeat_n(r as i64, (w[1] - w[0]) as usize))
            .collect();
        GradSite {
            rows: Rows::Routed {
                rec: Tensor::from_slice(&rec),
            },
            parts: vec![weight(param, a)],
            g: g.shallow_clone(),
            offsets: Some(off.to_vec()),
        }
    }

    /// The per-record loop in f64: `G_r = Σ_{rows of r} g aᵀ` for each record of `off`.
    fn per_record_grads(a: &Tensor, g: &Tensor, off: &[i64]) -> Result<Vec<Tensor>> {
        let (a, g) = (a.f_to_kind(Kind::Double)?, g.f_to_kind(Kind::Double)?);
        off.windows(2)
            .map(|w| {
                let (ar, gr) = (
                    a.f_narrow(0, w[0], w[1] - w[0])?,
                    g.f_narrow(0, w[0], w[1] - w[0])?,
                );
                Ok(gr.f_transpose(0, 1)?.f_matmul(&ar)?)
            })
            .collect()
    }

    fn dense(g: Tensor, parts: Vec<Part>) -> GradSite {
        GradSite {
            rows: Rows::Dense,
            parts,
            g,
            offsets: None,
        }
    }

    fn weight(param: &str, a: &Tensor) -> Part {
        Part::Weight {
            param: param.into(),
            a: a.shallow_clone(),
        }
    }

    /// Draws under the process-wide generator lock: unlocked draws would land inside another
    /// test's seeded section (`rng::tests` checks that sections are not interleaved).
    fn randn(sz: &[i64], kind: Kind) -> Tensor {
        let _rng = crate::rng::global_rng();
        Tensor::randn(sz, (kind, tch::Device::Cpu))
    }

    /// The chunk memory model, written out per parameter kind: a record's temporaries are
    /// three T×T Grams (3T²), plus its padded rows T·(in+out) on a routed site, plus its
    /// materialized `in·out` gradient where that is smaller than its rows; the T5 bucket table
    /// two copies of a record's `H·Tq·Tk` gradient. A chunk holds ⌊chunk_elems / cost⌋ records
    /// of the most expensive use, at least 1 and at most B.
    #[test]
    fn records_per_chunk_follow_the_memory_model() -> Result<()> {
        let b = 7i64;
        let f = Kind::Float;
        // dense weight, T 4, in 3, out 5: 3·16 + 15 (15 < 4·8) = 63
        let a1 = randn(&[b, 4, 3], f);
        // dense weight, T 2, in 8, out 8: 3·4 = 12 (64 ≥ 2·16: nothing materialized)
        let a2 = randn(&[b, 2, 8], f);
        // routed weight, largest record 3 rows, in 2, out 4: 27 + 3·6 + 8 = 53
        let off = vec![0i64, 1, 4, 4, 6, 7, 7, 9];
        let rec: Vec<i64> = (0..b)
            .flat_map(|r| std::iter::repeat_n(r, (off[r as usize + 1] - off[r as usize]) as usize))
            .collect();
        let a3 = randn(&[9, 2], f);
        let g3 = randn(&[9, 4], f);
        let (gw1, gw2, grel) = (
            randn(&[b, 4, 5], f),
            randn(&[b, 2, 8], f),
            randn(&[b, 2, 3, 3], f),
        );
        let (gw2b, aw2b) = (randn(&[b, 3, 2], f), randn(&[b, 3, 8], f));
        let (gtie, atie) = (randn(&[b, 2, 4], f), randn(&[b, 2, 4], f));
        // bias on [B, 4, 5]: in = out = 5: 48 + 25 (25 < 4·10) = 73
        // buckets on [B, 2, 3, 3]: 2·18 = 36
        // a second use of w2 on a site of T 3 (in 8, out 2): 27 + 16 (16 < 3·10) = 43
        let mk = || {
            vec![
                dense(
                    gw1.shallow_clone(),
                    vec![
                        weight("w1", &a1),
                        Part::Bias {
                            param: "bias".into(),
                        },
                    ],
                ),
                dense(gw2.shallow_clone(), vec![weight("w2", &a2)]),
                GradSite {
                    rows: Rows::Routed {
                        rec: Tensor::from_slice(&rec),
                    },
                    parts: vec![weight("routed", &a3)],
                    g: g3.shallow_clone(),
                    offsets: Some(off.clone()),
                },
                dense(
                    grel.shallow_clone(),
                    vec![Part::Buckets {
                        param: "rel".into(),
                        buckets: Tensor::zeros([3, 3], (Kind::Int64, tch::Device::Cpu)),
                        num_buckets: 4,
                    }],
                ),
                dense(gw2b.shallow_clone(), vec![weight("w2", &aw2b)]),
                // T 2, in 4, out 4: the gradient (16) is as large as the rows (2·8): not
                // counted, 3·4 = 12
                dense(gtie.shallow_clone(), vec![weight("tie", &atie)]),
            ]
        };
        let cost = [
            ("w1", 63i64),
            ("w2", 43),
            ("routed", 53),
            ("bias", 73),
            ("rel", 36),
            ("tie", 12),
        ];
        for chunk_elems in [
            1i64, 12, 35, 36, 62, 63, 64, 106, 125, 126, 159, 200, 300, 440, 441, 10_000,
        ] {
            let e = engine(b, mk(), chunk_elems);
            for (p, c) in cost {
                let want = (chunk_elems / c).clamp(1, b);
                assert_eq!(
                    e.chunk_records(e.uses_of(p)?),
                    want,
                    "{p} at chunk_elems {chunk_elems}"
                );
            }
        }
        // an empty batch still has chunks of one record
        let e = engine(
            0,
            vec![dense(
                randn(&[0, 4, 5], f),
                vec![weight("w", &randn(&[0, 4, 3], f))],
            )],
            1 << 20,
        );
        assert_eq!(e.chunk_records(e.uses_of("w")?), 1);
        Ok(())
    }

    /// Per-record squared norm of `Σ_t g_t a_tᵀ`, one record at a time, in f64.
    fn slow_sq_norms(a: &Tensor, g: &Tensor) -> Result<Vec<f64>> {
        let (a, g) = (a.f_to_kind(Kind::Double)?, g.f_to_kind(Kind::Double)?);
        (0..a.size()[0])
            .map(|r| {
                let gr = g.f_get(r)?.f_transpose(0, 1)?.f_matmul(&a.f_get(r)?)?;
                Ok(gr.f_square()?.f_sum(Kind::Double)?.f_double_value(&[])?)
            })
            .collect()
    }

    /// Linear weights reading one same activation (q, k, v) get their norms from one shared
    /// activation Gram per chunk, equal to each weight's own per-record norm; weights that
    /// read another activation, are used twice, sit on routed rows or are cheaper to
    /// materialize are left to the per-parameter pass. Every chunk size gives the same norms,
    /// in f64 for an f64 activation.
    #[test]
    fn weights_sharing_an_input_share_its_gram() -> Result<()> {
        let b = 5i64;
        for kind in [Kind::Float, Kind::Double] {
            // T 2, in 6, out 6: ghost (2·2·12 = 48) is cheaper than materializing (2·36 = 72)
            let x = randn(&[b, 2, 6], kind);
            let other = randn(&[b, 2, 6], kind);
            // T 4, in 2, out 2: materializing (16) is cheaper than ghost (64)
            let small = randn(&[b, 4, 2], kind);
            let gs: Vec<Tensor> = (0..6).map(|_| randn(&[b, 2, 6], kind)).collect();
            let gsmall = randn(&[b, 4, 2], kind);
            let gneg = gsmall.f_neg()?;
            // T 3, in 6, out 6: materializing and ghost cost the same (3·36 = 9·12): ghost, as
            // in the per-parameter pass
            let tie = randn(&[b, 3, 6], kind);
            let (gt1, gt2) = (randn(&[b, 3, 6], kind), randn(&[b, 3, 6], kind));
            // two routed sites reading one row block (records own rows 0..2, 2..3, 3..3, 3..6, 6..6)
            let off = vec![0i64, 2, 3, 3, 6, 6];
            let rec = Tensor::from_slice(&[0i64, 0, 1, 3, 3, 3]);
            let xr = randn(&[6, 6], kind);
            let (gr1, gr2) = (randn(&[6, 6], kind), randn(&[6, 6], kind));
            let routed = |g: &Tensor, p: &str| GradSite {
                rows: Rows::Routed {
                    rec: rec.shallow_clone(),
                },
                parts: vec![weight(p, &xr)],
                g: g.shallow_clone(),
                offsets: Some(off.clone()),
            };
            let mk = || {
                vec![
                    dense(gs[0].shallow_clone(), vec![weight("q", &x)]),
                    dense(gs[1].shallow_clone(), vec![weight("k", &x)]),
                    dense(gs[2].shallow_clone(), vec![weight("v", &x)]),
                    dense(gs[3].shallow_clone(), vec![weight("o", &other)]),
                    dense(gs[4].shallow_clone(), vec![weight("twice", &x)]),
                    dense(gs[5].shallow_clone(), vec![weight("twice", &x)]),
                    dense(gsmall.shallow_clone(), vec![weight("s1", &small)]),
                    dense(gneg.shallow_clone(), vec![weight("s2", &small)]),
                    routed(&gr1, "r1"),
                    routed(&gr2, "r2"),
                    dense(gt1.shallow_clone(), vec![weight("t1", &tie)]),
                    dense(gt2.shallow_clone(), vec![weight("t2", &tie)]),
                ]
            };
            for chunk_elems in [1i64, 40, 100, 1 << 20] {
                let e = engine(b, mk(), chunk_elems);
                let shared = e.shared_input_norms()?;
                assert_eq!(
                    shared.keys().map(String::as_str).collect::<Vec<_>>(),
                    vec!["k", "q", "t1", "t2", "v"],
                    "{kind:?} chunk_elems {chunk_elems}"
                );
                for (p, a, g) in [
                    ("q", &x, &gs[0]),
                    ("k", &x, &gs[1]),
                    ("v", &x, &gs[2]),
                    ("t1", &tie, &gt1),
                    ("t2", &tie, &gt2),
                ] {
                    let got = &shared[p];
                    assert_eq!(got.kind(), kind, "{p}");
                    assert_eq!(got.size(), vec![b], "{p}");
                    let got: Vec<f64> = Vec::try_from(got.f_to_kind(Kind::Double)?)?;
                    let want = slow_sq_norms(a, g)?;
                    for (r, (u, v)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (u - v).abs() <= 1e-4 * v.max(1.0),
                            "{p} record {r}: {u} vs {v}"
                        );
                    }
                    // and the same as the parameter's own pass
                    let own: Vec<f64> = Vec::try_from(e.sq_norms(p)?.f_to_kind(Kind::Double)?)?;
                    for (u, v) in got.iter().zip(&own) {
                        assert!((u - v).abs() <= 1e-4 * v.max(1.0), "{p}: {u} vs {v}");
                    }
                }
            }
        }
        Ok(())
    }

    /// Parameters with several uses of other kinds than attention's linear weights: a bias
    /// added at two sites (its per-record gradient is the sum of both sites' row sums, so it
    /// takes the factored path), and a table used as a linear weight first and as an
    /// embedding after (a tied head recorded before its embedding: the cross term of a dense
    /// and a one-hot factor). Norms against per-record gradients built by hand in f64, under
    /// several chunk sizes.
    #[test]
    fn norms_of_multi_use_biases_and_tied_tables_match_a_slow_reference() -> Result<()> {
        let (b, d, v) = (4i64, 3i64, 5i64);
        let f = Kind::Double;
        let g1 = randn(&[b, 2, d], f);
        let g2 = randn(&[b, 3, d], f);
        let gw = randn(&[b, 2, v], f); // head output gradient [B, T, V]
        let aw = randn(&[b, 2, d], f); // head input [B, T, d]
        let ge = randn(&[b, 3, d], f); // embedding output gradient [B, T, d]
        let ids = Tensor::from_slice(&[0i64, 4, 4, 1, 2, 2, 3, 0, 1, 4, 4, 4]).reshape([b, 3]);
        let mk = || {
            vec![
                dense(
                    g1.shallow_clone(),
                    vec![Part::Bias {
                        param: "bias".into(),
                    }],
                ),
                dense(gw.shallow_clone(), vec![weight("table", &aw)]),
                dense(
                    g2.shallow_clone(),
                    vec![Part::Bias {
                        param: "bias".into(),
                    }],
                ),
                dense(
                    ge.shallow_clone(),
                    vec![Part::Embedding {
                        param: "table".into(),
                        ids: ids.shallow_clone(),
                        vocab: v,
                    }],
                ),
            ]
        };
        // per-record gradients by hand
        let mut want_bias = Vec::new();
        let mut want_table = Vec::new();
        for r in 0..b {
            let gb = g1
                .f_get(r)?
                .f_sum_dim_intlist(0, false, None::<Kind>)?
                .f_add(&g2.f_get(r)?.f_sum_dim_intlist(0, false, None::<Kind>)?)?;
            want_bias.push(gb.f_square()?.f_sum(Kind::Double)?.f_double_value(&[])?);
            // head: Σ_t g_t a_tᵀ  [V, d]; embedding: Σ_t e_{id_t} g_tᵀ  [V, d]
            let mut gt = gw.f_get(r)?.f_transpose(0, 1)?.f_matmul(&aw.f_get(r)?)?;
            for t in 0..3 {
                let id = ids.f_int64_value(&[r, t])?;
                let row = gt.f_get(id)?.f_add(&ge.f_get(r)?.f_get(t)?)?;
                gt = gt.f_index_copy(0, &Tensor::from_slice(&[id]), &row.f_unsqueeze(0)?)?;
            }
            want_table.push(gt.f_square()?.f_sum(Kind::Double)?.f_double_value(&[])?);
        }
        for chunk_elems in [1i64, 50, 1 << 20] {
            let mut e = engine(b, mk(), chunk_elems);
            e.kind = Kind::Double;
            for (p, want) in [("bias", &want_bias), ("table", &want_table)] {
                let got: Vec<f64> = Vec::try_from(e.sq_norms(p)?)?;
                assert_eq!(got.len(), want.len(), "{p}");
                for (r, (u, w)) in got.iter().zip(want).enumerate() {
                    assert!(
                        (u - w).abs() <= 1e-9 * w.max(1.0),
                        "{p} record {r}: {u} vs {w}"
                    );
                }
            }
        }
        Ok(())
    }

    /// Weighted sums `Σ_b c_b · grad_b` of biases and norm gains on dense sites with several
    /// tokens per record and on routed rows (a record with no row included), against loops
    /// over records and rows.
    #[test]
    fn bias_and_gain_sums_over_dense_and_routed_rows_match_loops() -> Result<()> {
        let f = Kind::Double;
        let (b, t, out) = (3i64, 4i64, 5i64);
        let c = Tensor::from_slice(&[0.5f64, -1.0, 2.0]);
        let cv = [0.5f64, -1.0, 2.0];
        let g = randn(&[b, t, out], f);
        let n = randn(&[b, t, out], f);
        let rec_v = [0i64, 0, 2, 2, 2];
        let gr = randn(&[5, out], f);
        let nr = randn(&[5, out], f);
        let bias = Part::Bias {
            param: "bias".into(),
        };
        let gain = |n: &Tensor| Part::Gain {
            param: "gain".into(),
            n: n.shallow_clone(),
        };
        let dense_site = dense(g.shallow_clone(), vec![]);
        let routed_site = GradSite {
            rows: Rows::Routed {
                rec: Tensor::from_slice(&rec_v),
            },
            parts: vec![],
            g: gr.shallow_clone(),
            offsets: Some(vec![0, 2, 2, 5]),
        };
        let e = engine(b, vec![], 1 << 20);
        let close = |got: &Tensor, want: &Tensor, what: &str| -> Result<()> {
            assert_eq!(got.size(), want.size(), "{what}");
            let d = got.f_sub(want)?.f_abs()?.f_max()?.f_double_value(&[])?;
            assert!(d < 1e-12, "{what}: {d}");
            Ok(())
        };
        // dense: Σ_b c_b Σ_t g[b, t] (⊙ n[b, t])
        let mut want_b = Tensor::zeros([out], (f, tch::Device::Cpu));
        let mut want_g = Tensor::zeros([out], (f, tch::Device::Cpu));
        for r in 0..b {
            for k in 0..t {
                let gk = g.f_get(r)?.f_get(k)?;
                want_b = want_b.f_add(&gk.f_mul_scalar(cv[r as usize])?)?;
                want_g = want_g.f_add(
                    &gk.f_mul(&n.f_get(r)?.f_get(k)?)?
                        .f_mul_scalar(cv[r as usize])?,
                )?;
            }
        }
        close(&e.part_sum(&dense_site, &bias, &c)?, &want_b, "dense bias")?;
        close(
            &e.part_sum(&dense_site, &gain(&n), &c)?,
            &want_g,
            "dense gain",
        )?;
        // routed: Σ_rows c[rec[row]] g[row] (⊙ n[row])
        let mut want_b = Tensor::zeros([out], (f, tch::Device::Cpu));
        let mut want_g = Tensor::zeros([out], (f, tch::Device::Cpu));
        for (row, &r) in rec_v.iter().enumerate() {
            let gk = gr.f_get(row as i64)?;
            want_b = want_b.f_add(&gk.f_mul_scalar(cv[r as usize])?)?;
            want_g = want_g.f_add(
                &gk.f_mul(&nr.f_get(row as i64)?)?
                    .f_mul_scalar(cv[r as usize])?,
            )?;
        }
        close(
            &e.part_sum(&routed_site, &bias, &c)?,
            &want_b,
            "routed bias",
        )?;
        close(
            &e.part_sum(&routed_site, &gain(&nr), &c)?,
            &want_g,
            "routed gain",
        )?;
        Ok(())
    }

    /// Routed linear weights in f32 on the CPU take raptor-clip's ragged kernels over each
    /// record's own rows: the ghost identity where records have few rows and the weight is wide
    /// (sums then by one row contraction), materializing where records have many rows of a
    /// narrow weight (kept for the sums). Both give the per-record norms and the clipped sums of
    /// the obvious per-record loop in f64, records without rows included; with the cache off the
    /// norms come from the ghost kernel and are the same.
    #[test]
    fn routed_weights_take_the_cheaper_ragged_kernel_and_match_loops() -> Result<()> {
        let f = Kind::Float;
        let b = 4i64;
        let routed =
            |offsets: Vec<i64>, din: i64, dout: i64, param: &str| -> (GradSite, Tensor, Tensor) {
                let rows = offsets[offsets.len() - 1];
                let a = randn(&[rows, din], f);
                let g = randn(&[rows, dout], f);
                (routed_site(&offsets, &a, &g, param), a, g)
            };
        // "wide": ≤ 2 rows per record of a 40 → 48 weight (ghost is less work);
        // "narrow": 9–11 rows per record of a 3 → 2 weight (materializing is).
        let (wide, wa, wg) = routed(vec![0, 1, 1, 3, 4], 40, 48, "wide");
        let (narrow, na, ng) = routed(vec![0, 9, 9, 20, 30], 3, 2, "narrow");
        let wide_off = [0i64, 1, 1, 3, 4];
        let narrow_off = [0i64, 9, 9, 20, 30];
        let (gw, mw) = ragged_cost(&[1, 0, 2, 1], 40, 48);
        assert!(gw < mw, "the wide weight is a ghost case");
        let (gn, mn) = ragged_cost(&[9, 0, 11, 10], 3, 2);
        assert!(mn < gn, "the narrow weight is a materializing case");
        let per_w = per_record_grads(&wa, &wg, &wide_off)?;
        let per_n = per_record_grads(&na, &ng, &narrow_off)?;
        let sq = |v: &[Tensor]| -> Result<Vec<f64>> {
            v.iter()
                .map(|t| Ok(t.f_square()?.f_sum(Kind::Double)?.f_double_value(&[])?))
                .collect()
        };
        let (sq_w, sq_n) = (sq(&per_w)?, sq(&per_n)?);
        assert_eq!((sq_w[1], sq_n[1]), (0.0, 0.0), "record 1 owns no rows");
        let close = |got: f64, want: f64, what: &str| {
            assert!(
                (got - want).abs() <= 1e-4 * want.abs().max(1e-3),
                "{what}: {got} vs {want}"
            );
        };
        let e = engine(b, vec![wide, narrow], 1 << 20);
        // Norms with the cache off: the ghost kernel for both.
        for (p, want) in [("wide", &sq_w), ("narrow", &sq_n)] {
            let got: Vec<f64> = Vec::try_from(e.sq_norms(p)?.f_to_kind(Kind::Double)?)?;
            for r in 0..b as usize {
                close(got[r], want[r], &format!("{p} record {r}, cache off"));
            }
        }
        // One group each, bound 1.5: norms, factors, sums against the loop.
        let mut groups = ParamGroups::new();
        groups.assign("wide", "gw");
        groups.assign("narrow", "gn");
        let bound = 1.5;
        let policy = ClipPolicy::RoleWise(
            [("gw".to_string(), bound), ("gn".to_string(), bound)]
                .into_iter()
                .collect(),
        );
        let out = e.clip(&groups, &policy, &BTreeMap::new())?;
        assert!(out.from_cache.contains("narrow"), "materialized and kept");
        assert!(
            !out.from_cache.contains("wide"),
            "ghost norms, row-contraction sums"
        );
        for (p, grp, per, want_sq) in [
            ("wide", "gw", &per_w, &sq_w),
            ("narrow", "gn", &per_n, &sq_n),
        ] {
            let got: Vec<f64> = Vec::try_from(out.group_sq_norms[grp].f_to_kind(Kind::Double)?)?;
            let mut want_sum = per[0].f_zeros_like()?;
            for r in 0..b as usize {
                close(got[r], want_sq[r], &format!("{p} record {r}"));
                let c = (bound / want_sq[r].sqrt()).min(1.0);
                want_sum = want_sum.f_add(&per[r].f_mul_scalar(c)?)?;
            }
            let d = out.sums[p]
                .f_to_kind(Kind::Double)?
                .f_sub(&want_sum)?
                .f_abs()?
                .f_max()?
                .f_double_value(&[])?;
            let scale = want_sum.f_abs()?.f_max()?.f_double_value(&[])?;
            assert!(
                d <= 1e-4 * scale.max(1e-3),
                "{p} sum: max error {d} of {scale}"
            );
        }
        Ok(())
    }

    /// `prepared` leaves a site alone only when it is already in the compute dtype and nothing
    /// is to be sanitized; a bf16 site is widened (its tensors in f32), and sanitizing zeroes
    /// non-finite entries.
    #[test]
    fn sites_are_prepared_in_the_compute_dtype() -> Result<()> {
        let g = Tensor::from_slice(&[1.0f32, f32::NAN, 2.0, 3.0]).reshape([2, 2]);
        let a = randn(&[2, 3], Kind::Float);
        let mk = |g: &Tensor, a: &Tensor| dense(g.shallow_clone(), vec![weight("w", a)]);
        assert!(mk(&g, &a).prepared(Kind::Float, false)?.is_none());
        let half = mk(&g.f_to_kind(Kind::BFloat16)?, &a.f_to_kind(Kind::BFloat16)?);
        let p = half
            .prepared(Kind::Float, false)?
            .ok_or_else(|| ModelError::InvalidConfig("bf16 site kept as is".into()))?;
        assert_eq!(p.g.kind(), Kind::Float);
        let Part::Weight { a: pa, .. } = &p.parts[0] else {
            return Err(ModelError::InvalidConfig("part changed kind".into()));
        };
        assert_eq!(pa.kind(), Kind::Float);
        assert_eq!(p.g.f_isnan()?.f_sum(Kind::Int64)?.int64_value(&[]), 1);
        let s = mk(&g, &a)
            .prepared(Kind::Float, true)?
            .ok_or_else(|| ModelError::InvalidConfig("sanitize did nothing".into()))?;
        assert_eq!(
            Vec::<f32>::try_from(s.g.f_flatten(0, -1)?)?,
            vec![1.0, 0.0, 2.0, 3.0]
        );
        Ok(())
    }

    /// `clip_factors` turns squared norms into `min(1, C / ‖g‖)` in the norms' dtype.
    #[test]
    fn clip_factors_are_min_one_bound_over_norm() -> Result<()> {
        let sq = Tensor::from_slice(&[4.0f32, 0.25, 0.0, 1.0]);
        let f = clip_factors(&sq, 1.0)?;
        assert_eq!(f.kind(), Kind::Float);
        let v: Vec<f32> = Vec::try_from(&f)?;
        assert!((v[0] - 0.5).abs() < 1e-6, "{v:?}");
        assert_eq!(&v[1..], &[1.0, 1.0, 1.0]);
        Ok(())
    }
}
