//! Monte Carlo measurement of the DP-MuonBC bias (used by `raptor reproduce`).

use faer::{Mat, MatRef};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::bc::{BcConfig, bias_corrected_direction};
use crate::error::{MuonError, check_param};
use crate::ns::{NsConfig, newton_schulz};

/// Bias of the plain and corrected directions, estimated over noise draws.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BiasEstimate {
    /// `‖E f(M̃) − f(M)‖_F` (debiased: `tr Cov / N` subtracted from the squared norm).
    pub plain: f64,
    /// Monte Carlo standard error of `plain` (delta method).
    pub plain_se: f64,
    /// `‖E O_BC − f(M)‖_F` (debiased likewise).
    pub corrected: f64,
    /// Monte Carlo standard error of `corrected`.
    pub corrected_se: f64,
    /// Paired difference `‖bias_plain‖² − ‖bias_BC‖²` on the same draws.
    pub diff_sq: f64,
    /// Its standard error.
    pub diff_sq_se: f64,
    /// Number of draws.
    pub draws: usize,
}

/// Draw `M̃ = M + sΞ` (`Ξ` i.i.d. N(0, 1), seeded ChaCha20) `draws` times and measure the bias of
/// `f(M̃)` and of `O_BC` with respect to `f(M)`.
pub fn bias_monte_carlo(
    m: MatRef<'_, f32>,
    s: f64,
    ns: &NsConfig,
    bc: &BcConfig,
    draws: usize,
    seed: u64,
) -> Result<BiasEstimate, MuonError> {
    check_param("draws", draws as f64, draws >= 2, "need at least 2 draws")?;
    check_param("noise_std", s, s > 0.0, "noise std must be > 0")?;
    let (r, c) = (m.nrows(), m.ncols());
    let f = newton_schulz(m, ns)?;
    let mut noise = ChaCha20Rng::seed_from_u64(seed);
    let mut probes = ChaCha20Rng::seed_from_u64(seed.wrapping_add(0x9e37_79b9_7f4a_7c15));
    let d = r * c;
    let mut plain = Vec::with_capacity(draws);
    let mut corr = Vec::with_capacity(draws);
    let flat = |x: &Mat<f32>| -> Vec<f64> {
        let mut v = Vec::with_capacity(d);
        for j in 0..c {
            for i in 0..r {
                v.push(x[(i, j)] as f64 - f[(i, j)] as f64);
            }
        }
        v
    };
    for _ in 0..draws {
        let mt = Mat::<f32>::from_fn(r, c, |i, j| {
            let z: f32 = StandardNormal.sample(&mut noise);
            m[(i, j)] + s as f32 * z
        });
        let out = bias_corrected_direction(mt.as_ref(), s, ns, bc, &mut probes)?;
        plain.push(flat(&out.plain));
        corr.push(flat(&out.direction));
    }
    let n = draws as f64;
    let mean_tr = |xs: &[Vec<f64>]| -> (Vec<f64>, f64) {
        let mut mean = vec![0.0; d];
        for x in xs {
            for (m, v) in mean.iter_mut().zip(x) {
                *m += v / n;
            }
        }
        let tr: f64 = xs
            .iter()
            .map(|x| {
                x.iter()
                    .zip(&mean)
                    .map(|(v, m)| (v - m).powi(2))
                    .sum::<f64>()
            })
            .sum();
        (mean, tr / (n - 1.0))
    };
    let (bp, trp) = mean_tr(&plain);
    let (bb, trb) = mean_tr(&corr);
    let sq = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>();
    let p2 = (sq(&bp) - trp / n).max(0.0);
    let b2 = (sq(&bb) - trb / n).max(0.0);
    let proj = |xs: &[Vec<f64>], b: &[f64]| -> Vec<f64> {
        xs.iter()
            .map(|x| x.iter().zip(b).map(|(a, b)| a * b).sum())
            .collect()
    };
    let sd = |v: &[f64]| {
        let mu = v.iter().sum::<f64>() / n;
        (v.iter().map(|x| (x - mu).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    };
    let zp = proj(&plain, &bp);
    let zb = proj(&corr, &bb);
    let zd: Vec<f64> = zp.iter().zip(&zb).map(|(a, b)| 2.0 * (a - b)).collect();
    Ok(BiasEstimate {
        plain: p2.sqrt(),
        plain_se: sd(&zp) / sq(&bp).sqrt().max(1e-300) / n.sqrt(),
        corrected: b2.sqrt(),
        corrected_se: sd(&zb) / sq(&bb).sqrt().max(1e-300) / n.sqrt(),
        diff_sq: p2 - b2,
        diff_sq_se: sd(&zd) / n.sqrt(),
        draws,
    })
}

/// An `rows × cols` matrix of i.i.d. `N(0, scale²)` entries from a seeded ChaCha20 generator.
pub fn gaussian_matrix(rows: usize, cols: usize, scale: f32, seed: u64) -> Mat<f32> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    Mat::from_fn(rows, cols, |_, _| {
        let z: f32 = StandardNormal.sample(&mut rng);
        scale * z
    })
}

/// A planted matrix `U diag(sv) Vᵀ` (`rows × cols`, `sv.len() ≤ min(rows, cols)`) with random
/// orthonormal `U`, `V` (left singular vectors of seeded Gaussian matrices).
pub fn planted_matrix(
    rows: usize,
    cols: usize,
    sv: &[f64],
    seed: u64,
) -> Result<Mat<f32>, MuonError> {
    let k = sv.len();
    if rows == 0 || cols == 0 || k == 0 || k > rows.min(cols) {
        return Err(MuonError::EmptyMatrix { rows, cols });
    }
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut orth = |n: usize| -> Result<Mat<f64>, MuonError> {
        let g = Mat::<f64>::from_fn(n, k, |_, _| StandardNormal.sample(&mut rng));
        let svd = g
            .thin_svd()
            .map_err(|_| MuonError::SvdFailed { rows: n, cols: k })?;
        Ok(svd.U().to_owned())
    };
    let u = orth(rows)?;
    let v = orth(cols)?;
    let us = Mat::<f64>::from_fn(rows, k, |i, j| u[(i, j)] * sv[j]);
    let m = &us * v.transpose();
    Ok(Mat::from_fn(rows, cols, |i, j| m[(i, j)] as f32))
}
