//! Building a model of any supported family, from a checkpoint or from scratch: the one place
//! that knows which loader or constructor each family uses.
//!
//! A [`ModelSpec`] names the family (its [`Naming`]), where the weights come from
//! ([`ModelSource`]: a Hugging Face folder, a GGUF file, or none for a freshly initialized model
//! of [`ScratchDims`]) and the task's sizes (vocabulary, labels, positions). [`build`] seeds
//! libtorch's generator with the spec's seed, holds it while the model is built (no other
//! thread draws in between), and checks that a checkpoint holds the family asked for.
//!
//! ```no_run
//! use raptor_models::factory::{ModelSource, ModelSpec, ScratchDims, build};
//! use raptor_models::roles::Naming;
//! # fn main() -> Result<(), raptor_models::ModelError> {
//! let dims = ScratchDims { d_model: 32, heads: 2, d_ff: 64, layers: 2, experts: 4 };
//! let mut spec = ModelSpec::scratch(Naming::MoeBert, dims, 1000, 2);
//! spec.seed = 7;
//! let tiny = build(&spec, tch::Device::Cpu)?;
//! let spec = ModelSpec {
//!     source: Some(ModelSource::Folder("models/all-MiniLM-L6-v2".into())),
//!     ..ModelSpec::scratch(Naming::Bert, dims, 30522, 2)
//! };
//! let loaded = build(&spec, tch::Device::Cpu)?;
//! # Ok(())
//! # }
//! ```

use std::path::{Path, PathBuf};

use tch::Device;

use crate::checkpoint::{
    LoadOptions, load_bert, load_decoder, load_gpt2, load_olmoe, load_switch_encoder,
};
use crate::error::{ModelError, Result};
use crate::roles::Naming;
use crate::{
    Bert, BertConfig, BertMoeConfig, BertPooling, Decoder, DecoderConfig, DecoderFamily,
    DecoderHead, Gpt2, Gpt2Config, Model, OlmoeConfig, OlmoeDecoder, SwitchConfig, SwitchEncoder,
};

/// Where a model's weights come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A Hugging Face folder (`config.json` + safetensors).
    Folder(PathBuf),
    /// A GGUF file (Llama architecture; weights dequantized to f32).
    Gguf(PathBuf),
}

impl ModelSource {
    /// The path.
    pub fn path(&self) -> &Path {
        match self {
            ModelSource::Folder(p) | ModelSource::Gguf(p) => p,
        }
    }
}

/// The sizes of a model built from scratch (ignored when it is loaded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScratchDims {
    /// Hidden size.
    pub d_model: i64,
    /// Attention heads.
    pub heads: i64,
    /// Feed-forward (and expert) inner size.
    pub d_ff: i64,
    /// Layers (every one sparse in the MoE families).
    pub layers: i64,
    /// Routed experts per sparse layer (top-2, or top-1 with one expert).
    pub experts: i64,
}

/// What to build (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// The family.
    pub family: Naming,
    /// The checkpoint, or `None` for a freshly initialized model.
    pub source: Option<ModelSource>,
    /// Sizes of a model from scratch.
    pub dims: ScratchDims,
    /// Vocabulary size of a model from scratch.
    pub vocab: i64,
    /// Classes of a classification head.
    pub num_labels: i64,
    /// Pooling of the BERT families.
    pub pooling: BertPooling,
    /// Positions of a BERT or GPT-2 model from scratch (at least 8 are made).
    pub max_positions: i64,
    /// Seed of libtorch's generator while the model is built (initial weights, new heads).
    pub seed: i64,
}

impl ModelSpec {
    /// A model of `family` from scratch, with mean pooling, 512 positions and seed 0.
    pub fn scratch(family: Naming, dims: ScratchDims, vocab: i64, num_labels: i64) -> Self {
        ModelSpec {
            family,
            source: None,
            dims,
            vocab,
            num_labels,
            pooling: BertPooling::Mean,
            max_positions: 512,
            seed: 0,
        }
    }
}

