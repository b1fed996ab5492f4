//! Everything a run needs before its first update, built from the config: records (through
//! `raptor-data`), tokenizer, label map, model, RAPTOR's layer and owner maps, the plan.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use raptor_data::{LabelMap, TableSpec};
use raptor_models::factory::{ModelSource, ModelSpec, ScratchDims};
use raptor_models::tokenizer::{ByteTokenizer, CorpusTokenizer, Gpt2Tokenizer, TextTokenizer};
use raptor_models::{Batch, BertPooling, Model, Task};
use tch::Device;

use crate::config::{LayerSpec, Method, ModelKind, Pooling, RunConfig, TokenizerSpec};
use crate::device::open_device;
use crate::error::{Result, TrainError};
use crate::methods::{LayerChoice, PrivacyPlan, build_plan, choose_layer, owner_rule};
use crate::streams::Plan;
use crate::trainer::Example;

/// A prepared run.
pub struct Session {
    /// The resolved config.
    pub cfg: RunConfig,
    /// The model (scope set: LoRA attached, frozen parts frozen).
    pub model: Box<dyn Model>,
    /// The tokenizer.
    pub tokenizer: Box<dyn TextTokenizer>,
    /// Class names (classification).
    pub labels: Option<LabelMap>,
    /// Private training records.
    pub train: Vec<Example>,
    /// Validation records.
    pub validation: Vec<Example>,
    /// The plan.
    pub plan: Plan,
    /// The privacy plan.
    pub privacy: PrivacyPlan,
    /// RAPTOR's layer choice.
    pub layer: Option<LayerChoice>,
    /// Owner maps of the trained layers over the training records.
    pub owners: BTreeMap<usize, Vec<i64>>,
    /// Device.
    pub device: Device,
    /// Padding id.
    pub pad_id: i64,
    /// Data-to-text validation sources (prompt tokens, references) for generation metrics.
    pub validation_sources: Vec<SourceRefs>,
    /// A white-box audit run's Dirac canaries (set only by
    /// [`crate::run::train_prepared_with_canaries`]; None for every other run).
    pub(crate) canaries: Option<crate::trainer::DiracCanaries>,
}

/// A data-to-text source and its references (for BLEU / ROUGE-L).
#[derive(Debug, Clone, PartialEq)]
pub struct SourceRefs {
    /// The source text.
    pub source: String,
    /// The prompt tokens.
    pub prompt: Vec<i64>,
    /// All references of the source.
    pub references: Vec<String>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("method", &self.cfg.method.name)
            .field("train", &self.train.len())
            .field("validation", &self.validation.len())
            .finish_non_exhaustive()
    }
}

fn data_err(e: raptor_data::DataError) -> TrainError {
    TrainError::Data(e.to_string())
}

/// Opens the configured tokenizer (never trained on private records); a `tokenizer.json` is read
/// with its padding and truncation off (raptor pads batches and truncates records itself).
pub fn open_tokenizer(spec: &str) -> Result<Box<dyn TextTokenizer>> {
    Ok(match spec {
        "bytes" => Box::new(ByteTokenizer),
        "gpt2" => Box::new(Gpt2Tokenizer::new()?),
        path => {
            if !Path::new(path).exists() {
                return Err(TrainError::Config(format!(
                    "model.tokenizer: {path} does not exist (use bytes, gpt2 or a tokenizer.json path)"
                )));
            }
            Box::new(CorpusTokenizer::from_file_unpadded(path)?)
        }
    })
}

/// The GGUF file a `model.path` names, if it names one: a `.gguf` file, a folder holding exactly
/// one `.gguf` file, or (when the path does not exist) the name of a model folder in
/// `<cache>/models/` that `cargo xtask setup --models` filled, e.g. `smollm2-135m-instruct`.
pub fn gguf_model_file(path: &Path) -> Option<PathBuf> {
    let models = raptor_data::cache::default_cache_dir().map(|c| c.join("models"));
    raptor_models::factory::gguf_model_file(path, models.as_deref())
}

