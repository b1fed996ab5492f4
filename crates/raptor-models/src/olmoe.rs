//! OLMoE-style MoE decoder (top-k routing, q/k RMS norms, rotary embeddings, causal).
//!
//! Variable names equal Hugging Face `OlmoeForCausalLM` checkpoint names
//! (`model.embed_tokens.weight`, `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight`,
//! `model.layers.{i}.self_attn.{q,k}_norm.weight`, `model.layers.{i}.{input,post_attention}_layernorm.weight`,
//! `model.layers.{i}.mlp.gate.weight`, `model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight`,
//! `model.norm.weight`, `lm_head.weight`); a classification head is `score.weight` (no bias) on
//! the last valid token.

use crate::batch::{Batch, Task};
use crate::error::{ModelError, Result};
use crate::layers::{Act, Embedding, ForwardCtx, Linear, RmsNorm, mask_min};
use crate::model::Model;
use crate::moe::{dispatch, routing_and_owners};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

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
}

#[derive(Debug)]
struct Layer {
    input_ln: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    post_ln: RmsNorm,
    gate: Linear,
    experts: Vec<[Linear; 3]>,
}

/// OLMoE-style decoder.
#[derive(Debug)]
pub struct OlmoeDecoder {
    cfg: OlmoeConfig,
    vs: VarStore,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    head: Linear,
}

/// Additive mask `[B, 1, T, T]`: causal and key-padding, the most negative finite value where masked.
pub(crate) fn causal_mask(mask: &Tensor, kind: Kind) -> Result<Tensor> {
    let size = mask.size();
    let (b, t) = (size[0], size[1]);
    let causal = Tensor::f_ones([t, t], (Kind::Bool, mask.device()))?.f_tril(0)?;
    let keys = mask.f_gt(0)?.f_reshape([b, 1, 1, t])?;
    let allowed = keys.f_logical_and(&causal.f_reshape([1, 1, t, t])?)?;
    let zero = Tensor::f_zeros([1], (kind, mask.device()))?;
    let neg = Tensor::f_full([1], mask_min(kind), (kind, mask.device()))?;
    Ok(zero.f_where_self(&allowed, &neg)?)
}

/// Hidden state of each record's last valid token: `h [B, T, d]` → `[B, d]`.
pub(crate) fn last_valid(h: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let d = h.size()[2];
    let last = mask
        .f_sum_dim_intlist(1, false, Kind::Int64)?
        .f_sub_scalar(1)?
        .f_reshape([-1, 1, 1])?
        .f_expand([-1, 1, d], false)?;
    Ok(h.f_gather(1, &last, false)?.f_squeeze_dim(1)?)
}

