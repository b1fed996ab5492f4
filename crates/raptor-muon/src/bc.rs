//! DP-MuonBC: the exact noise variance of the momentum buffer and the antithetic-probe bias
//! correction of the Newton–Schulz direction. The DP-Muon paper's exact correction was not
//! available to us; this is our design, built from the description of an antithetic bias
//! correction (heat smoothing, second-order Richardson extrapolation; the derivation below).
//!
//! With the released buffer `M̃ = M + Ξ`, `Ξ` Gaussian with i.i.d. entries of variance `s²`,
//! `E f(M̃) = f(M) + (s²/2) Δf(M) + O(s⁴)`. With `K` antithetic probe pairs `ξ_k ~ N(0, I)`,
//! `P = (1/2K) Σ_k [f(M̃ + τξ_k) + f(M̃ − τξ_k)]` estimates `f(M̃) + (τ²/2) Δf(M̃)`, and
//! `O_BC = f(M̃) − (s²/τ²)(P − f(M̃))` has expectation `f(M) + O(s⁴)`. With `τ = s` (default),
//! `O_BC = 2f(M̃) − P`. The probes are data-independent, so this is post-processing: the privacy
//! guarantee does not change.
//!
//! Safeguards (all reported in [`BcOutput`]):
//! 1. the coefficient `s²/τ²` is capped at [`BcConfig::max_coefficient`] (default 1, which is
//!    exactly the default `τ = s`; the cap only binds when a caller picks `τ < s`);
//! 2. if `P` or `O_BC` has a NaN or infinity, the plain direction `f(M̃)` is returned;
//! 3. `‖O_BC‖_F` is kept at most [`BcConfig::max_norm_ratio`] `· ‖f(M̃)‖_F` (default 2) by
//!    rescaling (extrapolation can overshoot when `s` is comparable to the small singular values
//!    of `M`, where the Taylor expansion fails);
//! 4. `s = 0` (no noise) returns `f(M̃)` without drawing probes.

use faer::{Mat, MatRef};
use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::error::{MuonError, check_param};
use crate::form::MomentumForm;
use crate::ns::{NsConfig, NsWorkspace, frobenius, newton_schulz_with};

/// The Gaussian noise of the privatized gradient: per-entry std `σΔ/B` on `g̃`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NoiseSpec {
    /// Noise multiplier σ ≥ 0.
    pub sigma: f64,
    /// L2 sensitivity Δ > 0 of the release (e.g. `sqrt(Σ_W C_W²)`).
    pub sensitivity: f64,
    /// Public denominator B > 0 (expected lot size).
    pub denominator: f64,
}

impl NoiseSpec {
    /// Per-entry noise std of the privatized gradient, `σΔ/B`.
    pub fn gradient_std(&self) -> f64 {
        self.sigma * self.sensitivity / self.denominator
    }

    /// Check the fields.
    pub fn validate(&self) -> Result<(), MuonError> {
        check_param(
            "sigma",
            self.sigma,
            self.sigma >= 0.0,
            "noise multiplier must be >= 0",
        )?;
        check_param(
            "sensitivity",
            self.sensitivity,
            self.sensitivity > 0.0,
            "sensitivity must be > 0",
        )?;
        check_param(
            "denominator",
            self.denominator,
            self.denominator > 0.0,
            "denominator must be > 0",
        )
    }
}

