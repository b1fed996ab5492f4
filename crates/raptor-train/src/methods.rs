//! From a config to a [`Plan`]: the trainable scope of each method, the sparse layer RAPTOR
//! trains, and the privacy plan (σ of every release from the target ε), all decided before
//! training from public quantities only (N, B, the schedule; never a private count).

use std::collections::BTreeMap;

use raptor_accountant::{
    Accuracy, PlanRequest, PrvAccountant, Stream as PlanStream, StreamSampling, calibrate_sigma,
    plan_budget,
};
use raptor_models::roles::{ExpertId, Naming, RoleIndex};
use raptor_models::{LoraConfig, Model, attach_lora, freeze_all, set_trainable};
use serde::Serialize;

use crate::config::{
    Budget, BudgetSplit, ExpertClip, ExpertDenominator, LayerSpec, LoraSettings, Method,
    MethodConfig, MethodFamily, ModelKind, PrivacyConfig, ResidualWeight, RunConfig,
    StreamOptimizer, TrainConfig,
};
use crate::error::{Result, TrainError};
use crate::streams::{
    Charge, ClipGroup, GroupId, Optim, Phase, Plan, ReleaseSpec, Residual, Sigmas, Stream,
};

/// The parameter-name conventions of a model kind (where its experts, attention and head are).
pub fn naming(kind: ModelKind) -> Naming {
    match kind {
        ModelKind::Switch => Naming::Switch,
        ModelKind::Olmoe => Naming::Olmoe,
        ModelKind::Gpt2 => Naming::Gpt2,
        ModelKind::Llama => Naming::Llama,
        ModelKind::Mixtral => Naming::Mixtral,
        ModelKind::Qwen2Moe => Naming::Qwen2Moe,
        ModelKind::Bert => Naming::Bert,
        ModelKind::MoeBert => Naming::MoeBert,
    }
}

/// What a plan is made of: the config's method, privacy target, schedule and adapter settings,
/// and the model's kind. The data, the model's files, evaluation and the run's folder play no
/// part in a plan, so the plan functions never see them.
#[derive(Debug, Clone, Copy)]
pub struct PlanSettings<'a> {
    /// The model's kind (its parameter-name conventions).
    pub kind: ModelKind,
    /// `[method]`.
    pub method: &'a MethodConfig,
    /// `[privacy]`.
    pub privacy: &'a PrivacyConfig,
    /// `[train]`.
    pub train: &'a TrainConfig,
    /// `[lora]`.
    pub lora: &'a LoraSettings,
}

impl<'a> From<&'a RunConfig> for PlanSettings<'a> {
    fn from(c: &'a RunConfig) -> Self {
        Self {
            kind: c.model.kind,
            method: &c.method,
            privacy: &c.privacy,
            train: &c.train,
            lora: &c.lora,
        }
    }
}

/// The privacy plan as recorded in the run record.
#[derive(Debug, Clone, Serialize)]
pub struct PrivacyPlan {
    /// Whether the method is private.
    pub private: bool,
    /// Target ε (∞ for non-private methods).
    pub epsilon: f64,
    /// δ.
    pub delta: f64,
    /// Why δ has its value (given, or the default rule for N).
    pub delta_reason: String,
    /// Sampling rate q = B/N.
    pub q: f64,
    /// Records N.
    pub records: usize,
    /// Expected batch B.
    pub expected_batch: f64,
    /// Total updates.
    pub updates: u64,
    /// Updates per phase.
    pub phase_updates: BTreeMap<Stream, u64>,
    /// σ of each stream.
    pub sigmas: Sigmas,
    /// The plan's own certified ε (composed in one PRV over the planned schedule).
    pub planned_epsilon: f64,
    /// The budget split (RAPTOR) or `single`.
    pub split: String,
    /// Clip bounds chosen from public data (`train.clip_from_public`), if any.
    pub public_clip: Option<PublicClip>,
}

/// Clip bounds calibrated on public data (`train.clip_from_public`; crate `raptor-run`'s
/// `public_clip`), recorded in the run's privacy plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PublicClip {
    /// The quantile.
    pub quantile: f64,
    /// Public records used.
    pub records: usize,
    /// Per phase and clip group: the chosen bound, and how many public records reached it.
    pub bounds: Vec<(Stream, String, f64, usize)>,
}

/// What RAPTOR-family setup decided (public).
#[derive(Debug, Clone, Serialize)]
pub struct LayerChoice {
    /// The trained sparse layer.
    pub layer: usize,
    /// How it was chosen.
    pub how: String,
    /// Public routing statistics of every sparse layer (entropy, normalized entropy, χ², CV),
    /// when a public corpus was given.
    pub public_stats: Vec<serde_json::Value>,
    /// Warnings of the selection.
    pub warnings: Vec<String>,
}

