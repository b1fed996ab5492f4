//! `raptor audit`: an empirical ε lower bound from one training run with canaries (Steinke,
//! Nasr & Jagielski 2023, "Privacy auditing with one (1) training run"), beside the certified ε
//! upper bound of the run's ledger.
//!
//! Two families of canaries:
//!
//! - **White-box gradient canaries** ([`CanaryKind::Dirac`], the default for private methods;
//!   after the "Dirac canaries" of Nasr et al. 2023, "Tight auditing of differentially private
//!   machine learning"). A canary is a record whose clipped gradient is `v·e_k`: value `v` at one
//!   coordinate `k` of one trainable parameter, zero elsewhere, with `v` the smallest bound of
//!   the clip groups (or global clip) that hold the parameter, so the mechanism's sensitivity
//!   analysis admits it. `m` canaries (default [`DEFAULT_DIRAC_CANARIES`]) get distinct
//!   coordinates drawn uniformly by the design seed among the audited parameters' coordinates:
//!   every released parameter, or with `--expert e` those of routed expert e of RAPTOR's layer
//!   (a per-expert audit: the canaries reach that expert's release only). Each is included by a
//!   secret coin; the included ones are records of the run, drawn by its Poisson sampler at q
//!   like every real record (they skip the forward pass and add `v` at their coordinate to the
//!   clipped sums; see `trainer`'s module docs). The plan is made for N = real records +
//!   ⌈m/2⌉, fixed before the coins are drawn, so q = B/N and σ do not depend on them. Each
//!   released update that carries a canary's coordinate is observed there, in units of the
//!   release's planned noise std (x·D/(σΔ)), and two statistics score the canary: the sum of its
//!   observations over √n and the largest one ([`raptor_eval::audit::DiracTrace`]). Both go to
//!   [`raptor_eval::audit::audit_search_many`] (Bonferroni over both statistics and the grid).
//!   The scores read only what the run released: the guesses are post-processing, and the bound
//!   holds for the mechanism the ledger charges. A per-expert audit also reports the ε of the
//!   expert stream alone (its releases' charges composed without the rest), the claim its
//!   canaries test: parallel composition says the expert stream leaks no more than its member ε.
//! - **Paired white-box canaries** ([`CanaryKind::Paired`], RAPTOR): each canary's gradient has
//!   a coordinate in a shared-stream parameter and one in a parameter of its owner expert (4×
//!   their bounds), added through the trainer's owner masks and clip factors; an update's
//!   observations of a canary are projected on its whitened shift, so a drawn canary moves its
//!   score by sqrt(1/σ_s² + 1/σ_e²), the one-sample charge's 1/σ_eff when both releases come
//!   from one Poisson sample (RAPTOR without alternation).
//! - **Black-box loss canaries.** Kind [`CanaryKind::Mislabel`] (default for non-private
//!   classifiers) draws `m` training records (default `min(200, N/4)`; deterministic given the
//!   design seed `--seed`), **removes them from the training set** and gives each a different
//!   label, chosen uniformly among the other classes; kind [`CanaryKind::Random`] (default for
//!   non-private language models) builds random token sequences of the data's median length,
//!   with uniform random labels (classifiers) or as text. Canaries get fresh record ids above
//!   every training and validation id (LoRA dropout masks are keyed by record id). The plan is
//!   made for N = real records + included canaries. Each is scored by its loss under the initial
//!   model minus its loss under the trained model; [`raptor_eval::audit::audit_search`] turns
//!   the guesses into ε_lower. With m canaries no such audit can report much more than
//!   ln(m/2) − 2, and a noisy model rarely reaches it.
//!
//! In both, the coins come from the OS CSPRNG, or are derived from `train.insecure_seed` when
//! it is set (reproducible, NOT private), and are written only to the audit file. One training
//! run with the run's config (same method, same privacy target) goes into a run folder
//! `<runs-dir>/audit-<method>-<time>-<pid>`; the (k₊, k₋) grid is
//! [`raptor_eval::audit::default_grid`], fixed by m before any score is seen. The audit file
//! [`AUDIT_FILE`] (`private/audit.json`, beside the run's `private/record.json`) holds
//! everything: m, kind, coins, scores, the chosen (k₊, k₋), guesses, correct guesses, ε_lower,
//! the confidence, the certified ε_upper of the ledger (None for non-private methods: ε = ∞),
//! δ, and the canaries' coordinates (Dirac) or losses and source records (loss canaries). The
//! scores are also reported as a membership-inference attack on the canaries (AUC, TPR at 1 %
//! and 0.1 % FPR). The coins, the scores and that report are not differentially private (loss
//! canaries are made from, and scored beside, private records), so the file lives under
//! `private/` with [`raptor_run::PRIVATE_NOTICE`], like everything else a run computes from
//! private records without noise; the run's publishable `record.json` only notes that the run
//! was an audit, with m and the kind.
//!
//! The canaries exist only inside the audit's own run folder: nothing else can add them to a
//! run. An audit run folder must not be resumed with `raptor train --resume` (the canaries are
//! not in its config); its record carries a note saying so.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rand::seq::index::sample;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use raptor_accountant::{Accuracy, Composition, PrvAccountant, SubsampledGaussian};
use raptor_eval::audit::{AuditResult, audit_search, audit_search_many, default_grid};
use raptor_eval::mia::{MiaReport, mia_report};
use raptor_models::Model;
use raptor_models::roles::ExpertId;
use serde::{Deserialize, Serialize};
use tch::Device;

