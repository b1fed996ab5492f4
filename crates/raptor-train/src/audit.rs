//! `raptor audit`: an empirical ε lower bound from one training run with canaries (Steinke,
//! Nasr & Jagielski 2023, "Privacy auditing with one (1) training run"), beside the certified ε
//! upper bound of the run's ledger.
//!
//! 1. The run is prepared as training prepares it. `m` canaries are built (default
//!    `min(200, N/4)`): kind [`CanaryKind::Mislabel`] draws `m` training records (deterministic
//!    given the design seed `--seed`), **removes them from the training set** and gives each a
//!    different label, chosen uniformly among the other classes (so the only evidence of a
//!    canary's label is the canary itself); kind [`CanaryKind::Random`] builds random token
//!    sequences of the data's median length, with uniform random labels (classifiers) or as
//!    text (language models). Canaries get fresh record ids above every training and validation
//!    id (LoRA dropout masks are keyed by record id).
//! 2. Each canary is included independently with probability ½: a secret coin from the OS
//!    CSPRNG, or derived from `train.insecure_seed` when it is set (reproducible, NOT private).
//!    The coins are written only to `audit.json`.
//! 3. One training run with the run's config on the training records ∪ the included canaries,
//!    into a run folder `<runs-dir>/audit-<method>-<time>-<pid>`: same method, same privacy
//!    target. The plan is made for the actual N (real records + included canaries), so q = B/N,
//!    δ (when not set) and σ are those of that N; `record.json` records them.
//! 4. Each canary is scored by its loss under the initial model minus its loss under the trained
//!    model (higher: more likely a member). [`raptor_eval::audit::audit_search`] over the
//!    (k₊, k₋) grid [`raptor_eval::audit::default_grid`] (Bonferroni-corrected for the search)
//!    turns the guesses into ε_lower at the stated confidence for the run's δ. The loss-difference
//!    attack is also reported as a membership-inference attack on the canaries (members vs
//!    non-members: AUC, TPR at 1 % and 0.1 % FPR).
//! 5. `audit.json` beside `record.json` holds everything: m, kind, coins, losses, scores, the
//!    chosen (k₊, k₋), guesses, correct guesses, ε_lower, the confidence, the certified ε_upper
//!    of the ledger (None for non-private methods: ε = ∞) and δ.
//!
//! An audit run folder must not be resumed with `raptor train --resume` (the canaries are not in
//! its config); its record carries a note saying so.

use std::path::{Path, PathBuf};

use rand::seq::index::sample;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use raptor_eval::audit::{AuditResult, audit_search, default_grid};
use raptor_eval::mia::{MiaReport, mia_report};
use raptor_models::Model;
use serde::{Deserialize, Serialize};
use tch::Device;

use crate::config::RunConfig;
use crate::error::{Result, TrainError, io};
use crate::run::{Progress, new_run_id, train_session, write_atomic};
use crate::session::{DataInfo, is_classifier, prepare_with};
use crate::trainer::Example;

/// The default number of canaries (fewer when the training set is small: at most N/4).
pub const DEFAULT_CANARIES: usize = 200;

/// How canaries are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum CanaryKind {
    /// Training records with a different label (classifiers only).
    Mislabel,
    /// Random token sequences of the data's median length (random labels for classifiers).
    Random,
}

impl CanaryKind {
    /// The name used on the command line and in `audit.json`.
    pub fn name(self) -> &'static str {
        match self {
            CanaryKind::Mislabel => "mislabel",
            CanaryKind::Random => "random",
        }
    }
}

/// What `raptor audit` is asked for (besides the run config).
#[derive(Debug, Clone, PartialEq)]
pub struct AuditOptions {
    /// Number of canaries; None: `min(200, N/4)`. An explicit count must be ≥ 2 and, for
    /// mislabeled canaries, at most N/2 (half of the real records stay).
    pub canaries: Option<usize>,
    /// Canary kind; None: `mislabel` for classifiers, `random` for language models.
    pub kind: Option<CanaryKind>,
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
            confidence: raptor_eval::audit::DEFAULT_CONFIDENCE,
            design_seed: 0,
        }
    }
}

