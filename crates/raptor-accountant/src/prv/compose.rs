//! The FFT composition of one direction's grid pmfs (the [module docs](super): method 3,
//! round-off 1–4 and 6). [`compose_pmfs`] runs these stages in order, each a function of its
//! own:
//!
//! 1. [`untilted_window`]: the window by Chernoff bounds, the support and the mean of the sum;
//! 2. [`centre_tilt`]: the tilt λ at the expected query point, and the reference index `k_ref`;
//! 3. [`fit_tilt`]: λ halved while the tilted window would grow too far (heavy tails);
//! 4. [`fit_window`]: the window that is composed, its FFT size and `ln M_i(λ)`, `ln G`;
//! 5. [`compose_spectra`]: per part the tilted pmf ([`tilt_part`]) and its norms, the pmf's
//!    own round-off terms ([`pmf_charge`]), its spectrum raised to its count, and the product;
//! 6. [`inverse`]: the composed spectrum's norms and the inverse transform into the window;
//! 7. [`fft_roundoff`]: the FFT's and the pmf's round-off, charged at `k_ref`;
//! 8. [`untilt`]: `w_k = ŵ_k·G·e^{−λk}`, dropping the values below `k_ref` that the tilt made
//!    unusable;
//! 9. the [`ComposedDirection`]: relative round-off, truncation and the lower bound's shift.

use std::sync::{Arc, Mutex, OnceLock};

use realfft::num_complex::Complex64;
use realfft::{ComplexToReal, RealFftPlanner, RealToComplex};

use super::{
    ComposedDirection, Direction, FFT_LEVEL_C, GridPmf, LogPmf, Plan, TILT_GROWTH_MAX,
    TILT_ROUNDOFF_SHARE, Tilt, UNIT_ROUNDOFF, USABLE_FRACTION, chernoff_point,
    chernoff_point_tilted, grid_too_large, log_mgf, log_pmf, max_round_up, saddle_index,
    saddle_tilt,
};
use crate::error::{AccountantError, Result};

/// Compose grid pmfs of one direction (each `(pmf, times)`, built on `plan.h`) into a
/// [`ComposedDirection`]: the window, the tilted FFT composition and every round-off charge
/// (module docs). `hint` carries a coarser pass's tilts; `t0` is when building the pmfs
/// began (for the trace's timings).
pub(super) fn compose_pmfs(
    pmfs: &[(GridPmf, f64)],
    dir: Direction,
    plan: &Plan,
    max_points: usize,
    hint: Option<((f64, f64), (f64, f64))>,
    t0: std::time::Instant,
) -> Result<ComposedDirection> {
    let h = plan.h;
    let trace = std::env::var_os("RAPTOR_ACCOUNTANT_TRACE").is_some();
    let t_pmf = std::time::Instant::now();
    // Window by Chernoff.
    let logp: Vec<(LogPmf, f64)> = pmfs.iter().map(|(p, t)| (log_pmf(p), *t)).collect();
    // Tilts of a previous (coarser) grid, in units of 1/ε, rescaled to this grid's index units.
    let (hint_hi, hint_lo) = match hint {
        Some(((a, b), _)) => (Some(a * h), Some(b * h)),
        None => (None, None),
    };
    // The tilt and the tilted window's Chernoff parameter of a previous (coarser) grid.
    let (hint_tilt, hint_mu) = match hint {
        Some((_, (a, b))) if a.is_finite() && b.is_finite() => (Some(a), Some(b * h)),
        _ => (None, None),
    };
    let base = untilted_window(pmfs, &logp, plan.tau, hint_hi, hint_lo);
    let (lambda0, k_ref, centre) = centre_tilt(&logp, plan.tilt, h, &base, hint_tilt);
    let fitted = fit_tilt(
        &logp, plan, max_points, &base, lambda0, k_ref, hint_mu, dir, trace,
    );
    let lambda = fitted.lambda;
    if trace && lambda > 0.0 {
        let km: f64 = logp.iter().map(|(c, t)| t * log_mgf(c, lambda).1).sum();
        let kv: f64 = logp.iter().map(|(c, t)| t * log_mgf(c, lambda).2).sum();
        eprintln!(
            "{dir:?}: tilted mean {km:.1} sd {:.1} (centre {centre:?})",
            kv.sqrt()
        );
    }
    let win = fit_window(&logp, plan, max_points, &base, &fitted, k_ref)?;
    let (k_lo, n) = (win.k_lo, win.n);
    if trace {
        eprintln!(
            "{dir:?}: h={h:.3e} window=[{k_lo},{}] n={n} tilt={lambda:.3e}/index (k_ref {k_ref:.0}) pmf_lens={:?}",
            win.k_hi,
            pmfs.iter().map(|(p, _)| p.p.len()).collect::<Vec<_>>()
        );
    }

    let t1 = std::time::Instant::now();
    let (r2c, c2r) = fft_plans(n)?;
    let eta = fft_eta(n);
    let spectra = compose_spectra(pmfs, &win.ln_m, lambda, n, h, eta, &*r2c)?;
    let inv = inverse(spectra.spec, &spectra.cw, n, k_lo, &*c2r)?;
    let t2 = std::time::Instant::now();
    let n_steps: f64 = pmfs.iter().map(|(_, t)| t).sum();
    let ro = fft_roundoff(
        &spectra.norms,
        &inv,
        n,
        eta,
        lambda,
        win.ln_g - lambda * k_ref,
        &spectra.pmf,
    );
    let b_up = ro.b_up;
    if trace {
        eprintln!(
            "{dir:?}: round-off at k_ref: fft {:.3e}, pmf points {:.3e}, pmf tail coefficient {:.3e} (e2·s2 {:.3e}, e_inf·s1 {:.3e}, G·e^(-λ k_ref) {:.3e}, drift {:.3e})",
            ro.b_fft,
            ro.b_pmf,
            spectra.pmf.kappa,
            ro.e2_s2,
            ro.e_inf_s1,
            ro.at_ref.exp(),
            spectra.pmf.mgf_drift
        );
    }
    let mut w = inv.w;
    let (start, rel_untilt) = untilt(&mut w, k_lo, lambda, win.ln_g, k_ref, b_up);
    let k_lo = k_lo + start as i64;

    // The composed direction: relative round-off, truncation, the lower bound's shift.
    let u = UNIT_ROUNDOFF;
    let nf = n as f64;
    // Tables: sums of non-negative terms (up to the noise bounded above), ≤ 4n·u relative.
    let rel =
        ((1.01 * (spectra.tilt_rel + 4.0 * n_steps * u)).exp() - 1.0) + rel_untilt + 4.0 * nf * u;
    let trunc_up: f64 = pmfs.iter().map(|(p, t)| t * p.trunc_upper).sum();
    let trunc_low: f64 = pmfs.iter().map(|(p, t)| t * p.trunc_lower).sum();
    // Lower bound: Azuma–Hoeffding term t with tail η, plus the largest mean shift N·m*.
    let hoeffding = h * (n_steps * (1.0 / plan.eta).ln() / 2.0).sqrt();
    let shift_low = hoeffding + n_steps * max_round_up(h);
    let var_idx: f64 = logp.iter().map(|(c, t)| t * c.var).sum();
    let mut composed = ComposedDirection::new(
        h,
        k_lo,
        w,
        shift_low,
        (trunc_up + 2.0 * plan.tau) * (1.0 + 1e-12) + 1e-300,
        plan.eta + trunc_low + 2.0 * plan.tau,
    );
    composed.n_steps = n_steps;
    composed.sd = var_idx.max(0.0).sqrt() * h;
    composed.tilts = (base.lambda_hi / h, base.lambda_lo / h);
    composed.tilt_hint = (lambda / h, fitted.mu_used / h);
    composed.lambda = lambda;
    composed.k_ref = k_ref;
    composed.b_up = b_up;
    composed.kappa = 1.01 * spectra.pmf.kappa;
    composed.ln_ch_ref = ro.ln_ch_ref;
    // The δ-trick's step Δ = ln(1 + 1/μ) minimizes δ(x − Δ)/(1 − e^{−Δ}) for δ ∝ e^{−μx}
    // (μ the tilt in units of 1/ε, else the spread's scale); any Δ > 0 is valid.
    let mu_eps = if lambda > 0.0 {
        lambda / h
    } else {
        1.0 / (var_idx.max(0.0).sqrt() * h).max(h)
    };
    composed.dpmf = (1.0 / mu_eps).ln_1p().max(2.0 * h);
    // Aliased mass from above the window (≤ τ·e^{−λ(k0 − k_ref)}) counts in the lower bound.
    composed.b_low = b_up + plan.tau;
    composed.rel = rel;
    composed.coarser = fitted.coarser;
    if start > 0 || win.raised {
        composed.lowest = k_lo as f64 * h;
    }
    if trace {
        eprintln!(
            "{dir:?}: pmf {:?} window {:?} fft {:?} tables {:?} (dropped {start} points below)",
            t_pmf - t0,
            t1 - t_pmf,
            t2 - t1,
            t2.elapsed()
        );
    }
    Ok(composed)
}

