//! The PRV accountant (Gopi, Lee, Wutschitz 2021) with certified bounds.
//!
//! # Method
//!
//! For a composition of `N` steps with privacy random variables (PRVs) `Y_1 … Y_N` (the privacy
//! loss `ln(P/Q)` evaluated at an output drawn from `P`), the hockey-stick divergence is
//! `δ(ε) = E[(1 − e^{ε − S})₊]`, `S = Σ Y_i`, a non-decreasing function of `S`.
//!
//! 1. **Truncation.** Each `Y_i` is clamped to `[a_i, b_i]` (grid-aligned). Clamping changes `S`
//!    only on an event of probability at most `Σ T_i·P(Y_i > b_i)` (upward) or
//!    `Σ T_i·P(Y_i < a_i)` (downward); these masses are added to δ's upper bound, respectively
//!    subtracted from its lower bound.
//! 2. **Randomized rounding.** `Y` in `[kh, (k+1)h]` is rounded to `(k+1)h` with probability
//!    `Y/h − k`, else to `kh`. The rounded `Ỹ` satisfies `E[Ỹ | Y] = Y` (no mean shift — the
//!    trap of prv-accountant 0.2.0) and `Ỹ − Y` lies in an interval of width `h`, so by
//!    Hoeffding `P(Σ(Ỹ_i − Y_i) ≥ t) ≤ η = exp(−2t²/(N h²))`. Hence
//!    `δ_Ỹ(ε + t) − η ≤ δ_Y(ε) ≤ δ_Ỹ(ε − t) + η`. The pmf of `Ỹ` is the integral of the hat
//!    function against the law of `Y`: each bin's mass is a difference of the exact CDF (erfc,
//!    the lower or upper tail, whichever is accurate there) at its edges, and its split
//!    `(1/h)∫(F(y) − F(y₀)) dy` comes from Hermite quadrature on the edge values of F, the
//!    density and its derivative (see below).
//! 3. **FFT composition.** The characteristic functions of the grid pmfs (real-to-complex
//!    FFTs: only the `n/2 + 1` non-negative frequencies of the real pmfs) are raised to their
//!    counts and multiplied, on a window `[K_lo, K_hi]` of the composed grid chosen by Chernoff
//!    bounds (from the exact log-MGF of each grid pmf, coarsened upward) so that the mass outside
//!    is at most `τ` on each side; the circular wrap-around then adds at most `2τ` of mass, which
//!    is accounted for in both bounds.
//! 4. **Both adjacency directions** (remove: `P` = mixture, `Q` = N(0, σ²); add: swapped) are
//!    composed separately; the reported values are the maxima.
//!
//! The bounds are certified up to floating-point round-off and the quadrature tolerance of the
//! in-bin split: the FFT's round-off noise is accounted by a statistical allowance
//! (4·ε_mach·log2(n)·√n·‖w‖₂ added to δ's error). The split uses the two-point quintic Hermite
//! rule (F, density, density' at both edges — no interior evaluations) when it agrees with the
//! two-point cubic Hermite rule to 1e-7 of the bin's mass (their difference estimates the cubic
//! rule's error, the quintic rule's being of higher order); otherwise composite cubic Hermite
//! quadrature is refined until it changes by less than 1e-7 of the bin's mass. Either way the
//! estimated split error is below 1e-7 of each bin's mass, i.e. a mean bias below 1e-7·h per
//! step, N·1e-7·h in all. That bias is not left to chance: both bounds are moved outward by a
//! further N·1e-6·h (ten times the estimate; about 4e-5 of `t` at N = 10⁴), so the certificate
//! holds as long as the estimate is within a factor of ten of the true quadrature error.
//!
//! The grid step `h` follows from the requested ε accuracy `t`: `h = t / √(N·ln(1/η)/2)`.

use std::sync::{Mutex, OnceLock};

use rayon::prelude::*;
use realfft::RealFftPlanner;
use realfft::num_complex::Complex64;
use serde::{Deserialize, Serialize};

use crate::error::{AccountantError, Result};
use crate::rdp::RdpAccountant;
use crate::special::{norm_cdf, norm_pdf, norm_sf, norm_upper_quantile};
use crate::types::{Composition, Delta, Epsilon, SubsampledGaussian};

/// Adjacency direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Direction {
    /// Removing a record: P = (1−q)N(0,σ²) + qN(1,σ²), Q = N(0,σ²).
    Remove,
    /// Adding a record: P = N(0,σ²), Q = (1−q)N(0,σ²) + qN(1,σ²).
    Add,
}

/// How precise ε must be.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum EpsTolerance {
    /// `eps_error = rel × scale`, where the scale is the RDP ε (for ε(δ)) or max(ε, sd of the
    /// composed loss) (for δ(ε)).
    Relative(f64),
    /// A fixed `eps_error`.
    Absolute(f64),
}

/// Requested accuracy and resource limits.
///
/// `eps_error` is the width `t` of the Hoeffding shift: the upper bound is about `t` above the
/// estimate and the lower bound about `t` below. `delta_error` (relative to δ for ε(δ) queries,
/// absolute for δ(ε) queries) is the mass allowed for the rounding tail, truncation and
/// wrap-around together.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Accuracy {
    /// ε tolerance.
    pub eps: EpsTolerance,
    /// δ error budget relative to δ (ε(δ) queries).
    pub delta_error_rel: f64,
    /// Absolute δ error budget for δ(ε) queries.
    pub delta_error_abs: f64,
    /// Largest FFT grid (points) allowed per direction; memory is about 40 bytes per point.
    pub max_points: usize,
    /// Largest number of member combinations of parallel groups.
    pub max_combinations: u64,
}

impl Default for Accuracy {
    fn default() -> Self {
        Self {
            eps: EpsTolerance::Relative(0.01),
            delta_error_rel: 1e-3,
            delta_error_abs: 1e-15,
            max_points: 1 << 23,
            max_combinations: 256,
        }
    }
}

impl Accuracy {
    /// Relative ε tolerance (default 0.01).
    pub fn relative(rel: f64) -> Self {
        Self {
            eps: EpsTolerance::Relative(rel),
            ..Self::default()
        }
    }

    /// Absolute ε tolerance.
    pub fn absolute(eps_error: f64) -> Self {
        Self {
            eps: EpsTolerance::Absolute(eps_error),
            ..Self::default()
        }
    }

    /// Set the relative δ error budget (ε(δ) queries).
    pub fn with_delta_error_rel(mut self, rel: f64) -> Self {
        self.delta_error_rel = rel;
        self
    }

    /// Set the grid limit.
    pub fn with_max_points(mut self, max_points: usize) -> Self {
        self.max_points = max_points;
        self
    }

    fn validate(&self) -> Result<()> {
        let (name, v) = match self.eps {
            EpsTolerance::Relative(v) => ("eps_error (relative)", v),
            EpsTolerance::Absolute(v) => ("eps_error (absolute)", v),
        };
        if !(v.is_finite() && v > 0.0) {
            return Err(AccountantError::InvalidAccuracy {
                name,
                value: v,
                reason: "must be positive and finite",
            });
        }
        let r = self.delta_error_rel;
        if !(r.is_finite() && r > 0.0 && r < 1.0) {
            return Err(AccountantError::InvalidAccuracy {
                name: "delta_error_rel",
                value: r,
                reason: "must lie in (0, 1)",
            });
        }
        let a = self.delta_error_abs;
        if !(a.is_finite() && a > 0.0 && a < 1.0) {
            return Err(AccountantError::InvalidAccuracy {
                name: "delta_error_abs",
                value: a,
                reason: "must lie in (0, 1)",
            });
        }
        if self.max_points < 16 {
            return Err(AccountantError::InvalidAccuracy {
                name: "max_points",
                value: self.max_points as f64,
                reason: "must be at least 16",
            });
        }
        Ok(())
    }