impl OlmoeDecoder {
    /// Builds a randomly initialized model (std 0.02, Hugging Face's default) on `device`.
    pub fn new(cfg: OlmoeConfig, device: Device) -> Result<Self> {
        if cfg.hidden_size % cfg.num_attention_heads != 0
            || cfg.num_key_value_heads <= 0
            || cfg.num_attention_heads % cfg.num_key_value_heads != 0
            || cfg.head_dim() % 2 != 0
        {
            return Err(ModelError::InvalidConfig(format!(
                "bad attention sizes in {cfg:?}"
            )));
        }
        if cfg.num_experts_per_tok < 1 || cfg.num_experts_per_tok > cfg.num_experts {
            return Err(ModelError::InvalidConfig(format!(
                "num_experts_per_tok {} must be in [1, num_experts = {}]",
                cfg.num_experts_per_tok, cfg.num_experts
            )));
        }
        let vs = VarStore::new(device);
        let (d, hd) = (cfg.hidden_size, cfg.head_dim());
        let kvd = cfg.num_key_value_heads * hd;
        let std = 0.02;
        let embed = Embedding::new(&vs, "model.embed_tokens", cfg.vocab_size, d, std)?;
        let mut layers = Vec::new();
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let a = format!("{p}.self_attn");
            let mut experts = Vec::new();
            for e in 0..cfg.num_experts {
                let ep = format!("{p}.mlp.experts.{e}");
                experts.push([
                    Linear::new(
                        &vs,
                        &format!("{ep}.gate_proj"),
                        d,
                        cfg.intermediate_size,
                        false,
                        std,
                    )?,
                    Linear::new(
                        &vs,
                        &format!("{ep}.up_proj"),
                        d,
                        cfg.intermediate_size,
                        false,
                        std,
                    )?,
                    Linear::new(
                        &vs,
                        &format!("{ep}.down_proj"),
                        cfg.intermediate_size,
                        d,
                        false,
                        std,
                    )?,
                ]);
            }
            layers.push(Layer {
                input_ln: RmsNorm::new(&vs, &format!("{p}.input_layernorm"), d, cfg.rms_norm_eps)?,
                q: Linear::new(&vs, &format!("{a}.q_proj"), d, d, cfg.attention_bias, std)?,
                k: Linear::new(&vs, &format!("{a}.k_proj"), d, kvd, cfg.attention_bias, std)?,
                v: Linear::new(&vs, &format!("{a}.v_proj"), d, kvd, cfg.attention_bias, std)?,
                o: Linear::new(&vs, &format!("{a}.o_proj"), d, d, cfg.attention_bias, std)?,
                q_norm: RmsNorm::new(&vs, &format!("{a}.q_norm"), d, cfg.rms_norm_eps)?,
                k_norm: RmsNorm::new(&vs, &format!("{a}.k_norm"), kvd, cfg.rms_norm_eps)?,
                post_ln: RmsNorm::new(
                    &vs,
                    &format!("{p}.post_attention_layernorm"),
                    d,
                    cfg.rms_norm_eps,
                )?,
                gate: Linear::new(
                    &vs,
                    &format!("{p}.mlp.gate"),
                    d,
                    cfg.num_experts,
                    false,
                    std,
                )?,
                experts,
            });
        }
        let norm = RmsNorm::new(&vs, "model.norm", d, cfg.rms_norm_eps)?;
        let head = match cfg.head {
            DecoderHead::LanguageModel => {
                Linear::new(&vs, "lm_head", d, cfg.vocab_size, false, std)?
            }
            DecoderHead::Classification { num_labels } => {
                Linear::new(&vs, "score", d, num_labels, false, std)?
            }
        };
        for l in &layers {
            let _ = l.gate.weight.f_set_requires_grad(false)?;
        }
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
    pub fn config(&self) -> &OlmoeConfig {
        &self.cfg
    }

    fn rope(&self, t: i64, kind: Kind, device: Device) -> Result<(Tensor, Tensor)> {
        let hd = self.cfg.head_dim();
        let inv = Tensor::f_arange_start_step(0, hd, 2, (Kind::Float, device))?
            .f_div_scalar(hd as f64)?;
        let inv = Tensor::f_full([hd / 2], self.cfg.rope_theta, (Kind::Float, device))?
            .f_pow(&inv)?
            .f_reciprocal()?;
        let pos = Tensor::f_arange(t, (Kind::Float, device))?;
        let freqs = pos.f_unsqueeze(1)?.f_mul(&inv.f_unsqueeze(0)?)?;
        let emb = Tensor::f_cat(&[&freqs, &freqs], -1)?;
        Ok((emb.f_cos()?.f_to_kind(kind)?, emb.f_sin()?.f_to_kind(kind)?))
    }

    fn attention(
        &self,
        l: &Layer,
        x: &Tensor,
        mask: &Tensor,
        cs: &(Tensor, Tensor),
        ctx: &mut ForwardCtx,
    ) -> Result<Tensor> {
        let size = x.size();
        let (b, t) = (size[0], size[1]);
        let (h, kvh, hd) = (
            self.cfg.num_attention_heads,
            self.cfg.num_key_value_heads,
            self.cfg.head_dim(),
        );
        let mut q = l.q_norm.forward(&l.q.forward(x, ctx)?, ctx)?;
        let mut k = l.k_norm.forward(&l.k.forward(x, ctx)?, ctx)?;
        let mut v = l.v.forward(x, ctx)?;
        if let Some(c) = self.cfg.clip_qkv {
            q = q.f_clamp(-c, c)?;
            k = k.f_clamp(-c, c)?;
            v = v.f_clamp(-c, c)?;
        }
        let q = q.f_reshape([b, t, h, hd])?.f_transpose(1, 2)?;
        let k = k.f_reshape([b, t, kvh, hd])?.f_transpose(1, 2)?;
        let v = v.f_reshape([b, t, kvh, hd])?.f_transpose(1, 2)?;
        let rot = |x: &Tensor| -> Result<Tensor> {
            let halves = x.f_chunk(2, -1)?;
            let r = Tensor::f_cat(&[&halves[1].f_neg()?, &halves[0]], -1)?;
            Ok(x.f_mul(&cs.0)?.f_add(&r.f_mul(&cs.1)?)?)
        };
        let q = rot(&q)?;
        let mut k = rot(&k)?;
        let mut v = v;
        if kvh != h {
            let rep = h / kvh;
            k = k.f_repeat_interleave_self_int(rep, 1, None::<i64>)?;
            v = v.f_repeat_interleave_self_int(rep, 1, None::<i64>)?;
        }
        let scores = q
            .f_matmul(&k.f_transpose(2, 3)?)?
            .f_mul_scalar((hd as f64).powf(-0.5))?
            .f_add(mask)?;
        let attn = scores.f_softmax(-1, None::<Kind>)?;
        let out = attn
            .f_matmul(&v)?
            .f_transpose(1, 2)?
            .f_reshape([b, t, h * hd])?;
        l.o.forward(&out, ctx)
    }

