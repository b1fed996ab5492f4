//! Optimizers on released gradients: AdamW, SGD, Muon and DP-MuonBC on libtorch tensors, one
//! state per parameter (so every expert of an MoE layer has its own AdamW state), with state
//! that a checkpoint can export and restore.
//!
//! Everything here is post-processing of a release: an optimizer only ever sees a gradient
//! after it was clipped, summed, noised and divided by its public denominator, so nothing in
//! this crate touches private data or needs accounting. DP-MuonBC's correction needs the
//! release's per-coordinate noise level ([`ReleaseNoise`]), which is public (σ·Δ / D).
//!
//! ```
//! use raptor_optim::{Optim, OptimSettings, Optimizers, ReleaseNoise};
//! use tch::Tensor;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let settings = OptimSettings::adamw(1e-3);
//! let mut opt = Optimizers::new(settings, &[("w".into(), Optim::AdamW)], Some(0));
//! let mut w = Tensor::zeros([4, 4], (tch::Kind::Float, tch::Device::Cpu));
//! let released = Tensor::ones([4, 4], (tch::Kind::Float, tch::Device::Cpu));
//! opt.step("w", &mut w, &released, 1.0, ReleaseNoise { std: 0.0 })?;
//! // Adam's first step moves every entry by the learning rate against the gradient's sign.
//! let moved: Vec<f32> = Vec::try_from(w.flatten(0, -1))?;
//! assert!(moved.iter().all(|x| (x + 1e-3).abs() < 1e-7));
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

use raptor_muon::{
    BcConfig, MomentumForm, NsConfig, RunningNoiseVariance, TchPrecision, bias_corrected_direction,
    newton_schulz_tch, newton_schulz_tch_batch,
};
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

/// Everything that can go wrong in an optimizer step or while restoring optimizer state.
#[derive(Debug, thiserror::Error)]
pub enum OptimError {
    /// Optimizer state that does not match the parameters (a checkpoint from another run, or a
    /// step for a parameter the optimizers were not built for).
    #[error("optimizer state: {0}")]
    State(String),
    /// A parameter whose shape its optimizer cannot take (Muon needs a matrix).
    #[error("optimizer: {0}")]
    Shape(String),
    /// From the Muon crate (Newton–Schulz, DP-MuonBC).
    #[error(transparent)]
    Muon(#[from] raptor_muon::MuonError),
    /// From libtorch.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, OptimError>;

/// Which optimizer updates a parameter (post-processing of its release).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Optim {
    /// AdamW.
    AdamW,
    /// Plain SGD.
    Sgd,
    /// Muon (2-D hidden matrices).
    Muon,
    /// Muon with DP-MuonBC's bias correction.
    MuonBc,
}

/// Optimizer hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct OptimSettings {
    /// Learning rate of AdamW / SGD.
    pub lr: f64,
    /// AdamW β₁, β₂, ε.
    pub betas: (f64, f64),
    /// AdamW ε.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Muon learning rate.
    pub muon_lr: f64,
    /// Muon momentum β.
    pub muon_beta: f64,
    /// Muon momentum form.
    pub muon_form: MomentumForm,
    /// Newton–Schulz configuration.
    pub ns: NsConfig,
    /// DP-MuonBC probe pairs.
    pub bc_probe_pairs: usize,
}

impl OptimSettings {
    /// The defaults of a `raptor train` run with learning rate `lr`: AdamW β = (0.9, 0.999),
    /// ε = 1e-8, decoupled weight decay 0.01; Muon learning rate 0.02, β = 0.95, Nesterov
    /// momentum, Keller Jordan's five-step Newton–Schulz; one DP-MuonBC probe pair.
    pub fn adamw(lr: f64) -> Self {
        Self {
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
            muon_lr: 0.02,
            muon_beta: 0.95,
            muon_form: MomentumForm::Nesterov,
            ns: NsConfig::keller(),
            bc_probe_pairs: 1,
        }
    }
}

/// Per-parameter optimizer state.
#[derive(Debug)]
struct State {
    kind: Optim,
    m: Option<Tensor>,
    v: Option<Tensor>,
    t: u64,
    /// DP-MuonBC: running per-entry noise variances (public) of the momentum buffer and of what
    /// NS sees (raptor-muon's recursion).
    noise: RunningNoiseVariance,
    /// This parameter's AdamW / SGD learning rate, when it is not the settings' `lr` (e.g.
    /// RAPTOR's expert stream).
    lr: Option<f64>,
}

/// Serializable scalar part of the optimizer state (tensors go to safetensors).
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct OptimScalars {
    /// Per parameter: (steps, noise variance of what Newton–Schulz sees, noise variance of
    /// Nesterov's EMA buffer — 0 for the other forms, whose buffer is what Newton–Schulz sees).
    pub params: BTreeMap<String, (u64, f64, f64)>,
}

/// The optimizers of a run.
#[derive(Debug)]
pub struct Optimizers {
    settings: OptimSettings,
    states: BTreeMap<String, State>,
    probe_rng: rand_chacha::ChaCha20Rng,
    /// Heavy-ball momentum of [`Optim::Sgd`] (0: plain SGD).
    sgd_momentum: f64,
    tap: Option<BufferTap>,
}

