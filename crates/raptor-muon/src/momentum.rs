//! Muon momentum, learning-rate adjustment, weight decay and the optimizer step.
//!
//! The three momentum forms, with buffer `m` (zero at start) and gradient `g`:
//! - [`MomentumForm::HeavyBall`]: `m ← βm + g`, update `m` (DP-Muon, Kim & Oh, Moonlight buffer);
//! - [`MomentumForm::Ema`]: `m ← βm + (1−β)g`, update `m`;
//! - [`MomentumForm::Nesterov`]: torch.optim.Muon's code: `m ← βm + (1−β)g` (an EMA, `lerp`),
//!   update `(1−β)g + βm` (`grad.lerp(buf, β)`).
//!
//! The step is `p ← p(1 − lr·wd) − lr·adjust(rows, cols)·f(update)` with `f` the
//! Newton–Schulz map (weight decay uses the unadjusted lr, as torch and Moonlight do).

use faer::MatRef;

use crate::bc::{BcConfig, BcOutput, NoiseSpec, bias_corrected_direction, buffer_noise_variance};
use crate::error::{MuonError, check_finite, check_param, check_shape};
pub use crate::form::{LookAhead, MomentumCoefficients, MomentumForm, update_weights};
use crate::ns::{NsConfig, NsWorkspace, newton_schulz_with, to_col_major_vec};

/// Learning-rate shape adjustment (torch.optim.Muon's `adjust_lr_fn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LrAdjust {
    /// `lr` as given (the DP-Muon paper's update).
    None,
    /// Keller Jordan / torch default: `lr·sqrt(max(1, rows/cols))`.
    Original,
    /// Moonlight / torch `"match_rms_adamw"`: `lr·0.2·sqrt(max(rows, cols))`.
    MatchRmsAdamW,
}

impl LrAdjust {
    /// The multiplier applied to `lr` for a `rows × cols` parameter.
    ///
    /// ```
    /// use raptor_muon::LrAdjust;
    /// assert_eq!(LrAdjust::Original.factor(400, 100), 2.0);
    /// assert_eq!(LrAdjust::Original.factor(100, 400), 1.0);
    /// assert!((LrAdjust::MatchRmsAdamW.factor(100, 400) - 4.0).abs() < 1e-12);
    /// ```
    pub fn factor(&self, rows: usize, cols: usize) -> f64 {
        match self {
            LrAdjust::None => 1.0,
            LrAdjust::Original => (rows as f64 / cols as f64).max(1.0).sqrt(),
            LrAdjust::MatchRmsAdamW => 0.2 * (rows.max(cols) as f64).sqrt(),
        }
    }
}

/// Apply one momentum update in place: update `buf` from `grad` and write the vector to
/// orthogonalize into `out` (all the same length). Element-wise, f32, in torch's `lerp` form
/// (the maps of [`MomentumForm::coefficients`], rounded as torch.optim.Muon rounds them).
///
/// ```
/// use raptor_muon::{MomentumForm, momentum_update};
/// let (mut buf, mut out) = (vec![1.0f32], vec![0.0f32]);
/// momentum_update(MomentumForm::HeavyBall, 0.9, &mut buf, &[2.0], &mut out).unwrap();
/// assert!((buf[0] - 2.9).abs() < 1e-6 && out[0] == buf[0]);
/// ```
pub fn momentum_update(
    form: MomentumForm,
    beta: f64,
    buf: &mut [f32],
    grad: &[f32],
    out: &mut [f32],
) -> Result<(), MuonError> {
    check_param(
        "beta",
        beta,
        (0.0..1.0).contains(&beta),
        "momentum beta must be in [0, 1)",
    )?;
    if buf.len() != grad.len() || out.len() != grad.len() {
        return Err(MuonError::ShapeMismatch {
            what: "momentum buffers",
            len: buf.len().max(out.len()),
            rows: grad.len(),
            cols: 1,
        });
    }
    check_finite("gradient", grad)?;
    let b = beta as f32;
    let omb = (1.0 - beta) as f32;
    match form {
        MomentumForm::HeavyBall => {
            for ((m, &g), o) in buf.iter_mut().zip(grad).zip(out.iter_mut()) {
                *m = b * *m + g;
                *o = *m;
            }
        }
        MomentumForm::Ema => {
            for ((m, &g), o) in buf.iter_mut().zip(grad).zip(out.iter_mut()) {
                *m += omb * (g - *m); // lerp, as torch
                *o = *m;
            }
        }
        MomentumForm::Nesterov => {
            for ((m, &g), o) in buf.iter_mut().zip(grad).zip(out.iter_mut()) {
                *m += omb * (g - *m);
                *o = g + b * (*m - g); // grad.lerp(buf, beta)
            }
        }
    }
    Ok(())
}

/// Hyper-parameters of a Muon step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MuonConfig {
    /// Learning rate (> 0).
    pub lr: f64,
    /// Momentum coefficient β ∈ [0, 1).
    pub beta: f64,
    /// Momentum form.
    pub form: MomentumForm,
    /// Newton–Schulz configuration.
    pub ns: NsConfig,
    /// Learning-rate shape adjustment.
    pub lr_adjust: LrAdjust,
    /// Decoupled weight decay (≥ 0): `p ← p(1 − lr·wd)` before the update.
    pub weight_decay: f64,
}

