//! BERT-style encoder classifier: post-LN blocks, learned absolute positions, token types,
//! GELU, biases everywhere; the pooler (`tanh(dense(h[CLS]))`, `BertForSequenceClassification`)
//! or mean pooling over the valid tokens (sentence-transformers checkpoints such as
//! all-MiniLM-L6-v2, which ship a `BertModel`), then `classifier.{weight,bias}`.
//!
//! Variable names equal Hugging Face `BertForSequenceClassification` names:
//! `bert.embeddings.{word,position,token_type}_embeddings.weight`,
//! `bert.embeddings.LayerNorm.{weight,bias}`,
//! `bert.encoder.layer.{i}.attention.self.{query,key,value}.{weight,bias}`,
//! `bert.encoder.layer.{i}.attention.output.dense.{weight,bias}`,
//! `bert.encoder.layer.{i}.attention.output.LayerNorm.{weight,bias}`,
//! `bert.encoder.layer.{i}.intermediate.dense.{weight,bias}`,
//! `bert.encoder.layer.{i}.output.dense.{weight,bias}`,
//! `bert.encoder.layer.{i}.output.LayerNorm.{weight,bias}`, `bert.pooler.dense.{weight,bias}`,
//! `classifier.{weight,bias}`. A `BertModel` checkpoint (no `bert.` prefix) loads too
//! ([`crate::checkpoint::HfLayout::bert`]).

use crate::batch::{Batch, Task};
use crate::blocks::{attend, masked_mean, split_heads};
use crate::error::{ModelError, Result};
use crate::layers::{Act, Embedding, ForwardCtx, LayerNorm, Linear, mask_min};
use crate::model::Model;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

/// How a [`Bert`] classifier pools the encoder output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum BertPooling {
    /// `tanh(bert.pooler.dense(h[:, 0]))` (the `[CLS]` token), as `BertForSequenceClassification`.
    Pooler,
    /// Mean of the last hidden state over valid tokens (sentence-transformers); no pooler
    /// parameters.
    Mean,
}

/// Configuration of [`Bert`] (field names follow Hugging Face `BertConfig`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BertConfig {
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
    /// FFN activation (`gelu`: exact erf GELU).
    pub hidden_act: Act,
    /// Learned positions.
    pub max_position_embeddings: i64,
    /// Token types (segments).
    pub type_vocab_size: i64,
    /// Layer norm ε.
    pub layer_norm_eps: f64,
    /// Pooling before the classifier.
    pub pooling: BertPooling,
    /// Classes of the classifier.
    pub num_labels: i64,
}

impl BertConfig {
    /// A tiny configuration for tests.
    pub fn tiny(num_labels: i64) -> Self {
        Self {
            vocab_size: 40,
            hidden_size: 16,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            intermediate_size: 24,
            hidden_act: Act::Gelu,
            max_position_embeddings: 32,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            pooling: BertPooling::Pooler,
            num_labels,
        }
    }

    /// all-MiniLM-L6-v2 sizes (mean pooling).
    pub fn minilm_l6(num_labels: i64) -> Self {
        Self {
            vocab_size: 30522,
            hidden_size: 384,
            num_hidden_layers: 6,
            num_attention_heads: 12,
            intermediate_size: 1536,
            hidden_act: Act::Gelu,
            max_position_embeddings: 512,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            pooling: BertPooling::Mean,
            num_labels,
        }
    }
}

#[derive(Debug)]
struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attn_out: Linear,
    attn_ln: LayerNorm,
    inter: Linear,
    out: Linear,
    out_ln: LayerNorm,
}

/// BERT encoder classifier.
#[derive(Debug)]
pub struct Bert {
    cfg: BertConfig,
    vs: VarStore,
    word: Embedding,
    position: Embedding,
    token_type: Embedding,
    emb_ln: LayerNorm,
    layers: Vec<Layer>,
    pooler: Option<Linear>,
    classifier: Linear,
}