/// Whether `family` is trained as a language model (a language-modelling head; the others
/// classify with a head on the last token or the pooled encoding).
pub fn is_language_model(family: Naming) -> bool {
    matches!(family, Naming::Gpt2 | Naming::Llama)
}

/// Builds the model `spec` describes on `device` (see the [module docs](self)).
pub fn build(spec: &ModelSpec, device: Device) -> Result<Box<dyn Model>> {
    // Held until the model is built: no other thread seeds or draws in between.
    let rng = crate::rng::global_rng();
    rng.seed(spec.seed);
    match &spec.source {
        Some(source) => load(spec, source, device),
        None => scratch(spec, device),
    }
}

fn mismatch(path: &Path, found: &str, want: Naming) -> ModelError {
    ModelError::WrongFamily {
        path: path.display().to_string(),
        found: found.to_string(),
        expected: format!("{want:?}"),
    }
}

fn load(spec: &ModelSpec, source: &ModelSource, device: Device) -> Result<Box<dyn Model>> {
    let opts = LoadOptions::strict();
    let num_labels = spec.num_labels;
    let classify = DecoderHead::Classification { num_labels };
    let decoder_head = if is_language_model(spec.family) {
        DecoderHead::LanguageModel
    } else {
        classify
    };
    let folder = match source {
        ModelSource::Folder(p) => Some(p.as_path()),
        ModelSource::Gguf(_) => None,
    };
    let folder_only = |family: Naming| -> Result<&Path> {
        folder.ok_or_else(|| {
            ModelError::InvalidConfig(format!(
                "{} is a GGUF file; GGUF checkpoints load as Llama, not {family:?}",
                source.path().display()
            ))
        })
    };
    Ok(match spec.family {
        Naming::Switch => {
            let p = folder_only(spec.family)?;
            let loaded = load_switch_encoder(p, num_labels, device, &opts)?;
            for w in &loaded.report.config_warnings {
                eprintln!("warning: {}: {w}", p.join("config.json").display());
            }
            Box::new(loaded.model)
        }
        Naming::Olmoe => {
            Box::new(load_olmoe(folder_only(spec.family)?, classify, device, &opts)?.model)
        }
        Naming::Gpt2 => Box::new(
            load_gpt2(
                folder_only(spec.family)?,
                DecoderHead::LanguageModel,
                device,
                &opts,
            )?
            .model,
        ),
        Naming::Llama | Naming::Mixtral | Naming::Qwen2Moe => {
            let model = match source {
                ModelSource::Gguf(f) => {
                    crate::gguf_model::load_gguf_llama(f, decoder_head, device)?.model
                }
                ModelSource::Folder(p) => load_decoder(p, decoder_head, device, &opts)?.model,
            };
            let want = match spec.family {
                Naming::Llama => DecoderFamily::Llama,
                Naming::Mixtral => DecoderFamily::Mixtral,
                _ => DecoderFamily::Qwen2Moe,
            };
            if model.config().family != want {
                return Err(mismatch(
                    source.path(),
                    model.config().family.model_type(),
                    spec.family,
                ));
            }
            Box::new(model)
        }
        Naming::Bert | Naming::MoeBert => {
            let p = folder_only(spec.family)?;
            let model = load_bert(p, num_labels, spec.pooling, device, &opts)?.model;
            if model.config().moe.is_some() != (spec.family == Naming::MoeBert) {
                let found = if model.config().moe.is_some() {
                    "MoE-BERT (raptor_moe)"
                } else {
                    "dense BERT"
                };
                return Err(mismatch(p, found, spec.family));
            }
            Box::new(model)
        }
    })
}

