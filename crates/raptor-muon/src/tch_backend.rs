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
    let shape = m.size();
    let tall = shape[0] > shape[1];
    let work_kind = match precision {
        TchPrecision::F32 => Kind::Float,
        TchPrecision::Bf16 => Kind::BFloat16,
    };
    let mut x = m.f_to_kind(work_kind)?;
    if tall {
        x = x.f_mt()?;
    }
    let norm = x
        .f_to_kind(Kind::Float)?
        .f_square()?
        .f_sum(Kind::Double)?
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
                let _ = t.f_diagonal(0, 0, 1)?.f_add_scalar_(d[deg - 1])?;
                for j in (0..deg.saturating_sub(1)).rev() {
                    t = a.f_matmul(&t)?;
                    let _ = t.f_diagonal(0, 0, 1)?.f_add_scalar_(d[j])?;
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