impl Bert {
    /// Builds a randomly initialized model (std 0.02) on `device`.
    pub fn new(cfg: BertConfig, device: Device) -> Result<Self> {
        if cfg.num_attention_heads < 1
            || cfg.hidden_size % cfg.num_attention_heads != 0
            || cfg.num_labels < 1
            || cfg.type_vocab_size < 1
            || cfg.max_position_embeddings < 1
        {
            return Err(ModelError::InvalidConfig(format!(
                "bad BERT sizes in {cfg:?}"
            )));
        }
        let vs = VarStore::new(device);
        let (d, std, eps) = (cfg.hidden_size, 0.02, cfg.layer_norm_eps);
        let e = "bert.embeddings";
        let word = Embedding::new(&vs, &format!("{e}.word_embeddings"), cfg.vocab_size, d, std)?;
        let position = Embedding::new(
            &vs,
            &format!("{e}.position_embeddings"),
            cfg.max_position_embeddings,
            d,
            std,
        )?;
        let token_type = Embedding::new(
            &vs,
            &format!("{e}.token_type_embeddings"),
            cfg.type_vocab_size,
            d,
            std,
        )?;
        let emb_ln = LayerNorm::new(&vs, &format!("{e}.LayerNorm"), d, eps)?;
        let mut layers = Vec::new();
        for i in 0..cfg.num_hidden_layers {
            let p = format!("bert.encoder.layer.{i}");
            let lin = |name: &str, i: i64, o: i64| {
                Linear::new(&vs, &format!("{p}.{name}"), i, o, true, std)
            };
            layers.push(Layer {
                query: lin("attention.self.query", d, d)?,
                key: lin("attention.self.key", d, d)?,
                value: lin("attention.self.value", d, d)?,
                attn_out: lin("attention.output.dense", d, d)?,
                attn_ln: LayerNorm::new(&vs, &format!("{p}.attention.output.LayerNorm"), d, eps)?,
                inter: lin("intermediate.dense", d, cfg.intermediate_size)?,
                out: lin("output.dense", cfg.intermediate_size, d)?,
                out_ln: LayerNorm::new(&vs, &format!("{p}.output.LayerNorm"), d, eps)?,
            });
        }
        let pooler = match cfg.pooling {
            BertPooling::Pooler => Some(Linear::new(&vs, "bert.pooler.dense", d, d, true, std)?),
            BertPooling::Mean => None,
        };
        let classifier = Linear::new(&vs, "classifier", d, cfg.num_labels, true, std)?;
        Ok(Self {
            cfg,
            vs,
            word,
            position,
            token_type,
            emb_ln,
            layers,
            pooler,
            classifier,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &BertConfig {
        &self.cfg
    }

    /// Last hidden state `[B, T, d]`. `token_type_ids` `[B, T]` (i64, each in
    /// `[0, type_vocab_size)`); None: all 0 (single-segment input).
    pub fn encode(
        &self,
        batch: &Batch,
        token_type_ids: Option<&Tensor>,
        ctx: &mut ForwardCtx,
    ) -> Result<Tensor> {
        batch.validate(self.cfg.vocab_size, None)?;
        let (b, t) = (batch.batch_size(), batch.seq_len());
        if t > self.cfg.max_position_embeddings {
            return Err(ModelError::ShapeMismatch {
                what: format!(
                    "sequence length (at most max_position_embeddings = {})",
                    self.cfg.max_position_embeddings
                ),
                expected: vec![b, self.cfg.max_position_embeddings],
                got: vec![b, t],
            });
        }
        let device = batch.input_ids.device();
        let types = match token_type_ids {
            Some(tt) => {
                if tt.size() != [b, t] || tt.kind() != Kind::Int64 {
                    return Err(ModelError::ShapeMismatch {
                        what: "token_type_ids (i64, the shape of input_ids)".into(),
                        expected: vec![b, t],
                        got: tt.size(),
                    });
                }
                let (lo, hi) = (
                    tt.f_min()?.f_int64_value(&[])?,
                    tt.f_max()?.f_int64_value(&[])?,
                );
                if b * t > 0 && (lo < 0 || hi >= self.cfg.type_vocab_size) {
                    return Err(ModelError::InvalidConfig(format!(
                        "token type ids in [{lo}, {hi}] outside [0, {})",
                        self.cfg.type_vocab_size
                    )));
                }
                tt.shallow_clone()
            }
            None => Tensor::f_zeros([b, t], (Kind::Int64, device))?,
        };
        let pos = Tensor::f_arange(t, (Kind::Int64, device))?
            .f_unsqueeze(0)?
            .f_expand([b, t], false)?
            .f_contiguous()?;
        let h = self
            .word
            .forward(&batch.input_ids, ctx)?
            .f_add(&self.position.forward(&pos, ctx)?)?
            .f_add(&self.token_type.forward(&types, ctx)?)?;
        let mut h = self.emb_ln.forward(&h, ctx)?;
        let kind = h.kind();
        // Key-padding mask [B, 1, 1, T] (bidirectional attention).
        let keys = batch.attention_mask.f_gt(0)?.f_reshape([b, 1, 1, t])?;
        let zero = Tensor::f_zeros([1], (kind, device))?;
        let neg = Tensor::f_full([1], mask_min(kind), (kind, device))?;
        let mask = zero.f_where_self(&keys, &neg)?;
        let (nh, hd) = (
            self.cfg.num_attention_heads,
            self.cfg.hidden_size / self.cfg.num_attention_heads,
        );
        for l in &self.layers {
            let q = split_heads(&l.query.forward(&h, ctx)?, nh, hd)?;
            let k = split_heads(&l.key.forward(&h, ctx)?, nh, hd)?;
            let v = split_heads(&l.value.forward(&h, ctx)?, nh, hd)?;
            let a = attend(&q, &k, &v, &mask, Some((hd as f64).powf(-0.5)))?;
            let a = l.attn_out.forward(&a, ctx)?;
            h = l.attn_ln.forward(&h.f_add(&a)?, ctx)?;
            let f = self.cfg.hidden_act.apply(&l.inter.forward(&h, ctx)?)?;
            let f = l.out.forward(&f, ctx)?;
            h = l.out_ln.forward(&h.f_add(&f)?, ctx)?;
        }
        Ok(h)
    }

    /// The pooled representation `[B, d]` (pooler output or masked mean).
    pub fn pool(&self, h: &Tensor, mask: &Tensor, ctx: &mut ForwardCtx) -> Result<Tensor> {
        match &self.pooler {
            Some(p) => Ok(p.forward(&h.f_select(1, 0)?, ctx)?.f_tanh()?),
            None => masked_mean(h, mask),
        }
    }

    /// Class logits `[B, C]` with explicit token types (see [`Bert::encode`]).
    pub fn forward_with_token_types(
        &self,
        batch: &Batch,
        token_type_ids: Option<&Tensor>,
        ctx: &mut ForwardCtx,
    ) -> Result<Tensor> {
        let h = self.encode(batch, token_type_ids, ctx)?;
        let p = self.pool(&h, &batch.attention_mask, ctx)?;
        self.classifier.forward(&p, ctx)
    }
}

impl Model for Bert {
    fn hf_config_json(&self) -> Option<serde_json::Value> {
        let c = &self.cfg;
        Some(serde_json::json!({
            "model_type": "bert",
            "architectures": ["BertForSequenceClassification"],
            "vocab_size": c.vocab_size,
            "hidden_size": c.hidden_size,
            "num_hidden_layers": c.num_hidden_layers,
            "num_attention_heads": c.num_attention_heads,
            "intermediate_size": c.intermediate_size,
            "hidden_act": c.hidden_act.hf_name(),
            "max_position_embeddings": c.max_position_embeddings,
            "type_vocab_size": c.type_vocab_size,
            "layer_norm_eps": c.layer_norm_eps,
            "position_embedding_type": "absolute",
            "num_labels": c.num_labels,
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

    fn task(&self) -> Task {
        Task::Classification
    }

    fn num_labels(&self) -> Option<i64> {
        Some(self.cfg.num_labels)
    }

    fn linears_mut(&mut self) -> (&VarStore, Vec<&mut Linear>) {
        let mut v: Vec<&mut Linear> = Vec::new();
        for l in &mut self.layers {
            v.push(&mut l.query);
            v.push(&mut l.key);
            v.push(&mut l.value);
            v.push(&mut l.attn_out);
            v.push(&mut l.inter);
            v.push(&mut l.out);
        }
        if let Some(p) = &mut self.pooler {
            v.push(p);
        }
        v.push(&mut self.classifier);
        (&self.vs, v)
    }

    fn forward(&self, batch: &Batch, ctx: &mut ForwardCtx) -> Result<Tensor> {
        self.forward_with_token_types(batch, None, ctx)
    }
}
