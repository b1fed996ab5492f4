//! Hugging Face `config.json` for SwitchTransformers, OLMoE, GPT-2, Llama, Mixtral and
//! Qwen2-MoE, parsed into plain structs
//! with the fields a model needs, validated, with typed errors ([`ModelError::HfConfig`]) naming
//! the missing or invalid field.
//!
//! Size fields (vocabulary, widths, layers, heads, experts) are required; other fields take
//! the defaults of the `transformers` config classes when absent (older `config.json` files omit
//! some). Unknown fields are ignored. Both the transformers-5 `rope_parameters` object and the
//! older top-level `rope_theta` are read.
//!
//! ```
//! use raptor_models::hf_config::{HfConfig, HfGpt2Config};
//! let json = r#"{"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 768,
//!                "n_layer": 12, "n_head": 12, "n_inner": null}"#;
//! let HfConfig::Gpt2(cfg) = HfConfig::from_json_str(json, "<doc>")? else { unreachable!() };
//! assert_eq!(cfg.n_inner, 3072);
//! assert_eq!(cfg.activation_function, "gelu_new");
//! assert!(HfGpt2Config::from_json_str(r#"{"vocab_size": 10}"#, "<doc>").is_err());
//! # Ok::<(), raptor_models::ModelError>(())
//! ```

use crate::blocks::RopeScaling;
use crate::decoder::DecoderHead;
use crate::decoder::{DecoderConfig, DecoderFamily, MoeConfig};
use crate::error::{ModelError, Result};
use crate::layers::Act;
use serde_json::{Map, Value};
use std::path::Path;

/// `from_file` and `from_json_str` of a per-model config type (parsed by its `from_fields`).
macro_rules! config_io {
    ($ty:ident) => {
        impl $ty {
            /// Reads a `config.json` (or a directory's).
            pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
                let (text, label) = read(path.as_ref())?;
                Self::from_json_str(&text, &label)
            }

            /// Parses config JSON; `label` names the source in errors.
            pub fn from_json_str(text: &str, label: &str) -> Result<Self> {
                Self::from_fields(&Fields::parse(text, label)?)
            }
        }
    };
}

/// A parsed config of one of the supported model types.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub enum HfConfig {
    /// `model_type: switch_transformers`.
    Switch(HfSwitchConfig),
    /// `model_type: olmoe`.
    Olmoe(HfOlmoeConfig),
    /// `model_type: gpt2`.
    Gpt2(HfGpt2Config),
    /// `model_type: llama`, `mixtral` or `qwen2_moe` (see [`HfDecoderConfig::family`]).
    Decoder(HfDecoderConfig),
    /// `model_type: bert`.
    Bert(HfBertConfig),
}

impl HfConfig {
    /// Reads a `config.json` (or the `config.json` in a directory) and dispatches on
    /// `model_type`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let (text, label) = read(path.as_ref())?;
        Self::from_json_str(&text, &label)
    }

    /// Parses config JSON; `label` names the source in errors.
    pub fn from_json_str(text: &str, label: &str) -> Result<Self> {
        let f = Fields::parse(text, label)?;
        let model_type = f.string("model_type")?;
        match model_type.as_str() {
            "switch_transformers" => Ok(Self::Switch(HfSwitchConfig::from_fields(&f)?)),
            "olmoe" => Ok(Self::Olmoe(HfOlmoeConfig::from_fields(&f)?)),
            "gpt2" => Ok(Self::Gpt2(HfGpt2Config::from_fields(&f)?)),
            "llama" | "mixtral" | "qwen2_moe" => {
                Ok(Self::Decoder(HfDecoderConfig::from_fields(&f)?))
            }
            "bert" => Ok(Self::Bert(HfBertConfig::from_fields(&f)?)),
            other => Err(f.err(
                "model_type",
                format!(
                    "{other:?} is not supported (switch_transformers, olmoe, gpt2, llama, mixtral, qwen2_moe, bert)"
                ),
            )),
        }
    }

    /// The Hugging Face `model_type`.
    pub fn model_type(&self) -> &'static str {
        match self {
            Self::Switch(_) => "switch_transformers",
            Self::Olmoe(_) => "olmoe",
            Self::Gpt2(_) => "gpt2",
            Self::Decoder(c) => c.family.model_type(),
            Self::Bert(_) => "bert",
        }
    }

    /// The checkpoint layout of this model type, with the ties the config asks for.
    pub fn layout(&self) -> HfLayout {
        match self {
            Self::Switch(_) => HfLayout::switch_transformers(),
            Self::Olmoe(c) if c.tie_word_embeddings => {
                HfLayout::olmoe().with_tied("lm_head.weight", "model.embed_tokens.weight")
            }
            Self::Olmoe(_) => HfLayout::olmoe(),
            Self::Gpt2(_) => HfLayout::gpt2(),
            Self::Decoder(c) => HfLayout::llama_family(c.tie_word_embeddings),
            Self::Bert(_) => HfLayout::bert(),
        }
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> i64 {
        match self {
            Self::Switch(c) => c.vocab_size,
            Self::Olmoe(c) => c.vocab_size,
            Self::Gpt2(c) => c.vocab_size,
            Self::Decoder(c) => c.vocab_size,
            Self::Bert(c) => c.vocab_size,
        }
    }
}

fn read(path: &Path) -> Result<(String, String)> {
    let path = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::Io {
        path: path.display().to_string(),
        source: e,
    })?;
    Ok((text, path.display().to_string()))
}

/// The JSON object with typed, error-naming accessors.
struct Fields {
    map: Map<String, Value>,
    label: String,
}

impl Fields {
    fn parse(text: &str, label: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(text).map_err(|e| ModelError::HfConfig {
            path: label.to_string(),
            field: "(file)".into(),
            why: format!("not valid JSON: {e}"),
        })?;
        match value {
            Value::Object(map) => Ok(Self {
                map,
                label: label.to_string(),
            }),
            _ => Err(ModelError::HfConfig {
                path: label.to_string(),
                field: "(file)".into(),
                why: "not a JSON object".into(),
            }),
        }
    }