/// Exact per-entry noise variance `s_t²` of what is orthogonalized at step `t ≥ 1` (buffer zero
/// at `t = 0`, independent gradient noise of variance `v = (σΔ/B)²` per step):
/// - heavy-ball `m ← βm + g̃`: `v (1 − β^{2t}) / (1 − β²)`;
/// - EMA `m ← βm + (1−β)g̃`: `v (1−β)² (1 − β^{2t}) / (1 − β²) = v (1−β)(1 − β^{2t})/(1+β)`;
/// - Nesterov (torch) `u = (1−β)g̃ + βm` with EMA `m`: `u_t = (1−β²) g̃_t + β² m_{t−1}`, so
///   `v [(1−β²)² + β⁴ (1−β)² (1 − β^{2(t−1)}) / (1 − β²)]`.
///
/// ```
/// use raptor_muon::{MomentumForm, NoiseSpec, buffer_noise_variance};
/// let n = NoiseSpec { sigma: 1.0, sensitivity: 2.0, denominator: 4.0 }; // v = 0.25
/// let s2 = buffer_noise_variance(MomentumForm::HeavyBall, &n, 0.5, 2).unwrap();
/// assert!((s2 - 0.25 * (1.0 + 0.25)).abs() < 1e-12);
/// ```
pub fn buffer_noise_variance(
    form: MomentumForm,
    noise: &NoiseSpec,
    beta: f64,
    t: u64,
) -> Result<f64, MuonError> {
    noise.validate()?;
    check_param(
        "beta",
        beta,
        (0.0..1.0).contains(&beta),
        "momentum beta must be in [0, 1)",
    )?;
    check_param("t", t as f64, t >= 1, "step index t starts at 1")?;
    let v = noise.gradient_std().powi(2);
    let b2 = beta * beta;
    // Σ_{k<n} β^{2k}, stable for β = 0 and exact for large n.
    let geom = |n: u64| -> f64 {
        if n == 0 {
            0.0
        } else {
            let e = i32::try_from(n).unwrap_or(i32::MAX);
            (1.0 - b2.powi(e)) / (1.0 - b2)
        }
    };
    Ok(match form {
        MomentumForm::HeavyBall => v * geom(t),
        MomentumForm::Ema => v * (1.0 - beta).powi(2) * geom(t),
        MomentumForm::Nesterov => {
            v * ((1.0 - b2).powi(2) + b2 * b2 * (1.0 - beta).powi(2) * geom(t - 1))
        }
    })
}

/// Per-entry noise variances carried through the momentum recursion one step at a time: of the
/// buffer and of what is orthogonalized. Unlike [`buffer_noise_variance`] (one noise level for
/// every step), the gradient noise's variance may change from step to step (a release whose
/// σ or denominator changes); with a constant one the two agree (the closed form is
/// `Σ_k w_k² v_k` with the weights of [`update_weights`](crate::update_weights)).
///
/// The recursion follows [`MomentumForm::coefficients`]: with `m ← a·m + b·g̃`, the buffer's
/// variance becomes `a²·buffer + b²·v`; what is orthogonalized is the new buffer, or for
/// Nesterov `c·g̃ + d·m_old`, of variance `c²·v + d²·buffer_old`.
///
/// ```
/// use raptor_muon::{MomentumForm, NoiseSpec, RunningNoiseVariance, buffer_noise_variance};
/// let noise = NoiseSpec { sigma: 1.0, sensitivity: 2.0, denominator: 4.0 }; // v = 0.25
/// let mut s = RunningNoiseVariance::default();
/// for t in 1..=5 {
///     s = s.step(MomentumForm::Nesterov, 0.9, 0.25);
///     let want = buffer_noise_variance(MomentumForm::Nesterov, &noise, 0.9, t).unwrap();
///     assert!((s.update - want).abs() < 1e-15);
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RunningNoiseVariance {
    /// Per-entry noise variance of the momentum buffer.
    pub buffer: f64,
    /// Per-entry noise variance of what Newton–Schulz orthogonalizes (the buffer itself but
    /// for Nesterov's look-ahead).
    pub update: f64,
}

