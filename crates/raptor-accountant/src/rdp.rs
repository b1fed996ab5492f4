//! Rényi-DP accountant for the Poisson-subsampled Gaussian (Mironov 2017; Mironov, Talwar,
//! Zhang 2019), integer and fractional orders. Used as an independent cross-check of the PRV
//! accountant and to choose the PRV grid's scale.

use serde::{Deserialize, Serialize};
use statrs::function::gamma::ln_gamma;

use crate::error::{AccountantError, Result};
use crate::special::{ln_add, ln_erfc, ln_sub};
use crate::types::{Composition, Delta, SubsampledGaussian};

/// Default RDP orders: fractional orders near 1 for large ε, integer orders up to 4096 for tiny ε.
pub const DEFAULT_ORDERS: &[f64] = &[
    1.01, 1.05, 1.1, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0,
    9.0, 10.0, 12.0, 14.0, 16.0, 20.0, 24.0, 28.0, 32.0, 40.0, 48.0, 56.0, 64.0, 80.0, 96.0, 128.0,
    192.0, 256.0, 384.0, 512.0, 768.0, 1024.0, 2048.0, 4096.0,
];

/// ε from the RDP accountant, with the order that achieved it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RdpEpsilon {
    /// ε (an upper bound on the true ε at the given δ).
    pub epsilon: f64,
    /// The best order α.
    pub order: f64,
}

/// RDP accountant over a fixed list of orders.
///
/// ```
/// use raptor_accountant::{Composition, RdpAccountant, SubsampledGaussian};
/// let c = Composition::single(SubsampledGaussian::new(0.01, 1.0)?, 10_000)?;
/// let e = RdpAccountant::default().epsilon(&c, 1e-5)?;
/// // The PRV upper bound is about 6.25 here; RDP is looser.
/// assert!(e.epsilon > 6.0 && e.epsilon < 9.0);
/// # Ok::<(), raptor_accountant::AccountantError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RdpAccountant {
    orders: Vec<f64>,
}

impl Default for RdpAccountant {
    fn default() -> Self {
        Self {
            orders: DEFAULT_ORDERS.to_vec(),
        }
    }
}

impl RdpAccountant {
    /// An accountant over the given orders (each finite and > 1).
    pub fn with_orders(orders: Vec<f64>) -> Result<Self> {
        if orders.is_empty() {
            return Err(AccountantError::NoOrders);
        }
        if let Some(&bad) = orders.iter().find(|a| !(a.is_finite() && **a > 1.0)) {
            return Err(AccountantError::InvalidOrder(bad));
        }
        Ok(Self { orders })
    }

    /// The orders.
    pub fn orders(&self) -> &[f64] {
        &self.orders
    }

    /// The RDP curve of the composition (one value per order). Parallel groups take the worst
    /// member combination per order (a valid RDP bound for the partition).
    pub fn rdp(&self, comp: &Composition) -> Result<Vec<f64>> {
        let flats = comp.expand(1 << 16)?;
        let mut out = vec![0.0_f64; self.orders.len()];
        for flat in flats {
            let mut cur = vec![0.0_f64; self.orders.len()];
            for (m, t) in &flat {
                for (c, &a) in cur.iter_mut().zip(&self.orders) {
                    *c += (*t as f64) * rdp_subsampled_gaussian(m, a)?;
                }
            }
            for (o, c) in out.iter_mut().zip(cur) {
                *o = o.max(c);
            }
        }
        Ok(out)
    }

    /// ε at δ, minimized over the orders (conversion of Balle et al. 2020 / Canonne, Kamath,
    /// Steinke 2020: ε = RDP(α) + ln((α−1)/α) − (ln δ + ln α)/(α−1)).
    pub fn epsilon(&self, comp: &Composition, delta: f64) -> Result<RdpEpsilon> {
        let delta = Delta::new(delta)?.get();
        let rdp = self.rdp(comp)?;
        let mut best = RdpEpsilon {
            epsilon: f64::INFINITY,
            order: f64::NAN,
        };
        for (&r, &a) in rdp.iter().zip(&self.orders) {
            let eps = r + ((a - 1.0) / a).ln() - (delta.ln() + a.ln()) / (a - 1.0);
            if eps.is_finite() && eps < best.epsilon {
                best = RdpEpsilon {
                    epsilon: eps.max(0.0),
                    order: a,
                };
            }
        }
        if !best.epsilon.is_finite() {
            return Err(AccountantError::NumericalFailure(
                "RDP epsilon (no finite order)",
            ));
        }
        Ok(best)
    }
}

