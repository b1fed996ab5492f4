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
//!   step of part `i`. Since `f_{x−s}(a + y) ≥ f_x(a)` for `y ≥ −s`, `δ_{Πβ}(x − s_i) ≥
//!   β_i([−s_i, ∞))·D_i(x)`; with `s_i ≥ −ln(1 − q_i)` (the loss's infimum in the remove
//!   direction) that mass is `1 − π_i`, so `D_i(x) ≤ min(1, U(x − s_i)/(1 − π_i))`. `D_i` is
//!   non-increasing, so on `y ∈ ((j−1)h, jh]`, `D_i(ε − y) ≤ ĝ_j`, the running maximum over
//!   `j' ≤ j` of `min(1, U(ε − s_i − j'h)/(1 − π_i))`, and summation by parts turns
//!   `Σ_j P(bin j)·ĝ_j + P(Y > Jh)` into non-negative increments of `ĝ` times upper tails
//!   `P(Y > (j−1)h)`, which are bounded from the exact tails (erfc, with the pmf's error
//!   bounds) at a point whose loss lies certainly below the grid value.
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
    /// Upper bounds on `P(Y > (k_cut + i)h)`, `i = 0, 1, …` (non-increasing).
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
    /// The body composed again with its tilt centred lower (at the estimated ε less the
    /// smallest cut), where the `k = 1` term reads it: with one step fewer of the only part
    /// that has a tail (`low_less_one`), a bound on that part's `D_i` itself; else another
    /// certified bound on the body's δ (the smaller of the two is used).
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
                let j = part.k_cut + 1 + i1 as i64;
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
        if !(c.d <= 0.25 * h) {
            return None;
        }
        c
    };
    if !(c.rel < 0.5) {
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
        if !(c.d <= 0.25 * h) {
            return None;
        }
        c
    };
    if !(c.rel < 0.5) {
        return None;
    }
    let v = (c.p / (1.0 + c.rel) - c.abs) * (1.0 - 2.0 * UNIT_ROUNDOFF);
    v.is_finite().then_some(v.max(0.0))
}
