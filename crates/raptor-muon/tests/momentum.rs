//! Momentum forms, lr adjustment, weight decay and the Muon step against hand-written loops,
//! and the buffer noise-variance formulas against Monte Carlo simulation of the buffer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use rand_distr::{Distribution, StandardNormal};
use raptor_muon::reference::newton_schulz_via_svd;
use raptor_muon::{
    LrAdjust, MomentumForm, Muon, MuonConfig, MuonError, NoiseSpec, NsConfig,
    buffer_noise_variance, momentum_update,
};

const FORMS: [MomentumForm; 3] = [
    MomentumForm::HeavyBall,
    MomentumForm::Ema,
    MomentumForm::Nesterov,
];

/// Hand loop in f64, written from the definitions (not torch's lerp form).
fn hand_momentum(form: MomentumForm, beta: f64, buf: &mut [f64], g: &[f64]) -> Vec<f64> {
    let mut out = vec![0.0; g.len()];
    for i in 0..g.len() {
        match form {
            MomentumForm::HeavyBall => {
                buf[i] = beta * buf[i] + g[i];
                out[i] = buf[i];
            }
            MomentumForm::Ema => {
                buf[i] = beta * buf[i] + (1.0 - beta) * g[i];
                out[i] = buf[i];
            }
            MomentumForm::Nesterov => {
                buf[i] = beta * buf[i] + (1.0 - beta) * g[i];
                out[i] = (1.0 - beta) * g[i] + beta * buf[i];
            }
        }
    }
    out
}

#[test]
fn momentum_forms_match_hand_loops() {
    let mut r = rng(10);
    let n = 257;
    for form in FORMS {
        for beta in [0.0, 0.5, 0.9, 0.95] {
            let mut buf = vec![0.0f32; n];
            let mut out = vec![0.0f32; n];
            let mut hbuf = vec![0.0f64; n];
            for _ in 0..20 {
                let g: Vec<f32> = (0..n).map(|_| StandardNormal.sample(&mut r)).collect();
                let g64: Vec<f64> = g.iter().map(|&v| v as f64).collect();
                momentum_update(form, beta, &mut buf, &g, &mut out).unwrap();
                let want = hand_momentum(form, beta, &mut hbuf, &g64);
                for i in 0..n {
                    assert!(
                        (out[i] as f64 - want[i]).abs() < 1e-5,
                        "{form:?} beta {beta}"
                    );
                    assert!((buf[i] as f64 - hbuf[i]).abs() < 1e-5);
                }
            }
        }
    }
}

#[test]
fn muon_step_matches_hand_loop() {
    let mut r = rng(11);
    let (rows, cols) = (9usize, 5usize);
    for form in FORMS {
        for (adj, wd) in [
            (LrAdjust::None, 0.0),
            (LrAdjust::Original, 0.1),
            (LrAdjust::MatchRmsAdamW, 0.01),
        ] {
            for ns in [NsConfig::keller(), NsConfig::taylor(2, 5)] {
                let cfg = MuonConfig {
                    lr: 0.02,
                    beta: 0.9,
                    form,
                    ns,
                    lr_adjust: adj,
                    weight_decay: wd,
                };
                let mut muon = Muon::new(cfg, rows, cols).unwrap();
                let mut p: Vec<f32> = (0..rows * cols)
                    .map(|_| StandardNormal.sample(&mut r))
                    .collect();
                let mut hp: Vec<f64> = p.iter().map(|&v| v as f64).collect();
                let mut hbuf = vec![0.0f64; rows * cols];
                for _ in 0..4 {
                    let g: Vec<f32> = (0..rows * cols).map(|_| normal(&mut r) * 0.3).collect();
                    muon.step(&mut p, &g).unwrap();
                    let g64: Vec<f64> = g.iter().map(|&v| v as f64).collect();
                    let u = hand_momentum(form, 0.9, &mut hbuf, &g64);
                    let um = faer::Mat::<f32>::from_fn(rows, cols, |i, j| u[i * cols + j] as f32);
                    let o = newton_schulz_via_svd(um.as_ref(), &ns).unwrap();
                    let factor = match adj {
                        LrAdjust::None => 1.0,
                        LrAdjust::Original => (rows as f64 / cols as f64).max(1.0).sqrt(),
                        LrAdjust::MatchRmsAdamW => 0.2 * (rows.max(cols) as f64).sqrt(),
                    };
                    for i in 0..rows {
                        for j in 0..cols {
                            let k = i * cols + j;
                            hp[k] = hp[k] * (1.0 - 0.02 * wd) - 0.02 * factor * o[(i, j)];
                            assert!(
                                (p[k] as f64 - hp[k]).abs() < 1e-4,
                                "{form:?} {adj:?} {ns:?}"
                            );
                        }
                    }
                }
                assert_eq!(muon.steps_taken(), 4);
            }
        }
    }
}

