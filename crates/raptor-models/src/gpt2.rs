//! GPT-2 dense decoder, LM head tied to the token embedding.
//!
//! Variable names equal Hugging Face `GPT2LMHeadModel` names (`transformer.wte.weight`,
//! `transformer.wpe.weight`, `transformer.h.{i}.ln_1.{weight,bias}`,
//! `transformer.h.{i}.attn.c_attn.{weight,bias}`, `transformer.h.{i}.attn.c_proj.{weight,bias}`,
//! `transformer.h.{i}.ln_2.{weight,bias}`, `transformer.h.{i}.mlp.c_fc.{weight,bias}`,
//! `transformer.h.{i}.mlp.c_proj.{weight,bias}`, `transformer.ln_f.{weight,bias}`). Our linear
//! weights are `[out, in]`; Hugging Face's Conv1D stores `[in, out]` (the checkpoint loader
//! transposes). A classification head is `score.weight` (no bias) on the last valid token.

use crate::batch::Batch;
use crate::blocks::{attend, causal_mask, last_valid, split_heads, tied_lm_head};
use crate::error::{ModelError, Result};
use crate::layers::{Act, Embedding, ForwardCtx, LayerNorm, Linear};
use crate::model::Model;
use crate::olmoe::DecoderHead;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

/// Configuration of [`Gpt2`] (field names follow Hugging Face `GPT2Config`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Gpt2Config {
    /// Vocabulary size.
    pub vocab_size: i64,
    /// Maximum positions.
    pub n_positions: i64,
    /// Hidden size.
    pub n_embd: i64,
    /// Layers.
    pub n_layer: i64,
    /// Heads.
    pub n_head: i64,
    /// MLP inner size (Hugging Face: None means 4·n_embd).
    pub n_inner: i64,
    /// MLP activation.
    pub activation_function: Act,
    /// Layer norm ε.
    pub layer_norm_epsilon: f64,
    /// Head.
    pub head: DecoderHead,
}

impl Gpt2Config {
    /// A tiny configuration for tests.
    pub fn tiny(head: DecoderHead) -> Self {
        Self {
            vocab_size: 30,
            n_positions: 32,
            n_embd: 16,
            n_layer: 2,
            n_head: 2,
            n_inner: 32,
            activation_function: Act::GeluNew,
            layer_norm_epsilon: 1e-5,
            head,
        }
    }

    /// gpt2 (124M) sizes.
    pub fn gpt2_small(head: DecoderHead) -> Self {
        Self {
            vocab_size: 50257,
            n_positions: 1024,
            n_embd: 768,
            n_layer: 12,
            n_head: 12,
            n_inner: 3072,
            activation_function: Act::GeluNew,
            layer_norm_epsilon: 1e-5,
            head,
        }
    }
}

#[derive(Debug)]
struct Block {
    ln_1: LayerNorm,
    c_attn: Linear,
    attn_proj: Linear,
    ln_2: LayerNorm,
    c_fc: Linear,
    mlp_proj: Linear,
}

/// GPT-2 decoder.
#[derive(Debug)]
pub struct Gpt2 {
    cfg: Gpt2Config,
    vs: VarStore,
    wte: Embedding,
    wpe: Embedding,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    score: Option<Linear>,
}