/// `model.path`, resolved: a GGUF file ([`gguf_model_file`]) or the Hugging Face folder as
/// written. A path that does not exist is an error saying how the cache's models are fetched.
fn model_source(path: &Path) -> Result<(PathBuf, bool)> {
    if let Some(f) = gguf_model_file(path) {
        return Ok((f, true));
    }
    if !path.exists() {
        return Err(TrainError::Config(format!(
            "model.path {} does not exist (a bare name such as smollm2-135m-instruct means \
             <cache>/models/<name>/, which `cargo xtask setup --models` fills)",
            path.display()
        )));
    }
    Ok((path.to_path_buf(), false))
}

/// Opens the tokenizer of `cfg`: [`open_tokenizer`], or with `model.tokenizer = "gguf"` the
/// byte-level BPE stored in the GGUF model file of `model.path`.
pub fn open_model_tokenizer(cfg: &RunConfig) -> Result<Box<dyn TextTokenizer>> {
    let file = match &cfg.model.tokenizer {
        TokenizerSpec::Gguf => gguf_tokenizer_file(cfg)?,
        other @ (TokenizerSpec::Bytes
        | TokenizerSpec::Gpt2
        | TokenizerSpec::Model
        | TokenizerSpec::File(_)) => return open_tokenizer(&other.to_string()),
    };
    let f = raptor_models::gguf::GgufFile::open(&file)?;
    Ok(Box::new(raptor_models::gguf_model::gguf_tokenizer(&f)?))
}

fn gguf_tokenizer_file(cfg: &RunConfig) -> Result<PathBuf> {
    let p = cfg.model.path.as_ref().ok_or_else(|| {
        TrainError::Config("model.tokenizer = \"gguf\" needs model.path naming a GGUF model".into())
    })?;
    gguf_model_file(p).ok_or_else(|| {
        TrainError::Config(format!(
            "model.tokenizer = \"gguf\": model.path {} is not a GGUF model",
            p.display()
        ))
    })
}

/// The end-of-sequence id of a GGUF file's tokenizer (read once per file and process).
fn gguf_eos(cfg: &RunConfig) -> u32 {
    use std::sync::{Mutex, OnceLock};
    static SEEN: OnceLock<Mutex<BTreeMap<PathBuf, u32>>> = OnceLock::new();
    let Ok(file) = gguf_tokenizer_file(cfg) else {
        return 0;
    };
    let seen = SEEN.get_or_init(|| Mutex::new(BTreeMap::new()));
    if let Some(&id) = seen.lock().ok().as_ref().and_then(|m| m.get(&file)) {
        return id;
    }
    let id = raptor_models::gguf::GgufFile::open(&file)
        .and_then(|f| raptor_models::gguf_model::gguf_special_ids(&f))
        .ok()
        .and_then(|ids| ids.eos)
        .unwrap_or(0);
    if let Ok(mut m) = seen.lock() {
        m.insert(file, id);
    }
    id
}

/// Opens the run's tokenizer: [`open_tokenizer`] of `model.tokenizer`, where `gguf` is the GGUF
/// model file's ([`open_model_tokenizer`]) and `model` is
/// `<model.path>/tokenizer.json`; a `tokenizer.json` of a `bert` model also wraps each record
/// in its template's special tokens (`[CLS] … [SEP]`, see
/// [`TextTokenizer::special_ids`]).
pub fn open_run_tokenizer(cfg: &RunConfig) -> Result<Box<dyn TextTokenizer>> {
    let tokenizer = &cfg.model.tokenizer;
    let spec = match (tokenizer, &cfg.model.path) {
        (TokenizerSpec::Gguf, _) => return open_model_tokenizer(cfg),
        (TokenizerSpec::Model, Some(p)) => p.join("tokenizer.json").to_string_lossy().into_owned(),
        (TokenizerSpec::Model, None) => {
            return Err(TrainError::Config(
                "model.tokenizer = \"model\" needs model.path".into(),
            ));
        }
        (TokenizerSpec::Bytes | TokenizerSpec::Gpt2 | TokenizerSpec::File(_), _) => {
            tokenizer.to_string()
        }
    };
    let json_file = match tokenizer {
        TokenizerSpec::Model | TokenizerSpec::File(_) => true,
        TokenizerSpec::Bytes | TokenizerSpec::Gpt2 | TokenizerSpec::Gguf => false,
    };
    if cfg.model.kind.is_bert() && json_file {
        if !Path::new(&spec).exists() {
            return Err(TrainError::Config(format!(
                "model.tokenizer: {spec} does not exist{}",
                setup_hint(Path::new(&spec))
            )));
        }
        return Ok(Box::new(
            CorpusTokenizer::from_file_unpadded(&spec)?.with_special_tokens()?,
        ));
    }
    open_tokenizer(&spec)
}