    fn eps_error(&self, scale: f64) -> f64 {
        match self.eps {
            EpsTolerance::Relative(r) => r * scale.max(1e-9),
            EpsTolerance::Absolute(a) => a,
        }
    }
}

/// ε(δ): certified upper bound, estimate and lower bound.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EpsilonBounds {
    /// Certified upper bound (report this).
    pub upper: f64,
    /// Estimate (no rounding shift).
    pub estimate: f64,
    /// Certified lower bound.
    pub lower: f64,
    /// Upper bound for the remove direction alone.
    pub upper_remove: f64,
    /// Upper bound for the add direction alone.
    pub upper_add: f64,
}

/// δ(ε): certified upper bound, estimate and lower bound.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DeltaBounds {
    /// Certified upper bound (report this).
    pub upper: f64,
    /// Estimate.
    pub estimate: f64,
    /// Certified lower bound.
    pub lower: f64,
}

// ---------------------------------------------------------------------------------------------
// The privacy loss of one step.

#[derive(Debug, Clone, Copy)]
struct Loss {
    q: f64,
    sigma: f64,
    dir: Direction,
}

impl Loss {
    /// Remove-direction loss as a function of the output x: ln(1 − q + q·e^{(2x−1)/(2σ²)}).
    fn g(&self, x: f64) -> f64 {
        let z = (2.0 * x - 1.0) / (2.0 * self.sigma * self.sigma);
        if self.q == 1.0 {
            z
        } else if z > 0.0 {
            z + self.q.ln() + ((1.0 - self.q) / self.q * (-z).exp()).ln_1p()
        } else {
            (self.q * z.exp_m1()).ln_1p()
        }
    }

    /// Inverse of `g` (−∞ at or below ln(1−q)).
    fn ginv(&self, y: f64) -> f64 {
        let s2 = self.sigma * self.sigma;
        let z = if self.q == 1.0 {
            y
        } else if y > 0.0 {
            y - self.q.ln() + (-(1.0 - self.q) * (-y).exp()).ln_1p()
        } else {
            let r = y.exp_m1() / self.q;
            if r <= -1.0 {
                f64::NEG_INFINITY
            } else {
                r.ln_1p()
            }
        };
        s2 * z + 0.5
    }

    /// dx/dy of `ginv` at y.
    #[cfg(test)]
    fn ginv_prime(&self, y: f64) -> f64 {
        let s2 = self.sigma * self.sigma;
        if self.q == 1.0 {
            s2
        } else {
            // dz/dy = e^y / (e^y − 1 + q) = 1 / (1 − (1−q) e^{−y})
            let d = 1.0 - (1.0 - self.q) * (-y).exp();
            if d <= 0.0 { f64::INFINITY } else { s2 / d }
        }
    }

    /// Grid-free support [a, b] with P(Y < a) ≤ mass/… and P(Y > b) ≤ mass.
    fn support(&self, mass: f64) -> (f64, f64) {
        let z = norm_upper_quantile(mass);
        let s = self.sigma;
        match self.dir {
            Direction::Remove => (self.g(-s * z), self.g(1.0 + s * z)),
            Direction::Add => (-self.g(s * z), -self.g(-s * z)),
        }
    }

    /// (lower CDF F(y), upper tail S(y)); only the one asked for is computed accurately.
    /// `upper == false` → returns F(y); `upper == true` → returns S(y).
    fn tail(&self, y: f64, upper: bool) -> f64 {
        let (q, s) = (self.q, self.sigma);
        match self.dir {
            Direction::Remove => {
                let x = self.ginv(y);
                if x == f64::NEG_INFINITY {
                    return if upper { 1.0 } else { 0.0 };
                }
                if upper {
                    (1.0 - q) * norm_sf(x / s) + q * norm_sf((x - 1.0) / s)
                } else {
                    (1.0 - q) * norm_cdf(x / s) + q * norm_cdf((x - 1.0) / s)
                }
            }
            Direction::Add => {
                let x = self.ginv(-y);
                if x == f64::NEG_INFINITY {
                    return if upper { 0.0 } else { 1.0 };
                }
                if upper {
                    norm_cdf(x / s)
                } else {
                    norm_sf(x / s)
                }
            }
        }
    }

    /// Density of Y at y (0 outside the support); the library uses [`Loss::eval`], this
    /// independent form checks it.
    #[cfg(test)]
    fn density(&self, y: f64) -> f64 {
        let (q, s) = (self.q, self.sigma);
        match self.dir {
            Direction::Remove => {
                let x = self.ginv(y);
                if !x.is_finite() {
                    return 0.0;
                }
                let fx = ((1.0 - q) * norm_pdf(x / s) + q * norm_pdf((x - 1.0) / s)) / s;
                let d = fx * self.ginv_prime(y);
                if d.is_finite() { d } else { 0.0 }
            }
            Direction::Add => {
                let x = self.ginv(-y);
                if !x.is_finite() {
                    return 0.0;
                }
                let d = norm_pdf(x / s) / s * self.ginv_prime(-y);
                if d.is_finite() { d } else { 0.0 }
            }
        }
    }

    /// `(tail(y, upper), density(y), density'(y))` with one inversion of the loss. The
    /// derivative is NaN where it is not finite or `y` lies outside the support (callers then
    /// fall back to quadrature on interior nodes).
    fn eval(&self, y: f64, upper: bool) -> (f64, f64, f64) {
        let (q, s) = (self.q, self.sigma);
        let s2 = s * s;
        // x = ginv(±y) and its first two derivatives at ±y.
        let arg = match self.dir {
            Direction::Remove => y,
            Direction::Add => -y,
        };
        let x = self.ginv(arg);
        if x == f64::NEG_INFINITY {
            let v = match (self.dir, upper) {
                (Direction::Remove, true) | (Direction::Add, false) => 1.0,
                _ => 0.0,
            };
            return (v, 0.0, f64::NAN);
        }
        // dz/dy = 1/dd, d²z/dy² = −(1 − dd)/dd² with dd = 1 − (1−q)e^{−y}.
        let (x1, x2) = if q == 1.0 {
            (s2, 0.0)
        } else {
            let dd = 1.0 - (1.0 - q) * (-arg).exp();
            if dd <= 0.0 {
                (f64::INFINITY, f64::NAN)
            } else {
                (s2 / dd, -s2 * (1.0 - dd) / (dd * dd))
            }
        };
        let (tail, px, dpx) = match self.dir {
            Direction::Remove => {
                let (u0, u1) = (x / s, (x - 1.0) / s);
                let tail = if upper {
                    (1.0 - q) * norm_sf(u0) + q * norm_sf(u1)
                } else {
                    (1.0 - q) * norm_cdf(u0) + q * norm_cdf(u1)
                };
                let (p0, p1) = (norm_pdf(u0), norm_pdf(u1));
                let px = ((1.0 - q) * p0 + q * p1) / s;
                let dpx = -((1.0 - q) * u0 * p0 + q * u1 * p1) / s2;
                (tail, px, dpx)
            }
            Direction::Add => {
                let u = x / s;
                let tail = if upper { norm_cdf(u) } else { norm_sf(u) };
                let p = norm_pdf(u);
                (tail, p / s, -u * p / s2)
            }
        };
        let f = px * x1;
        let f = if f.is_finite() { f } else { 0.0 };
        // Remove: f' = p'(x)·x'² + p(x)·x''; Add (y ↦ −y): f' = −p'(x)·x'² − p(x)·x''.
        let df = dpx * x1 * x1 + px * x2;
        let df = match self.dir {
            Direction::Remove => df,
            Direction::Add => -df,
        };
        (tail, f, if df.is_finite() { df } else { f64::NAN })
    }

