//! Reproduce part `dpmuon`: DP-Adam vs DP-Muon vs DP-MuonBC on data-to-text, designed so the
//! experiment can tell the methods apart, as a curve over the signal per update.
//!
//! For each target task (E2E-cleaned, DART without its E2E-derived entries) the public corpus
//! is the *other* task ([`data`]): a byte-level BPE tokenizer and a GPT-2-style decoder are
//! pretrained on it (non-private, public data only), then fine-tuned on the target's dev pairs
//! (private) and scored on the target's test references (NLL, BLEU, ROUGE-L). The files come
//! from the per-user cache ([`d2t_inputs`]: pinned releases checked by SHA-256, fetched on first
//! use or copied from `--d2t-data` / the shared data folder).
//!
//! The grid is a list of **settings** (expected batch B, ε) at a fixed number of epochs, so a
//! larger B means fewer, less noisy updates ([`Setting`], [`Scale::steps`]); every task runs the
//! first setting (the main table), the curve tasks run them all (the curve table). In every
//! cell (a task at a setting):
//!
//! 1. **Pretrained start** (no private update) and a **positive control** per metric
//!    (non-private Adam at the cell's B): NLL verdicts count only where Adam lowers the test NLL
//!    below the start, BLEU verdicts only where it raises BLEU above the start's.
//! 2. **Learning rates chosen on public data only**: every method's learning rate is picked
//!    from a small grid by a public proxy run — the cell's fine-tuning (same σ, expected batch,
//!    updates, clip; as many records as the private set) on a held-out part of the public
//!    corpus, scored on another held-out public part. The Muon methods' non-matrix parameters
//!    use the AdamW rate chosen for DP-Adam (for non-private Muon: Adam's) in the same cell.
//!    Nothing is tuned on the private or test data.
//! 3. **Paired seeds**: every method runs the same seeds (same initialization seed, Poisson
//!    sampler and noise seeds); the report gives per-seed paired differences with 95 % CIs and
//!    a verdict per ordering by the decision rule written above the numbers.
//! 4. **Noise where it matters** ([`bias`]): the DP-Muon and DP-MuonBC runs of the first seed
//!    keep their released Newton–Schulz inputs at a few updates; the noise share of those
//!    buffers places each setting on the curve, and Newton–Schulz's noise bias is measured on
//!    them.
//!
//! The non-private references (Adam, Muon) run once per expected batch of a task (they do not
//! depend on ε). The noise and the Poisson sampler are seeded (`train.insecure_seed`) so that
//! the tables reproduce: the mechanism and the certified ε are those of a private run, but
//! these runs are not private releases.

mod bias;
pub mod data;
mod report;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use raptor_models::tokenizer::CorpusModel;
use raptor_train::config::Choice as _;
use raptor_train::config::{
    DataFormat, DeviceSpec, Method, MethodConfig, ModelKind, RunConfig, TokenizerSpec,
};

use crate::context::{Context, Dims, Profile, ProfileScale, Schedule, Table};
use crate::paper::runs::{Job, Placed, Runner, Summary};
use crate::paper::{D2tTask, Inputs, fit_batch, label, pretrain, seeded};

/// The environment variable naming a GPT-2 checkpoint folder (Hugging Face layout:
/// `config.json`, `model.safetensors`, `tokenizer.json`) for `--full`: the runs then fine-tune
/// it instead of a decoder pretrained here.
pub const GPT2_ENV: &str = "RAPTOR_DPMUON_GPT2";

/// The private methods compared, at every setting.
pub const PRIVATE: [Method; 3] = [Method::DpAdam, Method::DpMuon, Method::DpMuonbc];

/// The non-private references (Adam is also the positive control), once per expected batch.
pub const NON_PRIVATE: [Method; 2] = [Method::Adam, Method::Muon];

/// One point of the signal-per-update curve: the expected batch and the target ε of the
/// private runs (the updates follow from the profile's epochs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Setting {
    /// Expected batch B (Poisson sampling at rate B / N).
    pub batch: f64,
    /// Target ε of the private runs.
    pub epsilon: f64,
}

impl Setting {
    /// The label part naming the setting (`B=256`).
    pub fn variant(&self) -> String {
        format!("B={}", self.batch)
    }
}