/// Which Muon inputs to keep for a later look (see [`Optimizers::with_tap`]): what Newton–Schulz
/// orthogonalizes at every `every`-th step of a matrix, for at most `max_matrices` matrices (the
/// first in name order), together with its per-entry noise std. These inputs are released
/// momentum buffers (post-processing of noised gradients); keeping them costs no privacy.
#[derive(Debug)]
pub struct BufferTap {
    /// Keep the input of steps `every, 2·every, …` of each matrix (≥ 1).
    pub every: u64,
    /// Keep at most this many matrices per step (in name order).
    pub max_matrices: usize,
    kept: Vec<BufferSample>,
}

impl BufferTap {
    /// A tap keeping the inputs of every `every`-th step (0 is taken as 1) of the first
    /// `max_matrices` Muon matrices.
    pub fn new(every: u64, max_matrices: usize) -> Self {
        Self {
            every: every.max(1),
            max_matrices,
            kept: Vec::new(),
        }
    }

    fn wants(&self, t: u64, name: &str, states: &BTreeMap<String, State>) -> bool {
        if t == 0 || !t.is_multiple_of(self.every.max(1)) {
            return false;
        }
        states
            .iter()
            .filter(|(_, st)| matches!(st.kind, Optim::Muon | Optim::MuonBc))
            .take(self.max_matrices)
            .any(|(n, _)| n == name)
    }
}

/// One kept Muon input (see [`BufferTap`]).
#[derive(Debug)]
pub struct BufferSample {
    /// The parameter.
    pub name: String,
    /// Its optimizer step (1-based).
    pub step: u64,
    /// What Newton–Schulz orthogonalized at that step (the released momentum buffer, or its
    /// Nesterov look-ahead), f32 on the CPU, the parameter's shape.
    pub input: Tensor,
    /// Per-entry noise std of `input` (the running variance DP-MuonBC uses; 0 without noise).
    pub noise_std: f64,
    /// Whether the step applied DP-MuonBC's correction (else plain Newton–Schulz).
    pub corrected: bool,
}

/// Per-entry noise of one release as DP-MuonBC needs it: std σΔ/D per coordinate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReleaseNoise {
    /// σ·Δ / denominator.
    pub std: f64,
}

impl Optimizers {
    /// Optimizers for `params` (name → kind). `probe_seed`: DP-MuonBC probes from a seeded
    /// generator (post-processing: does not affect privacy; reproducible), else the OS.
    pub fn new(
        settings: OptimSettings,
        params: &[(String, Optim)],
        probe_seed: Option<u64>,
    ) -> Self {
        use rand::SeedableRng;
        let states = params
            .iter()
            .map(|(n, k)| {
                (
                    n.clone(),
                    State {
                        kind: *k,
                        m: None,
                        v: None,
                        t: 0,
                        noise: RunningNoiseVariance::default(),
                        lr: None,
                    },
                )
            })
            .collect();
        let probe_rng = match probe_seed {
            Some(s) => raptor_muon::probe_rng_seeded(s),
            None => rand_chacha::ChaCha20Rng::from_os_rng(),
        };
        Self {
            settings,
            states,
            probe_rng,
            sgd_momentum: 0.0,
            tap: None,
        }
    }