    fn err(&self, field: &str, why: impl Into<String>) -> ModelError {
        ModelError::HfConfig {
            path: self.label.clone(),
            field: field.to_string(),
            why: why.into(),
        }
    }

    /// The value, None when absent or null.
    fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn int_opt(&self, key: &str) -> Result<Option<i64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .or_else(|| {
                    v.as_f64()
                        .filter(|x| x.fract() == 0.0 && x.abs() < 9e15)
                        .map(|x| x as i64)
                })
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected an integer, found {v}"))),
        }
    }

    fn int(&self, key: &str) -> Result<i64> {
        self.int_opt(key)?
            .ok_or_else(|| self.err(key, "missing (required)"))
    }

    /// A required integer ≥ 1.
    fn size(&self, key: &str) -> Result<i64> {
        let v = self.int(key)?;
        if v < 1 {
            return Err(self.err(key, format!("must be at least 1, found {v}")));
        }
        Ok(v)
    }

    fn size_or(&self, key: &str, default: i64) -> Result<i64> {
        let v = self.int_opt(key)?.unwrap_or(default);
        if v < 1 {
            return Err(self.err(key, format!("must be at least 1, found {v}")));
        }
        Ok(v)
    }

    fn float_opt(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected a finite number, found {v}"))),
        }
    }

    /// A positive float (ε, θ), default when absent.
    fn positive_or(&self, key: &str, default: f64) -> Result<f64> {
        let v = self.float_opt(key)?.unwrap_or(default);
        if v <= 0.0 {
            return Err(self.err(key, format!("must be positive, found {v}")));
        }
        Ok(v)
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.err(key, format!("expected true or false, found {v}"))),
        }
    }

    fn string(&self, key: &str) -> Result<String> {
        match self.get(key) {
            None => Err(self.err(key, "missing (required)")),
            Some(v) => v
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| self.err(key, format!("expected a string, found {v}"))),
        }
    }

    /// A string that must be one of `allowed`, `default` when absent.
    fn choice(&self, key: &str, default: &str, allowed: &[&str]) -> Result<String> {
        let value = match self.get(key) {
            None => default.to_string(),
            Some(_) => self.string(key)?,
        };
        if allowed.contains(&value.as_str()) {
            Ok(value)
        } else {
            Err(self.err(
                key,
                format!("{value:?} is not supported ({})", allowed.join(", ")),
            ))
        }
    }

    /// `heads` must divide `width` (read from `width_key`); the error names `heads_key`.
    fn divides(&self, width_key: &str, width: i64, heads_key: &str, heads: i64) -> Result<()> {
        if width % heads != 0 {
            return Err(self.err(
                heads_key,
                format!("{width_key} {width} is not a multiple of {heads} heads"),
            ));
        }
        Ok(())
    }

    /// `num_key_value_heads` (default: the `heads` query heads), which must divide `heads`.
    fn kv_heads(&self, heads: i64) -> Result<i64> {
        let kv = self.size_or("num_key_value_heads", heads)?;
        if heads % kv != 0 {
            return Err(self.err(
                "num_key_value_heads",
                format!("{heads} query heads are not a multiple of {kv} key/value heads"),
            ));
        }
        Ok(kv)
    }

    /// `model_type`, when present, must be `expected`.
    fn check_type(&self, expected: &str) -> Result<()> {
        match self.get("model_type") {
            None => Ok(()),
            Some(_) => {
                let t = self.string("model_type")?;
                if t == expected {
                    Ok(())
                } else {
                    Err(self.err("model_type", format!("expected {expected:?}, found {t:?}")))
                }
            }
        }
    }
}

/// `SwitchTransformersConfig`, encoder side.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HfSwitchConfig {
    /// Vocabulary size.
    pub vocab_size: i64,
    /// Hidden size.
    pub d_model: i64,
    /// Per-head key/value size.
    pub d_kv: i64,
    /// FFN inner size (dense blocks and experts).
    pub d_ff: i64,
    /// Encoder blocks.
    pub num_layers: i64,
    /// Attention heads.
    pub num_heads: i64,
    /// Experts per sparse block.
    pub num_experts: i64,
    /// Sparse encoder blocks.
    pub num_sparse_encoder_layers: i64,
    /// Block i is sparse when `step > 0 && (i % step == 1 || step == 1)` (transformers' rule).
    /// The saved `encoder_sparse_step` when the file has one — transformers sets saved
    /// attributes after computing its own, so the saved step wins even when it disagrees with
    /// `num_sparse_encoder_layers` (see [`HfSwitchConfig::warnings`]); otherwise
    /// `num_layers / num_sparse_encoder_layers`, or `num_layers` when that is ≤ 0.
    pub encoder_sparse_step: i64,
    /// Relative attention buckets.
    pub relative_attention_num_buckets: i64,
    /// Relative attention max distance.
    pub relative_attention_max_distance: i64,
    /// RMS norm ε.
    pub layer_norm_epsilon: f64,
    /// Expert capacity per sequence (transformers always applies it; tokens past it skip the
    /// expert).
    pub expert_capacity: i64,
    /// Router bias.
    pub router_bias: bool,
    /// Router jitter noise (training only in transformers; raptor's routers never jitter).
    pub router_jitter_noise: f64,
    /// Router compute dtype (`float32`, `float16`, `bfloat16`).
    pub router_dtype: String,
    /// Whether padding tokens are ignored by the router.
    pub router_ignore_padding_tokens: bool,
    /// FFN activation (`relu`, `gelu`, `gelu_new`; the gated variants of T5 v1.1 are not
    /// supported).
    pub dense_act_fn: String,
    /// Dropout (inference: unused).
    pub dropout_rate: f64,
    /// Whether the LM head is tied to `shared` (decoder side only).
    pub tie_word_embeddings: bool,
    /// Padding token id.
    pub pad_token_id: Option<i64>,
    /// What was read differently from what the file's fields say together, each naming the
    /// fields and the value used: a saved `encoder_sparse_step` that disagrees with
    /// `num_layers / num_sparse_encoder_layers` (files whose `num_layers` was edited), or a
    /// `num_sparse_encoder_layers` outside `[0, num_layers]`. transformers loads such files
    /// silently; callers should show these to the user.
    pub warnings: Vec<String>,
}

