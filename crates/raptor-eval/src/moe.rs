//! RAPTOR's diagnostics of a private MoE run, from per-record numbers (defined as the public
//! Python implementation of RAPTOR, GitHub `leduckhai/RAPTOR`, computes them): the arithmetic
//! only. The per-record gradient norms, clipped sums and owner maps they are computed from come
//! from a model (raptor-train's `diagnostics` module gathers them on held-out records, never on
//! training records).
//!
//! - **Role mismatch** ([`role_mismatch`]): M_role = ½ Σ_r |norm_share_r − param_share_r|, the
//!   total-variation distance between where the per-record gradient norm mass sits and where
//!   the trainable parameters sit, over the roles (attention, head, the diagnosed layer's
//!   experts).
//! - **Signal against noise** ([`StreamSnr`]): a stream's signal is the norm of its clipped sum
//!   over a batch, its noise the norm the release's Gaussian noise has on its d coordinates,
//!   σ·C·√d; SNR = signal / noise (infinite without noise). **SNR-CV**
//!   ([`coefficient_of_variation`]): population std / mean of the experts' SNRs.
//! - **Clip suppression** ([`clip_suppressed_fraction`]): the fraction of owned records whose
//!   global clip factor (over every role) is smaller than the factor of their expert's gradient
//!   alone: a dense-dominated norm shrinking an expert gradient that was within its bound.
//! - **Dilution** ([`dilution`]): the least-loaded expert's expected owned records in a batch of
//!   B, over the expert release's public denominator D_e.
//!
//! ```
//! use std::collections::BTreeMap;
//! use raptor_eval::moe::{StreamSnr, role_mismatch};
//! let norms = BTreeMap::from([("attention".to_string(), 3.0), ("experts".to_string(), 1.0)]);
//! let params = BTreeMap::from([("attention".to_string(), 10.0), ("experts".to_string(), 30.0)]);
//! let (m, shares) = role_mismatch(&norms, &params);
//! assert!((m - 0.5).abs() < 1e-12); // norms 3:1, parameters 1:3
//! assert_eq!(shares["experts"], (0.25, 0.75));
//! let s = StreamSnr::new(2.0, 0.5, 1.0, 16); // noise 0.5 · 1 · √16 = 2
//! assert_eq!((s.noise_norm, s.snr), (2.0, 1.0));
//! ```

use std::collections::BTreeMap;

use serde::Serialize;

/// The diagnostics of one run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Diagnostics {
    /// Records used (held-out).
    pub records: usize,
    /// The trained sparse layer.
    pub layer: usize,
    /// Role mismatch M_role.
    pub role_mismatch: f64,
    /// Per role: (gradient-norm share, parameter share).
    pub roles: BTreeMap<String, (f64, f64)>,
    /// Per expert SNR (signal / noise).
    pub snr: Vec<f64>,
    /// Per expert: the norm of its clipped sum over the batch.
    pub expert_signal_norms: Vec<f64>,
    /// Per expert: the norm of its release's noise on its coordinates, σ_e·C_e·√d_e.
    pub expert_noise_norms: Vec<f64>,
    /// The shared stream (attention adapters and head): signal, noise and SNR.
    pub shared: StreamSnr,
    /// SNR-CV.
    pub snr_cv: f64,
    /// Fraction of owned rows whose expert gradient is shrunk more by one clip factor over the
    /// whole per-record gradient at the method's expert bound (RAPTOR's C_e, a monolithic
    /// method's C) than by a clip of the expert's own gradient at that bound.
    pub clip_suppressed_fraction: f64,
    /// Least-loaded expert's expected owned records per batch / D_e.
    pub dilution: f64,
}

/// One stream's clipped signal against its release's noise.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct StreamSnr {
    /// ‖Σ_i clip(g_i)‖ over the stream's coordinates.
    pub signal_norm: f64,
    /// σ·C·√d: the norm of the release's noise on those coordinates.
    pub noise_norm: f64,
    /// signal / noise (infinite without noise).
    pub snr: f64,
    /// d: the stream's trainable parameters.
    pub params: i64,
}

impl StreamSnr {
    /// The stream whose clipped sum has norm `signal_norm`, released with noise multiplier
    /// `sigma` at bound `bound` over `params` coordinates (at least 1 is counted).
    pub fn new(signal_norm: f64, sigma: f64, bound: f64, params: i64) -> Self {
        let noise_norm = sigma * bound * (params.max(1) as f64).sqrt();
        Self {
            signal_norm,
            noise_norm,
            snr: if noise_norm > 0.0 {
                signal_norm / noise_norm
            } else {
                f64::INFINITY
            },
            params,
        }
    }
}

