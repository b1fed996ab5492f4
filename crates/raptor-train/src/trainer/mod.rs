//! The trainer core: one loop for every method, driven by a [`Plan`].
//!
//! One update runs one [`Phase`]:
//! 1. draw a fresh Poisson sample (rate q, CSPRNG; may be empty);
//! 2. one forward/backward per micro-batch with owner masks and residual weights as the phase
//!    says; per-record norms by clip group, clip factors and clipped sums (raptor-models'
//!    per-sample engine); a parameter that got no gradient (an expert with no owned record, an
//!    empty sample) contributes zeros;
//! 3. each release: clipped sums + N(0, (σΔ)²) per coordinate ÷ its public denominator;
//! 4. every release is charged to the ledger and the ledger handed to the caller (who writes
//!    it atomically) **before** any parameter changes;
//! 5. optimizer steps on the released gradients only.
//!
//! Nothing here branches on a private count: the phase, the releases, their denominators and
//! the number of updates come from the plan; an expert whose owner group is empty still takes a
//! noise-only step.
//!
//! The white-box audit's hook (Dirac canaries) is in `canaries`, data-parallel training's
//! all-reduce in `collective`, records, batches and evaluation in `batch`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rand::{RngCore, SeedableRng};
use raptor_accountant::{Ledger, PoissonSampler, SamplingRate};
use raptor_clip::tensor::{ClippedSum, TensorRelease};
use raptor_clip::{ClipPolicy, ParamGroups, Privatizer, PublicDenominator};
use raptor_models::{Batch, ClippedStep, ForwardCtx, Model};
use serde::Serialize;
use tch::{Device, Kind, Tensor};

use crate::dist::{Collective, Solo};
use crate::error::{Result, TrainError};
use crate::optim::{Optimizers, ReleaseNoise, lr_scale};
use crate::streams::{Charge, GroupId, Phase, PhaseCharge, Plan, ReleaseSpec, Residual};
use raptor_models::PrefixCache;

pub use batch::{evaluate_cached, per_record_losses_cached};

mod batch;
mod canaries;
mod collective;
mod prefix;

pub use batch::{EvalMetrics, Example, evaluate, make_batch, per_record_losses};
#[cfg(feature = "planted-faults")]
pub use canaries::PlantedFault;
pub use canaries::{CanaryCoord, DiracCanaries, DiracCanary};

/// What the trainer needs besides the plan.
#[derive(Debug, Clone)]
pub struct TrainerOptions {
    /// Records per forward pass (memory only).
    pub micro_batch: usize,
    /// NOT PRIVATE: seeds sampling and noise.
    pub insecure_seed: Option<u64>,
    /// Padding id.
    pub pad_id: i64,
    /// Device.
    pub device: Device,
    /// Warm-up updates.
    pub warmup_steps: u64,
    /// Cosine decay.
    pub cosine: bool,
}

/// One release as it happened (public: which stream, which denominator, which σ).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReleaseEvent {
    /// Update index (0-based).
    pub update: u64,
    /// The phase's stream.
    pub phase: crate::streams::Stream,
    /// Release name.
    pub release: String,
    /// Public denominator.
    pub denominator: f64,
    /// Noise multiplier.
    pub sigma: f64,
    /// L2 sensitivity Δ.
    pub sensitivity: f64,
    /// How it was charged.
    pub charge: Charge,
}

/// Diagnostics of one update (computed on the private batch: for the data owner, not part of
/// the DP release).
#[derive(Debug, Clone, Serialize)]
pub struct UpdateMetrics {
    /// Update index (0-based).
    pub update: u64,
    /// Phase name.
    pub phase: String,
    /// Mean per-record loss over the sample (NaN for an empty sample).
    pub loss: f64,
    /// Records drawn (an audit run's Dirac canaries included; `loss` and `clipped_fraction`
    /// are over the real ones).
    pub sampled: usize,
    /// Per clip group: fraction of sampled records whose factor was < 1.
    pub clipped_fraction: BTreeMap<String, f64>,
    /// Expert releases whose owner group was empty in this sample (noise-only steps).
    pub empty_expert_groups: usize,
    /// Learning-rate multiplier.
    pub lr_scale: f64,
    /// Sampled records whose residual weight was not finite (their shared-only logits were
    /// NaN or infinite), given weight 0 in the weighted groups: they contribute nothing there,
    /// within their bound, and the run goes on (an error would be an event that depends on
    /// private data). Counted over this process's share of the sample.
    pub nonfinite_residual_weights: u64,
}