impl Default for MuonConfig {
    /// torch.optim.Muon's defaults except weight decay 0: lr 1e-3, β 0.95, Nesterov, Keller NS5,
    /// `Original` lr adjustment.
    fn default() -> Self {
        MuonConfig {
            lr: 1e-3,
            beta: 0.95,
            form: MomentumForm::Nesterov,
            ns: NsConfig::keller(),
            lr_adjust: LrAdjust::Original,
            weight_decay: 0.0,
        }
    }
}

impl MuonConfig {
    /// The DP-Muon paper's form: heavy-ball momentum, Taylor `p_κ` with `q` steps, no lr
    /// adjustment, no weight decay.
    pub fn dp_muon(lr: f64, beta: f64, kappa: usize, q: usize) -> Self {
        MuonConfig {
            lr,
            beta,
            form: MomentumForm::HeavyBall,
            ns: NsConfig::taylor(kappa, q),
            lr_adjust: LrAdjust::None,
            weight_decay: 0.0,
        }
    }

    /// Check every hyper-parameter.
    pub fn validate(&self) -> Result<(), MuonError> {
        check_param("lr", self.lr, self.lr > 0.0, "learning rate must be > 0")?;
        check_param(
            "beta",
            self.beta,
            (0.0..1.0).contains(&self.beta),
            "momentum beta must be in [0, 1)",
        )?;
        check_param(
            "weight_decay",
            self.weight_decay,
            self.weight_decay >= 0.0,
            "weight decay must be >= 0",
        )?;
        self.ns.validate()
    }
}

/// Muon state for one `rows × cols` parameter (row-major slices).
#[derive(Debug, Clone)]
pub struct Muon {
    cfg: MuonConfig,
    rows: usize,
    cols: usize,
    buf: Vec<f32>,
    update: Vec<f32>,
    t: u64,
    ws: NsWorkspace,
}

impl Muon {
    /// New state (zero momentum buffer) for a `rows × cols` parameter.
    pub fn new(cfg: MuonConfig, rows: usize, cols: usize) -> Result<Self, MuonError> {
        cfg.validate()?;
        if rows == 0 || cols == 0 {
            return Err(MuonError::EmptyMatrix { rows, cols });
        }
        Ok(Muon {
            cfg,
            rows,
            cols,
            buf: vec![0.0; rows * cols],
            update: vec![0.0; rows * cols],
            t: 0,
            ws: NsWorkspace::new(rows, cols),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MuonConfig {
        &self.cfg
    }

    /// The momentum buffer (row-major).
    pub fn buffer(&self) -> &[f32] {
        &self.buf
    }

    /// Number of steps taken so far.
    pub fn steps_taken(&self) -> u64 {
        self.t
    }

    fn advance(&mut self, param: &[f32], grad: &[f32]) -> Result<(), MuonError> {
        check_shape("param", param.len(), self.rows, self.cols)?;
        check_shape("grad", grad.len(), self.rows, self.cols)?;
        check_finite("param", param)?;
        momentum_update(
            self.cfg.form,
            self.cfg.beta,
            &mut self.buf,
            grad,
            &mut self.update,
        )?;
        self.t += 1;
        Ok(())
    }

    fn apply(&self, param: &mut [f32], direction: &[f32]) {
        let decay = (1.0 - self.cfg.lr * self.cfg.weight_decay) as f32;
        let step = (self.cfg.lr * self.cfg.lr_adjust.factor(self.rows, self.cols)) as f32;
        for (p, &o) in param.iter_mut().zip(direction) {
            *p = *p * decay - step * o;
        }
    }

    /// One Muon step: momentum, Newton–Schulz, lr adjustment, weight decay. `param` and `grad`
    /// are row-major `rows × cols`.
    pub fn step(&mut self, param: &mut [f32], grad: &[f32]) -> Result<(), MuonError> {
        self.advance(param, grad)?;
        // The row-major update is the column-major view of its transpose; f(Uᵀ) = f(U)ᵀ.
        let view = MatRef::from_column_major_slice(&self.update, self.cols, self.rows);
        let o = newton_schulz_with(view, &self.cfg.ns, &mut self.ws)?;
        let dir = to_col_major_vec(o.as_ref());
        self.apply(param, &dir);
        Ok(())
    }

    /// One DP-MuonBC step: `grad` is the privatized gradient (noise std `σΔ/B` per entry, as
    /// `noise` says); the direction is the bias-corrected `O_BC` with the exact per-entry noise
    /// variance of this step's update (see [`buffer_noise_variance`]). Returns the diagnostics.
    pub fn step_bc<R: rand::Rng + ?Sized>(
        &mut self,
        param: &mut [f32],
        grad: &[f32],
        noise: &NoiseSpec,
        bc: &BcConfig,
        rng: &mut R,
    ) -> Result<BcOutput, MuonError> {
        noise.validate()?;
        bc.validate()?;
        self.advance(param, grad)?;
        let s2 = buffer_noise_variance(self.cfg.form, noise, self.cfg.beta, self.t)?;
        let view = MatRef::from_column_major_slice(&self.update, self.cols, self.rows);
        let out = bias_corrected_direction(view, s2.sqrt(), &self.cfg.ns, bc, rng)?;
        let dir = to_col_major_vec(out.direction.as_ref());
        self.apply(param, &dir);
        Ok(out)
    }
}
