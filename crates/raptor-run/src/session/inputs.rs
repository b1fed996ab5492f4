//! The input half of a run's preparation: the tokenizer a config names (a keyword, a
//! `tokenizer.json`, the one of `model.path`, or a GGUF file's), the records read through
//! `raptor-data` with the config's columns, and their tokenization into [`Example`]s
//! (classification with the tokenizer's special tokens, language modelling with EOS,
//! data-to-text prompts with the loss on the reference only).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use raptor_data::{LabelMap, TableSpec};
use raptor_models::tokenizer::{ByteTokenizer, CorpusTokenizer, Gpt2Tokenizer, TextTokenizer};

use crate::error::{Result, RunError};
use raptor_train::config::{Choice, DataConfig, ModelConfig, TokenizerSpec};
use raptor_train::trainer::Example;

pub(super) fn data_err(e: raptor_data::DataError) -> RunError {
    RunError::Data(e.to_string())
}

/// Opens the configured tokenizer (never trained on private records); a `tokenizer.json` is read
/// with its padding and truncation off (raptor pads batches and truncates records itself).
pub fn open_tokenizer(spec: &str) -> Result<Box<dyn TextTokenizer>> {
    Ok(match spec {
        "bytes" => Box::new(ByteTokenizer),
        "gpt2" => Box::new(Gpt2Tokenizer::new()?),
        path => {
            if !Path::new(path).exists() {
                return Err(RunError::Config(format!(
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
pub(super) fn model_source(path: &Path) -> Result<(PathBuf, bool)> {
    if let Some(f) = gguf_model_file(path) {
        return Ok((f, true));
    }
    if !path.exists() {
        return Err(RunError::Config(format!(
            "model.path {} does not exist (a bare name such as smollm2-135m-instruct means \
             <cache>/models/<name>/, which `cargo xtask setup --models` fills)",
            path.display()
        )));
    }
    Ok((path.to_path_buf(), false))
}

/// Opens the tokenizer of `[model]`: [`open_tokenizer`], or with `model.tokenizer = "gguf"` the
/// byte-level BPE stored in the GGUF model file of `model.path`.
pub fn open_model_tokenizer(model: &ModelConfig) -> Result<Box<dyn TextTokenizer>> {
    let file = match &model.tokenizer {
        TokenizerSpec::Gguf => gguf_tokenizer_file(model)?,
        other @ (TokenizerSpec::Bytes
        | TokenizerSpec::Gpt2
        | TokenizerSpec::Model
        | TokenizerSpec::File(_)) => return open_tokenizer(&other.to_string()),
    };
    let f = raptor_models::gguf::GgufFile::open(&file)?;
    Ok(Box::new(raptor_models::gguf_model::gguf_tokenizer(&f)?))
}

fn gguf_tokenizer_file(model: &ModelConfig) -> Result<PathBuf> {
    let p = model.path.as_ref().ok_or_else(|| {
        RunError::Config("model.tokenizer = \"gguf\" needs model.path naming a GGUF model".into())
    })?;
    gguf_model_file(p).ok_or_else(|| {
        RunError::Config(format!(
            "model.tokenizer = \"gguf\": model.path {} is not a GGUF model",
            p.display()
        ))
    })
}

/// The end-of-sequence id of a GGUF file's tokenizer (read once per file and process).
fn gguf_eos(model: &ModelConfig) -> u32 {
    use std::sync::{Mutex, OnceLock};
    static SEEN: OnceLock<Mutex<BTreeMap<PathBuf, u32>>> = OnceLock::new();
    let Ok(file) = gguf_tokenizer_file(model) else {
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
pub fn open_run_tokenizer(model: &ModelConfig) -> Result<Box<dyn TextTokenizer>> {
    let tokenizer = &model.tokenizer;
    let spec = match (tokenizer, &model.path) {
        (TokenizerSpec::Gguf, _) => return open_model_tokenizer(model),
        (TokenizerSpec::Model, Some(p)) => p.join("tokenizer.json").to_string_lossy().into_owned(),
        (TokenizerSpec::Model, None) => {
            return Err(RunError::Config(
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
    if model.kind.is_bert() && json_file {
        if !Path::new(&spec).exists() {
            return Err(RunError::Config(format!(
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
pub(super) fn setup_hint(path: &Path) -> &'static str {
    match raptor_data::cache::default_cache_dir() {
        Some(c) if path.starts_with(c.join("models")) => {
            " (a model of the cache: run `cargo xtask setup --models` first)"
        }
        _ => "",
    }
}

/// Whether the model classifies (else: language modelling over the text column).
pub fn is_classifier(model: &ModelConfig) -> bool {
    !model.kind.is_language_model()
}

/// How records become token sequences: the length limit, whether the model is a language model
/// (records end with EOS) and its end-of-sequence id; resolved once from `[data]` and `[model]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoding {
    /// `data.max_length`: tokens per record at most.
    pub max_length: usize,
    /// Whether the model is a language model (else a classifier).
    pub language_model: bool,
    /// The tokenizer's end-of-sequence id ([`eos_id`]).
    pub eos: u32,
}

impl Encoding {
    /// The encoding of a run with these `[data]` and `[model]` sections.
    pub fn of(data: &DataConfig, model: &ModelConfig) -> Self {
        Self {
            max_length: data.max_length,
            language_model: !is_classifier(model),
            eos: eos_id(model),
        }
    }
}

/// Reads a table with the config's columns.
pub fn read_records(
    data: &DataConfig,
    path: &Path,
    labelled: bool,
) -> Result<raptor_data::Dataset> {
    let label = labelled.then_some(data.label_column.as_str());
    let spec = TableSpec::new(&data.text_column, label);
    let ds = raptor_data::read_table(path, &spec).map_err(data_err)?;
    if ds.is_empty() {
        return Err(RunError::Data(format!(
            "{} holds no record",
            path.display()
        )));
    }
    Ok(ds)
}

/// Tokenizes records into examples (ids = the records' ids in their file).
pub fn to_examples(
    enc: Encoding,
    tok: &dyn TextTokenizer,
    records: &[raptor_data::Record],
    labels: Option<&LabelMap>,
    vocab: i64,
) -> Result<Vec<Example>> {
    let mut out = Vec::with_capacity(records.len());
    let lm = enc.language_model;
    let (pre, post) = tok.special_ids();
    let (pre, post): (Vec<i64>, Vec<i64>) = (
        pre.into_iter().map(i64::from).collect(),
        post.into_iter().map(i64::from).collect(),
    );
    for r in records {
        let mut ids: Vec<i64> = tok.encode(&r.text)?.into_iter().map(i64::from).collect();
        if lm {
            ids.truncate(enc.max_length.saturating_sub(1));
            ids.push(i64::from(enc.eos));
        } else if !pre.is_empty() || !post.is_empty() {
            ids.truncate(enc.max_length.saturating_sub(pre.len() + post.len()));
            if !ids.is_empty() {
                ids = pre.iter().chain(&ids).chain(&post).copied().collect();
            }
        } else {
            ids.truncate(enc.max_length);
        }
        if ids.is_empty() || (lm && ids.len() < 2) {
            return Err(RunError::Data(format!(
                "record {} (line {}) has no token after tokenization",
                r.id,
                r.id + 2
            )));
        }
        if let Some(&bad) = ids.iter().find(|&&i| i < 0 || i >= vocab) {
            return Err(RunError::Data(format!(
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
pub fn read_d2t(data: &DataConfig, path: &Path) -> Result<raptor_data::D2tDataset> {
    let ds = raptor_data::read_d2t(data.format.name(), path).map_err(data_err)?;
    if ds.is_empty() {
        return Err(RunError::Data(format!(
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
    enc: Encoding,
    tok: &dyn TextTokenizer,
    records: &[raptor_data::D2tRecord],
    vocab: i64,
) -> Result<Vec<Example>> {
    let max = enc.max_length;
    let eos = i64::from(enc.eos);
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
            return Err(RunError::Data(format!(
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
pub fn eos_id(model: &ModelConfig) -> u32 {
    match model.tokenizer {
        TokenizerSpec::Bytes => ByteTokenizer::EOS,
        TokenizerSpec::Gpt2 => raptor_models::tokenizer::GPT2_EOS,
        TokenizerSpec::Gguf => gguf_eos(model),
        TokenizerSpec::Model | TokenizerSpec::File(_) => 0,
    }
}