/// Sizes of one profile.
#[derive(Debug, Clone)]
pub struct Scale {
    /// Seeds, paired across methods.
    pub seeds: Vec<u64>,
    /// The curve's settings; the first is the main table's (every task runs it).
    pub settings: Vec<Setting>,
    /// The tasks that run every setting (the others run the first only).
    pub curve_tasks: Vec<&'static str>,
    /// Epochs of private fine-tuning, the same at every setting: updates = epochs · N / B.
    pub epochs: f64,
    /// The fewest updates of a run.
    pub min_steps: u64,
    /// Tokenizer vocabulary.
    pub vocab: usize,
    /// Tokens per record.
    pub max_len: usize,
    /// Decoder width, blocks, heads, FFN size.
    pub dec: Dims,
    /// Pretraining updates, batch, learning rate.
    pub pretrain: Schedule,
    /// Per-example clipping bound.
    pub clip: f64,
    /// Learning-rate grid of AdamW (DP-Adam, Adam).
    pub adam_lrs: Vec<f64>,
    /// Learning-rate grid of the Muon matrices (DP-Muon, DP-MuonBC, Muon).
    pub muon_lrs: Vec<f64>,
    /// Data sizes.
    pub sizes: data::Sizes,
    /// Longest generation.
    pub new_tokens: usize,
    /// Times a tapped run keeps its Newton–Schulz inputs (evenly over its updates)…
    pub taps: u64,
    /// …for at most this many matrices.
    pub tap_matrices: usize,
    /// Noise draws per bias estimate.
    pub bias_draws: usize,
    /// Evaluations of the test NLL during the first seed's runs (curves).
    pub curve_points: u64,
}

impl Scale {
    /// Updates of a run at `setting` on `n` private records: `epochs · n / B` rounded, at least
    /// [`Scale::min_steps`].
    pub fn steps(&self, setting: &Setting, n: usize) -> u64 {
        let b = fit_batch(setting.batch, n);
        ((self.epochs * n as f64 / b).round() as u64).max(self.min_steps)
    }
}

fn e2e_curve(bs: &[f64], eps1_at_largest: bool) -> Vec<Setting> {
    let mut v: Vec<Setting> = bs
        .iter()
        .map(|&batch| Setting {
            batch,
            epsilon: 8.0,
        })
        .collect();
    if eps1_at_largest && let Some(&batch) = bs.last() {
        v.push(Setting {
            batch,
            epsilon: 1.0,
        });
    }
    v
}

impl ProfileScale for Scale {
    /// The test profile: tiny models, a few updates, a two-point curve on E2E.
    fn quick() -> Self {
        Self {
            seeds: vec![0, 1],
            settings: vec![
                Setting {
                    batch: 16.0,
                    epsilon: 8.0,
                },
                Setting {
                    batch: 16.0,
                    epsilon: 1.0,
                },
            ],
            curve_tasks: vec!["e2e"],
            epochs: 1.0,
            min_steps: 2,
            vocab: 200,
            max_len: 40,
            dec: Dims {
                width: 16,
                blocks: 1,
                heads: 2,
                ffn: 32,
                experts: 0,
            },
            pretrain: Schedule {
                updates: 6,
                batch: 16.0,
                lr: 5e-3,
            },
            clip: 1.0,
            adam_lrs: vec![1e-3, 1e-2],
            muon_lrs: vec![1e-2, 5e-2],
            sizes: data::Sizes {
                test_sources: 4,
                max_private: 0,
                proxy_val_sources: 3,
            },
            new_tokens: 8,
            taps: 2,
            tap_matrices: 2,
            bias_draws: 8,
            curve_points: 2,
        }
    }

    /// `cargo xtask reproduce` (no profile flag): the curve on E2E (B = 64, 256, 1024 at
    /// ε = 8 and ε = 1 at B = 1024, the same epochs), DART at B = 64 only, 2 paired seeds, a
    /// small decoder.
    fn small() -> Self {
        Self {
            seeds: vec![0, 1],
            settings: e2e_curve(&[64.0, 256.0, 1024.0], true),
            curve_tasks: vec!["e2e"],
            epochs: 0.6,
            min_steps: 3,
            vocab: 800,
            max_len: 64,
            dec: Dims {
                width: 48,
                blocks: 2,
                heads: 4,
                ffn: 192,
                experts: 0,
            },
            pretrain: Schedule {
                updates: 300,
                batch: 32.0,
                lr: 3e-3,
            },
            clip: 1.0,
            adam_lrs: vec![1e-3, 3e-3],
            muon_lrs: vec![3e-3, 1e-2],
            sizes: data::Sizes {
                test_sources: 20,
                max_private: 0,
                proxy_val_sources: 20,
            },
            new_tokens: 24,
            taps: 4,
            tap_matrices: 4,
            bias_draws: 50,
            curve_points: 2,
        }
    }

