//! OLMoE-style MoE decoder (top-k routing, q/k RMS norms, rotary embeddings, causal).
//!
//! Variable names equal Hugging Face `OlmoeForCausalLM` checkpoint names
//! (`model.embed_tokens.weight`, `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight`,
//! `model.layers.{i}.self_attn.{q,k}_norm.weight`, `model.layers.{i}.{input,post_attention}_layernorm.weight`,
//! `model.layers.{i}.mlp.gate.weight`, `model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight`,
//! `model.norm.weight`, `lm_head.weight`); a classification head is `score.weight` (no bias) on
//! the last valid token.

use crate::blocks::RopeScaling;
pub use crate::decoder::DecoderHead;
use crate::decoder::{Decoder, DecoderConfig, DecoderFamily, MoeConfig};
use crate::error::{ModelError, Result};
use crate::layers::Act;
use tch::Device;

/// Configuration of [`OlmoeDecoder`] (field names follow Hugging Face `OlmoeConfig`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OlmoeConfig {
    /// Vocabulary size.
    pub vocab_size: i64,
    /// Hidden size.
    pub hidden_size: i64,
    /// Expert FFN inner size.
    pub intermediate_size: i64,
    /// Decoder layers (all sparse).
    pub num_hidden_layers: i64,
    /// Attention heads.
    pub num_attention_heads: i64,
    /// Key/value heads (grouped-query attention when smaller).
    pub num_key_value_heads: i64,
    /// Expert activation (SwiGLU gate).
    pub hidden_act: Act,
    /// RMS norm ε.
    pub rms_norm_eps: f64,
    /// Rotary base θ.
    pub rope_theta: f64,
    /// Bias on q/k/v/o projections.
    pub attention_bias: bool,
    /// Clamp q/k/v to ±clip_qkv.
    pub clip_qkv: Option<f64>,
    /// Experts per token (top-k).
    pub num_experts_per_tok: i64,
    /// Experts per layer.
    pub num_experts: i64,
    /// Renormalize the top-k probabilities to sum to 1.
    pub norm_topk_prob: bool,
    /// Head.
    pub head: DecoderHead,
}

impl OlmoeConfig {
    /// A tiny configuration for tests.
    pub fn tiny(head: DecoderHead) -> Self {
        Self {
            vocab_size: 40,
            hidden_size: 16,
            intermediate_size: 12,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 4,
            hidden_act: Act::Silu,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            attention_bias: false,
            clip_qkv: None,
            num_experts_per_tok: 2,
            num_experts: 4,
            norm_topk_prob: false,
            head,
        }
    }

    /// allenai/OLMoE-1B-7B-0924 sizes.
    pub fn olmoe_1b_7b(head: DecoderHead) -> Self {
        Self {
            vocab_size: 50304,
            hidden_size: 2048,
            intermediate_size: 1024,
            num_hidden_layers: 16,
            num_attention_heads: 16,
            num_key_value_heads: 16,
            hidden_act: Act::Silu,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            attention_bias: false,
            clip_qkv: None,
            num_experts_per_tok: 8,
            num_experts: 64,
            norm_topk_prob: false,
            head,
        }
    }

    fn head_dim(&self) -> i64 {
        self.hidden_size / self.num_attention_heads
    }

    /// The shared-block decoder configuration this OLMoE configuration composes (every layer
    /// sparse, q/k norms, attention bias on all four projections).
    pub fn to_decoder_config(&self) -> DecoderConfig {
        DecoderConfig {
            family: DecoderFamily::Olmoe,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            num_key_value_heads: self.num_key_value_heads,
            head_dim: self.head_dim(),
            hidden_act: self.hidden_act,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta: self.rope_theta,
            rope_scaling: RopeScaling::None,
            qkv_bias: self.attention_bias,
            o_bias: self.attention_bias,
            mlp_bias: false,
            qk_norm: true,
            clip_qkv: self.clip_qkv,
            moe: Some(MoeConfig {
                num_experts: self.num_experts,
                num_experts_per_tok: self.num_experts_per_tok,
                expert_intermediate_size: self.intermediate_size,
                norm_topk_prob: self.norm_topk_prob,
                shared_expert_intermediate_size: None,
                sparse_layers: (0..self.num_hidden_layers.max(0) as usize).collect(),
            }),
            tie_word_embeddings: false,
            head: self.head,
        }
    }
}

/// OLMoE-style decoder: the shared-block [`Decoder`] with the OLMoE family's configuration.
#[derive(Debug)]
pub struct OlmoeDecoder {
    cfg: OlmoeConfig,
    inner: Decoder,
}

impl OlmoeDecoder {
    /// Builds a randomly initialized model (std 0.02, Hugging Face's default) on `device`.
    pub fn new(cfg: OlmoeConfig, device: Device) -> Result<Self> {
        if cfg.num_attention_heads < 1 || cfg.hidden_size % cfg.num_attention_heads != 0 {
            return Err(ModelError::InvalidConfig(format!(
                "bad attention sizes in {cfg:?}"
            )));
        }
        let inner = Decoder::new(cfg.to_decoder_config(), device)?;
        Ok(Self { cfg, inner })
    }

    /// The configuration.
    pub fn config(&self) -> &OlmoeConfig {
        &self.cfg
    }

    /// The shared-block decoder inside.
    pub fn decoder(&self) -> &Decoder {
        &self.inner
    }
}

crate::model::delegate_model!(OlmoeDecoder, inner);
