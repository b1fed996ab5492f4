//! Reproduce part `dpmuon`: DP-Adam vs DP-Muon vs DP-MuonBC on data-to-text, designed so the
//! experiment can tell the methods apart.
//!
//! For each target task (E2E-cleaned, DART without its E2E-derived entries) the public corpus
//! is the *other* task ([`data`]): a byte-level BPE tokenizer and a GPT-2-style decoder are
//! pretrained on it (non-private, public data only), then fine-tuned on the target's dev pairs
//! (private) and scored on the target's test references (NLL, BLEU, ROUGE-L).
//!
//! 1. **Pretrained start** (no private update) and a **positive control** (non-private Adam
//!    fine-tuning): the report says whether fine-tuning improves on the start, i.e. whether
//!    there is room for the private methods to differ.
//! 2. **Learning rates chosen on public data only**: every method's learning rate is picked from
//!    a small grid by a public proxy run — the same fine-tuning (same σ, batch, updates, clip; as
//!    many records as the private set) on a held-out part of the public corpus, scored on
//!    another held-out public part. The Muon methods' non-matrix parameters use the AdamW rate
//!    chosen for DP-Adam (for non-private Muon: Adam's). Nothing is tuned on the private or test
//!    data.
//! 3. **Paired seeds**: every method runs the same seeds (same initialization seed, Poisson
//!    sampler and noise seeds); the report gives per-seed paired differences with 95 % CIs and a
//!    verdict per ordering by the decision rule written above the numbers.
//! 4. **Bias where it matters** ([`bias`]): the DP-Muon and DP-MuonBC runs of the first seed keep
//!    their released Newton–Schulz inputs at a few updates; Newton–Schulz's noise bias is then
//!    measured on those buffers.
//!
//! The noise and the Poisson sampler are seeded (`train.insecure_seed`) so that the tables
//! reproduce: the mechanism and the certified ε are those of a private run, but these runs are
//! not private releases.

mod bias;
pub mod data;
mod report;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use raptor_models::tokenizer::CorpusModel;
use raptor_train::config::{
    DataFormat, DeviceSpec, Method, ModelKind, RunConfig, Scope, TokenizerSpec,
};

use crate::driver::{Context, Profile, ProfileScale, Table};
use crate::paper::runs::{Job, Placed, Runner, Summary};
use crate::paper::{D2tTask, Inputs, fit_batch, label, pretrain, seeded};

/// The environment variable naming a GPT-2 checkpoint folder (Hugging Face layout:
/// `config.json`, `model.safetensors`, `tokenizer.json`) for `--full`: the runs then fine-tune
/// it instead of a decoder pretrained here.
pub const GPT2_ENV: &str = "RAPTOR_DPMUON_GPT2";

/// The methods compared (the private three, then the non-private positive control).
pub const METHODS: [Method; 4] = [
    Method::DpAdam,
    Method::DpMuon,
    Method::DpMuonbc,
    Method::Adam,
];

/// Sizes of one profile.
#[derive(Debug, Clone)]
pub struct Scale {
    /// Seeds, paired across methods.
    pub seeds: Vec<u64>,
    /// Target ε of the private runs.
    pub epsilon: f64,
    /// Tokenizer vocabulary.
    pub vocab: usize,
    /// Tokens per record.
    pub max_len: usize,
    /// Decoder width, blocks, heads, FFN size.
    pub dec: (i64, i64, i64, i64),
    /// Pretraining updates, batch, learning rate.
    pub pretrain: (u64, f64, f64),
    /// Fine-tuning updates.
    pub steps: u64,
    /// Expected batch of fine-tuning.
    pub batch: f64,
    /// Per-example clipping bound.
    pub clip: f64,
    /// Learning-rate grid of AdamW (DP-Adam, Adam).
    pub adam_lrs: Vec<f64>,
    /// Learning-rate grid of the Muon matrices (DP-Muon, DP-MuonBC).
    pub muon_lrs: Vec<f64>,
    /// Data sizes.
    pub sizes: data::Sizes,
    /// Longest generation.
    pub new_tokens: usize,
    /// Keep the Newton–Schulz inputs of every this many updates…
    pub tap_every: u64,
    /// …for at most this many matrices.
    pub tap_matrices: usize,
    /// Noise draws per bias estimate.
    pub bias_draws: usize,
    /// Evaluations of the test NLL during the first seed's runs (curves).
    pub curve_points: u64,
}

