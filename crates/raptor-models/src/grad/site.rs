//! A recorded op's output gradient (`GradSite`) and how its rows map to records: chunks of
//! records, padded routed rows, row coefficients; the dtype helpers and the CPU slice views the
//! routed kernels read and write through.

use crate::error::{ModelError, Result};
use crate::tape::{Part, Rows};
use tch::{Kind, Tensor};

/// A site's output gradient (the op output `z` itself is dropped right after the backward).
pub(super) struct GradSite {
    pub(super) rows: Rows,
    pub(super) parts: Vec<Part>,
    /// Output gradient `∂L/∂z` in the site's own row layout.
    pub(super) g: Tensor,
    /// Routed sites: row offset of each record's rows (`B + 1` entries; rows sorted by record).
    pub(super) offsets: Option<Vec<i64>>,
}

impl GradSite {
    /// Tokens per record: T for dense sites, the largest routed count for routed ones.
    pub(super) fn tokens(&self) -> i64 {
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

    pub(super) fn out_dim(&self) -> i64 {
        self.g.size().last().copied().unwrap_or(1)
    }

    /// Rows of records `r0..r0+n` of `x` (`x` in the site's row layout: `[B, ...]` or
    /// `[N, d]` routed rows), as `[n, T, d]` (routed rows zero-padded within the chunk).
    pub(super) fn chunk(&self, x: &Tensor, r0: i64, n: i64) -> Result<Tensor> {
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
    pub(super) fn row_coeffs(&self, c: &Tensor, b: i64) -> Result<Tensor> {
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
    pub(super) fn scaled_g(&self, c: &Tensor, b: i64) -> Result<Tensor> {
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
pub(super) fn pad_rows<T: tch::kind::Element + Copy + Default>(
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

pub(super) fn internal(what: &str) -> ModelError {
    ModelError::InvalidConfig(format!("internal: {what}"))
}

/// `f` on the elements of `t`, a CPU tensor of `T` (a contiguous copy first when it is not
/// contiguous), borrowed in place.
pub(super) fn with_cpu_slice<T: tch::kind::Element, R>(
    t: &Tensor,
    f: impl FnOnce(&[T]) -> R,
) -> Result<R> {
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
pub(super) fn with_new_cpu_tensor<T: tch::kind::Element, R>(
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

/// The dtype clip coefficients and clipped-sum contractions are computed in: f64 for f64
/// models, f32 otherwise (a bf16/f16 coefficient could round up and let a record exceed its
/// bound).
pub(super) fn compute_kind(kind: Kind) -> Kind {
    match kind {
        Kind::Double => Kind::Double,
        _ => Kind::Float,
    }
}

/// `t` in `kind`, with NaN and ±inf replaced by 0 when `sanitize` (only records of coefficient
/// 0 hold such entries, so this changes no contribution; it stops 0 · NaN = NaN).
pub(super) fn prep(t: &Tensor, kind: Kind, sanitize: bool) -> Result<Tensor> {
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
    pub(super) fn prepared(&self, kind: Kind, sanitize: bool) -> Result<Option<GradSite>> {
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