    /// Rough median of Y (where to switch from F to S for accuracy).
    fn median_guess(&self) -> f64 {
        match self.dir {
            Direction::Remove => self.g(self.q),
            Direction::Add => -self.g(0.0),
        }
    }
}

/// The randomized-rounding pmf of one step's clamped loss on the grid `k·h`.
#[derive(Debug, Clone)]
struct GridPmf {
    offset: i64,
    p: Vec<f64>,
    /// P(Y > b'): the clamp moved this mass down.
    trunc_upper: f64,
    /// P(Y < a'): the clamp moved this mass up.
    trunc_lower: f64,
}

fn build_pmf(
    loss: Loss,
    h: f64,
    tail_mass: f64,
    max_points: usize,
    eps_error: f64,
) -> Result<GridPmf> {
    let (a, b) = loss.support(tail_mass);
    if !(a.is_finite() && b.is_finite()) {
        return Err(AccountantError::NumericalFailure("loss support"));
    }
    let a_idx = (a / h).floor();
    let b_idx = (b / h).ceil().max(a_idx + 1.0);
    let nbins = b_idx - a_idx;
    if nbins + 1.0 > max_points as f64 {
        return Err(grid_too_large(nbins + 1.0, max_points, eps_error));
    }
    let (a_idx, nbins) = (a_idx as i64, nbins as usize);
    let edge = |e: usize| (a_idx + e as i64) as f64 * h;
    // Bins whose left edge is below `switch` use F (accurate in the lower tail), the others S.
    let med = loss.median_guess();
    let switch = ((med / h).floor() as i64 - a_idx).clamp(0, nbins as i64) as usize;
    // Sub-steps per bin so that the in-bin quadrature resolves the law of Y even when h is
    // coarse compared with its spread (at least ~2048 sub-steps over the support).
    let sub = ((h * 2048.0 / (b - a).max(f64::MIN_POSITIVE)).ceil() as usize).clamp(1, 1 << 16);
    // Tail value (in the mode of the bins starting there) and density at every bin edge,
    // computed once and shared by the two bins meeting there.
    let edge_vals: Vec<(f64, f64, f64)> = (0..=nbins)
        .into_par_iter()
        .map(|e| loss.eval(edge(e), e >= switch))
        .collect();
    let bins: Vec<(f64, f64)> = (0..nbins)
        .into_par_iter()
        .map(|j| {
            let upper = j >= switch;
            let y0 = edge(j);
            let y1 = edge(j + 1);
            let (v0, d0, dd0) = edge_vals[j];
            let node3 = |y: f64| {
                let (v, d, dd) = loss.eval(y, upper);
                (if upper { v0 - v } else { v - v0 }, d, dd)
            };
            // The right edge's stored tail is in this bin's mode except for the last bin below
            // `switch`, whose right edge starts the first bin above it.
            let (g1, d1, dd1) = if j + 1 == switch {
                node3(y1)
            } else {
                let (v1, d1, dd1) = edge_vals[j + 1];
                (if upper { v0 - v1 } else { v1 - v0 }, d1, dd1)
            };
            let right = (g1, d1);
            if g1 <= 0.0 {
                return (0.0, 0.0);
            }
            // Edge-only rules for (1/h)∫_{y0}^{y1} G(y) dy, G(y) = F(y) − F(y0): the cubic
            // Hermite rule (G, G' = density) and the quintic one (G, G', G'' = density'); when
            // they agree to 1e-7 of the bin's mass the quintic value is used (its error is far
            // below the cubic one's, which the difference estimates), otherwise the composite
            // refinement below decides.
            if sub == 1 && dd0.is_finite() && dd1.is_finite() {
                let cubic = 0.5 * g1 + h * (d0 - d1) / 12.0;
                let quintic = 0.5 * g1 + h * (d0 - d1) / 10.0 + h * h * (dd0 + dd1) / 120.0;
                if (quintic - cubic).abs() <= 1e-7 * g1 {
                    return (g1, quintic.clamp(0.0, g1));
                }
            }
            let node = |y: f64| {
                let (g, d, _) = node3(y);
                (g, d)
            };
            // (G, density) at equally spaced nodes, G(y) = F(y) − F(y0).
            let mut nodes: Vec<(f64, f64)> = (0..=sub)
                .map(|i| {
                    if i == 0 {
                        (0.0, d0)
                    } else if i == sub {
                        right
                    } else {
                        node(y0 + i as f64 * h / sub as f64)
                    }
                })
                .collect();
            let mass = nodes[sub].0.max(0.0);
            // (1/h)∫(F(y) − F(y0)) dy by composite cubic Hermite, refined until the split
            // changes by less than 1e-7 of the bin's mass.
            let composite = |nodes: &[(f64, f64)]| {
                let m = nodes.len() - 1;
                let hs = h / m as f64;
                let mut acc = 0.0;
                for w in nodes.windows(2) {
                    acc += hs * 0.5 * (w[0].0 + w[1].0) + hs * hs * (w[0].1 - w[1].1) / 12.0;
                }
                acc / h
            };
            let mut lower = composite(&nodes);
            while nodes.len() - 1 < 4096 && mass > 0.0 {
                let m = nodes.len() - 1;
                let hs = h / (2 * m) as f64;
                let mut refined = Vec::with_capacity(2 * m + 1);
                for (i, w) in nodes.windows(2).enumerate() {
                    refined.push(w[0]);
                    refined.push(node(y0 + (2 * i + 1) as f64 * hs));
                }
                refined.push(nodes[m]);
                let next = composite(&refined);
                let done = (next - lower).abs() <= 1e-7 * mass;
                lower = next;
                nodes = refined;
                if done {
                    break;
                }
            }
            (mass, lower.clamp(0.0, mass))
        })
        .collect();
    let mut p = vec![0.0_f64; nbins + 1];
    let trunc_lower = loss.tail(edge(0), false);
    let trunc_upper = loss.tail(edge(nbins), true);
    p[0] += trunc_lower;
    p[nbins] += trunc_upper;
    for (j, (mass, lower)) in bins.into_iter().enumerate() {
        p[j] += lower;
        p[j + 1] += mass - lower;
    }
    Ok(GridPmf {
        offset: a_idx,
        p,
        trunc_upper,
        trunc_lower,
    })
}

fn grid_too_large(needed: f64, limit: usize, eps_error: f64) -> AccountantError {
    AccountantError::GridTooLarge {
        needed: needed.min(u64::MAX as f64) as u64,
        limit,
        eps_error,
        suggested_eps_error: eps_error * (needed / limit as f64) * 1.2,
    }
}

// ---------------------------------------------------------------------------------------------
// Chernoff window.

/// A grid pmf prepared for exact log-MGF evaluation: (ln p_k, absolute index k) for p_k > 0.
struct LogPmf {
    lnp: Vec<f64>,
    idx: Vec<f64>,
    mean: f64,
    var: f64,
}