    /// Gives parameter `name` its own AdamW / SGD learning rate `lr` (the settings' `lr` is
    /// every other parameter's; the schedule multiplies both). Muon matrices keep `muon_lr`.
    /// An unknown name or a learning rate that is not finite and ≥ 0 is an error.
    pub fn with_param_lr(mut self, name: &str, lr: f64) -> Result<Self> {
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(OptimError::State(format!(
                "learning rate {lr} of {name} is not finite and >= 0"
            )));
        }
        let st = self
            .states
            .get_mut(name)
            .ok_or_else(|| OptimError::State(format!("no optimizer state for {name}")))?;
        st.lr = Some(lr);
        Ok(self)
    }

    /// Heavy-ball momentum β ∈ [0, 1) of every [`Optim::Sgd`] parameter: `m ← βm + g`,
    /// `param ← param − lr·m` (β = 0, the default, is plain SGD). The update's size then
    /// follows the released gradient's scale, so a public denominator (RAPTOR's D_e = B/E)
    /// sets the expert step's size, as the analysis of the expert stream assumes; AdamW
    /// divides that scale out.
    pub fn with_sgd_momentum(mut self, beta: f64) -> Result<Self> {
        if !(beta.is_finite() && (0.0..1.0).contains(&beta)) {
            return Err(OptimError::State(format!(
                "SGD momentum {beta} is outside [0, 1)"
            )));
        }
        self.sgd_momentum = beta;
        Ok(self)
    }

    /// Keeps some Muon inputs for a later look ([`BufferTap`]; taken with
    /// [`Self::take_samples`]). Changes no update.
    pub fn with_tap(mut self, tap: BufferTap) -> Self {
        self.tap = Some(tap);
        self
    }

    /// The Muon inputs kept since the last call (empty without a tap).
    pub fn take_samples(&mut self) -> Vec<BufferSample> {
        self.tap
            .as_mut()
            .map(|t| std::mem::take(&mut t.kept))
            .unwrap_or_default()
    }

    /// One step of `param` along its released gradient `grad`; `lr_scale` multiplies every
    /// learning rate (schedule); `noise` is the release's per-entry noise (DP-MuonBC).
    pub fn step(
        &mut self,
        name: &str,
        param: &mut Tensor,
        grad: &Tensor,
        lr_scale: f64,
        noise: ReleaseNoise,
    ) -> Result<()> {
        if let Some(p) = self.step_one(name, param, grad, lr_scale, noise)? {
            apply_muon(
                &p,
                &newton_schulz_tch(&p.u, &self.settings.ns, TchPrecision::F32)?,
            )?;
        }
        Ok(())
    }

    /// One step of every parameter of an update, each along its released gradient (`(name,
    /// parameter, gradient, noise)`; the parameter tensors share storage with the model's and
    /// are updated in place). The result is that of [`Self::step`] on each in turn; the
    /// difference is that the Muon directions of matrices with one shape, kind and device are
    /// orthogonalized together: on CPU by raptor-muon's batched kernel (whole matrices per
    /// rayon thread; 2.2–3.2× faster than libtorch's loop, whose batched products are slower
    /// still), on a GPU by [`newton_schulz_tch_batch`] (one batched product per iteration step
    /// instead of one per matrix: the experts of an MoE layer, or the same projection across
    /// layers). The two backends agree within the tolerance of raptor-muon's planned schedules
    /// (`NsSchedule`: f32 round-off, looser for the Gram-space one; the test allows 1e-5 of
    /// the parameters after the step).
    /// DP-MuonBC matrices with noise take their own path, as in [`Self::step`].
    pub fn step_all(
        &mut self,
        items: Vec<(String, Tensor, Tensor, ReleaseNoise)>,
        lr_scale: f64,
    ) -> Result<()> {
        let mut groups: BTreeMap<(Vec<i64>, String), Vec<PendingMuon>> = BTreeMap::new();
        for (name, mut param, grad, noise) in items {
            if let Some(p) = self.step_one(&name, &mut param, &grad, lr_scale, noise)? {
                let key = (
                    p.u.size(),
                    format!("{:?}/{:?}", p.u.f_kind()?, p.u.device()),
                );
                groups.entry(key).or_default().push(p);
            }
        }
        for group in groups.values() {
            let us: Vec<&Tensor> = group.iter().map(|p| &p.u).collect();
            let dirs = if us.iter().all(|u| u.device() == tch::Device::Cpu) {
                ns_batch_cpu(&us, &self.settings.ns)?
            } else {
                newton_schulz_tch_batch(&us, &self.settings.ns, TchPrecision::F32)?
            };
            for (p, d) in group.iter().zip(&dirs) {
                apply_muon(p, d)?;
            }
        }
        Ok(())
    }

    /// [`Self::step`] except that a plain Muon step (no DP-MuonBC correction) stops before
    /// Newton–Schulz and returns what is left to do.
    fn step_one(
        &mut self,
        name: &str,
        param: &mut Tensor,
        grad: &Tensor,
        lr_scale: f64,
        noise: ReleaseNoise,
    ) -> Result<Option<PendingMuon>> {
        let s = self.settings.clone();
        let tapped = match (&self.tap, self.states.get(name)) {
            (Some(tap), Some(st)) => tap.wants(st.t + 1, name, &self.states),
            _ => false,
        };
        let mut kept = None;
        let st = self
            .states
            .get_mut(name)
            .ok_or_else(|| OptimError::State(format!("no optimizer state for {name}")))?;
        st.t += 1;
        let g = grad.f_to_kind(param.kind())?;
        let lr = st.lr.unwrap_or(s.lr) * lr_scale;
        let sgd_beta = self.sgd_momentum;
        let out = tch::no_grad(|| -> Result<Option<PendingMuon>> {
            match st.kind {
                Optim::Sgd if sgd_beta == 0.0 => {
                    let _ = param.f_sub_(&g.f_mul_scalar(lr)?)?;
                }
                Optim::Sgd => {
                    let m = match st.m.take() {
                        Some(m) => m.f_mul_scalar(sgd_beta)?.f_add(&g)?,
                        None => g.f_mul_scalar(1.0)?,
                    };
                    let _ = param.f_sub_(&m.f_mul_scalar(lr)?)?;
                    st.m = Some(m);
                }
                Optim::AdamW => {
                    let m = match st.m.take() {
                        Some(m) => m,
                        None => g.f_zeros_like()?,
                    };
                    let v = match st.v.take() {
                        Some(v) => v,
                        None => g.f_zeros_like()?,
                    };
                    let (b1, b2) = s.betas;
                    let m = m.f_mul_scalar(b1)?.f_add(&g.f_mul_scalar(1.0 - b1)?)?;
                    let v = v
                        .f_mul_scalar(b2)?
                        .f_add(&g.f_square()?.f_mul_scalar(1.0 - b2)?)?;
                    let t = st.t as i32;
                    let mhat = m.f_div_scalar(1.0 - b1.powi(t))?;
                    let vhat = v.f_div_scalar(1.0 - b2.powi(t))?;
                    let _ = param.f_mul_scalar_(1.0 - lr * s.weight_decay)?;
                    let upd = mhat.f_div(&vhat.f_sqrt()?.f_add_scalar(s.eps)?)?;
                    let _ = param.f_sub_(&upd.f_mul_scalar(lr)?)?;
                    st.m = Some(m);
                    st.v = Some(v);
                }
                Optim::Muon | Optim::MuonBc => {
                    // The momentum's coefficients and the noise variance's recursion are
                    // raptor-muon's (the one definition of the forms); the tensor arithmetic
                    // is here.
                    let c = s.muon_form.coefficients(s.muon_beta);
                    let m = match st.m.take() {
                        Some(m) => m,
                        None => g.f_zeros_like()?,
                    };
                    st.noise = st
                        .noise
                        .step(s.muon_form, s.muon_beta, noise.std * noise.std);
                    let decayed = m.f_mul_scalar(c.buffer_decay)?;
                    let m_new = if c.buffer_gain == 1.0 {
                        decayed.f_add(&g)?
                    } else {
                        decayed.f_add(&g.f_mul_scalar(c.buffer_gain)?)?
                    };
                    let (m, u) = match c.look_ahead {
                        None => (m_new.shallow_clone(), m_new),
                        Some(la) => {
                            let u = g
                                .f_mul_scalar(la.gradient)?
                                .f_add(&m.f_mul_scalar(la.buffer)?)?;
                            (m_new, u)
                        }
                    };
                    let size = param.size();
                    let (rows, cols) = match size.as_slice() {
                        [r, c] => (*r, *c),
                        _ => {
                            return Err(OptimError::Shape(format!(
                                "Muon needs matrices; {name} has shape {size:?}"
                            )));
                        }
                    };
                    let pending = PendingMuon {
                        param: param.shallow_clone(),
                        u: Tensor::new(),
                        lr: s.muon_lr * lr_scale,
                        weight_decay: s.weight_decay,
                        scale: (rows as f64 / cols as f64).max(1.0).sqrt(),
                    };
                    if tapped {
                        kept = Some(BufferSample {
                            name: name.to_string(),
                            step: st.t,
                            input: u
                                .f_detach_copy()?
                                .f_to_kind(Kind::Float)?
                                .f_to(tch::Device::Cpu)?
                                .f_contiguous()?,
                            noise_std: st.noise.update.max(0.0).sqrt(),
                            corrected: st.kind == Optim::MuonBc && st.noise.update > 0.0,
                        });
                    }
                    if st.kind == Optim::MuonBc && st.noise.update > 0.0 {
                        let v: Vec<f32> = Vec::try_from(
                            u.f_to_kind(Kind::Float)?
                                .f_to(tch::Device::Cpu)?
                                .f_flatten(0, -1)?,
                        )?;
                        // Row-major rows×cols is the column-major view of its transpose; NS
                        // commutes with transposition.
                        let view = raptor_muon::faer::MatRef::from_column_major_slice(
                            &v,
                            cols as usize,
                            rows as usize,
                        );
                        let bc = BcConfig {
                            probe_pairs: s.bc_probe_pairs.max(1),
                            ..BcConfig::default()
                        };
                        let out = bias_corrected_direction(
                            view,
                            st.noise.update.sqrt(),
                            &s.ns,
                            &bc,
                            &mut self.probe_rng,
                        )?;
                        let dir = out.direction;
                        // d is cols × rows (the transposed view); its columns, in order, are
                        // the rows of the rows × cols result.
                        let mut flat = Vec::with_capacity(v.len());
                        for i in 0..rows as usize {
                            flat.extend(dir.col_as_slice(i).iter().copied());
                        }
                        // flat is column-major of the transpose = row-major of the original.
                        let d = Tensor::f_from_slice(&flat)?
                            .f_reshape([rows, cols])?
                            .f_to_kind(param.kind())?
                            .f_to(param.device())?;
                        apply_muon(&pending, &d)?;
                        st.m = Some(m);
                        return Ok(None);
                    }
                    st.m = Some(m);
                    return Ok(Some(PendingMuon { u, ..pending }));
                }
            }
            Ok(None)
        });
        if let (Some(sample), Some(tap)) = (kept, self.tap.as_mut()) {
            tap.kept.push(sample);
        }
        out
    }

    /// Whether the Muon form orthogonalizes a look-ahead (Nesterov) rather than its buffer: then
    /// the buffer's noise variance is a scalar of its own in a checkpoint.
    fn has_look_ahead(&self) -> bool {
        self.settings
            .muon_form
            .coefficients(self.settings.muon_beta)
            .look_ahead
            .is_some()
    }

    /// The checkpoint's third scalar: the buffer's noise variance where it differs from what
    /// Newton–Schulz sees (Nesterov), else 0.
    fn buffer_scalar(&self, noise: RunningNoiseVariance) -> f64 {
        if self.has_look_ahead() {
            noise.buffer
        } else {
            0.0
        }
    }

    /// Named state tensors for a checkpoint (`{param}::m`, `{param}::v`) and the scalars.
    pub fn export(&self) -> Result<(Vec<(String, Tensor)>, OptimScalars)> {
        let mut ts = Vec::new();
        let mut sc = OptimScalars::default();
        for (n, st) in &self.states {
            if let Some(m) = &st.m {
                ts.push((format!("{n}::m"), m.f_detach()?.f_contiguous()?));
            }
            if let Some(v) = &st.v {
                ts.push((format!("{n}::v"), v.f_detach()?.f_contiguous()?));
            }
            sc.params.insert(
                n.clone(),
                (st.t, st.noise.update, self.buffer_scalar(st.noise)),
            );
        }
        Ok((ts, sc))
    }

    /// Restores what [`Self::export`] wrote.
    pub fn import(
        &mut self,
        tensors: Vec<(String, Tensor)>,
        sc: &OptimScalars,
        device: tch::Device,
    ) -> Result<()> {
        for (n, t) in tensors {
            let (p, which) = n
                .rsplit_once("::")
                .ok_or_else(|| OptimError::State(format!("tensor {n} has no ::m/::v suffix")))?;
            let st = self.states.get_mut(p).ok_or_else(|| {
                OptimError::State(format!("tensor {n} is for unknown parameter {p}"))
            })?;
            let t = t.f_to(device)?;
            match which {
                "m" => st.m = Some(t),
                "v" => st.v = Some(t),
                other => {
                    return Err(OptimError::State(format!("{n}: unknown part {other}")));
                }
            }
        }
        let has_look_ahead = self.has_look_ahead();
        for (n, (t, nv, bv)) in &sc.params {
            let st = self
                .states
                .get_mut(n)
                .ok_or_else(|| OptimError::State(format!("scalars for unknown parameter {n}")))?;
            st.t = *t;
            st.noise = RunningNoiseVariance {
                update: *nv,
                buffer: if has_look_ahead { *bv } else { *nv },
            };
        }
        Ok(())
    }
}

