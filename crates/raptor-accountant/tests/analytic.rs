#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The PRV bounds against closed forms and brute-force integration.

use raptor_accountant::{Accuracy, Composition, PrvAccountant, RdpAccountant, SubsampledGaussian};

/// Φ(x) via libm's erfc (within a few ulp; statrs 0.18's normal CDF is off by up to ~1e-10
/// relative, enough to put a correct certified bound below this reference).
fn phi(x: f64) -> f64 {
    0.5 * libm::erfc(-x / std::f64::consts::SQRT_2)
}

/// Exact δ(ε) of the Gaussian mechanism composed T times (Balle & Wang 2018): μ = √T/σ.
fn gaussian_delta(eps: f64, mu: f64) -> f64 {
    phi(-eps / mu + mu / 2.0) - eps.exp() * phi(-eps / mu - mu / 2.0)
}

/// δ(ε) of one step of the subsampled Gaussian, both directions, by brute-force quadrature.
fn one_step_delta(q: f64, s: f64, eps: f64) -> f64 {
    let pdf = |x: f64, m: f64| {
        (-(x - m) * (x - m) / (2.0 * s * s)).exp() / (s * (2.0 * std::f64::consts::PI).sqrt())
    };
    let (lo, hi, n) = (-20.0 * s - 1.0, 20.0 * s + 2.0, 400_000);
    let dx = (hi - lo) / n as f64;
    let (mut rem, mut add) = (0.0, 0.0);
    for i in 0..n {
        let x = lo + (i as f64 + 0.5) * dx;
        let p = (1.0 - q) * pdf(x, 0.0) + q * pdf(x, 1.0);
        let qq = pdf(x, 0.0);
        rem += (p - eps.exp() * qq).max(0.0) * dx;
        add += (qq - eps.exp() * p).max(0.0) * dx;
    }
    rem.max(add)
}

#[test]
fn gaussian_composition_matches_closed_form() {
    let acc = PrvAccountant::new(Accuracy::relative(0.005)).unwrap();
    for &(sigma, t) in &[(2.0, 1u64), (5.0, 100), (20.0, 10_000)] {
        let c = Composition::single(SubsampledGaussian::gaussian(sigma).unwrap(), t).unwrap();
        let mu = (t as f64).sqrt() / sigma;
        for &eps in &[0.5, 1.0, 2.0] {
            let exact = gaussian_delta(eps, mu);
            if exact < 1e-10 {
                continue;
            }
            let b = acc.delta(&c, eps).unwrap();
            assert!(
                b.lower <= exact && exact <= b.upper,
                "sigma={sigma} T={t} eps={eps}: {b:?} vs {exact}"
            );
            assert!(
                (b.estimate - exact).abs() <= 0.02 * exact + 1e-12,
                "estimate {b:?} vs {exact}"
            );
            // Over many steps the estimate removes the pessimistic grid's accumulated excess
            // (δ_w at ε + excess): it lies nearer the truth than the certified upper bound,
            // which keeps it. (One step has no accumulated excess to remove: its bound is
            // within 1e-12 of the truth.)
            assert!(
                t < 100 || (b.estimate - exact).abs() < b.upper - exact,
                "sigma={sigma} T={t} eps={eps}: estimate no better than the upper bound: {b:?} vs {exact}"
            );
        }
        let delta = 1e-6;
        let e = acc.epsilon(&c, delta).unwrap();
        // The exact δ at the certified ε's: upper must be feasible, lower infeasible.
        assert!(gaussian_delta(e.upper, mu) <= delta * (1.0 + 1e-9), "{e:?}");
        assert!(
            e.lower == 0.0 || gaussian_delta(e.lower, mu) >= delta,
            "{e:?}"
        );
    }
}

#[test]
fn one_step_subsampled_matches_quadrature() {
    let acc = PrvAccountant::new(Accuracy::relative(0.005)).unwrap();
    for &(q, s) in &[(0.01, 0.7), (0.1, 1.0), (0.5, 2.0)] {
        let c = Composition::single(SubsampledGaussian::new(q, s).unwrap(), 1).unwrap();
        for &eps in &[0.01, 0.1, 0.5] {
            let exact = one_step_delta(q, s, eps);
            let b = acc.delta(&c, eps).unwrap();
            assert!(
                b.lower <= exact * (1.0 + 1e-6) && exact <= b.upper * (1.0 + 1e-6),
                "q={q} s={s} eps={eps}: {b:?} vs {exact}"
            );
        }
    }
}

#[test]
fn rdp_is_an_upper_bound_consistent_with_prv() {
    let acc = PrvAccountant::default();
    for &(q, s, t) in &[(0.01, 1.0, 1000u64), (0.1, 2.0, 100), (1.0, 10.0, 50)] {
        let c = Composition::single(SubsampledGaussian::new(q, s).unwrap(), t).unwrap();
        let prv = acc.epsilon(&c, 1e-5).unwrap();
        let rdp = RdpAccountant::default().epsilon(&c, 1e-5).unwrap();
        // RDP is a valid but looser bound: it must not be below the PRV lower bound.
        assert!(rdp.epsilon >= prv.lower, "{rdp:?} vs {prv:?}");
        assert!(rdp.epsilon <= 2.0 * prv.upper + 0.1, "{rdp:?} vs {prv:?}");
    }
}