/// " (… run `cargo xtask setup --models` …)" when `path` lies in the cache's model folder.
fn setup_hint(path: &Path) -> &'static str {
    match raptor_data::cache::default_cache_dir() {
        Some(c) if path.starts_with(c.join("models")) => {
            " (a model of the cache: run `cargo xtask setup --models` first)"
        }
        _ => "",
    }
}

/// Whether the model classifies (else: language modelling over the text column).
pub fn is_classifier(cfg: &RunConfig) -> bool {
    !cfg.model.kind.is_language_model()
}

/// Reads a table with the config's columns.
pub fn read_records(cfg: &RunConfig, path: &Path, labelled: bool) -> Result<raptor_data::Dataset> {
    let label = labelled.then_some(cfg.data.label_column.as_str());
    let spec = TableSpec::new(&cfg.data.text_column, label);
    let ds = raptor_data::read_table(path, &spec).map_err(data_err)?;
    if ds.is_empty() {
        return Err(TrainError::Data(format!(
            "{} holds no record",
            path.display()
        )));
    }
    Ok(ds)
}

/// Tokenizes records into examples (ids = the records' ids in their file).
pub fn to_examples(
    cfg: &RunConfig,
    tok: &dyn TextTokenizer,
    records: &[raptor_data::Record],
    labels: Option<&LabelMap>,
    vocab: i64,
) -> Result<Vec<Example>> {
    let mut out = Vec::with_capacity(records.len());
    let lm = !is_classifier(cfg);
    let (pre, post) = tok.special_ids();
    let (pre, post): (Vec<i64>, Vec<i64>) = (
        pre.into_iter().map(i64::from).collect(),
        post.into_iter().map(i64::from).collect(),
    );
    for r in records {
        let mut ids: Vec<i64> = tok.encode(&r.text)?.into_iter().map(i64::from).collect();
        if lm {
            ids.truncate(cfg.data.max_length.saturating_sub(1));
            ids.push(eos_id(cfg) as i64);
        } else if !pre.is_empty() || !post.is_empty() {
            ids.truncate(cfg.data.max_length.saturating_sub(pre.len() + post.len()));
            if !ids.is_empty() {
                ids = pre.iter().chain(&ids).chain(&post).copied().collect();
            }
        } else {
            ids.truncate(cfg.data.max_length);
        }
        if ids.is_empty() || (lm && ids.len() < 2) {
            return Err(TrainError::Data(format!(
                "record {} (line {}) has no token after tokenization",
                r.id,
                r.id + 2
            )));
        }
        if let Some(&bad) = ids.iter().find(|&&i| i < 0 || i >= vocab) {
            return Err(TrainError::Data(format!(
                "record {}: token id {bad} is outside the model's vocabulary of {vocab}",
                r.id
            )));
        }
        let label = match labels {
            Some(m) => Some(m.encode(r).map_err(data_err)? as i64),
            None => None,
        };
        out.push(Example {
            id: r.id as u64,
            tokens: ids,
            label,
            prompt_len: 0,
        });
    }
    Ok(out)
}

/// Reads a data-to-text file (`data.format` = `e2e` or `dart`).
pub fn read_d2t(cfg: &RunConfig, path: &Path) -> Result<raptor_data::D2tDataset> {
    let ds = raptor_data::read_d2t(cfg.data.format.name(), path).map_err(data_err)?;
    if ds.is_empty() {
        return Err(TrainError::Data(format!(
            "{} holds no record",
            path.display()
        )));
    }
    Ok(ds)
}

/// The prompt of a source: `<source> =` (the model continues with the reference).
pub fn d2t_prompt(tok: &dyn TextTokenizer, source: &str, max_length: usize) -> Result<Vec<i64>> {
    let mut p: Vec<i64> = tok
        .encode(&format!("{source} ="))?
        .into_iter()
        .map(i64::from)
        .collect();
    p.truncate(max_length.saturating_sub(8).max(1));
    Ok(p)
}

