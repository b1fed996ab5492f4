//! Llama-family causal decoders composed from shared blocks: Llama (dense, SwiGLU, GQA),
//! Mixtral (top-k softmax MoE, `block_sparse_moe.experts.{e}.w1/w2/w3`), Qwen2-MoE (routed
//! experts plus a sigmoid-gated shared expert, dense layers where configured) and OLMoE (MoE
//! with q/k norms; [`crate::OlmoeDecoder`] wraps this type).
//!
//! Variable names equal the Hugging Face checkpoint names of each family:
//!
//! | part | names |
//! |---|---|
//! | embedding, final norm | `model.embed_tokens.weight`, `model.norm.weight` |
//! | norms | `model.layers.{i}.{input,post_attention}_layernorm.weight` |
//! | attention | `model.layers.{i}.self_attn.{q,k,v,o}_proj.{weight,bias}` (+ OLMoE `q_norm`, `k_norm`) |
//! | dense MLP (Llama, Qwen2-MoE dense layers) | `model.layers.{i}.mlp.{gate,up,down}_proj.weight` |
//! | Mixtral MoE | `model.layers.{i}.block_sparse_moe.gate.weight`, `….block_sparse_moe.experts.{e}.{w1,w3,w2}.weight` |
//! | OLMoE / Qwen2-MoE MoE | `model.layers.{i}.mlp.gate.weight`, `model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight` |
//! | Qwen2-MoE shared expert | `model.layers.{i}.mlp.shared_expert.{gate,up,down}_proj.weight`, `model.layers.{i}.mlp.shared_expert_gate.weight` |
//! | heads | `lm_head.weight` (absent when tied to the embedding), classification `score.weight` |
//!
//! Privacy: routers are frozen and never recorded; routed experts are owner-masked by the
//! context's owner maps; a Qwen2-MoE shared expert (and its gate) is part of the shared stream:
//! it runs on every token densely and is never owner-masked.

use crate::batch::{Batch, Task};
use crate::blocks::{
    AttentionSpec, GatedMlp, GatedNames, Rope, RopeScaling, RotaryAttention, RoutingSpec,
    SharedExpert, SparseMoe, causal_mask, last_valid, tied_lm_head,
};
use crate::error::{ModelError, Result};
use crate::layers::{Act, Embedding, ForwardCtx, Linear, RmsNorm, RowSpec};
use crate::model::{Model, MoeShape};
use tch::nn::VarStore;
use tch::{Device, Tensor};

/// Which Hugging Face family (tensor names and `model_type`) a [`Decoder`] follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum DecoderFamily {
    /// `LlamaForCausalLM` (`model_type: llama`), dense.
    Llama,
    /// `MixtralForCausalLM` (`model_type: mixtral`).
    Mixtral,
    /// `Qwen2MoeForCausalLM` (`model_type: qwen2_moe`).
    Qwen2Moe,
    /// `OlmoeForCausalLM` (`model_type: olmoe`).
    Olmoe,
}

impl DecoderFamily {
    /// The Hugging Face `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Mixtral => "mixtral",
            Self::Qwen2Moe => "qwen2_moe",
            Self::Olmoe => "olmoe",
        }
    }

    /// The Hugging Face causal-LM class name.
    pub fn architecture(self) -> &'static str {
        match self {
            Self::Llama => "LlamaForCausalLM",
            Self::Mixtral => "MixtralForCausalLM",
            Self::Qwen2Moe => "Qwen2MoeForCausalLM",
            Self::Olmoe => "OlmoeForCausalLM",
        }
    }

    /// Module prefix of layer `i`'s MoE block (router `{prefix}.gate`, experts
    /// `{prefix}.experts.{e}`).
    pub fn moe_prefix(self, i: usize) -> String {
        match self {
            Self::Mixtral => format!("model.layers.{i}.block_sparse_moe"),
            _ => format!("model.layers.{i}.mlp"),
        }
    }

    fn expert_names(self) -> GatedNames {
        match self {
            Self::Mixtral => GatedNames::W123,
            _ => GatedNames::PROJ,
        }
    }
}

