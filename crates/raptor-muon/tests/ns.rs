//! Newton–Schulz tests: against SVD references, the p_κ residual contraction, orientation,
//! slice API and errors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use faer::Mat;
use proptest::prelude::*;
use raptor_muon::reference::{newton_schulz_via_svd, orthogonality_residual, polar_factor};
use raptor_muon::{
    MuonError, Normalization, NsConfig, NsPolynomial, newton_schulz, newton_schulz_slice,
};

const SHAPES: [(usize, usize); 5] = [(1, 1), (4, 4), (6, 17), (33, 9), (48, 80)];

#[test]
fn matches_svd_spectral_reference_for_every_polynomial() {
    let mut r = rng(1);
    let configs = [
        NsConfig::keller(),
        NsConfig {
            steps: 12,
            ..NsConfig::keller()
        },
        NsConfig::taylor(1, 5),
        NsConfig::taylor(2, 5),
        NsConfig::taylor(3, 8),
        NsConfig::taylor(5, 3),
    ];
    for &(rows, cols) in &SHAPES {
        for scale in [0.05f32, 1.0, 30.0] {
            let m = gaussian(&mut r, rows, cols, scale);
            for cfg in &configs {
                let got = newton_schulz(m.as_ref(), cfg).unwrap();
                let want = newton_schulz_via_svd(m.as_ref(), cfg).unwrap();
                let rel = frob_diff(&got, &want) / frob64(&want).max(1e-12);
                assert!(
                    rel < 2e-4,
                    "{rows}x{cols} scale {scale} {cfg:?}: rel err {rel}"
                );
            }
        }
    }
}

#[test]
fn taylor_converges_to_polar_factor() {
    let mut r = rng(2);
    for &(rows, cols) in &[(5usize, 5usize), (8, 20), (24, 10)] {
        let k = rows.min(cols);
        // singular values spread 1 .. 0.05, Frobenius norm above 1 (normalization active)
        let sv: Vec<f64> = (0..k)
            .map(|i| 3.0 * (0.05f64).powf(i as f64 / (k - 1) as f64))
            .collect();
        let m = planted(&mut r, rows, cols, &sv);
        let polar = polar_factor(m.as_ref()).unwrap();
        for kappa in [1usize, 2, 3] {
            let o = newton_schulz(m.as_ref(), &NsConfig::taylor(kappa, 60)).unwrap();
            let err = max_abs_diff(&o, &polar);
            assert!(err < 2e-5, "{rows}x{cols} kappa {kappa}: max err {err}");
        }
    }
}

/// For singular values in (0, 1], one p_κ step maps e = 1 − σ² to
/// g(e) = 1 − (1−e) p_κ(1−e)², and g(e) ≤ e^{κ+1}. The residual ‖I − OOᵀ‖₂ = max e must follow.
#[test]
fn orthogonality_residual_contracts_as_theory_says() {
    let mut r = rng(3);
    let m = planted(
        &mut r,
        12,
        30,
        &[
            0.9, 0.7, 0.5, 0.3, 0.2, 0.1, 0.08, 0.05, 0.03, 0.02, 0.01, 0.005,
        ],
    );
    for kappa in [1usize, 2, 3, 4] {
        let poly = NsPolynomial::Taylor { kappa };
        let g = |e: f64| {
            let s = (1.0 - e).sqrt();
            let s2 = poly.apply_scalar(s);
            1.0 - s2 * s2
        };
        // q = 0 is the normalized start (singular values in (0, 1]).
        let mut prev = orthogonality_residual(
            newton_schulz(m.as_ref(), &NsConfig::taylor(kappa, 0))
                .unwrap()
                .as_ref(),
        )
        .unwrap();
        assert!(prev > 0.0 && prev < 1.0);
        for q in 1..=30 {
            let o = newton_schulz(m.as_ref(), &NsConfig::taylor(kappa, q)).unwrap();
            let res = orthogonality_residual(o.as_ref()).unwrap();
            let bound = prev.powi(kappa as i32 + 1);
            assert!(g(prev) <= bound + 1e-15, "theory: g(e) ≤ e^(κ+1)");
            assert!(
                res <= bound + 2e-6,
                "kappa {kappa} q {q}: residual {res} > {prev}^{} = {bound}",
                kappa + 1
            );
            assert!(
                (res - g(prev)).abs() <= 2e-6 + 1e-4 * g(prev),
                "kappa {kappa} q {q}: {res} vs g = {}",
                g(prev)
            );
            prev = res;
        }
        assert!(prev < 1e-5, "kappa {kappa}: final residual {prev}");
    }
}

#[test]
fn orientation_transpose_commutes() {
    let mut r = rng(4);
    let m = gaussian(&mut r, 7, 19, 1.0);
    for cfg in [NsConfig::keller(), NsConfig::taylor(2, 5)] {
        let a = newton_schulz(m.as_ref(), &cfg).unwrap();
        let mt = m.transpose().to_owned();
        let b = newton_schulz(mt.as_ref(), &cfg).unwrap();
        for i in 0..7 {
            for j in 0..19 {
                assert!((a[(i, j)] - b[(j, i)]).abs() < 1e-6);
            }
        }
    }
}