/// Tokenizes (source, reference) records: prompt tokens, then the reference and EOS; the loss is
/// on the reference and EOS only.
pub fn to_d2t_examples(
    cfg: &RunConfig,
    tok: &dyn TextTokenizer,
    records: &[raptor_data::D2tRecord],
    vocab: i64,
) -> Result<Vec<Example>> {
    let max = cfg.data.max_length;
    let eos = i64::from(eos_id(cfg));
    let mut out = Vec::with_capacity(records.len());
    for r in records {
        let prompt = d2t_prompt(tok, &r.source, max)?;
        let mut target: Vec<i64> = tok
            .encode(&format!(" {}", r.target))?
            .into_iter()
            .map(i64::from)
            .collect();
        target.truncate(max.saturating_sub(prompt.len() + 1));
        let mut tokens = prompt.clone();
        tokens.extend(target);
        tokens.push(eos);
        if let Some(&bad) = tokens.iter().find(|&&i| i < 0 || i >= vocab) {
            return Err(TrainError::Data(format!(
                "record {}: token id {bad} is outside the model's vocabulary of {vocab}",
                r.id
            )));
        }
        out.push(Example {
            id: r.id as u64,
            tokens,
            label: None,
            prompt_len: prompt.len(),
        });
    }
    Ok(out)
}

/// The end-of-sequence id of the configured tokenizer.
pub fn eos_id(cfg: &RunConfig) -> u32 {
    match cfg.model.tokenizer {
        TokenizerSpec::Bytes => ByteTokenizer::EOS,
        TokenizerSpec::Gpt2 => raptor_models::tokenizer::GPT2_EOS,
        TokenizerSpec::Gguf => gguf_eos(cfg),
        TokenizerSpec::Model | TokenizerSpec::File(_) => 0,
    }
}

fn bert_pooling(cfg: &RunConfig) -> BertPooling {
    match cfg.model.pooling {
        Pooling::Pooler => BertPooling::Pooler,
        Pooling::Mean => BertPooling::Mean,
    }
}

/// Builds the model (from a Hugging Face folder, a GGUF file or from scratch; seeded by
/// `train.seed`) with raptor-models' factory.
pub fn build_model(
    cfg: &RunConfig,
    vocab: i64,
    num_labels: i64,
    device: Device,
) -> Result<Box<dyn Model>> {
    let m = &cfg.model;
    let source = match &m.path {
        None => None,
        Some(p) if m.kind.is_bert() => {
            if !p.exists() {
                return Err(TrainError::Config(format!(
                    "model.path {} does not exist{}",
                    p.display(),
                    setup_hint(p)
                )));
            }
            Some(ModelSource::Folder(p.clone()))
        }
        Some(p)
            if matches!(
                m.kind,
                ModelKind::Llama | ModelKind::Mixtral | ModelKind::Qwen2Moe
            ) =>
        {
            Some(match model_source(p)? {
                (f, true) => ModelSource::Gguf(f),
                (f, false) => ModelSource::Folder(f),
            })
        }
        Some(p) => Some(ModelSource::Folder(p.clone())),
    };
    let spec = ModelSpec {
        family: m.kind.naming(),
        source,
        dims: ScratchDims {
            d_model: m.d_model,
            heads: m.heads,
            d_ff: m.d_ff,
            layers: m.layers,
            experts: m.experts,
        },
        vocab,
        num_labels,
        pooling: bert_pooling(cfg),
        max_positions: cfg.data.max_length as i64,
        seed: cfg.train.seed as i64,
    };
    raptor_models::factory::build(&spec, device).map_err(|e| match e {
        // A checkpoint of another family: say which settings disagree.
        raptor_models::ModelError::WrongFamily { path, found, .. } => TrainError::Config(format!(
            "model.path {path} holds a {found} checkpoint, not model.kind {:?}",
            m.kind
        )),
        other => other.into(),
    })
}