impl Gpt2 {
    /// Builds a randomly initialized model (std 0.02, projections 0.02/√(2·n_layer)).
    pub fn new(cfg: Gpt2Config, device: Device) -> Result<Self> {
        if cfg.n_embd % cfg.n_head != 0 {
            return Err(ModelError::InvalidConfig(format!(
                "n_embd {} is not a multiple of n_head {}",
                cfg.n_embd, cfg.n_head
            )));
        }
        let vs = VarStore::new(device);
        let d = cfg.n_embd;
        let std = 0.02;
        let proj_std = std / (2.0 * cfg.n_layer as f64).sqrt();
        let wte = Embedding::new(&vs, "transformer.wte", cfg.vocab_size, d, std)?;
        let wpe = Embedding::new(&vs, "transformer.wpe", cfg.n_positions, d, 0.01)?;
        let mut blocks = Vec::new();
        for i in 0..cfg.n_layer {
            let p = format!("transformer.h.{i}");
            blocks.push(Block {
                ln_1: LayerNorm::new(&vs, &format!("{p}.ln_1"), d, cfg.layer_norm_epsilon)?,
                c_attn: Linear::new(&vs, &format!("{p}.attn.c_attn"), d, 3 * d, true, std)?,
                attn_proj: Linear::new(&vs, &format!("{p}.attn.c_proj"), d, d, true, proj_std)?,
                ln_2: LayerNorm::new(&vs, &format!("{p}.ln_2"), d, cfg.layer_norm_epsilon)?,
                c_fc: Linear::new(&vs, &format!("{p}.mlp.c_fc"), d, cfg.n_inner, true, std)?,
                mlp_proj: Linear::new(
                    &vs,
                    &format!("{p}.mlp.c_proj"),
                    cfg.n_inner,
                    d,
                    true,
                    proj_std,
                )?,
            });
        }
        let ln_f = LayerNorm::new(&vs, "transformer.ln_f", d, cfg.layer_norm_epsilon)?;
        let score = match cfg.head {
            DecoderHead::LanguageModel => None,
            DecoderHead::Classification { num_labels } => {
                Some(Linear::new(&vs, "score", d, num_labels, false, std)?)
            }
        };
        Ok(Self {
            cfg,
            vs,
            wte,
            wpe,
            blocks,
            ln_f,
            score,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Gpt2Config {
        &self.cfg
    }

    fn attention(
        &self,
        blk: &Block,
        x: &Tensor,
        mask: &Tensor,
        ctx: &mut ForwardCtx,
    ) -> Result<Tensor> {
        let size = x.size();
        let d = size[2];
        let h = self.cfg.n_head;
        let hd = d / h;
        let qkv = blk.c_attn.forward(x, ctx)?;
        let parts = qkv.f_split(d, -1)?;
        let (q, k, v) = (
            split_heads(&parts[0], h, hd)?,
            split_heads(&parts[1], h, hd)?,
            split_heads(&parts[2], h, hd)?,
        );
        let out = attend(&q, &k, &v, mask, Some((hd as f64).powf(-0.5)))?;
        blk.attn_proj.forward(&out, ctx)
    }
}

impl Model for Gpt2 {
    fn hf_config_json(&self) -> Option<serde_json::Value> {
        let c = &self.cfg;
        Some(serde_json::json!({
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            "vocab_size": c.vocab_size,
            "n_positions": c.n_positions,
            "n_embd": c.n_embd,
            "n_layer": c.n_layer,
            "n_head": c.n_head,
            "n_inner": c.n_inner,
            "activation_function": c.activation_function.hf_name(),
            "layer_norm_epsilon": c.layer_norm_epsilon,
            "tie_word_embeddings": true,
        }))
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

    fn linears_mut(&mut self) -> (&VarStore, Vec<&mut Linear>) {
        let mut v: Vec<&mut Linear> = Vec::new();
        for b in &mut self.blocks {
            v.push(&mut b.c_attn);
            v.push(&mut b.attn_proj);
            v.push(&mut b.c_fc);
            v.push(&mut b.mlp_proj);
        }
        if let Some(s) = &mut self.score {
            v.push(s);
        }
        (&self.vs, v)
    }

    fn forward(&self, batch: &Batch, ctx: &mut ForwardCtx) -> Result<Tensor> {
        batch.validate(self.cfg.vocab_size, None)?;
        batch.check_positions(self.cfg.n_positions, "n_positions")?;
        let (b, t) = (batch.batch_size(), batch.seq_len());
        let device = batch.input_ids.device();
        let pos = Tensor::f_arange(t, (Kind::Int64, device))?
            .f_unsqueeze(0)?
            .f_expand([b, t], false)?
            .f_contiguous()?;
        let mut h = self
            .wte
            .forward(&batch.input_ids, ctx)?
            .f_add(&self.wpe.forward(&pos, ctx)?)?;
        let mask = causal_mask(&batch.attention_mask, h.kind())?;
        for blk in &self.blocks {
            let n = blk.ln_1.forward(&h, ctx)?;
            h = h.f_add(&self.attention(blk, &n, &mask, ctx)?)?;
            let n = blk.ln_2.forward(&h, ctx)?;
            let a = self
                .cfg
                .activation_function
                .apply(&blk.c_fc.forward(&n, ctx)?)?;
            h = h.f_add(&blk.mlp_proj.forward(&a, ctx)?)?;
        }
        let h = self.ln_f.forward(&h, ctx)?;
        match &self.score {
            Some(s) => s.forward(&last_valid(&h, &batch.attention_mask)?, ctx),
            // Tied LM head: logits = h · wteᵀ; a second use of `transformer.wte.weight`.
            None => tied_lm_head(&h, &self.wte, ctx),
        }
    }
}