/// Picks RAPTOR's sparse layer from the config and, for `entropy`, a public corpus's routing.
pub fn choose_layer(
    method: &MethodConfig,
    sparse: &[usize],
    public: Option<&raptor_routing::PublicCorpus>,
) -> Result<LayerChoice> {
    let last = *sparse
        .last()
        .ok_or_else(|| TrainError::Config("the model has no sparse (MoE) layer".into()))?;
    let simple = |layer: usize, how: &str| LayerChoice {
        layer,
        how: how.into(),
        public_stats: Vec::new(),
        warnings: Vec::new(),
    };
    // The methods without a layer of their own (never asked) read the defaults.
    let experts = method.expert_layer().copied().unwrap_or_default();
    match experts.layer {
        LayerSpec::First => Ok(simple(sparse[0], "first sparse layer")),
        LayerSpec::Last => Ok(simple(last, "last sparse layer")),
        LayerSpec::Entropy => match public {
            None => {
                let mut c = simple(last, "no public corpus: last sparse layer");
                c.warnings.push(
                    "no public corpus given (data.public): defaulting to the last sparse layer"
                        .into(),
                );
                Ok(c)
            }
            Some(corpus) => {
                let sel = raptor_routing::select_layer(
                    corpus,
                    &raptor_routing::SelectionConfig {
                        rule: experts.owner_rule.into(),
                        ..Default::default()
                    },
                )?;
                Ok(LayerChoice {
                    layer: sel.layer,
                    how: format!("highest public routing entropy ({:?})", sel.reason),
                    public_stats: sel
                        .stats
                        .iter()
                        .map(|(l, s)| {
                            serde_json::json!({
                                "layer": l,
                                "entropy": s.entropy(),
                                "normalized_entropy": s.normalized_entropy(),
                                "chi2": s.chi2(),
                                "load_cv": s.load_cv(),
                            })
                        })
                        .collect(),
                    warnings: sel.warnings.iter().map(|w| w.to_string()).collect(),
                })
            }
        },
        LayerSpec::Block(l) => {
            if !sparse.contains(&l) {
                return Err(TrainError::Config(format!(
                    "method.layer: block {l} is not a sparse layer (sparse layers: {sparse:?})"
                )));
            }
            Ok(simple(l, "given in the config"))
        }
    }
}

/// The owner rule of the config (the default for a method without one).
pub fn owner_rule(method: &MethodConfig) -> raptor_routing::OwnerRule {
    let experts = method.expert_layer().copied().unwrap_or_default();
    experts.owner_rule.into()
}

/// Number of updates: `train.steps`, else ceil(epochs · N / B); with `train.budget =
/// "stream-updates"`, an alternating RAPTOR plan runs enough whole cycles that its shared
/// stream gets that many updates (each cycle gives it `shared_steps`).
pub fn total_updates(method: &MethodConfig, train: &TrainConfig, n: usize) -> u64 {
    let base = match train.steps {
        Some(s) => s,
        None => ((train.epochs * n as f64 / train.batch_size).ceil() as u64).max(1),
    };
    match method.alternation() {
        Some(a) if train.budget == Budget::StreamUpdates && a.alternate && a.shared_steps > 0 => {
            let cycle = a.shared_steps + a.expert_steps;
            base.div_ceil(a.shared_steps).saturating_mul(cycle)
        }
        _ => base,
    }
}

/// RAPTOR's alternating pattern (phase 0 shared, phase 1 experts): the expert updates of a
/// cycle come first and its shared updates last, rotated so that the run's last update is a
/// shared one whatever the number of updates (the head and shared adapters get the final word).
pub fn alternating_pattern(shared_steps: u64, expert_steps: u64, updates: u64) -> Vec<usize> {
    let mut p = vec![1usize; expert_steps as usize];
    p.extend(std::iter::repeat_n(0usize, shared_steps as usize));
    let len = p.len();
    if len > 0 {
        let r = (updates % len as u64) as usize;
        if r != 0 {
            p.rotate_left(len - r);
        }
    }
    p
}

/// The optimizers of a run's plan: `train.lr` for every AdamW / SGD parameter but RAPTOR's
/// routed-expert ones, which get `train.expert_lr` when it is set; `train.momentum` for SGD.
pub fn optimizers(
    train: &TrainConfig,
    plan: &Plan,
    settings: raptor_optim::OptimSettings,
    probe_seed: Option<u64>,
) -> Result<raptor_optim::Optimizers> {
    let mut o = raptor_optim::Optimizers::new(settings, &plan.optim, probe_seed)
        .with_sgd_momentum(train.momentum)?;
    if let Some(lr) = train.expert_lr {
        for p in plan.routed.keys() {
            o = o.with_param_lr(p, lr)?;
        }
    }
    Ok(o)
}

fn lora_cfg(lora: &LoraSettings, targets: Vec<String>) -> LoraConfig {
    LoraConfig {
        r: lora.r,
        alpha: lora.alpha,
        dropout: lora.dropout,
        targets,
    }
}