/// Batches of `examples` (for routing collection), `size` records each.
fn batches(
    examples: &[Example],
    size: usize,
    pad: i64,
    device: Device,
    labelled: bool,
) -> Result<Vec<Batch>> {
    let mut out = Vec::new();
    for chunk in examples.chunks(size.max(1)) {
        let toks: Vec<Vec<i64>> = chunk.iter().map(|e| e.tokens.clone()).collect();
        let labels: Option<Vec<i64>> =
            labelled.then(|| chunk.iter().map(|e| e.label.unwrap_or(0)).collect());
        out.push(Batch::from_records(&toks, pad, labels.as_deref(), device)?);
    }
    Ok(out)
}

/// What a [`prepare_with`] hook knows about the data when it may change the training records.
#[derive(Debug, Clone, PartialEq)]
pub struct DataInfo {
    /// Whether the model classifies (else: language modelling).
    pub classifier: bool,
    /// Number of classes (0 for language models).
    pub num_labels: usize,
    /// The model's vocabulary size.
    pub vocab: i64,
    /// Padding id.
    pub pad_id: i64,
    /// End-of-sequence id.
    pub eos_id: i64,
    /// `data.max_length`.
    pub max_length: usize,
    /// The largest record id among the training and validation records (fresh ids start above).
    pub max_id: u64,
}

/// A hook that may change the training records after they are read and before anything is
/// computed from them (the plan's N and q, owner maps): the canaries of `raptor audit`.
pub type TrainHook<'a> = &'a mut dyn FnMut(&mut Vec<Example>, &DataInfo) -> Result<()>;

fn apply_hook(
    hook: Option<TrainHook<'_>>,
    train: &mut Vec<Example>,
    validation: &[Example],
    info: DataInfo,
) -> Result<()> {
    if let Some(h) = hook {
        let max_id = train
            .iter()
            .chain(validation)
            .map(|e| e.id)
            .max()
            .unwrap_or(0);
        h(train, &DataInfo { max_id, ..info })?;
        if train.is_empty() {
            return Err(TrainError::Data(
                "no training record is left after the hook".into(),
            ));
        }
    }
    Ok(())
}

/// Prepares a run from its config: reads and checks everything before training starts, so a
/// bad input fails here, with nothing written.
pub fn prepare(cfg: &RunConfig) -> Result<Session> {
    prepare_with(cfg, None)
}

/// [`prepare`], with a hook that may change the training records before the plan (N, q, σ) and
/// the owner maps are computed from them.
pub fn prepare_with(cfg: &RunConfig, hook: Option<TrainHook<'_>>) -> Result<Session> {
    prepare_counting(cfg, hook, 0)
}

/// The label set of a classifier: `data.labels` when declared (public), else the labels of
/// the training records; at least two.
fn label_map(cfg: &RunConfig, train_ds: &raptor_data::Dataset) -> Result<LabelMap> {
    let m = match &cfg.data.labels {
        Some(list) => LabelMap::from_list(list.clone())
            .map_err(|e| TrainError::Config(format!("data.labels: {e}")))?,
        None => LabelMap::from_records(&train_ds.records).map_err(data_err)?,
    };
    if m.len() < 2 {
        return Err(TrainError::Data(format!(
            "{}: column {} holds fewer than two distinct labels ({:?})",
            cfg.data.train.display(),
            cfg.data.label_column,
            m.labels()
        )));
    }
    Ok(m)
}

/// Training and validation records: `data.validation` when given, else a seeded split of the
/// training file by `data.validation_fraction`, else no validation.
fn split_records(
    cfg: &RunConfig,
    train_ds: &raptor_data::Dataset,
    classify: bool,
) -> Result<(Vec<raptor_data::Record>, Vec<raptor_data::Record>)> {
    Ok(match &cfg.data.validation {
        Some(p) => (
            train_ds.records.clone(),
            read_records(cfg, p, classify)?.records,
        ),
        None if cfg.data.validation_fraction > 0.0 => {
            let split = raptor_data::validation_split(
                &train_ds.ids(),
                cfg.data.validation_fraction,
                cfg.train.seed,
            )
            .map_err(data_err)?;
            (
                train_ds.select(&split.kept),
                train_ds.select(&split.held_out),
            )
        }
        None => (train_ds.records.clone(), Vec::new()),
    })
}