fn scratch(spec: &ModelSpec, device: Device) -> Result<Box<dyn Model>> {
    let m = spec.dims;
    let num_labels = spec.num_labels;
    let top_k = 2.min(m.experts);
    let positions = spec.max_positions.max(8);
    Ok(match spec.family {
        Naming::Switch => {
            let mut c = SwitchConfig::tiny();
            c.vocab_size = spec.vocab;
            c.d_model = m.d_model;
            c.num_heads = m.heads;
            c.d_kv = (m.d_model / m.heads.max(1)).max(1);
            c.d_ff = m.d_ff;
            c.num_layers = m.layers;
            c.num_experts = m.experts;
            c.num_labels = num_labels;
            c.relative_attention_num_buckets = 16;
            c.relative_attention_max_distance = 64;
            Box::new(SwitchEncoder::new(c, device)?)
        }
        Naming::Olmoe => {
            let mut c = OlmoeConfig::tiny(DecoderHead::Classification { num_labels });
            c.vocab_size = spec.vocab;
            c.hidden_size = m.d_model;
            c.intermediate_size = m.d_ff;
            c.num_hidden_layers = m.layers;
            c.num_attention_heads = m.heads;
            c.num_key_value_heads = m.heads;
            c.num_experts = m.experts;
            c.num_experts_per_tok = top_k;
            Box::new(OlmoeDecoder::new(c, device)?)
        }
        Naming::Llama | Naming::Mixtral | Naming::Qwen2Moe => {
            let (family, head) = match spec.family {
                Naming::Llama => (DecoderFamily::Llama, DecoderHead::LanguageModel),
                Naming::Mixtral => (
                    DecoderFamily::Mixtral,
                    DecoderHead::Classification { num_labels },
                ),
                _ => (
                    DecoderFamily::Qwen2Moe,
                    DecoderHead::Classification { num_labels },
                ),
            };
            let mut c = DecoderConfig::tiny(family, head);
            c.vocab_size = spec.vocab;
            c.hidden_size = m.d_model;
            c.intermediate_size = m.d_ff;
            c.num_hidden_layers = m.layers;
            c.num_attention_heads = m.heads;
            c.num_key_value_heads = m.heads;
            c.head_dim = m.d_model / m.heads.max(1);
            if let Some(moe) = c.moe.as_mut() {
                moe.num_experts = m.experts;
                moe.num_experts_per_tok = top_k;
                moe.expert_intermediate_size = m.d_ff;
                moe.sparse_layers = (0..m.layers.max(0) as usize).collect();
                if moe.shared_expert_intermediate_size.is_some() {
                    moe.shared_expert_intermediate_size = Some(m.d_ff);
                }
            }
            Box::new(Decoder::new(c, device)?)
        }
        Naming::Bert | Naming::MoeBert => {
            let mut c = BertConfig::tiny(num_labels);
            c.vocab_size = spec.vocab;
            c.hidden_size = m.d_model;
            c.intermediate_size = m.d_ff;
            c.num_hidden_layers = m.layers;
            c.num_attention_heads = m.heads;
            c.max_position_embeddings = positions;
            c.pooling = spec.pooling;
            if spec.family == Naming::MoeBert {
                c.moe = Some(BertMoeConfig {
                    num_experts: m.experts,
                    num_experts_per_tok: top_k,
                    sparse_layers: (0..m.layers.max(0) as usize).collect(),
                });
            }
            Box::new(Bert::new(c, device)?)
        }
        Naming::Gpt2 => {
            let mut c = Gpt2Config::tiny(DecoderHead::LanguageModel);
            c.vocab_size = spec.vocab;
            c.n_embd = m.d_model;
            c.n_layer = m.layers;
            c.n_head = m.heads;
            c.n_inner = m.d_ff;
            c.n_positions = positions;
            Box::new(Gpt2::new(c, device)?)
        }
    })
}

