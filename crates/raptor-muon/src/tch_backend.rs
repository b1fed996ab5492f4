//! Newton–Schulz on libtorch tensors (feature `tch`): CPU or CUDA, f32 or bf16, with the same
//! semantics as [`crate::newton_schulz`] (orientation, normalization, polynomial, steps).
//!
//! Keller's quintic is computed exactly as torch.optim.Muon does (`A = X Xᵀ; B = bA + cA²;
//! X = aX + BX`, full products); the Taylor family by the same Horner scheme as the pure-Rust
//! backend.

use tch::{Device, Kind, Tensor};

use crate::error::MuonError;
use crate::ns::{Normalization, NsConfig, NsPolynomial};

/// Arithmetic precision of the iterations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TchPrecision {
    /// f32 throughout.
    F32,
    /// Cast to bfloat16 before normalizing (torch.optim.Muon's choice; a GPU speed trick).
    Bf16,
}

fn check_input(m: &Tensor) -> Result<(), MuonError> {
    let shape = m.size();
    let kind = m.f_kind()?;
    if shape.len() != 2 {
        return Err(MuonError::BadTensor {
            what: "newton_schulz input",
            reason: "must be 2-D",
            shape,
            kind,
        });
    }
    if !matches!(
        kind,
        Kind::Float | Kind::Double | Kind::BFloat16 | Kind::Half
    ) {
        return Err(MuonError::BadTensor {
            what: "newton_schulz input",
            reason: "must be floating point",
            shape,
            kind,
        });
    }
    if shape[0] == 0 || shape[1] == 0 {
        return Err(MuonError::EmptyMatrix {
            rows: shape[0] as usize,
            cols: shape[1] as usize,
        });
    }
    let all_finite = m.f_isfinite()?.f_all()?.f_int64_value(&[])? != 0;
    if !all_finite {
        // Locate the first offending entry for the error (slow path only).
        let flat = m
            .f_reshape([-1])?
            .f_to_kind(Kind::Float)?
            .f_to_device(Device::Cpu)?;
        let n = flat.numel();
        let mut v = vec![0f32; n];
        flat.f_copy_data(&mut v, n)?;
        let index = v.iter().position(|x| !x.is_finite()).unwrap_or(0);
        return Err(MuonError::NonFinite {
            what: "newton_schulz input",
            index,
            value: v[index],
        });
    }
    Ok(())
}

/// `f(M)` on a 2-D tensor (any float kind, any device). The result has `m`'s kind and device.
pub fn newton_schulz_tch(
    m: &Tensor,
    cfg: &NsConfig,
    precision: TchPrecision,
) -> Result<Tensor, MuonError> {
    cfg.validate()?;
    check_input(m)?;
    iterate(m, cfg, precision)
}

/// `f(M)` for several matrices of one shape, kind and device at once: they are stacked into a
/// `k × rows × cols` tensor and every product of the iteration is one batched matmul (one
/// dispatch per product instead of `k`; what pays on a GPU and for many small matrices).
/// Each matrix is normalized by its own Frobenius norm, so the result is, matrix by matrix,
/// [`newton_schulz_tch`] of the input (equal up to the matmul kernels' summation order; the
/// tests check 1e-5 relative on CPU).
///
/// An empty slice gives an empty vector; matrices of different shapes, kinds or devices are an
/// error (group them first).
///
/// ```no_run
/// # fn main() -> Result<(), raptor_muon::MuonError> {
/// use raptor_muon::NsConfig;
/// use raptor_muon::tch_backend::{TchPrecision, newton_schulz_tch_batch};
/// let a = tch::Tensor::randn([64, 256], (tch::Kind::Float, tch::Device::Cpu));
/// let b = tch::Tensor::randn([64, 256], (tch::Kind::Float, tch::Device::Cpu));
/// let out = newton_schulz_tch_batch(&[&a, &b], &NsConfig::keller(), TchPrecision::F32)?;
/// assert_eq!(out.len(), 2);
/// # Ok(())
/// # }
/// ```
pub fn newton_schulz_tch_batch(
    mats: &[&Tensor],
    cfg: &NsConfig,
    precision: TchPrecision,
) -> Result<Vec<Tensor>, MuonError> {
    cfg.validate()?;
    let Some(first) = mats.first() else {
        return Ok(Vec::new());
    };
    for m in mats {
        check_input(m)?;
    }
    let (shape, kind, device) = (first.size(), first.f_kind()?, first.device());
    for m in &mats[1..] {
        if m.size() != shape || m.f_kind()? != kind || m.device() != device {
            return Err(MuonError::BadTensor {
                what: "newton_schulz_tch_batch input",
                reason: "all matrices of a batch must share shape, kind and device",
                shape: m.size(),
                kind: m.f_kind()?,
            });
        }
    }
    if mats.len() == 1 {
        return Ok(vec![iterate(first, cfg, precision)?]);
    }
    let stacked = Tensor::f_stack(mats, 0)?;
    let out = iterate(&stacked, cfg, precision)?;
    Ok(out.f_unbind(0)?)
}