    /// `cargo xtask reproduce --standard` on 2 CPU cores: the curve B = 64, 256, 1024 at
    /// ε = 8 and ε = 1 at B = 1024, on both tasks, 3 paired seeds.
    fn standard() -> Self {
        Self {
            seeds: vec![0, 1, 2],
            settings: e2e_curve(&[64.0, 256.0, 1024.0], true),
            curve_tasks: vec!["e2e", "dart"],
            epochs: 1.0,
            min_steps: 4,
            vocab: 1000,
            max_len: 64,
            dec: Dims {
                width: 64,
                blocks: 2,
                heads: 4,
                ffn: 256,
                experts: 0,
            },
            pretrain: Schedule {
                updates: 600,
                batch: 32.0,
                lr: 3e-3,
            },
            clip: 1.0,
            adam_lrs: vec![3e-4, 1e-3, 3e-3],
            muon_lrs: vec![1e-3, 3e-3, 1e-2],
            sizes: data::Sizes {
                test_sources: 40,
                max_private: 0,
                proxy_val_sources: 40,
            },
            new_tokens: 32,
            taps: 4,
            tap_matrices: 8,
            bias_draws: 100,
            curve_points: 4,
        }
    }

    /// `--full`: the paper-sized setting for a GPU (a GPT-2 small checkpoint through
    /// [`GPT2_ENV`], else a larger decoder pretrained here), every test source.
    fn full() -> Self {
        Self {
            seeds: vec![0, 1, 2, 3, 4],
            settings: e2e_curve(&[256.0, 1024.0, 2048.0], true),
            curve_tasks: vec!["e2e", "dart"],
            epochs: 20.0,
            min_steps: 10,
            vocab: 8000,
            max_len: 128,
            dec: Dims {
                width: 256,
                blocks: 6,
                heads: 4,
                ffn: 1024,
                experts: 0,
            },
            pretrain: Schedule {
                updates: 3000,
                batch: 64.0,
                lr: 1e-3,
            },
            clip: 1.0,
            adam_lrs: vec![3e-4, 1e-3, 3e-3],
            muon_lrs: vec![5e-3, 2e-2, 5e-2],
            sizes: data::Sizes {
                test_sources: 0,
                max_private: 0,
                proxy_val_sources: 200,
            },
            new_tokens: 64,
            taps: 4,
            tap_matrices: 12,
            bias_draws: 200,
            curve_points: 10,
        }
    }
}

/// One target task ready to run: its files, tokenizer and starting model.
struct Prepared {
    corpora: data::Corpora,
    tok: PathBuf,
    /// The pretraining run (None: a user-given checkpoint).
    pre: Option<pretrain::Pretraining>,
    /// The model every fine-tuning run starts from.
    start: PathBuf,
}

/// What the pretrained model scores on the test set (no private update).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct StartScore {
    /// Mean token NLL of the test references.
    pub nll: f64,
    /// Corpus BLEU.
    pub bleu: Option<f64>,
    /// ROUGE-L F.
    pub rouge_l: Option<f64>,
}

/// A learning rate picked by the public proxy.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct LrChoice {
    /// The method.
    pub method: String,
    /// Grid points: (learning rate, proxy validation NLL; None when the run gave none).
    pub grid: Vec<(f64, Option<f64>)>,
    /// The chosen learning rate (the tuned one: `train.lr` for DP-Adam/Adam, `muon_lr` for the
    /// Muon methods).
    pub lr: f64,
    /// AdamW learning rate of the non-matrix parameters (Muon methods), else `lr`.
    pub adam_lr: f64,
    /// Noise multiplier σ of the proxy runs (from their records; None: non-private).
    pub sigma: Option<f64>,
}

fn tuned_is_muon(m: Method) -> bool {
    matches!(m, Method::DpMuon | Method::DpMuonbc | Method::Muon)
}

/// One cell of the grid: a task at a setting.
#[derive(Debug, Clone)]
struct Cell {
    /// Index of the task in the prepared list.
    task: usize,
    /// The setting.
    setting: Setting,
    /// Updates of every run of the cell.
    steps: u64,
    /// Whether the non-private references run here (the first cell of each expected batch).
    references: bool,
}