/// The untilted window of the composed index sum and what the later stages need of it (stage
/// 1).
#[derive(Debug, Clone, Copy)]
pub(super) struct UntiltedWindow {
    /// The smallest index with (a Chernoff bound on) `P(S > k_hi) ≤ τ`, rounded up.
    pub(super) k_hi: f64,
    /// The largest index with `P(S < k_lo) ≤ τ`, rounded down.
    pub(super) k_lo: f64,
    /// The Chernoff parameters of the two sides (per grid index).
    pub(super) lambda_hi: f64,
    pub(super) lambda_lo: f64,
    /// The full support of the sum: `Σ t_i·offset_i` and `Σ t_i·(last index)_i`.
    pub(super) full_lo: f64,
    pub(super) full_hi: f64,
    /// The mean of the sum (index units).
    pub(super) mean_idx: f64,
}

/// Stage 1: the window `[k_lo, k_hi]` holding all but `tau` of the composed mass on each side
/// (Chernoff bounds from the exact log-MGFs; `hint_*` the coarser grid's parameters to start
/// from), with the sum's support and mean.
pub(super) fn untilted_window(
    pmfs: &[(GridPmf, f64)],
    logp: &[(LogPmf, f64)],
    tau: f64,
    hint_hi: Option<f64>,
    hint_lo: Option<f64>,
) -> UntiltedWindow {
    let (k_hi, lambda_hi) = chernoff_point(logp, tau, true, hint_hi);
    let (k_lo, lambda_lo) = chernoff_point(logp, tau, false, hint_lo);
    let full_lo: f64 = pmfs.iter().map(|(p, t)| t * p.offset as f64).sum();
    let full_hi: f64 = pmfs
        .iter()
        .map(|(p, t)| t * (p.offset + p.p.len() as i64 - 1) as f64)
        .sum();
    let mean_idx: f64 = logp.iter().map(|(c, t)| t * c.mean).sum();
    UntiltedWindow {
        k_hi: k_hi.ceil(),
        k_lo: k_lo.floor(),
        lambda_hi,
        lambda_lo,
        full_lo,
        full_hi,
        mean_idx,
    }
}

/// Stage 2: the tilt λ (per grid index, at most 0.5) whose tilted mean is the expected query
/// point (`tilt`), the reference index `k_ref` below which queries are not expected (−∞ and
/// λ = 0 where no tilt applies), and that centre (index units). The centre is kept inside the
/// support (above it δ is 0 and any tilt will do). `hint_tilt`: a coarser grid's tilt (in
/// units of 1/ε) to start the search from.
pub(super) fn centre_tilt(
    logp: &[(LogPmf, f64)],
    tilt: Tilt,
    h: f64,
    base: &UntiltedWindow,
    hint_tilt: Option<f64>,
) -> (f64, f64, Option<f64>) {
    let centre = match tilt {
        Tilt::Delta(d) => saddle_index(logp, d.clamp(1e-300, 0.5), h),
        Tilt::Eps(e) => Some(e / h),
    }
    .map(|c| c.min(base.mean_idx + 0.5 * (base.full_hi - base.mean_idx)));
    let (lambda, k_ref) = match centre {
        Some(c) if c.is_finite() => {
            // (At most 0.5 per grid index: steeper tilts, near the top of the support, only
            // push the untilting factors out of range.)
            let l = saddle_tilt(logp, c, hint_tilt.map(|t| t * h)).min(0.5);
            if l.is_finite() && l > 0.0 {
                (l, c - 1.0 - (2.0 / l).min(0.02 * c.abs() + 16.0))
            } else {
                (0.0, f64::NEG_INFINITY)
            }
        }
        _ => (0.0, f64::NEG_INFINITY),
    };
    (lambda, k_ref, centre)
}

/// The tilt that is kept (stage 3) and what choosing it found.
#[derive(Debug, Clone, Copy)]
pub(super) struct FittedTilt {
    /// The tilt per grid index: the saddle tilt, halved some number of times (0: untilted).
    pub(super) lambda: f64,
    /// The top of the window that keeps the tilted upper tail's aliased mass below τ (the
    /// untilted top where there is no tilt).
    pub(super) tilted_hi: f64,
    /// The tilted window's Chernoff parameter (per grid index; NaN if none was computed).
    pub(super) mu_used: f64,
    /// 1, or the factor by which a coarser grid would have kept the tilt within the point
    /// limit.
    pub(super) coarser: f64,
}

/// `ln G(λ) = Σ_i t_i ln M_i(λ)` of the parts (0 for λ ≤ 0).
fn ln_g_of(logp: &[(LogPmf, f64)], l: f64) -> f64 {
    logp.iter()
        .map(|(c, t)| if l > 0.0 { t * log_mgf(c, l).0 } else { 0.0 })
        .sum()
}