/// Sets the method's trainable scope on `model`: LoRA adapters (attention of every block, plus
/// the routed experts of RAPTOR's layer or of every sparse layer for the monolithic LoRA
/// methods) with the head trainable, or everything but the routers for full fine-tuning.
pub fn setup_scope(
    cfg: PlanSettings<'_>,
    model: &mut dyn Model,
    layer: Option<usize>,
) -> Result<()> {
    let method = cfg.method.name();
    let fam = naming(cfg.kind);
    let att_targets = if !cfg.lora.attention {
        Vec::new()
    } else if cfg.lora.attention_targets.is_empty() {
        fam.attention_targets()
    } else {
        cfg.lora.attention_targets.clone()
    };
    let sparse = model.sparse_layers();
    let lora_scope = cfg.method.lora_scope();
    let mut expert_layers: Vec<usize> = Vec::new();
    if method.needs_experts() {
        let l = layer.ok_or_else(|| TrainError::Config("RAPTOR needs a sparse layer".into()))?;
        expert_layers.push(l);
    } else if matches!(method, Method::DpAdamLora | Method::Lora) && cfg.lora.experts {
        expert_layers = sparse;
    }
    if lora_scope {
        freeze_all(model)?;
        let mut targets = att_targets;
        for &l in &expert_layers {
            targets.extend(fam.expert_targets(l));
        }
        // Nothing to adapt (attention frozen, no experts): the head alone trains.
        if !targets.is_empty() {
            attach_lora(model, &lora_cfg(cfg.lora, targets))?;
        }
        if cfg.lora.freeze_a {
            // FFA-LoRA: A stays at its random initialization; only B (zero at start) trains.
            set_trainable(model, &["lora_A"], false)?;
        }
        let head: Vec<&str> = fam.head_patterns();
        set_trainable(model, &head, true)?;
    }
    Ok(())
}

/// Sets up the trainable scope on `model` (LoRA attachment, freezing: [`setup_scope`]) and
/// builds the plan from what is then trainable ([`plan_for`]). `n` is the number of private
/// training records; `layer` RAPTOR's layer (MoE methods).
pub fn build_plan(
    cfg: PlanSettings<'_>,
    model: &mut dyn Model,
    n: usize,
    layer: Option<usize>,
) -> Result<(Plan, PrivacyPlan)> {
    check_batch(cfg.train, n)?;
    let experts = model.num_experts();
    let sparse_layers = model.sparse_layers();
    setup_scope(cfg, model, layer)?;
    let scope = TrainableScope {
        shapes: model
            .var_store()
            .variables()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .map(|(n, t)| (n, t.size()))
            .collect(),
        sparse_layers,
        experts,
    };
    plan_for(cfg, &scope, n, layer)
}

/// What a method trains once its scope is set on the model: the public facts the plan is
/// built from.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainableScope {
    /// Every trainable parameter and its shape.
    pub shapes: BTreeMap<String, Vec<i64>>,
    /// The model's sparse (MoE) layers.
    pub sparse_layers: Vec<usize>,
    /// Routed experts per sparse layer (0 for a dense model).
    pub experts: i64,
}

/// B ≤ N: q = B/N is a probability.
fn check_batch(train: &TrainConfig, n: usize) -> Result<()> {
    let b = train.batch_size;
    if b > n as f64 {
        return Err(TrainError::Config(format!(
            "train.batch_size: B = {b} is larger than the {n} training records (q = B/N must be <= 1)"
        )));
    }
    Ok(())
}

/// What every family's plan builder needs: the public quantities of the run, the trainable
/// parameters and the accountant.
struct PlanInputs<'a> {
    cfg: PlanSettings<'a>,
    fam: Naming,
    /// The role of every trainable parameter (which routed expert owns it).
    roles: RoleIndex,
    /// Trainable parameter names (sorted).
    names: Vec<String>,
    shapes: &'a BTreeMap<String, Vec<i64>>,
    experts: usize,
    /// Expected batch B.
    b: f64,
    q: f64,
    delta: f64,
    updates: u64,
    private: bool,
    acc: PrvAccountant,
}

impl PlanInputs<'_> {
    /// The routed expert that owns trainable parameter `name`, if any.
    fn expert_of(&self, name: &str) -> Option<ExpertId> {
        self.roles.routed_expert(name)
    }

    /// σ of one release per update over `t` updates, and the certified ε it gives.
    fn single_sigma(&self, t: u64) -> Result<(f64, f64)> {
        let c = calibrate_sigma(self.cfg.privacy.epsilon, self.delta, self.q, t, &self.acc)?;
        Ok((c.sigma, c.epsilon.upper))
    }
}

/// A family's phases and schedule, with the σ's and the certified ε they were calibrated to.
struct FamilyPlan {
    phases: Vec<Phase>,
    pattern: Vec<usize>,
    /// σ of each stream.
    sigmas: Sigmas,
    planned_epsilon: f64,
    /// The budget split (RAPTOR) or `single`.
    split: String,
}