/// Checks that `release` is the mechanism the ledger charges for `spec`: its groups are the
/// planned release's, its noise multiplier the planned σ and its sensitivity the planned Δ
/// (`delta`, from the phase's clipping).
fn release_matches_charge(
    spec: &ReleaseSpec,
    delta: f64,
    release: &TensorRelease<GroupId>,
) -> Result<()> {
    if release.groups() != spec.groups.as_slice() {
        Err(TrainError::Run(format!(
            "release {} released the groups {:?}, but the ledger charges {:?}",
            spec.name,
            release.groups(),
            spec.groups
        )))
    } else if release.noise_multiplier() == spec.sigma && release.sensitivity() == delta {
        Ok(())
    } else {
        Err(TrainError::Run(format!(
            "release {} drew noise σ {} for sensitivity {}, but the ledger charges σ {} at sensitivity {delta}",
            spec.name,
            release.noise_multiplier(),
            release.sensitivity(),
            spec.sigma
        )))
    }
}

/// The noise generators of the plan's private releases, σ scaled by `scale` (1 outside the
/// audit's tests); a release whose scaled σ is 0 gets none.
fn make_privatizers(
    plan: &Plan,
    insecure_seed: Option<u64>,
    scale: &dyn Fn(&ReleaseSpec) -> f64,
) -> Result<BTreeMap<(usize, usize), Privatizer>> {
    let mut privatizers = BTreeMap::new();
    for (i, ph) in plan.phases.iter().enumerate() {
        if !ph.private {
            continue;
        }
        for (j, r) in ph.releases.iter().enumerate() {
            let sigma = r.sigma * scale(r);
            if sigma > 0.0 {
                let p = match insecure_seed {
                    Some(s) => Privatizer::seeded_insecure(
                        sigma,
                        s ^ (0x9e37_79b9_7f4a_7c15u64.wrapping_mul((i * 1000 + j + 1) as u64)),
                    )?,
                    None => Privatizer::new(sigma)?,
                };
                privatizers.insert((i, j), p);
            }
        }
    }
    Ok(privatizers)
}

/// The training loop's state.
pub struct Trainer<'a> {
    model: &'a mut dyn Model,
    plan: Plan,
    /// Each phase's grouped clipping (`Phase::clipping`), built once: the engine clips with
    /// it and each release's sensitivity comes from it.
    clippings: Vec<Arc<(ParamGroups<GroupId>, ClipPolicy<GroupId>)>>,
    data: &'a [Example],
    owners: BTreeMap<usize, Vec<i64>>,
    vars: BTreeMap<String, Tensor>,
    scope: Vec<String>,
    sampler: PoissonSampler,
    privatizers: BTreeMap<(usize, usize), Privatizer>,
    optim: Optimizers,
    ledger: Ledger,
    update: u64,
    unaccounted: u64,
    opts: TrainerOptions,
    seed_rng: rand_chacha::ChaCha20Rng,
    events: Vec<ReleaseEvent>,
    comm: &'a dyn Collective,
    canaries: Option<DiracCanaries>,
    /// The frozen-prefix caches of the training and the validation records
    /// ([`Trainer::with_prefix_caches`]).
    prefix: Option<PrefixCache>,
    validation_prefix: Option<PrefixCache>,
}

/// The single-process collective every trainer starts with.
static SOLO: Solo = Solo;

impl std::fmt::Debug for Trainer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("update", &self.update)
            .field("records", &self.data.len())
            .finish_non_exhaustive()
    }
}

/// One released gradient: its parameter, the noised and normalized tensor, and its noise.
type Released = (String, Tensor, ReleaseNoise);