/// The mixture-of-experts part of a [`DecoderConfig`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MoeConfig {
    /// Routed experts per sparse layer.
    pub num_experts: i64,
    /// Experts per token (top-k).
    pub num_experts_per_tok: i64,
    /// Inner size of each routed expert.
    pub expert_intermediate_size: i64,
    /// Renormalize the top-k softmax probabilities to sum to 1 (Mixtral: true).
    pub norm_topk_prob: bool,
    /// Inner size of the always-on shared expert (Qwen2-MoE), if any.
    pub shared_expert_intermediate_size: Option<i64>,
    /// Indices of the sparse layers (the others have a dense MLP of `intermediate_size`).
    pub sparse_layers: Vec<usize>,
}

/// Configuration of a [`Decoder`] (field names follow the Hugging Face configs).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DecoderConfig {
    /// Tensor names and `model_type`.
    pub family: DecoderFamily,
    /// Vocabulary size.
    pub vocab_size: i64,
    /// Hidden size.
    pub hidden_size: i64,
    /// Inner size of the dense MLP layers.
    pub intermediate_size: i64,
    /// Decoder layers.
    pub num_hidden_layers: i64,
    /// Query heads.
    pub num_attention_heads: i64,
    /// Key/value heads (grouped-query attention when fewer than the query heads).
    pub num_key_value_heads: i64,
    /// Per-head size (usually `hidden_size / num_attention_heads`).
    pub head_dim: i64,
    /// MLP / expert activation (the SwiGLU gate).
    pub hidden_act: Act,
    /// RMS norm ε.
    pub rms_norm_eps: f64,
    /// RoPE base θ.
    pub rope_theta: f64,
    /// RoPE scaling.
    pub rope_scaling: RopeScaling,
    /// Bias on the q/k/v projections.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// Bias on the dense MLP projections.
    pub mlp_bias: bool,
    /// RMS norms on the projected queries and keys (OLMoE).
    pub qk_norm: bool,
    /// Clamp q/k/v to ±clip_qkv (OLMoE).
    pub clip_qkv: Option<f64>,
    /// Mixture of experts; None for a dense model.
    pub moe: Option<MoeConfig>,
    /// The language-model head is the token embedding (no `lm_head.weight`).
    pub tie_word_embeddings: bool,
    /// Head.
    pub head: DecoderHead,
}

impl DecoderConfig {
    /// A tiny configuration of `family` for tests: vocabulary 40, hidden 16, 2 layers, 4 query
    /// heads over 2 key/value heads; MoE families get 4 experts, top-2 (Qwen2-MoE: a shared
    /// expert of width 10, layer 1 dense).
    pub fn tiny(family: DecoderFamily, head: DecoderHead) -> Self {
        let moe = |shared: Option<i64>, sparse: Vec<usize>, norm: bool| MoeConfig {
            num_experts: 4,
            num_experts_per_tok: 2,
            expert_intermediate_size: 12,
            norm_topk_prob: norm,
            shared_expert_intermediate_size: shared,
            sparse_layers: sparse,
        };
        let (moe, qkv_bias, qk_norm) = match family {
            DecoderFamily::Llama => (None, false, false),
            DecoderFamily::Mixtral => (Some(moe(None, vec![0, 1], true)), false, false),
            DecoderFamily::Qwen2Moe => (Some(moe(Some(10), vec![0], false)), true, false),
            DecoderFamily::Olmoe => (Some(moe(None, vec![0, 1], false)), false, true),
        };
        Self {
            family,
            vocab_size: 40,
            hidden_size: 16,
            intermediate_size: 20,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 4,
            hidden_act: Act::Silu,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_scaling: RopeScaling::None,
            qkv_bias,
            o_bias: false,
            mlp_bias: false,
            qk_norm,
            clip_qkv: None,
            moe,
            tie_word_embeddings: false,
            head,
        }
    }

    fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(ModelError::InvalidConfig(why));
        if self.vocab_size < 1 || self.hidden_size < 1 || self.num_hidden_layers < 0 {
            return bad(format!("bad sizes in {self:?}"));
        }
        if self.num_attention_heads < 1
            || self.num_key_value_heads < 1
            || self.num_attention_heads % self.num_key_value_heads != 0
            || self.head_dim < 2
            || self.head_dim % 2 != 0
        {
            return bad(format!(
                "bad attention sizes: {} query heads, {} key/value heads, head_dim {} (even, heads a multiple of key/value heads)",
                self.num_attention_heads, self.num_key_value_heads, self.head_dim
            ));
        }
        if let RopeScaling::Linear { factor } = self.rope_scaling
            && !(factor.is_finite() && factor > 0.0)
        {
            return bad(format!(
                "RoPE linear scaling factor {factor} must be positive"
            ));
        }
        if let Some(m) = &self.moe {
            if m.num_experts < 1
                || m.num_experts_per_tok < 1
                || m.num_experts_per_tok > m.num_experts
            {
                return bad(format!(
                    "num_experts_per_tok {} must be in [1, num_experts = {}]",
                    m.num_experts_per_tok, m.num_experts
                ));
            }
            if let Some(&l) = m
                .sparse_layers
                .iter()
                .find(|&&l| l as i64 >= self.num_hidden_layers)
            {
                return bad(format!(
                    "sparse layer {l} is outside the {} layers",
                    self.num_hidden_layers
                ));
            }
            if m.shared_expert_intermediate_size.is_some() && self.family != DecoderFamily::Qwen2Moe
            {
                return bad(format!(
                    "a shared expert is only defined for qwen2_moe, not {}",
                    self.family.model_type()
                ));
            }
        } else if self.family != DecoderFamily::Llama {
            return bad(format!(
                "{} is a mixture-of-experts family: moe must be set",
                self.family.model_type()
            ));
        }
        if self.family == DecoderFamily::Llama && self.moe.is_some() {
            return bad("llama is dense: moe must be None".into());
        }
        Ok(())
    }
}

#[derive(Debug)]
enum Ffn {
    Dense(Box<GatedMlp>),
    Sparse(Box<SparseMoe>),
}

#[derive(Debug)]
struct Layer {
    input_ln: RmsNorm,
    attn: RotaryAttention,
    post_ln: RmsNorm,
    ffn: Ffn,
}

/// A Llama-family causal decoder (see the module docs for the families and tensor names).
#[derive(Debug)]
pub struct Decoder {
    cfg: DecoderConfig,
    vs: VarStore,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    /// `lm_head` (untied LM head) or `score` (classification); None for a tied LM head.
    head: Option<Linear>,
}