/// M_role and each role's (norm share, parameter share), from each role's gradient-norm mass
/// (the mean per-record norm of its clipped gradient) and its parameter count. A role missing
/// from `param_mass` counts 0 parameters; with no norm mass at all every norm share is 0.
pub fn role_mismatch(
    norm_mass: &BTreeMap<String, f64>,
    param_mass: &BTreeMap<String, f64>,
) -> (f64, BTreeMap<String, (f64, f64)>) {
    let tn: f64 = norm_mass.values().sum();
    let tp: f64 = norm_mass
        .keys()
        .map(|r| param_mass.get(r).copied().unwrap_or(0.0))
        .sum();
    let mut roles = BTreeMap::new();
    let mut m = 0.0;
    for (r, nm) in norm_mass {
        let ns = if tn > 0.0 { nm / tn } else { 0.0 };
        let ps = param_mass.get(r).copied().unwrap_or(0.0) / tp.max(1.0);
        m += 0.5 * (ns - ps).abs();
        roles.insert(r.clone(), (ns, ps));
    }
    (m, roles)
}

/// Population standard deviation over mean of `values` (NaN when the mean is not positive, or
/// when there is no value).
pub fn coefficient_of_variation(values: &[f64]) -> f64 {
    let n = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / n;
    if mean > 0.0 {
        var.sqrt() / mean
    } else {
        f64::NAN
    }
}

/// The fraction of owned records whose global clip factor is smaller (by more than 10⁻¹²) than
/// their expert's own clip factor; `rows` holds (global factor, own-expert factor) of each
/// owned record. 0 without owned records.
pub fn clip_suppressed_fraction(rows: &[(f64, f64)]) -> f64 {
    let suppressed = rows.iter().filter(|(g, own)| *g < own - 1e-12).count();
    suppressed as f64 / rows.len().max(1) as f64
}

/// B · (owned records of the least-loaded of `experts` experts / records) / `denominator`: the
/// least-loaded expert's expected owned records in a batch of B over its release's public
/// denominator. `owners` holds each record's owner (an owner outside 0..experts counts for
/// none); NaN without records.
pub fn dilution(owners: &[i64], experts: usize, batch: f64, denominator: f64) -> f64 {
    let mut counts = vec![0usize; experts.max(1)];
    for &o in owners {
        if let Some(c) = usize::try_from(o).ok().and_then(|o| counts.get_mut(o)) {
            *c += 1;
        }
    }
    let min = counts.iter().copied().min().unwrap_or(0) as f64;
    batch * (min / owners.len() as f64) / denominator
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn map(v: &[(&str, f64)]) -> BTreeMap<String, f64> {
        v.iter().map(|(k, x)| (k.to_string(), *x)).collect()
    }

    #[test]
    fn role_mismatch_is_zero_when_shares_agree_and_one_when_disjoint() {
        let (m, r) = role_mismatch(
            &map(&[("a", 2.0), ("b", 6.0)]),
            &map(&[("a", 5.0), ("b", 15.0)]),
        );
        assert!(m.abs() < 1e-15);
        assert_eq!(r["a"], (0.25, 0.25));
        let (m, _) = role_mismatch(
            &map(&[("a", 1.0), ("b", 0.0)]),
            &map(&[("a", 0.0), ("b", 9.0)]),
        );
        assert!((m - 1.0).abs() < 1e-15);
        // No norm mass: norm shares 0, M_role half the parameter shares' total.
        let (m, r) = role_mismatch(
            &map(&[("a", 0.0), ("b", 0.0)]),
            &map(&[("a", 1.0), ("b", 3.0)]),
        );
        assert_eq!(r["b"], (0.0, 0.75));
        assert!((m - 0.5).abs() < 1e-15);
    }

    #[test]
    fn snr_is_infinite_without_noise_and_counts_at_least_one_coordinate() {
        let s = StreamSnr::new(3.0, 0.0, 1.0, 10);
        assert_eq!((s.noise_norm, s.snr), (0.0, f64::INFINITY));
        let s = StreamSnr::new(3.0, 2.0, 0.5, 0);
        assert_eq!((s.noise_norm, s.snr, s.params), (1.0, 3.0, 0));
    }

    #[test]
    fn cv_suppression_and_dilution_by_hand() {
        // Values 1, 3: mean 2, population std 1.
        assert_eq!(coefficient_of_variation(&[1.0, 3.0]), 0.5);
        assert!(coefficient_of_variation(&[]).is_nan());
        assert!(coefficient_of_variation(&[0.0, 0.0]).is_nan());
        assert_eq!(
            clip_suppressed_fraction(&[(0.5, 1.0), (1.0, 1.0), (0.2, 0.1), (0.3, 0.9)]),
            0.5
        );
        assert_eq!(clip_suppressed_fraction(&[]), 0.0);
        // Owners of 8 records over 3 experts: counts 4, 3, 1 → B·(1/8)/D.
        let owners = [0, 0, 1, 0, 1, 2, 0, 1];
        assert_eq!(dilution(&owners, 3, 16.0, 2.0), 1.0);
        // An expert without records, or an out-of-range owner, counts for none.
        assert_eq!(dilution(&[0, 0, -1, 7], 2, 16.0, 2.0), 0.0);
        assert!(dilution(&[], 2, 16.0, 2.0).is_nan());
    }
}