use raptor_run::session::{DataInfo, Session, is_classifier, prepare_counting, prepare_with};
use raptor_run::{
    PRIVATE_NOTICE, Progress, Record, new_run_id, train_prepared, train_prepared_with_canaries,
    write_atomic,
};
use raptor_train::config::RunConfig;
use raptor_train::streams::{Charge, GroupId, Plan};
use raptor_train::trainer::{CanaryCoord, DiracCanaries, DiracCanary, Example};

mod dirac;
pub mod error;

use dirac::audit_dirac;
use error::io;
pub use error::{AuditError, Result};

/// The default number of loss canaries (fewer when the training set is small: at most N/4).
pub const DEFAULT_CANARIES: usize = 200;

/// The default number of white-box (Dirac) canaries.
pub const DEFAULT_DIRAC_CANARIES: usize = 1000;

/// How canaries are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum CanaryKind {
    /// Training records with a different label (classifiers only).
    Mislabel,
    /// Random token sequences of the data's median length (random labels for classifiers).
    Random,
    /// White-box gradient canaries: one coordinate direction each, scored on the releases.
    Dirac,
    /// White-box gradient canaries of two coordinates each, one in the shared stream and one in
    /// the canary's owner expert, through clipping and owner masks: scored on both releases of
    /// an update at once (RAPTOR; without alternation both come from one sample, and the
    /// canary's shift is the one-sample mechanism's 1/σ_eff).
    Paired,
}

impl CanaryKind {
    /// The name used on the command line and in the audit file.
    pub fn name(self) -> &'static str {
        match self {
            CanaryKind::Mislabel => "mislabel",
            CanaryKind::Random => "random",
            CanaryKind::Dirac => "dirac",
            CanaryKind::Paired => "paired",
        }
    }
}

/// What `raptor audit` is asked for (besides the run config).
#[derive(Debug, Clone, PartialEq)]
pub struct AuditOptions {
    /// Number of canaries; None: [`DEFAULT_DIRAC_CANARIES`] for Dirac canaries, else
    /// `min(200, N/4)`. An explicit count must be ≥ 2; mislabeled canaries at most N/2 (half
    /// of the real records stay); Dirac canaries at most the audited coordinates.
    pub canaries: Option<usize>,
    /// Canary kind; None: `dirac` for private methods, else `mislabel` for classifiers and
    /// `random` for language models.
    pub kind: Option<CanaryKind>,
    /// A per-expert audit (Dirac canaries only): every canary in routed expert `e` of the
    /// layer RAPTOR trains.
    pub expert: Option<usize>,
    /// Confidence of the lower bound (e.g. 0.95).
    pub confidence: f64,
    /// Seed of the canary design (which records, which labels, which tokens); public. The
    /// inclusion coins never come from it.
    pub design_seed: u64,
}