/// Stage 3: with a tilt, mass above the window aliases into it amplified by `e^{λ(k − r)}`: the
/// top of the window also bounds `Σ_{k > K_hi} w_k e^{λ(k − k_ref)}` by τ (module docs,
/// round-off). Where the tilted upper tail reaches far beyond the untilted window (heavy
/// per-step tails), the tilt is halved until the window grows by at most a quarter (fourfold
/// for a pass centred on a known ε), or up to [`TILT_GROWTH_MAX`]-fold where halving would cost
/// tightness: a smaller tilt only makes the round-off bound less relative to δ.
#[allow(clippy::too_many_arguments)]
pub(super) fn fit_tilt(
    logp: &[(LogPmf, f64)],
    plan: &Plan,
    max_points: usize,
    base: &UntiltedWindow,
    lambda0: f64,
    k_ref: f64,
    hint_mu: Option<f64>,
    dir: Direction,
    trace: bool,
) -> FittedTilt {
    let (h, eps_error, u) = (plan.h, plan.eps_error, UNIT_ROUNDOFF);
    let (k_hi, k_lo, full_lo) = (base.k_hi, base.k_lo, base.full_lo);
    let mut lambda = lambda0;
    let base_width = k_hi - k_lo.max(full_lo);
    let n_steps_all: f64 = logp.iter().map(|(_, t)| t).sum();
    // ln of the Chernoff factor G·e^{−λ k_ref} at the saddle tilt: about δ at the centre. The
    // FFT's round-off is charged relative to this factor at the tilt finally used, about
    // n_steps·η times it (module docs, round-off, 3).
    let ln_c0 = ln_g_of(logp, lambda0) - lambda0 * k_ref;
    let mut tilted_hi = k_hi;
    let mut coarser = 1.0_f64;
    let mut mu_start = hint_mu;
    let mut mu_used = f64::NAN;
    for _ in 0..12 {
        if lambda.is_nan() || lambda <= 0.0 {
            break;
        }
        let ln_inv = (1.0 / plan.tau).ln() + ln_g_of(logp, lambda) - lambda * k_ref;
        tilted_hi = k_hi;
        if ln_inv > 0.0 {
            let (kt, mu) = chernoff_point_tilted(logp, lambda, ln_inv, true, mu_start.take());
            mu_used = mu;
            tilted_hi = if kt.is_finite() {
                k_hi.max(kt.ceil())
            } else {
                f64::INFINITY
            };
        }
        // A coarse pass (centre from a saddle-point estimate) keeps its window within 1.25×; a
        // pass centred on a known ε may grow it fourfold.
        let growth = if matches!(plan.tilt, Tilt::Eps(_)) {
            3.0
        } else {
            0.25
        };
        let extra = tilted_hi - k_hi;
        if extra <= growth * base_width.max(16.0) {
            break;
        }
        // Beyond that the window may grow up to `TILT_GROWTH_MAX`-fold (and a quarter of the
        // grid limit) where halving the tilt would cost tightness: where the FFT's round-off,
        // relative to the halved tilt's Chernoff factor, would exceed `TILT_ROUNDOFF_SHARE` of
        // the tolerance in ε (the charge moves ε by about charge/(δ·λ/h), δ ≈ the saddle
        // tilt's factor). Heavy per-step tails (small q and σ, small δ) need this.
        let half = 0.5 * lambda;
        let width = (tilted_hi - k_lo.max(full_lo)).max(16.0);
        let eta_est = FFT_LEVEL_C * width.log2() * u;
        let ln_delta = if plan.delta_hint > 0.0 {
            plan.delta_hint.ln()
        } else {
            ln_c0
        };
        let ln_loss =
            (3.0 * n_steps_all * eta_est).ln() + ln_g_of(logp, half) - half * k_ref - ln_delta;
        let allowed = TILT_ROUNDOFF_SHARE * eps_error * lambda0 / h;
        let costly = ln_loss >= allowed.ln() || ln_loss.is_nan();
        let within_growth = width <= TILT_GROWTH_MAX * base_width.max(16.0);
        let within_points = width <= 0.25 * max_points as f64;
        if costly && within_growth && within_points {
            break;
        }
        if costly && within_growth {
            // Only the grid limit forces the halving: a grid this much coarser would keep the
            // tilt (the window's width scales like 1/h).
            coarser = coarser.max(width / (0.25 * max_points as f64));
        }
        lambda = half;
        if trace {
            eprintln!(
                "{dir:?}: tilt halved to {lambda:.3e} (tilted top {tilted_hi}, k_hi {k_hi}, base width {base_width})"
            );
        }
    }
    FittedTilt {
        lambda,
        tilted_hi,
        mu_used,
        coarser,
    }
}

/// The window that is composed (stage 4).
#[derive(Debug, Clone)]
pub(super) struct Window {
    /// Its first grid index.
    pub(super) k_lo: i64,
    /// Its last grid index.
    pub(super) k_hi: f64,
    /// The FFT size (≥ the window's length).
    pub(super) n: usize,
    /// Whether the bottom was raised above the untilted window's (see [`fit_window`]).
    pub(super) raised: bool,
    /// `ln M_i(λ)` of each part (0 untilted).
    pub(super) ln_m: Vec<f64>,
    /// `ln G = Σ_i t_i ln M_i(λ)`.
    pub(super) ln_g: f64,
}

/// Stage 4: the window composed at tilt `fitted.lambda`. Mass below the window aliases into it
/// damped by `e^{−λ(r − k)} ≤ e^{−λn}`: with a tilt the window need not reach below the
/// reference point by more than 6 tilted standard deviations, as long as `λ·(window) ≥
/// ln(1/τ)` (the aliased mass is then below τ). (Only where the centre is known well: a fine
/// pass centred on its coarse pass's ε, or a δ(ε) query; a saddle-point estimate can be far
/// off for few heavy-tailed steps.) The window is never wider than the sum's support, and one
/// of more than `max_points` points is an error.
pub(super) fn fit_window(
    logp: &[(LogPmf, f64)],
    plan: &Plan,
    max_points: usize,
    base: &UntiltedWindow,
    fitted: &FittedTilt,
    k_ref: f64,
) -> Result<Window> {
    let lambda = fitted.lambda;
    let (mut k_hi, mut k_lo) = (base.k_hi, base.k_lo);
    let mut raised = false;
    if lambda > 0.0 {
        k_hi = fitted.tilted_hi;
    }
    if lambda > 0.0 && matches!(plan.tilt, Tilt::Eps(..)) {
        let var_t: f64 = logp.iter().map(|(c, t)| t * log_mgf(c, lambda).2).sum();
        let low_t = (k_ref - 6.0 * var_t.max(0.0).sqrt())
            .min(k_hi - (1.0 / plan.tau).ln() / lambda)
            .floor();
        if low_t > k_lo {
            k_lo = low_t;
            raised = true;
        }
    }
    // ln M_i(λ) of each grid pmf and ln G = Σ t_i ln M_i.
    let ln_m: Vec<f64> = logp
        .iter()
        .map(|(c, _)| {
            if lambda > 0.0 {
                log_mgf(c, lambda).0
            } else {
                0.0
            }
        })
        .collect();
    let ln_g: f64 = ln_m.iter().zip(logp).map(|(l, (_, t))| t * l).sum();
    // Never wider than the full support of the sum.
    let (full_lo, full_hi) = (base.full_lo, base.full_hi);
    if !(k_hi.is_finite() && k_lo.is_finite()) || k_hi < k_lo {
        k_lo = full_lo;
        k_hi = full_hi;
    }
    k_lo = k_lo.max(full_lo);
    k_hi = k_hi.min(full_hi).max(k_lo);
    let needed = k_hi - k_lo + 1.0;
    if needed > max_points as f64 {
        return Err(grid_too_large(needed, max_points, plan.eps_error));
    }
    Ok(Window {
        k_lo: k_lo as i64,
        k_hi,
        n: fft_size((needed as usize).max(2)),
        raised,
        ln_m,
        ln_g,
    })
}

/// A forward and an inverse real FFT plan of one length.
pub(super) type FftPlans = (Arc<dyn RealToComplex<f64>>, Arc<dyn ComplexToReal<f64>>);

/// The forward and inverse real FFTs of size `n` (plans, i.e. twiddle tables, cached across
/// calls: planning costs more than a transform).
pub(super) fn fft_plans(n: usize) -> Result<FftPlans> {
    static PLANNER: OnceLock<Mutex<RealFftPlanner<f64>>> = OnceLock::new();
    let mut planner = PLANNER
        .get_or_init(|| Mutex::new(RealFftPlanner::new()))
        .lock()
        .map_err(|_| AccountantError::NumericalFailure("FFT planner lock"))?;
    Ok((planner.plan_fft_forward(n), planner.plan_fft_inverse(n)))
}

/// The assumed relative accuracy η of an `n`-point FFT (module docs, round-off, 3):
/// `c·log2(n)·u`, divided by `1 − c·log2(n)·u` (at least 1/2).
pub(super) fn fft_eta(n: usize) -> f64 {
    let e = FFT_LEVEL_C * (n as f64).log2().max(1.0) * UNIT_ROUNDOFF;
    e / (1.0 - e).max(0.5)
}