/// RAPTOR's sparse layer (methods with experts), from the public corpus's routing under the
/// entropy rule, or by the configured position; no private record is involved. Methods
/// without experts get none (a classifier trained with (DP-Adam) LoRA must still have a sparse
/// layer: its experts are part of the scope).
fn public_layer(
    cfg: &RunConfig,
    model: &dyn Model,
    tokenizer: &dyn TextTokenizer,
    pad_id: i64,
    device: Device,
) -> Result<Option<LayerChoice>> {
    let classify = is_classifier(cfg);
    let model_vocab = model.vocab_size();
    if cfg.method.name.needs_experts() {
        let sparse = model.sparse_layers();
        // Only the entropy rule reads the public corpus's routing.
        let public = match (&cfg.data.public, cfg.method.layer) {
            (Some(p), LayerSpec::Entropy) => {
                let ds = read_records(cfg, p, false)?;
                let ex = to_examples(cfg, tokenizer, &ds.records, None, model_vocab)?;
                let bs = batches(&ex, 64, pad_id, device, classify)?;
                let routing = raptor_models::collect_routing(model, bs.iter())?;
                let mut corpus = raptor_routing::PublicCorpus::new();
                for (l, r) in routing {
                    corpus.add_layer(l, r)?;
                }
                Some(corpus)
            }
            (None, _) | (Some(_), LayerSpec::First | LayerSpec::Last | LayerSpec::Block(_)) => None,
        };
        Ok(Some(choose_layer(cfg, &sparse, public.as_ref())?))
    } else {
        if !cfg.model.kind.is_language_model()
            && matches!(cfg.method.name, Method::DpAdamLora | Method::Lora)
            && model.sparse_layers().is_empty()
        {
            return Err(TrainError::Config("the model has no sparse layer".into()));
        }
        Ok(None)
    }
}

/// Owner maps of the plan's owner layers over the private training records, once, from the
/// frozen model (expert LoRA B = 0 at this point, so the routing is the pretrained one). Each
/// record is routed on its own: its owner cannot depend on the other records.
fn owner_maps(
    cfg: &RunConfig,
    model: &dyn Model,
    plan: &Plan,
    train: &[Example],
    pad_id: i64,
    device: Device,
) -> Result<BTreeMap<usize, Vec<i64>>> {
    let mut owners = BTreeMap::new();
    let owner_layers: Vec<usize> = plan
        .phases
        .iter()
        .flat_map(|p| p.owner_layers.clone())
        .collect();
    if !owner_layers.is_empty() {
        let tokens: Vec<Vec<i64>> = train.iter().map(|e| e.tokens.clone()).collect();
        let maps =
            raptor_models::owners_per_record(model, &tokens, pad_id, owner_rule(cfg), device)?;
        for l in owner_layers {
            let v = maps
                .get(&l)
                .ok_or_else(|| TrainError::Config(format!("no routing for layer {l}")))?;
            owners.insert(l, v.clone());
        }
    }
    Ok(owners)
}

/// At most `cap` of `records`, evenly strided (every record at `cap` = 0 or ≥ their number);
/// public records only, so the choice may depend on their count.
fn strided<T: Clone>(records: &[T], cap: usize) -> Vec<T> {
    let n = records.len();
    if cap == 0 || cap >= n {
        return records.to_vec();
    }
    (0..cap).map(|i| records[i * n / cap].clone()).collect()
}

/// Clip bounds from the public file `public_file` (quantile `q` of the public records'
/// gradient norms, labelled with the run's label set and routed one by one), written into
/// `plan`; what was chosen, for the record.
#[allow(clippy::too_many_arguments)]
fn public_clip_bounds(
    cfg: &RunConfig,
    model: &dyn Model,
    tokenizer: &dyn TextTokenizer,
    labels: Option<&LabelMap>,
    plan: &mut Plan,
    public_file: &Path,
    q: f64,
    pad_id: i64,
    device: Device,
) -> Result<crate::public_clip::PublicClip> {
    let ds = read_records(cfg, public_file, is_classifier(cfg))?;
    let records = strided(&ds.records, cfg.train.clip_public_records);
    let public = to_examples(cfg, tokenizer, &records, labels, model.vocab_size())?;
    let layers: Vec<usize> = plan
        .phases
        .iter()
        .flat_map(|ph| ph.owner_layers.clone())
        .collect();
    let public_owners = if layers.is_empty() {
        BTreeMap::new()
    } else {
        let tokens: Vec<Vec<i64>> = public.iter().map(|e| e.tokens.clone()).collect();
        raptor_models::owners_per_record(model, &tokens, pad_id, owner_rule(cfg), device)?
    };
    crate::public_clip::calibrate(model, plan, &public, &public_owners, q, pad_id, device)
}

