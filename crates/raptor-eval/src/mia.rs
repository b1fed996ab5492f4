//! Membership-inference metrics from member and non-member scores: ROC AUC and the true-positive
//! rate at a low false-positive rate.
//!
//! **Convention:** a higher score means "more likely a member" (for the loss attack pass the
//! negated loss, or use [`loss_attack`]). The attack with threshold τ predicts "member" when
//! `score ≥ τ`, so tied scores always fall on the same side.
//!
//! - AUC = P(member score > non-member score) + ½·P(equal) (the Mann–Whitney statistic over all
//!   member/non-member pairs; ties count one half).
//! - TPR at FPR α = the largest TPR over thresholds τ (every distinct score, and +∞) whose FPR
//!   `#{non-members ≥ τ}/n₀` is at most α; 0 when only τ = +∞ qualifies.

use serde::{Deserialize, Serialize};

use crate::EvalError;

fn check(members: &[f64], non_members: &[f64]) -> Result<(), EvalError> {
    if members.is_empty() {
        return Err(EvalError::Empty {
            what: "member scores",
        });
    }
    if non_members.is_empty() {
        return Err(EvalError::Empty {
            what: "non-member scores",
        });
    }
    crate::stats::check_finite("member scores", members)?;
    crate::stats::check_finite("non-member scores", non_members)
}

fn sorted(xs: &[f64]) -> Vec<f64> {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

/// Number of elements of the sorted slice that are `< x` and `<= x`.
fn counts_below(s: &[f64], x: f64) -> (usize, usize) {
    (
        s.partition_point(|&y| y < x),
        s.partition_point(|&y| y <= x),
    )
}

/// ROC AUC with ties counted one half (module docs). O((n₁ + n₀) log n₀).
///
/// ```
/// let auc = raptor_eval::mia::roc_auc(&[3.0, 2.0, 1.0], &[1.0, 0.0])?;
/// assert!((auc - (2.0 + 2.0 + 1.5) / 6.0).abs() < 1e-12);
/// # Ok::<(), raptor_eval::EvalError>(())
/// ```
pub fn roc_auc(members: &[f64], non_members: &[f64]) -> Result<f64, EvalError> {
    check(members, non_members)?;
    let neg = sorted(non_members);
    let mut wins = 0.0;
    for &x in members {
        let (lt, le) = counts_below(&neg, x);
        wins += lt as f64 + 0.5 * (le - lt) as f64;
    }
    Ok(wins / (members.len() as f64 * neg.len() as f64))
}

/// TPR at FPR ≤ `max_fpr` (module docs).
///
/// ```
/// let members = [5.0, 4.0, 3.0, 1.0];
/// let non_members = [4.0, 2.0, 1.0, 0.0];
/// // τ = 5: FPR 0, TPR 1/4; τ = 4 would give FPR 1/4.
/// assert_eq!(raptor_eval::mia::tpr_at_fpr(&members, &non_members, 0.1)?, 0.25);
/// // τ = 3: FPR 1/4 (the non-member at 4), TPR 3/4.
/// assert_eq!(raptor_eval::mia::tpr_at_fpr(&members, &non_members, 0.25)?, 0.75);
/// # Ok::<(), raptor_eval::EvalError>(())
/// ```
pub fn tpr_at_fpr(members: &[f64], non_members: &[f64], max_fpr: f64) -> Result<f64, EvalError> {
    check(members, non_members)?;
    if !(0.0..=1.0).contains(&max_fpr) {
        return Err(EvalError::OutOfRange {
            what: "max FPR",
            value: max_fpr,
            expected: "0 ≤ α ≤ 1",
        });
    }
    let pos = sorted(members);
    let neg = sorted(non_members);
    let (n1, n0) = (pos.len() as f64, neg.len() as f64);
    let mut best = 0.0f64;
    // Candidate thresholds: every distinct score (higher τ only lowers both rates, so the
    // best τ for a given FPR is a score value).
    for &t in pos.iter().chain(&neg) {
        let fp = neg.len() - neg.partition_point(|&y| y < t);
        if fp as f64 / n0 <= max_fpr {
            let tp = pos.len() - pos.partition_point(|&y| y < t);
            best = best.max(tp as f64 / n1);
        }
    }
    Ok(best)
}

/// AUC and TPR at 1 % and 0.1 % FPR of an attack.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MiaReport {
    /// ROC AUC.
    pub auc: f64,
    /// TPR at FPR ≤ 1 %.
    pub tpr_at_1pct_fpr: f64,
    /// TPR at FPR ≤ 0.1 %.
    pub tpr_at_0_1pct_fpr: f64,
    /// Number of members.
    pub members: usize,
    /// Number of non-members.
    pub non_members: usize,
}

/// Report of an attack whose scores are higher for members.
pub fn mia_report(members: &[f64], non_members: &[f64]) -> Result<MiaReport, EvalError> {
    Ok(MiaReport {
        auc: roc_auc(members, non_members)?,
        tpr_at_1pct_fpr: tpr_at_fpr(members, non_members, 0.01)?,
        tpr_at_0_1pct_fpr: tpr_at_fpr(members, non_members, 0.001)?,
        members: members.len(),
        non_members: non_members.len(),
    })
}

/// The loss-threshold attack: a lower loss means "member" (scores are the negated losses).
///
/// ```
/// let r = raptor_eval::mia::loss_attack(&[0.1, 0.2], &[0.9, 0.3])?;
/// assert_eq!(r.auc, 1.0);
/// # Ok::<(), raptor_eval::EvalError>(())
/// ```
pub fn loss_attack(
    member_losses: &[f64],
    non_member_losses: &[f64],
) -> Result<MiaReport, EvalError> {
    let neg = |xs: &[f64]| xs.iter().map(|x| -x).collect::<Vec<_>>();
    mia_report(&neg(member_losses), &neg(non_member_losses))
}
