//! Public pretraining: a tokenizer trained on the public split only, and a model pretrained
//! non-privately on the public split only, both cached under `<cache>/reproduce/` keyed by
//! their config and the hash of the public file. The private fine-tuning runs start from the
//! exported Hugging Face folder.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use raptor_models::tokenizer::{CorpusModel, CorpusTokenizer, CorpusTokenizerConfig};
use raptor_train::config::RunConfig;
use sha2::{Digest, Sha256};

use super::runs::{Job, file_hash, run_key};

/// Trains (or reuses) a tokenizer on the lines of `public` (never on private records); returns
/// the path of its `tokenizer.json`.
pub fn tokenizer(
    cache: &Path,
    name: &str,
    public_lines: &[String],
    public_hash: &str,
    model: CorpusModel,
    vocab: usize,
) -> anyhow::Result<PathBuf> {
    let cfg = CorpusTokenizerConfig {
        model,
        vocab_size: vocab,
        min_frequency: 2,
        lowercase: model == CorpusModel::WordPiece,
    };
    let key_src = format!("{public_hash}|{}", serde_json::to_string(&cfg)?);
    let key: String = Sha256::digest(key_src.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    let dir = cache.join("reproduce").join("tokenizers");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("{name}-{key}.json"));
    if path.exists() {
        return Ok(path);
    }
    let tok = CorpusTokenizer::train(public_lines.iter().map(String::as_str), &cfg)
        .with_context(|| format!("training the {name} tokenizer on its public split"))?;
    let tmp = dir.join(format!("{name}-{key}.json.tmp"));
    tok.save(&tmp)?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// A pretraining run: the job, its run folder and the Hugging Face folder it exports to.
#[derive(Debug, Clone)]
pub struct Pretraining {
    /// The non-private run on public data.
    pub job: Job,
    /// Its run folder (in the cache).
    pub run: PathBuf,
    /// The exported model (`model.path` of the fine-tuning runs).
    pub hf: PathBuf,
    /// Export the encoder without its task head (fine-tuning on another task gets a new head).
    pub drop_head: bool,
}

impl Pretraining {
    /// Plans pretraining with `cfg` (a non-private run on public data only), cached under
    /// `<cache>/reproduce/pretrained/<label>-<key>/` where the key covers the config and
    /// `data_hash`.
    pub fn plan(
        cache: &Path,
        label: &str,
        cfg: &RunConfig,
        data_hash: &str,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            !cfg.method.name().is_private(),
            "pretraining is non-private by design: it must only see public data"
        );
        let key_src = format!("{}|{data_hash}", run_key(cfg)?);
        let key: String = Sha256::digest(key_src.as_bytes())
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect();
        let out = cache
            .join("reproduce")
            .join("pretrained")
            .join(format!("{label}-{key}"));
        Ok(Self {
            job: Job {
                label: format!("pretrain {label}"),
                cfg: cfg.clone(),
            },
            run: out.join("run"),
            hf: out.join("hf"),
            drop_head: false,
        })
    }

    /// Whether the exported model is already cached.
    pub fn cached(&self) -> bool {
        self.hf.join("config.json").exists() && self.hf.join("model.safetensors").exists()
    }

    /// Exports the finished run (when not cached yet).
    pub fn export(&self) -> anyhow::Result<()> {
        if !self.cached() {
            let export = if self.drop_head {
                raptor_run::export_encoder
            } else {
                raptor_run::export_run
            };
            export(&self.run, &self.hf).with_context(|| format!("exporting {}", self.job.label))?;
        }
        Ok(())
    }
}

/// Hash of a public file (for cache keys).
pub fn public_hash(path: &Path) -> anyhow::Result<String> {
    file_hash(path)
}