#[test]
fn gaussian_rdp_matches_closed_form() {
    // RDP of T Gaussian steps is αT/(2σ²); the conversion's minimum over the default orders must
    // be at least the continuous minimum.
    let (sigma, t, delta) = (4.0, 100u64, 1e-5);
    let c = Composition::single(SubsampledGaussian::gaussian(sigma).unwrap(), t).unwrap();
    let e = RdpAccountant::default().epsilon(&c, delta).unwrap();
    let rho = t as f64 / (2.0 * sigma * sigma);
    let mut best = f64::INFINITY;
    for i in 1..200_000 {
        let a = 1.0 + i as f64 * 1e-3;
        best = best.min(a * rho + ((a - 1.0) / a).ln() - (delta.ln() + a.ln()) / (a - 1.0));
    }
    assert!(
        e.epsilon >= best - 1e-9 && e.epsilon <= best * 1.02,
        "{e:?} vs {best}"
    );
}

/// The exact ε(δ) of T Gaussian steps (bisection on the closed form to 1e-14 relative).
fn gaussian_epsilon(delta: f64, mu: f64) -> f64 {
    let (mut lo, mut hi) = (0.0_f64, 1.0_f64);
    while gaussian_delta(hi, mu) > delta {
        hi *= 2.0;
    }
    while hi - lo > 1e-14 * hi {
        let mid = 0.5 * (lo + hi);
        if gaussian_delta(mid, mu) > delta {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// Against the closed form (Balle & Wang 2018): the default certified ε is never below the
/// truth (a 1e-9 relative under-report fails) and within 0.01 % above it; the tight preset is
/// within 0.001 %, or 0.002 % where the FFT's round-off allowance (≈ N·1e-15 of δ) is not small
/// against δ (T = 10⁴, δ = 1e-8: +1.4e-5).
#[test]
fn gaussian_upper_bound_is_sound_and_within_the_preset_accuracy() {
    for &(sigma, t) in &[
        (2.0, 1u64),
        (2.0, 2),
        (8.0, 1),
        (5.0, 100),
        (20.0, 10_000),
        (1.0, 10),
    ] {
        let c = Composition::single(SubsampledGaussian::gaussian(sigma).unwrap(), t).unwrap();
        let mu = (t as f64).sqrt() / sigma;
        for &delta in &[1e-5, 1e-8] {
            let exact = gaussian_epsilon(delta, mu);
            for (name, acc, rel) in [
                ("fast", Accuracy::fast(), 1e-3),
                ("default", Accuracy::default(), 1e-4),
                (
                    "tight",
                    Accuracy::tight(),
                    if (t as f64) * 1e-12 > 1e-3 * delta {
                        2e-5
                    } else {
                        1e-5
                    },
                ),
            ] {
                let e = PrvAccountant::new(acc).unwrap().epsilon(&c, delta).unwrap();
                assert!(
                    e.upper >= exact * (1.0 - 1e-9),
                    "{name} sigma={sigma} T={t} delta={delta}: upper {} < exact {exact}",
                    e.upper
                );
                assert!(
                    e.upper <= exact * (1.0 + rel),
                    "{name} sigma={sigma} T={t} delta={delta}: upper {} vs exact {exact} ({:+.2e})",
                    e.upper,
                    e.upper / exact - 1.0
                );
                assert!(e.lower <= exact, "{name}: {e:?} vs {exact}");
            }
        }
    }
}

/// δ(ε) against the closed form: the default certified δ is never below the exact δ(ε) and at
/// most the exact δ at ε·(1 − 1e-4) (the ε tolerance, relative to ε when ε ≥ the loss's sd),
/// for δ ≥ 1e-10 (below, the FFT's round-off floor, about 1e-13 here, dominates).
#[test]
fn gaussian_delta_upper_bound_is_sound_and_within_the_tolerance() {
    let acc = PrvAccountant::default();
    let mut checked = 0;
    for &(sigma, t) in &[(2.0, 1u64), (5.0, 100), (20.0, 10_000), (1.0, 10)] {
        let c = Composition::single(SubsampledGaussian::gaussian(sigma).unwrap(), t).unwrap();
        let mu = (t as f64).sqrt() / sigma;
        for k in [1.5, 2.5, 4.0] {
            let eps = k * mu.max(mu * mu / 2.0);
            let exact = gaussian_delta(eps, mu);
            if exact < 1e-10 {
                continue;
            }
            let b = acc.delta(&c, eps).unwrap();
            assert!(
                b.upper >= exact * (1.0 - 1e-9),
                "sigma={sigma} T={t} eps={eps}: {b:?} < {exact}"
            );
            let looser = gaussian_delta(eps * (1.0 - 1e-4), mu);
            assert!(
                b.upper <= looser,
                "sigma={sigma} T={t} eps={eps}: {b:?} vs exact {exact}, at eps(1-1e-4) {looser}"
            );
            assert!(b.lower <= exact, "{b:?} vs {exact}");
            checked += 1;
        }
    }
    assert!(checked >= 8, "{checked}");
}