config_io!(HfSwitchConfig);

impl HfSwitchConfig {
    fn from_fields(f: &Fields) -> Result<Self> {
        f.check_type("switch_transformers")?;
        let num_layers = f.size("num_layers")?;
        let num_sparse = f.int_opt("num_sparse_encoder_layers")?.unwrap_or(3);
        let mut warnings = Vec::new();
        // transformers (SwitchTransformersConfig.__post_init__): `num_layers //
        // num_sparse_encoder_layers` when that count is > 0, else `num_layers`; then every saved
        // attribute is set on the config, so a saved `encoder_sparse_step` replaces the computed
        // one. Neither an out-of-range count nor a disagreeing step is an error there.
        let step_computed = if num_sparse > 0 {
            num_layers / num_sparse
        } else {
            num_layers
        };
        if num_sparse < 0 || num_sparse > num_layers {
            warnings.push(format!(
                "num_sparse_encoder_layers = {num_sparse} is outside [0, num_layers = {num_layers}]; \
                 transformers reads it as a sparse step of {step_computed}"
            ));
        }
        let encoder_sparse_step = match f.int_opt("encoder_sparse_step")? {
            Some(s) => {
                if s != step_computed {
                    warnings.push(format!(
                        "encoder_sparse_step = {s} disagrees with num_layers / \
                         num_sparse_encoder_layers = {num_layers} / {num_sparse} = {step_computed}; \
                         using the saved step {s}, as transformers does (sparse blocks: {})",
                        sparse_blocks(num_layers, s)
                    ));
                }
                s
            }
            None => step_computed,
        };
        let expert_capacity = f.size_or("expert_capacity", 64)?;
        let dense_act_fn = f.choice("dense_act_fn", "relu", &["relu", "gelu", "gelu_new"])?;
        let router_dtype = f.choice(
            "router_dtype",
            "float32",
            &["float32", "float16", "bfloat16"],
        )?;
        let jitter = f.float_opt("router_jitter_noise")?.unwrap_or(0.01);
        if jitter < 0.0 {
            return Err(f.err(
                "router_jitter_noise",
                format!("must be non-negative, found {jitter}"),
            ));
        }
        let dropout_rate = f.float_opt("dropout_rate")?.unwrap_or(0.1);
        if !(0.0..1.0).contains(&dropout_rate) {
            return Err(f.err(
                "dropout_rate",
                format!("must be in [0, 1), found {dropout_rate}"),
            ));
        }
        Ok(Self {
            vocab_size: f.size("vocab_size")?,
            d_model: f.size("d_model")?,
            d_kv: f.size("d_kv")?,
            d_ff: f.size("d_ff")?,
            num_layers,
            num_heads: f.size("num_heads")?,
            num_experts: f.size("num_experts")?,
            num_sparse_encoder_layers: num_sparse,
            encoder_sparse_step,
            relative_attention_num_buckets: f.size_or("relative_attention_num_buckets", 32)?,
            relative_attention_max_distance: f.size_or("relative_attention_max_distance", 128)?,
            layer_norm_epsilon: f.positive_or("layer_norm_epsilon", 1e-6)?,
            expert_capacity,
            router_bias: f.bool_or("router_bias", false)?,
            router_jitter_noise: jitter,
            router_dtype,
            router_ignore_padding_tokens: f.bool_or("router_ignore_padding_tokens", false)?,
            dense_act_fn,
            dropout_rate,
            tie_word_embeddings: f.bool_or("tie_word_embeddings", true)?,
            pad_token_id: f.int_opt("pad_token_id")?,
            warnings,
        })
    }

    /// The model configuration of [`crate::SwitchEncoder`] with a `num_labels`-way head.
    /// Expert capacity is off (`None`), as private training requires; transformers always
    /// applies `expert_capacity` per sequence, so outputs agree with it only while no expert
    /// receives more than `expert_capacity` tokens of one sequence (set
    /// `expert_capacity = Some(..)` on the result to reproduce its dropping).
    pub fn to_model_config(&self, num_labels: i64) -> Result<crate::SwitchConfig> {
        if num_labels < 1 {
            return Err(ModelError::InvalidConfig(format!(
                "num_labels must be at least 1, found {num_labels}"
            )));
        }
        Ok(crate::SwitchConfig {
            vocab_size: self.vocab_size,
            d_model: self.d_model,
            d_kv: self.d_kv,
            d_ff: self.d_ff,
            num_layers: self.num_layers,
            num_heads: self.num_heads,
            num_experts: self.num_experts,
            encoder_sparse_step: self.encoder_sparse_step,
            relative_attention_num_buckets: self.relative_attention_num_buckets,
            relative_attention_max_distance: self.relative_attention_max_distance,
            layer_norm_epsilon: self.layer_norm_epsilon,
            expert_capacity: None,
            router_bias: self.router_bias,
            dense_act_fn: Act::from_hf(&self.dense_act_fn)?,
            num_labels,
        })
    }

    /// Whether encoder block `i` is sparse: transformers' rule `i % step == 1 || step == 1`,
    /// applied even when `num_sparse_encoder_layers` is 0 (then `step = num_layers`, and block 1
    /// is sparse when there are at least 2 blocks: a quirk of transformers that checkpoints
    /// follow).
    pub fn is_sparse(&self, i: i64) -> bool {
        self.encoder_sparse_step > 0
            && (i % self.encoder_sparse_step == 1 || self.encoder_sparse_step == 1)
    }
}

/// The sparse blocks of `num_layers` encoder blocks under transformers' rule with `step`, as a
/// list for messages (`1, 3` or `none`).
fn sparse_blocks(num_layers: i64, step: i64) -> String {
    let blocks: Vec<String> = (0..num_layers.clamp(0, 4096))
        .filter(|&i| step > 0 && (i % step == 1 || step == 1))
        .map(|i| i.to_string())
        .collect();
    if blocks.is_empty() {
        "none".into()
    } else {
        blocks.join(", ")
    }
}

