//! DP-MuonBC: the bias test on planted matrices (Monte Carlo, fixed seed, stated margin), the
//! exact form of the estimator, and the safeguards.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use faer::Mat;
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};
use raptor_muon::{
    BcConfig, Fallback, MomentumForm, Muon, MuonConfig, MuonError, NoiseSpec, NsConfig,
    bias_corrected_direction, buffer_noise_variance, newton_schulz, probe_rng_os, probe_rng_seeded,
};

/// THE DP-MuonBC bias test. Planted 6 × 10 matrix with singular values spread 8:1
/// (0.6 … 0.075, ‖M‖_F ≈ 0.8), both NS variants, several noise levels, 6 000 seeded noise draws
/// each, K = 1 antithetic pair, τ = s. Passes only if, at every level, the corrected direction's
/// bias is smaller than the plain one by more than 6 Monte Carlo standard errors of the paired
/// difference D = ‖bias_plain‖² − ‖bias_BC‖² (a one-sided z > 6 has probability < 1e-9 under
/// "no improvement"; the observed z are 15–60), AND by at least a factor of 2 in norm.
///
/// The levels are those where the second-order (heat-smoothing) expansion holds: s small next to
/// the smallest singular value divided by the NS map's amplification of it (1.875⁵ ≈ 23 for
/// p₂, 3.4445⁵ ≈ 480 for Keller's quintic). Beyond that (Keller at s ≈ 0.01–0.02 here) the
/// iterated quintic is too wiggly on the noise scale and the correction does not help — see the
/// crate README and `raptor reproduce` part "muon", which shows that window.
#[test]
fn bias_correction_reduces_bias_on_planted_matrices() {
    let sv: Vec<f64> = (0..6)
        .map(|i| 0.6 * (1.0f64 / 8.0).powf(i as f64 / 5.0))
        .collect();
    let m = raptor_muon::diagnostics::planted_matrix(6, 10, &sv, 5).unwrap();
    let cases = [
        (
            "taylor k=2 q=5",
            NsConfig::taylor(2, 5),
            [0.005f64, 0.01, 0.02],
        ),
        ("keller q=5", NsConfig::keller(), [0.001f64, 0.002, 0.005]),
    ];
    for (name, ns, levels) in cases {
        for (level, s) in levels.into_iter().enumerate() {
            let b = raptor_muon::diagnostics::bias_monte_carlo(
                m.as_ref(),
                s,
                &ns,
                &BcConfig::default(),
                6000,
                100 + level as u64,
            )
            .unwrap();
            eprintln!(
                "{name} s={s}: plain {:.4} ± {:.4}, BC {:.4} ± {:.4}, D = {:.3e} ± {:.1e} (z = {:.1})",
                b.plain,
                b.plain_se,
                b.corrected,
                b.corrected_se,
                b.diff_sq,
                b.diff_sq_se,
                b.diff_sq / b.diff_sq_se
            );
            assert!(
                b.diff_sq > 6.0 * b.diff_sq_se,
                "{name} s={s}: D = {} not > 6 SE = {}",
                b.diff_sq,
                6.0 * b.diff_sq_se
            );
            assert!(
                b.corrected * 2.0 < b.plain,
                "{name} s={s}: BC bias {} not 2x below plain {}",
                b.corrected,
                b.plain
            );
        }
    }
}

/// With τ = s and K = 1, O_BC = 2 f(M̃) − (f(M̃ + sξ) + f(M̃ − sξ))/2, with ξ drawn column-major.
#[test]
fn estimator_has_the_documented_form() {
    let mut r = rng(21);
    let mt = gaussian(&mut r, 5, 8, 0.2);
    let ns = NsConfig::taylor(2, 5);
    let s = 0.03f64;
    let out = bias_corrected_direction(
        mt.as_ref(),
        s,
        &ns,
        &BcConfig::default(),
        &mut probe_rng_seeded(5),
    )
    .unwrap();
    let mut pr = probe_rng_seeded(5);
    let mut xi = Mat::<f32>::zeros(5, 8);
    for j in 0..8 {
        for i in 0..5 {
            xi[(i, j)] = StandardNormal.sample(&mut pr);
        }
    }
    let plus = Mat::<f32>::from_fn(5, 8, |i, j| mt[(i, j)] + s as f32 * xi[(i, j)]);
    let minus = Mat::<f32>::from_fn(5, 8, |i, j| mt[(i, j)] - s as f32 * xi[(i, j)]);
    let f = newton_schulz(mt.as_ref(), &ns).unwrap();
    let fp = newton_schulz(plus.as_ref(), &ns).unwrap();
    let fm = newton_schulz(minus.as_ref(), &ns).unwrap();
    for i in 0..5 {
        for j in 0..8 {
            let want = 2.0 * f[(i, j)] - 0.5 * (fp[(i, j)] + fm[(i, j)]);
            assert!((out.direction[(i, j)] - want).abs() < 1e-6);
        }
    }
    assert_eq!(out.fallback, Fallback::None);
    assert_eq!(out.coefficient, 1.0);
    assert_eq!(out.tau, s);
}

