//! One-run privacy audit: the ε lower bound of Steinke, Nasr & Jagielski (2023, "Privacy
//! auditing with one (1) training run", NeurIPS).
//!
//! **Setting.** `m` canaries are each included in training independently with probability ½.
//! After training, the auditor scores each canary, guesses "member" for the `k₊` highest scores
//! and "non-member" for the `k₋` lowest, and abstains on the rest; `r = k₊ + k₋` guesses are made
//! and `v` of them are correct.
//!
//! **The bound (the paper's Theorem on (ε, δ)-DP and its p-value algorithm).** Under the null
//! hypothesis "the training run is (ε, δ)-DP", the probability of at least `v` correct guesses out
//! of `r` is at most
//!
//! ```text
//! p(ε, δ) = min(1, β + 2·m·δ·α),   q = e^ε / (1 + e^ε),
//! β = P[Binomial(r, q) ≥ v],
//! α = max_{1 ≤ i ≤ v} (1/i) · P[v − i ≤ Binomial(r, q) < v].
//! ```
//!
//! [`p_value`] computes it. [`epsilon_lower_bound`] returns the largest ε whose null hypothesis is
//! rejected at the level `1 − confidence`, i.e. the supremum of `{ε ≥ 0 : p(ε, δ) < 1 −
//! confidence}` (p is non-decreasing in ε), found by bisection to an absolute tolerance of 1e-10
//! (after bracketing by steps of 1); 0 when even ε = 0 is not rejected. With probability at
//! least `confidence` the true ε of the run is at least this value.
//!
//! **Search over (k₊, k₋).** Trying several abstention thresholds and keeping the best would
//! overstate the confidence. [`audit_search`] tries every pair of a grid given in advance and
//! tests each at level `(1 − confidence) / K`, where K is the number of pairs (Bonferroni
//! correction: the probability that any of the K tests rejects a true null is at most
//! `1 − confidence`); it reports the largest of the K lower bounds and the pair that gave it.
//! With K = 1 this is exactly [`epsilon_lower_bound`].
//!
//! **Several statistics.** [`audit_search_many`] scores the same canaries with several
//! statistics (say the sum and the largest of a canary's observations) and tests every
//! (statistic, pair) at `(1 − confidence) / (S·K)`: the same correction over S·K tests, so the
//! reported bound keeps its confidence whichever statistic gave it.
//!
//! **White-box (Dirac) canaries.** A canary that is a direction `v·e_k` in parameter space is
//! observed in every released update that carries its coordinate. [`DiracTrace`] keeps, per
//! canary, the two statistics of those observations that [`audit_search_many`] uses: the sum
//! (over √n: the optimal test when the noise dominates) and the largest single observation
//! (which finds a canary sampled a few times under small noise, where the sum drowns it in the
//! noise of the updates that did not sample it).
//!
//! **Ties** in scores are broken by canary index (the lower index ranks higher among equal
//! scores), so the guesses are a deterministic function of the scores.

use serde::{Deserialize, Serialize};
use statrs::distribution::{Binomial, Discrete, DiscreteCDF};

use crate::EvalError;

/// The default confidence of audit bounds (95 %).
pub const DEFAULT_CONFIDENCE: f64 = 0.95;

fn check_counts(m: u64, r: u64, v: u64) -> Result<(), EvalError> {
    if v <= r && r <= m {
        Ok(())
    } else {
        Err(EvalError::InvalidCounts(format!(
            "need correct ≤ guesses ≤ canaries, got correct = {v}, guesses = {r}, canaries = {m}"
        )))
    }
}

fn check_delta(delta: f64) -> Result<(), EvalError> {
    if (0.0..=1.0).contains(&delta) {
        Ok(())
    } else {
        Err(EvalError::OutOfRange {
            what: "delta",
            value: delta,
            expected: "0 ≤ δ ≤ 1",
        })
    }
}

/// The paper's p-value bound `p(ε, δ)` (see the module docs) for `m` canaries, `r` guesses and
/// `v` correct.
///
/// ```
/// use raptor_eval::audit::p_value;
/// // 100 guesses, all correct: very unlikely under ε = 1.
/// assert!(p_value(1000, 100, 100, 1.0, 0.0)? < 1e-12);
/// // 50 of 100 correct is what ε = 0 predicts on average.
/// assert!(p_value(1000, 100, 50, 0.0, 0.0)? > 0.5);
/// # Ok::<(), raptor_eval::EvalError>(())
/// ```
pub fn p_value(m: u64, r: u64, v: u64, epsilon: f64, delta: f64) -> Result<f64, EvalError> {
    check_counts(m, r, v)?;
    check_delta(delta)?;
    if epsilon.is_nan() || epsilon < 0.0 {
        return Err(EvalError::OutOfRange {
            what: "epsilon",
            value: epsilon,
            expected: "ε ≥ 0",
        });
    }
    if v == 0 {
        return Ok(1.0);
    }
    let q = 1.0 / (1.0 + (-epsilon).exp());
    if r == 0 {
        return Ok(1.0);
    }
    let bin = Binomial::new(q, r).map_err(|_| EvalError::OutOfRange {
        what: "epsilon",
        value: epsilon,
        expected: "a finite ε",
    })?;
    let beta = bin.sf(v - 1);
    Ok((beta + alpha_term(&bin, q, r, v) * delta * 2.0 * m as f64).min(1.0))
}