impl ProfileScale for Scale {
    /// The test profile: tiny models, a few updates.
    fn quick() -> Self {
        Self {
            seeds: vec![0, 1],
            epsilon: 8.0,
            vocab: 200,
            max_len: 40,
            dec: (16, 1, 2, 32),
            pretrain: (6, 16.0, 5e-3),
            steps: 4,
            batch: 16.0,
            clip: 1.0,
            adam_lrs: vec![1e-3, 1e-2],
            muon_lrs: vec![1e-2, 5e-2],
            sizes: data::Sizes {
                test_sources: 4,
                max_private: 0,
                proxy_val_sources: 3,
            },
            new_tokens: 8,
            tap_every: 2,
            tap_matrices: 2,
            bias_draws: 8,
            curve_points: 2,
        }
    }

    /// `cargo xtask reproduce` (no profile flag): the design of [`Scale::standard`] with 2
    /// paired seeds, a smaller decoder and fewer updates (a few minutes on 2 CPU cores).
    fn small() -> Self {
        Self {
            seeds: vec![0, 1],
            epsilon: 8.0,
            vocab: 800,
            max_len: 64,
            dec: (48, 2, 4, 192),
            pretrain: (300, 32.0, 3e-3),
            steps: 40,
            batch: 64.0,
            clip: 1.0,
            adam_lrs: vec![1e-3, 3e-3],
            muon_lrs: vec![3e-3, 1e-2],
            sizes: data::Sizes {
                test_sources: 20,
                max_private: 0,
                proxy_val_sources: 20,
            },
            new_tokens: 24,
            tap_every: 10,
            tap_matrices: 4,
            bias_draws: 50,
            curve_points: 2,
        }
    }