/// The plan of `cfg` over a trainable scope (no model involved: the same inputs give the same
/// plan). `n` is the number of private training records; `layer` RAPTOR's layer (MoE methods).
pub fn plan_for(
    cfg: PlanSettings<'_>,
    scope: &TrainableScope,
    n: usize,
    layer: Option<usize>,
) -> Result<(Plan, PrivacyPlan)> {
    check_batch(cfg.train, n)?;
    let b = cfg.train.batch_size;
    let names: Vec<String> = scope.shapes.keys().cloned().collect();
    if names.is_empty() {
        return Err(TrainError::Config(
            "the method leaves no trainable parameter".into(),
        ));
    }
    let method = cfg.method.name();
    let fam = naming(cfg.kind);
    let experts = usize::try_from(scope.experts).unwrap_or(0);
    let inputs = PlanInputs {
        cfg,
        fam,
        roles: RoleIndex::new(
            fam,
            names.iter().map(String::as_str),
            &scope.sparse_layers,
            experts,
            &[],
        ),
        names,
        shapes: &scope.shapes,
        experts,
        b,
        q: b / n as f64,
        delta: if method.is_private() {
            crate::config::run_delta(cfg.privacy, n)?
        } else {
            cfg.privacy
                .delta
                .unwrap_or_else(|| crate::config::default_delta(n))
        },
        updates: total_updates(cfg.method, cfg.train, n),
        private: method.is_private(),
        acc: PrvAccountant::new(Accuracy::relative(cfg.privacy.accuracy))?,
    };
    let FamilyPlan {
        mut phases,
        pattern,
        sigmas,
        planned_epsilon,
        split,
    } = match method.family() {
        MethodFamily::Streams => streams_plan(&inputs, layer)?,
        MethodFamily::MatchedScope | MethodFamily::Monolithic | MethodFamily::Scoped => {
            one_release_plan(&inputs)?
        }
    };
    let private = inputs.private;
    // Non-private phases charge nothing.
    if !private {
        for ph in &mut phases {
            for r in &mut ph.releases {
                r.charge = Charge::None;
                r.sigma = 0.0;
            }
        }
    }
    let optim = inputs
        .names
        .iter()
        .map(|n| (n.clone(), optimizer_of(&inputs, n)))
        .collect();
    let plan = Plan {
        phases,
        pattern,
        updates: inputs.updates,
        q: inputs.q,
        expected_batch: b,
        optim,
        routed: inputs
            .names
            .iter()
            .filter_map(|n| inputs.expert_of(n).map(|id| (n.clone(), id)))
            .collect(),
    };
    plan.check()?;
    let phase_updates = plan
        .phases
        .iter()
        .zip(plan.phase_counts())
        .map(|(p, c)| (p.name, c))
        .collect();
    let privacy = PrivacyPlan {
        private,
        epsilon: if private {
            cfg.privacy.epsilon
        } else {
            f64::INFINITY
        },
        delta: inputs.delta,
        delta_reason: crate::config::delta_reason(cfg.privacy.delta, n),
        q: inputs.q,
        records: n,
        expected_batch: b,
        updates: inputs.updates,
        phase_updates,
        sigmas,
        planned_epsilon,
        split,
        public_clip: None,
    };
    Ok((plan, privacy))
}

/// The optimizer of trainable parameter `name`: RAPTOR's streams their configured ones (the
/// routed experts' and the shared stream's), DP-SGD SGD, the Muon methods Muon (MuonBC) on
/// hidden matrices, AdamW everywhere else.
fn optimizer_of(inputs: &PlanInputs<'_>, name: &str) -> Optim {
    let stream_optim = |o: StreamOptimizer| match o {
        StreamOptimizer::Adamw => Optim::AdamW,
        StreamOptimizer::Sgd => Optim::Sgd,
    };
    let hidden = || {
        inputs
            .shapes
            .get(name)
            .is_some_and(|s| inputs.fam.is_hidden_matrix(name, s.len()))
    };
    let t = &inputs.cfg.train;
    match inputs.cfg.method.name() {
        Method::Raptor | Method::SharedOnly | Method::ExpertOnly => {
            if inputs.expert_of(name).is_some() {
                stream_optim(t.expert_optimizer)
            } else {
                stream_optim(t.shared_optimizer)
            }
        }
        Method::DpSgd => Optim::Sgd,
        Method::DpMuon | Method::Muon if hidden() => Optim::Muon,
        Method::DpMuonbc if hidden() => Optim::MuonBc,
        Method::DpMuon
        | Method::Muon
        | Method::DpMuonbc
        | Method::DpAdamLora
        | Method::DpAdamFull
        | Method::MatchedScope
        | Method::Lora
        | Method::Full
        | Method::DpAdam
        | Method::Adam => Optim::AdamW,
    }
}

