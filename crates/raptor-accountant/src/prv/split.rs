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
//!
//! **The `k = 2` term counted too (one part with a tail, `T ≥ 2`).** A cut at `T·π ≈ √τ` can
//! still leave the body heavy-tailed (at q = 1e-5, σ 0.8, T 10⁴, δ 1e-8 the cut lies at a loss
//! twice ε): its doubly tilted sum then reaches far beyond the window, the tilt is halved, and
//! the FFT's round-off, relative to the halved tilt's Chernoff factor, cost 1.7e-3·δ (3.2× the
//! default tolerance in ε). A lower cut makes the body light, but `(Tπ)²/2` grows. So, with a
//! single tail part, the expansion keeps `k = 2` as a term of its own and bounds only `k ≥ 3`:
//!
//! - `k = 2`: `C(T, 2)·∫∫ τ(dy₁)τ(dy₂)·D₂(ε − y₁ − y₂)`, `D₂` the δ of the body less two steps
//!   of the part. *Bound on `D₂` from `D₁`:* `D₁(x) = ∫ β(dy)·D₂(x − y)` (one more body step,
//!   `β` of mass `1 − π`), and `y ↦ D₂(x − y) = ψ(e^{−y})`, `ψ(v) = E[(1 − e^{x − R}v)₊]`, is
//!   convex and non-increasing in `v`; by Jensen's inequality for the probability `β/(1 − π)`,
//!   `D₁(x) ≥ (1 − π)·ψ(v̄)` with `v̄ = E_β[e^{−Y}]/(1 − π) = Q(Y ≤ c)/(1 − π) ≤ 1/(1 − π)`
//!   (`e^{−Y}` is `dQ/dP`), so `D₁(x) ≥ (1 − π)·ψ(1/(1 − π)) = (1 − π)·D₂(x + ln(1/(1 − π)))`:
//!   `D₂(z) ≤ m·D₁(z − ln m)` for any `m ≥ 1/(1 − π)` (`D₁` non-increasing), a shift of about
//!   π (1e-9), not the loss's infimum `−ln(1 − q)`. *Discretization:* for fixed `y₂`,
//!   `y₁ ↦ D₂(ε − y₁ − y₂)` is non-negative, non-decreasing and convex in `e^{−y₁}`, so the
//!   `k = 1` argument bounds the inner integral by `Σ_j m_j·D₂(ε − jh − y₂) + P(Y > Jh)`
//!   (`D₂ ≤ 1`), and again for `y₂`: the term is at most
//!   `C(T, 2)·[Σ_J (m ∗ m)_J·ĝ_J + P(Y > Jh)·(Σ_j m_j + π)]` with `ĝ_J ≥ D₂(ε − Jh)`
//!   non-decreasing, read by the same summation by parts. *The convolution `m ∗ m`* (the table
//!   is long: up to 10⁶ entries) is computed by a real FFT of a size that does not wrap: with
//!   `μ ≥ Σ m_j` and the assumed componentwise accuracy `η = c·log2(n)·u` of each transform
//!   (module docs, round-off, 3), the forward error per frequency is at most `ημ`, the square's
//!   at most `ημ²(2 + η) + 4u(1 + η)²μ²` (`|M_j| ≤ μ`; a complex product within 4u), the
//!   inverse's own at most `η·(1 + η)²μ²` per entry after the `1/n` (`‖Ẑ‖₁ ≤ n(1 + η)²μ²`),
//!   the scaling `2u(1 + η)²μ²`: every entry lies within `e_c` of the exact one, which is
//!   non-negative, so `max(ĉ_J + e_c, 0)` bounds it from above (`e_c ≈ 1e-13·μ²`, a relative
//!   1e-13 of the term).
//! - `k ≥ 3`: at most `P(N ≥ 3) ≤ E[C(N, 3)] ≤ (Tπ)³/6` (`E[N(N − 1)(N − 2)] ≤ (E N)³`).
//!
//! The cut is then where `T·π` is about the smaller of `(3τ)^{1/3}` (the `k ≥ 3` bound at most
//! τ/2) and `τ/(3T·η)` (the `k = 1` term multiplies the untilted body's absolute round-off,
//! about `3T·η`, by `T·π`), but not below `√τ`: at δ = 1e-8 (τ = 2e-14, T 10⁴) about 1e-5
//! instead of 1.4e-7, a loss below ε. Where the cut does not apply to exactly one part with
//! `T ≥ 2`, the `√τ` cut and the `k ≥ 2` bound are used as before.

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
    /// Where the `k = 2` term is counted (module docs): suffix sums of the upper bounds on
    /// `(m ∗ m)_J`, the pair masses at `(2·k_cut + J)h`, the last entry the pair mass beyond
    /// the table, `P(Y > Jh)·(Σ_j m_j + π)`. Empty where `k ≥ 2` is bounded as a whole.
    pub(super) pair: Vec<f64>,
}

