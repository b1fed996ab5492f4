//! raptor-config: the run configuration of raptor (`run.toml`), with no libtorch.
//!
//! The run configuration: every knob is a documented field with a default; unknown
//! fields are an error that names them. Every setting that takes one of a fixed set of values is
//! an enum ([`choices`]), so a value the TOML does not accept fails to parse (naming the setting,
//! the value and the accepted ones) and no code matches on strings. `[method]` is an enum tagged
//! by `name` whose variants carry only their own knobs ([`method`]); [`RunConfig::validate`] is
//! the one validator of the rest, listing every problem at once (a knob of another method in
//! `[method]` among them). The same struct backs the file, the builder in code and the resolved
//! copy written into the run folder.
//!
//! ```
//! use raptor_config::{Method, MethodConfig, RunConfig};
//!
//! let mut cfg = RunConfig::default();
//! cfg.method = MethodConfig::new(Method::DpAdamLora);
//! cfg.privacy.epsilon = 4.0;
//! cfg.validate()?; // every problem at once, each naming its setting
//! let text = cfg.to_toml()?; // the file `raptor train --config` reads
//! assert_eq!(RunConfig::from_toml(&text)?, cfg);
//!
//! // A knob of another method is refused, naming the methods that take it.
//! let e = RunConfig::from_toml("[method]\nname = \"dp-adam-lora\"\nmuon_beta = 0.9\n");
//! assert!(e.unwrap_err().to_string().contains("used by dp-muon"));
//! # Ok::<(), raptor_config::ConfigError>(())
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod check;
pub mod choices;
pub mod error;
pub mod method;

pub use choices::{
    Budget, BudgetSplit, Choice, DataFormat, DeviceSpec, ExpertClip, ExpertDenominator, LayerSpec,
    Method, MethodFamily, ModelKind, MuonMomentum, NsPolynomial, OwnerRule, Pooling,
    PrefixCacheMode, ResidualWeight, Scope, StreamOptimizer, TokenizerSpec, parse_choice,
};
pub use error::{ConfigError, ConfigIssue, ConfigIssues, Result};
pub use method::{
    Alternation, BiasCorrection, ExpertLayer, ExpertStreams, MethodConfig, MuonKnobs,
};

/// A whole run: data, model, method, privacy target and training schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// Where the records come from.
    pub data: DataConfig,
    /// The model to fine-tune.
    pub model: ModelConfig,
    /// The training method and its own knobs (`name` left out: `raptor`).
    #[serde(deserialize_with = "method::deserialize_or_raptor")]
    pub method: MethodConfig,
    /// The privacy target.
    pub privacy: PrivacyConfig,
    /// Batch size, steps, learning rate, clipping bounds, seed, device.
    pub train: TrainConfig,
    /// LoRA adapters (methods that train LoRA).
    pub lora: LoraSettings,
    /// Evaluation (generation for data-to-text).
    pub eval: EvalConfig,
}

/// Evaluation settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// Beam width of generation (1: greedy).
    pub beams: usize,
    /// Longest generated text (tokens).
    pub max_new_tokens: usize,
    /// Generate for at most this many distinct sources of the validation set (0: all).
    pub max_sources: usize,
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self {
            beams: 1,
            max_new_tokens: 48,
            max_sources: 200,
        }
    }
}

/// Data files and columns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// `table` (CSV/TSV/JSONL with text and label columns), `e2e` (E2E-style CSV: `mr`, `ref`)
    /// or `dart` (DART JSON, or WebNLG-style XML by extension).
    pub format: DataFormat,
    /// Training records (CSV, TSV or JSONL by extension). Relative paths are resolved against
    /// the folder of the config file; `cache:<rest>` against the per-user cache (e.g.
    /// `cache:data/rotten-tomatoes/train.tsv` after `cargo xtask setup --data`).
    pub train: PathBuf,
    /// Validation records; empty: `validation_fraction` of the training file is held out.
    pub validation: Option<PathBuf>,
    /// Whether the validation file holds public records (e.g. a benchmark's published
    /// validation split). Only then do the validation and generation metrics go to the run's
    /// publishable `record.json`; otherwise (the default, and always for records held out of
    /// the training file) they are computed from private records without noise and are written
    /// under the run's `private/` folder.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub validation_public: bool,
    /// Fraction of the training file held out for validation when no validation file is given
    /// (0 disables validation).
    pub validation_fraction: f64,
    /// Public records, used only for routing statistics and layer selection (never trained on).
    pub public: Option<PathBuf>,
    /// The text column.
    pub text_column: String,
    /// The label column (classification).
    pub label_column: String,
    /// The label set, declared (classification). Omitted: read from the private training
    /// file, which reveals it — the head's shape and the run's `labels.json` show every label
    /// that occurs there, one that occurs only in private data included; the run says so. A
    /// record whose label is not declared is an error.
    pub labels: Option<Vec<String>>,
    /// Tokens kept per record (longer records are truncated).
    pub max_length: usize,
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            format: DataFormat::Table,
            train: PathBuf::from("train.csv"),
            validation: None,
            validation_public: false,
            validation_fraction: 0.1,
            public: None,
            text_column: "text".into(),
            label_column: "label".into(),
            labels: None,
            max_length: 64,
        }
    }
}