impl Cell {
    fn methods(&self) -> Vec<Method> {
        let mut v = PRIVATE.to_vec();
        if self.references {
            v.extend(NON_PRIVATE);
        }
        v
    }
}

/// The cells of the prepared tasks: every task at the first setting, the curve tasks at the
/// others.
fn cells(prepared: &[Prepared], s: &Scale) -> Vec<Cell> {
    let mut out: Vec<Cell> = Vec::new();
    for (i, p) in prepared.iter().enumerate() {
        let curve = s.curve_tasks.contains(&p.corpora.task.as_str());
        for (k, st) in s.settings.iter().enumerate() {
            if k > 0 && !curve {
                continue;
            }
            let references = !out
                .iter()
                .any(|c| c.task == i && c.setting.batch == st.batch);
            out.push(Cell {
                task: i,
                setting: *st,
                steps: s.steps(st, p.corpora.private_pairs),
                references,
            });
        }
    }
    out
}

/// The fine-tuning config shared by the proxy and the private runs of a cell.
fn base_cfg(
    p: &Prepared,
    s: &Scale,
    cell: &Cell,
    device: DeviceSpec,
    train: &Path,
    valid: &Path,
    n: usize,
) -> RunConfig {
    let mut c = RunConfig::default();
    c.data.format = DataFormat::E2e;
    c.data.train = train.to_path_buf();
    c.data.validation = Some(valid.to_path_buf());
    c.data.max_length = s.max_len;
    c.model.kind = ModelKind::Gpt2;
    c.model.path = Some(p.start.clone());
    c.model.tokenizer = TokenizerSpec::from(p.tok.as_path());
    c.train.steps = Some(cell.steps);
    c.train.batch_size = fit_batch(cell.setting.batch, n);
    c.train.micro_batch = 64;
    c.train.checkpoint_every = 0;
    c.train.device = device;
    c.train.eval_every = 0;
    c.train.clip = s.clip;
    c.privacy.epsilon = cell.setting.epsilon;
    c.privacy.accuracy = 1e-3;
    c.eval.max_sources = 0;
    c.eval.max_new_tokens = s.new_tokens;
    c
}

/// The proxy's config of a cell: the private run's, on the public proxy split, scored on NLL
/// only (one source, one generated token).
fn proxy_cfg(p: &Prepared, s: &Scale, cell: &Cell, device: DeviceSpec) -> RunConfig {
    let c = &p.corpora;
    let mut base = base_cfg(
        p,
        s,
        cell,
        device,
        &c.proxy_train,
        &c.proxy_val,
        c.proxy_pairs,
    );
    base.eval.max_sources = 1;
    base.eval.max_new_tokens = 1;
    base
}

fn with_method(mut c: RunConfig, m: Method, lr: f64, adam_lr: f64) -> RunConfig {
    // Every method at the full scope (the default), Muon's rate where it has Muon.
    c.method = MethodConfig::new(m);
    if let Some(muon) = c.method.muon_mut() {
        muon.muon_lr = lr;
    }
    if tuned_is_muon(m) {
        c.train.lr = adam_lr;
    } else {
        c.train.lr = lr;
    }
    c
}

fn eps_of(m: Method, st: &Setting) -> Option<f64> {
    m.is_private().then_some(st.epsilon)
}

/// The label of a cell's run.
fn run_label(task: &str, m: Method, st: &Setting, seed: u64) -> String {
    label(task, m.name(), &st.variant(), eps_of(m, st), seed)
}

fn proxy_label(task: &str, m: Method, lr: f64, st: &Setting, seed: u64) -> String {
    label(
        task,
        m.name(),
        &format!("{} proxy lr={lr}", st.variant()),
        eps_of(m, st),
        seed,
    )
}

fn grid(s: &Scale, m: Method) -> &[f64] {
    if tuned_is_muon(m) {
        &s.muon_lrs
    } else {
        &s.adam_lrs
    }
}

/// Proxy jobs of a cell's `methods` over their grids (`adam_lr`: the non-matrix rate of Muon
/// methods).
fn proxy_jobs(
    p: &Prepared,
    s: &Scale,
    cell: &Cell,
    device: DeviceSpec,
    methods: &[Method],
    adam_lr: &dyn Fn(Method) -> f64,
) -> Vec<Job> {
    let base = proxy_cfg(p, s, cell, device);
    let mut jobs = Vec::new();
    for &m in methods.iter().filter(|m| cell.methods().contains(m)) {
        for &lr in grid(s, m) {
            jobs.push(Job {
                label: proxy_label(&p.corpora.task, m, lr, &cell.setting, s.seeds[0]),
                cfg: seeded(with_method(base.clone(), m, lr, adam_lr(m)), s.seeds[0]),
            });
        }
    }
    jobs
}

