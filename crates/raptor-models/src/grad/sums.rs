//! Weighted (clipped) sums `Σ_b c_b G_b`: one contraction per recorded use of a parameter, the
//! narrower factor scaled by the record coefficients; coefficients checked, non-finite
//! entries of zero-coefficient records sanitized.

use super::PerSampleGrads;
use super::site::{GradSite, compute_kind};
use crate::error::{ModelError, Result};
use crate::tape::{Part, Rows};
use tch::{Kind, Tensor};

impl PerSampleGrads {
    /// The sum term of one use: from the cache ([`Self::cached_sum`]), else
    /// [`Self::part_sum_safe`].
    pub(super) fn use_sum(
        &self,
        s: &GradSite,
        p: &Part,
        c: &Tensor,
        sanitize: bool,
    ) -> Result<Tensor> {
        match self.cached_sum(p.param(), c, sanitize)? {
            Some(t) => Ok(t),
            None => self.part_sum_safe(s, p, c, sanitize),
        }
    }

    /// `Σ_b c[b] · (part p's per-record gradient)` for one use of a parameter.
    pub(super) fn part_sum(&self, s: &GradSite, p: &Part, c: &Tensor) -> Result<Tensor> {
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

    pub(super) fn check_coeffs(&self, param: &str, coeffs: &Tensor) -> Result<Tensor> {
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
    pub(super) fn part_sum_safe(
        &self,
        s: &GradSite,
        p: &Part,
        c: &Tensor,
        sanitize: bool,
    ) -> Result<Tensor> {
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
    pub(super) fn weighted_sum_with(
        &self,
        param: &str,
        coeffs: &Tensor,
        sanitize: bool,
    ) -> Result<Tensor> {
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
}