#[test]
fn slice_api_is_row_major() {
    let mut r = rng(5);
    let (rows, cols) = (5, 9);
    let m = gaussian(&mut r, rows, cols, 1.0);
    let row_major: Vec<f32> = (0..rows)
        .flat_map(|i| (0..cols).map(move |j| (i, j)))
        .map(|(i, j)| m[(i, j)])
        .collect();
    for cfg in [NsConfig::keller(), NsConfig::taylor(2, 5)] {
        let want = newton_schulz(m.as_ref(), &cfg).unwrap();
        let got = newton_schulz_slice(&row_major, rows, cols, &cfg).unwrap();
        for i in 0..rows {
            for j in 0..cols {
                assert!((got[i * cols + j] - want[(i, j)]).abs() < 1e-6);
            }
        }
    }
}

#[test]
fn zero_matrix_maps_to_zero() {
    let z = Mat::<f32>::zeros(3, 4);
    for cfg in [NsConfig::keller(), NsConfig::taylor(2, 5)] {
        let o = newton_schulz(z.as_ref(), &cfg).unwrap();
        assert!(o.col_iter().all(|c| c.iter().all(|&v| v == 0.0)));
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    let cfg = NsConfig::keller();
    assert!(matches!(
        newton_schulz(Mat::<f32>::zeros(0, 3).as_ref(), &cfg),
        Err(MuonError::EmptyMatrix { rows: 0, cols: 3 })
    ));
    assert!(matches!(
        newton_schulz_slice(&[1.0; 5], 2, 3, &cfg),
        Err(MuonError::ShapeMismatch { len: 5, .. })
    ));
    let mut m = Mat::<f32>::zeros(2, 2);
    m[(1, 0)] = f32::NAN;
    assert!(matches!(
        newton_schulz(m.as_ref(), &cfg),
        Err(MuonError::NonFinite { index: 1, .. })
    ));
    m[(1, 0)] = f32::INFINITY;
    assert!(matches!(
        newton_schulz(m.as_ref(), &cfg),
        Err(MuonError::NonFinite { .. })
    ));
    let ok = Mat::<f32>::identity(2, 2);
    for bad in [
        NsConfig::taylor(0, 5),
        NsConfig::taylor(13, 5),
        NsConfig {
            steps: 1_000_000,
            ..NsConfig::keller()
        },
        NsConfig {
            polynomial: NsPolynomial::Keller {
                a: f32::NAN,
                b: 0.0,
                c: 0.0,
            },
            ..NsConfig::keller()
        },
        NsConfig {
            normalization: Normalization::FrobeniusPlusEps { eps: 0.0 },
            ..NsConfig::keller()
        },
    ] {
        assert!(
            matches!(
                newton_schulz(ok.as_ref(), &bad),
                Err(MuonError::InvalidHyperParameter { .. })
            ),
            "{bad:?}"
        );
    }
}

#[test]
fn taylor_coefficients_expand_correctly() {
    // p_κ(λ) evaluated two ways at several λ.
    for kappa in 1..=8 {
        let poly = NsPolynomial::Taylor { kappa };
        let c = raptor_muon::ns::taylor_coefficients(kappa);
        for lam in [0.0f64, 0.1, 0.5, 0.9, 1.0, 1.5] {
            let direct: f64 = c
                .iter()
                .enumerate()
                .map(|(s, cs)| cs * (1.0 - lam).powi(s as i32))
                .sum();
            let sigma = lam.sqrt();
            let via = if sigma > 0.0 {
                poly.apply_scalar(sigma) / sigma
            } else {
                poly.coefficients_in_a()[0]
            };
            assert!((direct - via).abs() < 1e-9, "kappa {kappa} lambda {lam}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Keller's map is odd and (up to the 1e-7 eps) scale invariant.
    #[test]
    fn keller_is_odd_and_scale_invariant(seed in 0u64..1000, rows in 1usize..10, cols in 1usize..10, c in 0.01f32..100.0) {
        let mut r = rng(seed);
        let m = gaussian(&mut r, rows, cols, 1.0);
        let cfg = NsConfig::keller();
        let a = newton_schulz(m.as_ref(), &cfg).unwrap();
        let neg = Mat::<f32>::from_fn(rows, cols, |i, j| -m[(i, j)]);
        let b = newton_schulz(neg.as_ref(), &cfg).unwrap();
        let scaled = Mat::<f32>::from_fn(rows, cols, |i, j| c * m[(i, j)]);
        let s = newton_schulz(scaled.as_ref(), &cfg).unwrap();
        for i in 0..rows { for j in 0..cols {
            prop_assert!((a[(i, j)] + b[(i, j)]).abs() < 1e-6);
            prop_assert!((a[(i, j)] - s[(i, j)]).abs() < 1e-3);
        }}
    }
}