/// Simulate only the noise: gradients are i.i.d. N(0, v) per entry and step, the buffer starts at
/// zero; the sample variance of the orthogonalized input over N = 200 000 independent entries must
/// match the formula. The sample variance of N Gaussians has relative std sqrt(2/(N−1)) ≈ 0.32 %;
/// the tolerance is 6 of those (a correct formula fails with probability < 1e-8 per check).
#[test]
fn noise_variance_formulas_match_monte_carlo() {
    let mut r = rng(12);
    let n = 200_000usize;
    let noise = NoiseSpec {
        sigma: 1.3,
        sensitivity: 2.0,
        denominator: 16.0,
    };
    let std = noise.gradient_std() as f32;
    for form in FORMS {
        for beta in [0.0, 0.5, 0.9] {
            let mut buf = vec![0.0f32; n];
            let mut out = vec![0.0f32; n];
            let mut g = vec![0.0f32; n];
            for t in 1..=12u64 {
                for v in g.iter_mut() {
                    let z: f32 = StandardNormal.sample(&mut r);
                    *v = z * std;
                }
                momentum_update(form, beta, &mut buf, &g, &mut out).unwrap();
                if ![1u64, 2, 3, 5, 12].contains(&t) {
                    continue;
                }
                let mean: f64 = out.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
                let var: f64 =
                    out.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
                let want = buffer_noise_variance(form, &noise, beta, t).unwrap();
                let tol = 6.0 * want * (2.0 / (n - 1) as f64).sqrt();
                assert!(
                    (var - want).abs() < tol,
                    "{form:?} beta {beta} t {t}: MC {var} vs formula {want} (tol {tol})"
                );
            }
        }
    }
}

#[test]
fn variance_formula_limits() {
    let noise = NoiseSpec {
        sigma: 1.0,
        sensitivity: 1.0,
        denominator: 1.0,
    };
    // beta = 0: every form is the raw gradient noise.
    for form in FORMS {
        assert!((buffer_noise_variance(form, &noise, 0.0, 7).unwrap() - 1.0).abs() < 1e-12);
    }
    // stationary limits
    let b: f64 = 0.9;
    let hb = buffer_noise_variance(MomentumForm::HeavyBall, &noise, b, 100_000).unwrap();
    assert!((hb - 1.0 / (1.0 - b * b)).abs() < 1e-9);
    let ema = buffer_noise_variance(MomentumForm::Ema, &noise, b, 100_000).unwrap();
    assert!((ema - (1.0 - b) / (1.0 + b)).abs() < 1e-9);
    // t = 1 Nesterov: (1−β²)² v
    let nes = buffer_noise_variance(MomentumForm::Nesterov, &noise, b, 1).unwrap();
    assert!((nes - (1.0 - b * b).powi(2)).abs() < 1e-12);
}

#[test]
fn bad_hyper_parameters_are_typed_errors() {
    let ok = MuonConfig::default();
    for bad in [
        MuonConfig { lr: 0.0, ..ok },
        MuonConfig { lr: f64::NAN, ..ok },
        MuonConfig { beta: 1.0, ..ok },
        MuonConfig { beta: -0.1, ..ok },
        MuonConfig {
            weight_decay: -1.0,
            ..ok
        },
        MuonConfig {
            ns: NsConfig::taylor(0, 3),
            ..ok
        },
    ] {
        assert!(
            matches!(
                Muon::new(bad, 2, 2),
                Err(MuonError::InvalidHyperParameter { .. })
            ),
            "{bad:?}"
        );
    }
    assert!(matches!(
        Muon::new(ok, 0, 2),
        Err(MuonError::EmptyMatrix { .. })
    ));
    let mut m = Muon::new(ok, 2, 2).unwrap();
    let mut p = vec![0.0f32; 4];
    assert!(matches!(
        m.step(&mut p, &[0.0; 3]),
        Err(MuonError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        m.step(&mut p, &[0.0, f32::NAN, 0.0, 0.0]),
        Err(MuonError::NonFinite { index: 1, .. })
    ));
    let noise = NoiseSpec {
        sigma: 1.0,
        sensitivity: 1.0,
        denominator: 1.0,
    };
    assert!(buffer_noise_variance(MomentumForm::Ema, &noise, 0.9, 0).is_err());
    assert!(
        buffer_noise_variance(
            MomentumForm::Ema,
            &NoiseSpec {
                denominator: 0.0,
                ..noise
            },
            0.9,
            1
        )
        .is_err()
    );
    assert!(
        buffer_noise_variance(
            MomentumForm::Ema,
            &NoiseSpec {
                sigma: -1.0,
                ..noise
            },
            0.9,
            1
        )
        .is_err()
    );
}