/// α = max_{1 ≤ i ≤ v} (1/i)·Σ_{j=1..i} P[Bin(r, q) = v − j]. The terms come from the
/// recurrence P[k − 1] = P[k]·k/(r − k + 1)·(1 − q)/q (directly from `pmf` while a term is
/// below 10⁻³⁰⁰), not from one `pmf` call each: audits of many white-box canaries make r
/// tens of thousands. Past the mode the terms only decrease, so once a term there is below the
/// best prefix mean no later prefix can beat it, and the loop stops.
fn alpha_term(bin: &Binomial, q: f64, r: u64, v: u64) -> f64 {
    let ratio = (1.0 - q) / q;
    let mode = ((r as f64 + 1.0) * q).floor();
    let mut term = 0.0f64;
    let mut sum = 0.0;
    let mut alpha: f64 = 0.0;
    for i in 1..=v {
        let k = v - i; // term = P[Bin = k]
        // Direct values until a term is a normal number (a subnormal start would carry its
        // large relative error into every term after it).
        term = if i == 1 || term < 1e-300 || !term.is_finite() {
            bin.pmf(k)
        } else {
            term * (k + 1) as f64 / (r - k) as f64 * ratio
        };
        sum += term;
        alpha = alpha.max(sum / i as f64);
        if (k as f64) < mode && (term < alpha || term == 0.0) {
            break;
        }
    }
    alpha
}

/// The ε lower bound at `confidence` (e.g. 0.95) for `m` canaries, `r` guesses, `v` correct and
/// the run's δ (see the module docs).
///
/// ```
/// use raptor_eval::audit::epsilon_lower_bound;
/// let eps = epsilon_lower_bound(1000, 100, 90, 1e-5, 0.95)?;
/// assert!(eps > 1.0 && eps < 2.2, "{eps}");
/// assert_eq!(epsilon_lower_bound(1000, 100, 50, 1e-5, 0.95)?, 0.0);
/// # Ok::<(), raptor_eval::EvalError>(())
/// ```
pub fn epsilon_lower_bound(
    m: u64,
    r: u64,
    v: u64,
    delta: f64,
    confidence: f64,
) -> Result<f64, EvalError> {
    if !(confidence.is_finite() && confidence > 0.0 && confidence < 1.0) {
        return Err(EvalError::OutOfRange {
            what: "confidence",
            value: confidence,
            expected: "0 < confidence < 1",
        });
    }
    eps_at_level(m, r, v, delta, 1.0 - confidence)
}