/// The clip groups of RAPTOR's streams over one sparse layer, and the phases built from them.
struct Streams {
    /// RAPTOR's layer.
    layer: usize,
    /// Experts of the layer.
    experts: usize,
    /// Expected batch B (the shared stream's public denominator).
    b: f64,
    /// The expert streams' public denominator D_e.
    d_e: f64,
    /// The shared bound C (also the global bound when `global`).
    clip: f64,
    /// Global clipping (one factor over shared + expert gradients).
    global: bool,
    residual: Residual,
    private: bool,
    /// Every trainable parameter outside the routed experts.
    shared: ClipGroup,
    /// One group per routed expert of the layer.
    expert_groups: Vec<ClipGroup>,
    /// The layer's expert-module prefix (where the residual weight is disabled).
    expert_modules: String,
}

impl Streams {
    /// The streams of `inputs` at `layer`; every routed expert of it must have a trainable
    /// parameter.
    fn new(inputs: &PlanInputs<'_>, layer: Option<usize>) -> Result<Self> {
        let cfg = inputs.cfg;
        let l = layer.ok_or_else(|| TrainError::Config("RAPTOR needs a sparse layer".into()))?;
        // shared-only reads the defaults (its plan releases no expert stream).
        let knobs = cfg.method.expert_streams().copied().unwrap_or_default();
        let residual = match knobs.residual {
            ResidualWeight::Prob => Residual::Prob,
            ResidualWeight::Margin => Residual::Margin,
            ResidualWeight::None => Residual::None,
        };
        let global = match knobs.expert_clip {
            ExpertClip::Global => true,
            ExpertClip::Role => false,
        };
        let clip = cfg.train.clip;
        let shared = ClipGroup {
            name: GroupId::Shared,
            params: inputs
                .names
                .iter()
                .filter(|n| inputs.expert_of(n).is_none())
                .cloned()
                .collect(),
            bound: clip,
            weighted: false,
            release: true,
        };
        let expert_groups: Vec<ClipGroup> = (0..inputs.experts)
            .map(|x| {
                let id = ExpertId {
                    layer: l,
                    expert: x,
                };
                ClipGroup {
                    name: GroupId::Expert(id),
                    params: inputs.roles.expert_params(id),
                    bound: if global { clip } else { cfg.train.clip_expert },
                    weighted: residual != Residual::None,
                    release: true,
                }
            })
            .collect();
        if expert_groups.iter().any(|g| g.params.is_empty()) {
            return Err(TrainError::Config(format!(
                "layer {l}: some routed experts have no trainable parameter"
            )));
        }
        Ok(Self {
            layer: l,
            experts: inputs.experts,
            b: inputs.b,
            d_e: match knobs.expert_denominator {
                ExpertDenominator::Batch => inputs.b,
                ExpertDenominator::ExpectedOwner => inputs.b / inputs.experts as f64,
            },
            clip,
            global,
            residual,
            private: inputs.private,
            shared,
            expert_groups,
            expert_modules: inputs.fam.expert_modules(l),
        })
    }

    fn expert(&self, x: usize) -> ExpertId {
        ExpertId {
            layer: self.layer,
            expert: x,
        }
    }

    /// The shared stream's release at σ (denominator B, sequential composition).
    fn shared_release(&self, sigma: f64) -> ReleaseSpec {
        ReleaseSpec {
            name: GroupId::Shared.to_string(),
            groups: vec![GroupId::Shared],
            sigma,
            denominator: self.b,
            charge: Charge::Sequential,
        }
    }

    /// The shared stream alone.
    fn shared_phase(&self, sigma: f64) -> Phase {
        Phase {
            name: Stream::Shared,
            groups: vec![self.shared.clone()],
            global_clip: None,
            releases: vec![self.shared_release(sigma)],
            owner_layers: vec![],
            residual: Residual::None,
            residual_disable: vec![],
            private: self.private,
        }
    }

    /// The expert releases at σ_e (denominator D_e, parallel over the layer); with
    /// `shared_sigma`, the shared stream is released from the same sample too, at its own σ
    /// (one sample per update feeds both streams).
    fn expert_phase(&self, sigma: f64, shared_sigma: Option<f64>) -> Phase {
        let mut groups = self.expert_groups.clone();
        let mut releases: Vec<ReleaseSpec> = (0..self.experts)
            .map(|x| ReleaseSpec {
                name: self.expert(x).to_string(),
                groups: vec![GroupId::Expert(self.expert(x))],
                sigma,
                denominator: self.d_e,
                charge: Charge::Parallel(self.expert(x)),
            })
            .collect();
        match shared_sigma {
            Some(s) => {
                groups.push(self.shared.clone());
                releases.insert(0, self.shared_release(s));
            }
            None if self.global => {
                // Global clipping: the factor is taken over shared + expert gradients, but
                // only the expert sums are released in this phase.
                let mut sg = self.shared.clone();
                sg.release = false;
                groups.push(sg);
            }
            None => {}
        }
        Phase {
            name: if shared_sigma.is_some() {
                Stream::All
            } else {
                Stream::Experts
            },
            groups,
            global_clip: self.global.then_some(self.clip),
            releases,
            owner_layers: vec![self.layer],
            residual: self.residual,
            residual_disable: vec![self.expert_modules.clone()],
            private: self.private,
        }
    }
}