impl Decoder {
    /// Builds a randomly initialized model (std 0.02, Hugging Face's default; routers frozen)
    /// on `device`.
    pub fn new(cfg: DecoderConfig, device: Device) -> Result<Self> {
        cfg.validate()?;
        let vs = VarStore::new(device);
        let d = cfg.hidden_size;
        let std = 0.02;
        let embed = Embedding::new(&vs, "model.embed_tokens", cfg.vocab_size, d, std)?;
        let spec = AttentionSpec {
            hidden: d,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
            qkv_bias: cfg.qkv_bias,
            o_bias: cfg.o_bias,
            qk_norm: cfg.qk_norm,
            norm_eps: cfg.rms_norm_eps,
            clip_qkv: cfg.clip_qkv,
        };
        let mut layers = Vec::new();
        for i in 0..cfg.num_hidden_layers as usize {
            let p = format!("model.layers.{i}");
            let ffn = match &cfg.moe {
                Some(m) if m.sparse_layers.contains(&i) => {
                    let mp = cfg.family.moe_prefix(i);
                    let mut experts = Vec::new();
                    for e in 0..m.num_experts {
                        experts.push(GatedMlp::new(
                            &vs,
                            &format!("{mp}.experts.{e}"),
                            cfg.family.expert_names(),
                            d,
                            m.expert_intermediate_size,
                            false,
                            cfg.hidden_act,
                            std,
                        )?);
                    }
                    let shared = match m.shared_expert_intermediate_size {
                        Some(w) => Some(SharedExpert {
                            mlp: GatedMlp::new(
                                &vs,
                                &format!("{mp}.shared_expert"),
                                GatedNames::PROJ,
                                d,
                                w,
                                false,
                                cfg.hidden_act,
                                std,
                            )?,
                            gate: Linear::new(
                                &vs,
                                &format!("{mp}.shared_expert_gate"),
                                d,
                                1,
                                false,
                                std,
                            )?,
                        }),
                        None => None,
                    };
                    let router =
                        Linear::new(&vs, &format!("{mp}.gate"), d, m.num_experts, false, std)?;
                    let _ = router.weight.f_set_requires_grad(false)?;
                    Ffn::Sparse(Box::new(SparseMoe {
                        routing: RoutingSpec {
                            num_experts: m.num_experts,
                            top_k: m.num_experts_per_tok,
                            norm_topk_prob: m.norm_topk_prob,
                        },
                        router,
                        experts,
                        shared,
                    }))
                }
                _ => Ffn::Dense(Box::new(GatedMlp::new(
                    &vs,
                    &format!("{p}.mlp"),
                    GatedNames::PROJ,
                    d,
                    cfg.intermediate_size,
                    cfg.mlp_bias,
                    cfg.hidden_act,
                    std,
                )?)),
            };
            layers.push(Layer {
                input_ln: RmsNorm::new(&vs, &format!("{p}.input_layernorm"), d, cfg.rms_norm_eps)?,
                attn: RotaryAttention::new(&vs, &format!("{p}.self_attn"), spec, std)?,
                post_ln: RmsNorm::new(
                    &vs,
                    &format!("{p}.post_attention_layernorm"),
                    d,
                    cfg.rms_norm_eps,
                )?,
                ffn,
            });
        }
        let norm = RmsNorm::new(&vs, "model.norm", d, cfg.rms_norm_eps)?;
        let head = match cfg.head {
            DecoderHead::LanguageModel if cfg.tie_word_embeddings => None,
            DecoderHead::LanguageModel => {
                Some(Linear::new(&vs, "lm_head", d, cfg.vocab_size, false, std)?)
            }
            DecoderHead::Classification { num_labels } => {
                Some(Linear::new(&vs, "score", d, num_labels, false, std)?)
            }
        };
        Ok(Self {
            cfg,
            vs,
            embed,
            layers,
            norm,
            head,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &DecoderConfig {
        &self.cfg
    }

    fn rope(&self) -> Rope {
        Rope {
            head_dim: self.cfg.head_dim,
            theta: self.cfg.rope_theta,
            scaling: self.cfg.rope_scaling,
        }
    }

    /// Hidden states after the final norm `[B, T, d]`.
    pub fn hidden_states(&self, batch: &Batch, ctx: &mut ForwardCtx) -> Result<Tensor> {
        batch.validate(self.cfg.vocab_size, None)?;
        let mut h = self.embed.forward(&batch.input_ids, ctx)?;
        let kind = h.kind();
        let mask = causal_mask(&batch.attention_mask, kind)?;
        let cs = self.rope().cos_sin(batch.seq_len(), kind, h.device())?;
        for (i, l) in self.layers.iter().enumerate() {
            let n = l.input_ln.forward(&h, ctx)?;
            h = h.f_add(&l.attn.forward(&n, &mask, &cs, ctx)?)?;
            let n = l.post_ln.forward(&h, ctx)?;
            let f = match &l.ffn {
                Ffn::Dense(m) => m.forward_rows(&n, ctx, RowSpec::Dense, None)?,
                Ffn::Sparse(m) => m.forward(i, &n, &batch.attention_mask, ctx)?,
            };
            h = h.f_add(&f)?;
        }
        self.norm.forward(&h, ctx)
    }
}

impl Model for Decoder {
    fn hf_config_json(&self) -> Option<serde_json::Value> {
        let c = &self.cfg;
        let rope = match c.rope_scaling {
            RopeScaling::None => {
                serde_json::json!({"rope_type": "default", "rope_theta": c.rope_theta})
            }
            RopeScaling::Linear { factor } => serde_json::json!({
                "rope_type": "linear", "rope_theta": c.rope_theta, "factor": factor
            }),
        };
        let mut v = serde_json::json!({
            "model_type": c.family.model_type(),
            "architectures": [c.family.architecture()],
            "vocab_size": c.vocab_size,
            "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_hidden_layers,
            "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads,
            "head_dim": c.head_dim,
            "hidden_act": c.hidden_act.hf_name(),
            "rms_norm_eps": c.rms_norm_eps,
            "rope_parameters": rope,
            "tie_word_embeddings": c.tie_word_embeddings,
        });
        let obj = v.as_object_mut()?;
        match c.family {
            DecoderFamily::Llama => {
                if c.qkv_bias != c.o_bias {
                    return None;
                }
                obj.insert("attention_bias".into(), c.qkv_bias.into());
                obj.insert("mlp_bias".into(), c.mlp_bias.into());
            }
            DecoderFamily::Mixtral => {
                let m = c.moe.as_ref()?;
                let all: Vec<usize> = (0..c.num_hidden_layers as usize).collect();
                if c.qkv_bias
                    || c.o_bias
                    || !m.norm_topk_prob
                    || m.sparse_layers != all
                    || m.expert_intermediate_size != c.intermediate_size
                {
                    return None;
                }
                obj.insert("num_local_experts".into(), m.num_experts.into());
                obj.insert("num_experts_per_tok".into(), m.num_experts_per_tok.into());
                obj.insert("router_jitter_noise".into(), 0.0.into());
            }
            DecoderFamily::Qwen2Moe => {
                let m = c.moe.as_ref()?;
                if c.o_bias {
                    return None;
                }
                let dense: Vec<usize> = (0..c.num_hidden_layers as usize)
                    .filter(|l| !m.sparse_layers.contains(l))
                    .collect();
                obj.insert("qkv_bias".into(), c.qkv_bias.into());
                obj.insert("num_experts".into(), m.num_experts.into());
                obj.insert("num_experts_per_tok".into(), m.num_experts_per_tok.into());
                obj.insert(
                    "moe_intermediate_size".into(),
                    m.expert_intermediate_size.into(),
                );
                obj.insert(
                    "shared_expert_intermediate_size".into(),
                    m.shared_expert_intermediate_size?.into(),
                );
                obj.insert("norm_topk_prob".into(), m.norm_topk_prob.into());
                obj.insert("decoder_sparse_step".into(), 1.into());
                obj.insert("mlp_only_layers".into(), serde_json::json!(dense));
            }
            DecoderFamily::Olmoe => return None,
        }
        Some(v)
    }

    fn var_store(&self) -> &VarStore {
        &self.vs
    }

    fn var_store_mut(&mut self) -> &mut VarStore {
        &mut self.vs
    }

    fn vocab_size(&self) -> i64 {
        self.cfg.vocab_size
    }

    fn num_labels(&self) -> Option<i64> {
        self.cfg.head.num_labels()
    }

    fn moe_shape(&self) -> Option<MoeShape> {
        let m = self.cfg.moe.as_ref()?;
        Some(MoeShape::new(
            m.sparse_layers.clone(),
            m.num_experts,
            m.num_experts_per_tok,
        ))
    }

    fn linears_mut(&mut self) -> (&VarStore, Vec<&mut Linear>) {
        let mut v: Vec<&mut Linear> = Vec::new();
        for l in &mut self.layers {
            v.extend(l.attn.linears_mut());
            match &mut l.ffn {
                Ffn::Dense(m) => v.extend(m.linears_mut()),
                Ffn::Sparse(m) => v.extend(m.linears_mut()),
            }
        }
        if let Some(h) = &mut self.head {
            v.push(h);
        }
        (&self.vs, v)
    }

    fn router_params(&self) -> Vec<String> {
        self.layers
            .iter()
            .filter_map(|l| match &l.ffn {
                Ffn::Sparse(m) => Some(m.router.param_names()),
                Ffn::Dense(_) => None,
            })
            .flatten()
            .collect()
    }

    fn forward(&self, batch: &Batch, ctx: &mut ForwardCtx) -> Result<Tensor> {
        let h = self.hidden_states(batch, ctx)?;
        match (&self.cfg.head, &self.head) {
            (DecoderHead::LanguageModel, Some(lm)) => lm.forward(&h, ctx),
            (DecoderHead::LanguageModel, None) => tied_lm_head(&h, &self.embed, ctx),
            (DecoderHead::Classification { .. }, Some(s)) => {
                s.forward(&last_valid(&h, &batch.attention_mask)?, ctx)
            }
            (DecoderHead::Classification { .. }, None) => Err(ModelError::InvalidConfig(
                "classification decoder without a score head".into(),
            )),
        }
    }
}

/// What a decoder's head computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum DecoderHead {
    /// Next-token logits `[B, T, V]`.
    LanguageModel,
    /// Class logits `[B, C]` from the hidden state of each record's last valid token.
    Classification {
        /// Number of classes.
        num_labels: i64,
    },
}

impl DecoderHead {
    /// The loss this head trains with.
    pub fn task(&self) -> Task {
        match self {
            DecoderHead::LanguageModel => Task::LanguageModel,
            DecoderHead::Classification { .. } => Task::Classification,
        }
    }

    /// Number of classes (`None` for the language-model head).
    pub fn num_labels(&self) -> Option<i64> {
        match self {
            DecoderHead::LanguageModel => None,
            DecoderHead::Classification { num_labels } => Some(*num_labels),
        }
    }
}