#[test]
fn safeguards() {
    let mut r = rng(22);
    let mt = gaussian(&mut r, 4, 6, 0.2);
    let ns = NsConfig::keller();
    // s = 0: plain direction, no probes.
    let out = bias_corrected_direction(
        mt.as_ref(),
        0.0,
        &ns,
        &BcConfig::default(),
        &mut probe_rng_seeded(1),
    )
    .unwrap();
    assert_eq!(out.fallback, Fallback::NoNoise);
    assert_eq!(out.direction, out.plain);
    // τ = s/2 wants coefficient 4: capped at 1 by default, 4 when allowed.
    let half = BcConfig {
        tau: Some(0.005),
        ..BcConfig::default()
    };
    let out =
        bias_corrected_direction(mt.as_ref(), 0.01, &ns, &half, &mut probe_rng_seeded(1)).unwrap();
    assert_eq!(out.coefficient, 1.0);
    let loose = BcConfig {
        max_coefficient: 10.0,
        ..half
    };
    let out =
        bias_corrected_direction(mt.as_ref(), 0.01, &ns, &loose, &mut probe_rng_seeded(1)).unwrap();
    assert!((out.coefficient - 4.0).abs() < 1e-12);
    // Norm cap: with a huge noise level the extrapolation overshoots; ratio 1 bounds it.
    let tight = BcConfig {
        max_norm_ratio: 1.0,
        ..BcConfig::default()
    };
    let out =
        bias_corrected_direction(mt.as_ref(), 5.0, &ns, &tight, &mut probe_rng_seeded(1)).unwrap();
    let norm = |x: &Mat<f32>| {
        x.col_iter()
            .flat_map(|c| c.iter().map(|v| (*v as f64).powi(2)).collect::<Vec<_>>())
            .sum::<f64>()
            .sqrt()
    };
    assert!(norm(&out.direction) <= norm(&out.plain) * (1.0 + 1e-5));
    assert!(out.rescaled);
    // Non-finite probe (overflow in M̃ + τξ) falls back to the plain direction.
    // (τ = 1e39 is finite in f64 but overflows f32, so M̃ ± τξ is infinite.)
    let out = bias_corrected_direction(
        mt.as_ref(),
        1e39,
        &ns,
        &BcConfig::default(),
        &mut probe_rng_seeded(3),
    )
    .unwrap();
    assert_eq!(out.fallback, Fallback::NonFinite);
    assert_eq!(out.direction, out.plain);
    // Bad settings.
    for bad in [
        BcConfig {
            probe_pairs: 0,
            ..BcConfig::default()
        },
        BcConfig {
            tau: Some(0.0),
            ..BcConfig::default()
        },
        BcConfig {
            max_coefficient: 0.0,
            ..BcConfig::default()
        },
        BcConfig {
            max_norm_ratio: 0.5,
            ..BcConfig::default()
        },
    ] {
        let e = bias_corrected_direction(mt.as_ref(), 0.1, &ns, &bad, &mut probe_rng_seeded(1));
        assert!(
            matches!(e, Err(MuonError::InvalidHyperParameter { .. })),
            "{bad:?}"
        );
    }
    assert!(
        bias_corrected_direction(
            mt.as_ref(),
            -1.0,
            &ns,
            &BcConfig::default(),
            &mut probe_rng_seeded(1)
        )
        .is_err()
    );
}

#[test]
fn seeded_probes_are_reproducible_and_os_probes_work() {
    let mut r = rng(23);
    let mt = gaussian(&mut r, 4, 6, 0.2);
    let ns = NsConfig::taylor(2, 5);
    let bc = BcConfig {
        probe_pairs: 3,
        ..BcConfig::default()
    };
    let a =
        bias_corrected_direction(mt.as_ref(), 0.02, &ns, &bc, &mut probe_rng_seeded(9)).unwrap();
    let b =
        bias_corrected_direction(mt.as_ref(), 0.02, &ns, &bc, &mut probe_rng_seeded(9)).unwrap();
    assert_eq!(a.direction, b.direction);
    let mut os = probe_rng_os();
    let _: u64 = os.random();
    let c = bias_corrected_direction(mt.as_ref(), 0.02, &ns, &bc, &mut os).unwrap();
    assert_ne!(a.direction, c.direction);
    assert_eq!(c.fallback, Fallback::None);
}

/// Muon::step_bc uses the exact variance of the update for its momentum form and step.
#[test]
fn muon_step_bc_uses_the_buffer_variance() {
    let noise = NoiseSpec {
        sigma: 0.8,
        sensitivity: 1.5,
        denominator: 64.0,
    };
    for form in [
        MomentumForm::HeavyBall,
        MomentumForm::Ema,
        MomentumForm::Nesterov,
    ] {
        let cfg = MuonConfig {
            form,
            ..MuonConfig::dp_muon(0.01, 0.9, 2, 5)
        };
        let mut muon = Muon::new(cfg, 3, 4).unwrap();
        let mut p = vec![0.1f32; 12];
        let mut r = rng(24);
        for t in 1..=3u64 {
            let g: Vec<f32> = (0..12).map(|_| StandardNormal.sample(&mut r)).collect();
            let out = muon
                .step_bc(
                    &mut p,
                    &g,
                    &noise,
                    &BcConfig::default(),
                    &mut probe_rng_seeded(t),
                )
                .unwrap();
            let want = buffer_noise_variance(form, &noise, 0.9, t).unwrap().sqrt();
            assert!((out.noise_std - want).abs() < 1e-12);
            assert!(p.iter().all(|v| v.is_finite()));
        }
    }
}