/// Which model and tokenizer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Architecture: `switch` (MoE encoder classifier), `olmoe`, `mixtral`, `qwen2-moe` (MoE
    /// decoder classifiers), `gpt2`, `llama` (dense decoders, language modelling), `bert`
    /// (dense encoder classifier, mean pooling), `moe-bert` (raptor's MoE-BERT classifier).
    pub kind: ModelKind,
    /// A Hugging Face model folder (config.json + safetensors), a `.gguf` file (Llama
    /// architecture, `kind = "llama"`; dequantized to f32), or the name of a model that
    /// `cargo xtask setup --models` put in the per-user cache (a bare name that is not a
    /// folder next to the config file: `all-minilm-l6-v2` = `cache:models/all-minilm-l6-v2`,
    /// `smollm2-135m-instruct`); empty: a randomly initialized model of the sizes below.
    pub path: Option<PathBuf>,
    /// Tokenizer: `bytes` (UTF-8 bytes, data-independent), `gpt2` (GPT-2 BPE), `gguf` (the
    /// tokenizer stored in the GGUF file of `path`), `model` (the `tokenizer.json` of `path`),
    /// or a path to a `tokenizer.json` (`cache:` allowed). A `tokenizer.json` is read with its
    /// padding and truncation off; for `bert` its template's special tokens (`[CLS] … [SEP]`)
    /// wrap every record. Never trained on private records.
    pub tokenizer: TokenizerSpec,
    /// Pooling of a `bert` / `moe-bert` classifier: `mean` (over valid tokens, as
    /// sentence-transformers) or `pooler` (`tanh(pooler.dense(h[CLS]))`, the checkpoint's
    /// pooler).
    #[serde(skip_serializing_if = "Pooling::is_mean")]
    pub pooling: Pooling,
    /// Hidden size of a from-scratch model.
    pub d_model: i64,
    /// Blocks of a from-scratch model.
    pub layers: i64,
    /// Attention heads of a from-scratch model.
    pub heads: i64,
    /// FFN inner size of a from-scratch model.
    pub d_ff: i64,
    /// Routed experts per sparse layer of a from-scratch MoE model.
    pub experts: i64,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            kind: ModelKind::Switch,
            path: None,
            tokenizer: TokenizerSpec::Bytes,
            pooling: Pooling::Mean,
            d_model: 32,
            layers: 4,
            heads: 2,
            d_ff: 64,
            experts: 4,
        }
    }
}

/// The privacy target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrivacyConfig {
    /// Total ε (> 0).
    pub epsilon: f64,
    /// Total δ; empty: the largest power of ten at most 1/(10·N) ([`default_delta`]). A given
    /// δ ≥ 1/N is refused unless `allow_large_delta` is set: at δ = 1/N a mechanism may publish
    /// one record outright and still be (0, δ)-DP.
    pub delta: Option<f64>,
    /// Accept a given `delta` at or above 1/N (recorded in the run's privacy plan).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub allow_large_delta: bool,
    /// RAPTOR's budget split: `joint` (the default: both σ's calibrated together on the one
    /// composed PRV, so the run spends its whole ε) or `additive` (the paper's: each stream
    /// calibrated alone on its share, which leaves part of ε unspent).
    pub split: BudgetSplit,
    /// Share ρ of the budget for the shared stream.
    pub rho: f64,
    /// Relative accuracy of the PRV accountant.
    pub accuracy: f64,
}

impl Default for PrivacyConfig {
    fn default() -> Self {
        Self {
            epsilon: 8.0,
            delta: None,
            allow_large_delta: false,
            split: BudgetSplit::Joint,
            rho: 0.9,
            accuracy: 1e-4,
        }
    }
}