/// Stage 5a: the tilted grid pmf `x[k] = p[k]·e^{λk − ln M}` of one part (`lm` = ln M(λ), 0
/// untilted) written into `buf`, each index wrapped modulo its length `n` (the circular
/// window); returns the bound on the relative round-off of its entries times the part's count
/// `t`: `exp(λk − ln M)` with λk rounded (relative u), the subtraction and exp (2 ulp each),
/// the product and the wrap-around sum.
pub(super) fn tilt_part(p: &GridPmf, t: f64, lm: f64, lambda: f64, buf: &mut [f64]) -> f64 {
    let u = UNIT_ROUNDOFF;
    let n = buf.len();
    buf.iter_mut().for_each(|x| *x = 0.0);
    let mut max_arg = 0.0_f64;
    let mut max_lk = 0.0_f64;
    for (k, &v) in p.p.iter().enumerate() {
        let ka = (p.offset + k as i64) as f64;
        let idx = (p.offset + k as i64).rem_euclid(n as i64) as usize;
        if v == 0.0 {
            continue;
        }
        let arg = lambda * ka - lm;
        max_arg = max_arg.max(arg.abs());
        max_lk = max_lk.max((lambda * ka).abs());
        buf[idx] += v * arg.exp();
    }
    t * u * (2.0 * max_lk + 2.0 * max_arg + 6.0)
}

/// The grid pmfs' own round-off (module docs, round-off, 5), summed over parts.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct PmfCharge {
    /// Σ t_i·ln((1 + ρ₂)/(1 − ρ₁)) plus the log-MGF's own rounding: the exact pmfs' MGF
    /// against the computed ones' (∞ where it cannot be bounded).
    pub(super) mgf_drift: f64,
    /// Σ t_i·(ln M̂_i − ln M_i(λ)): the computed pmf's mass where there is no tilt (0 tilted).
    pub(super) ln_mass: f64,
    /// Σ t_i·(tail coefficient): the coefficient of τ(ε − 3h).
    pub(super) kappa: f64,
    /// Σ t_i·(per-point terms weighted by e^{λ(k+1)}/M̂), with the drift's correction.
    pub(super) pmf_err: f64,
}

/// Stage 5b: one part's round-off terms of [`PmfCharge`] (times its count `t`): the MGF drift
/// ρ (the exact pmf's MGF against the computed one, for the Chernoff bound of compositions
/// mixing both), the tail coefficient κ and the per-point terms, charged later as
/// `a·G·e^{drift}·e^{−λk0}`. `lm` = ln M(λ) of the tilt (0 untilted), `omeh` = 1 − e^{−h}.
pub(super) fn pmf_charge(
    p: &GridPmf,
    t: f64,
    lm: f64,
    lambda: f64,
    h: f64,
    omeh: f64,
) -> PmfCharge {
    let u = UNIT_ROUNDOFF;
    let ro = &p.roundoff;
    // ln M̂ (for λ = 0 the mass, which the tilt's normalizer leaves at 0), with the log-MGF's
    // own rounding (≤ (n + 8)·4u relative) added to the drift.
    let ln_mhat = if lambda > 0.0 {
        lm
    } else {
        p.p.iter().sum::<f64>().ln()
    };
    let (rho1, rho2) = ro.mgf_drift(lambda, h, omeh, ln_mhat);
    let mgf_drift = if rho1 < 0.5 && rho2.is_finite() {
        t * ((1.0 + rho2) / (1.0 - rho1)).ln() + t * (p.p.len() as f64 + 8.0) * 4.0 * u
    } else {
        f64::INFINITY
    };
    let mut a = 0.0_f64;
    for &(k, m) in &ro.abs {
        a += m * (lambda * (k + 1) as f64 - ln_mhat).exp();
    }
    PmfCharge {
        mgf_drift,
        ln_mass: t * (ln_mhat - lm),
        kappa: t * ro.tail_coef,
        pmf_err: t * a * (1.0 + rho1) / (1.0 - rho2).max(0.5),
    }
}

/// The composed spectrum and what its round-off bounds need (stage 5).
#[derive(Debug, Clone)]
pub(super) struct Spectra {
    /// The product of the parts' tilted spectra raised to their counts (frequencies
    /// 0..=n/2).
    pub(super) spec: Vec<Complex64>,
    /// Per part: (count, ‖x‖₁, ‖x‖₂) of its tilted buffer, each rounded up.
    pub(super) norms: Vec<(f64, f64, f64)>,
    /// Kept sparse: (frequency j, Π_i m_ij^{t_i}, Σ_i t_i·eps_ci/m_ij) where no part's factor
    /// underflows (the componentwise error of the composed spectrum is their product).
    pub(super) cw: Vec<(usize, f64, f64)>,
    /// Σ t_i·(relative round-off of the tilted entries).
    pub(super) tilt_rel: f64,
    /// The grid pmfs' round-off.
    pub(super) pmf: PmfCharge,
}

/// Stage 5: real-to-complex FFTs of the tilted grid pmfs `x_i[k] = p_i[k]·e^{λk}/M_i(λ)`: only
/// the `n/2 + 1` non-negative frequencies are transformed, raised to their counts and
/// multiplied; with each part's norms, the componentwise error terms and the round-off of the
/// tilt and of the pmfs. `eta`: the FFT's assumed accuracy ([`fft_eta`]).
pub(super) fn compose_spectra(
    pmfs: &[(GridPmf, f64)],
    ln_m: &[f64],
    lambda: f64,
    n: usize,
    h: f64,
    eta: f64,
    r2c: &dyn RealToComplex<f64>,
) -> Result<Spectra> {
    let u = UNIT_ROUNDOFF;
    let fft_err = |_| AccountantError::NumericalFailure("FFT composition");
    let mut scratch = r2c.make_scratch_vec();
    let mut buf = r2c.make_input_vec();
    let mut acc_spec: Option<Vec<Complex64>> = None;
    let mut norms: Vec<(f64, f64, f64)> = Vec::with_capacity(pmfs.len());
    let mut cw: Vec<(usize, f64, f64)> = Vec::new();
    let mut first_part = true;
    let mut tilt_rel = 0.0_f64;
    let mut pmf = PmfCharge::default();
    let omeh = -(-h).exp_m1();
    for ((p, t), lm) in pmfs.iter().zip(ln_m) {
        tilt_rel += tilt_part(p, *t, *lm, lambda, &mut buf);
        let (mut l1, mut l2) = (0.0_f64, 0.0_f64);
        for &x in buf.iter() {
            l1 += x.abs();
            l2 += x * x;
        }
        norms.push((
            *t,
            l1 * (1.0 + 2.0 * n as f64 * u),
            l2.sqrt() * (1.0 + n as f64 * u),
        ));
        let c = pmf_charge(p, *t, *lm, lambda, h, omeh);
        pmf.mgf_drift += c.mgf_drift;
        pmf.ln_mass += c.ln_mass;
        pmf.kappa += c.kappa;
        pmf.pmf_err += c.pmf_err;
        let mut spec = r2c.make_output_vec();
        r2c.process_with_scratch(&mut buf, &mut spec, &mut scratch)
            .map_err(fft_err)?;
        // |z|² below e^{−1490/t} gives |z|^t < e^{−745} (zero in f64): skip the logarithm
        // there (most frequencies of a long composition).
        let r2_min = (-1490.0 / t).exp();
        // Componentwise forward error ≤ eps_c = η·‖x‖₁ per frequency: per frequency j the
        // power's error is ≤ t·eps_c·m_j^{t−1} with m_j = |X̂_j| + eps_c, so the composed
        // spectrum's error is ≤ Π_i m_ij^{t_i}·Σ_i t_i eps_ci/m_ij (kept in `cw`; zero where
        // m_j^t underflows).
        let eps_c = eta * norms.last().map_or(1.0, |v| v.1);
        // m_j² ≥ r2_min ⇔ |X̂_j|² ≥ (√r2_min − eps_c)² (checked without a square root).
        let r2_cw_min = (r2_min.sqrt() - eps_c).max(0.0).powi(2);
        let factor = |z: &Complex64| {
            let r2 = z.re * z.re + z.im * z.im;
            if r2 < r2_cw_min {
                None
            } else {
                let m = r2.sqrt() + eps_c;
                Some(((t * m.ln()).exp(), t * eps_c / m))
            }
        };
        if cw.is_empty() && first_part {
            for (j, z) in spec.iter().enumerate() {
                if let Some((pw, sm)) = factor(z) {
                    cw.push((j, pw, sm));
                }
            }
        } else {
            cw.retain_mut(|(j, pw, sm)| match factor(&spec[*j]) {
                Some((a, b)) => {
                    *pw *= a;
                    *sm += b;
                    true
                }
                None => false,
            });
        }
        first_part = false;
        for z in spec.iter_mut() {
            let r2 = z.re * z.re + z.im * z.im;
            *z = if r2 < r2_min {
                Complex64::new(0.0, 0.0)
            } else {
                cpow(*z, *t)
            };
        }
        acc_spec = Some(match acc_spec {
            None => spec,
            Some(mut a) => {
                for (x, y) in a.iter_mut().zip(&spec) {
                    *x *= *y;
                }
                a
            }
        });
    }
    let spec = acc_spec.ok_or(AccountantError::EmptyComposition)?;
    Ok(Spectra {
        spec,
        norms,
        cw,
        tilt_rel,
        pmf,
    })
}