impl RunningNoiseVariance {
    /// The variances after one more step whose gradient carries independent noise of
    /// per-entry variance `gradient_variance`.
    pub fn step(self, form: MomentumForm, beta: f64, gradient_variance: f64) -> Self {
        let c = form.coefficients(beta);
        let v = gradient_variance;
        let buffer =
            c.buffer_decay * c.buffer_decay * self.buffer + c.buffer_gain * c.buffer_gain * v;
        let update = match c.look_ahead {
            None => buffer,
            Some(la) => la.gradient * la.gradient * v + la.buffer * la.buffer * self.buffer,
        };
        RunningNoiseVariance { buffer, update }
    }
}

/// Bias-correction settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BcConfig {
    /// Number K ≥ 1 of antithetic probe pairs (cost: 2K extra Newton–Schulz calls).
    pub probe_pairs: usize,
    /// Probe scale τ; `None` means τ = s_t.
    pub tau: Option<f64>,
    /// Cap on the extrapolation coefficient `s²/τ²` (> 0).
    pub max_coefficient: f64,
    /// Cap on `‖O_BC‖_F / ‖f(M̃)‖_F` (≥ 1).
    pub max_norm_ratio: f64,
}

impl Default for BcConfig {
    fn default() -> Self {
        BcConfig {
            probe_pairs: 1,
            tau: None,
            max_coefficient: 1.0,
            max_norm_ratio: 2.0,
        }
    }
}

impl BcConfig {
    /// Check the fields.
    pub fn validate(&self) -> Result<(), MuonError> {
        check_param(
            "probe_pairs",
            self.probe_pairs as f64,
            (1..=4096).contains(&self.probe_pairs),
            "number of probe pairs must be in 1..=4096",
        )?;
        if let Some(tau) = self.tau {
            check_param("tau", tau, tau > 0.0, "probe scale tau must be > 0")?;
        }
        check_param(
            "max_coefficient",
            self.max_coefficient,
            self.max_coefficient > 0.0,
            "coefficient cap must be > 0",
        )?;
        check_param(
            "max_norm_ratio",
            self.max_norm_ratio,
            self.max_norm_ratio >= 1.0,
            "norm-ratio cap must be >= 1",
        )
    }
}

/// Which safeguard, if any, replaced the corrected direction by the plain one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// No fallback: `direction` is `O_BC` (possibly rescaled).
    None,
    /// `s = 0`: nothing to correct.
    NoNoise,
    /// A probe evaluation or `O_BC` had a non-finite entry.
    NonFinite,
}

/// Result of [`bias_corrected_direction`].
#[derive(Debug, Clone)]
pub struct BcOutput {
    /// The direction to step along (`O_BC`, or `f(M̃)` on fallback), same shape as the input.
    pub direction: Mat<f32>,
    /// The plain direction `f(M̃)`.
    pub plain: Mat<f32>,
    /// The noise std `s` used.
    pub noise_std: f64,
    /// The probe scale τ used.
    pub tau: f64,
    /// The coefficient actually applied (after the cap).
    pub coefficient: f64,
    /// Whether the norm cap rescaled `O_BC`.
    pub rescaled: bool,
    /// Fallback taken, if any.
    pub fallback: Fallback,
}

/// A cryptographically secure probe generator: ChaCha20 seeded from the operating system.
pub fn probe_rng_os() -> ChaCha20Rng {
    ChaCha20Rng::from_os_rng()
}

/// A seeded ChaCha20 probe generator, for reproducible experiments and tests. The probes of
/// DP-MuonBC are post-processing, so a fixed seed does not weaken the privacy guarantee of the
/// release itself, but it makes the correction deterministic: NOT for production use.
pub fn probe_rng_seeded(seed: u64) -> ChaCha20Rng {
    ChaCha20Rng::seed_from_u64(seed)
}

