//! Slow, obvious references built on faer's SVD (f64). Used by the tests; public so that users
//! can check their own configurations.
//!
//! For `M = U Σ Vᵀ`, every Newton–Schulz iteration acts on the singular values alone:
//! `X = U S Vᵀ ↦ U φ(S) Vᵀ` with `φ(σ) = σ·Σ_j d_j σ^{2j}`. So `f(M) = U φ^q(s·Σ) Vᵀ` where `s`
//! is the normalization factor, exactly, whatever the number of steps.

use faer::{Mat, MatRef};

use crate::error::MuonError;
use crate::ns::{NsConfig, frobenius};

/// `(U, singular values, V)` of a thin SVD in f64.
type ThinSvd = (Mat<f64>, Vec<f64>, Mat<f64>);

fn thin_svd_f64(m: MatRef<'_, f32>) -> Result<ThinSvd, MuonError> {
    let (r, c) = (m.nrows(), m.ncols());
    if r == 0 || c == 0 {
        return Err(MuonError::EmptyMatrix { rows: r, cols: c });
    }
    let m64 = Mat::<f64>::from_fn(r, c, |i, j| m[(i, j)] as f64);
    let svd = m64
        .thin_svd()
        .map_err(|_| MuonError::SvdFailed { rows: r, cols: c })?;
    let k = r.min(c);
    let s: Vec<f64> = (0..k).map(|i| svd.S()[i]).collect();
    Ok((svd.U().to_owned(), s, svd.V().to_owned()))
}

fn rebuild(u: &Mat<f64>, s: &[f64], v: &Mat<f64>) -> Mat<f64> {
    let us = Mat::<f64>::from_fn(u.nrows(), s.len(), |i, k| u[(i, k)] * s[k]);
    &us * v.transpose()
}

/// The polar factor `U Vᵀ` of `M = U Σ Vᵀ` (thin SVD; singular values below
/// `1e-12·σ_max` are treated as zero and their directions dropped).
pub fn polar_factor(m: MatRef<'_, f32>) -> Result<Mat<f64>, MuonError> {
    let (u, s, v) = thin_svd_f64(m)?;
    let smax = s.iter().cloned().fold(0.0f64, f64::max);
    let ones: Vec<f64> = s
        .iter()
        .map(|&x| if x > 1e-12 * smax { 1.0 } else { 0.0 })
        .collect();
    Ok(rebuild(&u, &ones, &v))
}

/// Singular values of `M` (f64, non-increasing).
pub fn singular_values(m: MatRef<'_, f32>) -> Result<Vec<f64>, MuonError> {
    Ok(thin_svd_f64(m)?.1)
}

/// `f(M)` computed through the SVD in f64: normalize as `cfg` says, apply the scalar
/// iteration `cfg.steps` times to each singular value, rebuild.
pub fn newton_schulz_via_svd(m: MatRef<'_, f32>, cfg: &NsConfig) -> Result<Mat<f64>, MuonError> {
    cfg.validate()?;
    let (u, s, v) = thin_svd_f64(m)?;
    let scale = cfg.scale_for_norm(frobenius(m));
    let phi: Vec<f64> = s
        .iter()
        .map(|&x| {
            let mut y = x * scale;
            for _ in 0..cfg.steps {
                y = cfg.polynomial.apply_scalar(y);
            }
            y
        })
        .collect();
    Ok(rebuild(&u, &phi, &v))
}

/// Operator (spectral) norm of `I − O Oᵀ` (on the small side of `O`): the orthogonality residual.
pub fn orthogonality_residual(o: MatRef<'_, f32>) -> Result<f64, MuonError> {
    let s = singular_values(o)?;
    Ok(s.iter().map(|&x| (1.0 - x * x).abs()).fold(0.0, f64::max))
}