    /// `cargo xtask reproduce --standard` on 2 CPU cores: the README's table.
    fn standard() -> Self {
        Self {
            seeds: vec![0, 1, 2],
            epsilon: 8.0,
            vocab: 1000,
            max_len: 64,
            dec: (64, 2, 4, 256),
            pretrain: (600, 32.0, 3e-3),
            steps: 60,
            batch: 64.0,
            clip: 1.0,
            adam_lrs: vec![3e-4, 1e-3, 3e-3],
            muon_lrs: vec![1e-3, 3e-3, 1e-2],
            sizes: data::Sizes {
                test_sources: 40,
                max_private: 0,
                proxy_val_sources: 40,
            },
            new_tokens: 32,
            tap_every: 15,
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
            epsilon: 8.0,
            vocab: 8000,
            max_len: 128,
            dec: (256, 6, 4, 1024),
            pretrain: (3000, 64.0, 1e-3),
            steps: 1000,
            batch: 256.0,
            clip: 1.0,
            adam_lrs: vec![3e-4, 1e-3, 3e-3],
            muon_lrs: vec![5e-3, 2e-2, 5e-2],
            sizes: data::Sizes {
                test_sources: 0,
                max_private: 0,
                proxy_val_sources: 200,
            },
            new_tokens: 64,
            tap_every: 250,
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

/// The fine-tuning config shared by the proxy and the private runs of a task.
fn base_cfg(
    p: &Prepared,
    s: &Scale,
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
    c.method.scope = Scope::Full;
    c.train.steps = Some(s.steps);
    c.train.batch_size = fit_batch(s.batch, n);
    c.train.micro_batch = 64;
    c.train.checkpoint_every = 0;
    c.train.device = device;
    c.train.eval_every = 0;
    c.train.clip = s.clip;
    c.privacy.epsilon = s.epsilon;
    c.privacy.accuracy = 1e-3;
    c.eval.max_sources = 0;
    c.eval.max_new_tokens = s.new_tokens;
    c
}

fn with_method(mut c: RunConfig, m: Method, lr: f64, adam_lr: f64) -> RunConfig {
    c.method.name = m;
    if tuned_is_muon(m) {
        c.method.muon_lr = lr;
        c.train.lr = adam_lr;
    } else {
        c.train.lr = lr;
    }
    c
}

fn eps_of(m: Method, s: &Scale) -> Option<f64> {
    m.is_private().then_some(s.epsilon)
}

fn proxy_label(task: &str, m: Method, lr: f64, s: &Scale) -> String {
    label(
        task,
        m.name(),
        &format!("proxy lr={lr}"),
        eps_of(m, s),
        s.seeds[0],
    )
}

/// Proxy jobs of `methods` over their grids (`adam_lr`: the non-matrix rate of Muon methods).
fn proxy_jobs(
    p: &Prepared,
    s: &Scale,
    device: DeviceSpec,
    methods: &[Method],
    adam_lr: &dyn Fn(Method) -> f64,
) -> Vec<Job> {
    let c = &p.corpora;
    let mut base = base_cfg(p, s, device, &c.proxy_train, &c.proxy_val, c.proxy_pairs);
    // The proxy is scored on NLL only: one source, one generated token.
    base.eval.max_sources = 1;
    base.eval.max_new_tokens = 1;
    let mut jobs = Vec::new();
    for &m in methods {
        let grid = if tuned_is_muon(m) {
            &s.muon_lrs
        } else {
            &s.adam_lrs
        };
        for &lr in grid {
            jobs.push(Job {
                label: proxy_label(&c.task, m, lr, s),
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

fn choose(
    p: &Prepared,
    s: &Scale,
    m: Method,
    adam_lr: f64,
    out: &BTreeMap<String, Summary>,
    runner: &Runner,
    device: DeviceSpec,
) -> anyhow::Result<LrChoice> {
    let c = &p.corpora;
    let grid = if tuned_is_muon(m) {
        &s.muon_lrs
    } else {
        &s.adam_lrs
    };
    let mut points = Vec::new();
    let mut best: Option<(f64, f64)> = None;
    for &lr in grid {
        let l = out
            .get(&proxy_label(&c.task, m, lr, s))
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
            "{}: no proxy run of {} gave a validation NLL",
            c.task,
            m.name()
        )
    })?;
    let mut base = base_cfg(p, s, device, &c.proxy_train, &c.proxy_val, c.proxy_pairs);
    base.eval.max_sources = 1;
    base.eval.max_new_tokens = 1;
    let dir = runner.dir_of(&seeded(with_method(base, m, lr, adam_lr), s.seeds[0]))?;
    Ok(LrChoice {
        method: m.name().into(),
        grid: points,
        lr,
        adam_lr: if tuned_is_muon(m) { adam_lr } else { lr },
        sigma: run_sigma(&dir),
    })
}

/// The private grid of a task with the chosen learning rates; the DP-Muon family's first-seed
/// runs keep their Newton–Schulz inputs.
fn main_jobs(
    p: &Prepared,
    s: &Scale,
    device: DeviceSpec,
    lrs: &BTreeMap<String, LrChoice>,
) -> Vec<(Job, bool)> {
    let c = &p.corpora;
    let base = base_cfg(p, s, device, &c.train, &c.test, c.private_pairs);
    let mut jobs = Vec::new();
    for &seed in &s.seeds {
        for m in METHODS {
            let Some(ch) = lrs.get(m.name()) else {
                continue;
            };
            let mut cfg = with_method(base.clone(), m, ch.lr, ch.adam_lr);
            let first = Some(&seed) == s.seeds.first();
            if first {
                cfg.train.eval_every = (s.steps / s.curve_points.max(1)).max(1);
            }
            let tap = first && matches!(m, Method::DpMuon | Method::DpMuonbc);
            jobs.push((
                Job {
                    label: label(&c.task, m.name(), "", eps_of(m, s), seed),
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
    (p.model.d_model, p.model.layers, p.model.heads, p.model.d_ff) = s.dec;
    p.method.name = Method::Adam;
    p.train.steps = Some(s.pretrain.0);
    p.train.batch_size = fit_batch(s.pretrain.1, corpora.pretrain_lines.len());
    p.train.lr = s.pretrain.2;
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
    let r = raptor_train::run::eval_run(&pre.run, Some(&p.corpora.test)).with_context(|| {
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
    raptor_train::run::write_atomic(&path, &serde_json::to_vec_pretty(&s)?)?;
    Ok(Some(s))
}

/// Everything the report needs.
pub struct Results {
    /// The profile.
    pub scale: Scale,
    /// Per task: its corpora note, the pretrained start, the learning-rate choices (by method
    /// name), the private σ.
    pub tasks: Vec<TaskResults>,
    /// Summaries of the private runs by label.
    pub runs: BTreeMap<String, Summary>,
    /// Why a task is missing.
    pub missing: Vec<String>,
    /// Bias measurements.
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
    /// Learning rates by method name.
    pub lrs: BTreeMap<String, LrChoice>,
    /// σ of the private runs (first seed of DP-Adam's record).
    pub sigma: Option<f64>,
}

/// Runs the part and returns its tables (plots are written beside them).
pub fn tables(ctx: &Context) -> anyhow::Result<Vec<Table>> {
    let started = std::time::Instant::now();
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
    // Phase 2: proxies of the AdamW methods, then of the Muon methods with DP-Adam's (Adam's)
    // chosen rate on their non-matrix parameters.
    let adam_family = [Method::DpAdam, Method::Adam];
    let muon_family = [Method::DpMuon, Method::DpMuonbc];
    let mut jobs = Vec::new();
    for p in &prepared {
        jobs.extend(proxy_jobs(p, &scale, device, &adam_family, &|_| 0.0));
    }
    let placed = runner.place(jobs)?;
    let out_a = runner.run_all(&placed)?;
    let mut choices: Vec<BTreeMap<String, LrChoice>> = Vec::new();
    for p in &prepared {
        let mut m = BTreeMap::new();
        for meth in adam_family {
            m.insert(
                meth.name().to_string(),
                choose(p, &scale, meth, 0.0, &out_a, &runner, device)?,
            );
        }
        choices.push(m);
    }
    let adam_lr_of = |ch: &BTreeMap<String, LrChoice>, m: Method| -> f64 {
        let from = if m.is_private() {
            Method::DpAdam
        } else {
            Method::Adam
        };
        ch.get(from.name()).map_or(scale.adam_lrs[0], |c| c.lr)
    };
    let mut jobs = Vec::new();
    for (p, ch) in prepared.iter().zip(&choices) {
        jobs.extend(proxy_jobs(p, &scale, device, &muon_family, &|m| {
            adam_lr_of(ch, m)
        }));
    }
    let placed = runner.place(jobs)?;
    let out_b = runner.run_all(&placed)?;
    for (p, ch) in prepared.iter().zip(choices.iter_mut()) {
        for meth in muon_family {
            let a = adam_lr_of(ch, meth);
            let c = choose(p, &scale, meth, a, &out_b, &runner, device)?;
            ch.insert(meth.name().to_string(), c);
        }
    }
    // Phase 3: the private grid; the tapped runs get their request file before they start.
    let mut jobs = Vec::new();
    let mut tapped = Vec::new();
    for (p, ch) in prepared.iter().zip(&choices) {
        for (j, tap) in main_jobs(p, &scale, device, ch) {
            if tap {
                tapped.push((p.corpora.task.clone(), j.label.clone(), j.cfg.clone()));
            }
            jobs.push(j);
        }
    }
    let placed = runner.place(jobs)?;
    for (_, label, cfg) in &tapped {
        let dir = runner.dir_of(cfg)?;
        if !dir.join("summary.json").exists() {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let req =
                serde_json::json!({"every": scale.tap_every, "max_matrices": scale.tap_matrices});
            raptor_train::run::write_atomic(
                &dir.join(raptor_train::run::BUFFER_TAP_FILE),
                &serde_json::to_vec(&req)?,
            )
            .with_context(|| format!("asking {label} to keep its buffers"))?;
        }
    }
    let runs = runner.run_all(&placed)?;
    runner.finish_all();
    // Phase 4: the pretrained starts, the bias of the kept buffers, the choices in the records.
    let mut tasks = Vec::new();
    for (p, ch) in prepared.iter().zip(choices) {
        let start = start_score(p)?;
        let sigma = placed
            .iter()
            .find(|(j, _)| {
                j.label
                    == label(
                        &p.corpora.task,
                        Method::DpAdam.name(),
                        "",
                        Some(scale.epsilon),
                        scale.seeds[0],
                    )
            })
            .and_then(|(_, d)| run_sigma(d));
        tasks.push(TaskResults {
            task: p.corpora.task.clone(),
            note: p.corpora.note.clone(),
            start,
            lrs: ch,
            sigma,
        });
    }
    let mut bias_rows = Vec::new();
    for (task, label, cfg) in &tapped {
        let dir = runner.dir_of(cfg)?;
        eprintln!("reproduce: dpmuon: bias of the kept buffers of {label} ...");
        bias_rows.extend(bias::measure(task, label, cfg, &dir, scale.bias_draws)?);
    }
    let results = Results {
        scale,
        tasks,
        runs,
        missing,
        bias: bias_rows,
        seconds: started.elapsed().as_secs_f64(),
    };
    report::tables(&results, &ctx.out)
}