/// Everything an audit reports (`audit.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AuditReport {
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
    /// Records N the run trained on (real records + included canaries); q = B/N.
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
    /// The run's target ε (∞ for non-private methods).
    pub epsilon_target: f64,
    /// The run's δ.
    pub delta: f64,
    /// The loss-difference attack as membership inference on the canaries (None when every
    /// coin fell the same way).
    pub mia: Option<MiaReport>,
    /// Notes.
    pub notes: Vec<String>,
}

/// A test-only switch (the enum has no other value outside tests: neither the CLI nor the
/// config can reach it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tamper {
    /// The mechanism as planned.
    None,
    /// No noise (σ = 0) and no clipping (bounds 10³⁰): a broken mechanism the audit must catch.
    #[cfg(test)]
    BreakMechanism,
}

#[cfg_attr(not(test), allow(unused_variables))]
fn apply_tamper(plan: &mut crate::streams::Plan, tamper: Tamper) {
    match tamper {
        Tamper::None => {}
        #[cfg(test)]
        Tamper::BreakMechanism => tests::break_mechanism(plan),
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
/// `runs_dir`, scores the canaries and writes `audit.json` there.
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
    let kind = opts.kind.unwrap_or(if classifier {
        CanaryKind::Mislabel
    } else {
        CanaryKind::Random
    });
    let mut coin_rng = match cfg.train.insecure_seed {
        Some(s) => ChaCha20Rng::seed_from_u64(s ^ 0x5eed_a0d1_c0de_c01d),
        None => ChaCha20Rng::from_os_rng(),
    };
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
    let members: Vec<f64> = scores
        .iter()
        .zip(&canaries.coins)
        .filter(|(_, c)| **c)
        .map(|(s, _)| *s)
        .collect();
    let non_members: Vec<f64> = scores
        .iter()
        .zip(&canaries.coins)
        .filter(|(_, c)| !**c)
        .map(|(s, _)| *s)
        .collect();
    let mia = if members.is_empty() || non_members.is_empty() {
        None
    } else {
        Some(mia_report(&members, &non_members).map_err(eval_err)?)
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
    let report = AuditReport {
        run: dir.clone(),
        method: record.method.clone(),
        kind,
        canaries: m,
        design_seed: opts.design_seed,
        insecure_seeded: cfg.train.insecure_seed.is_some(),
        real_records: canaries.real_records,
        train_records: record.train_records,
        sampling_rate: record.privacy_plan.q,
        included: members.len(),
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
        notes,
    };
    write_atomic(
        &dir.join("audit.json"),
        &serde_json::to_vec_pretty(&report)?,
    )?;
    record.notes.push(format!(
        "audit run: trained on {} real records and {} of {} canaries (audit.json); do not resume it with raptor train --resume",
        report.real_records, report.included, report.canaries
    ));
    write_atomic(
        &dir.join("record.json"),
        &serde_json::to_vec_pretty(&record)?,
    )?;
    Ok(report)
}

/// Reads the `audit.json` of a run folder.
pub fn read_report(run: &Path) -> Result<AuditReport> {
    let p = run.join("audit.json");
    Ok(serde_json::from_slice(&std::fs::read(&p).map_err(io(&p))?)?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::config::{Method, ModelKind};
    use crate::streams::Plan;

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

    fn toy() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/toy")
    }

    /// A tiny GPT-2 language model on the toy text (16 byte tokens), DP-Adam over every
    /// parameter, 200 updates of B = 64 at a high learning rate: random-token canaries are
    /// memorized quickly once noise and clipping are off.
    fn small_cfg(epsilon: f64) -> RunConfig {
        let (steps, lr) = (300, 0.02);
        let mut c = RunConfig::default();
        c.data.train = toy().join("train.csv");
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
}