/// `OlmoeConfig`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HfOlmoeConfig {
    /// Vocabulary size.
    pub vocab_size: i64,
    /// Hidden size.
    pub hidden_size: i64,
    /// Expert FFN inner size.
    pub intermediate_size: i64,
    /// Decoder layers.
    pub num_hidden_layers: i64,
    /// Query heads.
    pub num_attention_heads: i64,
    /// Key/value heads (defaults to the query heads).
    pub num_key_value_heads: i64,
    /// Experts per layer.
    pub num_experts: i64,
    /// Experts per token (top-k).
    pub num_experts_per_tok: i64,
    /// Whether the top-k gate weights are renormalized to sum to 1.
    pub norm_topk_prob: bool,
    /// RoPE base θ (`rope_parameters.rope_theta` or `rope_theta`).
    pub rope_theta: f64,
    /// RMS norm ε.
    pub rms_norm_eps: f64,
    /// Maximum positions.
    pub max_position_embeddings: i64,
    /// Bias on q/k/v/o projections.
    pub attention_bias: bool,
    /// Clamp of q/k/v, if any.
    pub clip_qkv: Option<f64>,
    /// RMS norms on the projected queries and keys (always on in OLMoE: `q_norm` over the
    /// hidden size, `k_norm` over `num_key_value_heads · head_dim`).
    pub qk_norm: bool,
    /// Expert activation (`silu`).
    pub hidden_act: String,
    /// Whether `lm_head` is tied to `model.embed_tokens`.
    pub tie_word_embeddings: bool,
    /// Padding token id.
    pub pad_token_id: Option<i64>,
}

config_io!(HfOlmoeConfig);

impl HfOlmoeConfig {
    fn from_fields(f: &Fields) -> Result<Self> {
        f.check_type("olmoe")?;
        let hidden_size = f.size("hidden_size")?;
        let heads = f.size("num_attention_heads")?;
        f.divides("hidden_size", hidden_size, "num_attention_heads", heads)?;
        let kv = f.kv_heads(heads)?;
        let num_experts = f.size("num_experts")?;
        let top_k = f.size("num_experts_per_tok")?;
        if top_k > num_experts {
            return Err(f.err(
                "num_experts_per_tok",
                format!("{top_k} exceeds num_experts = {num_experts}"),
            ));
        }
        // transformers 5: rope_parameters {rope_type, rope_theta}; older: top-level rope_theta
        // and rope_scaling (only unscaled RoPE is supported).
        let mut rope_theta = f.float_opt("rope_theta")?;
        if let Some(rp) = f.get("rope_parameters") {
            let obj = rp.as_object().ok_or_else(|| {
                f.err("rope_parameters", format!("expected an object, found {rp}"))
            })?;
            if let Some(t) = obj.get("rope_type").filter(|v| !v.is_null())
                && t.as_str() != Some("default")
            {
                return Err(f.err(
                    "rope_parameters.rope_type",
                    format!("{t} is not supported (only \"default\")"),
                ));
            }
            if let Some(t) = obj.get("rope_theta").filter(|v| !v.is_null()) {
                rope_theta = Some(t.as_f64().filter(|x| x.is_finite()).ok_or_else(|| {
                    f.err(
                        "rope_parameters.rope_theta",
                        format!("expected a finite number, found {t}"),
                    )
                })?);
            }
        }
        if let Some(rs) = f.get("rope_scaling") {
            return Err(f.err(
                "rope_scaling",
                format!("{rs} is not supported (only unscaled RoPE)"),
            ));
        }
        let rope_theta = rope_theta.unwrap_or(10000.0);
        if rope_theta <= 0.0 {
            return Err(f.err(
                "rope_theta",
                format!("must be positive, found {rope_theta}"),
            ));
        }
        let clip_qkv = f.float_opt("clip_qkv")?;
        if let Some(c) = clip_qkv
            && c <= 0.0
        {
            return Err(f.err("clip_qkv", format!("must be positive, found {c}")));
        }
        let hidden_act = f.choice("hidden_act", "silu", &["silu"])?;
        Ok(Self {
            vocab_size: f.size("vocab_size")?,
            hidden_size,
            intermediate_size: f.size("intermediate_size")?,
            num_hidden_layers: f.size("num_hidden_layers")?,
            num_attention_heads: heads,
            num_key_value_heads: kv,
            num_experts,
            num_experts_per_tok: top_k,
            norm_topk_prob: f.bool_or("norm_topk_prob", false)?,
            rope_theta,
            rms_norm_eps: f.positive_or("rms_norm_eps", 1e-5)?,
            max_position_embeddings: f.size_or("max_position_embeddings", 4096)?,
            attention_bias: f.bool_or("attention_bias", false)?,
            clip_qkv,
            qk_norm: true,
            hidden_act,
            tie_word_embeddings: f.bool_or("tie_word_embeddings", false)?,
            pad_token_id: f.int_opt("pad_token_id")?,
        })
    }

    /// The model configuration of [`crate::OlmoeDecoder`] with `head`.
    pub fn to_model_config(&self, head: DecoderHead) -> Result<crate::OlmoeConfig> {
        Ok(crate::OlmoeConfig {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            num_key_value_heads: self.num_key_value_heads,
            hidden_act: Act::from_hf(&self.hidden_act)?,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta: self.rope_theta,
            attention_bias: self.attention_bias,
            clip_qkv: self.clip_qkv,
            num_experts_per_tok: self.num_experts_per_tok,
            num_experts: self.num_experts,
            norm_topk_prob: self.norm_topk_prob,
            head,
        })
    }

    /// Per-head size.
    pub fn head_dim(&self) -> i64 {
        self.hidden_size / self.num_attention_heads
    }
}