/// The composed (tilted) grid pmf on the window and the norms of its spectrum (stage 6).
#[derive(Debug, Clone)]
pub(super) struct Inverse {
    /// `ŵ`: position i holds grid index `k_lo + i`.
    pub(super) w: Vec<f64>,
    /// ‖ŵ‖₂².
    pub(super) l2: f64,
    /// Σ|Z(ω)|² and Σ|Z(ω)| over the full spectrum (the half computed, mirrored).
    pub(super) spec_l2sq: f64,
    pub(super) spec_l1: f64,
    /// The componentwise error terms summed the same two ways.
    pub(super) cw_l1: f64,
    pub(super) cw_l2sq: f64,
}

/// The multiplicity of frequency `i` in the full spectrum of a real `n`-point sequence (1 for
/// DC and Nyquist, else 2: the half computed stands for its mirror too).
fn mirror(i: usize, n: usize) -> f64 {
    if i == 0 || (n.is_multiple_of(2) && i == n / 2) {
        1.0
    } else {
        2.0
    }
}

/// The unnormalized inverse real FFT of `spec`, the spectrum of a real sequence of length `n`:
/// its DC and Nyquist terms are real (so are their powers), so the round-off imaginary parts
/// the inverse transform would reject are dropped first (this moves them towards the exact
/// values).
pub(super) fn inverse_real(
    c2r: &dyn ComplexToReal<f64>,
    spec: &mut [Complex64],
    n: usize,
) -> std::result::Result<Vec<f64>, realfft::FftError> {
    if let Some(z) = spec.first_mut() {
        z.im = 0.0;
    }
    if n.is_multiple_of(2)
        && let Some(z) = spec.last_mut()
    {
        z.im = 0.0;
    }
    let mut out = c2r.make_output_vec();
    let mut scratch = c2r.make_scratch_vec();
    c2r.process_with_scratch(spec, &mut out, &mut scratch)?;
    Ok(out)
}

/// Stage 6: the composed spectrum's norms, then the inverse transform, rotated so that
/// position i holds the grid point `k_lo + i` (index r of the circular result holds
/// `k_lo + ((r − k_lo) mod n)`) and scaled by 1/n. A non-finite result is an error.
pub(super) fn inverse(
    mut spec: Vec<Complex64>,
    cw: &[(usize, f64, f64)],
    n: usize,
    k_lo: i64,
    c2r: &dyn ComplexToReal<f64>,
) -> Result<Inverse> {
    let fft_err = |_| AccountantError::NumericalFailure("FFT composition");
    let mut spec_l2sq = 0.0_f64;
    let mut spec_l1 = 0.0_f64;
    let (mut cw_l1, mut cw_l2sq) = (0.0_f64, 0.0_f64);
    for (i, z) in spec.iter().enumerate() {
        let m = mirror(i, n);
        let r2 = z.norm_sqr();
        spec_l2sq += m * r2;
        if r2 > 0.0 {
            spec_l1 += m * r2.sqrt();
        }
    }
    for &(i, pw, sm) in cw {
        let m = mirror(i, n);
        let e = pw * sm;
        cw_l1 += m * e;
        cw_l2sq += m * e * e;
    }
    let out = inverse_real(c2r, &mut spec, n).map_err(fft_err)?;
    let scale = 1.0 / n as f64;
    let mut w = out;
    w.rotate_left(k_lo.rem_euclid(n as i64) as usize);
    let mut l2 = 0.0_f64;
    for x in w.iter_mut() {
        *x *= scale;
        l2 += *x * *x;
    }
    if !l2.is_finite() {
        return Err(AccountantError::NumericalFailure("FFT composition"));
    }
    Ok(Inverse {
        w,
        l2,
        spec_l2sq,
        spec_l1,
        cw_l1,
        cw_l2sq,
    })
}

/// The round-off charged at the reference index (stage 7).
#[derive(Debug, Clone, Copy)]
pub(super) struct RoundOff {
    /// The normwise bound `‖ŵ − w̃‖₂ ≤ e2` of the tilted composition's FFT error (read by
    /// the stage tests).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) e2: f64,
    /// The entrywise bound `max_k |ŵ_k − w̃_k| ≤ e_inf` (read by the stage tests).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) e_inf: f64,
    /// The FFT's normwise bound `e₂` times `(Σ_{j≥0} e^{−2λj})^{1/2}` over the window.
    pub(super) e2_s2: f64,
    /// The FFT's componentwise bound `e_∞` times `Σ_{j≥0} e^{−λj}` over the window.
    pub(super) e_inf_s1: f64,
    /// `ln(G·e^{−λ k_ref})` (0 untilted).
    pub(super) at_ref: f64,
    /// The FFT's share at `k_ref`: `min(e2_s2, e_inf_s1)·e^{at_ref}`.
    pub(super) b_fft: f64,
    /// The pmfs' per-point share at `k_ref`.
    pub(super) b_pmf: f64,
    /// Their sum (∞ where it cannot be evaluated): `b` of the module docs (round-off, 6).
    pub(super) b_up: f64,
    /// ln of the Chernoff factor at `k_ref` of every composition of the steps' exact or
    /// computed pmfs: `G·e^{drift}·e^{−λ k_ref}` (module docs, round-off, 5).
    pub(super) ln_ch_ref: f64,
}

