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

mod closed_form {
    //! The three descriptions of a momentum form agree: the coefficients of one step
    //! (`MomentumForm::coefficients`, what `raptor-optim` computes with), the slice update in
    //! torch's `lerp` form (`momentum_update`) and the closed form over all steps
    //! (`update_weights`); and the noise variance step by step (`RunningNoiseVariance`) is the
    //! closed form `Σ w_k² v_k`, which `buffer_noise_variance` is for a constant `v`.

    use super::FORMS;
    use proptest::prelude::*;
    use raptor_muon::{
        MomentumForm, NoiseSpec, RunningNoiseVariance, buffer_noise_variance, momentum_update,
        update_weights,
    };

    fn form() -> impl Strategy<Value = MomentumForm> {
        (0usize..3).prop_map(|i| FORMS[i])
    }

    /// Gradients (`t` steps of `n` entries) in [−4, 4].
    fn grads() -> impl Strategy<Value = Vec<Vec<f32>>> {
        (1usize..6, 1usize..20).prop_flat_map(|(n, t)| {
            prop::collection::vec(prop::collection::vec(-4.0f32..4.0, n), t)
        })
    }

    /// One step with the coefficients, in f64 (the new buffer, what is orthogonalized).
    fn coefficient_step(
        form: MomentumForm,
        beta: f64,
        m: &[f64],
        g: &[f64],
    ) -> (Vec<f64>, Vec<f64>) {
        let c = form.coefficients(beta);
        let m_new: Vec<f64> = m
            .iter()
            .zip(g)
            .map(|(m, g)| c.buffer_decay * m + c.buffer_gain * g)
            .collect();
        let u = match c.look_ahead {
            None => m_new.clone(),
            Some(la) => m
                .iter()
                .zip(g)
                .map(|(m, g)| la.gradient * g + la.buffer * m)
                .collect(),
        };
        (m_new, u)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// At every step, what is orthogonalized is `Σ_k w_k g_k`: computed with the
        /// coefficients in f64 (to 1e-12 of `Σ |w_k g_k|`) and with the f32 slice update (to
        /// f32 round-off over the steps).
        #[test]
        fn coefficients_and_slices_follow_the_closed_form(
            form in form(),
            beta in 0.0f64..0.995,
            gs in grads(),
        ) {
            let n = gs[0].len();
            let (mut m64, mut buf, mut out) = (vec![0.0f64; n], vec![0.0f32; n], vec![0.0f32; n]);
            for t in 1..=gs.len() {
                let g64: Vec<f64> = gs[t - 1].iter().map(|&v| v as f64).collect();
                let (m_new, u) = coefficient_step(form, beta, &m64, &g64);
                m64 = m_new;
                momentum_update(form, beta, &mut buf, &gs[t - 1], &mut out).unwrap();
                let w = update_weights(form, beta, t as u64).unwrap();
                prop_assert_eq!(w.len(), t);
                for i in 0..n {
                    let want: f64 = w.iter().zip(&gs).map(|(w, g)| w * g[i] as f64).sum();
                    let scale: f64 = w.iter().zip(&gs).map(|(w, g)| (w * g[i] as f64).abs()).sum();
                    prop_assert!(
                        (u[i] - want).abs() <= 1e-12 * scale + 1e-300,
                        "{:?} β {} t {}: coefficients {} vs closed form {}", form, beta, t, u[i], want
                    );
                    // f32: a few roundings per step, each relative to the terms' size.
                    let tol = 4.0 * (t as f64 + 2.0) * f32::EPSILON as f64 * (scale + 4.0);
                    prop_assert!(
                        (out[i] as f64 - want).abs() <= tol,
                        "{:?} β {} t {}: slices {} vs closed form {}", form, beta, t, out[i], want
                    );
                }
            }
        }

        /// The running variance is `Σ_k w_k² v_k` for any per-step variances, and
        /// `buffer_noise_variance` when they are constant (both to 1e-12 relative).
        #[test]
        fn running_variance_is_the_closed_form(
            form in form(),
            beta in 0.0f64..0.995,
            vs in prop::collection::vec(prop_oneof![Just(0.0f64), 1e-8f64..10.0], 1..40),
            constant in 1e-8f64..10.0,
        ) {
            let (mut s, mut c) = (RunningNoiseVariance::default(), RunningNoiseVariance::default());
            let noise = NoiseSpec { sigma: constant.sqrt(), sensitivity: 1.0, denominator: 1.0 };
            for t in 1..=vs.len() {
                s = s.step(form, beta, vs[t - 1]);
                c = c.step(form, beta, noise.gradient_std().powi(2));
                let w = update_weights(form, beta, t as u64).unwrap();
                let want: f64 = w.iter().zip(&vs).map(|(w, v)| w * w * v).sum();
                prop_assert!((s.update - want).abs() <= 1e-12 * want, "{:?} β {} t {}", form, beta, t);
                let closed = buffer_noise_variance(form, &noise, beta, t as u64).unwrap();
                prop_assert!(
                    (c.update - closed).abs() <= 1e-12 * closed,
                    "{:?} β {} t {}: running {} vs closed form {}", form, beta, t, c.update, closed
                );
                // The buffer's own variance: the update's for the forms without a look-ahead.
                if form.coefficients(beta).look_ahead.is_none() {
                    prop_assert_eq!(s.buffer, s.update);
                }
            }
        }

        /// The recursion is the written-out formulas of each form, bit for bit (the ones the
        /// tensor optimizers used before they took them from here: a checkpoint's running
        /// variances stay valid).
        #[test]
        fn running_variance_is_bitwise_the_written_out_recursion(
            beta in 0.0f64..0.999,
            buffer in 0.0f64..10.0,
            v in 0.0f64..10.0,
        ) {
            let prev = RunningNoiseVariance { buffer, update: buffer };
            let hb = prev.step(MomentumForm::HeavyBall, beta, v);
            prop_assert_eq!(hb.update.to_bits(), (beta * beta * buffer + v).to_bits());
            let ema = prev.step(MomentumForm::Ema, beta, v);
            let want = beta * beta * buffer + (1.0 - beta) * (1.0 - beta) * v;
            prop_assert_eq!(ema.update.to_bits(), want.to_bits());
            let nes = prev.step(MomentumForm::Nesterov, beta, v);
            let want_u = (1.0 - beta * beta).powi(2) * v + beta.powi(4) * buffer;
            let want_b = beta * beta * buffer + (1.0 - beta).powi(2) * v;
            prop_assert_eq!(nes.update.to_bits(), want_u.to_bits());
            prop_assert_eq!(nes.buffer.to_bits(), want_b.to_bits());
        }
    }

    #[test]
    fn update_weights_rejects_what_the_closed_form_does_not_cover() {
        for form in FORMS {
            assert!(update_weights(form, 0.9, 0).is_err());
            assert!(update_weights(form, 1.0, 3).is_err());
            assert!(update_weights(form, -0.1, 3).is_err());
            assert!(update_weights(form, f64::NAN, 3).is_err());
            // β = 0: the gradient alone.
            assert_eq!(update_weights(form, 0.0, 3).unwrap(), vec![0.0, 0.0, 1.0]);
        }
    }
}