/// The optimization schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Expected batch size B (q = B/N).
    pub batch_size: f64,
    /// Epochs (updates = epochs · ceil(N/B)); ignored when `steps` is set.
    pub epochs: f64,
    /// Total number of updates (overrides `epochs`).
    pub steps: Option<u64>,
    /// Learning rate (AdamW / SGD).
    pub lr: f64,
    /// Learning rate of RAPTOR's expert streams (AdamW / SGD); omitted: `lr`. The expert
    /// releases carry far more noise per coordinate than the shared one (noise σ_e·C_e/D_e on
    /// every expert coordinate against a clipped signal of norm ≤ C_e·n_e/D_e), so they
    /// usually want a smaller step.
    pub expert_lr: Option<f64>,
    /// Optimizer of RAPTOR's shared stream (`adamw` or `sgd`); monolithic methods keep their
    /// own (DP-Adam: AdamW, DP-SGD: SGD).
    pub shared_optimizer: StreamOptimizer,
    /// Optimizer of RAPTOR's expert streams. With `sgd` a step is proportional to the release,
    /// so the public denominator D_e = B/E sets the expert step's scale (the paper's analysis);
    /// AdamW divides each coordinate by its own running scale, which cancels D_e.
    pub expert_optimizer: StreamOptimizer,
    /// Heavy-ball momentum β of every SGD-updated parameter (0: plain SGD).
    pub momentum: f64,
    /// What `steps` (or `epochs`) counts: `updates` (phase executions: an alternating RAPTOR
    /// run gives each stream about half of them) or `stream-updates` (each stream of an
    /// alternating plan gets that many updates, as a monolithic run does: twice the updates
    /// and samples for a 1:1 cycle, at the same ε).
    pub budget: Budget,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// Warm-up updates (linear), then constant or cosine.
    pub warmup_steps: u64,
    /// Cosine decay to 0 after warm-up.
    pub cosine: bool,
    /// Clipping bound of the shared stream / of monolithic methods.
    pub clip: f64,
    /// Clipping bound of each expert stream (RAPTOR).
    pub clip_expert: f64,
    /// Clip bounds from public data: every clip group's bound (`clip`, `clip_expert` and the
    /// per-matrix ones alike) is this quantile of the initial model's per-record gradient
    /// norms over the labelled public records of `data.public` (privacy-free; the chosen
    /// values go to the record). Omitted: the configured bounds.
    pub clip_from_public: Option<f64>,
    /// Public records `clip_from_public` reads at most, evenly strided over `data.public`
    /// (0: every one). A quantile needs a few hundred records, and each costs a per-record
    /// gradient. Left out of a written config at 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub clip_public_records: usize,
    /// Records per forward pass (memory only; results do not depend on it).
    pub micro_batch: usize,
    /// The frozen-prefix cache: `auto` (default), `memory`, `file` or `off` (results do not
    /// depend on it beyond float round-off). Left out of a written config at `auto`.
    #[serde(skip_serializing_if = "PrefixCacheMode::is_auto")]
    pub prefix_cache: PrefixCacheMode,
    /// Seed of model initialization.
    pub seed: u64,
    /// NOT PRIVATE: seed the Poisson sampler and the noise (reproducible experiments only).
    pub insecure_seed: Option<u64>,
    /// `cpu`, `cuda` or `cuda:N`.
    pub device: DeviceSpec,
    /// Evaluate every this many updates (0: only at the end).
    pub eval_every: u64,
    /// Write a checkpoint every this many updates (0: only at the end).
    pub checkpoint_every: u64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            batch_size: 64.0,
            epochs: 3.0,
            steps: None,
            lr: 2e-3,
            expert_lr: None,
            shared_optimizer: StreamOptimizer::Adamw,
            expert_optimizer: StreamOptimizer::Adamw,
            momentum: 0.0,
            budget: Budget::Updates,
            weight_decay: 0.01,
            warmup_steps: 0,
            cosine: false,
            clip: 1.0,
            clip_expert: 1.0,
            clip_from_public: None,
            clip_public_records: 0,
            micro_batch: 64,
            prefix_cache: PrefixCacheMode::Auto,
            seed: 0,
            insecure_seed: None,
            device: DeviceSpec::Cpu,
            eval_every: 0,
            checkpoint_every: 50,
        }
    }
}