/// Stage 7: round-off of the tilted composition (module docs, round-off, 3), two ways: in L2
/// (normwise FFT bounds; `‖ŵ − w̃‖₂ ≤ e2`) and entrywise (componentwise FFT bounds;
/// `|ŵ_k − w̃_k| ≤ e_inf`), the smaller kept, charged relative to the Chernoff factor at the
/// reference index (`at_ref` = ln G − λ·k_ref); with the pmfs' per-point terms.
pub(super) fn fft_roundoff(
    norms: &[(f64, f64, f64)],
    inv: &Inverse,
    n: usize,
    eta: f64,
    lambda: f64,
    at_ref: f64,
    pmf: &PmfCharge,
) -> RoundOff {
    let u = UNIT_ROUNDOFF;
    let nf = n as f64;
    let sqrt_n = nf.sqrt();
    let mut ln_prod = 0.0_f64;
    let betas: Vec<f64> = norms
        .iter()
        .map(|&(_, _, l2x)| eta * sqrt_n * l2x)
        .collect();
    for (&(t, l1x, _), &b) in norms.iter().zip(&betas) {
        ln_prod += t * (l1x + b).ln();
    }
    let mut d_norm = 0.0_f64;
    for (&(t, l1x, _), &b) in norms.iter().zip(&betas) {
        d_norm += t * b * (ln_prod - (l1x + b).ln()).exp();
    }
    let rho_pow = u * norms.iter().map(|&(t, _, _)| 8.0 * t + 1600.0).sum::<f64>()
        + 8.0 * u * norms.len() as f64;
    let slack = 1.0 + 4.0 * nf * u;
    let z_norm = inv.spec_l2sq.sqrt() * slack;
    let z_l1 = inv.spec_l1 * slack;
    let d_l2 = d_norm.min(inv.cw_l2sq.sqrt() * slack);
    let e2 = 1.01
        * ((d_l2 + rho_pow * z_norm + sqrt_n * 1e-300) / sqrt_n
            + eta * z_norm / sqrt_n
            + 2.0 * u * inv.l2.sqrt());
    let max_w = inv.w.iter().fold(0.0_f64, |a, &x| a.max(x.abs()));
    let e_inf = 1.01
        * ((inv.cw_l1 * slack + rho_pow * z_l1 + nf * 1e-300) / nf
            + eta * z_l1 / nf
            + 2.0 * u * max_w);
    // Σ_{k ≥ k0} e^{−2λk} ≤ e^{−2λk0}·s2², Σ_{k ≥ k0} e^{−λk} ≤ e^{−λk0}·s1 over the window.
    let (s1, s2) = if lambda * nf < 1e-9 {
        (nf, sqrt_n)
    } else {
        (
            -(-lambda * nf).exp_m1() / -(-lambda).exp_m1(),
            (-(-2.0 * lambda * nf).exp_m1() / -(-2.0 * lambda).exp_m1()).sqrt(),
        )
    };
    let fft_bound = (e2 * s2).min(e_inf * s1);
    let at_ref = if lambda > 0.0 { at_ref } else { 0.0 };
    let b_fft = fft_bound * at_ref.exp();
    let ln_ch_ref = at_ref + 1.01 * pmf.mgf_drift + pmf.ln_mass;
    let b_pmf = 1.01 * pmf.pmf_err * ln_ch_ref.exp();
    // A bound that cannot be evaluated is infinite (the bounds then say nothing).
    let b_up = if (b_fft + b_pmf).is_nan() {
        f64::INFINITY
    } else {
        b_fft + b_pmf
    };
    RoundOff {
        e2,
        e_inf,
        e2_s2: e2 * s2,
        e_inf_s1: e_inf * s1,
        at_ref,
        b_fft,
        b_pmf,
        b_up,
        ln_ch_ref,
    }
}

/// Stage 8: untilt `w` in place, `w_k = ŵ_k·e^{ln G − λk}` (grid index `k = k_lo + i` at
/// position i), with `e^{λ}` stepped in blocks of 256 from an exact exponential (relative
/// error ≤ 256·2u + the exponentials'), top down; the values below the first index (under
/// `k_ref`) whose round-off bound `3·b_up·e^{−λ(k − k_ref)}` exceeds [`USABLE_FRACTION`] of
/// the mass above are dropped (checked every 64 points: dropping only protects the queries
/// from amplified noise; the bounds hold at every index either way), as are those whose
/// factor would overflow. Returns how many leading values were dropped and the relative
/// round-off bound of the untilted values. Untilted (λ = 0), nothing changes.
pub(super) fn untilt(
    w: &mut Vec<f64>,
    k_lo: i64,
    lambda: f64,
    ln_g: f64,
    k_ref: f64,
    b_up: f64,
) -> (usize, f64) {
    let u = UNIT_ROUNDOFF;
    let mut start = 0usize;
    let mut max_arg = 0.0_f64;
    if lambda > 0.0 {
        let up = lambda.exp();
        let mut mass = 0.0_f64;
        let mut f = 0.0_f64;
        for i in (0..w.len()).rev() {
            let k = (k_lo + i as i64) as f64;
            let arg = ln_g - lambda * k;
            if arg > 700.0 {
                start = i + 1;
                break;
            }
            f = if (w.len() - 1 - i).is_multiple_of(256) {
                arg.exp()
            } else {
                f * up
            };
            w[i] *= f;
            mass += w[i];
            if k < k_ref
                && (w.len() - 1 - i).is_multiple_of(64)
                && 3.0 * b_up * (-lambda * (k - k_ref)).exp() > USABLE_FRACTION * mass
            {
                start = i + 1;
                break;
            }
        }
        // |arg| and |λk| are largest at the ends of the range untilted (both linear in k).
        for i in [
            start.min(w.len().saturating_sub(1)),
            w.len().saturating_sub(1),
        ] {
            let k = (k_lo + i as i64) as f64;
            max_arg = max_arg
                .max((ln_g - lambda * k).abs())
                .max((lambda * k).abs());
        }
    }
    if start > 0 {
        w.drain(..start);
    }
    (start, u * (2.0 * max_arg + 4.0) + 2.0 * 256.0 * u)
}

/// z^t for a complex z with |z| ≤ 1 (polar form); 0 where |z|^t underflows.
pub(super) fn cpow(z: Complex64, t: f64) -> Complex64 {
    if t == 1.0 {
        return z;
    }
    let r2 = z.re * z.re + z.im * z.im;
    // ln|z|^t = (t/2)·ln|z|²; |z|² = 0 (also by underflow, |z| < 1e-154) gives 0 for t ≥ 1.
    let lm = 0.5 * t * r2.ln();
    if r2 == 0.0 || lm < -745.0 {
        return Complex64::new(0.0, 0.0);
    }
    Complex64::from_polar(lm.exp(), t * z.im.atan2(z.re))
}