fn eps_at_level(m: u64, r: u64, v: u64, delta: f64, level: f64) -> Result<f64, EvalError> {
    if p_value(m, r, v, 0.0, delta)? >= level {
        return Ok(0.0);
    }
    let mut lo = 0.0; // p(lo) < level
    let mut hi = 1.0;
    let mut steps = 0;
    while p_value(m, r, v, hi, delta)? < level {
        lo = hi;
        hi += 1.0;
        steps += 1;
        if steps > 10_000 {
            return Ok(lo); // p stays below the level up to ε = 10⁴ (r = v tiny level); report it
        }
    }
    while hi - lo > 1e-10 {
        let mid = 0.5 * (lo + hi);
        if p_value(m, r, v, mid, delta)? < level {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// Number of guesses `r` and correct guesses `v` when guessing "member" for the `k_plus`
/// highest scores and "non-member" for the `k_minus` lowest (ties broken by index, see the
/// module docs). `included[i]` is canary i's secret coin.
///
/// ```
/// use raptor_eval::audit::guesses;
/// let scores = [0.9, 0.1, 0.8, 0.2, 0.5];
/// let included = [true, false, true, true, false];
/// // Top 2 (idx 0, 2): both members; bottom 2 (idx 1, 3): one non-member.
/// assert_eq!(guesses(&scores, &included, 2, 2)?, (4, 3));
/// # Ok::<(), raptor_eval::EvalError>(())
/// ```
pub fn guesses(
    scores: &[f64],
    included: &[bool],
    k_plus: usize,
    k_minus: usize,
) -> Result<(u64, u64), EvalError> {
    let order = ranking(scores, included)?;
    guesses_ranked(&order, included, k_plus, k_minus)
}

/// Canary indices from the highest score to the lowest (ties: lower index first).
fn ranking(scores: &[f64], included: &[bool]) -> Result<Vec<usize>, EvalError> {
    if scores.len() != included.len() {
        return Err(EvalError::LengthMismatch {
            what: "scores and inclusion coins",
            left: scores.len(),
            right: included.len(),
        });
    }
    crate::stats::check_finite("canary scores", scores)?;
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    Ok(order)
}

fn guesses_ranked(
    order: &[usize],
    included: &[bool],
    k_plus: usize,
    k_minus: usize,
) -> Result<(u64, u64), EvalError> {
    let m = order.len();
    if k_plus + k_minus > m {
        return Err(EvalError::InvalidCounts(format!(
            "k₊ + k₋ = {} exceeds the {m} canaries",
            k_plus + k_minus
        )));
    }
    let top = order[..k_plus].iter().filter(|&&i| included[i]).count();
    let bottom = order[m - k_minus..]
        .iter()
        .filter(|&&i| !included[i])
        .count();
    Ok(((k_plus + k_minus) as u64, (top + bottom) as u64))
}

/// A (k₊, k₋) grid that depends only on `m` (so it is fixed before any score is seen): for each
/// fraction f in {1 %, 2 %, 5 %, 10 %, 20 %, 50 %} and `k = max(1, round(f·m/2))`, the symmetric
/// pair (k, k) and the members-only pair (k, 0); duplicates removed, in that order. Empty for
/// m < 2.
///
/// ```
/// let g = raptor_eval::audit::default_grid(1000);
/// assert_eq!(&g[..4], &[(5, 5), (5, 0), (10, 10), (10, 0)]);
/// assert_eq!(g.last(), Some(&(250, 0)));
/// assert!(g.iter().all(|&(a, b)| a + b <= 1000));
/// ```
pub fn default_grid(m: usize) -> Vec<(usize, usize)> {
    let mut grid = Vec::new();
    if m < 2 {
        return grid;
    }
    for f in [0.01, 0.02, 0.05, 0.1, 0.2, 0.5] {
        let k = ((f * m as f64 / 2.0).round() as usize).clamp(1, m / 2);
        for pair in [(k, k), (k, 0)] {
            if !grid.contains(&pair) {
                grid.push(pair);
            }
        }
    }
    grid
}

/// The result of [`audit_search`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditResult {
    /// The ε lower bound (largest over the grid, each pair at the corrected level).
    pub epsilon_lower: f64,
    /// The pair (k₊, k₋) that gave it (the first in grid order on ties).
    pub k_plus: usize,
    /// See `k_plus`.
    pub k_minus: usize,
    /// Guesses made by that pair.
    pub guesses: u64,
    /// Correct guesses of that pair.
    pub correct: u64,
    /// Number of canaries.
    pub canaries: u64,
    /// Number of pairs tried (K).
    pub pairs_tried: usize,
    /// The stated confidence.
    pub confidence: f64,
    /// The level each pair was tested at: `(1 − confidence) / K`.
    pub per_pair_level: f64,
    /// δ of the null hypothesis.
    pub delta: f64,
}

/// The audit with a search over the (k₊, k₋) pairs of `grid`, Bonferroni-corrected (module docs).
///
/// ```
/// use raptor_eval::audit::audit_search;
/// // A leaky "model": members score high, non-members low.
/// let m = 200;
/// let included: Vec<bool> = (0..m).map(|i| i % 2 == 0).collect();
/// let scores: Vec<f64> = (0..m).map(|i| if i % 2 == 0 { 1.0 + i as f64 } else { -(i as f64) }).collect();
/// let grid = [(10, 10), (25, 25), (50, 50)];
/// let a = audit_search(&scores, &included, 1e-5, 0.95, &grid)?;
/// assert_eq!(a.pairs_tried, 3);
/// assert_eq!((a.guesses, a.correct), (100, 100));
/// assert!(a.epsilon_lower > 2.0);
/// # Ok::<(), raptor_eval::EvalError>(())
/// ```
pub fn audit_search(
    scores: &[f64],
    included: &[bool],
    delta: f64,
    confidence: f64,
    grid: &[(usize, usize)],
) -> Result<AuditResult, EvalError> {
    audit_search_many(&[scores], included, delta, confidence, grid).map(|(_, a)| a)
}

/// The audit over several statistics of the same canaries (`statistics[s][i]`: canary i's
/// score under statistic s), every (statistic, pair) tested at `(1 − confidence) / (S·K)`
/// (module docs). Returns the index of the statistic that gave the largest bound (the first
/// on ties) and its result, whose `pairs_tried` is S·K. With one statistic this is
/// [`audit_search`].
///
/// ```
/// use raptor_eval::audit::{audit_search, audit_search_many};
/// let m = 400;
/// let included: Vec<bool> = (0..m).map(|i| i % 3 == 0).collect();
/// // A useless statistic and one that separates members from non-members.
/// let flat: Vec<f64> = (0..m).map(|i| (i % 7) as f64).collect();
/// let good: Vec<f64> = (0..m).map(|i| if i % 3 == 0 { 10.0 } else { 0.0 } + (i % 5) as f64).collect();
/// let grid = [(20, 20), (50, 0)];
/// let (s, a) = audit_search_many(&[&flat, &good], &included, 1e-6, 0.95, &grid)?;
/// assert_eq!((s, a.pairs_tried), (1, 4));
/// // The price of the second statistic: a bound at level 0.05/4 instead of 0.05/2.
/// assert!(a.epsilon_lower <= audit_search(&good, &included, 1e-6, 0.95, &grid)?.epsilon_lower);
/// # Ok::<(), raptor_eval::EvalError>(())
/// ```
pub fn audit_search_many(
    statistics: &[&[f64]],
    included: &[bool],
    delta: f64,
    confidence: f64,
    grid: &[(usize, usize)],
) -> Result<(usize, AuditResult), EvalError> {
    if grid.is_empty() {
        return Err(EvalError::Empty {
            what: "(k₊, k₋) grid",
        });
    }
    if statistics.is_empty() {
        return Err(EvalError::Empty {
            what: "score statistics",
        });
    }
    if !(confidence.is_finite() && confidence > 0.0 && confidence < 1.0) {
        return Err(EvalError::OutOfRange {
            what: "confidence",
            value: confidence,
            expected: "0 < confidence < 1",
        });
    }
    check_delta(delta)?;
    let tests = statistics.len() * grid.len();
    let level = (1.0 - confidence) / tests as f64;
    let mut best: Option<(usize, AuditResult)> = None;
    for (s, scores) in statistics.iter().enumerate() {
        let order = ranking(scores, included)?;
        let m = scores.len() as u64;
        for &(kp, km) in grid {
            let (r, v) = guesses_ranked(&order, included, kp, km)?;
            let eps = eps_at_level(m, r, v, delta, level)?;
            if best.as_ref().is_none_or(|(_, b)| eps > b.epsilon_lower) {
                best = Some((
                    s,
                    AuditResult {
                        epsilon_lower: eps,
                        k_plus: kp,
                        k_minus: km,
                        guesses: r,
                        correct: v,
                        canaries: m,
                        pairs_tried: tests,
                        confidence,
                        per_pair_level: level,
                        delta,
                    },
                ));
            }
        }
    }
    best.ok_or(EvalError::Empty {
        what: "(k₊, k₋) grid",
    })
}

/// What a white-box (Dirac) canary's coordinate showed over a run: the running sum, the
/// largest value and the number of observations, one observation per released update that
/// carries the coordinate (module docs). An observation is the released component in units of
/// that release's planned noise standard deviation (or of the canary's own value where the
/// release has no noise), so a sampled canary adds about `1/σ` to it.
///
/// ```
/// use raptor_eval::audit::DiracTrace;
/// let mut t = DiracTrace::default();
/// for x in [0.5, -1.0, 2.5, 0.0] {
///     t.observe(x);
/// }
/// assert_eq!(t.releases(), 4);
/// assert_eq!(t.max_score(), 2.5);
/// assert_eq!(t.sum_score(), 2.0 / 2.0); // (0.5 − 1 + 2.5 + 0) / √4
/// // A coordinate no update released scores 0 under both statistics.
/// assert_eq!((DiracTrace::default().sum_score(), DiracTrace::default().max_score()), (0.0, 0.0));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct DiracTrace {
    sum: f64,
    max: Option<f64>,
    releases: u64,
}

impl DiracTrace {
    /// Adds one observation (a non-finite one counts as 0: a score must stay finite).
    pub fn observe(&mut self, x: f64) {
        let x = if x.is_finite() { x } else { 0.0 };
        self.sum += x;
        self.max = Some(self.max.map_or(x, |m| m.max(x)));
        self.releases += 1;
    }

    /// Number of observations.
    pub fn releases(&self) -> u64 {
        self.releases
    }

    /// The sum statistic: Σ x / √n (0 without observations). Under the null hypothesis with unit
    /// noise it is a standard normal whatever n, so canaries observed a different number of
    /// times stay comparable.
    pub fn sum_score(&self) -> f64 {
        if self.releases == 0 {
            0.0
        } else {
            self.sum / (self.releases as f64).sqrt()
        }
    }

    /// The max statistic: the largest observation (0 without observations).
    pub fn max_score(&self) -> f64 {
        self.max.unwrap_or(0.0)
    }
}