/// σ of a finished run (its record's privacy plan), None when non-private or unreadable.
fn run_sigma(dir: &Path) -> Option<f64> {
    let bytes = std::fs::read(dir.join("record.json")).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let sigmas = v.get("privacy_plan")?.get("sigmas")?.as_object()?;
    sigmas
        .values()
        .filter_map(serde_json::Value::as_f64)
        .reduce(f64::max)
}

#[allow(clippy::too_many_arguments)]
fn choose(
    p: &Prepared,
    s: &Scale,
    cell: &Cell,
    m: Method,
    adam_lr: f64,
    out: &BTreeMap<String, Summary>,
    runner: &Runner,
    device: DeviceSpec,
) -> anyhow::Result<LrChoice> {
    let c = &p.corpora;
    let mut points = Vec::new();
    let mut best: Option<(f64, f64)> = None;
    for &lr in grid(s, m) {
        let l = out
            .get(&proxy_label(&c.task, m, lr, &cell.setting, s.seeds[0]))
            .and_then(|sm| sm.loss)
            .filter(|l| l.is_finite());
        points.push((lr, l));
        if let Some(l) = l
            && best.is_none_or(|(_, b)| l < b)
        {
            best = Some((lr, l));
        }
    }
    let (lr, _) = best.ok_or_else(|| {
        anyhow::anyhow!(
            "{} at {}: no proxy run of {} gave a validation NLL",
            c.task,
            cell.setting.variant(),
            m.name()
        )
    })?;
    let base = proxy_cfg(p, s, cell, device);
    let dir = runner.dir_of(&seeded(with_method(base, m, lr, adam_lr), s.seeds[0]))?;
    Ok(LrChoice {
        method: m.name().into(),
        grid: points,
        lr,
        adam_lr: if tuned_is_muon(m) { adam_lr } else { lr },
        sigma: run_sigma(&dir),
    })
}

/// The private grid of a cell with the chosen learning rates; the DP-Muon family's first-seed
/// runs keep their Newton–Schulz inputs.
fn main_jobs(
    p: &Prepared,
    s: &Scale,
    cell: &Cell,
    device: DeviceSpec,
    lrs: &BTreeMap<String, LrChoice>,
) -> Vec<(Job, bool)> {
    let c = &p.corpora;
    let base = base_cfg(p, s, cell, device, &c.train, &c.test, c.private_pairs);
    let mut jobs = Vec::new();
    for &seed in &s.seeds {
        for m in cell.methods() {
            let Some(ch) = lrs.get(m.name()) else {
                continue;
            };
            let mut cfg = with_method(base.clone(), m, ch.lr, ch.adam_lr);
            let first = Some(&seed) == s.seeds.first();
            if first {
                cfg.train.eval_every = (cell.steps / s.curve_points.max(1)).max(1);
            }
            let tap = first && matches!(m, Method::DpMuon | Method::DpMuonbc);
            jobs.push((
                Job {
                    label: run_label(&c.task, m, &cell.setting, seed),
                    cfg: seeded(cfg, seed),
                },
                tap,
            ));
        }
    }
    jobs
}