/// The smallest 2^a·3^b ≥ n (up to 25 % fewer points than the next power of two; rustfft's
/// mixed-radix kernels transform these sizes as fast per point).
pub(super) fn fft_size(n: usize) -> usize {
    let mut best = n.next_power_of_two();
    let mut p3 = 1usize;
    while p3 < best {
        let mut v = p3;
        while v < n {
            v *= 2;
        }
        best = best.min(v);
        p3 *= 3;
    }
    best
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    //! Each stage's own properties, on grid pmfs of random subsampled Gaussians. (The
    //! composition as a whole is checked against direct convolution, references and golden
    //! files in the parent module's tests and the crate's integration tests.)

    use super::super::{Loss, build_pmf};
    use super::*;
    use proptest::prelude::*;

    /// The grid pmf of one step's loss (either direction) on the grid step `h`.
    fn pmf(q: f64, sigma: f64, h: f64, remove: bool) -> GridPmf {
        let dir = if remove {
            Direction::Remove
        } else {
            Direction::Add
        };
        build_pmf(Loss { q, sigma, dir }, h, 1e-12, 1 << 22, 0.01).unwrap()
    }

    fn plan(h: f64, tilt: Tilt) -> Plan {
        Plan {
            h,
            tilt,
            eps_error: 0.01,
            delta_hint: f64::NAN,
            eta: 1e-12,
            tail_mass: 1e-12,
            tau: 1e-10,
        }
    }

    /// A step: q, σ, grid step h, direction.
    fn step() -> impl Strategy<Value = (f64, f64, f64, bool)> {
        (0.02f64..1.0, 0.7f64..3.0, 0.03f64..0.2, any::<bool>())
    }

    /// The exact linear (not circular) composition of the grid pmfs with integer counts, as
    /// (first index, masses).
    fn direct(parts: &[(GridPmf, f64)]) -> (i64, Vec<f64>) {
        let mut off = 0i64;
        let mut acc = vec![1.0f64];
        for (p, t) in parts {
            for _ in 0..(*t as usize) {
                let mut next = vec![0.0; acc.len() + p.p.len() - 1];
                for (i, a) in acc.iter().enumerate() {
                    for (j, b) in p.p.iter().enumerate() {
                        next[i + j] += a * b;
                    }
                }
                acc = next;
                off += p.offset;
            }
        }
        (off, acc)
    }

    /// The stages 1–6 on `parts` with the plan's tilt: the window and the composed (tilted,
    /// circular) pmf, with the round-off bounds.
    fn run(parts: &[(GridPmf, f64)], plan: &Plan) -> (Window, FittedTilt, Spectra, Inverse, f64) {
        let logp: Vec<(LogPmf, f64)> = parts.iter().map(|(p, t)| (log_pmf(p), *t)).collect();
        let base = untilted_window(parts, &logp, plan.tau, None, None);
        let (l0, k_ref, _) = centre_tilt(&logp, plan.tilt, plan.h, &base, None);
        let fitted = fit_tilt(
            &logp,
            plan,
            1 << 22,
            &base,
            l0,
            k_ref,
            None,
            Direction::Remove,
            false,
        );
        let win = fit_window(&logp, plan, 1 << 22, &base, &fitted, k_ref).unwrap();
        let (r2c, c2r) = fft_plans(win.n).unwrap();
        let eta = fft_eta(win.n);
        let sp =
            compose_spectra(parts, &win.ln_m, fitted.lambda, win.n, plan.h, eta, &*r2c).unwrap();
        let inv = inverse(sp.spec.clone(), &sp.cw, win.n, win.k_lo, &*c2r).unwrap();
        (win, fitted, sp, inv, k_ref)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Stage 1: the window leaves at most τ of the composed mass outside on each side
        /// (checked against the exact composition), brackets the mean and lies around the
        /// support's mean.
        #[test]
        fn the_untilted_window_holds_all_but_tau_on_each_side(
            (q, sigma, h, remove) in step(),
            t in 1u32..4,
            tau in prop_oneof![Just(1e-3), Just(1e-6), Just(1e-10)],
        ) {
            let parts = vec![(pmf(q, sigma, h, remove), t as f64)];
            let logp: Vec<(LogPmf, f64)> = parts.iter().map(|(p, t)| (log_pmf(p), *t)).collect();
            let w = untilted_window(&parts, &logp, tau, None, None);
            let (off, exact) = direct(&parts);
            prop_assert_eq!(off as f64, w.full_lo);
            prop_assert_eq!((off + exact.len() as i64 - 1) as f64, w.full_hi);
            let above: f64 = exact.iter().enumerate()
                .filter(|(i, _)| (off + *i as i64) as f64 > w.k_hi).map(|(_, v)| v).sum();
            let below: f64 = exact.iter().enumerate()
                .filter(|(i, _)| ((off + *i as i64) as f64) < w.k_lo).map(|(_, v)| v).sum();
            prop_assert!(above <= tau * (1.0 + 1e-9), "above {} > τ {}", above, tau);
            prop_assert!(below <= tau * (1.0 + 1e-9), "below {} > τ {}", below, tau);
            prop_assert!(w.k_lo <= w.mean_idx && w.mean_idx <= w.k_hi);
            prop_assert!(w.full_lo <= w.mean_idx && w.mean_idx <= w.full_hi);
            prop_assert!(w.lambda_hi >= 0.0 && w.lambda_lo >= 0.0);
        }

        /// Stages 2–4: the tilt is in [0, 0.5] and grows with the query point; a kept tilt is
        /// the saddle tilt halved a whole number of times, at most 12; the window lies in the
        /// support, reaches at least the untilted top, and fits its FFT size (2^a·3^b); ln G is
        /// Σ t_i ln M_i.
        #[test]
        fn tilts_and_windows_are_in_range(
            (q, sigma, h, remove) in step(),
            t in 1.0f64..2000.0,
            eps in 0.0f64..8.0,
            on_eps in any::<bool>(),
        ) {
            let parts = vec![(pmf(q, sigma, h, remove), t.round())];
            let logp: Vec<(LogPmf, f64)> = parts.iter().map(|(p, t)| (log_pmf(p), *t)).collect();
            let tilt = if on_eps { Tilt::Eps(eps) } else { Tilt::Delta(10f64.powf(-1.0 - eps)) };
            let plan = plan(h, tilt);
            let base = untilted_window(&parts, &logp, plan.tau, None, None);
            let (l0, k_ref, centre) = centre_tilt(&logp, tilt, h, &base, None);
            prop_assert!((0.0..=0.5).contains(&l0), "{}", l0);
            if l0 > 0.0 {
                let c = centre.unwrap();
                prop_assert!(k_ref.is_finite() && k_ref < c, "{} {}", k_ref, c);
            } else {
                prop_assert_eq!(k_ref, f64::NEG_INFINITY);
            }
            if on_eps {
                let (l1, _, _) = centre_tilt(&logp, Tilt::Eps(eps + 0.5), h, &base, None);
                prop_assert!(l1 >= l0, "tilt {} at ε {} below {} at ε {}", l1, eps + 0.5, l0, eps);
            }
            let fitted = fit_tilt(&logp, &plan, 1 << 22, &base, l0, k_ref, None, Direction::Remove, false);
            prop_assert!(fitted.coarser >= 1.0);
            prop_assert!(fitted.tilted_hi >= base.k_hi);
            let halvings = (0..=12).find(|j| fitted.lambda == l0 / f64::powi(2.0, *j));
            prop_assert!(halvings.is_some(), "λ {} from {}", fitted.lambda, l0);
            let win = fit_window(&logp, &plan, 1 << 22, &base, &fitted, k_ref).unwrap();
            let len = win.k_hi - win.k_lo as f64 + 1.0;
            prop_assert!(base.full_lo <= win.k_lo as f64 && win.k_hi <= base.full_hi);
            prop_assert!(len >= 1.0 && win.n as f64 >= len && win.n == fft_size(win.n));
            if !win.raised {
                prop_assert!(win.k_lo as f64 <= base.k_lo.max(base.full_lo));
            }
            prop_assert!(win.k_hi >= base.k_hi.min(base.full_hi));
            let ln_g: f64 = win.ln_m.iter().zip(&logp).map(|(l, (_, t))| t * l).sum();
            prop_assert_eq!(ln_g, win.ln_g);
            // A window beyond the point limit is an error, not a smaller window.
            let small = (len as usize).saturating_sub(1).max(1);
            if (len as usize) > small {
                prop_assert!(fit_window(&logp, &plan, small, &base, &fitted, k_ref).is_err());
            }
        }

        /// Stage 5a: tilting keeps the mass (the tilted pmf sums to 1 with the exact
        /// normalizer, to its relative round-off bound; untilted it is the pmf itself, wrapped
        /// into the buffer), and the round-off term is non-negative and linear in the count.
        #[test]
        fn tilting_conserves_mass(
            (q, sigma, h, remove) in step(),
            lambda in prop_oneof![Just(0.0), 1e-4f64..0.5],
            t in 1.0f64..100.0,
        ) {
            let p = pmf(q, sigma, h, remove);
            let lp = log_pmf(&p);
            let lm = if lambda > 0.0 { log_mgf(&lp, lambda).0 } else { 0.0 };
            let mut buf = vec![0.0; fft_size(p.p.len() + 3)];
            let rel = tilt_part(&p, t, lm, lambda, &mut buf);
            prop_assert!(rel >= 0.0);
            prop_assert_eq!(rel, t * tilt_part(&p, 1.0, lm, lambda, &mut buf));
            prop_assert!(buf.iter().all(|&x| x >= 0.0));
            let mass: f64 = buf.iter().sum();
            let want = if lambda > 0.0 { 1.0 } else { p.p.iter().sum::<f64>() };
            // The entries' rounding (rel/t), the sums' (n·u each) and ln M's own.
            let tol = rel / t + 4.0 * (buf.len() + p.p.len()) as f64 * UNIT_ROUNDOFF;
            prop_assert!((mass - want).abs() <= tol * want, "mass {} vs {} (tol {})", mass, want, tol);
            if lambda == 0.0 {
                let n = buf.len() as i64;
                for (k, &v) in p.p.iter().enumerate() {
                    let i = (p.offset + k as i64).rem_euclid(n) as usize;
                    prop_assert_eq!(buf[i], v);
                }
            }
        }

        /// Stage 5b: every round-off term of the pmfs is non-negative, linear in the count,
        /// and the mass term is 0 with a tilt (its normalizer is the computed MGF).
        #[test]
        fn pmf_charges_are_non_negative_and_linear_in_the_count(
            (q, sigma, h, remove) in step(),
            lambda in prop_oneof![Just(0.0), 1e-4f64..0.5],
            t in 1.0f64..1000.0,
        ) {
            let p = pmf(q, sigma, h, remove);
            let lm = if lambda > 0.0 { log_mgf(&log_pmf(&p), lambda).0 } else { 0.0 };
            let omeh = -(-h).exp_m1();
            let one = pmf_charge(&p, 1.0, lm, lambda, h, omeh);
            let c = pmf_charge(&p, t, lm, lambda, h, omeh);
            for (a, b) in [
                (c.mgf_drift, one.mgf_drift),
                (c.kappa, one.kappa),
                (c.pmf_err, one.pmf_err),
            ] {
                prop_assert!(a >= 0.0 && b >= 0.0);
                if b.is_infinite() {
                    prop_assert!(a.is_infinite());
                    continue;
                }
                prop_assert!((a - t * b).abs() <= 1e-12 * a, "{} vs {}·{}", a, t, b);
            }
            if lambda > 0.0 {
                prop_assert_eq!(c.ln_mass, 0.0);
            } else {
                // ln of the computed mass (at most 1 up to rounding).
                prop_assert!(c.ln_mass <= 1e-12 * t);
            }
        }

        /// Stages 5–7: the FFT composition is the circular composition of the tilted pmfs
        /// within the round-off bounds (entrywise and in L2; the direct one computed exactly
        /// in the window, wrapped mass folded back), conserves the mass (1 tilted), and the
        /// round-off terms are non-negative and small.
        #[test]
        fn composition_is_within_its_round_off_bounds_of_the_direct_one(
            (q, sigma, h, remove) in step(),
            (q2, sigma2) in (0.02f64..1.0, 0.7f64..3.0),
            (t1, t2) in (1u32..4, 0u32..3),
            eps in prop_oneof![Just(None), (0.0f64..3.0).prop_map(Some)],
        ) {
            let mut parts = vec![(pmf(q, sigma, h, remove), t1 as f64)];
            if t2 > 0 {
                parts.push((pmf(q2, sigma2, h, remove), t2 as f64));
            }
            let tilt = match eps { Some(e) => Tilt::Eps(e), None => Tilt::Delta(1e-6) };
            let plan = plan(h, tilt);
            let (win, fitted, sp, inv, k_ref) = run(&parts, &plan);
            let n = win.n;
            prop_assert_eq!(inv.w.len(), n);
            let lambda = fitted.lambda;
            // The exact composition, tilted by e^{λk}/G and wrapped into the window.
            let (off, exact) = direct(&parts);
            let mut want = vec![0.0f64; n];
            for (i, v) in exact.iter().enumerate() {
                let k = off + i as i64;
                let r = (k - win.k_lo).rem_euclid(n as i64) as usize;
                if *v > 0.0 {
                    want[r] += (v.ln() + lambda * k as f64 - win.ln_g).exp();
                }
            }
            let ro = fft_roundoff(&sp.norms, &inv, n, fft_eta(n), lambda, win.ln_g - lambda * k_ref, &sp.pmf);
            // The reference's own rounding and the tilt's (both relative to each entry: sums of
            // non-negative terms) are allowed on top of the FFT's absolute bounds, which are
            // what is checked where the entries are small (the tails).
            let c = 1e-11 + 2.0 * sp.tilt_rel;
            let mut l2 = 0.0f64;
            let mut want_l2 = 0.0f64;
            for (k, (a, b)) in inv.w.iter().zip(&want).enumerate() {
                prop_assert!(
                    (a - b).abs() <= ro.e_inf + c * b,
                    "index {}: FFT {:e} vs direct {:e}, e_inf {:e}", k, a, b, ro.e_inf
                );
                l2 += (a - b) * (a - b);
                want_l2 += b * b;
            }
            prop_assert!(l2.sqrt() <= ro.e2 + c * want_l2.sqrt(), "L2 {:e} > e2 {:e}", l2.sqrt(), ro.e2);
            let mass: f64 = inv.w.iter().sum();
            let total: f64 = want.iter().sum();
            prop_assert!((mass - total).abs() <= n as f64 * ro.e_inf + c * total, "mass {} vs {}", mass, total);
            if lambda > 0.0 {
                prop_assert!((total - 1.0).abs() <= 1e-9, "tilted mass {}", total);
            }
            for v in [ro.e2, ro.e_inf, ro.b_fft, ro.b_pmf, ro.b_up, sp.tilt_rel] {
                prop_assert!(v >= 0.0 && v.is_finite(), "{:?}", ro);
            }
            prop_assert!(ro.b_up >= ro.b_fft && ro.b_up >= ro.b_pmf);
            prop_assert!(ro.e_inf <= 1e-10 && ro.e2 <= 1e-10, "{:?}", ro);
        }

        /// Stage 8: untilting gives `ŵ_k·e^{ln G − λk}` within its relative round-off bound at
        /// every kept index, drops values only below the reference index (or where the factor
        /// would overflow), and changes nothing untilted.
        #[test]
        fn untilting_is_within_its_bound_and_drops_only_below_the_reference(
            (q, sigma, h, remove) in step(),
            t in 1u32..4,
            eps in prop_oneof![Just(None), (0.0f64..3.0).prop_map(Some)],
            b_up in prop_oneof![Just(0.0), 1e-30f64..1e-3],
        ) {
            let parts = vec![(pmf(q, sigma, h, remove), t as f64)];
            let tilt = match eps { Some(e) => Tilt::Eps(e), None => Tilt::Delta(1e-6) };
            let plan = plan(h, tilt);
            let (win, fitted, _, inv, k_ref) = run(&parts, &plan);
            let lambda = fitted.lambda;
            let mut w = inv.w.clone();
            let (start, rel) = untilt(&mut w, win.k_lo, lambda, win.ln_g, k_ref, b_up);
            prop_assert!((0.0..=1e-9).contains(&rel), "{}", rel);
            prop_assert_eq!(w.len() + start, inv.w.len());
            if lambda == 0.0 {
                prop_assert_eq!(start, 0);
                prop_assert_eq!(&w, &inv.w);
            }
            for (i, &v) in w.iter().enumerate() {
                let j = i + start;
                let k = (win.k_lo + j as i64) as f64;
                let want = if lambda > 0.0 { inv.w[j] * (win.ln_g - lambda * k).exp() } else { inv.w[j] };
                prop_assert!((v - want).abs() <= 2.0 * rel * want.abs(), "index {}: {} vs {}", k, v, want);
            }
            if start > 0 {
                let k = (win.k_lo + start as i64 - 1) as f64;
                prop_assert!(k < k_ref || win.ln_g - lambda * k > 700.0, "dropped {} ≥ k_ref {}", k, k_ref);
            }
        }

        /// cpow is z^t in polar form: modulus |z|^t, argument t·arg z.
        #[test]
        fn cpow_is_the_polar_power(r in 1e-3f64..1.0, a in -3.1f64..3.1, t in 1.0f64..50.0) {
            let z = Complex64::from_polar(r, a);
            let p = cpow(z, t);
            prop_assert!((p.norm() - r.powf(t)).abs() <= 1e-12 * r.powf(t) + 1e-300);
            let want = Complex64::from_polar(r.powf(t), t * a);
            prop_assert!((p - want).norm() <= 1e-11 * (t + 1.0) * r.powf(t));
            prop_assert_eq!(cpow(z, 1.0), z);
        }
    }

    #[test]
    fn fft_sizes_are_smooth() {
        assert_eq!(fft_size(1000), 1024);
        assert_eq!(fft_size(1025), 1152);
        assert_eq!(fft_size(84_753), 93_312);
        for n in [2, 3, 5, 17, 1000, 100_001, 1 << 20] {
            let m = fft_size(n);
            assert!(m >= n && m <= n.next_power_of_two(), "{n} -> {m}");
            let mut r = m;
            while r.is_multiple_of(2) {
                r /= 2;
            }
            while r.is_multiple_of(3) {
                r /= 3;
            }
            assert_eq!(r, 1, "{n} -> {m}");
        }
    }
}