impl<'a> Trainer<'a> {
    /// A trainer over `data` (the private training records) for `plan`. `owners`: per sparse
    /// layer, the owner expert of each record of `data` (same order), computed once from the
    /// frozen model.
    pub fn new(
        model: &'a mut dyn Model,
        plan: Plan,
        data: &'a [Example],
        owners: BTreeMap<usize, Vec<i64>>,
        optim: Optimizers,
        opts: TrainerOptions,
    ) -> Result<Self> {
        if data.is_empty() {
            return Err(TrainError::Data("the training set is empty".into()));
        }
        if model.expert_capacity().is_some() {
            return Err(raptor_models::ModelError::CapacityInPrivateTraining {
                capacity: model.expert_capacity().unwrap_or(0),
            }
            .into());
        }
        for ph in &plan.phases {
            for l in &ph.owner_layers {
                let o = owners.get(l).ok_or_else(|| {
                    TrainError::Config(format!(
                        "phase {} masks experts of layer {l} but no owner map was given",
                        ph.name
                    ))
                })?;
                if o.len() != data.len() {
                    return Err(TrainError::Config(format!(
                        "owner map of layer {l} has {} entries for {} records",
                        o.len(),
                        data.len()
                    )));
                }
            }
        }
        // Routed-expert parameters clipped role-wise (several groups in the phase) must come with
        // their layer's owner map: otherwise a record's tokens would reach several expert
        // streams and its sensitivity would no longer be one stream's bound.
        for ph in &plan.phases {
            if !ph.private || ph.global_clip.is_some() || ph.groups.len() < 2 {
                continue;
            }
            for g in &ph.groups {
                for p in &g.params {
                    if let Some(l) = plan.routed.get(p).map(|id| id.layer)
                        && !ph.owner_layers.contains(&l)
                    {
                        return Err(TrainError::Config(format!(
                            "phase {}: routed-expert parameter {p} is clipped role-wise (group {}) but layer {l} has no owner map; a record could touch several expert streams",
                            ph.name, g.name
                        )));
                    }
                }
            }
        }
        let vars: BTreeMap<String, Tensor> = model.var_store().variables().into_iter().collect();
        // The scope: every variable trainable at the start (the method's setup) plus the plan's
        // parameters; each phase switches on its own parameters and off all the others.
        let mut scope: Vec<String> = vars
            .iter()
            .filter(|(_, t)| t.requires_grad())
            .map(|(n, _)| n.clone())
            .collect();
        scope.extend(plan.params());
        scope.sort();
        scope.dedup();
        for p in plan.params() {
            if !vars.contains_key(&p) {
                return Err(TrainError::Config(format!(
                    "planned parameter {p} is not in the model"
                )));
            }
        }
        let rate = SamplingRate::new(plan.q)?;
        let sampler = match opts.insecure_seed {
            Some(s) => PoissonSampler::seeded_insecure(rate, data.len(), s)?,
            None => PoissonSampler::new(rate, data.len())?,
        };
        let privatizers = make_privatizers(&plan, opts.insecure_seed, &|_| 1.0)?;
        let clippings = plan
            .phases
            .iter()
            .map(|ph| Arc::new(ph.clipping()))
            .collect();
        let seed_rng = match opts.insecure_seed {
            Some(s) => rand_chacha::ChaCha20Rng::seed_from_u64(s.wrapping_add(17)),
            None => rand_chacha::ChaCha20Rng::from_os_rng(),
        };
        Ok(Self {
            model,
            plan,
            clippings,
            data,
            owners,
            vars,
            scope,
            sampler,
            privatizers,
            optim,
            ledger: Ledger::new(),
            update: 0,
            unaccounted: 0,
            opts,
            seed_rng,
            events: Vec::new(),
            comm: &SOLO,
            canaries: None,
            prefix: None,
            validation_prefix: None,
        })
    }

    /// Every parameter some phase of the plan trains (and every one trainable at the start):
    /// what the frozen prefix must not reach (crate `raptor-run`'s `prefix::plan_prefix_cache`).
    pub fn scope(&self) -> &[String] {
        &self.scope
    }

    /// Starts each pass over a training record (`train`, over the trainer's records in order)
    /// or a validation record ([`Trainer::evaluate_validation`]; `validation`, over those
    /// records) from its cached hidden states after the frozen prefix. The released updates
    /// equal those without a cache up to float round-off.
    ///
    /// # Errors
    /// A cache over another number of records, or one that skips a block some phase trains or
    /// adapts (its states would be stale).
    pub fn with_prefix_caches(
        mut self,
        train: Option<PrefixCache>,
        validation: Option<PrefixCache>,
    ) -> Result<Self> {
        let frozen = self
            .model
            .frozen_prefix(&self.scope)
            .map_or(0, |p| p.layers);
        for c in train.iter().chain(validation.iter()) {
            if c.layers() > frozen {
                return Err(TrainError::Config(format!(
                    "a prefix cache of the states after {} blocks, but only {frozen} are frozen while this plan trains",
                    c.layers()
                )));
            }
        }
        if let Some(c) = &train
            && c.records() != self.data.len()
        {
            return Err(TrainError::Config(format!(
                "a prefix cache of {} records for {} training records",
                c.records(),
                self.data.len()
            )));
        }
        self.prefix = train;
        self.validation_prefix = validation;
        Ok(self)
    }

    /// Evaluates the model on `validation` (the records the validation cache was made for, in
    /// order), from their cached hidden states when there is a cache.
    ///
    /// # Errors
    /// As [`evaluate`].
    pub fn evaluate_validation(&mut self, validation: &[Example]) -> Result<EvalMetrics> {
        evaluate_cached(
            &*self.model,
            validation,
            self.opts.micro_batch,
            self.opts.pad_id,
            self.opts.device,
            self.validation_prefix.as_mut(),
        )
    }