/// RAPTOR and its one-stream ablations: a shared stream (every trainable parameter outside the
/// routed experts) and one stream per routed expert of `layer`, each its own clip group and
/// release; the expert releases compose in parallel over the layer.
fn streams_plan(inputs: &PlanInputs<'_>, layer: Option<usize>) -> Result<FamilyPlan> {
    let streams = Streams::new(inputs, layer)?;
    let updates = inputs.updates;
    let one_stream = |phase: Phase, stream: Stream, sigma: f64, pe: f64| FamilyPlan {
        phases: vec![phase],
        pattern: vec![0],
        sigmas: Sigmas::One { stream, sigma },
        planned_epsilon: pe,
        split: "single".into(),
    };
    match inputs.cfg.method.name() {
        Method::SharedOnly => {
            let (s, pe) = inputs.single_sigma(updates)?;
            Ok(one_stream(streams.shared_phase(s), Stream::Shared, s, pe))
        }
        Method::ExpertOnly => {
            let (s, pe) = inputs.single_sigma(updates)?;
            Ok(one_stream(
                streams.expert_phase(s, None),
                Stream::Experts,
                s,
                pe,
            ))
        }
        Method::Raptor
        | Method::DpAdamLora
        | Method::DpAdamFull
        | Method::MatchedScope
        | Method::Lora
        | Method::Full
        | Method::DpSgd
        | Method::DpAdam
        | Method::DpMuon
        | Method::DpMuonbc
        | Method::Muon
        | Method::Adam => two_streams_plan(inputs, &streams),
    }
}

/// RAPTOR's two streams: alternating phases (each draws its own sample) or, without
/// alternation, one sample per update feeding both; both σ's calibrated together by the
/// planner so that the composed mechanism meets the target.
fn two_streams_plan(inputs: &PlanInputs<'_>, streams: &Streams) -> Result<FamilyPlan> {
    let cfg = inputs.cfg;
    let updates = inputs.updates;
    // Only RAPTOR has two streams; its schedule (the defaults for a method without one).
    let schedule = cfg.method.alternation().copied().unwrap_or_default();
    let alternate = schedule.alternate;
    let (pattern, ts, te) = if alternate {
        let pattern = alternating_pattern(schedule.shared_steps, schedule.expert_steps, updates);
        let counts = crate::streams::pattern_counts(&pattern, 2, updates);
        (pattern, counts[0], counts[1])
    } else {
        (vec![0], updates, updates)
    };
    if ts == 0 || te == 0 {
        return Err(TrainError::Config(format!(
            "train.steps = {updates} leaves a stream without updates (shared {ts}, expert {te})"
        )));
    }
    let mut split = "single".to_string();
    let mut planned_epsilon = f64::INFINITY;
    let (ss, se) = if inputs.private {
        let plans = plan_budget(
            &PlanRequest {
                epsilon: cfg.privacy.epsilon,
                delta: inputs.delta,
                rho: cfg.privacy.rho,
                shared: PlanStream {
                    q: inputs.q,
                    steps: ts,
                },
                expert: PlanStream {
                    q: inputs.q,
                    steps: te,
                },
                layers: 1,
                sampling: if alternate {
                    StreamSampling::Alternating
                } else {
                    StreamSampling::Simultaneous
                },
            },
            &inputs.acc,
        )?;
        split = if alternate {
            cfg.privacy.split.to_string()
        } else {
            // One mechanism per update: no additive split exists.
            "joint (one sample per update)".to_string()
        };
        let p = match cfg.privacy.split {
            BudgetSplit::Joint => plans.joint,
            BudgetSplit::Additive => plans.additive,
        };
        planned_epsilon = p.epsilon_composed.upper;
        (p.shared.sigma, p.expert.sigma)
    } else {
        (0.0, 0.0)
    };
    let phases = if alternate {
        vec![streams.shared_phase(ss), streams.expert_phase(se, None)]
    } else {
        vec![streams.expert_phase(se, Some(ss))]
    };
    Ok(FamilyPlan {
        phases,
        pattern,
        sigmas: Sigmas::SharedAndExperts {
            shared: ss,
            experts: se,
        },
        planned_epsilon,
        split,
    })
}