    fn moe(
        &self,
        li: usize,
        l: &Layer,
        x: &Tensor,
        mask: &Tensor,
        ctx: &mut ForwardCtx,
    ) -> Result<Tensor> {
        let logits = l.gate.forward(x, &mut ForwardCtx::new(false))?;
        let probs = logits.f_softmax(-1, None::<Kind>)?;
        let (mut w, sel) = probs.f_topk(self.cfg.num_experts_per_tok, -1, true, true)?;
        if self.cfg.norm_topk_prob {
            w = w.f_div(&w.f_sum_dim_intlist(-1, true, None::<Kind>)?)?;
        }
        let owners =
            routing_and_owners(ctx, li, &sel, &w, mask, x.size()[0], self.cfg.num_experts)?;
        let act = self.cfg.hidden_act;
        dispatch(
            x,
            &sel,
            &w,
            None,
            self.cfg.num_experts,
            owners.as_ref(),
            ctx,
            |e, xe, rows, m, ctx| {
                let [g, u, dn] = &l.experts[e];
                let gv = act.apply(&g.forward_rows(xe, ctx, rows, m)?)?;
                let uv = u.forward_rows(xe, ctx, rows, m)?;
                dn.forward_rows(&gv.f_mul(&uv)?, ctx, rows, m)
            },
        )
    }
}

impl Model for OlmoeDecoder {
    fn var_store(&self) -> &VarStore {
        &self.vs
    }

    fn var_store_mut(&mut self) -> &mut VarStore {
        &mut self.vs
    }

    fn vocab_size(&self) -> i64 {
        self.cfg.vocab_size
    }

    fn task(&self) -> Task {
        self.cfg.head.task()
    }

    fn num_labels(&self) -> Option<i64> {
        self.cfg.head.num_labels()
    }

    fn sparse_layers(&self) -> Vec<usize> {
        (0..self.cfg.num_hidden_layers as usize).collect()
    }

    fn num_experts(&self) -> i64 {
        self.cfg.num_experts
    }

    fn top_k(&self) -> i64 {
        self.cfg.num_experts_per_tok
    }

    fn expert_capacity(&self) -> Option<i64> {
        None
    }

    fn linears_mut(&mut self) -> (&VarStore, Vec<&mut Linear>) {
        let mut v: Vec<&mut Linear> = Vec::new();
        for l in &mut self.layers {
            v.push(&mut l.q);
            v.push(&mut l.k);
            v.push(&mut l.v);
            v.push(&mut l.o);
            for ex in &mut l.experts {
                for lin in ex.iter_mut() {
                    v.push(lin);
                }
            }
        }
        v.push(&mut self.head);
        (&self.vs, v)
    }

    fn router_params(&self) -> Vec<String> {
        self.layers
            .iter()
            .map(|l| format!("{}.weight", l.gate.name))
            .collect()
    }

    fn forward(&self, batch: &Batch, ctx: &mut ForwardCtx) -> Result<Tensor> {
        batch.validate(self.cfg.vocab_size, None)?;
        let mut h = self.embed.forward(&batch.input_ids, ctx)?;
        let kind = h.kind();
        let mask = causal_mask(&batch.attention_mask, kind)?;
        let cs = self.rope(batch.seq_len(), kind, h.device())?;
        for (i, l) in self.layers.iter().enumerate() {
            let n = l.input_ln.forward(&h, ctx)?;
            h = h.f_add(&self.attention(l, &n, &mask, &cs, ctx)?)?;
            let n = l.post_ln.forward(&h, ctx)?;
            h = h.f_add(&self.moe(i, l, &n, &batch.attention_mask, ctx)?)?;
        }
        let h = self.norm.forward(&h, ctx)?;
        match self.cfg.head {
            DecoderHead::LanguageModel => self.head.forward(&h, ctx),
            DecoderHead::Classification { .. } => self
                .head
                .forward(&last_valid(&h, &batch.attention_mask)?, ctx),
        }
    }
}
