//! Heavy per-step upper tails: the body of each step's loss is composed by the tilted FFT, and
//! the steps whose loss lands in the rare tail are counted (the [module docs](super), method 8).
//!
//! With a cut `c_i` per part (a grid value), write the law of one step of part `i` as
//! `β_i + τ_i`, `β_i` the loss restricted to `Y ≤ c_i` and `τ_i` to `Y > c_i` (mass
//! `π_i = P(Y > c_i)`). Expanding the composition by the number `k` of steps in their tails
//! (all terms non-negative, `0 ≤ f_ε ≤ 1`):
//!
//! - `k = 0`: `Π β_i^{*T_i}`, whose δ is at most `U(ε)`, the certified bound of the body's
//!   [`super::ComposedDirection`]: the grid pmfs of the `β_i` (sub-probabilities: the
//!   pessimistic pmf of the clamped loss `Y_c = min(Y, c)` without its top mass `P(Y > c)`,
//!   no truncation charge at the top). Their round-off is the clamped pmf's (module docs,
//!   round-off, 5) plus the error of the computed top mass, at most
//!   `T_i·|P(Y > c) − computed|` on δ (`f_ε ≤ 1`), bounded from the exact tails at points
//!   certainly below and above `c`; it is added to the constant term.
//! - `k = 1`: `Σ_i T_i ∫_{y > c_i} P(dy)·D_i(ε − y)` with `D_i` the δ of `Π β^{*}` less one
//!   step of part `i`, bounded by the body composed with one step fewer of that part (with a
//!   single tail part), or else through `δ_{Πβ}(x − s_i) ≥ β_i([−s_i, ∞))·D_i(x)` (since
//!   `f_{x−s}(a + y) ≥ f_x(a)` for `y ≥ −s`): with `s_i ≥ −ln(1 − q_i)`, the loss's infimum in
//!   the remove direction, that mass is `1 − π_i`, so `D_i(x) ≤ min(1, U(x − s_i)/(1 − π_i))`.
//!   `D_i(ε − y) = E[f_ε(R + y)]` is non-decreasing in `y` and convex in `e^{−y}` (step 2 of
//!   the method), so on each bin `[y_0, y_0 + h]` above the cut the pessimistic split applies:
//!   `E[D_i(ε − Y); bin] ≤ p⁻·D_i(ε − y_0) + p⁺·D_i(ε − y_0 − h)`, with `p⁺` increasing in the
//!   bin's P-mass and decreasing in its Q-mass, so that the largest P-mass and the smallest
//!   Q-mass the exact tails allow (bracketed from erfc with the pmf's error bounds at points
//!   whose loss lies certainly below and above each edge) give grid masses `m_j` with
//!   `∫ D_i dτ ≤ Σ_j m_j·ĝ_j + P(Y > Jh)` for any non-decreasing `ĝ_j ≥ D_i(ε − jh)`: the
//!   running maximum of the bound on `D_i`, read on groups of grid points at their top point
//!   (summation by parts: non-negative increments of `ĝ` times suffix sums of `m`).
//! - `k ≥ 2`: at most `P(N ≥ 2) ≤ (Σ_i T_i π_i)²/2` for the number `N` of tail steps (a sum of
//!   independent Bernoullis: `E[N(N − 1)] ≤ (E N)²`).
//!
//! The sum of the three is a certified upper bound on δ(ε). The cut is where `Σ T_i π_i` is
//! about `√τ` (so that the `k ≥ 2` term is at most τ/2): there the clamped losses' tilted
//! MGF no longer sees the far tail, whose Chernoff factor kept the FFT's round-off charge many
//! orders above δ. The lower bound needs nothing new: clamping only lowers the losses, so the
//! body's certified lower bound is one for the full composition.

use super::{Loss, UNIT_ROUNDOFF};

/// One part's tail: the cut, the steps, the shift and the upper tails above the cut.
#[derive(Debug, Clone)]
pub(super) struct TailPart {
    /// The number of steps of this part.
    pub(super) t: f64,
    /// The cut `c = k_cut·h`.
    pub(super) k_cut: i64,
    /// The shift `s ≥ −ln(1 − q)` (the loss is above `−s`).
    pub(super) s: f64,
    /// An upper bound on `1/(1 − π)`.
    pub(super) inv_m: f64,
    /// Suffix sums `M_i = Σ_{i' ≥ i} m_{k_cut + i'} + P(Y > Jh)` of the grid masses above
    /// the cut (module docs), `i = 0, 1, …`, the last entry the mass beyond the table alone.
    pub(super) tails: Vec<f64>,
}