fn prepare(
    inputs: &Inputs,
    target: &D2tTask,
    other: &D2tTask,
    s: &Scale,
    gpt2: Option<&Path>,
) -> anyhow::Result<Prepared> {
    let corpora = data::build(target, other, s.sizes, &inputs.cache)?;
    if let Some(g) = gpt2 {
        let tok = g.join("tokenizer.json");
        anyhow::ensure!(
            g.join("config.json").is_file() && tok.is_file(),
            "{GPT2_ENV}={}: expected a Hugging Face GPT-2 folder with config.json, model.safetensors and tokenizer.json",
            g.display()
        );
        return Ok(Prepared {
            corpora,
            tok,
            pre: None,
            start: g.to_path_buf(),
        });
    }
    let name = format!("dpmuon-{}", corpora.task);
    let tok = pretrain::tokenizer(
        &inputs.cache,
        &name,
        &corpora.pretrain_lines,
        &corpora.pretrain_hash,
        CorpusModel::ByteLevelBpe,
        s.vocab,
    )?;
    let mut p = RunConfig::default();
    p.data.format = DataFormat::E2e;
    p.data.train = corpora.pretrain.clone();
    p.data.validation = Some(corpora.proxy_val.clone());
    p.data.max_length = s.max_len;
    p.model.kind = ModelKind::Gpt2;
    p.model.tokenizer = TokenizerSpec::from(tok.as_path());
    p.model.d_model = s.dec.width;
    p.model.layers = s.dec.blocks;
    p.model.heads = s.dec.heads;
    p.model.d_ff = s.dec.ffn;
    p.method = MethodConfig::new(Method::Adam);
    p.train.steps = Some(s.pretrain.updates);
    p.train.batch_size = fit_batch(s.pretrain.batch, corpora.pretrain_lines.len());
    p.train.lr = s.pretrain.lr;
    p.train.micro_batch = 64;
    p.train.checkpoint_every = 0;
    p.train.insecure_seed = Some(7);
    p.train.device = inputs.device;
    p.eval.max_sources = 0;
    p.eval.max_new_tokens = s.new_tokens;
    let pre = pretrain::Pretraining::plan(
        &inputs.cache,
        &format!("{name}-gpt2"),
        &p,
        &corpora.pretrain_hash,
    )?;
    let start = pre.hf.clone();
    Ok(Prepared {
        corpora,
        tok,
        pre: Some(pre),
        start,
    })
}

/// The pretrained model's scores on the test file (cached beside the pretraining run).
fn start_score(p: &Prepared) -> anyhow::Result<Option<StartScore>> {
    let Some(pre) = &p.pre else { return Ok(None) };
    let h = crate::paper::runs::file_hash(&p.corpora.test)?;
    let path = pre
        .run
        .parent()
        .unwrap_or(&pre.run)
        .join(format!("start-{}.json", &h[..16]));
    if let Ok(bytes) = std::fs::read(&path)
        && let Ok(s) = serde_json::from_slice::<StartScore>(&bytes)
    {
        return Ok(Some(s));
    }
    let r = raptor_run::eval_run(&pre.run, Some(&p.corpora.test)).with_context(|| {
        format!(
            "scoring the pretrained {} model on its test file",
            p.corpora.task
        )
    })?;
    let s = StartScore {
        nll: r.metrics.loss,
        bleu: r.generation.as_ref().map(|g| g.bleu),
        rouge_l: r.generation.as_ref().map(|g| g.rouge_l),
    };
    raptor_run::write_atomic(&path, &serde_json::to_vec_pretty(&s)?)?;
    Ok(Some(s))
}

/// Everything the report needs.
pub struct Results {
    /// The profile.
    pub scale: Scale,
    /// Per task: its corpora note, the pretrained start and its cells.
    pub tasks: Vec<TaskResults>,
    /// Summaries of the private runs by label.
    pub runs: BTreeMap<String, Summary>,
    /// Why a task is missing.
    pub missing: Vec<String>,
    /// Where the data came from (one sentence per release).
    pub sources: Vec<String>,
    /// Bias measurements (every tapped run).
    pub bias: Vec<bias::BiasRow>,
    /// Wall seconds of the part.
    pub seconds: f64,
}

/// What one task produced besides its run summaries.
pub struct TaskResults {
    /// The task.
    pub task: String,
    /// What went where.
    pub note: String,
    /// The pretrained start's scores (None with a user-given checkpoint).
    pub start: Option<StartScore>,
    /// Its cells, the first setting first.
    pub cells: Vec<CellResults>,
}

/// What one cell (a task at a setting) produced besides its run summaries.
pub struct CellResults {
    /// The setting.
    pub setting: Setting,
    /// Updates of its runs.
    pub steps: u64,
    /// Learning rates by method name.
    pub lrs: BTreeMap<String, LrChoice>,
    /// σ of the private runs (first seed of DP-Adam's record).
    pub sigma: Option<f64>,
}

/// One data-to-text release from the per-user cache, fetched there first when missing (a
/// fallback folder's pinned copy, else the canonical URL); `folders` are the fallbacks, in
/// order. Returns the task and a sentence saying where its files came from, or why it is
/// missing (with what to download and where to put it).
pub fn d2t_task(
    r: &raptor_data::d2t_sources::D2tRelease,
    cache: &Path,
    folders: &[PathBuf],
) -> Result<(D2tTask, String), String> {
    let f = raptor_data::d2t_sources::ensure_d2t(
        r,
        cache,
        folders,
        &raptor_data::d2t_sources::curl_download,
        false,
    )
    .map_err(|e| e.to_string())?;
    let source = f.describe();
    Ok((
        D2tTask {
            name: r.name.into(),
            format: r.format.into(),
            dev: f.dev,
            test: f.test,
        },
        source,
    ))
}