/// The iteration on a checked `… × rows × cols` tensor (2-D, or 3-D for a batch): every
/// reduction and product acts on the last two dimensions only.
fn iterate(m: &Tensor, cfg: &NsConfig, precision: TchPrecision) -> Result<Tensor, MuonError> {
    let shape = m.size();
    let nd = shape.len();
    let tall = shape[nd - 2] > shape[nd - 1];
    let work_kind = match precision {
        TchPrecision::F32 => Kind::Float,
        TchPrecision::Bf16 => Kind::BFloat16,
    };
    let mut x = m.f_to_kind(work_kind)?;
    if tall {
        x = x.f_mt()?;
    }
    // Per-matrix Frobenius norm, accumulated in f64.
    let norm = x
        .f_to_kind(Kind::Float)?
        .f_square()?
        .f_sum_dim_intlist([-2i64, -1].as_slice(), true, Kind::Double)?
        .f_sqrt()?;
    let denom = match cfg.normalization {
        Normalization::FrobeniusPlusEps { eps } => norm.f_add_scalar(eps as f64)?,
        Normalization::MaxOneFrobenius => norm.f_clamp_min(1.0)?,
    };
    x = x.f_div(&denom.f_to_kind(work_kind)?)?;
    match cfg.polynomial {
        NsPolynomial::Keller { a, b, c } => {
            for _ in 0..cfg.steps {
                let g = x.f_matmul(&x.f_mt()?)?;
                let u = g
                    .f_mul_scalar(b as f64)?
                    .f_add(&g.f_matmul(&g)?.f_mul_scalar(c as f64)?)?;
                x = x.f_mul_scalar(a as f64)?.f_add(&u.f_matmul(&x)?)?;
            }
        }
        NsPolynomial::Taylor { .. } => {
            let d = cfg.polynomial.coefficients_in_a();
            let deg = d.len() - 1;
            for _ in 0..cfg.steps {
                let a = x.f_matmul(&x.f_mt()?)?;
                let mut t = a.f_mul_scalar(d[deg])?;
                let _ = t.f_diagonal(0, -2, -1)?.f_add_scalar_(d[deg - 1])?;
                for j in (0..deg.saturating_sub(1)).rev() {
                    t = a.f_matmul(&t)?;
                    let _ = t.f_diagonal(0, -2, -1)?.f_add_scalar_(d[j])?;
                }
                x = t.f_matmul(&x)?;
            }
        }
    }
    if tall {
        x = x.f_mt()?;
    }
    Ok(x.f_to_kind(m.f_kind()?)?.f_contiguous()?)
}

/// Copy a row-major `rows × cols` f32 slice into a tensor on `device`.
pub fn tensor_from_slice(
    data: &[f32],
    rows: usize,
    cols: usize,
    device: Device,
) -> Result<Tensor, MuonError> {
    crate::error::check_shape("tensor_from_slice", data.len(), rows, cols)?;
    Ok(Tensor::f_from_slice(data)?
        .f_reshape([rows as i64, cols as i64])?
        .f_to_device(device)?)
}

/// Copy a 2-D tensor back into a row-major f32 vector.
pub fn tensor_to_vec(t: &Tensor) -> Result<Vec<f32>, MuonError> {
    let flat = t
        .f_to_kind(Kind::Float)?
        .f_to_device(Device::Cpu)?
        .f_contiguous()?
        .f_reshape([-1])?;
    let n = flat.numel();
    let mut v = vec![0f32; n];
    flat.f_copy_data(&mut v, n)?;
    Ok(v)
}