/// The tail terms of a split composition (`k = 1` and `k ≥ 2` above, and the error of the
/// dropped top mass).
#[derive(Debug, Clone)]
pub(super) struct SplitTail {
    pub(super) h: f64,
    pub(super) parts: Vec<TailPart>,
    /// `(Σ T_i π_i)²/2` plus `Σ T_i·|P(Y > c_i) − its computed value|`, rounded up.
    pub(super) rho2: f64,
    /// The body composed again, untilted (the `k = 1` term reads it far below the window's
    /// tilt, where the tilted window's values may have been dropped): with one step fewer of
    /// the only part that has a tail (`low_less_one`), a bound on that part's `D_i` itself;
    /// else another certified bound on the body's δ (the smaller of the two is used).
    pub(super) low: Option<super::ComposedDirection>,
    /// Whether `low` composes one step fewer of the (only) part with a tail.
    pub(super) low_less_one: bool,
}

impl SplitTail {
    /// The `k = 1` and `k ≥ 2` terms at ε, with `d(part, x)` a certified upper bound on
    /// `D_i(x)`, the δ at `x` of the body's composition less one step of that part.
    pub(super) fn term(&self, eps: f64, d: impl Fn(&TailPart, f64) -> f64) -> f64 {
        let mut total = self.rho2;
        for part in &self.parts {
            let n = part.tails.len();
            if n == 0 {
                continue;
            }
            // Bins K+1+i for i in [i0, i1] form a group read at its top bin: the group's
            // ĝ is the running maximum with D at the top (D is non-increasing in x), so
            // summation by parts charges (ĝ − ĝ_prev)·P(Y > (K + i0)h). Groups grow (double)
            // while their excess over single bins, at most (ĝ − ĝ_prev)·P(group), stays below
            // 1e-8 of the sum; that only sets the tightness.
            let mut g_prev = 0.0_f64;
            let mut sum = 0.0_f64;
            let mut rem = part.tails[n - 1];
            let mut i0 = 0usize;
            let mut stride = 1usize;
            while i0 < n - 1 {
                let i1 = (i0 + stride).min(n - 1) - 1;
                let j = part.k_cut + i1 as i64;
                let b = d(part, eps - j as f64 * self.h);
                let g = if b.is_nan() { 1.0 } else { b.min(1.0) }.max(g_prev);
                let inc = g - g_prev;
                sum += inc * part.tails[i0];
                let excess = inc * (part.tails[i0] - part.tails[i1 + 1]);
                g_prev = g;
                i0 = i1 + 1;
                // What is left is at most (1 − ĝ)·P(Y > (K + i0)h).
                let left = (1.0 - g) * part.tails[i0];
                if g >= 1.0 || left <= 1e-9 * sum {
                    rem = left;
                    break;
                }
                rem = left;
                if excess <= 1e-8 * sum {
                    stride = (2 * stride).min(1 << 16);
                } else {
                    stride = (stride / 2).max(1);
                }
            }
            total += part.t * (sum + rem);
        }
        // Sums of non-negative terms: a relative rounding of at most n·u, with room.
        let steps: usize = self.parts.iter().map(|p| p.tails.len()).sum();
        total * (1.0 + 4.0 * (steps as f64 + 8.0) * UNIT_ROUNDOFF)
    }
}

/// An upper bound on the exact `P(Y > y)` (the law under P): the exact tails at a common output
/// point whose loss lies certainly below `y` (8d below it when that point's own backward error
/// is at most 5.8d, else half a bin), with their relative and absolute error bounds. `None`
/// where no bound is available.
pub(super) fn tail_above(loss: &Loss, y: f64, h: f64) -> Option<f64> {
    let u = UNIT_ROUNDOFF;
    let t = loss.edge_tails(y, true);
    if t.rel == 0.0 && t.d == 0.0 {
        let v = t.p + t.abs;
        return (v.is_finite() && v >= 0.0).then_some(v.min(1.0));
    }
    let near = loss.edge_tails(y - 8.0 * t.d, true);
    let c = if near.d <= 5.8 * t.d {
        near
    } else {
        let c = loss.edge_tails(y - 0.5 * h, true);
        if c.d.is_nan() || c.d > 0.25 * h {
            return None;
        }
        c
    };
    if c.rel.is_nan() || c.rel >= 0.5 {
        return None;
    }
    let v = (c.p / (1.0 - c.rel) + c.abs) * (1.0 + 2.0 * u);
    (v.is_finite() && v >= 0.0).then_some(v.min(1.0))
}