/// `GPT2Config`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HfGpt2Config {
    /// Vocabulary size.
    pub vocab_size: i64,
    /// Hidden size.
    pub n_embd: i64,
    /// Layers.
    pub n_layer: i64,
    /// Heads.
    pub n_head: i64,
    /// Maximum positions.
    pub n_positions: i64,
    /// MLP inner size (`n_inner`, or 4·n_embd when null).
    pub n_inner: i64,
    /// MLP activation (`gelu_new`, `gelu`, `relu`, `silu`).
    pub activation_function: String,
    /// Layer norm ε.
    pub layer_norm_epsilon: f64,
    /// Whether `lm_head` is tied to `transformer.wte` (true for GPT-2).
    pub tie_word_embeddings: bool,
    /// Attention scores divided by √head_dim (true for GPT-2).
    pub scale_attn_weights: bool,
    /// Attention scores additionally divided by the layer index + 1.
    pub scale_attn_by_inverse_layer_idx: bool,
    /// Upcast-and-reorder attention (numerics only).
    pub reorder_and_upcast_attn: bool,
}

config_io!(HfGpt2Config);

impl HfGpt2Config {
    fn from_fields(f: &Fields) -> Result<Self> {
        f.check_type("gpt2")?;
        let n_embd = f.size("n_embd")?;
        let n_head = f.size("n_head")?;
        f.divides("n_embd", n_embd, "n_head", n_head)?;
        let act = f.choice(
            "activation_function",
            "gelu_new",
            &["gelu_new", "gelu", "relu", "silu", "gelu_pytorch_tanh"],
        )?;
        Ok(Self {
            vocab_size: f.size("vocab_size")?,
            n_embd,
            n_layer: f.size("n_layer")?,
            n_head,
            n_positions: f.size("n_positions")?,
            n_inner: f.size_or("n_inner", 4 * n_embd)?,
            activation_function: act,
            layer_norm_epsilon: f.positive_or("layer_norm_epsilon", 1e-5)?,
            tie_word_embeddings: f.bool_or("tie_word_embeddings", true)?,
            scale_attn_weights: f.bool_or("scale_attn_weights", true)?,
            scale_attn_by_inverse_layer_idx: f.bool_or("scale_attn_by_inverse_layer_idx", false)?,
            reorder_and_upcast_attn: f.bool_or("reorder_and_upcast_attn", false)?,
        })
    }
}

impl HfGpt2Config {
    /// The model configuration of [`crate::Gpt2`] with `head`. Attention variants our model
    /// does not implement (`scale_attn_weights = false`, `scale_attn_by_inverse_layer_idx`) are
    /// an error rather than a silently different model.
    pub fn to_model_config(&self, head: DecoderHead) -> Result<crate::Gpt2Config> {
        if !self.scale_attn_weights || self.scale_attn_by_inverse_layer_idx {
            return Err(ModelError::InvalidConfig(
                "GPT-2 with scale_attn_weights = false or scale_attn_by_inverse_layer_idx = true is not supported"
                    .into(),
            ));
        }
        if !self.tie_word_embeddings && head == DecoderHead::LanguageModel {
            return Err(ModelError::InvalidConfig(
                "GPT-2 language-model head untied from wte (tie_word_embeddings = false) is not supported".into(),
            ));
        }
        Ok(crate::Gpt2Config {
            vocab_size: self.vocab_size,
            n_positions: self.n_positions,
            n_embd: self.n_embd,
            n_layer: self.n_layer,
            n_head: self.n_head,
            n_inner: self.n_inner,
            activation_function: Act::from_hf(&self.activation_function)?,
            layer_norm_epsilon: self.layer_norm_epsilon,
            head,
        })
    }
}

/// RoPE θ and scaling from the transformers-5 `rope_parameters` object (`rope_type` `default`
/// or `linear` with `factor`, `rope_theta`) or the older top-level `rope_theta` and
/// `rope_scaling` (`{"type" | "rope_type": "linear", "factor": f}`). Other scaling kinds (yarn,
/// dynamic, llama3, longrope) are errors naming the field.
fn rope_with_scaling(f: &Fields) -> Result<(f64, RopeScaling)> {
    let mut theta = f.float_opt("rope_theta")?;
    let mut scaling = RopeScaling::None;
    let parse = |field: &str, v: &Value, theta: &mut Option<f64>| -> Result<RopeScaling> {
        let obj = v
            .as_object()
            .ok_or_else(|| f.err(field, format!("expected an object, found {v}")))?;
        if let Some(t) = obj.get("rope_theta").filter(|v| !v.is_null()) {
            *theta = Some(t.as_f64().filter(|x| x.is_finite()).ok_or_else(|| {
                f.err(
                    &format!("{field}.rope_theta"),
                    format!("expected a finite number, found {t}"),
                )
            })?);
        }
        let kind = obj
            .get("rope_type")
            .or_else(|| obj.get("type"))
            .filter(|v| !v.is_null());
        match kind.map(|k| k.as_str()) {
            None | Some(Some("default")) => Ok(RopeScaling::None),
            Some(Some("linear")) => {
                let factor = obj
                    .get("factor")
                    .and_then(Value::as_f64)
                    .filter(|x| x.is_finite() && *x > 0.0)
                    .ok_or_else(|| {
                        f.err(
                            &format!("{field}.factor"),
                            "linear RoPE scaling needs a positive factor",
                        )
                    })?;
                Ok(RopeScaling::Linear { factor })
            }
            _ => Err(f.err(
                &format!("{field}.rope_type"),
                format!(
                    "{} is not supported (only \"default\" and \"linear\")",
                    kind.map(ToString::to_string).unwrap_or_default()
                ),
            )),
        }
    };
    if let Some(rs) = f.get("rope_scaling") {
        scaling = parse("rope_scaling", rs, &mut theta)?;
    }
    if let Some(rp) = f.get("rope_parameters") {
        scaling = parse("rope_parameters", rp, &mut theta)?;
    }
    let theta = theta.unwrap_or(10000.0);
    if theta <= 0.0 {
        return Err(f.err("rope_theta", format!("must be positive, found {theta}")));
    }
    Ok((theta, scaling))
}