/// RDP of order α of one step of the Poisson-subsampled Gaussian (add/remove adjacency).
pub fn rdp_subsampled_gaussian(m: &SubsampledGaussian, alpha: f64) -> Result<f64> {
    if !(alpha.is_finite() && alpha > 1.0) {
        return Err(AccountantError::InvalidOrder(alpha));
    }
    let (q, sigma) = (m.q(), m.sigma());
    if q == 1.0 {
        let r = alpha / (2.0 * sigma * sigma);
        return if r.is_finite() {
            Ok(r)
        } else {
            Err(AccountantError::NoiseTooSmall { sigma })
        };
    }
    let log_a = if alpha.fract() == 0.0 && alpha <= 1e6 {
        log_a_int(q, sigma, alpha as u64)
    } else {
        log_a_frac(q, sigma, alpha)?
    };
    let r = log_a / (alpha - 1.0);
    if r.is_finite() {
        Ok(r.max(0.0))
    } else if !(1.0 / (sigma * sigma)).is_finite() || log_a == f64::INFINITY {
        // The loss itself overflows (σ far below any usable noise level).
        Err(AccountantError::NoiseTooSmall { sigma })
    } else {
        Err(AccountantError::NumericalFailure("RDP order"))
    }
}

fn ln_binom(n: f64, k: f64) -> f64 {
    ln_gamma(n + 1.0) - ln_gamma(k + 1.0) - ln_gamma(n - k + 1.0)
}

/// ln A_α for integer α: Σ_k C(α,k) (1−q)^{α−k} q^k exp((k²−k)/(2σ²)).
fn log_a_int(q: f64, sigma: f64, alpha: u64) -> f64 {
    let mut log_a = f64::NEG_INFINITY;
    let (lq, l1q) = (q.ln(), (-q).ln_1p());
    for k in 0..=alpha {
        let kf = k as f64;
        let af = alpha as f64;
        let s =
            ln_binom(af, kf) + (af - kf) * l1q + kf * lq + (kf * kf - kf) / (2.0 * sigma * sigma);
        log_a = ln_add(log_a, s);
    }
    log_a
}

/// ln A_α for fractional α (Mironov, Talwar, Zhang 2019, Section 3.3).
fn log_a_frac(q: f64, sigma: f64, alpha: f64) -> Result<f64> {
    let (mut log_a0, mut log_a1) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    let z0 = sigma * sigma * (1.0 / q - 1.0).ln() + 0.5;
    let (lq, l1q) = (q.ln(), (-q).ln_1p());
    let mut log_coef = 0.0_f64; // ln |C(α, i)|
    let mut positive = true;
    let s2 = std::f64::consts::SQRT_2 * sigma;
    for i in 0..1_000_000u32 {
        let fi = f64::from(i);
        if i > 0 {
            let factor = (alpha - (fi - 1.0)) / fi;
            if factor == 0.0 {
                break;
            }
            if factor < 0.0 {
                positive = !positive;
            }
            log_coef += factor.abs().ln();
        }
        let j = alpha - fi;
        let log_t0 = log_coef + fi * lq + j * l1q;
        let log_t1 = log_coef + j * lq + fi * l1q;
        let log_e0 = 0.5_f64.ln() + ln_erfc((fi - z0) / s2);
        let log_e1 = 0.5_f64.ln() + ln_erfc((z0 - j) / s2);
        let log_s0 = log_t0 + (fi * fi - fi) / (2.0 * sigma * sigma) + log_e0;
        let log_s1 = log_t1 + (j * j - j) / (2.0 * sigma * sigma) + log_e1;
        if positive {
            log_a0 = ln_add(log_a0, log_s0);
            log_a1 = ln_add(log_a1, log_s1);
        } else {
            log_a0 = ln_sub(log_a0, log_s0);
            log_a1 = ln_sub(log_a1, log_s1);
        }
        if log_s0.max(log_s1) < -30.0 {
            return Ok(ln_add(log_a0, log_a1));
        }
    }
    Err(AccountantError::NumericalFailure(
        "fractional RDP series did not converge",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaussian_rdp_is_alpha_over_two_sigma_squared() {
        let m = SubsampledGaussian::gaussian(2.0).unwrap();
        assert!((rdp_subsampled_gaussian(&m, 3.0).unwrap() - 3.0 / 8.0).abs() < 1e-15);
    }

    #[test]
    fn fractional_interpolates_integer_orders() {
        // The fractional series at an integer order equals the integer formula.
        let (q, s) = (0.05, 1.3);
        for a in [2u64, 3, 5, 8] {
            let i = log_a_int(q, s, a);
            let f = log_a_frac(q, s, a as f64 + 1e-9).unwrap();
            assert!(
                (i - f).abs() < 1e-6 * i.abs().max(1e-3),
                "alpha={a}: {i} vs {f}"
            );
        }
    }

    #[test]
    fn rdp_increases_with_order() {
        let m = SubsampledGaussian::new(0.01, 0.8).unwrap();
        let mut prev = 0.0;
        for &a in DEFAULT_ORDERS {
            let r = rdp_subsampled_gaussian(&m, a).unwrap();
            assert!(r >= prev - 1e-12, "order {a}");
            prev = r;
        }
    }
}
