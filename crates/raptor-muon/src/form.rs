//! The momentum forms and their arithmetic: one step's coefficients and the closed form over the
//! steps (what both the Muon step and DP-MuonBC's noise variance read).

use crate::error::{MuonError, check_param};

/// How the momentum buffer is updated and what is orthogonalized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MomentumForm {
    /// `m ← βm + g`; orthogonalize `m`.
    HeavyBall,
    /// `m ← βm + (1−β)g`; orthogonalize `m`.
    Ema,
    /// torch.optim.Muon (`nesterov=True`): `m ← βm + (1−β)g`; orthogonalize `(1−β)g + βm`.
    Nesterov,
}

/// One momentum step as two linear maps of the previous buffer `m` and the gradient `g`, the
/// arithmetic the tensor optimizers (`raptor-optim`) carry out:
/// the new buffer is `buffer_decay·m + buffer_gain·g`, and what is orthogonalized is that new
/// buffer or, for Nesterov, `look_ahead.gradient·g + look_ahead.buffer·m` (torch's
/// `(1−β)g + β·m_new` written in the previous buffer: `(1−β²)g + β²m`).
///
/// [`crate::momentum_update`] (on slices) computes the same maps in torch's `lerp` form, which rounds
/// differently in f32; [`update_weights`] is their closed form over the steps so far.
///
/// ```
/// use raptor_muon::MomentumForm;
/// let c = MomentumForm::Nesterov.coefficients(0.9);
/// assert_eq!((c.buffer_decay, c.buffer_gain), (0.9, 1.0 - 0.9));
/// let la = c.look_ahead.unwrap();
/// assert_eq!((la.gradient, la.buffer), (1.0 - 0.9 * 0.9, 0.9 * 0.9));
/// assert!(MomentumForm::HeavyBall.coefficients(0.9).look_ahead.is_none());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MomentumCoefficients {
    /// Weight of the previous buffer in the new one: β.
    pub buffer_decay: f64,
    /// Weight of the gradient in the new buffer: 1 (heavy-ball) or 1 − β (EMA, Nesterov).
    pub buffer_gain: f64,
    /// `None`: the new buffer is orthogonalized; `Some`: this combination of the gradient and
    /// the previous buffer is (Nesterov).
    pub look_ahead: Option<LookAhead>,
}

/// Nesterov's look-ahead `gradient·g + buffer·m` in the gradient and the previous buffer (see
/// [`MomentumCoefficients`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LookAhead {
    /// Weight of the gradient: 1 − β².
    pub gradient: f64,
    /// Weight of the previous buffer: β².
    pub buffer: f64,
}

impl MomentumForm {
    /// The step's coefficients for momentum `beta` (see [`MomentumCoefficients`]). Pure
    /// arithmetic: the range of `beta` is checked where it is configured
    /// ([`crate::MuonConfig::validate`], [`crate::momentum_update`]).
    pub fn coefficients(self, beta: f64) -> MomentumCoefficients {
        match self {
            MomentumForm::HeavyBall => MomentumCoefficients {
                buffer_decay: beta,
                buffer_gain: 1.0,
                look_ahead: None,
            },
            MomentumForm::Ema => MomentumCoefficients {
                buffer_decay: beta,
                buffer_gain: 1.0 - beta,
                look_ahead: None,
            },
            MomentumForm::Nesterov => MomentumCoefficients {
                buffer_decay: beta,
                buffer_gain: 1.0 - beta,
                look_ahead: Some(LookAhead {
                    gradient: 1.0 - beta * beta,
                    buffer: beta * beta,
                }),
            },
        }
    }
}

/// Closed form of the momentum recursion (buffer zero at `t = 0`): what is orthogonalized at
/// step `t ≥ 1` is `Σ_{k=1..t} w_k g_k`, and this returns `[w_1, …, w_t]`:
/// - heavy-ball: `w_k = β^{t−k}`;
/// - EMA: `w_k = (1−β) β^{t−k}`;
/// - Nesterov: `w_t = 1 − β²`, `w_k = β²(1−β) β^{t−1−k}` for `k < t`.
///
/// With independent gradient noise of variance `v_k` per entry at step `k`, what is
/// orthogonalized carries noise of variance `Σ_k w_k² v_k` ([`crate::buffer_noise_variance`] for a
/// constant `v`, [`RunningNoiseVariance`](crate::RunningNoiseVariance) step by step).
///
/// ```
/// use raptor_muon::{MomentumForm, update_weights};
/// let w = update_weights(MomentumForm::HeavyBall, 0.5, 3).unwrap();
/// assert_eq!(w, vec![0.25, 0.5, 1.0]);
/// ```
pub fn update_weights(form: MomentumForm, beta: f64, t: u64) -> Result<Vec<f64>, MuonError> {
    check_param(
        "beta",
        beta,
        (0.0..1.0).contains(&beta),
        "momentum beta must be in [0, 1)",
    )?;
    check_param("t", t as f64, t >= 1, "step index t starts at 1")?;
    let n = usize::try_from(t).map_err(|_| MuonError::InvalidHyperParameter {
        name: "t",
        value: t as f64,
        reason: "step index too large for this platform",
    })?;
    // β^j by repeated multiplication, j = 0, 1, …, from the newest gradient back.
    let mut pow = Vec::with_capacity(n);
    let mut b = 1.0_f64;
    for _ in 0..n {
        pow.push(b);
        b *= beta;
    }
    let w = (1..=n)
        .map(|k| match form {
            MomentumForm::HeavyBall => pow[n - k],
            MomentumForm::Ema => (1.0 - beta) * pow[n - k],
            MomentumForm::Nesterov if k == n => 1.0 - beta * beta,
            MomentumForm::Nesterov => beta * beta * (1.0 - beta) * pow[n - 1 - k],
        })
        .collect();
    Ok(w)
}