/// [`prepare_with`], the plan made for `extra_records` records beside the training records
/// (a white-box audit's canaries: records without tokens).
pub fn prepare_counting(
    cfg: &RunConfig,
    hook: Option<TrainHook<'_>>,
    extra_records: usize,
) -> Result<Session> {
    cfg.validate()?;
    let device = open_device(cfg.train.device)?;
    if !cfg.data.train.exists() {
        let hint = match raptor_data::cache::default_cache_dir() {
            Some(c) if cfg.data.train.starts_with(c.join("data")) => {
                " (a corpus of the cache: run `cargo xtask setup --data` first)"
            }
            _ => "",
        };
        return Err(TrainError::Data(format!(
            "training file {} does not exist{hint}",
            cfg.data.train.display()
        )));
    }
    let classify = is_classifier(cfg);
    let tokenizer = open_run_tokenizer(cfg)?;
    let vocab = tokenizer.vocab_size() as i64;
    let pad_id = i64::from(tokenizer.pad_id());
    if cfg.data.format.is_data_to_text() {
        return prepare_d2t(cfg, device, tokenizer, vocab, pad_id, hook, extra_records);
    }
    let train_ds = read_records(cfg, &cfg.data.train, classify)?;
    let labels = if classify {
        Some(label_map(cfg, &train_ds)?)
    } else {
        None
    };
    let (train_recs, valid_recs) = split_records(cfg, &train_ds, classify)?;
    if train_recs.is_empty() {
        return Err(TrainError::Data(
            "no training record is left after the validation split".into(),
        ));
    }
    let num_labels = labels.as_ref().map_or(0, |m| m.len() as i64);
    let mut model = build_model(cfg, vocab, num_labels, device)?;
    let model_vocab = model.vocab_size();
    let mut train = to_examples(
        cfg,
        tokenizer.as_ref(),
        &train_recs,
        labels.as_ref(),
        model_vocab,
    )?;
    let validation = to_examples(
        cfg,
        tokenizer.as_ref(),
        &valid_recs,
        labels.as_ref(),
        model_vocab,
    )?;
    apply_hook(
        hook,
        &mut train,
        &validation,
        DataInfo {
            classifier: classify,
            num_labels: num_labels as usize,
            vocab: model_vocab,
            pad_id,
            eos_id: i64::from(eos_id(cfg)),
            max_length: cfg.data.max_length,
            max_id: 0,
        },
    )?;
    // RAPTOR's layer from public routing (no private record is involved).
    let layer = public_layer(cfg, model.as_ref(), tokenizer.as_ref(), pad_id, device)?;
    let (plan, privacy) =
        raptor_models::rng::seeded(cfg.train.seed.wrapping_add(1) as i64, || {
            build_plan(
                cfg,
                model.as_mut(),
                train.len() + extra_records,
                layer.as_ref().map(|l| l.layer),
            )
        })?;
    if cfg.lora.dropout > 0.0 && train.iter().any(|e| e.id == u64::MAX) {
        return Err(TrainError::Config("LoRA dropout needs record ids".into()));
    }
    let owners = owner_maps(cfg, model.as_ref(), &plan, &train, pad_id, device)?;
    if model.task() == Task::Classification && labels.is_none() {
        return Err(TrainError::Config(
            "a classifier needs a label column".into(),
        ));
    }
    let mut plan = plan;
    let mut privacy = privacy;
    if let (Some(q), Some(p)) = (cfg.train.clip_from_public, &cfg.data.public) {
        privacy.public_clip = Some(public_clip_bounds(
            cfg,
            model.as_ref(),
            tokenizer.as_ref(),
            labels.as_ref(),
            &mut plan,
            p,
            q,
            pad_id,
            device,
        )?);
    }
    Ok(Session {
        cfg: cfg.clone(),
        model,
        tokenizer,
        labels,
        train,
        validation,
        plan,
        privacy,
        layer,
        owners,
        device,
        pad_id,
        validation_sources: Vec::new(),
        canaries: None,
    })
}

