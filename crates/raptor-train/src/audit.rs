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
//! `private/` with [`crate::run::PRIVATE_NOTICE`], like everything else a run computes from
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

use crate::config::RunConfig;
use crate::error::{Result, TrainError, io};
use crate::run::{Progress, new_run_id, train_session, write_atomic};
use crate::session::{DataInfo, Session, is_classifier, prepare_counting, prepare_with};
use crate::streams::{Charge, GroupId, Plan};
use crate::trainer::{DiracCanaries, DiracCanary, Example};

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
}

impl CanaryKind {
    /// The name used on the command line and in the audit file.
    pub fn name(self) -> &'static str {
        match self {
            CanaryKind::Mislabel => "mislabel",
            CanaryKind::Random => "random",
            CanaryKind::Dirac => "dirac",
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
    /// [`crate::run::PRIVATE_NOTICE`]: the coins, the scores and the membership-inference report
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
    /// Released updates that carried each canary's coordinate.
    pub releases: Vec<u64>,
    /// The sum statistic of each canary (Σ observations / √n).
    pub sum_scores: Vec<f64>,
    /// The max statistic of each canary (its largest observation).
    pub max_scores: Vec<f64>,
    /// The statistic that gave ε_lower: `sum` or `max` (its scores are `scores`).
    pub statistic: String,
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
    /// A planted noise bug in the trainer (Dirac audits): the releases' noise differs from the
    /// plan while the ledger charges the planned σ (tests and the `planted-faults` feature).
    #[cfg(any(test, feature = "planted-faults"))]
    Noise(crate::trainer::NoiseFault),
}

#[cfg_attr(not(test), allow(unused_variables))]
fn apply_tamper(plan: &mut crate::streams::Plan, tamper: Tamper) {
    match tamper {
        Tamper::None => {}
        #[cfg(test)]
        Tamper::BreakMechanism => tests::break_mechanism(plan),
        #[cfg(any(test, feature = "planted-faults"))]
        Tamper::Noise(_) => {}
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

fn eval_err(e: raptor_eval::EvalError) -> TrainError {
    TrainError::Data(format!("audit: {e}"))
}

/// The number of canaries for `n` real records.
fn canary_count(opts: &AuditOptions, kind: CanaryKind, n: usize) -> Result<usize> {
    let m = match opts.canaries {
        None => DEFAULT_CANARIES.min(n / 4),
        Some(m) => {
            if kind == CanaryKind::Mislabel && m > n / 2 {
                return Err(TrainError::Config(format!(
                    "--canaries {m}: mislabeled canaries are drawn from the {n} training records; at most {} (N/2)",
                    n / 2
                )));
            }
            m
        }
    };
    if m < 2 {
        return Err(TrainError::Config(format!(
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
        CanaryKind::Dirac => {
            return Err(TrainError::Config(
                "Dirac canaries are not records of the data set".into(),
            ));
        }
        CanaryKind::Mislabel => {
            if !info.classifier || info.num_labels < 2 {
                return Err(TrainError::Config(
                    "mislabeled canaries need a classifier with at least two classes; use --kind random".into(),
                ));
            }
            let picked = sample(&mut rng, n, m).into_vec();
            for (i, &j) in picked.iter().enumerate() {
                let src = &train[j];
                let label = src
                    .label
                    .ok_or_else(|| TrainError::Data(format!("record {} has no label", src.id)))?;
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
                return Err(TrainError::Config(format!(
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
    let out = crate::trainer::per_record_losses(model, data, micro_batch, pad_id, device)?;
    if let Some(i) = out.iter().position(|l| !l.is_finite()) {
        return Err(TrainError::Data(format!(
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
        return Err(TrainError::Config(format!(
            "--confidence {}: need 0 < confidence < 1",
            opts.confidence
        )));
    }
    let classifier = is_classifier(cfg);
    let kind = opts.kind.unwrap_or(if cfg.method.name.is_private() {
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
    if kind == CanaryKind::Dirac {
        let m = opts.canaries.unwrap_or(DEFAULT_DIRAC_CANARIES);
        let coins: Vec<bool> = (0..m).map(|_| coin_rng.random::<bool>()).collect();
        return audit_dirac(cfg, opts, runs_dir, progress, tamper, coins);
    }
    if opts.expert.is_some() {
        return Err(TrainError::Config(
            "--expert audits with white-box canaries: use --kind dirac".into(),
        ));
    }
    #[cfg(any(test, feature = "planted-faults"))]
    if matches!(tamper, Tamper::Noise(_)) {
        return Err(TrainError::Config(
            "planted noise bugs are for Dirac audits".into(),
        ));
    }
    let mut canaries: Option<Canaries> = None;
    let mut hook = |train: &mut Vec<Example>, info: &DataInfo| -> Result<()> {
        canaries = Some(insert_canaries(train, info, opts, kind, &mut coin_rng)?);
        Ok(())
    };
    let mut session = prepare_with(cfg, Some(&mut hook))?;
    let canaries =
        canaries.ok_or_else(|| TrainError::Run("audit: the canaries were not built".into()))?;
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
    let dir = runs_dir.join(format!("audit-{}", new_run_id(cfg)));
    let (dir, mut record, model) =
        train_session(session, dir, false, progress, None, &crate::dist::Solo)?;
    let fin = per_record_losses(model.as_ref(), &canaries.examples, micro, pad, device)?;
    let scores: Vec<f64> = initial.iter().zip(&fin).map(|(a, b)| a - b).collect();
    let m = canaries.examples.len();
    let grid = default_grid(m);
    let delta = record.privacy_plan.delta;
    let search =
        audit_search(&scores, &canaries.coins, delta, opts.confidence, &grid).map_err(eval_err)?;
    let mia = canary_mia(&scores, &canaries.coins)?;
    let included = canaries.coins.iter().filter(|c| **c).count();
    let mut notes = Vec::new();
    if cfg.train.insecure_seed.is_some() {
        notes.push(
            "NOT PRIVATE: train.insecure_seed seeds the coins, the sampling and the noise".into(),
        );
    }
    if record.epsilon.is_none() && record.privacy_plan.epsilon.is_finite() {
        notes.push("the ledger certifies no ε for this run (a release without noise)".into());
    }
    let report = AuditReport {
        notice: crate::run::PRIVATE_NOTICE.into(),
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

/// Writes the audit file under the run's `private/` folder and notes the audit in the run's
/// `record.json` (m and the kind only: the coins stay in the private file).
fn finish(report: AuditReport, dir: &Path, record: &mut crate::run::Record) -> Result<AuditReport> {
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
    Ok(Some(mia_report(&members, &non_members).map_err(eval_err)?))
}

/// The parameters a Dirac audit may place canaries in, each with its canary value (the
/// smallest bound of a clip group, or global clip, that holds it in any phase): every
/// parameter a phase releases, or with `expert` only those of the clip group of that routed
/// expert of `layer`.
fn dirac_params(
    plan: &Plan,
    layer: Option<usize>,
    expert: Option<usize>,
) -> Result<BTreeMap<String, f64>> {
    let wanted: Option<GroupId> = match (expert, layer) {
        (None, _) => None,
        (Some(expert), Some(layer)) => Some(GroupId::Expert(ExpertId { layer, expert })),
        (Some(_), None) => {
            return Err(TrainError::Config(
                "--expert: the method trains no expert stream (RAPTOR or expert-only)".into(),
            ));
        }
    };
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    for ph in &plan.phases {
        for r in &ph.releases {
            for g in r.groups.iter().filter_map(|g| ph.group(g)) {
                if wanted.as_ref().is_some_and(|w| *w != g.name) {
                    continue;
                }
                for p in &g.params {
                    out.entry(p.clone()).or_insert(f64::INFINITY);
                }
            }
        }
    }
    if out.is_empty() {
        return Err(TrainError::Config(match (expert, layer) {
            (Some(e), Some(l)) => format!(
                "--expert {e}: layer {l} has no released expert {e} (experts are numbered from 0)"
            ),
            _ => "the plan releases no parameter to place canaries in".into(),
        }));
    }
    // The value: within every bound that applies to the parameter, in any phase.
    for ph in &plan.phases {
        for g in &ph.groups {
            let bound = ph.global_clip.unwrap_or(g.bound);
            for p in &g.params {
                if let Some(v) = out.get_mut(p) {
                    *v = v.min(bound);
                }
            }
        }
    }
    Ok(out)
}

/// `m` canaries at distinct coordinates of `params` (name → value), drawn uniformly by the
/// design seed among all their coordinates (`shapes`: each parameter's element count).
fn place_dirac(
    params: &BTreeMap<String, f64>,
    numel: &BTreeMap<String, usize>,
    m: usize,
    design_seed: u64,
) -> Result<Vec<DiracCanary>> {
    let mut starts = Vec::with_capacity(params.len());
    let mut total = 0usize;
    for p in params.keys() {
        let n = numel
            .get(p)
            .copied()
            .ok_or_else(|| TrainError::Config(format!("parameter {p} is not in the model")))?;
        starts.push((total, p));
        total += n;
    }
    if m > total {
        return Err(TrainError::Config(format!(
            "--canaries {m}: the audited parameters have {total} coordinates; a canary needs one of its own"
        )));
    }
    let mut rng = ChaCha20Rng::seed_from_u64(design_seed);
    let mut out = Vec::with_capacity(m);
    for flat in sample(&mut rng, total, m).into_iter() {
        // The last parameter whose first coordinate is ≤ flat.
        let at = starts.partition_point(|(s, _)| *s <= flat) - 1;
        let (start, p) = starts[at];
        out.push(DiracCanary {
            param: p.clone(),
            index: (flat - start) as i64,
            value: params[p],
        });
    }
    Ok(out)
}

/// The certified ε of one expert stream alone: every update that releases expert `expert` of
/// `layer`, at that release's σ, composed (None when it has no noise).
fn expert_stream_epsilon(
    plan: &Plan,
    layer: usize,
    expert: usize,
    delta: f64,
    accuracy: f64,
) -> Result<ExpertAudit> {
    let counts = plan.phase_counts();
    let mut comp = Composition::new();
    let (mut updates, mut sigma, mut noiseless) = (0u64, f64::NAN, false);
    for (ph, &count) in plan.phases.iter().zip(&counts) {
        for r in &ph.releases {
            if r.charge == Charge::Parallel(ExpertId { layer, expert }) && count > 0 {
                updates += count;
                sigma = r.sigma;
                if ph.private && r.sigma > 0.0 {
                    comp.push(SubsampledGaussian::new(plan.q, r.sigma)?, count)?;
                } else {
                    noiseless = true;
                }
            }
        }
    }
    let epsilon_stream = if updates == 0 || noiseless {
        None
    } else {
        let acc = PrvAccountant::new(Accuracy::relative(accuracy))?;
        Some(acc.epsilon(&comp, delta)?.upper)
    };
    Ok(ExpertAudit {
        layer,
        expert,
        stream_updates: updates,
        sigma,
        epsilon_stream,
    })
}

/// The white-box audit (module docs) with the secret `coins` (one per canary).
fn audit_dirac(
    cfg: &RunConfig,
    opts: &AuditOptions,
    runs_dir: &Path,
    progress: Progress<'_>,
    tamper: Tamper,
    coins: Vec<bool>,
) -> Result<AuditReport> {
    let m = coins.len();
    if m < 2 {
        return Err(TrainError::Config(format!(
            "--canaries {m}: an audit needs at least 2 canaries"
        )));
    }
    let mut session: Session = prepare_counting(cfg, None, m.div_ceil(2))?;
    apply_tamper(&mut session.plan, tamper);
    let layer = session.layer.as_ref().map(|l| l.layer);
    let params = dirac_params(&session.plan, layer, opts.expert)?;
    let numel: BTreeMap<String, usize> = session
        .model
        .var_store()
        .variables()
        .into_iter()
        .map(|(n, t)| (n, t.numel()))
        .collect();
    let placed = place_dirac(&params, &numel, m, opts.design_seed)?;
    let names: Vec<String> = params.keys().cloned().collect();
    let param_of: Vec<usize> = placed
        .iter()
        .map(|c| names.binary_search(&c.param).unwrap_or(0))
        .collect();
    let index: Vec<i64> = placed.iter().map(|c| c.index).collect();
    let value: Vec<f64> = placed.iter().map(|c| c.value).collect();
    let real_records = session.train.len();
    let plan_records = real_records + m.div_ceil(2);
    let plan = session.plan.clone();
    #[cfg_attr(not(any(test, feature = "planted-faults")), allow(unused_mut))]
    let (mut canaries, traces) = DiracCanaries::new(placed, &coins)?;
    #[cfg(any(test, feature = "planted-faults"))]
    if let Tamper::Noise(f) = tamper {
        canaries.fault = Some(f);
    }
    session.canaries = Some(canaries);
    let dir = runs_dir.join(format!("audit-{}", new_run_id(cfg)));
    let (dir, mut record, _model) =
        train_session(session, dir, false, progress, None, &crate::dist::Solo)?;
    let traces: Vec<raptor_eval::audit::DiracTrace> = traces
        .lock()
        .map_err(|_| TrainError::Run("the canary traces are poisoned".into()))?
        .clone();
    let sum_scores: Vec<f64> = traces.iter().map(|t| t.sum_score()).collect();
    let max_scores: Vec<f64> = traces.iter().map(|t| t.max_score()).collect();
    let grid = default_grid(m);
    let delta = record.privacy_plan.delta;
    let (stat, search) = audit_search_many(
        &[&sum_scores, &max_scores],
        &coins,
        delta,
        opts.confidence,
        &grid,
    )
    .map_err(eval_err)?;
    let (statistic, scores) = if stat == 0 {
        ("sum", sum_scores.clone())
    } else {
        ("max", max_scores.clone())
    };
    let mia = canary_mia(&scores, &coins)?;
    let expert = match (opts.expert, layer) {
        (Some(e), Some(l)) => Some(expert_stream_epsilon(
            &plan,
            l,
            e,
            delta,
            cfg.privacy.accuracy,
        )?),
        _ => None,
    };
    let mut notes = Vec::new();
    if cfg.train.insecure_seed.is_some() {
        notes.push(
            "NOT PRIVATE: train.insecure_seed seeds the coins, the sampling and the noise".into(),
        );
    }
    if record.epsilon.is_none() && record.privacy_plan.epsilon.is_finite() {
        notes.push("the ledger certifies no ε for this run (a release without noise)".into());
    }
    let included = coins.iter().filter(|c| **c).count();
    let report = AuditReport {
        notice: crate::run::PRIVATE_NOTICE.into(),
        run: dir.clone(),
        method: record.method.clone(),
        kind: CanaryKind::Dirac,
        canaries: m,
        design_seed: opts.design_seed,
        insecure_seeded: cfg.train.insecure_seed.is_some(),
        real_records,
        train_records: real_records + included,
        sampling_rate: record.privacy_plan.q,
        included,
        canary_ids: Vec::new(),
        source_ids: Vec::new(),
        canary_labels: Vec::new(),
        coins,
        initial_losses: Vec::new(),
        final_losses: Vec::new(),
        scores,
        grid,
        epsilon_lower: search.epsilon_lower,
        confidence: opts.confidence,
        search,
        epsilon_upper: record.epsilon.as_ref().map(|e| e.upper),
        epsilon_target: record.privacy_plan.epsilon,
        delta,
        mia,
        dirac: Some(DiracReport {
            plan_records,
            params: names,
            param: param_of,
            index,
            value,
            releases: traces.iter().map(|t| t.releases()).collect(),
            sum_scores,
            max_scores,
            statistic: statistic.into(),
        }),
        expert,
        notes,
    };
    finish(report, &dir, &mut record)
}

/// Reads the audit file ([`AUDIT_FILE`]) of a run folder.
pub fn read_report(run: &Path) -> Result<AuditReport> {
    let p = run.join(AUDIT_FILE);
    Ok(serde_json::from_slice(&std::fs::read(&p).map_err(io(&p))?)?)
}

/// Planted bugs of the mechanism, to show that the white-box audit can fail: the audit's own
/// tests and its measured table (`examples/audit_table.rs`, `scripts/audit-table.sh`) use them.
///
/// Compiled only in tests and under the cargo feature `planted-faults`, which is for tests and
/// audits of the auditor only: it is off by default, no crate of the workspace turns it on, and
/// the `raptor` program refuses to build with it. A run made through
/// [`audit_with_fault`](crate::audit::planted::audit_with_fault) is **not private** (its noise
/// is not what its ledger charges).
#[cfg(any(test, feature = "planted-faults"))]
pub mod planted {
    use std::path::{Path, PathBuf};

    use super::{AuditOptions, AuditReport, CanaryKind, Tamper, audit_impl};
    use crate::config::{Method, ModelKind, RunConfig};
    use crate::error::{Result, TrainError};
    use crate::run::Progress;
    pub use crate::trainer::NoiseFault;

    /// A white-box audit as [`super::audit`] runs it, with `fault` planted in the trainer: the
    /// releases' noise differs from the plan while the ledger charges the planned σ. Dirac
    /// canaries only (`opts.kind` None or `Some(Dirac)`).
    pub fn audit_with_fault(
        cfg: &RunConfig,
        opts: &AuditOptions,
        runs_dir: &Path,
        progress: Progress<'_>,
        fault: NoiseFault,
    ) -> Result<AuditReport> {
        if opts.kind.is_some_and(|k| k != CanaryKind::Dirac) {
            return Err(TrainError::Config(
                "planted noise bugs are for white-box (dirac) audits".into(),
            ));
        }
        let opts = AuditOptions {
            kind: Some(CanaryKind::Dirac),
            ..opts.clone()
        };
        audit_impl(cfg, &opts, runs_dir, progress, Tamper::Noise(fault))
    }

    /// The toy data of the repository (`examples/toy`).
    pub fn toy_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/toy")
    }

    /// The setting of the white-box audit's tests and table: a tiny Switch classifier on the
    /// toy sentiment data (600 records; d 64, 2 blocks, the second sparse with 4 experts of
    /// d_ff 640), LoRA r = 32 on the attention and on the experts (45,056 coordinates per
    /// expert), `steps` updates at q = 0.01 of N = 600 + ⌈m/2⌉ (`m` canaries), δ = 10⁻⁶, target
    /// `epsilon`, RAPTOR's ρ = 0.5 on its last layer, seeded by `train.insecure_seed` = 11 (NOT
    /// private). Few real records per update (about 6): the canaries need no forward pass, so m
    /// is cheap.
    pub fn toy_switch(method: Method, epsilon: f64, m: usize, steps: u64) -> RunConfig {
        let mut c = RunConfig::default();
        c.data.train = toy_dir().join("train.csv");
        c.data.validation = None;
        c.data.validation_fraction = 0.0;
        c.data.text_column = "text".into();
        c.data.label_column = "label".into();
        c.data.max_length = 16;
        c.model.kind = ModelKind::Switch;
        c.model.tokenizer = crate::config::TokenizerSpec::Bytes;
        c.model.d_model = 64;
        c.model.layers = 2;
        c.model.heads = 2;
        c.model.d_ff = 640;
        c.model.experts = 4;
        c.lora.r = 32;
        c.lora.alpha = 32.0;
        c.method.name = method;
        // RAPTOR's knobs only where they apply (the validator reports them elsewhere).
        if method == Method::Raptor {
            c.method.layer = crate::config::LayerSpec::Last;
            c.privacy.rho = 0.5;
        }
        c.privacy.epsilon = epsilon;
        c.privacy.accuracy = 0.01;
        c.privacy.delta = Some(1e-6);
        c.train.batch_size = 0.01 * (600 + m.div_ceil(2)) as f64;
        c.train.micro_batch = 64;
        c.train.steps = Some(steps);
        c.train.lr = 0.01;
        c.train.checkpoint_every = 0;
        c.train.eval_every = 0;
        c.train.insecure_seed = Some(11);
        c
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::planted::{NoiseFault, toy_dir, toy_switch};
    use super::*;
    use crate::config::{Method, ModelKind};
    use crate::streams::Plan;
    use proptest::prelude::*;

    /// The broken mechanism: no noise, no clipping (test-only; see [`Tamper`]).
    pub(super) fn break_mechanism(plan: &mut Plan) {
        for ph in &mut plan.phases {
            ph.global_clip = ph.global_clip.map(|_| 1e30);
            for g in &mut ph.groups {
                g.bound = 1e30;
            }
            for r in &mut ph.releases {
                r.sigma = 0.0;
            }
        }
    }

    /// A tiny GPT-2 language model on the toy text (16 byte tokens), DP-Adam over every
    /// parameter, 200 updates of B = 64 at a high learning rate: random-token canaries are
    /// memorized quickly once noise and clipping are off.
    fn small_cfg(epsilon: f64) -> RunConfig {
        let (steps, lr) = (300, 0.02);
        let mut c = RunConfig::default();
        c.data.train = toy_dir().join("train.csv");
        c.data.validation = None;
        c.data.validation_fraction = 0.0;
        c.data.text_column = "text".into();
        c.data.label_column = "label".into();
        c.data.max_length = 16;
        c.model.kind = ModelKind::Gpt2;
        c.model.tokenizer = crate::config::TokenizerSpec::Bytes;
        c.model.d_model = 32;
        c.model.layers = 2;
        c.model.heads = 2;
        c.model.d_ff = 64;
        c.model.experts = 2;
        c.method.name = Method::DpAdam;
        c.privacy.epsilon = epsilon;
        c.privacy.accuracy = 0.01;
        // 2·m·δ enters the bound: δ = 1/N (10⁻³ here) would leave almost no power to 300
        // canaries.
        c.privacy.delta = Some(1e-5);
        c.train.batch_size = 64.0;
        c.train.micro_batch = 128;
        c.train.steps = Some(steps);
        c.train.lr = lr;
        c.train.weight_decay = 0.0;
        c.train.checkpoint_every = 0;
        c.train.eval_every = 0;
        c.train.insecure_seed = Some(7);
        c
    }

    fn info(classifier: bool) -> DataInfo {
        DataInfo {
            classifier,
            num_labels: if classifier { 3 } else { 0 },
            vocab: 50,
            pad_id: 0,
            eos_id: 2,
            max_length: 16,
            max_id: 999,
        }
    }

    fn records(n: usize) -> Vec<Example> {
        (0..n)
            .map(|i| Example {
                id: i as u64 * 2,
                tokens: vec![3 + (i % 40) as i64; 4 + i % 5],
                label: Some((i % 3) as i64),
                prompt_len: 0,
            })
            .collect()
    }

    #[test]
    fn mislabeled_canaries_leave_the_training_set_with_another_label_and_fresh_ids() {
        let opts = AuditOptions::default();
        let mut train = records(100);
        let orig = train.clone();
        let mut coins = ChaCha20Rng::seed_from_u64(1);
        let c = insert_canaries(
            &mut train,
            &info(true),
            &opts,
            CanaryKind::Mislabel,
            &mut coins,
        )
        .unwrap();
        assert_eq!(c.examples.len(), 25); // N/4
        assert_eq!(c.real_records, 75);
        let included = c.coins.iter().filter(|b| **b).count();
        assert!(included > 0 && included < 25);
        assert_eq!(train.len(), 75 + included);
        for (k, e) in c.examples.iter().enumerate() {
            assert_eq!(e.id, 1000 + k as u64);
            let src = orig.iter().find(|o| Some(o.id) == c.sources[k]).unwrap();
            assert_eq!(src.tokens, e.tokens);
            assert_ne!(src.label, e.label);
            assert!((0..3).contains(&e.label.unwrap()));
            // The source record left; the canary is in iff its coin says so.
            assert!(!train.iter().any(|t| t.id == src.id));
            assert_eq!(train.iter().any(|t| t.id == e.id), c.coins[k]);
        }
        // Deterministic design given the seed; the coins come from their own generator.
        let mut again = records(100);
        let c2 = insert_canaries(
            &mut again,
            &info(true),
            &opts,
            CanaryKind::Mislabel,
            &mut ChaCha20Rng::seed_from_u64(2),
        )
        .unwrap();
        assert_eq!(c.examples, c2.examples);
        assert_ne!(c.coins, c2.coins);
    }

    #[test]
    fn random_canaries_have_the_median_length_and_no_special_token() {
        let mut train = records(40);
        let opts = AuditOptions {
            canaries: Some(30),
            ..AuditOptions::default()
        };
        let lm = info(false);
        let c = insert_canaries(
            &mut train,
            &lm,
            &opts,
            CanaryKind::Random,
            &mut ChaCha20Rng::seed_from_u64(3),
        )
        .unwrap();
        assert_eq!(c.real_records, 40);
        let med = typical_length(&records(40), 16);
        for e in &c.examples {
            assert_eq!(e.tokens.len(), med);
            assert_eq!(e.tokens.last(), Some(&2)); // EOS ends LM text
            assert!(e.tokens[..med - 1].iter().all(|&t| (3..50).contains(&t)));
            assert_eq!(e.label, None);
        }
        // Too few records for the default count, too many mislabeled canaries: errors.
        let few = AuditOptions::default();
        assert!(canary_count(&few, CanaryKind::Random, 7).is_err());
        let many = AuditOptions {
            canaries: Some(51),
            ..AuditOptions::default()
        };
        assert!(canary_count(&many, CanaryKind::Mislabel, 100).is_err());
        assert_eq!(canary_count(&many, CanaryKind::Random, 100).unwrap(), 51);
        let mut t = records(40);
        assert!(
            insert_canaries(
                &mut t,
                &lm,
                &opts,
                CanaryKind::Mislabel,
                &mut ChaCha20Rng::seed_from_u64(3)
            )
            .is_err()
        );
    }

    fn run(cfg: &RunConfig, opts: &AuditOptions, tamper: Tamper) -> AuditReport {
        // One libtorch thread: the machine's cores may be busy (OpenMP spinning would stall).
        tch::set_num_threads(1);
        let dir = tempfile::tempdir().unwrap();
        let t = std::time::Instant::now();
        let mut quiet = |_: u64, _: u64, _: &crate::trainer::UpdateMetrics, _: Option<f64>| {};
        let r = audit_impl(cfg, opts, dir.path(), &mut quiet, tamper).unwrap();
        let back = read_report(&r.run).unwrap();
        assert_eq!(
            (back.coins.as_slice(), back.search.correct),
            (r.coins.as_slice(), r.search.correct)
        );
        assert!(r.run.join("record.json").exists());
        let mean = |v: &[f64], want: bool| {
            let x: Vec<f64> = v
                .iter()
                .zip(&r.coins)
                .filter(|(_, c)| **c == want)
                .map(|(a, _)| *a)
                .collect();
            x.iter().sum::<f64>() / x.len().max(1) as f64
        };
        eprintln!(
            "members init {:.3} final {:.3}; non-members init {:.3} final {:.3}",
            mean(&r.initial_losses, true),
            mean(&r.final_losses, true),
            mean(&r.initial_losses, false),
            mean(&r.final_losses, false)
        );
        eprintln!(
            "{:?} eps target {} lower {:.3} upper {:?} (k+ {}, k- {}, {}/{} correct, included {}/{}, N {}, mia {:?}) in {:.1}s",
            tamper,
            r.epsilon_target,
            r.epsilon_lower,
            r.epsilon_upper,
            r.search.k_plus,
            r.search.k_minus,
            r.search.correct,
            r.search.guesses,
            r.included,
            r.canaries,
            r.train_records,
            r.mia.map(|m| m.auc),
            t.elapsed().as_secs_f64()
        );
        r
    }

    /// The audit can fail: without noise and clipping, the canaries are memorized and ε_lower
    /// lies far above the claimed ε = 1.
    #[test]
    fn audit_catches_a_mechanism_without_noise_or_clipping() {
        let cfg = small_cfg(1.0);
        let opts = AuditOptions {
            canaries: Some(300),
            kind: Some(CanaryKind::Random),
            ..AuditOptions::default()
        };
        let r = run(&cfg, &opts, Tamper::BreakMechanism);
        assert_eq!(r.epsilon_target, 1.0);
        assert_eq!(r.epsilon_upper, None, "σ = 0 releases are not accounted");
        assert!(
            r.epsilon_lower > 2.0,
            "ε_lower {} on a broken mechanism claimed at ε = 1",
            r.epsilon_lower
        );
        assert!(r.mia.unwrap().auc > 0.9);
    }

    /// On correct runs (ε = 1 and ε = 8) the empirical lower bound stays below the certified
    /// upper bound.
    #[test]
    fn audit_lower_bound_is_below_the_certified_bound_on_correct_runs() {
        let opts = AuditOptions {
            canaries: Some(300),
            kind: Some(CanaryKind::Random),
            ..AuditOptions::default()
        };
        for eps in [1.0, 8.0] {
            let r = run(&small_cfg(eps), &opts, Tamper::None);
            let upper = r.epsilon_upper.unwrap();
            assert!(
                upper <= eps * (1.0 + 1e-9),
                "certified {upper} above target {eps}"
            );
            assert!(
                r.epsilon_lower <= upper,
                "ε_lower {} > ε_upper {upper}",
                r.epsilon_lower
            );
            assert_eq!(r.coins.len(), 300);
            assert_eq!(r.train_records, r.real_records + r.included);
        }
    }

    // ---- White-box (Dirac) canaries ----

    fn dirac_run(cfg: &RunConfig, opts: &AuditOptions, tamper: Tamper) -> AuditReport {
        tch::set_num_threads(1);
        let dir = tempfile::tempdir().unwrap();
        let t = std::time::Instant::now();
        let mut quiet = |_: u64, _: u64, _: &crate::trainer::UpdateMetrics, _: Option<f64>| {};
        let r = audit_impl(cfg, opts, dir.path(), &mut quiet, tamper).unwrap();
        let back = read_report(&r.run).unwrap();
        assert_eq!(back.dirac, r.dirac);
        assert_eq!(back.search, r.search);
        eprintln!(
            "{:?} {} eps target {} lower {:.3} upper {:?} stream {:?} ({} k+ {} k- {}, {}/{} correct, included {}/{}, q {:.4}) in {:.1}s",
            tamper,
            r.method,
            r.epsilon_target,
            r.epsilon_lower,
            r.epsilon_upper,
            r.expert.as_ref().map(|x| x.epsilon_stream),
            r.dirac.as_ref().map_or("", |d| d.statistic.as_str()),
            r.search.k_plus,
            r.search.k_minus,
            r.search.correct,
            r.search.guesses,
            r.included,
            r.canaries,
            r.sampling_rate,
            t.elapsed().as_secs_f64()
        );
        r
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Canaries get distinct coordinates inside their parameters, their parameter's value,
        /// and the design seed alone decides where.
        #[test]
        fn dirac_canaries_sit_at_distinct_coordinates(
            sizes in prop::collection::vec(1usize..300, 1..6),
            frac in 0.0f64..1.0,
            seed in any::<u64>(),
        ) {
            let params: BTreeMap<String, f64> = sizes
                .iter()
                .enumerate()
                .map(|(i, _)| (format!("p{i}"), 0.25 + i as f64))
                .collect();
            let numel: BTreeMap<String, usize> =
                sizes.iter().enumerate().map(|(i, &n)| (format!("p{i}"), n)).collect();
            let total: usize = sizes.iter().sum();
            let m = ((frac * total as f64) as usize).clamp(1, total);
            let c = place_dirac(&params, &numel, m, seed).unwrap();
            prop_assert_eq!(c.len(), m);
            let mut seen = std::collections::BTreeSet::new();
            for d in &c {
                prop_assert!(d.index >= 0 && (d.index as usize) < numel[&d.param]);
                prop_assert_eq!(d.value, params[&d.param]);
                prop_assert!(seen.insert((d.param.clone(), d.index)));
            }
            prop_assert_eq!(&c, &place_dirac(&params, &numel, m, seed).unwrap());
            prop_assert!(place_dirac(&params, &numel, total + 1, seed).is_err());
        }
    }

    /// The audited parameters and their values on real plans: every released parameter (the
    /// smallest bound that holds it), or one expert's, which a method without expert streams
    /// cannot give.
    #[test]
    fn dirac_parameters_follow_the_plan() {
        let cfg = toy_switch(Method::Raptor, 4.0, 100, 4);
        let mut s = prepare_counting(&cfg, None, 50).unwrap();
        assert_eq!(s.plan.q, cfg.train.batch_size / 650.0);
        let layer = s.layer.as_ref().map(|l| l.layer);
        let all = dirac_params(&s.plan, layer, None).unwrap();
        assert_eq!(all.keys().cloned().collect::<Vec<_>>(), s.plan.params());
        let e2 = dirac_params(&s.plan, layer, Some(2)).unwrap();
        assert!(!e2.is_empty());
        for (p, v) in &e2 {
            assert!(p.contains("expert_2."), "{p}");
            assert_eq!(*v, cfg.train.clip_expert);
        }
        assert!(dirac_params(&s.plan, layer, Some(4)).is_err()); // 4 experts: 0..3
        // A smaller bound anywhere lowers the value.
        let g = &mut s.plan.phases[0].groups[0];
        g.bound = 0.125;
        let p0 = g.params[0].clone();
        assert_eq!(dirac_params(&s.plan, layer, None).unwrap()[&p0], 0.125);
        let mono = crate::session::prepare(&toy_switch(Method::DpAdamLora, 4.0, 100, 4)).unwrap();
        assert!(dirac_params(&mono.plan, None, Some(0)).is_err());
    }

    /// A drawn canary moves the release that carries its coordinate by exactly its value (in
    /// units of the planned noise std: v/(σΔ)), and nothing else: two runs that differ only in
    /// the coins (every canary in, every canary out; q = 1, the same seeds, so the same real
    /// records and the same noise) differ by exactly that at every canary, on every release
    /// that carries it, and the per-expert canaries appear only in expert updates.
    #[test]
    fn a_drawn_canary_moves_its_release_by_exactly_its_value() {
        for (method, expert) in [(Method::DpAdamLora, None), (Method::Raptor, Some(1))] {
            let m = 40;
            let mut cfg = toy_switch(method, 4.0, m, 3);
            // 60 real records (q = 1 makes every update see all of them).
            let data = tempfile::tempdir().unwrap();
            let text = std::fs::read_to_string(&cfg.data.train).unwrap();
            let head: Vec<&str> = text.lines().take(61).collect();
            cfg.data.train = data.path().join("train.csv");
            std::fs::write(&cfg.data.train, head.join("\n") + "\n").unwrap();
            cfg.train.batch_size = (60 + m / 2) as f64; // q = 1
            cfg.train.lr = 1e-12; // the parameters (hence the real gradients) stay put
            let opts = AuditOptions {
                canaries: Some(m),
                kind: Some(CanaryKind::Dirac),
                expert,
                ..AuditOptions::default()
            };
            let dir = tempfile::tempdir().unwrap();
            let mut quiet = |_: u64, _: u64, _: &crate::trainer::UpdateMetrics, _: Option<f64>| {};
            let mut go = |coins: Vec<bool>| {
                audit_dirac(&cfg, &opts, dir.path(), &mut quiet, Tamper::None, coins).unwrap()
            };
            let inn = go(vec![true; m]);
            let out = go(vec![false; m]);
            assert_eq!(inn.sampling_rate, 1.0);
            assert_eq!(inn.epsilon_upper, out.epsilon_upper);
            let (a, b) = (inn.dirac.unwrap(), out.dirac.unwrap());
            assert_eq!((&a.param, &a.index), (&b.param, &b.index));
            let phases = crate::session::prepare_counting(&cfg, None, m / 2)
                .unwrap()
                .plan;
            let sigma = |param: &str| {
                phases
                    .phases
                    .iter()
                    .find_map(|ph| {
                        ph.releases.iter().find_map(|r| {
                            let g = ph.group(&r.groups[0])?;
                            g.params
                                .iter()
                                .any(|p| p == param)
                                .then(|| (r.sigma, ph.sensitivity(r).unwrap()))
                        })
                    })
                    .unwrap()
            };
            for i in 0..m {
                let p = &a.params[a.param[i]];
                let (s, delta) = sigma(p);
                let n = a.releases[i];
                assert_eq!(n, b.releases[i]);
                let want = match expert {
                    None => 3,
                    // alternating 1:1, ending on a shared update: 1 expert update of 3
                    Some(_) => 1,
                };
                assert_eq!(n, want, "canary {i} in {p}");
                // Σ over n releases, reported as Σ/√n.
                let diff = (a.sum_scores[i] - b.sum_scores[i]) * (n as f64).sqrt();
                let exact = n as f64 * a.value[i] / (s * delta);
                assert!(
                    (diff - exact).abs() <= 1e-3 * exact.max(1.0),
                    "canary {i} in {p}: moved {diff}, value/(σΔ) × {n} = {exact}"
                );
            }
        }
    }

    /// The quick check, through the public path of the planted bugs: at m = 10,000 canaries and
    /// 30 updates, a run without noise charged at ε = 1 is caught (ε_lower above the certified
    /// ε), and the same run without the bug is not (ε_lower ≤ ε_upper). Its audit file sits
    /// under `private/`, marked, and nothing of it at the top of the run folder.
    #[test]
    fn a_planted_bug_is_caught_and_the_correct_run_is_not() {
        tch::set_num_threads(1);
        let m = 10_000;
        let cfg = toy_switch(Method::DpAdamLora, 1.0, m, 30);
        let opts = AuditOptions {
            canaries: Some(m),
            ..AuditOptions::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let mut quiet = |_: u64, _: u64, _: &crate::trainer::UpdateMetrics, _: Option<f64>| {};
        let bad = planted::audit_with_fault(&cfg, &opts, dir.path(), &mut quiet, NoiseFault::Off)
            .unwrap();
        let good = audit(&cfg, &opts, dir.path(), &mut quiet).unwrap();
        for r in [&bad, &good] {
            assert_eq!(r.kind, CanaryKind::Dirac);
            assert_eq!(r.notice, crate::run::PRIVATE_NOTICE);
            assert_eq!(&read_report(&r.run).unwrap(), r);
            assert!(r.run.join("private").join("audit.json").is_file());
            assert!(!r.run.join("audit.json").exists());
            let record: serde_json::Value =
                serde_json::from_slice(&std::fs::read(r.run.join("record.json")).unwrap()).unwrap();
            for key in ["coins", "scores", "mia", "dirac", "epsilon_lower"] {
                assert!(record.get(key).is_none(), "record.json has {key}");
            }
            let notes = record["notes"].as_array().unwrap();
            assert!(
                notes
                    .iter()
                    .any(|n| n.as_str().unwrap().starts_with("audit run"))
            );
        }
        let (upper_bad, upper_good) = (bad.epsilon_upper.unwrap(), good.epsilon_upper.unwrap());
        eprintln!(
            "no noise: ε_lower {:.3}; correct: ε_lower {:.3}; certified {:?}",
            bad.epsilon_lower, good.epsilon_lower, good.epsilon_upper
        );
        // The ledger charges the plan either way: the bug is invisible to it.
        assert_eq!(upper_bad, upper_good);
        assert!(upper_good <= 1.0 + 1e-9);
        assert!(
            bad.epsilon_lower > upper_bad,
            "planted bug not caught: ε_lower {} ≤ certified {upper_bad}",
            bad.epsilon_lower
        );
        assert!(
            good.epsilon_lower <= upper_good,
            "correct run: ε_lower {} > certified {upper_good}",
            good.epsilon_lower
        );
        // A planted bug needs white-box canaries.
        let loss = AuditOptions {
            kind: Some(CanaryKind::Random),
            ..opts.clone()
        };
        assert!(
            planted::audit_with_fault(&cfg, &loss, dir.path(), &mut quiet, NoiseFault::Half)
                .is_err()
        );
    }

    /// The audit catches each planted noise bug: ε_lower clearly above the ε the ledger
    /// certifies (the whole run's, and for the expert bug the expert stream's alone too).
    #[test]
    fn white_box_audit_catches_planted_noise_bugs() {
        let m = 40_000;
        let opts = |expert| AuditOptions {
            canaries: Some(m),
            kind: Some(CanaryKind::Dirac),
            expert,
            ..AuditOptions::default()
        };
        // No noise at all, charged at ε = 1.
        let r = dirac_run(
            &toy_switch(Method::DpAdamLora, 1.0, m, 100),
            &opts(None),
            Tamper::Noise(NoiseFault::Off),
        );
        let upper = r.epsilon_upper.unwrap();
        assert!(upper <= 1.0 + 1e-9);
        assert!(
            r.epsilon_lower > 3.0 * upper,
            "{} vs {upper}",
            r.epsilon_lower
        );
        // Half the planned σ, charged at ε = 1.
        let r = dirac_run(
            &toy_switch(Method::DpAdamLora, 1.0, m, 100),
            &opts(None),
            Tamper::Noise(NoiseFault::Half),
        );
        let upper = r.epsilon_upper.unwrap();
        assert!(
            r.epsilon_lower > 1.3 * upper,
            "{} vs {upper}",
            r.epsilon_lower
        );
        // RAPTOR's expert stream at half its σ, canaries in expert 0, charged at ε = 1.
        let r = dirac_run(
            &toy_switch(Method::Raptor, 1.0, m, 200),
            &opts(Some(0)),
            Tamper::Noise(NoiseFault::HalfExperts),
        );
        let upper = r.epsilon_upper.unwrap();
        let stream = r.expert.as_ref().unwrap().epsilon_stream.unwrap();
        assert!(stream < upper);
        assert!(
            r.epsilon_lower > 1.5 * stream,
            "{} vs {stream}",
            r.epsilon_lower
        );
        assert!(
            r.epsilon_lower > 1.2 * upper,
            "{} vs {upper}",
            r.epsilon_lower
        );
    }

    /// On correct runs the white-box bound stays at or below the certified one: the whole run
    /// at ε = 1 and 8, and RAPTOR's expert stream against its own ε.
    #[test]
    fn white_box_audit_stays_below_the_certified_bound_on_correct_runs() {
        let m = 40_000;
        for eps in [1.0, 8.0] {
            let opts = AuditOptions {
                canaries: Some(m),
                kind: Some(CanaryKind::Dirac),
                ..AuditOptions::default()
            };
            let r = dirac_run(
                &toy_switch(Method::DpAdamLora, eps, m, 100),
                &opts,
                Tamper::None,
            );
            let upper = r.epsilon_upper.unwrap();
            assert!(upper <= eps * (1.0 + 1e-9));
            assert!(r.epsilon_lower <= upper, "{} > {upper}", r.epsilon_lower);
            assert_eq!(r.coins.len(), m);
            assert_eq!(r.train_records, r.real_records + r.included);
            let d = r.dirac.unwrap();
            assert_eq!(d.plan_records, r.real_records + m / 2);
            assert!(d.releases.iter().all(|&n| n == 100));
        }
        let opts = AuditOptions {
            canaries: Some(m),
            kind: Some(CanaryKind::Dirac),
            expert: Some(0),
            ..AuditOptions::default()
        };
        let r = dirac_run(
            &toy_switch(Method::Raptor, 1.0, m, 200),
            &opts,
            Tamper::None,
        );
        let stream = r.expert.as_ref().unwrap().epsilon_stream.unwrap();
        assert!(r.epsilon_lower <= stream, "{} > {stream}", r.epsilon_lower);
        assert!(stream < r.epsilon_upper.unwrap());
        let d = r.dirac.unwrap();
        assert!(d.params.iter().all(|p| p.contains("expert_0.")));
        assert!(d.releases.iter().all(|&n| n == 100)); // the expert half of 200 updates
    }
}