/// One stream over the whole trainable scope, one release per update: a flat clip group, or
/// for the DP-Muon methods one group per hidden matrix (C_W = C/√K) and one for the rest.
fn one_release_plan(inputs: &PlanInputs<'_>) -> Result<FamilyPlan> {
    let cfg = inputs.cfg;
    let (clip, private) = (cfg.train.clip, inputs.private);
    let (sigma, planned_epsilon) = if private {
        inputs.single_sigma(inputs.updates)?
    } else {
        (0.0, f64::INFINITY)
    };
    let per_matrix = match cfg.method.name() {
        Method::DpMuon | Method::DpMuonbc => true,
        Method::Raptor
        | Method::DpAdamLora
        | Method::DpAdamFull
        | Method::MatchedScope
        | Method::SharedOnly
        | Method::ExpertOnly
        | Method::Lora
        | Method::Full
        | Method::DpSgd
        | Method::DpAdam
        | Method::Muon
        | Method::Adam => false,
    };
    let names = &inputs.names;
    let mut groups = Vec::new();
    if per_matrix {
        let hidden: Vec<String> = names
            .iter()
            .filter(|n| {
                inputs
                    .shapes
                    .get(*n)
                    .is_some_and(|s| inputs.fam.is_hidden_matrix(n, s.len()))
            })
            .cloned()
            .collect();
        let rest: Vec<String> = names
            .iter()
            .filter(|n| !hidden.contains(n))
            .cloned()
            .collect();
        let k = hidden.len() + usize::from(!rest.is_empty());
        // Equal split: C_W = C/√K, so Δ = sqrt(Σ C_W²) = C.
        let cw = clip / (k as f64).sqrt();
        for h in &hidden {
            groups.push(ClipGroup {
                name: GroupId::Matrix(h.clone()),
                params: vec![h.clone()],
                bound: cw,
                weighted: false,
                release: true,
            });
        }
        if !rest.is_empty() {
            groups.push(ClipGroup {
                name: GroupId::Rest,
                params: rest,
                bound: cw,
                weighted: false,
                release: true,
            });
        }
    } else {
        groups.push(ClipGroup {
            name: GroupId::All,
            params: names.clone(),
            bound: clip,
            weighted: false,
            release: true,
        });
    }
    let release = ReleaseSpec {
        name: Stream::All.to_string(),
        groups: groups.iter().map(|g| g.name.clone()).collect(),
        sigma,
        denominator: inputs.b,
        charge: if private {
            Charge::Sequential
        } else {
            Charge::None
        },
    };
    let phase = Phase {
        name: Stream::All,
        groups,
        global_clip: None,
        releases: vec![release],
        owner_layers: vec![],
        residual: Residual::None,
        residual_disable: vec![],
        private,
    };
    Ok(FamilyPlan {
        phases: vec![phase],
        pattern: vec![0],
        sigmas: Sigmas::One {
            stream: Stream::All,
            sigma,
        },
        planned_epsilon,
        split: "single".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelKind;
    use proptest::prelude::*;

    proptest! {
        /// The alternating pattern gives each phase its count per cycle, and the run's last
        /// update is a shared one whatever the number of updates.
        #[test]
        fn the_alternating_schedule_ends_on_a_shared_update(
            shared in 1u64..4,
            expert in 1u64..4,
            updates in 1u64..60,
        ) {
            let p = alternating_pattern(shared, expert, updates);
            prop_assert_eq!(p.len() as u64, shared + expert);
            prop_assert_eq!(p.iter().filter(|&&x| x == 0).count() as u64, shared);
            let last = p[((updates - 1) % p.len() as u64) as usize];
            prop_assert_eq!(last, 0, "pattern {:?}, {} updates", p, updates);
        }
    }

    fn scope(names: &[(&str, &[i64])], sparse_layers: Vec<usize>, experts: i64) -> TrainableScope {
        TrainableScope {
            shapes: names
                .iter()
                .map(|(n, s)| (n.to_string(), s.to_vec()))
                .collect(),
            sparse_layers,
            experts,
        }
    }

    /// The plan comes from the trainable names and shapes alone: DP-Muon clips each hidden
    /// matrix on its own (C/√K each) and updates it with Muon, the rest together with AdamW.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_plan_needs_no_model() {
        let mut c = RunConfig::default();
        c.model.kind = ModelKind::Gpt2;
        c.method = crate::config::MethodConfig::new(Method::DpMuon);
        c.train.steps = Some(10);
        c.train.batch_size = 10.0;
        c.privacy.accuracy = 0.05;
        let s = scope(
            &[
                ("h.0.attn.c_attn.weight", &[8, 24]),
                ("h.0.mlp.c_fc.weight", &[8, 32]),
                ("h.0.ln_1.weight", &[8]),
                ("wte.weight", &[64, 8]),
            ],
            vec![],
            0,
        );
        let (plan, privacy) = plan_for((&c).into(), &s, 100, None).unwrap();
        assert_eq!(plan.phases.len(), 1);
        let groups: Vec<(GroupId, f64)> = plan.phases[0]
            .groups
            .iter()
            .map(|g| (g.name.clone(), g.bound))
            .collect();
        let cw = 1.0 / 3f64.sqrt();
        assert_eq!(
            groups,
            [
                (GroupId::Matrix("h.0.attn.c_attn.weight".into()), cw),
                (GroupId::Matrix("h.0.mlp.c_fc.weight".into()), cw),
                (GroupId::Rest, cw)
            ]
        );
        let optim: Vec<(&str, Optim)> = plan.optim.iter().map(|(n, o)| (n.as_str(), *o)).collect();
        assert_eq!(
            optim,
            [
                ("h.0.attn.c_attn.weight", Optim::Muon),
                ("h.0.ln_1.weight", Optim::AdamW),
                ("h.0.mlp.c_fc.weight", Optim::Muon),
                ("wte.weight", Optim::AdamW)
            ]
        );
        assert_eq!(privacy.split, "single");
        assert!(privacy.planned_epsilon <= c.privacy.epsilon);
        // B > N and an empty scope are errors, not plans.
        assert!(plan_for((&c).into(), &s, 5, None).is_err());
        assert!(plan_for((&c).into(), &scope(&[], vec![], 0), 100, None).is_err());
    }

    /// RAPTOR over one sample per update: one phase releases the shared stream (÷B, its own σ)
    /// and every expert of the layer (÷B/E, σ_e, parallel over the layer).
    #[test]
    #[allow(clippy::unwrap_used)]
    fn raptor_without_alternation_releases_both_streams_from_one_sample() {
        let mut c = RunConfig::default();
        if let Some(a) = c.method.alternation_mut() {
            a.alternate = false;
        }
        c.train.steps = Some(10);
        c.train.batch_size = 10.0;
        c.privacy.accuracy = 0.05;
        let s = scope(
            &[
                ("classifier.weight", &[2, 8]),
                (
                    "encoder.block.1.layer.1.mlp.experts.expert_0.wi.lora_A.weight",
                    &[2, 8],
                ),
                (
                    "encoder.block.1.layer.1.mlp.experts.expert_1.wi.lora_A.weight",
                    &[2, 8],
                ),
            ],
            vec![1],
            2,
        );
        let (plan, privacy) = plan_for((&c).into(), &s, 100, Some(1)).unwrap();
        assert_eq!(plan.pattern, [0]);
        let ph = &plan.phases[0];
        assert_eq!(ph.name, Stream::All);
        let releases: Vec<(&str, f64, f64)> = ph
            .releases
            .iter()
            .map(|r| (r.name.as_str(), r.sigma, r.denominator))
            .collect();
        let Sigmas::SharedAndExperts {
            shared: ss,
            experts: se,
        } = privacy.sigmas
        else {
            panic!("RAPTOR has two streams: {:?}", privacy.sigmas)
        };
        assert!(ss.is_finite() && se.is_finite() && ss > 0.0 && se > 0.0);
        assert_eq!(
            releases,
            [
                ("shared", ss, 10.0),
                ("expert[1,0]", se, 5.0),
                ("expert[1,1]", se, 5.0)
            ]
        );
        assert_eq!(privacy.split, "joint (one sample per update)");
        let routed: Vec<ExpertId> = plan.routed.values().copied().collect();
        assert_eq!(
            routed,
            [
                ExpertId {
                    layer: 1,
                    expert: 0
                },
                ExpertId {
                    layer: 1,
                    expert: 1
                }
            ]
        );
        assert_eq!(privacy.phase_updates[&Stream::All], 10);
    }

    #[test]
    fn pattern_counts_of_an_empty_pattern_are_zero() {
        assert_eq!(crate::streams::pattern_counts(&[], 2, 10), [0, 0]);
        assert_eq!(crate::streams::pattern_counts(&[1, 0, 0], 2, 10), [6, 4]);
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn stream_updates_give_each_alternating_stream_the_budget() {
        let mut c = RunConfig::default();
        c.train.steps = Some(25);
        assert_eq!(total_updates(&c.method, &c.train, 1000), 25);
        c.train.budget = Budget::StreamUpdates;
        // 1:1 cycles: 25 shared and 25 expert updates.
        assert_eq!(total_updates(&c.method, &c.train, 1000), 50);
        let a = c.method.alternation_mut().unwrap();
        a.shared_steps = 2;
        a.expert_steps = 1;
        // 13 cycles of (2 shared, 1 expert): 26 shared updates ≥ 25.
        assert_eq!(total_updates(&c.method, &c.train, 1000), 39);
        // Not alternating, or not RAPTOR: the budget is the updates.
        c.method.alternation_mut().unwrap().alternate = false;
        assert_eq!(total_updates(&c.method, &c.train, 1000), 25);
        c.method = crate::config::MethodConfig::new(Method::DpAdamLora);
        assert_eq!(total_updates(&c.method, &c.train, 1000), 25);
    }
}