impl Default for AuditOptions {
    fn default() -> Self {
        Self {
            canaries: None,
            kind: None,
            expert: None,
            confidence: raptor_eval::audit::DEFAULT_CONFIDENCE,
            design_seed: 0,
        }
    }
}

/// Where an audit writes its report, relative to its run folder: under `private/` (the coins
/// and the scores are not differentially private; see the module docs).
pub const AUDIT_FILE: &str = "private/audit.json";

/// Everything an audit reports (the audit file, [`AUDIT_FILE`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AuditReport {
    /// [`raptor_run::PRIVATE_NOTICE`]: the coins, the scores and the membership-inference report
    /// are not differentially private.
    #[serde(default)]
    pub notice: String,
    /// The run folder (its `record.json` is the training run's record).
    pub run: PathBuf,
    /// Method name.
    pub method: String,
    /// Canary kind.
    pub kind: CanaryKind,
    /// Number of canaries m.
    pub canaries: usize,
    /// Seed of the canary design.
    pub design_seed: u64,
    /// Whether the coins (and the run's sampling and noise) were seeded (NOT private).
    pub insecure_seeded: bool,
    /// Real training records in the run (after mislabeled canaries' sources were removed).
    pub real_records: usize,
    /// Records the run trained on (real records + included canaries). Loss canaries: the plan's
    /// N, q = B/N; Dirac canaries: see `dirac.plan_records`.
    pub train_records: usize,
    /// The run's sampling rate q (from N above).
    pub sampling_rate: f64,
    /// Canaries included (coins = true).
    pub included: usize,
    /// The canaries' record ids (fresh, above every training and validation id).
    pub canary_ids: Vec<u64>,
    /// Mislabeled canaries: the id of the training record each was made from.
    pub source_ids: Vec<Option<u64>>,
    /// The canaries' labels (classifiers).
    pub canary_labels: Vec<Option<i64>>,
    /// The secret coins: canary i was in the training set.
    pub coins: Vec<bool>,
    /// Each canary's loss under the initial model.
    pub initial_losses: Vec<f64>,
    /// Each canary's loss under the trained model.
    pub final_losses: Vec<f64>,
    /// Scores: initial − final loss (higher: guessed member).
    pub scores: Vec<f64>,
    /// The (k₊, k₋) grid searched (fixed by m before any score is seen).
    pub grid: Vec<(usize, usize)>,
    /// The search's result: chosen (k₊, k₋), guesses, correct guesses, ε_lower, levels.
    pub search: AuditResult,
    /// The empirical lower bound ε_lower (at `confidence`, for `delta`).
    pub epsilon_lower: f64,
    /// Confidence of `epsilon_lower`.
    pub confidence: f64,
    /// The certified upper bound of the run's ledger (None for non-private methods: ∞).
    pub epsilon_upper: Option<f64>,
    /// The run's target ε (∞ for non-private methods, which JSON writes as null).
    #[serde(deserialize_with = "null_is_infinite")]
    pub epsilon_target: f64,
    /// The run's δ.
    pub delta: f64,
    /// The scores as membership inference on the canaries (None when every coin fell the same
    /// way).
    pub mia: Option<MiaReport>,
    /// Dirac canaries: where they sit and what each statistic scored.
    #[serde(default)]
    pub dirac: Option<DiracReport>,
    /// A per-expert audit: the expert and the ε of its stream alone.
    #[serde(default)]
    pub expert: Option<ExpertAudit>,
    /// Notes.
    pub notes: Vec<String>,
}

/// Reads an ε that JSON wrote as null because it was infinite.
fn null_is_infinite<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
}