/// `LlamaConfig`, `MixtralConfig` and `Qwen2MoeConfig`: the Llama-family decoders built by
/// [`crate::Decoder`]. Fields a family lacks take their neutral value (no experts for Llama,
/// no shared expert for Mixtral). Mixtral's `router_jitter_noise` is ignored (raptor's routers
/// never jitter); sliding-window attention is not supported (an error when set).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HfDecoderConfig {
    /// The family (`model_type`).
    pub family: DecoderFamily,
    /// Vocabulary size.
    pub vocab_size: i64,
    /// Hidden size.
    pub hidden_size: i64,
    /// Dense MLP inner size (Mixtral: also each expert's).
    pub intermediate_size: i64,
    /// Decoder layers.
    pub num_hidden_layers: i64,
    /// Query heads.
    pub num_attention_heads: i64,
    /// Key/value heads (defaults to the query heads).
    pub num_key_value_heads: i64,
    /// Per-head size (`head_dim`, default `hidden_size / num_attention_heads`).
    pub head_dim: i64,
    /// MLP activation (the SwiGLU gate).
    pub hidden_act: String,
    /// RMS norm ε.
    pub rms_norm_eps: f64,
    /// RoPE θ.
    pub rope_theta: f64,
    /// RoPE scaling (none or linear).
    pub rope_scaling: RopeScaling,
    /// Bias on q/k/v (Llama `attention_bias`, Qwen2-MoE `qkv_bias`).
    pub qkv_bias: bool,
    /// Bias on the output projection (Llama `attention_bias`).
    pub o_bias: bool,
    /// Bias on the dense MLP (Llama `mlp_bias`).
    pub mlp_bias: bool,
    /// Routed experts per sparse layer (0 for Llama; Mixtral `num_local_experts`).
    pub num_experts: i64,
    /// Experts per token.
    pub num_experts_per_tok: i64,
    /// Routed expert inner size (Qwen2-MoE `moe_intermediate_size`; Mixtral
    /// `intermediate_size`).
    pub expert_intermediate_size: i64,
    /// Shared-expert inner size (Qwen2-MoE).
    pub shared_expert_intermediate_size: Option<i64>,
    /// Top-k renormalization (Mixtral: always).
    pub norm_topk_prob: bool,
    /// Sparse layer indices (Mixtral: all; Qwen2-MoE: `(i + 1) % decoder_sparse_step == 0`
    /// and `i` not in `mlp_only_layers`).
    pub sparse_layers: Vec<usize>,
    /// Whether `lm_head` is tied to `model.embed_tokens`.
    pub tie_word_embeddings: bool,
    /// Padding token id.
    pub pad_token_id: Option<i64>,
}

config_io!(HfDecoderConfig);

impl HfDecoderConfig {
    fn from_fields(f: &Fields) -> Result<Self> {
        let model_type = f.string("model_type")?;
        let family = match model_type.as_str() {
            "llama" => DecoderFamily::Llama,
            "mixtral" => DecoderFamily::Mixtral,
            "qwen2_moe" => DecoderFamily::Qwen2Moe,
            other => {
                return Err(f.err(
                    "model_type",
                    format!("{other:?} is not a Llama-family decoder (llama, mixtral, qwen2_moe)"),
                ));
            }
        };
        let hidden_size = f.size("hidden_size")?;
        let heads = f.size("num_attention_heads")?;
        let kv = f.kv_heads(heads)?;
        let head_dim = match f.int_opt("head_dim")? {
            Some(h) => h,
            None => {
                f.divides("hidden_size", hidden_size, "num_attention_heads", heads)?;
                hidden_size / heads
            }
        };
        if head_dim < 2 || head_dim % 2 != 0 {
            return Err(f.err(
                "head_dim",
                format!("must be even and positive, found {head_dim}"),
            ));
        }
        let layers = f.size("num_hidden_layers")?;
        let intermediate_size = f.size("intermediate_size")?;
        let (rope_theta, rope_scaling) = rope_with_scaling(f)?;
        let hidden_act = f.choice(
            "hidden_act",
            "silu",
            &[
                "silu",
                "swish",
                "gelu",
                "gelu_new",
                "gelu_pytorch_tanh",
                "relu",
            ],
        )?;
        let sliding = match family {
            DecoderFamily::Qwen2Moe => f.bool_or("use_sliding_window", false)?,
            DecoderFamily::Mixtral => f.int_opt("sliding_window")?.is_some_and(|w| w > 0),
            _ => false,
        };
        if sliding {
            return Err(f.err(
                if family == DecoderFamily::Mixtral {
                    "sliding_window"
                } else {
                    "use_sliding_window"
                },
                "sliding-window attention is not supported",
            ));
        }
        let eps_default = if family == DecoderFamily::Mixtral {
            1e-5
        } else {
            1e-6
        };
        let (mut qkv_bias, mut o_bias, mut mlp_bias) = (false, false, false);
        let (mut num_experts, mut top_k, mut expert_inner) = (0, 0, 0);
        let (mut shared, mut norm_topk, mut sparse_layers) = (None, false, Vec::new());
        match family {
            DecoderFamily::Llama => {
                let b = f.bool_or("attention_bias", false)?;
                (qkv_bias, o_bias) = (b, b);
                mlp_bias = f.bool_or("mlp_bias", false)?;
            }
            DecoderFamily::Mixtral => {
                num_experts = f.size_or("num_local_experts", 8)?;
                top_k = f.size_or("num_experts_per_tok", 2)?;
                expert_inner = intermediate_size;
                norm_topk = true;
                sparse_layers = (0..layers as usize).collect();
            }
            DecoderFamily::Qwen2Moe => {
                qkv_bias = f.bool_or("qkv_bias", true)?;
                num_experts = f.size_or("num_experts", 60)?;
                top_k = f.size_or("num_experts_per_tok", 4)?;
                expert_inner = f.size_or("moe_intermediate_size", 1408)?;
                shared = Some(f.size_or("shared_expert_intermediate_size", 5632)?);
                norm_topk = f.bool_or("norm_topk_prob", false)?;
                let step = f.size_or("decoder_sparse_step", 1)?;
                let only: Vec<i64> = match f.get("mlp_only_layers") {
                    None => Vec::new(),
                    Some(v) => v
                        .as_array()
                        .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<i64>>>())
                        .ok_or_else(|| {
                            f.err("mlp_only_layers", format!("expected integers, found {v}"))
                        })?,
                };
                sparse_layers = (0..layers)
                    .filter(|i| !only.contains(i) && (i + 1) % step == 0)
                    .map(|i| i as usize)
                    .collect();
            }
            DecoderFamily::Olmoe => {}
        }
        if family != DecoderFamily::Llama && top_k > num_experts {
            return Err(f.err(
                "num_experts_per_tok",
                format!("{top_k} exceeds the {num_experts} experts"),
            ));
        }
        Ok(Self {
            family,
            vocab_size: f.size("vocab_size")?,
            hidden_size,
            intermediate_size,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: kv,
            head_dim,
            hidden_act,
            rms_norm_eps: f.positive_or("rms_norm_eps", eps_default)?,
            rope_theta,
            rope_scaling,
            qkv_bias,
            o_bias,
            mlp_bias,
            num_experts,
            num_experts_per_tok: top_k,
            expert_intermediate_size: expert_inner,
            shared_expert_intermediate_size: shared,
            norm_topk_prob: norm_topk,
            sparse_layers,
            tie_word_embeddings: f.bool_or("tie_word_embeddings", false)?,
            pad_token_id: f.int_opt("pad_token_id")?,
        })
    }

    /// The model configuration of [`crate::Decoder`] with `head`.
    pub fn to_model_config(&self, head: DecoderHead) -> Result<DecoderConfig> {
        let moe = (self.family != DecoderFamily::Llama).then(|| MoeConfig {
            num_experts: self.num_experts,
            num_experts_per_tok: self.num_experts_per_tok,
            expert_intermediate_size: self.expert_intermediate_size,
            norm_topk_prob: self.norm_topk_prob,
            shared_expert_intermediate_size: self.shared_expert_intermediate_size,
            sparse_layers: self.sparse_layers.clone(),
        });
        Ok(DecoderConfig {
            family: self.family,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            num_key_value_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            hidden_act: Act::from_hf(&self.hidden_act)?,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta: self.rope_theta,
            rope_scaling: self.rope_scaling,
            qkv_bias: self.qkv_bias,
            o_bias: self.o_bias,
            mlp_bias: self.mlp_bias,
            qk_norm: false,
            clip_qkv: None,
            moe,
            tie_word_embeddings: self.tie_word_embeddings,
            head,
        })
    }
}