/// The tail terms of a split composition (`k = 1` and `k ≥ 2` above, and the error of the
/// dropped top mass).
#[derive(Debug, Clone)]
pub(super) struct SplitTail {
    pub(super) h: f64,
    pub(super) parts: Vec<TailPart>,
    /// `(Σ T_i π_i)²/2` (`(Σ T_i π_i)³/6` where the `k = 2` term is counted) plus
    /// `Σ T_i·|P(Y > c_i) − its computed value|`, rounded up.
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
    /// The `k = 1` and `k ≥ 2` terms at ε (`k = 2` counted where `pair` is kept), with
    /// `d(part, x)` a certified upper bound on `D_i(x)`, the δ at `x` of the body's composition
    /// less one step of that part.
    pub(super) fn term(&self, eps: f64, d: impl Fn(&TailPart, f64) -> f64) -> f64 {
        let mut total = self.rho2;
        let mut steps = 0usize;
        for part in &self.parts {
            steps += part.tails.len() + part.pair.len();
            total += part.t * suffix_term(&part.tails, part.k_cut, self.h, eps, |x| d(part, x));
            if !part.pair.is_empty() {
                // D₂(z) ≤ m·D₁(z − ln m), m = inv_m ≥ 1/(1 − π) (module docs); ln m from
                // ln_1p of the exact m − 1, rounded up with room.
                let m = part.inv_m;
                let ln_m = (m - 1.0).ln_1p() * (1.0 + 1e-6);
                let pairs = 0.5 * part.t * (part.t - 1.0) * (1.0 + 4.0 * UNIT_ROUNDOFF);
                total += pairs
                    * suffix_term(&part.pair, 2 * part.k_cut, self.h, eps, |x| {
                        m * d(part, x - ln_m)
                    });
            }
        }
        // Sums of non-negative terms: a relative rounding of at most n·u, with room.
        total * (1.0 + 4.0 * (steps as f64 + 8.0) * UNIT_ROUNDOFF)
    }
}

