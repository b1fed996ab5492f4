//! The cache of per-record gradients materialized by the norm pass, kept (within a budget) for
//! the clipped sums: one `[1, n] × [n, out·in]` product instead of a contraction over every
//! token row.

use super::PerSampleGrads;
use super::site::compute_kind;
use crate::error::Result;
use raptor_clip::linear::per_record_sq_sums;
use std::collections::{BTreeMap, BTreeSet};
use tch::Tensor;

/// Per-record gradients `[n, out, in]` of single-use linear weights whose norms were computed
/// by materializing them, chunk by chunk in record order, so that the clipped sum is one
/// `[1, n] × [n, out·in]` product per chunk instead of a contraction over every token row. At
/// most `budget` elements are kept (the size of the pass's output gradients: the cache at most
/// doubles what the backward pass left); a parameter that does not fit is not kept at all and
/// takes the token-row contraction.
pub(super) struct MatCache {
    pub(super) budget: i64,
    pub(super) used: i64,
    pub(super) grads: BTreeMap<String, Vec<Tensor>>,
    pub(super) skipped: BTreeSet<String>,
    /// Parameters whose clipped sum came from the cache.
    pub(super) served: BTreeSet<String>,
}

impl PerSampleGrads {
    /// Room in the materialized-gradient cache for `need` more elements of `param`: false (and
    /// `param` dropped from the cache for this pass, its sums then taken by the row
    /// contraction) when caching is off, `param` was dropped before, or the budget is spent.
    pub(super) fn cache_admits(&self, param: &str, need: i64) -> bool {
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
    pub(super) fn cache_keep(&self, param: &str, gi: Tensor) {
        if let Some(cache) = self.cache.borrow_mut().as_mut() {
            cache.used += gi.numel() as i64;
            cache.grads.entry(param.to_string()).or_default().push(gi);
        }
    }

    /// Squared norms `[n]` of one chunk's per-record gradients `G_b = Σ_t g_t a_tᵀ` by
    /// materializing them (the same products as raptor-clip's materialized kernel), keeping
    /// `G` for the clipped sums when caching is on and the budget allows; `None` otherwise.
    pub(super) fn materialize_cached(
        &self,
        param: &str,
        a3: &Tensor,
        g3: &Tensor,
    ) -> Result<Option<Tensor>> {
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
    pub(super) fn cached_sum(
        &self,
        param: &str,
        c: &Tensor,
        sanitize: bool,
    ) -> Result<Option<Tensor>> {
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
    pub(super) fn start_cache(&self) {
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
    pub(super) fn end_cache(&self) -> BTreeSet<String> {
        self.cache
            .borrow_mut()
            .take()
            .map(|c| c.served)
            .unwrap_or_default()
    }
}
