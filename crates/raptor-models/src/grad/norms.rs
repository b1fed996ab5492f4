//! Per-record squared norms: the ghost identity (Gram products of the two factors of a linear
//! weight or embedding), materialized per-record gradients where cheaper, the ragged or padded
//! forms of routed expert rows, per-record grads of small parameters; records in chunks of
//! bounded temporaries.

use super::site::{GradSite, compute_kind, internal, with_cpu_slice, with_new_cpu_tensor};
use super::{MATERIALIZE_MAX_ELEMS, PerSampleGrads};
use crate::error::{ModelError, Result};
use crate::tape::Part;
use raptor_clip::linear::{
    NormMethod, ghost_cost, linear_per_example_sq_norms_with, materialized_cost,
};
use raptor_clip::routed::{ragged_cost, routed_linear_grads, routed_linear_sq_norms};
use std::collections::BTreeMap;
use tch::{Kind, Tensor};

pub(super) enum Factor {
    Dense(Tensor),
    OneHot(Tensor),
    Ones(i64),
}

impl PerSampleGrads {
    /// Per-record gradient `[n, ...param shape]` of a "direct" part over records `r0..r0+n`.
    pub(super) fn direct(&self, s: &GradSite, p: &Part, r0: i64, n: i64) -> Result<Tensor> {
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
    pub(super) fn factors(
        &self,
        s: &GradSite,
        p: &Part,
        r0: i64,
        n: i64,
    ) -> Result<(Factor, Factor)> {
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

    pub(super) fn gram(&self, x: &Factor, y: &Factor) -> Result<Tensor> {
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
    pub(super) fn chunk_records(&self, uses: &[(usize, usize)]) -> i64 {
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
    pub(super) fn shared_input_norms(&self) -> Result<BTreeMap<String, Tensor>> {
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

    pub(super) fn sq_norms_chunk(
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

    /// Squared norms `[n]` of one chunk's per-record gradients of a routed linear weight (an
    /// expert's, rows grouped by record) on the CPU in f32, over the records' own rows (no
    /// padding to the longest record) by raptor-clip's ragged kernels, whichever does less
    /// work ([`ragged_cost`]): the ghost identity ([`routed_linear_sq_norms`]; the clipped sums
    /// are then one row contraction), or materializing ([`routed_linear_grads`]) and keeping
    /// the gradients for the sums when the cache has room. `None` (nothing done) unless the
    /// site is routed and f32 on the CPU.
    pub(super) fn routed_sq_norms(
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
}