/// `Σ_j m_j·ĝ_j + (mass beyond)` for grid masses `m_j` at `(k0 + j)h` given by their suffix
/// sums `tails` (the last entry the mass beyond the table), with `ĝ_j ≥ g(ε − (k0 + j)h)`
/// non-decreasing in j and at most 1 (`g` a certified bound on a non-increasing function of
/// x, at most 1 where it matters): by summation by parts, the non-negative increments of ĝ
/// times the suffix sums.
fn suffix_term(tails: &[f64], k0: i64, h: f64, eps: f64, g: impl Fn(f64) -> f64) -> f64 {
    let n = tails.len();
    if n == 0 {
        return 0.0;
    }
    // Bins k0+i for i in [i0, i1] form a group read at its top bin: the group's ĝ is the
    // running maximum with g at the top (g is non-increasing in x), so summation by parts
    // charges (ĝ − ĝ_prev)·M_{i0}. A group of several bins is kept only where its excess over
    // single bins, at most (ĝ − ĝ_prev)·(mass of the group), is at most 1e-8 of the sum with
    // it (else it is retried at half the stride); the stride doubles after a group whose
    // excess is below 1e-9 of it. That only sets the tightness: every group is read at its top.
    let mut g_prev = 0.0_f64;
    let mut sum = 0.0_f64;
    let mut rem = tails[n - 1];
    let mut i0 = 0usize;
    let mut stride = 1usize;
    while i0 < n - 1 {
        let i1 = (i0 + stride).min(n - 1) - 1;
        let j = k0 + i1 as i64;
        let b = g(eps - j as f64 * h);
        let gv = if b.is_nan() { 1.0 } else { b.min(1.0) }.max(g_prev);
        let inc = gv - g_prev;
        let excess = inc * (tails[i0] - tails[i1 + 1]);
        let with = sum + inc * tails[i0];
        if i1 > i0 && excess > 1e-8 * with {
            stride = (stride / 2).max(1);
            continue;
        }
        sum = with;
        g_prev = gv;
        i0 = i1 + 1;
        // What is left is at most (1 − ĝ)·M_{i0}.
        let left = (1.0 - gv) * tails[i0];
        rem = left;
        if gv >= 1.0 || left <= 1e-9 * sum {
            break;
        }
        if excess <= 1e-9 * sum {
            stride = (2 * stride).min(1 << 16);
        }
    }
    sum + rem
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
/// (the mass beyond the table); and the masses themselves (at `y_e`).
pub(super) fn tail_suffix(
    brackets: &[(f64, f64, f64, f64)],
    k: i64,
    h: f64,
) -> (Vec<f64>, Vec<f64>) {
    let u = UNIT_ROUNDOFF;
    let n = brackets.len();
    if n == 0 {
        return (Vec::new(), Vec::new());
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
    (out, m)
}

/// The self-convolution `m ∗ m` of non-negative masses by a real FFT of a size that does not
/// wrap, and the bound `e_c` on every entry's error (module docs, `k = 2`: forward transform,
/// square, inverse, scaling, under the assumed componentwise accuracy of the FFT).
pub(super) fn pair_masses(m: &[f64]) -> crate::error::Result<(Vec<f64>, f64)> {
    let u = UNIT_ROUNDOFF;
    let fail = || crate::error::AccountantError::NumericalFailure("tail pair convolution");
    let nm = m.len();
    if nm == 0 {
        return Ok((Vec::new(), 0.0));
    }
    let len = 2 * nm - 1;
    let n = super::compose::fft_size(len.max(2));
    let (r2c, c2r) = super::compose::fft_plans(n)?;
    let mut buf = r2c.make_input_vec();
    buf[..nm].copy_from_slice(m);
    // μ ≥ Σ m_j (non-negative terms: n·u relative, with room).
    let mu = m.iter().sum::<f64>() * (1.0 + 2.0 * (nm as f64 + 2.0) * u);
    let mut spec = r2c.make_output_vec();
    let mut scratch = r2c.make_scratch_vec();
    r2c.process_with_scratch(&mut buf, &mut spec, &mut scratch)
        .map_err(|_| fail())?;
    for z in spec.iter_mut() {
        *z = *z * *z;
    }
    let mut out = super::compose::inverse_real(&*c2r, &mut spec, n).map_err(|_| fail())?;
    let eta = super::compose::fft_eta(n);
    let g2 = (1.0 + eta) * (1.0 + eta) * mu * mu;
    let e_c = 1.01
        * (eta * mu * mu * (2.0 + eta) + 4.0 * u * g2 + eta * g2 * (1.0 + 4.0 * u) + 2.0 * u * g2);
    let scale = 1.0 / n as f64;
    out.truncate(len);
    out.iter_mut().for_each(|x| *x *= scale);
    if !e_c.is_finite() || out.iter().any(|x| !x.is_finite()) {
        return Err(fail());
    }
    Ok((out, e_c))
}

/// The suffix sums of the `k = 2` term (module docs): upper bounds `max(ĉ_J + e_c, 0)` on the
/// pair masses `(m ∗ m)_J` ([`pair_masses`]), the last entry the pair mass beyond the table,
/// `beyond·(Σ_j m_j + pi_hi)`. `m`: the table's masses; `beyond`: the mass beyond the table;
/// `pi_hi ≥ π`.
pub(super) fn pair_suffix(m: &[f64], beyond: f64, pi_hi: f64) -> crate::error::Result<Vec<f64>> {
    let u = UNIT_ROUNDOFF;
    let (c, e_c) = pair_masses(m)?;
    if c.is_empty() {
        return Ok(Vec::new());
    }
    let len = c.len();
    let mu = m.iter().sum::<f64>() * (1.0 + 2.0 * (m.len() as f64 + 2.0) * u);
    let mut suffix = vec![0.0_f64; len + 1];
    suffix[len] = beyond * (mu + pi_hi) * (1.0 + 4.0 * u);
    for j in (0..len).rev() {
        suffix[j] = (suffix[j + 1] + (c[j] + e_c).max(0.0)) * (1.0 + 2.0 * u);
    }
    if suffix.iter().any(|v| !v.is_finite()) {
        return Err(crate::error::AccountantError::NumericalFailure(
            "tail pair convolution",
        ));
    }
    Ok(suffix)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `a + b` as an unevaluated double-double sum `(s, e)` (Knuth's TwoSum).
    fn two_sum(a: f64, b: f64) -> (f64, f64) {
        let s = a + b;
        let bb = s - a;
        (s, (a - (s - bb)) + (b - bb))
    }

    /// The self-convolution of `m` in double-double arithmetic (TwoProduct by FMA, TwoSum):
    /// every entry within a relative 1e-25 or so of the exact one, far below the bound tested.
    fn pair_exact(m: &[f64]) -> Vec<f64> {
        let len = 2 * m.len() - 1;
        let mut hi = vec![0.0_f64; len];
        let mut lo = vec![0.0_f64; len];
        for (i, &x) in m.iter().enumerate() {
            for (j, &y) in m.iter().enumerate() {
                let p = x * y;
                let pe = x.mul_add(y, -p);
                let (s, e) = two_sum(hi[i + j], p);
                hi[i + j] = s;
                lo[i + j] += e + pe;
            }
        }
        hi.iter().zip(&lo).map(|(a, b)| a + b).collect()
    }

    /// Masses like a tail table's: decaying (geometric with ratio `r`, times a random factor in
    /// [0.5, 1.5], some zeros), total `scale`.
    fn masses() -> impl Strategy<Value = Vec<f64>> {
        (
            2usize..1500,
            0.9f64..0.9999,
            -14.0f64..-2.0,
            proptest::collection::vec(0.0f64..1.5, 1500),
        )
            .prop_map(|(n, r, ls, noise)| {
                let mut m: Vec<f64> = (0..n)
                    .map(|i| {
                        let f = noise[i];
                        if f < 0.05 {
                            0.0
                        } else {
                            r.powi(i as i32) * (0.5 + f)
                        }
                    })
                    .collect();
                let s: f64 = m.iter().sum();
                if s > 0.0 {
                    let c = 10f64.powf(ls) / s;
                    m.iter_mut().for_each(|x| *x *= c);
                }
                m
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// The pair masses of the `k = 2` term: the FFT's self-convolution is within its bound
        /// `e_c` of the exact one (double-double reference) at every entry, its measured error
        /// below a quarter of the bound, and the suffix sums bound the exact ones from above.
        #[test]
        fn pair_masses_bound_the_exact_convolution(m in masses(), beyond in 0.0f64..1e-12) {
            let (c, e_c) = pair_masses(&m).unwrap();
            let exact = pair_exact(&m);
            prop_assert_eq!(c.len(), exact.len());
            let worst = c
                .iter()
                .zip(&exact)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0_f64, f64::max);
            prop_assert!(worst <= 0.25 * e_c, "measured {worst:e} against the bound {e_c:e}");
            let pi_hi: f64 = m.iter().sum::<f64>() + beyond;
            let suffix = pair_suffix(&m, beyond, pi_hi).unwrap();
            prop_assert_eq!(suffix.len(), exact.len() + 1);
            let mut exact_suffix = beyond * pi_hi;
            prop_assert!(suffix[exact.len()] >= exact_suffix);
            for j in (0..exact.len()).rev() {
                exact_suffix += exact[j];
                prop_assert!(
                    suffix[j] >= exact_suffix * (1.0 - 1e-15),
                    "suffix {} below the exact {} at {}", suffix[j], exact_suffix, j
                );
            }
        }
    }
}