/// The GGUF file `path` names, if it names one: a `.gguf` file, a folder holding exactly one
/// `.gguf` file, or (when `path` does not exist) the name of a folder under `models_dir` (a
/// cache of models) holding exactly one.
pub fn gguf_model_file(path: &Path, models_dir: Option<&Path>) -> Option<PathBuf> {
    let is_gguf = |p: &Path| p.is_file() && p.extension().is_some_and(|e| e == "gguf");
    let single_in = |dir: &Path| -> Option<PathBuf> {
        let found: Vec<PathBuf> = std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .filter(|p| is_gguf(p))
            .collect();
        (found.len() == 1)
            .then(|| found.into_iter().next())
            .flatten()
    };
    if is_gguf(path) {
        return Some(path.to_path_buf());
    }
    if path.is_dir() {
        return single_in(path);
    }
    if path.exists() {
        return None;
    }
    single_in(&models_dir?.join(path.file_name()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims() -> ScratchDims {
        ScratchDims {
            d_model: 16,
            heads: 2,
            d_ff: 24,
            // Two layers: Switch makes every other layer sparse.
            layers: 2,
            experts: 2,
        }
    }

    /// Every family builds from scratch, with the names its `Naming` describes (routed experts
    /// exactly in the MoE families), the same weights for the same seed and other weights for
    /// another.
    #[test]
    fn every_family_builds_from_scratch_seeded() {
        for family in Naming::ALL {
            let mut spec = ModelSpec::scratch(family, dims(), 50, 3);
            spec.seed = 11;
            let a = build(&spec, Device::Cpu).unwrap();
            let b = build(&spec, Device::Cpu).unwrap();
            spec.seed = 12;
            let c = build(&spec, Device::Cpu).unwrap();
            let vars = |m: &dyn Model| {
                let mut v = m.var_store().variables().into_iter().collect::<Vec<_>>();
                v.sort_by(|x, y| x.0.cmp(&y.0));
                v
            };
            let (va, vb, vc) = (vars(&*a), vars(&*b), vars(&*c));
            assert!(va.len() == vb.len() && !va.is_empty(), "{family:?}");
            assert!(
                va.iter()
                    .zip(&vb)
                    .all(|(x, y)| x.0 == y.0 && x.1.equal(&y.1))
            );
            assert!(
                va.iter().zip(&vc).any(|(x, y)| !x.1.equal(&y.1)),
                "{family:?}"
            );
            let routed = crate::roles::RoleIndex::of_model(&*a, family)
                .iter()
                .filter(|(_, r)| matches!(r, crate::roles::Role::RoutedExpert(_)))
                .count();
            let moe = matches!(
                family,
                Naming::Switch
                    | Naming::Olmoe
                    | Naming::Mixtral
                    | Naming::Qwen2Moe
                    | Naming::MoeBert
            );
            assert_eq!(routed > 0, moe, "{family:?}: {routed} routed parameters");
        }
    }

    #[test]
    fn a_gguf_file_is_refused_for_a_family_that_does_not_load_from_one() {
        let mut spec = ModelSpec::scratch(Naming::Bert, dims(), 50, 3);
        spec.source = Some(ModelSource::Gguf("x.gguf".into()));
        let e = build(&spec, Device::Cpu).err().unwrap();
        assert!(
            e.to_string().contains("GGUF checkpoints load as Llama"),
            "{e}"
        );
    }

    #[test]
    fn gguf_files_are_found_in_a_folder_or_the_models_cache() {
        let dir = tempfile::tempdir().unwrap();
        let models = dir.path().join("models");
        std::fs::create_dir_all(models.join("tiny")).unwrap();
        let f = models.join("tiny").join("m.gguf");
        std::fs::write(&f, b"GGUF").unwrap();
        assert_eq!(gguf_model_file(&f, None), Some(f.clone()));
        assert_eq!(gguf_model_file(&models.join("tiny"), None), Some(f.clone()));
        // A bare name that does not exist: looked up in the models cache.
        assert_eq!(
            gguf_model_file(Path::new("tiny"), Some(&models)),
            Some(f.clone())
        );
        assert_eq!(gguf_model_file(Path::new("tiny"), None), None);
        // Two GGUF files: ambiguous, none chosen.
        std::fs::write(models.join("tiny").join("n.gguf"), b"GGUF").unwrap();
        assert_eq!(gguf_model_file(&models.join("tiny"), None), None);
    }
}