fn log_pmf(p: &GridPmf) -> LogPmf {
    let mut out = LogPmf {
        lnp: Vec::new(),
        idx: Vec::new(),
        mean: 0.0,
        var: 0.0,
    };
    let (mut s1, mut s2, mut s0) = (0.0, 0.0, 0.0);
    for (k, &v) in p.p.iter().enumerate() {
        if v > 0.0 {
            let i = (p.offset + k as i64) as f64;
            out.lnp.push(v.ln());
            out.idx.push(i);
            s0 += v;
            s1 += v * i;
        }
    }
    let mean = s1 / s0;
    for (k, &v) in p.p.iter().enumerate() {
        let d = (p.offset + k as i64) as f64 - mean;
        s2 += v * d * d;
    }
    out.mean = mean;
    out.var = s2 / s0;
    out
}

/// ln E[e^{λK}] (K in index units) of the grid pmf, exactly (up to round-off), with its first
/// two derivatives in λ (the tilted mean and variance of K).
fn log_mgf(c: &LogPmf, lambda: f64) -> (f64, f64, f64) {
    let mut mx = f64::NEG_INFINITY;
    for (&l, &k) in c.lnp.iter().zip(&c.idx) {
        mx = mx.max(l + lambda * k);
    }
    // Moments about the untilted mean keep the variance free of cancellation.
    let (mut s0, mut s1, mut s2) = (0.0, 0.0, 0.0);
    for (&l, &k) in c.lnp.iter().zip(&c.idx) {
        let e = (l + lambda * k - mx).exp();
        let d = k - c.mean;
        s0 += e;
        s1 += e * d;
        s2 += e * d * d;
    }
    let m1 = s1 / s0;
    (mx + s0.ln(), c.mean + m1, (s2 / s0 - m1 * m1).max(0.0))
}

/// The smallest index s with (a Chernoff bound on) P(S ≥ s) ≤ tau (upper = true), or the
/// largest index s with P(S ≤ s) ≤ tau (upper = false): s = ±(K(±λ) + ln(1/τ))/λ for the
/// cumulant K of the composed index sum. Any λ > 0 gives a valid bound; λ is the root of
/// ψ(λ) = λK'(λ) − K(λ) − ln(1/τ) (increasing, ψ' = λK''), found by safeguarded Newton steps
/// from the Gaussian optimum, and the best bound seen is returned.
fn chernoff_point(parts: &[(LogPmf, f64)], tau: f64, upper: bool) -> f64 {
    let sign = if upper { 1.0 } else { -1.0 };
    let ln_inv_tau = (1.0 / tau).ln();
    // (bound, ψ, ψ') at λ, in the tilted direction `sign`.
    let eval = |lambda: f64| {
        let (mut k, mut k1, mut k2) = (0.0, 0.0, 0.0);
        for (c, t) in parts {
            let (a, b, v) = log_mgf(c, sign * lambda);
            k += t * a;
            k1 += t * sign * b;
            k2 += t * v;
        }
        let bound = (k + ln_inv_tau) / lambda;
        let psi = lambda * k1 - k - ln_inv_tau;
        let bound = if bound.is_nan() { f64::INFINITY } else { bound };
        (bound, psi, lambda * k2)
    };
    let var: f64 = parts
        .iter()
        .map(|(c, t)| t * c.var)
        .sum::<f64>()
        .max(1e-300);
    let mut lambda = (2.0 * ln_inv_tau / var).sqrt();
    let (mut lo, mut hi) = (0.0_f64, f64::INFINITY);
    let mut best = f64::INFINITY;
    for _ in 0..8 {
        let (bound, psi, dpsi) = eval(lambda);
        best = best.min(bound);
        if !psi.is_finite() || psi > 0.0 {
            hi = lambda;
        } else {
            lo = lambda;
        }
        let newton = lambda - psi / dpsi;
        let next = if psi.is_finite() && dpsi > 0.0 && newton > lo && newton < hi {
            newton
        } else if hi.is_finite() {
            0.5 * (lo + hi)
        } else {
            2.0 * lambda
        };
        if (next - lambda).abs() <= 1e-6 * lambda {
            break;
        }
        lambda = next;
    }
    sign * best
}

// ---------------------------------------------------------------------------------------------
// Composition.

/// Spacing of the stored (A, C, D) checkpoints of a composed direction.
const BLOCK: usize = 32;

/// A composed PRV (one direction) on a window of the grid, ready for queries.
///
/// With `w_k` the composed grid pmf at grid index `k_lo + k`, the query tables are
/// `A_i = Σ_{k ≥ i} w_k`, `C_i = Σ_{k > i} w_k (1 − e^{−(k−i)h})` (δ_w at ε = (k_lo + i)h) and
/// `D_i = Σ_{k ≥ i} w_k e^{−(k−i)h}`, computed by the downward recurrence
/// `A_i = A_{i+1} + w_i`, `C_i = (1 − e^{−h}) A_{i+1} + e^{−h} C_{i+1}`,
/// `D_i = w_i + e^{−h} D_{i+1}`. Only every `BLOCK`-th triple is stored; any other one is
/// recomputed from the checkpoint above it with the same floating-point operations, so the
/// values are bit-identical to full tables (which would cost three fresh n-point arrays per
/// direction and call).
#[derive(Debug, Clone)]
struct ComposedDirection {
    h: f64,
    k_lo: i64,
    /// The composed grid pmf on the window.
    w: Vec<f64>,
    /// (A_i, C_i, D_i) at i = 0, BLOCK, 2·BLOCK, … (< n).
    ck: Vec<(f64, f64, f64)>,
    /// e^{−h}.
    eh: f64,
    /// 1 − e^{−h}.
    omeh: f64,
    t: f64,
    extra_up: f64,
    extra_low: f64,
}

impl ComposedDirection {
    /// Composed pmf `w` (window starting at grid index `k_lo`) → direction with checkpoints.
    fn new(h: f64, k_lo: i64, w: Vec<f64>, t: f64, extra_up: f64, extra_low: f64) -> Self {
        let mut out = Self {
            h,
            k_lo,
            ck: Vec::with_capacity(w.len().div_ceil(BLOCK)),
            w,
            eh: (-h).exp(),
            omeh: -(-h).exp_m1(),
            t,
            extra_up,
            extra_low,
        };
        let n = out.n();
        out.ck.resize(n.div_ceil(BLOCK), (0.0, 0.0, 0.0));
        let mut st = (0.0, 0.0, 0.0);
        for i in (0..n).rev() {
            st = out.step(i, st);
            if i % BLOCK == 0 {
                out.ck[i / BLOCK] = st;
            }
        }
        out
    }

    fn n(&self) -> usize {
        self.w.len()
    }

    /// (A_k, C_k, D_k) from (A_{k+1}, C_{k+1}, D_{k+1}) (zeros above the window).
    #[inline]
    fn step(&self, k: usize, (a1, c1, d1): (f64, f64, f64)) -> (f64, f64, f64) {
        let c = if k + 1 < self.n() {
            self.omeh * a1 + self.eh * c1
        } else {
            0.0
        };
        (a1 + self.w[k], c, self.w[k] + self.eh * d1)
    }