/// A Muon step waiting for its orthogonalized direction (see [`Optimizers::step_all`]).
#[derive(Debug)]
struct PendingMuon {
    /// The parameter (shares storage with the model's).
    param: Tensor,
    /// What Newton–Schulz orthogonalizes (momentum or its Nesterov look-ahead).
    u: Tensor,
    /// Muon learning rate of this update (schedule applied).
    lr: f64,
    /// Decoupled weight decay.
    weight_decay: f64,
    /// Shape factor √max(1, rows/cols).
    scale: f64,
}

/// Newton–Schulz of same-shape CPU tensors with raptor-muon's own batched kernel
/// ([`raptor_muon::newton_schulz_batch`]): on CPU it is 2.2–3.2× faster than libtorch's loop, and
/// libtorch's batched products are slower than its loop (`cargo bench -p raptor-benches --bench
/// muon`, group `ns5_batch`). A row-major `rows × cols` buffer is the column-major view of the
/// transpose, and Newton–Schulz commutes with transposition, so no copy is transposed.
fn ns_batch_cpu(us: &[&Tensor], ns: &NsConfig) -> Result<Vec<Tensor>> {
    let mut bufs = Vec::with_capacity(us.len());
    let mut shapes = Vec::with_capacity(us.len());
    for u in us {
        let size = u.size();
        let (rows, cols) = match size.as_slice() {
            [r, c] => (*r, *c),
            _ => {
                return Err(OptimError::Shape(format!(
                    "Muon needs matrices; got a tensor of shape {size:?}"
                )));
            }
        };
        let v: Vec<f32> =
            Vec::try_from(u.f_to_kind(Kind::Float)?.f_contiguous()?.f_flatten(0, -1)?)?;
        bufs.push(v);
        shapes.push((rows, cols, u.kind()));
    }
    let views: Vec<raptor_muon::faer::MatRef<'_, f32>> = bufs
        .iter()
        .zip(&shapes)
        .map(|(v, (rows, cols, _))| {
            raptor_muon::faer::MatRef::from_column_major_slice(v, *cols as usize, *rows as usize)
        })
        .collect();
    let outs = raptor_muon::newton_schulz_batch(&views, ns)?;
    let mut dirs = Vec::with_capacity(outs.len());
    for (o, (rows, cols, kind)) in outs.iter().zip(&shapes) {
        // o is cols × rows; its columns, in order, are the rows of the rows × cols result.
        let mut flat = Vec::with_capacity((*rows * *cols) as usize);
        for i in 0..*rows as usize {
            flat.extend(o.col_as_slice(i).iter().copied());
        }
        dirs.push(
            Tensor::f_from_slice(&flat)?
                .f_reshape([*rows, *cols])?
                .f_to_kind(*kind)?,
        );
    }
    Ok(dirs)
}