/// The white-box canaries of an audit (in the audit file).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DiracReport {
    /// N the plan was made for: real records + ⌈m/2⌉, fixed before the coins (q = B/N).
    pub plan_records: usize,
    /// The audited parameters (canary i sits in `params[param[i]]`).
    pub params: Vec<String>,
    /// Each canary's parameter (index into `params`).
    pub param: Vec<usize>,
    /// Each canary's flat (row-major) index in its parameter.
    pub index: Vec<i64>,
    /// Each canary's gradient value (the smallest bound of a clip group holding the parameter).
    pub value: Vec<f64>,
    /// Paired canaries: each canary's second coordinate (in its owner expert): parameter
    /// (index into `params`), flat index, gradient before clipping; and its owner expert.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paired: Vec<PairedCoord>,
    /// Released updates that carried each canary's coordinate.
    pub releases: Vec<u64>,
    /// The sum statistic of each canary (Σ observations / √n).
    pub sum_scores: Vec<f64>,
    /// The max statistic of each canary (its largest observation).
    pub max_scores: Vec<f64>,
    /// The statistic that gave ε_lower: `sum` or `max` (its scores are `scores`).
    pub statistic: String,
}

/// The expert coordinate of a paired canary (in the audit file).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PairedCoord {
    /// The parameter (index into [`DiracReport::params`]).
    pub param: usize,
    /// Flat index in the parameter.
    pub index: i64,
    /// The gradient there before clipping.
    pub gradient: f64,
    /// The canary's owner expert of RAPTOR's layer.
    pub owner: usize,
}

/// A per-expert audit (`--expert e`): the claim its canaries test.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExpertAudit {
    /// RAPTOR's layer.
    pub layer: usize,
    /// The routed expert whose parameters hold every canary.
    pub expert: usize,
    /// Updates that released the expert's parameters.
    pub stream_updates: u64,
    /// The expert release's planned σ.
    pub sigma: f64,
    /// The certified ε upper bound of the expert stream alone at the run's δ: its releases'
    /// charges composed without the rest of the run (None when it has no noise to account).
    pub epsilon_stream: Option<f64>,
}

/// A switch that breaks the mechanism, for the audit's own tests (the enum has no other value
/// outside tests and the `planted-faults` feature, and neither the CLI nor the config can reach
/// it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tamper {
    /// The mechanism as planned.
    None,
    /// No noise (σ = 0) and no clipping (bounds 10³⁰): a broken mechanism the audit must catch.
    #[cfg(test)]
    BreakMechanism,
    /// A planted bug in the trainer (white-box audits): the releases' noise differs from the
    /// plan while the ledger charges the planned σ, or the ledger charges one sample as several
    /// (tests and the `planted-faults` feature).
    #[cfg(feature = "planted-faults")]
    Fault(raptor_train::trainer::PlantedFault),
}

#[cfg_attr(not(test), allow(unused_variables))]
fn apply_tamper(plan: &mut Plan, tamper: Tamper) {
    match tamper {
        Tamper::None => {}
        #[cfg(test)]
        Tamper::BreakMechanism => tests::break_mechanism(plan),
        #[cfg(feature = "planted-faults")]
        Tamper::Fault(_) => {}
    }
}

/// The canaries as built before training.
#[derive(Debug, Clone, Default)]
struct Canaries {
    examples: Vec<Example>,
    sources: Vec<Option<u64>>,
    coins: Vec<bool>,
    real_records: usize,
}

/// The number of canaries for `n` real records.
fn canary_count(opts: &AuditOptions, kind: CanaryKind, n: usize) -> Result<usize> {
    let m = match opts.canaries {
        None => DEFAULT_CANARIES.min(n / 4),
        Some(m) => {
            if kind == CanaryKind::Mislabel && m > n / 2 {
                return Err(AuditError::Config(format!(
                    "--canaries {m}: mislabeled canaries are drawn from the {n} training records; at most {} (N/2)",
                    n / 2
                )));
            }
            m
        }
    };
    if m < 2 {
        return Err(AuditError::Config(format!(
            "an audit needs at least 2 canaries; the training set of {n} records gives {m} (N/4 by default)"
        )));
    }
    Ok(m)
}

/// The median token length of `train`, within [2, max_length].
fn typical_length(train: &[Example], max_length: usize) -> usize {
    let mut lens: Vec<usize> = train.iter().map(|e| e.tokens.len()).collect();
    lens.sort_unstable();
    let med = lens.get(lens.len() / 2).copied().unwrap_or(2);
    med.clamp(2, max_length.max(2))
}