/// A lower bound on the exact `P(Y > y)`: the exact tails at a common output point whose loss
/// lies certainly above `y` (the mirror of [`tail_above`]). `None` where no bound is available.
pub(super) fn tail_at_least(loss: &Loss, y: f64, h: f64) -> Option<f64> {
    let t = loss.edge_tails(y, true);
    if t.rel == 0.0 && t.d == 0.0 {
        let v = t.p - t.abs;
        return v.is_finite().then_some(v.max(0.0));
    }
    let near = loss.edge_tails(y + 8.0 * t.d, true);
    let c = if near.d <= 5.8 * t.d {
        near
    } else {
        let c = loss.edge_tails(y + 0.5 * h, true);
        if c.d.is_nan() || c.d > 0.25 * h {
            return None;
        }
        c
    };
    if c.rel.is_nan() || c.rel >= 0.5 {
        return None;
    }
    let v = (c.p / (1.0 + c.rel) - c.abs) * (1.0 - 2.0 * UNIT_ROUNDOFF);
    v.is_finite().then_some(v.max(0.0))
}

/// Brackets `(P_lo, P_hi, Q_lo, Q_hi)` of the exact tails `P(Y > y)` and `Q(Y > y)` (both
/// non-increasing in y): the exact tails at common output points whose loss lies certainly
/// below y (upper bounds) and certainly above it (lower bounds). `None` where no bound is
/// available.
pub(super) fn tails_bracket(loss: &Loss, y: f64, h: f64) -> Option<(f64, f64, f64, f64)> {
    let u = UNIT_ROUNDOFF;
    let t = loss.edge_tails(y, true);
    if t.rel == 0.0 && t.d == 0.0 {
        let (p, q) = (t.p, t.q);
        return (p.is_finite() && q.is_finite()).then_some((
            (p - t.abs).max(0.0),
            (p + t.abs).min(1.0),
            (q - t.abs).max(0.0),
            (q + t.abs).min(1.0),
        ));
    }
    let at = |dir: f64| -> Option<super::EdgeTails> {
        let near = loss.edge_tails(y + dir * 8.0 * t.d, true);
        if near.d <= 5.8 * t.d {
            return Some(near);
        }
        let c = loss.edge_tails(y + dir * 0.5 * h, true);
        (c.d <= 0.25 * h).then_some(c)
    };
    let (below, above) = (at(-1.0)?, at(1.0)?);
    if !(below.rel < 0.5 && above.rel < 0.5) {
        return None;
    }
    let up =
        |v: f64, e: &super::EdgeTails| ((v / (1.0 - e.rel) + e.abs) * (1.0 + 2.0 * u)).min(1.0);
    let down =
        |v: f64, e: &super::EdgeTails| ((v / (1.0 + e.rel) - e.abs) * (1.0 - 2.0 * u)).max(0.0);
    let out = (
        down(above.p, &above),
        up(below.p, &below),
        down(above.q, &above),
        up(below.q, &below),
    );
    (out.0.is_finite() && out.1.is_finite() && out.2.is_finite() && out.3.is_finite())
        .then_some(out)
}

/// The grid masses `m_j` above a cut from the tails' brackets at the edges `y_e = (k + e)h`
/// (module docs, `k = 1`): per bin the largest P-mass and the smallest Q-mass, split
/// pessimistically (`p⁺` rounded up), as suffix sums, the last entry `P_hi` at the last edge
/// (the mass beyond the table).
pub(super) fn tail_suffix(brackets: &[(f64, f64, f64, f64)], k: i64, h: f64) -> Vec<f64> {
    let u = UNIT_ROUNDOFF;
    let n = brackets.len();
    if n == 0 {
        return Vec::new();
    }
    let omeh = -(-h).exp_m1();
    let mut m = vec![0.0_f64; n];
    for e in 0..n - 1 {
        let (a, b) = (brackets[e], brackets[e + 1]);
        let p_hi = (a.1 - b.0).max(0.0) * (1.0 + 2.0 * u);
        let q_lo = (a.2 - b.3).max(0.0) * (1.0 - 2.0 * u);
        let y0 = (k + e as i64) as f64 * h;
        let raw = (p_hi - y0.exp() * (1.0 - 4.0 * u) * q_lo) / omeh;
        // The subtraction and division round at most a few u of p_hi/omeh.
        let plus = (raw + 16.0 * u * p_hi / omeh).clamp(0.0, p_hi);
        m[e] += p_hi - plus;
        m[e + 1] += plus;
    }
    // Suffix sums (of non-negative terms), plus the mass beyond the last edge.
    let beyond = brackets[n - 1].1;
    let mut out = vec![0.0_f64; n + 1];
    out[n] = beyond;
    for e in (0..n).rev() {
        out[e] = (out[e + 1] + m[e]) * (1.0 + 2.0 * u);
    }
    out
}