fn prepare_d2t(
    cfg: &RunConfig,
    device: Device,
    tokenizer: Box<dyn TextTokenizer>,
    vocab: i64,
    pad_id: i64,
    hook: Option<TrainHook<'_>>,
    extra_records: usize,
) -> Result<Session> {
    let train_ds = read_d2t(cfg, &cfg.data.train)?;
    let (train_recs, valid_recs) = match &cfg.data.validation {
        Some(p) => (train_ds.records.clone(), read_d2t(cfg, p)?.records),
        None if cfg.data.validation_fraction > 0.0 => {
            let ids: Vec<usize> = train_ds.records.iter().map(|r| r.id).collect();
            let split =
                raptor_data::validation_split(&ids, cfg.data.validation_fraction, cfg.train.seed)
                    .map_err(data_err)?;
            let pick = |keep: &[usize]| -> Vec<raptor_data::D2tRecord> {
                train_ds
                    .records
                    .iter()
                    .filter(|r| keep.binary_search(&r.id).is_ok())
                    .cloned()
                    .collect()
            };
            let mut kept = split.kept.clone();
            kept.sort_unstable();
            let mut held = split.held_out.clone();
            held.sort_unstable();
            (pick(&kept), pick(&held))
        }
        None => (train_ds.records.clone(), Vec::new()),
    };
    if train_recs.is_empty() {
        return Err(TrainError::Data(
            "no training record is left after the validation split".into(),
        ));
    }
    let mut model = build_model(cfg, vocab, 0, device)?;
    let model_vocab = model.vocab_size();
    let mut train = to_d2t_examples(cfg, tokenizer.as_ref(), &train_recs, model_vocab)?;
    let validation = to_d2t_examples(cfg, tokenizer.as_ref(), &valid_recs, model_vocab)?;
    apply_hook(
        hook,
        &mut train,
        &validation,
        DataInfo {
            classifier: false,
            num_labels: 0,
            vocab: model_vocab,
            pad_id,
            eos_id: i64::from(eos_id(cfg)),
            max_length: cfg.data.max_length,
            max_id: 0,
        },
    )?;
    let valid_ds = raptor_data::D2tDataset {
        path: cfg.data.train.clone(),
        records: valid_recs,
        skipped_empty: 0,
    };
    let mut validation_sources = Vec::new();
    for g in valid_ds.group_by_source() {
        if cfg.eval.max_sources > 0 && validation_sources.len() >= cfg.eval.max_sources {
            break;
        }
        validation_sources.push(SourceRefs {
            prompt: d2t_prompt(tokenizer.as_ref(), &g.source, cfg.data.max_length)?,
            source: g.source,
            references: g.references,
        });
    }
    let (plan, privacy) =
        raptor_models::rng::seeded(cfg.train.seed.wrapping_add(1) as i64, || {
            build_plan(cfg, model.as_mut(), train.len() + extra_records, None)
        })?;
    Ok(Session {
        cfg: cfg.clone(),
        model,
        tokenizer,
        labels: None,
        train,
        validation,
        plan,
        privacy,
        layer: None,
        owners: BTreeMap::new(),
        device,
        pad_id,
        validation_sources,
        canaries: None,
    })
}

#[cfg(test)]
mod tests {
    use super::strided;

    /// The cap takes evenly spaced records, every one when it is 0 or not below their number.
    #[test]
    fn strided_takes_evenly_spaced_records() {
        let v: Vec<usize> = (0..10).collect();
        assert_eq!(strided(&v, 0), v);
        assert_eq!(strided(&v, 10), v);
        assert_eq!(strided(&v, 25), v);
        assert_eq!(strided(&v, 5), [0, 2, 4, 6, 8]);
        assert_eq!(strided(&v, 3), [0, 3, 6]);
        assert_eq!(strided(&v, 1), [0]);
    }
}