/// `BertConfig` (absolute positions only).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HfBertConfig {
    /// Vocabulary size.
    pub vocab_size: i64,
    /// Hidden size.
    pub hidden_size: i64,
    /// Encoder layers.
    pub num_hidden_layers: i64,
    /// Attention heads.
    pub num_attention_heads: i64,
    /// FFN inner size.
    pub intermediate_size: i64,
    /// FFN activation (`gelu`, `gelu_new`, `relu`, `silu`).
    pub hidden_act: String,
    /// Learned positions.
    pub max_position_embeddings: i64,
    /// Token types.
    pub type_vocab_size: i64,
    /// Layer norm ε.
    pub layer_norm_eps: f64,
    /// Classes of a sequence-classification checkpoint (`num_labels` or the size of
    /// `id2label`), if given.
    pub num_labels: Option<i64>,
    /// Padding token id.
    pub pad_token_id: Option<i64>,
    /// raptor's MoE-BERT experts (`raptor_moe`, see [`crate::BertMoeConfig`]); None: a dense BERT.
    pub moe: Option<crate::BertMoeConfig>,
}

config_io!(HfBertConfig);

impl HfBertConfig {
    fn from_fields(f: &Fields) -> Result<Self> {
        f.check_type("bert")?;
        let hidden_size = f.size("hidden_size")?;
        let heads = f.size("num_attention_heads")?;
        f.divides("hidden_size", hidden_size, "num_attention_heads", heads)?;
        f.choice("position_embedding_type", "absolute", &["absolute"])?;
        let act = f.choice("hidden_act", "gelu", &["gelu", "gelu_new", "relu", "silu"])?;
        let num_labels = match f.int_opt("num_labels")? {
            Some(n) => Some(n),
            None => f
                .get("id2label")
                .and_then(Value::as_object)
                .map(|m| m.len() as i64),
        };
        Ok(Self {
            vocab_size: f.size("vocab_size")?,
            hidden_size,
            num_hidden_layers: f.size("num_hidden_layers")?,
            num_attention_heads: heads,
            intermediate_size: f.size("intermediate_size")?,
            hidden_act: act,
            max_position_embeddings: f.size_or("max_position_embeddings", 512)?,
            type_vocab_size: f.size_or("type_vocab_size", 2)?,
            layer_norm_eps: f.positive_or("layer_norm_eps", 1e-12)?,
            num_labels,
            pad_token_id: f.int_opt("pad_token_id")?,
            moe: match f.get("raptor_moe") {
                None => None,
                Some(v) => Some(
                    serde_json::from_value(v.clone())
                        .map_err(|e| f.err("raptor_moe", format!("not a MoE-BERT object: {e}")))?,
                ),
            },
        })
    }

    /// The model configuration of [`crate::Bert`] with a `num_labels`-way classifier pooled by
    /// `pooling`.
    pub fn to_model_config(
        &self,
        num_labels: i64,
        pooling: crate::BertPooling,
    ) -> Result<crate::BertConfig> {
        Ok(crate::BertConfig {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            intermediate_size: self.intermediate_size,
            hidden_act: Act::from_hf(&self.hidden_act)?,
            max_position_embeddings: self.max_position_embeddings,
            type_vocab_size: self.type_vocab_size,
            layer_norm_eps: self.layer_norm_eps,
            pooling,
            num_labels,
            moe: self.moe.clone(),
        })
    }
}

/// How a Hugging Face checkpoint's tensors differ from this crate's variables (see the module
/// docs). Patterns are [`glob_match`](crate::layers::glob_match) patterns over whole names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HfLayout {
    /// Variable names whose 2-D weight is stored transposed (`[in, out]`) in the file.
    pub transposed: Vec<String>,
    /// Tied weights `(alias, source)`: the file stores `source` only.
    pub tied: Vec<(String, String)>,
    /// Prefixes a file may omit (`transformer.`): variable `transformer.h.0.x` is also looked
    /// up as `h.0.x`.
    pub optional_prefixes: Vec<String>,
    /// Checkpoint tensors that are never reported as unexpected.
    pub ignore_unexpected: Vec<String>,
}