/// DP-MuonBC's corrected direction for a noisy buffer `m_tilde` whose entries carry i.i.d.
/// Gaussian noise of std `s` (use [`buffer_noise_variance`]). Probes are drawn from `rng`.
///
/// ```
/// use faer::Mat;
/// use raptor_muon::{BcConfig, NsConfig, bias_corrected_direction, probe_rng_seeded};
/// let m = Mat::<f32>::from_fn(4, 6, |i, j| if i == j { 0.2 + 0.1 * i as f32 } else { 0.01 });
/// let out = bias_corrected_direction(m.as_ref(), 0.01, &NsConfig::taylor(2, 5),
///     &BcConfig::default(), &mut probe_rng_seeded(7)).unwrap();
/// assert_eq!(out.coefficient, 1.0);
/// assert_eq!((out.direction.nrows(), out.direction.ncols()), (4, 6));
/// ```
pub fn bias_corrected_direction<R: Rng + ?Sized>(
    m_tilde: MatRef<'_, f32>,
    s: f64,
    ns: &NsConfig,
    bc: &BcConfig,
    rng: &mut R,
) -> Result<BcOutput, MuonError> {
    bc.validate()?;
    check_param("noise_std", s, s >= 0.0, "noise std must be >= 0")?;
    let (r, c) = (m_tilde.nrows(), m_tilde.ncols());
    let mut ws = NsWorkspace::new(r, c);
    let plain = newton_schulz_with(m_tilde, ns, &mut ws)?;
    if s == 0.0 {
        return Ok(BcOutput {
            direction: plain.clone(),
            plain,
            noise_std: 0.0,
            tau: bc.tau.unwrap_or(0.0),
            coefficient: 0.0,
            rescaled: false,
            fallback: Fallback::NoNoise,
        });
    }
    let tau = bc.tau.unwrap_or(s);
    let coefficient = (s * s / (tau * tau)).min(bc.max_coefficient);
    let k = bc.probe_pairs;
    let mut p = Mat::<f32>::zeros(r, c);
    let mut xi = Mat::<f32>::zeros(r, c);
    let mut shifted = Mat::<f32>::zeros(r, c);
    let tau32 = tau as f32;
    let mut non_finite = false;
    'probes: for _ in 0..k {
        for j in 0..c {
            for i in 0..r {
                let z: f32 = StandardNormal.sample(&mut *rng);
                xi[(i, j)] = z;
            }
        }
        for sign in [1.0f32, -1.0] {
            for j in 0..c {
                for i in 0..r {
                    shifted[(i, j)] = m_tilde[(i, j)] + sign * tau32 * xi[(i, j)];
                }
            }
            let f = match newton_schulz_with(shifted.as_ref(), ns, &mut ws) {
                Ok(f) => f,
                Err(MuonError::NonFinite { .. }) => {
                    non_finite = true;
                    break 'probes;
                }
                Err(e) => return Err(e),
            };
            for j in 0..c {
                for i in 0..r {
                    p[(i, j)] += f[(i, j)];
                }
            }
        }
    }
    let inv = 1.0 / (2 * k) as f32;
    let cf = coefficient as f32;
    let mut dir = Mat::<f32>::zeros(r, c);
    if !non_finite {
        for j in 0..c {
            for i in 0..r {
                let pv = p[(i, j)] * inv;
                let f = plain[(i, j)];
                let o = f - cf * (pv - f);
                non_finite |= !o.is_finite();
                dir[(i, j)] = o;
            }
        }
    }
    if non_finite {
        return Ok(BcOutput {
            direction: plain.clone(),
            plain,
            noise_std: s,
            tau,
            coefficient: 0.0,
            rescaled: false,
            fallback: Fallback::NonFinite,
        });
    }
    let bound = bc.max_norm_ratio * frobenius(plain.as_ref());
    let norm = frobenius(dir.as_ref());
    let rescaled = norm > bound;
    if rescaled {
        let f = (bound / norm) as f32;
        for j in 0..c {
            for v in dir.col_as_slice_mut(j) {
                *v *= f;
            }
        }
    }
    Ok(BcOutput {
        direction: dir,
        plain,
        noise_std: s,
        tau,
        coefficient,
        rescaled,
        fallback: Fallback::None,
    })
}