/// `param ← (1 − lr·wd)·param − lr·scale·dir`.
fn apply_muon(p: &PendingMuon, dir: &Tensor) -> Result<()> {
    tch::no_grad(|| -> Result<()> {
        let mut param = p.param.shallow_clone();
        let _ = param.f_mul_scalar_(1.0 - p.lr * p.weight_decay)?;
        let _ = param.f_sub_(&dir.f_mul_scalar(p.lr * p.scale)?)?;
        Ok(())
    })
}

/// Learning-rate multiplier at update `t` of `total`: linear warm-up, then constant or cosine.
pub fn lr_scale(t: u64, total: u64, warmup: u64, cosine: bool) -> f64 {
    if warmup > 0 && t < warmup {
        return (t + 1) as f64 / warmup as f64;
    }
    if cosine && total > warmup {
        let p = (t - warmup) as f64 / (total - warmup) as f64;
        return 0.5 * (1.0 + (std::f64::consts::PI * p).cos());
    }
    1.0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn settings() -> OptimSettings {
        OptimSettings {
            lr: 0.1,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            muon_lr: 0.02,
            muon_beta: 0.95,
            muon_form: MomentumForm::Nesterov,
            ns: NsConfig::keller(),
            bc_probe_pairs: 1,
        }
    }

    /// A tap keeps what Newton–Schulz saw at the tapped steps, with the noise std DP-MuonBC
    /// uses, for the first matrices only, and changes no update.
    #[test]
    fn a_buffer_tap_keeps_the_muon_inputs_and_changes_nothing() {
        let params: Vec<(String, Optim)> = vec![
            ("a".into(), Optim::MuonBc),
            ("b".into(), Optim::Muon),
            ("c".into(), Optim::AdamW),
        ];
        let mut plain = Optimizers::new(settings(), &params, Some(3));
        let mut tapped =
            Optimizers::new(settings(), &params, Some(3)).with_tap(BufferTap::new(2, 1));
        let g = Tensor::from_slice(&[0.3f32, -0.1, 0.2, 0.05, 0.4, -0.2]).reshape([2, 3]);
        let mut p1 = Tensor::zeros([2, 3], (Kind::Float, tch::Device::Cpu));
        let mut p2 = p1.copy();
        let noise = ReleaseNoise { std: 0.01 };
        for step in 1..=4u64 {
            for (n, _) in &params {
                plain.step(n, &mut p1, &g, 1.0, noise).unwrap();
                tapped.step(n, &mut p2, &g, 1.0, noise).unwrap();
            }
            let kept = tapped.take_samples();
            if step % 2 == 0 {
                assert_eq!(kept.len(), 1, "step {step}");
                let k = &kept[0];
                assert_eq!((k.name.as_str(), k.step), ("a", step));
                assert!(k.corrected);
                assert_eq!(k.input.size(), [2, 3]);
                let (_, sc) = tapped.export().unwrap();
                assert!((k.noise_std - sc.params["a"].1.sqrt()).abs() < 1e-15);
            } else {
                assert!(kept.is_empty(), "step {step}");
            }
        }
        assert!(plain.take_samples().is_empty());
        let d: f64 = (&p1 - &p2).abs().max().double_value(&[]);
        assert_eq!(d, 0.0);
    }

    #[test]
    fn adamw_first_step_moves_by_lr_times_sign() {
        // With bias correction, Adam's first step is lr·g/(|g|+eps) = lr·sign(g).
        let mut o = Optimizers::new(settings(), &[("p".into(), Optim::AdamW)], None);
        let mut p = Tensor::from_slice(&[1.0f32, 2.0, 3.0]);
        let g = Tensor::from_slice(&[0.5f32, -2.0, 1e-3]);
        o.step("p", &mut p, &g, 1.0, ReleaseNoise { std: 0.0 })
            .unwrap();
        let v: Vec<f32> = Vec::try_from(&p).unwrap();
        for (x, want) in v.iter().zip([0.9f32, 2.1, 2.9]) {
            assert!((x - want).abs() < 1e-5, "{v:?}");
        }
    }

    /// Our AdamW against libtorch's own (`torch::optim::AdamW` through `tch::nn`): decoupled
    /// weight decay, bias correction and a changing learning rate (schedule) over eight steps.
    #[test]
    fn adamw_matches_libtorchs_adamw() {
        use tch::nn::OptimizerConfig;
        let init = [0.5f32, -1.0, 2.0, 0.0, 3.0, -0.25];
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let w = vs.root().var_copy("w", &Tensor::from_slice(&init));
        let lr = 0.05;
        let mut torch_opt = tch::nn::AdamW::default().build(&vs, lr).unwrap();
        let mut ours = Optimizers::new(
            OptimSettings::adamw(lr),
            &[("w".into(), Optim::AdamW)],
            None,
        );
        let mut p = Tensor::from_slice(&init);
        for step in 0..8 {
            let scale = lr_scale(step, 8, 2, true);
            let g: Vec<f32> = (0..init.len())
                .map(|i| ((step as f32 + 1.0) * (i as f32 - 2.5)).sin() * (1.0 + i as f32))
                .collect();
            let g = Tensor::from_slice(&g);
            torch_opt.set_lr(lr * scale);
            torch_opt.zero_grad();
            (&w * &g).sum(Kind::Float).backward();
            torch_opt.step();
            ours.step("w", &mut p, &g, scale, ReleaseNoise { std: 0.0 })
                .unwrap();
        }
        let theirs: Vec<f32> = Vec::try_from(w.detach()).unwrap();
        let mine: Vec<f32> = Vec::try_from(&p).unwrap();
        for (a, b) in mine.iter().zip(&theirs) {
            assert!(
                (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                "{mine:?} vs {theirs:?}"
            );
        }
        assert!(
            mine.iter().zip(&init).any(|(a, b)| (a - b).abs() > 0.01),
            "the parameters moved"
        );
    }

    #[test]
    fn sgd_steps_along_the_release_with_the_schedule_factor() {
        let mut o = Optimizers::new(settings(), &[("p".into(), Optim::Sgd)], None);
        let mut p = Tensor::from_slice(&[1.0f32, -1.0]);
        let g = Tensor::from_slice(&[2.0f32, 4.0]);
        o.step("p", &mut p, &g, 0.5, ReleaseNoise { std: 0.0 })
            .unwrap();
        // lr 0.1 × schedule 0.5 × g.
        let v: Vec<f32> = Vec::try_from(&p).unwrap();
        assert!(
            (v[0] - 0.9).abs() < 1e-6 && (v[1] + 1.2).abs() < 1e-6,
            "{v:?}"
        );
    }

    /// SGD with heavy-ball momentum against libtorch's `torch::optim::SGD` (momentum β,
    /// dampening 0) over eight steps with a changing learning rate; β = 0 stays plain SGD.
    #[test]
    fn sgd_momentum_matches_libtorchs_sgd() {
        use tch::nn::OptimizerConfig;
        let init = [0.5f32, -1.0, 2.0, 0.0];
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let w = vs.root().var_copy("w", &Tensor::from_slice(&init));
        let (lr, beta) = (0.05, 0.9);
        let mut torch_opt = tch::nn::Sgd {
            momentum: beta,
            dampening: 0.0,
            wd: 0.0,
            nesterov: false,
        }
        .build(&vs, lr)
        .unwrap();
        let mut ours = Optimizers::new(OptimSettings::adamw(lr), &[("w".into(), Optim::Sgd)], None)
            .with_sgd_momentum(beta)
            .unwrap();
        let mut p = Tensor::from_slice(&init);
        for step in 0..8 {
            let scale = lr_scale(step, 8, 2, true);
            let g: Vec<f32> = (0..init.len())
                .map(|i| ((step as f32 + 1.0) * (i as f32 - 1.5)).cos() * (1.0 + i as f32))
                .collect();
            let g = Tensor::from_slice(&g);
            torch_opt.set_lr(lr * scale);
            torch_opt.zero_grad();
            (&w * &g).sum(Kind::Float).backward();
            torch_opt.step();
            ours.step("w", &mut p, &g, scale, ReleaseNoise { std: 0.0 })
                .unwrap();
        }
        let theirs: Vec<f32> = Vec::try_from(w.detach()).unwrap();
        let mine: Vec<f32> = Vec::try_from(&p).unwrap();
        for (a, b) in mine.iter().zip(&theirs) {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "{mine:?} vs {theirs:?}"
            );
        }
        // Momentum moved it further than plain SGD would have.
        let mut plain =
            Optimizers::new(OptimSettings::adamw(lr), &[("w".into(), Optim::Sgd)], None);
        let mut q = Tensor::from_slice(&init);
        let g = Tensor::from_slice(&[1.0f32, 1.0, 1.0, 1.0]);
        let mut r = Tensor::from_slice(&init);
        let mut mom = Optimizers::new(OptimSettings::adamw(lr), &[("w".into(), Optim::Sgd)], None)
            .with_sgd_momentum(beta)
            .unwrap();
        for _ in 0..3 {
            plain
                .step("w", &mut q, &g, 1.0, ReleaseNoise { std: 0.0 })
                .unwrap();
            mom.step("w", &mut r, &g, 1.0, ReleaseNoise { std: 0.0 })
                .unwrap();
        }
        let (q0, r0) = (q.double_value(&[0]), r.double_value(&[0]));
        assert!((q0 - (0.5 - 3.0 * lr)).abs() < 1e-6, "{q0}");
        // 1 + 1.9 + 2.71 steps of lr.
        assert!((r0 - (0.5 - 5.61 * lr)).abs() < 1e-5, "{r0}");
        for bad in [-0.1, 1.0, f64::NAN] {
            assert!(
                Optimizers::new(OptimSettings::adamw(lr), &[], None)
                    .with_sgd_momentum(bad)
                    .is_err()
            );
        }
    }

    /// A parameter with its own learning rate steps by it (AdamW and SGD); the others keep the
    /// settings' rate; unknown names and bad rates are errors.
    #[test]
    fn a_parameter_can_have_its_own_learning_rate() {
        let mut o = Optimizers::new(
            settings(),
            &[
                ("a".into(), Optim::AdamW),
                ("b".into(), Optim::AdamW),
                ("s".into(), Optim::Sgd),
            ],
            None,
        )
        .with_param_lr("b", 0.01)
        .unwrap()
        .with_param_lr("s", 0.5)
        .unwrap();
        let g = Tensor::from_slice(&[1.0f32]);
        let mut a = Tensor::from_slice(&[0.0f32]);
        let mut b = Tensor::from_slice(&[0.0f32]);
        let mut sg = Tensor::from_slice(&[0.0f32]);
        let n = ReleaseNoise { std: 0.0 };
        o.step("a", &mut a, &g, 0.5, n).unwrap();
        o.step("b", &mut b, &g, 0.5, n).unwrap();
        o.step("s", &mut sg, &g, 0.5, n).unwrap();
        // Adam's first step is lr·sign(g); the schedule factor 0.5 applies to both rates.
        assert!((a.double_value(&[0]) + 0.05).abs() < 1e-6);
        assert!((b.double_value(&[0]) + 0.005).abs() < 1e-7);
        assert!((sg.double_value(&[0]) + 0.25).abs() < 1e-7);
        let fresh = || Optimizers::new(settings(), &[("a".into(), Optim::AdamW)], None);
        assert!(fresh().with_param_lr("zzz", 0.1).is_err());
        assert!(fresh().with_param_lr("a", -1.0).is_err());
        assert!(fresh().with_param_lr("a", f64::NAN).is_err());
    }

    #[test]
    fn mismatched_state_and_shapes_are_errors_not_panics() {
        let mut o = Optimizers::new(
            settings(),
            &[("v".into(), Optim::Muon), ("m".into(), Optim::AdamW)],
            None,
        );
        let mut v = Tensor::from_slice(&[1.0f32, 2.0]);
        let g = Tensor::from_slice(&[0.5f32, -2.0]);
        let quiet = ReleaseNoise { std: 0.0 };
        let e = o.step("v", &mut v, &g, 1.0, quiet).unwrap_err();
        assert!(
            matches!(e, OptimError::Shape(ref m) if m.contains("v")),
            "{e}"
        );
        let e = o.step("nope", &mut v, &g, 1.0, quiet).unwrap_err();
        assert!(
            matches!(e, OptimError::State(ref m) if m.contains("nope")),
            "{e}"
        );
        let e = o
            .step_all(
                vec![("v".into(), v.shallow_clone(), g.shallow_clone(), quiet)],
                1.0,
            )
            .unwrap_err();
        assert!(matches!(e, OptimError::Shape(_)), "{e}");
        let sc = OptimScalars::default();
        for bad in ["m", "other::m", "m::w"] {
            let e = o
                .import(vec![(bad.into(), g.copy())], &sc, tch::Device::Cpu)
                .unwrap_err();
            assert!(
                matches!(e, OptimError::State(ref m) if m.contains(bad)),
                "{bad}: {e}"
            );
        }
        let mut sc = OptimScalars::default();
        sc.params.insert("ghost".into(), (1, 0.0, 0.0));
        let e = o.import(vec![], &sc, tch::Device::Cpu).unwrap_err();
        assert!(
            matches!(e, OptimError::State(ref m) if m.contains("ghost")),
            "{e}"
        );
    }

    #[test]
    fn state_round_trips() {
        let mut o = Optimizers::new(settings(), &[("p".into(), Optim::AdamW)], None);
        let mut p = Tensor::from_slice(&[1.0f32, 2.0]);
        let g = Tensor::from_slice(&[0.5f32, -2.0]);
        o.step("p", &mut p, &g, 1.0, ReleaseNoise { std: 0.0 })
            .unwrap();
        let (ts, sc) = o.export().unwrap();
        let mut o2 = Optimizers::new(settings(), &[("p".into(), Optim::AdamW)], None);
        o2.import(ts, &sc, tch::Device::Cpu).unwrap();
        let mut p2 = p.copy();
        o.step("p", &mut p, &g, 1.0, ReleaseNoise { std: 0.0 })
            .unwrap();
        o2.step("p", &mut p2, &g, 1.0, ReleaseNoise { std: 0.0 })
            .unwrap();
        assert_eq!(
            Vec::<f32>::try_from(&p).unwrap(),
            Vec::<f32>::try_from(&p2).unwrap()
        );
    }

    /// `step_all` (same-shape Muon matrices orthogonalized in one batch) moves every parameter
    /// as `step` does one at a time: Muon and DP-MuonBC (with and without noise) matrices of
    /// two shapes, an AdamW vector, with weight decay and a schedule factor, over three updates.
    #[test]
    fn step_all_equals_one_at_a_time() {
        let mut s = settings();
        s.weight_decay = 0.1;
        let kinds: Vec<(String, Optim)> = vec![
            ("a".into(), Optim::Muon),
            ("b".into(), Optim::Muon),
            ("c".into(), Optim::Muon),
            ("tall".into(), Optim::Muon),
            ("bc".into(), Optim::MuonBc),
            ("bias".into(), Optim::AdamW),
        ];
        let shape = |n: &str| -> Vec<i64> {
            match n {
                "tall" => vec![12, 5],
                "bias" => vec![7],
                _ => vec![5, 12],
            }
        };
        // Values from a seeded generator of our own (libtorch's global one is shared with
        // other tests of the process).
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(7);
        let mut draw = |shape: Vec<i64>| -> Tensor {
            let n: i64 = shape.iter().product();
            let v: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect();
            Tensor::from_slice(&v).reshape(shape)
        };
        let init: Vec<Tensor> = kinds.iter().map(|(n, _)| draw(shape(n))).collect();
        let mut one = Optimizers::new(s.clone(), &kinds, Some(3));
        let mut all = Optimizers::new(s, &kinds, Some(3));
        let p_one: Vec<Tensor> = init.iter().map(|t| t.copy()).collect();
        let p_all: Vec<Tensor> = init.iter().map(|t| t.copy()).collect();
        for update in 0..3 {
            let noise = ReleaseNoise {
                std: if update == 1 { 0.0 } else { 0.05 },
            };
            let grads: Vec<Tensor> = kinds.iter().map(|(n, _)| draw(shape(n))).collect();
            for (((n, _), p), g) in kinds.iter().zip(&p_one).zip(&grads) {
                let mut p = p.shallow_clone();
                one.step(n, &mut p, g, 0.5, noise).unwrap();
            }
            let items = kinds
                .iter()
                .zip(&p_all)
                .zip(&grads)
                .map(|(((n, _), p), g)| (n.clone(), p.shallow_clone(), g.shallow_clone(), noise))
                .collect();
            all.step_all(items, 0.5).unwrap();
            for (((n, _), a), b) in kinds.iter().zip(&p_one).zip(&p_all) {
                let diff = f64::try_from((a - b).abs().max()).unwrap();
                let moved = f64::try_from(a.abs().max()).unwrap();
                assert!(diff <= 1e-5 * moved.max(1.0), "{n} update {update}: {diff}");
            }
        }
        // The parameters did move (the comparison is not between two unchanged tensors).
        for (p, i) in p_all.iter().zip(&init) {
            assert!(f64::try_from((p - i).abs().max()).unwrap() > 1e-3);
        }
    }

    #[test]
    fn schedule_warms_up_and_decays() {
        assert_eq!(lr_scale(0, 10, 2, false), 0.5);
        assert_eq!(lr_scale(5, 10, 2, false), 1.0);
        assert!((lr_scale(2, 10, 2, true) - 1.0).abs() < 1e-12);
        assert!(lr_scale(9, 10, 2, true) < 0.1);
    }
}