/// LoRA settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoraSettings {
    /// Rank r.
    pub r: i64,
    /// α (delta scaled by α/r).
    pub alpha: f64,
    /// Dropout on the adapter input (masks keyed by record id in private training).
    pub dropout: f64,
    /// Attention modules to adapt (patterns); empty: the model family's attention projections.
    pub attention_targets: Vec<String>,
    /// FFA-LoRA: keep every adapter's A factor frozen at its random initialization and train B
    /// only (half the trainable, hence noised, coordinates of each adapter).
    pub freeze_a: bool,
    /// Whether the monolithic LoRA methods (`dp-adam-lora`, `lora`) also adapt the routed
    /// experts of every sparse layer (default) or the attention projections and the head only
    /// (a reference without expert adaptation).
    pub experts: bool,
    /// Whether the LoRA methods adapt the attention projections (default), or leave attention
    /// frozen so that the head and, where adapted, the routed experts carry all of the
    /// fine-tuning (a setting where expert adaptation has to matter). Left out of a written
    /// config when true.
    #[serde(skip_serializing_if = "is_true")]
    pub attention: bool,
}

impl Default for LoraSettings {
    fn default() -> Self {
        Self {
            r: 8,
            alpha: 16.0,
            dropout: 0.0,
            attention_targets: Vec::new(),
            freeze_a: false,
            experts: true,
            attention: true,
        }
    }
}

/// A data path written `cache:<rest>` is `<cache>/<rest>` in the per-user cache (where
/// `cargo xtask setup --data` prepares the corpora, e.g.
/// `cache:data/rotten-tomatoes/train.tsv`); None for any other path, or when there is no cache
/// folder (the path is then left as written and reported missing when read).
pub fn resolve_cache_path(path: &Path, cache: Option<&Path>) -> Option<PathBuf> {
    let rest = path.to_str()?.strip_prefix("cache:")?;
    Some(cache?.join(rest.trim_start_matches('/')))
}

/// Where `model.path` points: a `cache:` path in the cache; a relative path next to the config
/// file (`base`) when it exists there; else, for a bare name (one path component), the model
/// folder `<cache>/models/<name>` that `cargo xtask setup --models` writes when that exists;
/// else the path next to the config file (reported missing when read).
pub fn resolve_model_path(path: &Path, base: &Path, cache: Option<&Path>) -> PathBuf {
    if let Some(c) = resolve_cache_path(path, cache) {
        return c;
    }
    if path.is_absolute() {
        return path.to_path_buf();
    }
    let local = base.join(path);
    if local.exists() || path.components().count() != 1 {
        return local;
    }
    match cache.map(|c| c.join("models").join(path)) {
        Some(cached) if cached.exists() => cached,
        _ => local,
    }
}

/// A setting added after configs were first written is left out of a written config at its
/// default, so that a config's text (and the key a cached run is filed under) stays what it
/// was before the setting existed.
fn is_zero(v: &usize) -> bool {
    *v == 0
}

/// See [`is_zero`].
fn is_true(v: &bool) -> bool {
    *v
}