    /// (A_i, C_i, D_i), recomputed from the checkpoint at or above i.
    fn state(&self, i: usize) -> (f64, f64, f64) {
        let m = i.div_ceil(BLOCK) * BLOCK;
        let (mut st, top) = if m < self.n() {
            (self.ck[m / BLOCK], m)
        } else {
            ((0.0, 0.0, 0.0), self.n())
        };
        for k in (i..top).rev() {
            st = self.step(k, st);
        }
        st
    }

    /// δ_w(ε) of the windowed grid distribution.
    fn delta_w(&self, eps: f64) -> f64 {
        let n = self.n();
        let j = (eps / self.h).floor() as i64 + 1;
        let i = j - self.k_lo;
        if i >= n as i64 {
            return 0.0;
        }
        let (i, u) = if i < 0 {
            (0usize, self.k_lo as f64 * self.h - eps)
        } else {
            (i as usize, j as f64 * self.h - eps)
        };
        let e = (-u).exp();
        let (a, c, _) = self.state(i);
        (a * (1.0 - e) + e * c).max(0.0)
    }

    /// The first i with C_i ≤ target (C is non-increasing and C_{n−1} = 0 ≤ target), with
    /// (A_i, C_i, D_i): binary search over the checkpoints, then a scan down the block.
    fn first_below(&self, target: f64) -> (usize, (f64, f64, f64)) {
        let n = self.n();
        if self.ck[0].1 <= target {
            return (0, self.ck[0]);
        }
        // First checkpoint j ≥ 1 with C ≤ target (ck.len() if none): ck[lo].C > target.
        let (mut lo, mut hi) = (0usize, self.ck.len());
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if self.ck[mid].1 <= target {
                hi = mid
            } else {
                lo = mid
            }
        }
        let mut i = (hi * BLOCK).min(n - 1);
        let mut st = self.state(i);
        while i > lo * BLOCK + 1 {
            let next = self.step(i - 1, st);
            if next.1 > target {
                break;
            }
            i -= 1;
            st = next;
        }
        (i, st)
    }

    /// Smallest ε with δ_w(ε) ≤ target (−∞ if every ε qualifies).
    fn eps_w(&self, target: f64) -> f64 {
        let (i, (a, _, d)) = self.first_below(target);
        let j = self.k_lo + i as i64;
        let num = a - target;
        if num <= 0.0 {
            return if i == 0 {
                f64::NEG_INFINITY
            } else {
                j as f64 * self.h - self.h
            };
        }
        let ratio = d / num;
        let mut u = ratio.ln().max(0.0);
        if i > 0 {
            u = u.min(self.h);
        }
        j as f64 * self.h - u
    }
}

/// Deterministic allowance, per composed step and in units of the grid step `h`, for the mean
/// bias of the in-bin split (whose quadrature error is estimated below `1e-7·h`): added to the
/// rounding shift `t` of both bounds.
const SPLIT_BIAS_PER_STEP: f64 = 1e-6;

struct Plan {
    h: f64,
    t: f64,
    eta: f64,
    tail_mass: f64,
    tau: f64,
}

