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
//!
//! # Map
//!
//! - this file: [`PerSampleGrads`] and [`PerSampleGrads::compute`] (the one backward pass and
//!   the recorded sites it keeps), the engine's memory limits ([`EngineLimits`]), accessors;
//! - `site`: a recorded op's output gradient and how its rows map to records (chunks, padded
//!   routed rows, row coefficients), the compute dtype and the CPU slice views;
//! - `norms`: per-record squared norms ([`PerSampleGrads::sq_norms`]): ghost identity,
//!   materialized gradients, routed rows (ragged or padded), shared-input Gram matrices;
//! - `cache`: per-record gradients the norm pass keeps for the clipped sums;
//! - `sums`: weighted sums ([`PerSampleGrads::weighted_sum`]), one contraction per use;
//! - `clip`: the clipping policies and the clip itself ([`PerSampleGrads::clip`],
//!   [`PerSampleGrads::into_clip`], [`clip_factors`], [`ParamGroups`], [`ClipPolicy`],
//!   [`GroupKey`], [`ClipOutput`]);
//! - `tests`: unit tests of the internals.
//!
//! The engine clips; it adds no noise. The noise and the public denominator are the trainer's
//! (`raptor-train`'s release, with `raptor-clip`'s privatizer).

mod cache;
mod clip;
mod norms;
mod site;
mod sums;
#[cfg(test)]
mod tests;

pub use clip::{ClipOutput, ClipPolicy, GroupKey, ParamGroups, clip_factors};

use crate::error::{ModelError, Result};
use crate::tape::{Part, Rows, Site, Tape};
use cache::MatCache;
use site::GradSite;
use std::cell::RefCell;
use std::collections::BTreeMap;
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

impl std::fmt::Debug for PerSampleGrads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerSampleGrads")
            .field("batch_size", &self.batch_size)
            .field("sites", &self.sites.len())
            .field("params", &self.uses.keys().collect::<Vec<_>>())
            .finish()
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
}