/// Builds the canaries from the real training records, draws the coins and puts the included
/// canaries into `train` (mislabeled canaries' source records leave it).
fn insert_canaries(
    train: &mut Vec<Example>,
    info: &DataInfo,
    opts: &AuditOptions,
    kind: CanaryKind,
    coin_rng: &mut ChaCha20Rng,
) -> Result<Canaries> {
    let n = train.len();
    let m = canary_count(opts, kind, n)?;
    let mut rng = ChaCha20Rng::seed_from_u64(opts.design_seed);
    let fresh = |i: usize| info.max_id.saturating_add(1).saturating_add(i as u64);
    let mut examples = Vec::with_capacity(m);
    let mut sources = Vec::with_capacity(m);
    match kind {
        CanaryKind::Dirac | CanaryKind::Paired => {
            return Err(AuditError::Config(
                "white-box canaries are not records of the data set".into(),
            ));
        }
        CanaryKind::Mislabel => {
            if !info.classifier || info.num_labels < 2 {
                return Err(AuditError::Config(
                    "mislabeled canaries need a classifier with at least two classes; use --kind random".into(),
                ));
            }
            let picked = sample(&mut rng, n, m).into_vec();
            for (i, &j) in picked.iter().enumerate() {
                let src = &train[j];
                let label = src
                    .label
                    .ok_or_else(|| AuditError::Data(format!("record {} has no label", src.id)))?;
                let shift = rng.random_range(1..info.num_labels as i64);
                examples.push(Example {
                    id: fresh(i),
                    tokens: src.tokens.clone(),
                    label: Some((label + shift).rem_euclid(info.num_labels as i64)),
                    prompt_len: src.prompt_len,
                });
                sources.push(Some(src.id));
            }
            let mut keep = vec![true; n];
            for &j in &picked {
                keep[j] = false;
            }
            let mut k = keep.iter();
            train.retain(|_| k.next().copied().unwrap_or(true));
        }
        CanaryKind::Random => {
            let len = typical_length(train, info.max_length);
            // Special ids (padding, EOS, the byte tokenizer's 0..3) are never drawn.
            let lo = 3i64.min(info.vocab - 1);
            if info.vocab - lo < 2 {
                return Err(AuditError::Config(format!(
                    "random canaries need a vocabulary of more than 4 tokens, the model has {}",
                    info.vocab
                )));
            }
            for i in 0..m {
                let body = if info.classifier { len } else { len - 1 };
                let mut tokens = Vec::with_capacity(len);
                while tokens.len() < body {
                    let t = rng.random_range(lo..info.vocab);
                    if t != info.pad_id && t != info.eos_id {
                        tokens.push(t);
                    }
                }
                let label = if info.classifier {
                    Some(rng.random_range(0..info.num_labels.max(1) as i64))
                } else {
                    tokens.push(info.eos_id);
                    None
                };
                examples.push(Example {
                    id: fresh(i),
                    tokens,
                    label,
                    prompt_len: 0,
                });
                sources.push(None);
            }
        }
    }
    let real_records = train.len();
    let coins: Vec<bool> = (0..m).map(|_| coin_rng.random::<bool>()).collect();
    train.extend(
        examples
            .iter()
            .zip(&coins)
            .filter(|(_, c)| **c)
            .map(|(e, _)| e.clone()),
    );
    Ok(Canaries {
        examples,
        sources,
        coins,
        real_records,
    })
}

/// Per-record losses of `data` under `model` (no dropout, natural routing): cross-entropy for
/// classifiers, mean next-token NLL over the targets for language models.
pub fn per_record_losses(
    model: &dyn Model,
    data: &[Example],
    micro_batch: usize,
    pad_id: i64,
    device: Device,
) -> Result<Vec<f64>> {
    let out = raptor_train::trainer::per_record_losses(model, data, micro_batch, pad_id, device)?;
    if let Some(i) = out.iter().position(|l| !l.is_finite()) {
        return Err(AuditError::Data(format!(
            "audit: canary {i} has a non-finite loss"
        )));
    }
    Ok(out)
}