    /// Hands over the training and validation caches (for the measurements after training).
    pub fn take_prefix_caches(&mut self) -> (Option<PrefixCache>, Option<PrefixCache>) {
        (self.prefix.take(), self.validation_prefix.take())
    }

    /// Continue from a checkpoint: the ledger (which may hold more releases than `update`
    /// applied updates after a crash: it only over-counts) and the update counter.
    ///
    /// A ledger written by an earlier raptor that charged a sample's releases separately (named
    /// parallel groups) is refused when this plan releases several streams from one sample:
    /// that ledger under-counts the updates it holds.
    pub fn resume(&mut self, ledger: Ledger, update: u64) -> Result<()> {
        let one_sample_streams = self.plan.phases.iter().any(|ph| {
            ph.private
                && ph
                    .releases
                    .iter()
                    .filter(|r| r.charge != Charge::None)
                    .count()
                    > 1
                && ph.releases.iter().any(|r| r.charge == Charge::Sequential)
        });
        if one_sample_streams && !ledger.parallel_groups().is_empty() {
            return Err(TrainError::Run(
                "this run's ledger was written by an earlier raptor that charged the shared and \
                 expert releases of one sample as separate samples, which under-reports epsilon; \
                 it cannot be resumed: start a new run"
                    .into(),
            ));
        }
        self.ledger = ledger;
        self.update = update;
        Ok(())
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Updates applied so far.
    pub fn update(&self) -> u64 {
        self.update
    }

    /// Whether every planned update ran.
    pub fn done(&self) -> bool {
        self.update >= self.plan.updates
    }

    /// The ledger.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Releases made with σ = 0 (tests and non-private methods): ε is infinite when > 0 in a
    /// private phase.
    pub fn unaccounted_releases(&self) -> u64 {
        self.unaccounted
    }

    /// The release events so far.
    pub fn events(&self) -> &[ReleaseEvent] {
        &self.events
    }

    /// The model.
    pub fn model(&self) -> &dyn Model {
        &*self.model
    }

    /// The optimizers (for checkpoints).
    pub fn optimizers(&self) -> &Optimizers {
        &self.optim
    }

    /// The optimizers (to restore a checkpoint).
    pub fn optimizers_mut(&mut self) -> &mut Optimizers {
        &mut self.optim
    }

    fn set_phase_trainable(&self, phase: &Phase) -> Result<()> {
        let keep = phase.params();
        for p in &self.scope {
            let on = keep.binary_search(p).is_ok();
            if let Some(v) = self.vars.get(p) {
                let _ = v.f_set_requires_grad(on)?;
            }
        }
        Ok(())
    }

    fn batch(&self, idx: &[usize]) -> Result<Batch> {
        let ex: Vec<&Example> = idx.iter().map(|&i| &self.data[i]).collect();
        make_batch(&ex, self.model.task(), self.opts.pad_id, self.opts.device)
    }

    /// A non-empty micro-batch reaches every trainable parameter of `phase` except routed
    /// experts' ([`Plan::routed`]); `reached` names the parameters that got a gradient. A
    /// parameter it misses is not used by the model's forward pass (e.g. an adapter the
    /// forward skips): releasing it as noise only would train nothing and say nothing, so it
    /// is an error. Structural, not data-dependent: every record's forward uses the same
    /// non-routed parameters.
    fn check_reached(&self, phase: &Phase, reached: &[String]) -> Result<()> {
        let reached: std::collections::BTreeSet<&str> =
            reached.iter().map(String::as_str).collect();
        let routed: std::collections::BTreeSet<&str> =
            self.plan.routed.keys().map(String::as_str).collect();
        let missing: Vec<String> = phase
            .params()
            .into_iter()
            .filter(|p| !reached.contains(p.as_str()) && !routed.contains(p.as_str()))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let shown: Vec<&str> = missing.iter().take(5).map(String::as_str).collect();
        Err(TrainError::Run(format!(
            "{} trainable parameter{} of phase {} got no gradient from a non-empty batch: the model's forward pass does not use {} ({}{}); nothing would train them",
            missing.len(),
            if missing.len() == 1 { "" } else { "s" },
            phase.name,
            if missing.len() == 1 { "it" } else { "them" },
            shown.join(", "),
            if missing.len() > shown.len() {
                ", …"
            } else {
                ""
            }
        )))
    }

    /// Residual weights `[b]` in [0, 1] from the shared-only logits (expert LoRA off), and how
    /// many were not finite: those are mapped to 0 (the record adds nothing to the weighted
    /// groups) instead of stopping the run.
    fn residual_weights(
        &self,
        phase: &Phase,
        batch: &Batch,
        prefix: Option<&(usize, Tensor)>,
    ) -> Result<(Tensor, u64)> {
        let mut ctx = ForwardCtx::new(false);
        ctx.lora_disabled = phase.residual_disable.clone();
        ctx.prefix = prefix.map(|(k, h)| (*k, h.shallow_clone()));
        let logits = tch::no_grad(|| self.model.forward(batch, &mut ctx))?;
        let probs = logits
            .f_to_kind(Kind::Double)?
            .f_softmax(-1, Kind::Double)?;
        let labels = batch
            .labels
            .as_ref()
            .ok_or_else(|| TrainError::Config("residual weights need class labels".into()))?;
        let py = probs
            .f_gather(1, &labels.f_unsqueeze(1)?, false)?
            .f_squeeze_dim(1)?;
        let w = match phase.residual {
            Residual::None => py.f_ones_like()?,
            Residual::Prob => py.f_neg()?.f_add_scalar(1.0)?.f_clamp(0.0, 1.0)?,
            Residual::Margin => {
                let others = probs.f_scatter_value(1, &labels.f_unsqueeze(1)?, -1.0)?;
                let best_other = others.f_amax([1i64].as_slice(), false)?;
                py.f_sub(&best_other)?.f_lt(0.2)?.f_to_kind(Kind::Double)?
            }
        };
        let finite = w.f_isfinite()?;
        let bad = finite
            .f_logical_not()?
            .f_sum(Kind::Int64)?
            .f_int64_value(&[])?;
        let w = w.f_where_self(&finite, &w.f_zeros_like()?)?;
        Ok((w.f_to_kind(Kind::Float)?.f_detach()?, bad.max(0) as u64))
    }

    /// Draws this update's Poisson sample and its dropout seed. Under data parallelism rank 0
    /// samples (its sampler is the one the accountant certifies) and picks the seed; every
    /// rank gets both.
    fn draw_sample(&mut self) -> Result<(Vec<usize>, u64)> {
        if self.comm.size() <= 1 {
            let sample = self.sampler.sample();
            return Ok((sample, self.seed_rng.next_u64()));
        }
        let mut buf: Vec<u64> = Vec::new();
        if self.comm.rank() == 0 {
            let s = self.sampler.sample();
            buf.push(self.seed_rng.next_u64());
            buf.extend(s.iter().map(|&i| i as u64));
        }
        self.comm.broadcast_u64(&mut buf)?;
        let (seed, ids) = buf
            .split_first()
            .ok_or_else(|| TrainError::Run("the sample broadcast from rank 0 was empty".into()))?;
        let mut sample = Vec::with_capacity(ids.len());
        for &i in ids {
            let i = usize::try_from(i)
                .ok()
                .filter(|&i| i < self.data.len())
                .ok_or_else(|| {
                    TrainError::Run(format!(
                        "rank 0 sampled record {i} of {}: the ranks hold different training sets",
                        self.data.len()
                    ))
                })?;
            sample.push(i);
        }
        Ok((sample, *seed))
    }

    /// One micro-batch of a private phase: owner masks, residual weights, per-record clipping
    /// by the phase's groups. Returns the records' losses and the clipped sums with their clip
    /// factors; counts each owner expert's records into `owned`.
    #[allow(clippy::too_many_arguments)]
    fn private_sums(
        &self,
        phase: &Phase,
        clipping: &(ParamGroups<GroupId>, ClipPolicy<GroupId>),
        chunk: &[usize],
        batch: &Batch,
        prefix: Option<&(usize, Tensor)>,
        step_seed: u64,
        owned: &mut BTreeMap<(usize, i64), usize>,
        nonfinite: &mut u64,
    ) -> Result<(Tensor, raptor_models::ClipOutput<GroupId>)> {
        let ids: Vec<u64> = chunk.iter().map(|&i| self.data[i].id).collect();
        let mut owners = BTreeMap::new();
        for &l in &phase.owner_layers {
            let o: Vec<i64> = chunk.iter().map(|&i| self.owners[&l][i]).collect();
            for &e in &o {
                *owned.entry((l, e)).or_default() += 1;
            }
            owners.insert(l, Tensor::f_from_slice(&o)?.f_to(self.opts.device)?);
        }
        let mut weights = BTreeMap::new();
        if phase.residual != Residual::None && phase.groups.iter().any(|g| g.weighted) {
            let (w, bad) = self.residual_weights(phase, batch, prefix)?;
            *nonfinite += bad;
            for g in phase.groups.iter().filter(|g| g.weighted) {
                weights.insert(g.name.clone(), w.shallow_clone());
            }
        }
        let (groups, policy) = clipping;
        let mut step = ClippedStep::new(&*self.model)?
            .with_dropout_seed(step_seed)
            .with_record_ids(ids);
        if let Some((k, h)) = prefix {
            step = step.with_prefix(*k, h.shallow_clone());
        }
        let (losses, grads) = step.per_sample(batch, &owners, true)?;
        self.check_reached(phase, &grads.params())?;
        // Weights of groups with no gradient in this pass (no owned record) are dropped.
        let present: BTreeSet<&GroupId> = grads
            .params()
            .iter()
            .filter_map(|p| groups.group_of(p))
            .collect();
        weights.retain(|g, _| present.contains(g));
        let clip = grads.into_clip(groups, policy, &weights)?;
        Ok((losses, clip))
    }

    /// The phase's releases from the summed clipped gradients `sums` (noise on rank 0, then
    /// the public denominator; an absent sum is zeros), each recorded as an event and charged
    /// to the ledger as one charge for the whole sample: the charge of the releases made (each
    /// with the σ it carries), which must equal the plan's ([`Phase::charge`]), all before any
    /// parameter moves. Returns the released gradients and how many expert
    /// releases had no owned record in `owned` (a diagnostic).
    fn release_and_charge(
        &mut self,
        pi: usize,
        phase: &Phase,
        t: u64,
        mut sums: BTreeMap<String, Tensor>,
        owned: &BTreeMap<(usize, i64), usize>,
    ) -> Result<(Vec<Released>, usize)> {
        let rank = self.comm.rank();
        let mut released: Vec<Released> = Vec::new();
        let mut empty_experts = 0usize;
        let clipping = Arc::clone(&self.clippings[pi]);
        let (clip_groups, policy) = &*clipping;
        // How each noised release this rank made is charged, with the σ it carries.
        let mut made: Vec<(Charge, f64)> = Vec::new();
        for (j, r) in phase.releases.iter().enumerate() {
            // Δ from the policy the sums were clipped under (every group a release names is
            // the phase's: `Plan::check`).
            let delta = policy.sensitivity(&r.groups)?;
            let denom = PublicDenominator::new(r.denominator)?;
            if let Charge::Parallel(id) = r.charge
                && owned
                    .get(&(id.layer, id.expert as i64))
                    .copied()
                    .unwrap_or(0)
                    == 0
            {
                empty_experts += 1;
            }
            // The release's parameters in plan order (an absent sum is zeros: a routed expert
            // no sampled record reached still gets its noise).
            let mut names: Vec<String> = Vec::new();
            let mut parts: Vec<Tensor> = Vec::new();
            for gname in &r.groups {
                let g = phase.group(gname).ok_or_else(|| {
                    TrainError::Config(format!("release {} names missing group {gname}", r.name))
                })?;
                for p in &g.params {
                    let v = &self.vars[p];
                    parts.push(match sums.remove(p) {
                        Some(s) => s,
                        None => v.f_zeros_like()?.f_detach()?,
                    });
                    names.push(p.clone());
                }
            }
            let outs: Vec<Tensor> = match self.privatizers.get_mut(&(pi, j)) {
                // Noise is added once, on rank 0; the other ranks receive the release.
                Some(_) if rank > 0 => parts,
                // One draw for the whole release (in parallel chunks when it is long), calibrated
                // to the sensitivity the clipping policy gives the release's groups; the release
                // must hold every parameter of its groups and nothing else.
                Some(pz) if phase.private => {
                    let clipped = ClippedSum::new(
                        clip_groups,
                        policy,
                        &r.groups,
                        names.iter().cloned().zip(parts).collect(),
                    )?;
                    let release = pz.release_clipped(clipped, denom)?;
                    // The ledger charges this update from the plan (`Phase::charge`, the same on
                    // every rank); the release must be the mechanism it charges (a planted
                    // noise fault of the audit's tests is exactly such a mismatch, left for the
                    // audit to measure).
                    if !self.fault_planted() {
                        release_matches_charge(r, delta, &release)?;
                    }
                    made.push((r.charge.clone(), release.noise_multiplier()));
                    release.into_parts().into_iter().map(|(_, t)| t).collect()
                }
                _ => parts
                    .iter()
                    .map(|s| s.f_div_scalar(denom.value()))
                    .collect::<std::result::Result<_, _>>()?,
            };
            let noise = ReleaseNoise {
                std: if phase.private {
                    r.sigma * delta / denom.value()
                } else {
                    0.0
                },
            };
            self.observe_canaries(pi, r, delta, &names, &outs)?;
            for (p, out) in names.into_iter().zip(outs) {
                released.push((p, out, noise));
            }
            self.events.push(ReleaseEvent {
                update: t,
                phase: phase.name,
                release: r.name.clone(),
                denominator: r.denominator,
                sigma: r.sigma,
                sensitivity: delta,
                charge: r.charge.clone(),
            });
        }
        self.flush_canaries()?;
        // A planted ledger fault of the audit's tests charges the sample as several.
        #[cfg(feature = "planted-faults")]
        if let Some(charges) = self.split_charges(phase)? {
            for c in &charges {
                self.ledger.charge(c)?;
            }
            return Ok((released, empty_experts));
        }
        // One sample, one charge: every release above came from this update's sample. Rank 0
        // charges the releases it made (their σ), checked against the plan's charge; the other
        // ranks, which received them, charge the plan's (the same, or rank 0 has stopped).
        match phase.charge(self.plan.q)? {
            PhaseCharge::Charged(planned) => {
                let sample = if rank == 0 && !self.fault_planted() {
                    let charged = phase.releases.iter().filter(|r| r.charge != Charge::None);
                    if made.len() != charged.count() {
                        return Err(TrainError::Run(format!(
                            "update {t} made {} noised releases where the plan charges {}",
                            made.len(),
                            phase
                                .releases
                                .iter()
                                .filter(|r| r.charge != Charge::None)
                                .count()
                        )));
                    }
                    let actual = crate::streams::sample_charge(
                        self.plan.q,
                        made.iter().map(|(c, s)| (c, *s)),
                    )?;
                    if actual != planned {
                        return Err(TrainError::Run(format!(
                            "update {t}: the releases made cost {:?}, the plan charges {:?}",
                            actual.mechanism()?,
                            planned.mechanism()?
                        )));
                    }
                    actual
                } else {
                    planned
                };
                self.ledger.charge(&sample)?;
            }
            PhaseCharge::NotPrivate => {}
            PhaseCharge::Unaccountable { releases } => self.unaccounted += releases,
        }
        Ok((released, empty_experts))
    }

    /// Runs the next planned update. `on_charge` receives the ledger after this update's
    /// releases were charged and before any parameter changes (write it durably there).
    pub fn step(
        &mut self,
        on_charge: &mut dyn FnMut(&Ledger) -> Result<()>,
    ) -> Result<UpdateMetrics> {
        if self.done() {
            return Err(TrainError::Run("every planned update already ran".into()));
        }
        let t = self.update;
        let pi = self.plan.phase_at(t);
        let phase = self.plan.phases[pi].clone();
        self.set_phase_trainable(&phase)?;
        let (rank, ranks) = (self.comm.rank(), self.comm.size());
        let (drawn, step_seed) = self.draw_sample()?;
        // Records past the real ones are an audit run's Dirac canaries (no forward pass).
        let n_real = self.data.len();
        let (sample, canaries): (Vec<usize>, Vec<usize>) =
            drawn.into_iter().partition(|&i| i < n_real);
        // This rank's share of the sample: positions rank, rank + K, …
        let mine: Vec<usize> = sample.iter().skip(rank).step_by(ranks).copied().collect();
        let mut sums: BTreeMap<String, Tensor> = BTreeMap::new();
        let mut loss_sum = 0.0f64;
        let mut clipped: BTreeMap<GroupId, f64> = BTreeMap::new();
        let mut owned: BTreeMap<(usize, i64), usize> = BTreeMap::new();
        let mut nonfinite = 0u64;
        for chunk in mine.chunks(self.opts.micro_batch.max(1)) {
            let batch = self.batch(chunk)?;
            // The frozen prefix's hidden states, from the cache (computed the first time a
            // record is drawn).
            let prefix = prefix::cached_prefix(
                self.prefix.as_mut(),
                &*self.model,
                self.data,
                chunk,
                self.opts.pad_id,
                self.opts.device,
            )?;
            let part: BTreeMap<String, Tensor> = if phase.private {
                let (losses, clip) = self.private_sums(
                    &phase,
                    &self.clippings[pi],
                    chunk,
                    &batch,
                    prefix.as_ref(),
                    step_seed,
                    &mut owned,
                    &mut nonfinite,
                )?;
                loss_sum += losses.f_sum(Kind::Double)?.f_double_value(&[])?;
                for (g, f) in &clip.clip_factors {
                    let n = f
                        .f_lt(1.0 - 1e-9)?
                        .f_sum(Kind::Double)?
                        .f_double_value(&[])?;
                    *clipped.entry(g.clone()).or_default() += n;
                }
                clip.sums
            } else {
                // Non-private: the plain gradient of the summed loss.
                let ids: Vec<u64> = chunk.iter().map(|&i| self.data[i].id).collect();
                let mut ctx = ForwardCtx::new(true);
                ctx.dropout_seed = Some(step_seed);
                ctx.record_ids = Some(ids);
                ctx.prefix = prefix;
                let losses = self.model.per_record_loss(&batch, &mut ctx)?;
                let loss = losses.f_sum(Kind::Float)?;
                loss_sum += loss.f_double_value(&[])?;
                let params = phase.params();
                let vars: Vec<&Tensor> = params.iter().map(|p| &self.vars[p]).collect();
                let gs = Tensor::f_run_backward(&[&loss], &vars, false, false)?;
                let part: BTreeMap<String, Tensor> = params
                    .into_iter()
                    .zip(gs)
                    .filter(|(_, g)| g.defined())
                    .collect();
                self.check_reached(&phase, &part.keys().cloned().collect::<Vec<_>>())?;
                part
            };
            for (p, s) in part {
                match sums.get_mut(&p) {
                    Some(acc) => *acc = acc.f_add(&s)?,
                    None => {
                        sums.insert(p, s.f_detach()?);
                    }
                }
            }
        }
        self.add_canaries(pi, &canaries, &mut sums)?;
        if ranks > 1 {
            self.all_reduce_sums(&phase, &mut sums, &mut loss_sum, &mut clipped, &mut owned)?;
        }
        // Releases (noise ÷ public denominator), charged before anything is applied.
        let (mut released, empty_experts) = self.release_and_charge(pi, &phase, t, sums, &owned)?;
        if ranks > 1 {
            let outs: Vec<Tensor> = released.iter().map(|r| r.1.shallow_clone()).collect();
            let mut buf = collective::flatten(&outs)?;
            self.comm.broadcast_f32(&mut buf)?;
            let got = collective::unflatten(&buf, &outs)?;
            for (r, g) in released.iter_mut().zip(got) {
                r.1 = g;
            }
        }
        on_charge(&self.ledger)?;
        // Apply (post-processing of the releases).
        let scale = lr_scale(
            t,
            self.plan.updates,
            self.opts.warmup_steps,
            self.opts.cosine,
        );
        let mut steps = Vec::with_capacity(released.len());
        for (p, g, noise) in released {
            let v = self
                .vars
                .get(&p)
                .ok_or_else(|| {
                    TrainError::Run(format!("released gradient for unknown parameter {p}"))
                })?
                .shallow_clone();
            steps.push((p, v, g, noise));
        }
        self.optim.step_all(steps, scale)?;
        self.update += 1;
        let n = sample.len();
        Ok(UpdateMetrics {
            update: t,
            phase: phase.name.to_string(),
            loss: if n > 0 { loss_sum / n as f64 } else { f64::NAN },
            sampled: n + canaries.len(),
            clipped_fraction: clipped
                .into_iter()
                .map(|(g, c)| (g.to_string(), if n > 0 { c / n as f64 } else { 0.0 }))
                .collect(),
            empty_expert_groups: empty_experts,
            lr_scale: scale,
            nonfinite_residual_weights: nonfinite,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::streams::GroupId;
    use raptor_clip::{ClipPolicy, ParamGroups};

    /// A release whose groups, σ or Δ are not what the ledger charges is refused.
    #[test]
    fn a_release_must_be_the_mechanism_the_ledger_charges() {
        let mut groups = ParamGroups::new();
        groups.assign("w", GroupId::Shared);
        let policy = ClipPolicy::RoleWise([(GroupId::Shared, 2.0)].into());
        let spec = ReleaseSpec {
            name: "shared".into(),
            groups: vec![GroupId::Shared],
            sigma: 1.5,
            denominator: 4.0,
            charge: Charge::Sequential,
        };
        let release = |sigma: f64| {
            let sum = ClippedSum::new(
                &groups,
                &policy,
                &[GroupId::Shared],
                vec![("w".into(), Tensor::from_slice(&[1.0f32, -1.0]))],
            )
            .unwrap();
            Privatizer::seeded_insecure(sigma, 3)
                .unwrap()
                .release_clipped(sum, PublicDenominator::new(4.0).unwrap())
                .unwrap()
        };
        assert!(release_matches_charge(&spec, 2.0, &release(1.5)).is_ok());
        let e = release_matches_charge(&spec, 2.0, &release(0.75)).unwrap_err();
        assert!(e.to_string().contains("σ 0.75"), "{e}");
        let e = release_matches_charge(&spec, 1.0, &release(1.5)).unwrap_err();
        assert!(e.to_string().contains("sensitivity 2"), "{e}");
        // A release of other groups than the planned release's is refused.
        let mut other = spec.clone();
        other.groups = vec![GroupId::All];
        let e = release_matches_charge(&other, 2.0, &release(1.5)).unwrap_err();
        assert!(
            e.to_string().contains("released the groups [Shared]"),
            "{e}"
        );
    }
}