fn compose_direction(
    parts: &[(SubsampledGaussian, u64)],
    dir: Direction,
    plan: &Plan,
    acc: &Accuracy,
) -> Result<ComposedDirection> {
    let h = plan.h;
    let eps_error = plan.t;
    let trace = std::env::var_os("RAPTOR_ACCOUNTANT_TRACE").is_some();
    let t0 = std::time::Instant::now();
    let mut pmfs = Vec::with_capacity(parts.len());
    for (m, t) in parts {
        let loss = Loss {
            q: m.q(),
            sigma: m.sigma(),
            dir,
        };
        pmfs.push((
            build_pmf(loss, h, plan.tail_mass, acc.max_points, eps_error)?,
            *t as f64,
        ));
    }
    let t_pmf = std::time::Instant::now();
    // Window by Chernoff.
    let logp: Vec<(LogPmf, f64)> = pmfs.iter().map(|(p, t)| (log_pmf(p), *t)).collect();
    let mut k_hi = chernoff_point(&logp, plan.tau, true).ceil();
    let mut k_lo = chernoff_point(&logp, plan.tau, false).floor();
    // Never wider than the full support of the sum.
    let full_lo: f64 = pmfs.iter().map(|(p, t)| t * p.offset as f64).sum();
    let full_hi: f64 = pmfs
        .iter()
        .map(|(p, t)| t * (p.offset + p.p.len() as i64 - 1) as f64)
        .sum();
    if !(k_hi.is_finite() && k_lo.is_finite()) || k_hi < k_lo {
        k_lo = full_lo;
        k_hi = full_hi;
    }
    k_lo = k_lo.max(full_lo);
    k_hi = k_hi.min(full_hi).max(k_lo);
    let needed = k_hi - k_lo + 1.0;
    if needed > acc.max_points as f64 {
        return Err(grid_too_large(needed, acc.max_points, eps_error));
    }
    let n = fft_size((needed as usize).max(2));
    let k_lo = k_lo as i64;
    if trace {
        eprintln!(
            "{dir:?}: h={h:.3e} window=[{k_lo},{k_hi}] n={n} pmf_lens={:?}",
            pmfs.iter().map(|(p, _)| p.p.len()).collect::<Vec<_>>()
        );
    }

    let t1 = std::time::Instant::now();
    // Real-to-complex FFTs: the grid pmfs are real, so only the n/2 + 1 non-negative
    // frequencies are transformed, raised to their counts and multiplied.
    let (r2c, c2r) = {
        // Plans (twiddle tables) are cached across calls: planning costs more than a transform.
        static PLANNER: OnceLock<Mutex<RealFftPlanner<f64>>> = OnceLock::new();
        let mut planner = PLANNER
            .get_or_init(|| Mutex::new(RealFftPlanner::new()))
            .lock()
            .map_err(|_| AccountantError::NumericalFailure("FFT planner lock"))?;
        (planner.plan_fft_forward(n), planner.plan_fft_inverse(n))
    };
    let fft_err = |_| AccountantError::NumericalFailure("FFT composition");
    let mut scratch = r2c.make_scratch_vec();
    let mut buf = r2c.make_input_vec();
    let mut acc_spec: Option<Vec<Complex64>> = None;
    for (p, t) in &pmfs {
        buf.iter_mut().for_each(|x| *x = 0.0);
        for (k, &v) in p.p.iter().enumerate() {
            let idx = (p.offset + k as i64).rem_euclid(n as i64) as usize;
            buf[idx] += v;
        }
        let mut spec = r2c.make_output_vec();
        r2c.process_with_scratch(&mut buf, &mut spec, &mut scratch)
            .map_err(fft_err)?;
        for z in spec.iter_mut() {
            *z = cpow(*z, *t);
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
    let mut spec = acc_spec.ok_or(AccountantError::EmptyComposition)?;
    // The DC and Nyquist terms of a real sequence's spectrum are real (so are their powers);
    // drop the round-off imaginary parts the inverse transform would reject.
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
    c2r.process_with_scratch(&mut spec, &mut out, &mut scratch)
        .map_err(fft_err)?;
    // Index r of the circular result holds the grid point k_lo + ((r − k_lo) mod n): rotate so
    // that position i holds k_lo + i, and undo the transform's scaling.
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
    let t2 = std::time::Instant::now();
    // Round-off allowance of the FFT (statistical: ~ε_mach·log2(n) per entry relative to the
    // L2 norm, accumulated over at most n entries as a random walk).
    let roundoff = 4.0 * f64::EPSILON * (n as f64).log2() * (n as f64).sqrt() * l2.sqrt();
    let trunc_up: f64 = pmfs.iter().map(|(p, t)| t * p.trunc_upper).sum();
    let trunc_low: f64 = pmfs.iter().map(|(p, t)| t * p.trunc_lower).sum();
    // Mean bias of the in-bin split: estimated below 1e-7·h per step; charged deterministically
    // at ten times that, so the shift covers it with room for the estimate's own error.
    let n_steps: f64 = pmfs.iter().map(|(_, t)| t).sum();
    let split_bias = SPLIT_BIAS_PER_STEP * h * n_steps;
    let composed = ComposedDirection::new(
        h,
        k_lo,
        w,
        plan.t + split_bias,
        plan.eta + trunc_up + 2.0 * plan.tau + roundoff,
        plan.eta + trunc_low + 2.0 * plan.tau + roundoff,
    );
    if trace {
        eprintln!(
            "{dir:?}: pmf {:?} window {:?} fft {:?} tables {:?}",
            t_pmf - t0,
            t1 - t_pmf,
            t2 - t1,
            t2.elapsed()
        );
    }
    Ok(composed)
}

/// z^t for a complex z with |z| ≤ 1 (polar form); 0 where |z|^t underflows.
fn cpow(z: Complex64, t: f64) -> Complex64 {
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
fn fft_size(n: usize) -> usize {
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

/// A composition's PRV in both directions, discretized for a given accuracy; answers any
/// number of ε(δ) / δ(ε) queries.
#[derive(Debug, Clone)]
pub struct ComposedPrv {
    dirs: Vec<ComposedDirection>,
    eps_error: f64,
    delta_error: f64,
}

impl ComposedPrv {
    /// The ε tolerance `t` the grid was built for.
    pub fn eps_error(&self) -> f64 {
        self.eps_error
    }

    /// The δ error budget (rounding tail + truncation + wrap-around).
    pub fn delta_error(&self) -> f64 {
        self.delta_error
    }

    /// Grid step.
    pub fn grid_step(&self) -> f64 {
        self.dirs.first().map_or(f64::NAN, |d| d.h)
    }

    /// Grid points of the largest direction.
    pub fn grid_points(&self) -> usize {
        self.dirs
            .iter()
            .map(ComposedDirection::n)
            .max()
            .unwrap_or(0)
    }

    /// ε(δ) bounds (max over both directions and all member combinations).
    pub fn epsilon(&self, delta: f64) -> Result<EpsilonBounds> {
        let delta = Delta::new(delta)?.get();
        let mut out = EpsilonBounds {
            upper: 0.0,
            estimate: 0.0,
            lower: 0.0,
            upper_remove: 0.0,
            upper_add: 0.0,
        };
        for (i, d) in self.dirs.iter().enumerate() {
            let room = delta - d.extra_up;
            if room <= 0.0 {
                return Err(AccountantError::DeltaBelowAccuracy {
                    delta,
                    delta_error: d.extra_up,
                });
            }
            let up = (d.eps_w(room) + d.t).max(0.0);
            let est = d.eps_w(delta).max(0.0);
            let low = (d.eps_w((delta + d.extra_low).min(1.0)) - d.t).max(0.0);
            if !(up.is_finite() && est.is_finite() && low.is_finite()) {
                return Err(AccountantError::NumericalFailure("epsilon query"));
            }
            out.upper = out.upper.max(up);
            out.estimate = out.estimate.max(est);
            out.lower = out.lower.max(low);
            if i % 2 == 0 {
                out.upper_remove = out.upper_remove.max(up);
            } else {
                out.upper_add = out.upper_add.max(up);
            }
        }
        out.estimate = out.estimate.clamp(out.lower, out.upper);
        Ok(out)
    }

    /// δ(ε) bounds (max over both directions and all member combinations).
    pub fn delta(&self, eps: f64) -> Result<DeltaBounds> {
        let eps = Epsilon::new(eps)?.get();
        let mut out = DeltaBounds {
            upper: 0.0,
            estimate: 0.0,
            lower: 0.0,
        };
        for d in &self.dirs {
            let up = (d.delta_w(eps - d.t) + d.extra_up).min(1.0);
            let est = d.delta_w(eps);
            let low = (d.delta_w(eps + d.t) - d.extra_low).max(0.0);
            out.upper = out.upper.max(up);
            out.estimate = out.estimate.max(est);
            out.lower = out.lower.max(low);
        }
        out.estimate = out.estimate.clamp(out.lower, out.upper);
        Ok(out)
    }
}

/// The PRV accountant.
///
/// ```
/// use raptor_accountant::{Composition, PrvAccountant, SubsampledGaussian};
/// let c = Composition::single(SubsampledGaussian::new(0.01, 1.0)?, 1_000)?;
/// let e = PrvAccountant::default().epsilon(&c, 1e-5)?;
/// assert!(e.lower <= e.estimate && e.estimate <= e.upper);
/// # Ok::<(), raptor_accountant::AccountantError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct PrvAccountant {
    accuracy: Accuracy,
}

impl PrvAccountant {
    /// An accountant with the given accuracy.
    pub fn new(accuracy: Accuracy) -> Result<Self> {
        accuracy.validate()?;
        Ok(Self { accuracy })
    }

    /// The accuracy.
    pub fn accuracy(&self) -> &Accuracy {
        &self.accuracy
    }

    /// ε(δ) of a composition: certified upper bound, estimate, lower bound.
    pub fn epsilon(&self, comp: &Composition, delta: f64) -> Result<EpsilonBounds> {
        let delta = Delta::new(delta)?.get();
        self.accuracy.validate()?;
        let delta_error = self.accuracy.delta_error_rel * delta;
        let eps_error = match self.accuracy.eps {
            EpsTolerance::Absolute(a) => a,
            EpsTolerance::Relative(rel) => {
                // Scale: a coarse PRV pass (at 5 % of the RDP ε, or the target accuracy if that
                // is coarser) estimates ε; the fine pass then uses rel × that estimate.
                let rdp = RdpAccountant::default()
                    .epsilon(comp, delta)?
                    .epsilon
                    .max(1e-9);
                let coarse_err = (0.05 * rdp).max(rel * rdp);
                let coarse = self
                    .compose(comp, coarse_err, delta_error)?
                    .epsilon(delta)?;
                if rel * rdp <= coarse_err
                    && coarse_err <= rel * coarse.estimate.max(coarse.upper * 0.5)
                {
                    return Ok(coarse);
                }
                rel * coarse.estimate.max(coarse.upper * 0.5).max(1e-9)
            }
        };
        let prv = self.compose(comp, eps_error, delta_error)?;
        prv.epsilon(delta)
    }

    /// δ(ε) of a composition: certified upper bound, estimate, lower bound.
    pub fn delta(&self, comp: &Composition, eps: f64) -> Result<DeltaBounds> {
        let eps = Epsilon::new(eps)?.get();
        self.accuracy.validate()?;
        let scale = eps.max(loss_sd(comp)?);
        let eps_error = self.accuracy.eps_error(scale);
        let prv = self.compose(comp, eps_error, self.accuracy.delta_error_abs)?;
        prv.delta(eps)
    }

    /// Discretize and compose both directions for an absolute ε tolerance `eps_error` and δ
    /// error budget `delta_error`, for repeated queries.
    pub fn compose(
        &self,
        comp: &Composition,
        eps_error: f64,
        delta_error: f64,
    ) -> Result<ComposedPrv> {
        self.accuracy.validate()?;
        if !(eps_error.is_finite() && eps_error > 0.0) {
            return Err(AccountantError::InvalidAccuracy {
                name: "eps_error",
                value: eps_error,
                reason: "must be positive and finite",
            });
        }
        if !(delta_error.is_finite() && delta_error > 0.0 && delta_error < 1.0) {
            return Err(AccountantError::InvalidAccuracy {
                name: "delta_error",
                value: delta_error,
                reason: "must lie in (0, 1)",
            });
        }
        let flats = comp.expand(self.accuracy.max_combinations)?;
        let mut dirs = Vec::with_capacity(2 * flats.len());
        for flat in &flats {
            let n_steps: f64 = flat.iter().map(|(_, t)| *t as f64).sum();
            let eta = 0.5 * delta_error;
            let t = eps_error;
            let h = t / (n_steps * (1.0 / eta).ln() / 2.0).sqrt();
            let plan = Plan {
                h,
                t,
                eta,
                tail_mass: 0.2 * delta_error / n_steps,
                tau: 0.1 * delta_error,
            };
            let (rem, add) = rayon::join(
                || compose_direction(flat, Direction::Remove, &plan, &self.accuracy),
                || compose_direction(flat, Direction::Add, &plan, &self.accuracy),
            );
            dirs.push(rem?);
            dirs.push(add?);
        }
        Ok(ComposedPrv {
            dirs,
            eps_error,
            delta_error,
        })
    }
}

/// Approximate standard deviation of the composed privacy loss (the grid's natural scale).
fn loss_sd(comp: &Composition) -> Result<f64> {
    let flats = comp.expand(1 << 16)?;
    let mut best = 0.0_f64;
    for flat in flats {
        let v: f64 = flat
            .iter()
            .map(|(m, t)| {
                let (q, s) = (m.q(), m.sigma());
                let per = (q * q * (1.0 / (s * s)).exp_m1()).min(1.0 / (s * s));
                per * *t as f64
            })
            .sum();
        best = best.max(v.sqrt());
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pmf_is_a_distribution_and_preserves_the_mean() {
        for dir in [Direction::Remove, Direction::Add] {
            let loss = Loss {
                q: 0.05,
                sigma: 1.2,
                dir,
            };
            let h = 1e-3;
            let p = build_pmf(loss, h, 1e-14, 1 << 24, 0.01).unwrap();
            let total: f64 = p.p.iter().sum();
            assert!((total - 1.0).abs() < 1e-12, "{dir:?}: {total}");
            // Mean of the grid pmf vs. numerically integrated mean of Y (KL divergence).
            let mean: f64 =
                p.p.iter()
                    .enumerate()
                    .map(|(k, v)| v * (p.offset + k as i64) as f64 * h)
                    .sum();
            let (a, b) = loss.support(1e-14);
            let n = 200_000;
            let dy = (b - a) / n as f64;
            let mut m = 0.0;
            for i in 0..n {
                let y = a + (i as f64 + 0.5) * dy;
                m += y * loss.density(y) * dy;
            }
            assert!((mean - m).abs() < 1e-6, "{dir:?}: {mean} vs {m}");
        }
    }

    #[test]
    fn pmf_mean_is_exact_on_coarse_grids() {
        // q = 1: Y ~ N(1/(2σ²), 1/σ²) in both directions; the grid mean must equal it even
        // when h is much larger than the spread.
        for &(s, h) in &[(0.5, 30.0), (0.5, 3.0), (2.0, 0.7), (2.0, 5.0)] {
            for dir in [Direction::Remove, Direction::Add] {
                let p = build_pmf(
                    Loss {
                        q: 1.0,
                        sigma: s,
                        dir,
                    },
                    h,
                    1e-14,
                    1 << 24,
                    0.01,
                )
                .unwrap();
                let mean: f64 =
                    p.p.iter()
                        .enumerate()
                        .map(|(k, v)| v * (p.offset + k as i64) as f64 * h)
                        .sum();
                let want = 1.0 / (2.0 * s * s);
                assert!(
                    (mean - want).abs() < 1e-9 * (1.0 + want),
                    "s={s} h={h} {dir:?}: {mean} vs {want}"
                );
            }
        }
    }

    /// Both bounds are moved by the rounding shift t plus the in-bin split allowance N·1e-6·h,
    /// in every direction of every composition (heterogeneous included).
    #[test]
    fn bounds_carry_the_split_bias_allowance() {
        let comp = Composition::single(SubsampledGaussian::new(0.01, 1.0).unwrap(), 3_000)
            .unwrap()
            .with(SubsampledGaussian::new(0.05, 2.0).unwrap(), 1_000)
            .unwrap();
        let (t, delta_error) = (0.05, 1e-8);
        let prv = PrvAccountant::default()
            .compose(&comp, t, delta_error)
            .unwrap();
        assert_eq!(prv.dirs.len(), 2);
        let n_steps = 4_000.0;
        let h = t / (n_steps * (1.0 / (0.5 * delta_error)).ln() / 2.0).sqrt();
        for d in &prv.dirs {
            assert!((d.h - h).abs() <= 1e-15 * h);
            let want = t + SPLIT_BIAS_PER_STEP * h * n_steps;
            assert!(
                (d.t - want).abs() <= 1e-15 * want && d.t > t,
                "shift {} vs {want}",
                d.t
            );
        }
    }

    /// E[Y] by brute-force quadrature in x (the output space).
    fn mean_by_quadrature(loss: Loss) -> f64 {
        let s = loss.sigma;
        let (lo, hi, n) = (-30.0 * s - 1.0, 30.0 * s + 2.0, 2_000_000);
        let dx = (hi - lo) / n as f64;
        let mut m = 0.0;
        for i in 0..n {
            let x = lo + (i as f64 + 0.5) * dx;
            let px = match loss.dir {
                Direction::Remove => {
                    (1.0 - loss.q) * norm_pdf(x / s) + loss.q * norm_pdf((x - 1.0) / s)
                }
                Direction::Add => norm_pdf(x / s),
            } / s;
            let y = match loss.dir {
                Direction::Remove => loss.g(x),
                Direction::Add => -loss.g(x),
            };
            m += px * y * dx;
        }
        m
    }

    #[test]
    fn pmf_mean_matches_quadrature_across_regimes() {
        for &(q, s, h) in &[
            (0.5, 0.5, 1.7),
            (1e-4, 0.5, 4e-5),
            (0.01, 1.0, 2e-4),
            (0.25, 8.0, 1e-3),
            (0.05, 2.0, 0.3),
        ] {
            for dir in [Direction::Remove, Direction::Add] {
                let loss = Loss { q, sigma: s, dir };
                let p = build_pmf(loss, h, 1e-14, 1 << 24, 0.01).unwrap();
                let mean: f64 =
                    p.p.iter()
                        .enumerate()
                        .map(|(k, v)| v * (p.offset + k as i64) as f64 * h)
                        .sum();
                let want = mean_by_quadrature(loss);
                eprintln!("q={q} s={s} h={h} {dir:?}: {mean:e} vs {want:e}");
                assert!(
                    (mean - want).abs() < 1e-8 * want.abs() + 1e-6 * h,
                    "q={q} s={s} h={h} {dir:?}: {mean:e} vs {want:e}"
                );
            }
        }
    }

    #[test]
    fn eval_matches_tail_density_and_finite_differences() {
        for &(q, s) in &[
            (0.01, 1.0),
            (0.25, 8.0),
            (1.0, 2.0),
            (1e-4, 0.5),
            (0.5, 0.6),
        ] {
            for dir in [Direction::Remove, Direction::Add] {
                let loss = Loss { q, sigma: s, dir };
                let (a, b) = loss.support(1e-12);
                for i in 1..40 {
                    let y = a + (b - a) * i as f64 / 40.0;
                    for upper in [false, true] {
                        let (v, f, df) = loss.eval(y, upper);
                        assert_eq!(v, loss.tail(y, upper), "q={q} s={s} {dir:?} y={y}");
                        assert_eq!(f, loss.density(y), "q={q} s={s} {dir:?} y={y}");
                        let e = 1e-6 * (b - a);
                        let fd = (loss.density(y + e) - loss.density(y - e)) / (2.0 * e);
                        let scale = f.abs() / (b - a) + df.abs() + 1e-300;
                        assert!(
                            (df - fd).abs() <= 1e-5 * scale,
                            "q={q} s={s} {dir:?} y={y}: {df:e} vs {fd:e}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn remove_gaussian_loss_is_normal() {
        // q = 1: Y ~ N(1/(2σ²), 1/σ²).
        let s = 2.0;
        let loss = Loss {
            q: 1.0,
            sigma: s,
            dir: Direction::Remove,
        };
        let mu = 1.0 / (2.0 * s * s);
        for y in [-1.0, 0.0, 0.3, 1.5] {
            let want = norm_cdf((y - mu) * s);
            assert!((loss.tail(y, false) - want).abs() < 1e-14);
        }
    }

    /// The grid pmf by brute force: bin masses from tail differences, each split by composite
    /// cubic Hermite quadrature from 512 sub-steps doubled until it moves by < 1e-11 of the
    /// bin's mass (no edge-only rule). Returns (offset, pmf, bin masses).
    fn slow_pmf(loss: Loss, h: f64, tail_mass: f64) -> (i64, Vec<f64>, Vec<f64>) {
        let (a, b) = loss.support(tail_mass);
        let a_idx = (a / h).floor() as i64;
        let nbins = ((b / h).ceil() as i64 - a_idx).max(1) as usize;
        let switch = ((loss.median_guess() / h).floor() as i64 - a_idx).clamp(0, nbins as i64);
        let mut p = vec![0.0; nbins + 1];
        let mut masses = vec![0.0; nbins];
        p[0] += loss.tail(a_idx as f64 * h, false);
        p[nbins] += loss.tail((a_idx + nbins as i64) as f64 * h, true);
        let m = 256;
        for j in 0..nbins {
            let upper = j as i64 >= switch;
            let y0 = (a_idx + j as i64) as f64 * h;
            let v0 = loss.tail(y0, upper);
            let g = |y: f64| {
                let v = loss.tail(y, upper);
                if upper { v0 - v } else { v - v0 }
            };
            let composite = |m: usize| {
                let hs = h / m as f64;
                let mut acc = 0.0;
                for i in 0..m {
                    let (ya, yb) = (y0 + i as f64 * hs, y0 + (i + 1) as f64 * hs);
                    acc += hs * 0.5 * (g(ya) + g(yb))
                        + hs * hs * (loss.density(ya) - loss.density(yb)) / 12.0;
                }
                acc
            };
            let mass = g(y0 + h).max(0.0);
            // Doubled until it moves by < 1e-11 of the mass (bins where the density varies
            // on a scale much finer than h, at the support's ends).
            let mut m = m;
            let mut lower = composite(m);
            while m < 1 << 16 {
                m *= 2;
                let next = composite(m);
                let done = (next - lower).abs() <= 1e-11 * mass * h;
                lower = next;
                if done {
                    break;
                }
            }
            let lower = (lower / h).clamp(0.0, mass);
            p[j] += lower;
            p[j + 1] += mass - lower;
            masses[j] = mass;
        }
        (a_idx, p, masses)
    }

    #[test]
    fn pmf_matches_a_brute_force_split() {
        for &(q, s, h) in &[
            (0.01, 1.0, 2e-3),
            (0.25, 8.0, 1e-3),
            (0.5, 0.6, 0.05),
            (1.0, 2.0, 0.01),
        ] {
            for dir in [Direction::Remove, Direction::Add] {
                let loss = Loss { q, sigma: s, dir };
                let fast = build_pmf(loss, h, 1e-12, 1 << 24, 0.01).unwrap();
                let (offset, slow, masses) = slow_pmf(loss, h, 1e-12);
                assert_eq!(fast.offset, offset);
                assert_eq!(fast.p.len(), slow.len());
                for (k, (x, y)) in fast.p.iter().zip(&slow).enumerate() {
                    // Each entry is split off its two neighbouring bins, each split accurate to
                    // 1e-7 of its bin's mass (plus round-off of the tail differences).
                    let near = masses[k.saturating_sub(1)] + masses.get(k).copied().unwrap_or(0.0);
                    assert!(
                        (x - y).abs() <= 1e-7 * near + 1e-12 * y.abs() + 1e-18,
                        "q={q} s={s} h={h} {dir:?} k={k}: {x:e} vs {y:e}"
                    );
                }
            }
        }
    }

    #[test]
    fn checkpointed_tables_are_bit_identical_to_full_tables() {
        for &(n, h) in &[
            (1usize, 0.1),
            (31, 0.05),
            (32, 0.05),
            (33, 0.05),
            (1000, 1e-3),
        ] {
            // A positive pmf with a bump, plus round-off-like negative entries.
            let w: Vec<f64> = (0..n)
                .map(|i| {
                    let x = (i as f64 - 0.4 * n as f64) / (0.1 * n as f64 + 1.0);
                    (-0.5 * x * x).exp() + if i % 7 == 3 { -1e-17 } else { 0.0 }
                })
                .collect();
            let total: f64 = w.iter().sum();
            let w: Vec<f64> = w.iter().map(|x| x / total).collect();
            let dir = ComposedDirection::new(h, -7, w.clone(), 0.01, 0.0, 0.0);
            // The full tables, as computed before checkpointing.
            let (eh, omeh) = ((-h).exp(), -(-h).exp_m1());
            let (mut a, mut c, mut d) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
            let (mut sa, mut sd, mut next_c) = (0.0_f64, 0.0_f64, 0.0_f64);
            for i in (0..n).rev() {
                let ci = if i + 1 < n {
                    omeh * sa + eh * next_c
                } else {
                    0.0
                };
                sa += w[i];
                sd = w[i] + eh * sd;
                (a[i], c[i], d[i]) = (sa, ci, sd);
                next_c = ci;
            }
            for i in 0..n {
                assert_eq!(dir.state(i), (a[i], c[i], d[i]), "n={n} i={i}");
            }
            for k in 0..200 {
                let target = 10f64.powf(-12.0 * k as f64 / 199.0) * c[0].max(1e-300) * 1.5;
                // Binary search on the full table.
                let (mut lo, mut hi) = (0usize, n - 1);
                if c[0] <= target {
                    hi = 0;
                } else {
                    while hi - lo > 1 {
                        let mid = (lo + hi) / 2;
                        if c[mid] <= target { hi = mid } else { lo = mid }
                    }
                }
                let (i, st) = dir.first_below(target);
                assert_eq!(i, hi, "n={n} target={target:e}");
                assert_eq!(st, (a[i], c[i], d[i]));
            }
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