/// Runs the audit: prepares the run with canaries, trains once into a new run folder under
/// `runs_dir`, scores the canaries and writes the audit file there ([`AUDIT_FILE`], under the
/// run's `private/` folder).
pub fn audit(
    cfg: &RunConfig,
    opts: &AuditOptions,
    runs_dir: &Path,
    progress: Progress<'_>,
) -> Result<AuditReport> {
    audit_impl(cfg, opts, runs_dir, progress, Tamper::None)
}

fn audit_impl(
    cfg: &RunConfig,
    opts: &AuditOptions,
    runs_dir: &Path,
    progress: Progress<'_>,
    tamper: Tamper,
) -> Result<AuditReport> {
    if !(opts.confidence.is_finite() && opts.confidence > 0.0 && opts.confidence < 1.0) {
        return Err(AuditError::Config(format!(
            "--confidence {}: need 0 < confidence < 1",
            opts.confidence
        )));
    }
    let classifier = is_classifier(&cfg.model);
    let kind = opts.kind.unwrap_or(if cfg.method.name().is_private() {
        CanaryKind::Dirac
    } else if classifier {
        CanaryKind::Mislabel
    } else {
        CanaryKind::Random
    });
    let mut coin_rng = match cfg.train.insecure_seed {
        Some(s) => ChaCha20Rng::seed_from_u64(s ^ 0x5eed_a0d1_c0de_c01d),
        None => ChaCha20Rng::from_os_rng(),
    };
    if matches!(kind, CanaryKind::Dirac | CanaryKind::Paired) {
        let m = opts.canaries.unwrap_or(DEFAULT_DIRAC_CANARIES);
        let coins: Vec<bool> = (0..m).map(|_| coin_rng.random::<bool>()).collect();
        return audit_dirac(cfg, opts, kind, runs_dir, progress, tamper, coins);
    }
    if opts.expert.is_some() {
        return Err(AuditError::Config(
            "--expert audits with white-box canaries: use --kind dirac or paired".into(),
        ));
    }
    #[cfg(feature = "planted-faults")]
    if matches!(tamper, Tamper::Fault(_)) {
        return Err(AuditError::Config(
            "planted bugs are for white-box (dirac, paired) audits".into(),
        ));
    }
    let mut canaries: Option<Canaries> = None;
    // The hook speaks raptor-run's error type; the audit's own error is kept aside and
    // returned as it is.
    let mut failed: Option<AuditError> = None;
    let mut hook = |train: &mut Vec<Example>, info: &DataInfo| -> raptor_run::Result<()> {
        match insert_canaries(train, info, opts, kind, &mut coin_rng) {
            Ok(c) => {
                canaries = Some(c);
                Ok(())
            }
            Err(e) => {
                let message = e.to_string();
                failed = Some(e);
                Err(raptor_run::RunError::Config(message))
            }
        }
    };
    let prepared = prepare_with(cfg, Some(&mut hook));
    if let Some(e) = failed {
        return Err(e);
    }
    let mut session = prepared?;
    let canaries =
        canaries.ok_or_else(|| AuditError::Run("audit: the canaries were not built".into()))?;
    apply_tamper(&mut session.plan, tamper);
    let (micro, pad, device) = (
        session.cfg.train.micro_batch,
        session.pad_id,
        session.device,
    );
    let initial = per_record_losses(
        session.model.as_ref(),
        &canaries.examples,
        micro,
        pad,
        device,
    )?;
    let dir = runs_dir.join(format!("audit-{}", new_run_id(cfg.method.name())));
    let (dir, mut record, model) = train_prepared(session, dir, progress)?;
    let fin = per_record_losses(model.as_ref(), &canaries.examples, micro, pad, device)?;
    let scores: Vec<f64> = initial.iter().zip(&fin).map(|(a, b)| a - b).collect();
    let m = canaries.examples.len();
    let grid = default_grid(m);
    let delta = record.privacy_plan.delta;
    let search = audit_search(&scores, &canaries.coins, delta, opts.confidence, &grid)?;
    let mia = canary_mia(&scores, &canaries.coins)?;
    let included = canaries.coins.iter().filter(|c| **c).count();
    let notes = run_notes(cfg, &record);
    let report = AuditReport {
        notice: raptor_run::PRIVATE_NOTICE.into(),
        run: dir.clone(),
        method: record.method.clone(),
        kind,
        canaries: m,
        design_seed: opts.design_seed,
        insecure_seeded: cfg.train.insecure_seed.is_some(),
        real_records: canaries.real_records,
        train_records: record.train_records,
        sampling_rate: record.privacy_plan.q,
        included,
        canary_ids: canaries.examples.iter().map(|e| e.id).collect(),
        source_ids: canaries.sources,
        canary_labels: canaries.examples.iter().map(|e| e.label).collect(),
        coins: canaries.coins,
        initial_losses: initial,
        final_losses: fin,
        scores,
        grid,
        epsilon_lower: search.epsilon_lower,
        confidence: opts.confidence,
        search,
        epsilon_upper: record.epsilon.as_ref().map(|e| e.upper),
        epsilon_target: record.privacy_plan.epsilon,
        delta,
        mia,
        dirac: None,
        expert: None,
        notes,
    };
    finish(report, &dir, &mut record)
}