impl HfLayout {
    /// Names and shapes as they are.
    pub fn identity() -> Self {
        Self::default()
    }

    /// `GPT2LMHeadModel`: Conv1D weights transposed, `lm_head.weight` tied to
    /// `transformer.wte.weight`, optional `transformer.` prefix, causal-mask buffers ignored.
    pub fn gpt2() -> Self {
        Self {
            transposed: [
                "*.attn.c_attn.weight",
                "*.attn.c_proj.weight",
                "*.mlp.c_fc.weight",
                "*.mlp.c_proj.weight",
            ]
            .map(String::from)
            .to_vec(),
            tied: vec![("lm_head.weight".into(), "transformer.wte.weight".into())],
            optional_prefixes: vec!["transformer.".into()],
            ignore_unexpected: ["*.attn.bias", "*.attn.masked_bias"]
                .map(String::from)
                .to_vec(),
        }
    }

    /// `SwitchTransformersEncoderModel` (also reads full `SwitchTransformersModel` /
    /// `…ForConditionalGeneration` checkpoints, ignoring the decoder): embeddings tied to
    /// `shared.weight`.
    pub fn switch_transformers() -> Self {
        Self {
            transposed: vec![],
            tied: vec![
                ("encoder.embed_tokens.weight".into(), "shared.weight".into()),
                ("decoder.embed_tokens.weight".into(), "shared.weight".into()),
                ("lm_head.weight".into(), "shared.weight".into()),
            ],
            optional_prefixes: vec![],
            ignore_unexpected: ["decoder.*", "lm_head.weight"].map(String::from).to_vec(),
        }
    }

    /// `OlmoeForCausalLM` (hub layout: one matrix per expert; `lm_head.weight` untied unless
    /// the config ties it, see [`HfLayout::with_tied`]).
    pub fn olmoe() -> Self {
        Self {
            transposed: vec![],
            tied: vec![],
            optional_prefixes: vec![],
            ignore_unexpected: vec![],
        }
    }

    /// `LlamaForCausalLM`, `MixtralForCausalLM`, `Qwen2MoeForCausalLM` (hub layout: one matrix
    /// per expert). With `tied`, `lm_head.weight` is `model.embed_tokens.weight` (a file that
    /// stores both is read); old checkpoints' `rotary_emb.inv_freq` buffers are ignored.
    pub fn llama_family(tied: bool) -> Self {
        let mut l = Self {
            ignore_unexpected: vec!["*.rotary_emb.inv_freq".into()],
            ..Self::default()
        };
        if tied {
            l.ignore_unexpected.push("lm_head.weight".into());
        }
        l
    }

    /// `BertForSequenceClassification` (also reads a `BertModel` checkpoint, whose names lack
    /// the `bert.` prefix); `position_ids` buffers and, when the model pools by mean, the
    /// checkpoint's pooler are never unexpected.
    pub fn bert() -> Self {
        Self {
            transposed: vec![],
            tied: vec![],
            optional_prefixes: vec!["bert.".into()],
            ignore_unexpected: ["*position_ids", "*pooler.dense.*"]
                .map(String::from)
                .to_vec(),
        }
    }

    /// Adds a tie `(alias, source)`.
    pub fn with_tied(mut self, alias: &str, source: &str) -> Self {
        self.tied.push((alias.to_string(), source.to_string()));
        self
    }

    /// The layout for a Hugging Face `model_type` (`gpt2`, `switch_transformers`, `olmoe`).
    pub fn for_model_type(model_type: &str) -> Result<Self> {
        match model_type {
            "gpt2" => Ok(Self::gpt2()),
            "switch_transformers" => Ok(Self::switch_transformers()),
            "olmoe" => Ok(Self::olmoe()),
            "llama" | "mixtral" | "qwen2_moe" => Ok(Self::llama_family(false)),
            "bert" => Ok(Self::bert()),
            other => Err(ModelError::InvalidConfig(format!(
                "no checkpoint layout for model_type {other:?} (known: gpt2, switch_transformers, olmoe, llama, mixtral, qwen2_moe, bert)"
            ))),
        }
    }

    pub(crate) fn is_transposed(&self, var: &str) -> bool {
        crate::layers::any_match(&self.transposed, var)
    }

    /// File names to try for variable `var`, best first.
    pub(crate) fn candidates(&self, var: &str) -> Vec<(String, bool)> {
        let mut direct = vec![var.to_string()];
        for p in &self.optional_prefixes {
            if let Some(rest) = var.strip_prefix(p.as_str()) {
                direct.push(rest.to_string());
            }
        }
        let mut out: Vec<(String, bool)> = direct.iter().map(|n| (n.clone(), false)).collect();
        for (alias, source) in &self.tied {
            if alias == var {
                out.push((source.clone(), true));
                for p in &self.optional_prefixes {
                    if let Some(rest) = source.strip_prefix(p.as_str()) {
                        out.push((rest.to_string(), true));
                    }
                }
            }
        }
        out
    }

    /// When checkpoint tensor `name` is the alias of a tied weight (e.g. an old GPT-2 file that
    /// stores both `lm_head.weight` and `wte.weight`), the source's name in `available`.
    pub(crate) fn tied_source_in(
        &self,
        name: &str,
        available: &std::collections::BTreeSet<String>,
    ) -> Option<String> {
        self.tied.iter().find_map(|(alias, source)| {
            let matches = alias == name
                || self
                    .optional_prefixes
                    .iter()
                    .any(|p| alias.strip_prefix(p.as_str()) == Some(name));
            if !matches {
                return None;
            }
            std::iter::once(source.clone())
                .chain(
                    self.optional_prefixes
                        .iter()
                        .filter_map(|p| source.strip_prefix(p.as_str()).map(str::to_string)),
                )
                .find(|s| available.contains(s))
        })
    }
}
