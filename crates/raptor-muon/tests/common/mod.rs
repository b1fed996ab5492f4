//! Shared helpers for the integration tests: seeded random and planted matrices.
#![allow(dead_code)]

use faer::Mat;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

/// Seeded generator.
pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// An `r × c` matrix of i.i.d. N(0, scale²) entries.
pub fn gaussian(rng: &mut ChaCha8Rng, r: usize, c: usize, scale: f32) -> Mat<f32> {
    Mat::from_fn(r, c, |_, _| {
        let z: f32 = StandardNormal.sample(rng);
        z * scale
    })
}

/// An `n × k` matrix with orthonormal columns (k ≤ n), from the SVD of a Gaussian matrix.
pub fn orthonormal(rng: &mut ChaCha8Rng, n: usize, k: usize) -> Mat<f64> {
    let g = Mat::<f64>::from_fn(n, k, |_, _| StandardNormal.sample(&mut *rng));
    let svd = g.thin_svd().unwrap();
    svd.U().to_owned()
}

/// `U diag(sv) Vᵀ` with random orthonormal U (r × k), V (c × k), k = sv.len() ≤ min(r, c).
pub fn planted(rng: &mut ChaCha8Rng, r: usize, c: usize, sv: &[f64]) -> Mat<f32> {
    let k = sv.len();
    let u = orthonormal(rng, r, k);
    let v = orthonormal(rng, c, k);
    let us = Mat::<f64>::from_fn(r, k, |i, j| u[(i, j)] * sv[j]);
    let m = &us * v.transpose();
    Mat::from_fn(r, c, |i, j| m[(i, j)] as f32)
}

/// Max |a − b| over entries.
pub fn max_abs_diff(a: &Mat<f32>, b: &Mat<f64>) -> f64 {
    let mut d = 0.0f64;
    for j in 0..a.ncols() {
        for i in 0..a.nrows() {
            d = d.max((a[(i, j)] as f64 - b[(i, j)]).abs());
        }
    }
    d
}

/// Frobenius norm of a − b.
pub fn frob_diff(a: &Mat<f32>, b: &Mat<f64>) -> f64 {
    let mut d = 0.0f64;
    for j in 0..a.ncols() {
        for i in 0..a.nrows() {
            let e = a[(i, j)] as f64 - b[(i, j)];
            d += e * e;
        }
    }
    d.sqrt()
}

/// Frobenius norm (f64).
pub fn frob64(b: &Mat<f64>) -> f64 {
    let mut d = 0.0f64;
    for j in 0..b.ncols() {
        for i in 0..b.nrows() {
            d += b[(i, j)] * b[(i, j)];
        }
    }
    d.sqrt()
}

/// One N(0, 1) f32 draw.
pub fn normal(rng: &mut ChaCha8Rng) -> f32 {
    StandardNormal.sample(rng)
}