/// The notes every audit report carries about its run: seeded (not private) coins, sampling and
/// noise; a run whose ledger certifies no ε.
fn run_notes(cfg: &RunConfig, record: &Record) -> Vec<String> {
    let mut notes = Vec::new();
    if cfg.train.insecure_seed.is_some() {
        notes.push(
            "NOT PRIVATE: train.insecure_seed seeds the coins, the sampling and the noise".into(),
        );
    }
    if record.epsilon.is_none() && record.privacy_plan.epsilon.is_finite() {
        notes.push("the ledger certifies no ε for this run (a release without noise)".into());
    }
    notes
}

/// Writes the audit file under the run's `private/` folder and notes the audit in the run's
/// `record.json` (m and the kind only: the coins stay in the private file).
fn finish(report: AuditReport, dir: &Path, record: &mut Record) -> Result<AuditReport> {
    let path = dir.join(AUDIT_FILE);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    write_atomic(&path, &serde_json::to_vec_pretty(&report)?)?;
    record.notes.push(format!(
        "audit run: {} {} canaries beside the {} real records ({AUDIT_FILE}: secret coins and scores, not differentially private); do not resume it with raptor train --resume",
        report.canaries,
        report.kind.name(),
        report.real_records,
    ));
    write_atomic(
        &dir.join("record.json"),
        &serde_json::to_vec_pretty(&record)?,
    )?;
    Ok(report)
}

/// The canaries' scores as membership inference (None when every coin fell the same way).
fn canary_mia(scores: &[f64], coins: &[bool]) -> Result<Option<MiaReport>> {
    let pick = |want: bool| -> Vec<f64> {
        scores
            .iter()
            .zip(coins)
            .filter(|(_, c)| **c == want)
            .map(|(s, _)| *s)
            .collect()
    };
    let (members, non_members) = (pick(true), pick(false));
    if members.is_empty() || non_members.is_empty() {
        return Ok(None);
    }
    Ok(Some(mia_report(&members, &non_members)?))
}

/// Reads the audit file ([`AUDIT_FILE`]) of a run folder.
pub fn read_report(run: &Path) -> Result<AuditReport> {
    let p = run.join(AUDIT_FILE);
    Ok(serde_json::from_slice(&std::fs::read(&p).map_err(io(&p))?)?)
}

/// Planted bugs of the mechanism, to show that the white-box audit can fail: the audit's own
/// tests and its measured table (`examples/audit_table.rs`, `scripts/audit-table.sh`) use them.
///
/// Compiled only in tests (the toy setting) and under the cargo feature `planted-faults` (the
/// faults themselves, forwarded to raptor-train's feature of the same name), which is for tests
/// and audits of the auditor only: it is off by default, no crate of the workspace turns it on,
/// and the `raptor` program refuses to build with it. A run made through `audit_with_fault` is
/// **not private** (its noise is not what its ledger charges).
#[cfg(any(test, feature = "planted-faults"))]
pub mod planted;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;

/// The README's examples, compiled (and run where not `no_run`) as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