impl RunConfig {
    /// Reads a config file; relative data paths become relative to the file's folder, and
    /// `cache:` paths relative to the per-user cache ([`resolve_cache_path`]).
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        let mut cfg = Self::from_toml(&text).map_err(|e| match e {
            ConfigError::Value(msg) => ConfigError::Value(format!("{}: {msg}", path.display())),
            ConfigError::Invalid(issues) => ConfigError::InvalidFile {
                path: path.to_path_buf(),
                issues,
            },
            other => other,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        cfg.resolve_paths(base);
        Ok(cfg)
    }

    /// Parses TOML text. An error names the setting (`section.field`) it is about, with the
    /// line: an unknown field, a value of the wrong type, or a value a setting does not accept
    /// (the error then gives the bad value and every accepted one).
    ///
    /// `[method]` takes the knobs of the method it names, and only those: a knob of another
    /// method (with the methods that take it) and a knob's bad value are reported together with
    /// every problem [`RunConfig::validate`] finds in the rest of the config
    /// ([`ConfigError::Invalid`]).
    pub fn from_toml(text: &str) -> Result<Self> {
        let describe = |e: toml::de::Error| ConfigError::Value(describe_toml_error(text, &e));
        let doc: toml::Table = toml::from_str(text).map_err(describe)?;
        let Some(toml::Value::Table(table)) = doc.get("method") else {
            return toml::from_str(text).map_err(describe);
        };
        let at_line = |key: &str, reason: String| ConfigIssue {
            setting: format!("method.{key}"),
            reason: match key_line(text, &["method", key]) {
                Some(line) => format!("{reason} (line {line})"),
                None => reason,
            },
        };
        let m = method::named(table)
            .map_err(|i| ConfigError::Value(at_line(&i.key, i.reason).to_string()))?;
        let mut bad = method::table_issues(m, table);
        bad.sort_by_key(|i| key_line(text, &["method", &i.key]));
        if bad.is_empty() {
            return toml::from_str(text).map_err(describe);
        }
        // The rest of the config, read without the knobs reported, so that every problem is
        // listed at once.
        let mut rest = doc.clone();
        if let Some(toml::Value::Table(t)) = rest.get_mut("method") {
            for i in &bad {
                t.remove(&i.key);
            }
        }
        let mut issues: Vec<ConfigIssue> =
            bad.into_iter().map(|i| at_line(&i.key, i.reason)).collect();
        let rest_text = toml::to_string(&rest).map_err(|e| ConfigError::Value(e.to_string()))?;
        match toml::from_str::<RunConfig>(&rest_text) {
            Ok(cfg) => issues.extend(cfg.issues()),
            Err(e) => {
                let setting = e.span().and_then(|s| setting_at(&rest_text, s.start));
                let path: Vec<&str> = setting
                    .as_deref()
                    .map_or(Vec::new(), |s| s.split('.').collect());
                let line = key_line(text, &path);
                issues.push(ConfigIssue {
                    setting: setting.clone().unwrap_or_else(|| "config".into()),
                    reason: match line {
                        Some(l) => format!("{} (line {l})", e.message().trim_end()),
                        None => e.message().trim_end().to_string(),
                    },
                });
            }
        }
        Err(ConfigError::Invalid(ConfigIssues(issues)))
    }

    /// Reads a config that raptor wrote into a run folder (`config.toml`), as
    /// [`RunConfig::from_toml`] does, except that a knob of another method at that method's
    /// default is dropped: the configs written before `[method]` held only its method's knobs
    /// carry every method's knobs at their defaults, and their runs can still be resumed,
    /// evaluated and exported. A knob of another method away from its default is still an error.
    pub fn from_written_toml(text: &str) -> Result<Self> {
        let mut doc: toml::Table =
            toml::from_str(text).map_err(|e| ConfigError::Value(describe_toml_error(text, &e)))?;
        let dropped = match doc.get_mut("method") {
            Some(toml::Value::Table(table)) => match method::named(table) {
                Ok(m) => method::drop_foreign_defaults(m, table),
                Err(_) => 0,
            },
            _ => 0,
        };
        if dropped == 0 {
            return Self::from_toml(text);
        }
        Self::from_toml(&toml::to_string(&doc).map_err(|e| ConfigError::Value(e.to_string()))?)
    }

    /// The config as TOML.
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string_pretty(self).map_err(|e| ConfigError::Value(e.to_string()))
    }

    /// The fields (`section.field`, sorted) whose values differ between two configs; empty when
    /// they are equal. A field set in one and left out (`None`) in the other counts as
    /// different.
    pub fn differences(&self, other: &RunConfig) -> Result<Vec<String>> {
        let value =
            |c: &RunConfig| toml::Value::try_from(c).map_err(|e| ConfigError::Value(e.to_string()));
        let mut out = Vec::new();
        diff_values("", &value(self)?, &value(other)?, &mut out);
        out.sort();
        Ok(out)
    }

    /// Resolves the paths of a config made in code as [`RunConfig::from_file`] resolves those of
    /// a file in `base`: relative data paths against `base`, `cache:` paths and bare model names
    /// against the per-user cache.
    pub fn resolve_paths_against(&mut self, base: &Path) {
        self.resolve_paths(base);
    }