/// Every data-to-text release ([`d2t_task`]): the tasks, why any is missing, and where each
/// came from.
pub fn d2t_inputs(cache: &Path, folders: &[PathBuf]) -> (Vec<D2tTask>, Vec<String>, Vec<String>) {
    let mut tasks = Vec::new();
    let mut missing = Vec::new();
    let mut sources = Vec::new();
    for r in &raptor_data::d2t_sources::D2T_RELEASES {
        match d2t_task(r, cache, folders) {
            Ok((t, s)) => {
                tasks.push(t);
                sources.push(s);
            }
            Err(e) => missing.push(e),
        }
    }
    (tasks, missing, sources)
}

/// The fallback folders of the data-to-text files: `--d2t-data`, then the shared data folder
/// beside the repository (`<root>/../shared/data`) when that is another folder.
pub fn d2t_folders(ctx: &Context) -> Vec<PathBuf> {
    let mut v = vec![ctx.d2t_data.clone()];
    let shared = ctx.root.join("..").join("shared").join("data");
    if shared != ctx.d2t_data {
        v.push(shared);
    }
    v
}

/// Runs the part and returns its tables (plots are written beside them).
pub fn tables(ctx: &Context, given: Option<&Inputs>) -> anyhow::Result<Vec<Table>> {
    let started = std::time::Instant::now();
    let scale = Scale::for_profile(ctx.profile);
    let (inputs, sources) = match given {
        Some(i) => (i.clone(), Vec::new()),
        None => {
            let cache = match &ctx.cache {
                Some(c) => c.clone(),
                None => raptor_data::cache::default_cache_dir()
                    .context("no cache folder: set RAPTOR_CACHE_DIR (or HOME) or pass --cache")?,
            };
            let mut i = Inputs::real(&cache, &ctx.d2t_data, ctx.device);
            let (d2t, missing, sources) = d2t_inputs(&cache, &d2t_folders(ctx));
            i.d2t = d2t;
            i.d2t_missing = missing;
            (i, sources)
        }
    };
    let gpt2 = if ctx.profile == Profile::Full {
        std::env::var_os(GPT2_ENV).map(PathBuf::from)
    } else {
        None
    };
    let mut missing = inputs.d2t_missing.clone();
    let find = |n: &str| inputs.d2t.iter().find(|t| t.name == n);
    let mut prepared = Vec::new();
    for (t, o) in [("e2e", "dart"), ("dart", "e2e")] {
        match (find(t), find(o)) {
            (Some(target), Some(other)) => {
                prepared.push(prepare(&inputs, target, other, &scale, gpt2.as_deref())?);
            }
            (Some(_), None) => missing.push(format!(
                "{t}: its public corpus ({o}) is missing, so there is no public pretraining for it"
            )),
            _ => {}
        }
    }
    let mut runner = Runner::new(&ctx.out.join("runs"), ctx.exe.clone(), ctx.workers)?;
    // Phase 1: public pretraining (cached).
    let mut pre: Vec<Placed> = Vec::new();
    for p in prepared.iter().filter_map(|p| p.pre.as_ref()) {
        if p.cached() {
            runner.skip(&p.job.label, "cached");
        } else {
            pre.push((p.job.clone(), p.run.clone()));
        }
    }
    runner.run_all(&pre)?;
    for p in prepared.iter().filter_map(|p| p.pre.as_ref()) {
        p.export()?;
    }
    let device = inputs.device;
    let cells = cells(&prepared, &scale);
    // Phase 2: proxies of the AdamW methods, then of the Muon methods with DP-Adam's (Adam's)
    // chosen rate on their non-matrix parameters, in every cell.
    let adam_family = [Method::DpAdam, Method::Adam];
    let muon_family = [Method::DpMuon, Method::DpMuonbc, Method::Muon];
    let mut jobs = Vec::new();
    for c in &cells {
        jobs.extend(proxy_jobs(
            &prepared[c.task],
            &scale,
            c,
            device,
            &adam_family,
            &|_| 0.0,
        ));
    }
    let placed = runner.place(jobs)?;
    let out_a = runner.run_all(&placed)?;
    let mut choices: Vec<BTreeMap<String, LrChoice>> = Vec::new();
    for c in &cells {
        let p = &prepared[c.task];
        let mut m = BTreeMap::new();
        for meth in adam_family.iter().filter(|m| c.methods().contains(m)) {
            m.insert(
                meth.name().to_string(),
                choose(p, &scale, c, *meth, 0.0, &out_a, &runner, device)?,
            );
        }
        choices.push(m);
    }
    // The AdamW rate of a Muon method's other parameters: DP-Adam's choice in its cell (Adam's
    // for non-private Muon).
    let adam_lr_of = |ch: &BTreeMap<String, LrChoice>, m: Method| -> f64 {
        let from = if m.is_private() {
            Method::DpAdam
        } else {
            Method::Adam
        };
        ch.get(from.name()).map_or(scale.adam_lrs[0], |c| c.lr)
    };
    let mut jobs = Vec::new();
    for (c, ch) in cells.iter().zip(&choices) {
        jobs.extend(proxy_jobs(
            &prepared[c.task],
            &scale,
            c,
            device,
            &muon_family,
            &|m| adam_lr_of(ch, m),
        ));
    }
    let placed = runner.place(jobs)?;
    let out_b = runner.run_all(&placed)?;
    for (c, ch) in cells.iter().zip(choices.iter_mut()) {
        for meth in muon_family.iter().filter(|m| c.methods().contains(m)) {
            let a = adam_lr_of(ch, *meth);
            let choice = choose(
                &prepared[c.task],
                &scale,
                c,
                *meth,
                a,
                &out_b,
                &runner,
                device,
            )?;
            ch.insert(meth.name().to_string(), choice);
        }
    }
    // Phase 3: the private grid; the tapped runs get their request file before they start.
    let mut jobs = Vec::new();
    let mut tapped = Vec::new();
    for (c, ch) in cells.iter().zip(&choices) {
        for (j, tap) in main_jobs(&prepared[c.task], &scale, c, device, ch) {
            if tap {
                tapped.push((
                    prepared[c.task].corpora.task.clone(),
                    j.label.clone(),
                    j.cfg.clone(),
                    c.steps,
                ));
            }
            jobs.push(j);
        }
    }
    let placed = runner.place(jobs)?;
    for (_, label, cfg, steps) in &tapped {
        let dir = runner.dir_of(cfg)?;
        if !dir.join("summary.json").exists() {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let every = (steps / scale.taps.max(1)).max(1);
            let req = serde_json::json!({"every": every, "max_matrices": scale.tap_matrices});
            raptor_run::write_atomic(
                &dir.join(raptor_run::BUFFER_TAP_FILE),
                &serde_json::to_vec(&req)?,
            )
            .with_context(|| format!("asking {label} to keep its buffers"))?;
        }
    }
    let runs = runner.run_all(&placed)?;
    runner.finish_all();
    // Phase 4: the pretrained starts, the bias of the kept buffers, the choices in the records.
    let mut tasks: Vec<TaskResults> = Vec::new();
    for p in &prepared {
        tasks.push(TaskResults {
            task: p.corpora.task.clone(),
            note: p.corpora.note.clone(),
            start: start_score(p)?,
            cells: Vec::new(),
        });
    }
    for (c, ch) in cells.iter().zip(choices) {
        let task = &prepared[c.task].corpora.task;
        let dp_adam = run_label(task, Method::DpAdam, &c.setting, scale.seeds[0]);
        let sigma = placed
            .iter()
            .find(|(j, _)| j.label == dp_adam)
            .and_then(|(_, d)| run_sigma(d));
        tasks[c.task].cells.push(CellResults {
            setting: c.setting,
            steps: c.steps,
            lrs: ch,
            sigma,
        });
    }
    let mut bias_rows = Vec::new();
    for (task, label, cfg, _) in &tapped {
        let dir = runner.dir_of(cfg)?;
        eprintln!("reproduce: dpmuon: bias of the kept buffers of {label} ...");
        bias_rows.extend(bias::measure(task, label, cfg, &dir, scale.bias_draws)?);
    }
    let results = Results {
        scale,
        tasks,
        runs,
        missing,
        sources,
        bias: bias_rows,
        seconds: started.elapsed().as_secs_f64(),
    };
    report::tables(&results, &ctx.out)
}