    fn resolve_paths(&mut self, base: &Path) {
        let cache = raptor_data::cache::default_cache_dir();
        let fix = |p: &mut PathBuf| {
            if let Some(c) = resolve_cache_path(p, cache.as_deref()) {
                *p = c;
            } else if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        fix(&mut self.data.train);
        if let Some(p) = self.data.validation.as_mut() {
            fix(p);
        }
        if let Some(p) = self.data.public.as_mut() {
            fix(p);
        }
        if let Some(p) = self.model.path.as_mut() {
            *p = resolve_model_path(p, base, cache.as_deref());
        }
        if let TokenizerSpec::File(t) = &mut self.model.tokenizer {
            fix(t);
        }
    }
}

/// The default δ for N private records: the largest power of ten at most 1/(10·N), so that
/// δ ≪ 1/N (a mechanism that publishes one record at random is (0, 1/N)-DP; δ must sit well
/// below that). N = 1,714 gives 1e-5; N = 1,000 gives 1e-4.
pub fn default_delta(n: usize) -> f64 {
    // The smallest k with 10^k ≥ 10·N, in integers (no log10 round-off at exact powers).
    let target = (n.max(1) as u128).saturating_mul(10);
    let mut k = 0i32;
    let mut p: u128 = 1;
    while p < target {
        p = p.saturating_mul(10);
        k += 1;
    }
    10f64.powi(-k)
}

/// Why a run's δ has its value (recorded beside it).
pub fn delta_reason(given: Option<f64>, n: usize) -> String {
    match given {
        Some(d) if d * n.max(1) as f64 >= 1.0 => format!(
            "given in the config (privacy.delta) at or above 1/N for N = {n} private records, accepted by privacy.allow_large_delta: a delta this large allows releasing a record outright"
        ),
        Some(_) => "given in the config (privacy.delta)".into(),
        None => format!(
            "default: the largest power of ten at most 1/(10·N) for N = {n} private records"
        ),
    }
}

/// The δ of a run over `n` private records: the given one, or [`default_delta`]. A given
/// δ ≥ 1/N is an error unless `allow_large_delta` (at δ = 1/N a mechanism that publishes one
/// record outright is (0, δ)-DP, so such a δ certifies nothing).
pub fn run_delta(privacy: &PrivacyConfig, n: usize) -> Result<f64> {
    match privacy.delta {
        None => Ok(default_delta(n)),
        Some(d) if d * n.max(1) as f64 >= 1.0 && !privacy.allow_large_delta => {
            Err(ConfigError::Value(format!(
                "privacy.delta = {d} is at or above 1/N = {:e} for N = {n} private records: a delta that large allows releasing a record outright; use a delta well below 1/N (omit it for the default {:e}), or set privacy.allow_large_delta = true to accept it (it is recorded in the run's privacy plan)",
                1.0 / n.max(1) as f64,
                default_delta(n)
            )))
        }
        Some(d) => Ok(d),
    }
}

/// The commented default config printed by `raptor train --print-default-config`.
pub const DEFAULT_CONFIG: &str = include_str!("default_config.toml");

/// A TOML error as `setting: message (line n)` when the setting it is about can be found from
/// its position, else as the TOML crate renders it (with the line and a caret).
fn describe_toml_error(text: &str, e: &toml::de::Error) -> String {
    let Some(span) = e.span() else {
        return e.to_string();
    };
    let line = text
        .get(..span.start)
        .map_or(0, |before| before.matches('\n').count())
        + 1;
    match setting_at(text, span.start) {
        Some(setting) => format!("{setting}: {} (line {line})", e.message().trim_end()),
        None => e.to_string(),
    }
}

/// The line (from 1) where the key at `path` (`["method", "residual"]`) is written in `text`.
fn key_line(text: &str, path: &[&str]) -> Option<usize> {
    let doc = toml::de::DeTable::parse(text).ok()?;
    let (last, parents) = path.split_last()?;
    let mut table = doc.get_ref();
    for p in parents {
        let (_, v) = table.iter().find(|(k, _)| k.get_ref() == p)?;
        let toml::de::DeValue::Table(inner) = v.get_ref() else {
            return None;
        };
        table = inner;
    }
    let (k, _) = table.iter().find(|(k, _)| k.get_ref() == last)?;
    text.get(..k.span().start)
        .map(|before| before.matches('\n').count() + 1)
}

/// The dotted key (`method.residual`) whose key or value holds byte `at` of `text`, if any.
fn setting_at(text: &str, at: usize) -> Option<String> {
    let doc = toml::de::DeTable::parse(text).ok()?;
    setting_in(doc.get_ref(), at, "")
}

fn setting_in(table: &toml::de::DeTable<'_>, at: usize, prefix: &str) -> Option<String> {
    for (key, value) in table.iter() {
        let path = if prefix.is_empty() {
            key.get_ref().to_string()
        } else {
            format!("{prefix}.{}", key.get_ref())
        };
        if let toml::de::DeValue::Table(inner) = value.get_ref()
            && let Some(found) = setting_in(inner, at, &path)
        {
            return Some(found);
        }
        if key.span().contains(&at) || value.span().contains(&at) {
            return Some(path);
        }
    }
    None
}

/// Collects the dotted keys under which `a` and `b` differ.
fn diff_values(prefix: &str, a: &toml::Value, b: &toml::Value, out: &mut Vec<String>) {
    match (a, b) {
        (toml::Value::Table(ta), toml::Value::Table(tb)) => {
            let keys: std::collections::BTreeSet<&String> = ta.keys().chain(tb.keys()).collect();
            for k in keys {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match (ta.get(k), tb.get(k)) {
                    (Some(x), Some(y)) => diff_values(&path, x, y, out),
                    _ => out.push(path),
                }
            }
        }
        _ if a != b => out.push(prefix.to_string()),
        _ => {}
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn default_config_text_parses_to_the_defaults() {
        let parsed = RunConfig::from_toml(DEFAULT_CONFIG).unwrap();
        assert_eq!(parsed, RunConfig::default());
    }

    /// Settings added after configs were first written are left out of the text at their
    /// defaults (a cached run's key is the config text's hash), written and read back
    /// otherwise.
    #[test]
    fn later_settings_at_their_defaults_leave_the_text_unchanged() {
        let d = RunConfig::default().to_toml().unwrap();
        assert!(
            !d.contains("attention =") && !d.contains("clip_public_records"),
            "{d}"
        );
        let mut c = RunConfig::default();
        c.lora.attention = false;
        c.train.clip_from_public = Some(0.5);
        c.train.clip_public_records = 256;
        let t = c.to_toml().unwrap();
        assert!(t.contains("attention = false") && t.contains("clip_public_records = 256"));
        assert_eq!(RunConfig::from_toml(&t).unwrap(), c);
    }

    #[test]
    fn differences_name_every_changed_field() {
        let a = RunConfig::default();
        assert_eq!(a.differences(&a.clone()).unwrap(), Vec::<String>::new());
        let mut b = a.clone();
        b.train.steps = Some(25);
        b.privacy.epsilon = 2.0;
        b.lora.attention_targets = vec!["query".into()];
        assert_eq!(
            a.differences(&b).unwrap(),
            ["lora.attention_targets", "privacy.epsilon", "train.steps"]
        );
        assert_eq!(b.differences(&a).unwrap(), a.differences(&b).unwrap());
    }

    /// A run folder's config written when `[method]` held every method's knobs (each at its
    /// default) still reads; a user's config with such a knob does not, nor a written one
    /// whose foreign knob is away from its default.
    #[test]
    fn a_config_written_with_every_methods_knobs_still_reads_from_a_run_folder() {
        let old = "[method]\nname = \"dp-adam\"\nlayer = \"entropy\"\n\
                   owner_rule = \"gate-weighted\"\nalternate = true\nshared_steps = 1\n\
                   expert_steps = 1\nexpert_denominator = \"expected-owner\"\n\
                   expert_clip = \"role\"\nresidual = \"prob\"\nscope = \"lora\"\n\
                   muon_beta = 0.95\nmuon_momentum = \"nesterov\"\nns_polynomial = \"keller\"\n\
                   ns_steps = 5\nns_kappa = 2\nbc_probe_pairs = 1\nmuon_lr = 0.02\n";
        let c = RunConfig::from_written_toml(old).unwrap();
        assert_eq!(c.method, MethodConfig::DpAdam { scope: Scope::Lora });
        assert!(RunConfig::from_toml(old).is_err());
        let changed = old.replace("muon_lr = 0.02", "muon_lr = 0.05");
        let e = RunConfig::from_written_toml(&changed)
            .unwrap_err()
            .to_string();
        assert!(e.contains("method.muon_lr: dp-adam does not use it"), "{e}");
        // A config of the present form reads the same either way.
        let t = c.to_toml().unwrap();
        assert_eq!(RunConfig::from_written_toml(&t).unwrap(), c);
    }

    #[test]
    fn unknown_field_is_named() {
        let e = RunConfig::from_toml("[train]\nbatchsize = 3\n").unwrap_err();
        assert!(e.to_string().contains("batchsize"), "{e}");
    }

    #[test]
    fn delta_default_is_the_largest_power_of_ten_below_a_tenth_of_one_over_n() {
        assert_eq!(default_delta(1000), 1e-4);
        assert_eq!(default_delta(1001), 1e-5);
        assert_eq!(default_delta(1_714), 1e-5);
        assert_eq!(default_delta(12_750), 1e-6);
        assert_eq!(default_delta(1), 1e-1);
        for n in [1usize, 2, 9, 10, 11, 99, 100, 12_345, 1_000_000, 7_654_321] {
            let d = default_delta(n);
            assert!(d <= 1.0 / (10.0 * n as f64), "{n}: {d}");
            // the largest such power: ten times it is above 1/(10N)
            assert!(
                d * 10.0 > 1.0 / (10.0 * n as f64) * (1.0 - 1e-12),
                "{n}: {d}"
            );
        }
        assert!(delta_reason(None, 1714).contains("N = 1714"));
        assert!(delta_reason(Some(1e-6), 1714).contains("given"));
    }

    #[test]
    fn bad_values_are_errors() {
        let mut c = RunConfig::default();
        c.privacy.epsilon = 0.0;
        assert!(c.validate().is_err());
        let mut c = RunConfig {
            method: MethodConfig::new(Method::Lora),
            ..RunConfig::default()
        };
        c.privacy.epsilon = 0.0;
        assert!(c.validate().is_ok());
    }
}

#[cfg(test)]
mod path_tests {
    use super::*;

    /// Every error of a config file names the file: a value that does not parse and the
    /// problems collected with a misplaced `[method]` knob alike.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_config_files_errors_name_the_file() {
        let dir = std::env::temp_dir().join(format!("raptor-config-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text, setting) in [
            (
                "bad-value.toml",
                "[method]\nname = \"raptor\"\nresidual = \"x\"\n",
                "method.residual",
            ),
            (
                "misplaced.toml",
                "[method]\nname = \"dp-adam\"\nmuon_beta = 0.9\n",
                "method.muon_beta",
            ),
            (
                "both.toml",
                "[method]\nname = \"dp-adam\"\nmuon_beta = 0.9\n[train]\nlr = -1.0\n",
                "train.lr",
            ),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            let e = RunConfig::from_file(&path).unwrap_err().to_string();
            assert!(e.contains(&path.display().to_string()), "{name}: {e}");
            assert!(e.contains(setting), "{name}: {e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn model_names_resolve_to_the_cache_only_when_nothing_local_matches() {
        let root = std::env::temp_dir().join(format!("raptor-model-path-{}", std::process::id()));
        let (base, cache) = (root.join("cfg"), root.join("cache"));
        std::fs::create_dir_all(cache.join("models/mini")).unwrap();
        std::fs::create_dir_all(base.join("local")).unwrap();
        let r = |p: &str| resolve_model_path(Path::new(p), &base, Some(&cache));
        assert_eq!(r("mini"), cache.join("models/mini"));
        assert_eq!(r("cache:models/mini"), cache.join("models/mini"));
        assert_eq!(r("local"), base.join("local"));
        assert_eq!(r("absent"), base.join("absent"));
        assert_eq!(r("sub/mini"), base.join("sub/mini"));
        assert_eq!(r("/abs/mini"), PathBuf::from("/abs/mini"));
        std::fs::create_dir_all(base.join("mini")).unwrap();
        assert_eq!(
            r("mini"),
            base.join("mini"),
            "a folder next to the config wins"
        );
        assert_eq!(
            resolve_model_path(Path::new("mini"), &root, None),
            root.join("mini")
        );
        std::fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn cache_paths_resolve_against_the_cache_and_nothing_else_does() {
        let c = Path::new("/cache");
        assert_eq!(
            resolve_cache_path(Path::new("cache:data/rt/train.tsv"), Some(c)),
            Some(PathBuf::from("/cache/data/rt/train.tsv"))
        );
        assert_eq!(
            resolve_cache_path(Path::new("cache:/data/x.tsv"), Some(c)),
            Some(PathBuf::from("/cache/data/x.tsv"))
        );
        assert_eq!(resolve_cache_path(Path::new("data/cache:x"), Some(c)), None);
        assert_eq!(resolve_cache_path(Path::new("cache:x"), None), None);
    }

    /// Every shipped example config parses (no unknown field) and passes the data-free checks;
    /// `cache:` paths land in the cache and the rest next to the config.
    #[test]
    fn every_example_config_parses_and_validates() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.map(|e| e.path()).unwrap_or_default();
            if p.extension().is_some_and(|x| x == "toml") {
                let cfg = RunConfig::from_file(&p).unwrap_or_else(|e| panic!("{e}"));
                cfg.validate()
                    .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                assert!(cfg.data.train.is_absolute(), "{}", p.display());
                assert!(!cfg.data.train.to_string_lossy().contains("cache:"));
                n += 1;
            }
        }
        assert!(n >= 5, "found {n} example configs");
    }
}
