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
//!
//! **MoE-BERT** (raptor's own layout; [`BertMoeConfig`], made by
//! [`crate::upcycle::upcycle_bert`]): in each sparse layer `i` the FFN
//! (`intermediate.dense` → activation → `output.dense`) is replaced by E routed experts of the
//! same shape, `bert.encoder.layer.{i}.moe.experts.{e}.{intermediate,output}.dense.{weight,bias}`,
//! under a frozen bias-free router `bert.encoder.layer.{i}.moe.gate.weight` `[E, d]`: top-k of the
//! router's softmax, renormalized to sum to 1, gate-weighted sum of the chosen experts' outputs;
//! the residual and `output.LayerNorm` are unchanged. `config.json` is BERT's with
//! `"architectures": ["RaptorMoeBertForSequenceClassification"]` and an object
//! `"raptor_moe": {"num_experts", "num_experts_per_tok", "sparse_layers"}`. transformers does not
//! read this layout (it is not a Hugging Face architecture).

use crate::batch::Batch;
use crate::blocks::{attend_fused, masked_mean, split_heads};
use crate::error::{ModelError, Result};
use crate::layers::RowSpec;
use crate::layers::{Act, Embedding, ForwardCtx, LayerNorm, Linear, mask_min};
use crate::model::{FrozenPrefix, Model, MoeShape};
use crate::moe::{dispatch, routing_and_owners};
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

/// The routed experts of a MoE-BERT (raptor's own layout, made by
/// [`crate::upcycle::upcycle_bert`]): in each sparse layer `i` the FFN is replaced by E routed
/// experts of the same shape,
/// `bert.encoder.layer.{i}.moe.experts.{e}.{intermediate,output}.dense.{weight,bias}`, under a
/// frozen bias-free router `bert.encoder.layer.{i}.moe.gate.weight` `[E, d]`: top-k of the
/// router's softmax, renormalized to sum to 1, gate-weighted sum of the chosen experts'
/// outputs; the residual and `output.LayerNorm` are unchanged. In `config.json`:
/// `"architectures": ["RaptorMoeBertForSequenceClassification"]` and
/// `"raptor_moe": {"num_experts", "num_experts_per_tok", "sparse_layers"}` (transformers does
/// not read this layout).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BertMoeConfig {
    /// Experts per sparse layer (E ≥ 1).
    pub num_experts: i64,
    /// Experts per token (1 ≤ k ≤ E); the top-k gate weights are renormalized to sum to 1.
    pub num_experts_per_tok: i64,
    /// Indices of the sparse layers (each < `num_hidden_layers`).
    pub sparse_layers: Vec<usize>,
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
    /// Routed experts (MoE-BERT); None: a dense BERT.
    #[serde(default)]
    pub moe: Option<BertMoeConfig>,
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
            moe: None,
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
            moe: None,
        }
    }
}

/// One FFN: `output.dense(act(intermediate.dense(x)))`.
#[derive(Debug)]
struct Ffn {
    inter: Linear,
    out: Linear,
}

impl Ffn {
    fn new(vs: &VarStore, prefix: &str, cfg: &BertConfig, std: f64) -> Result<Self> {
        let (d, i) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Self {
            inter: Linear::new(vs, &format!("{prefix}intermediate.dense"), d, i, true, std)?,
            out: Linear::new(vs, &format!("{prefix}output.dense"), i, d, true, std)?,
        })
    }

    fn forward_rows(
        &self,
        act: Act,
        x: &Tensor,
        ctx: &mut ForwardCtx,
        rows: RowSpec<'_>,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let f = act.apply(&self.inter.forward_rows(x, ctx, rows, mask)?)?;
        self.out.forward_rows(&f, ctx, rows, mask)
    }
}

/// The FFN of a layer: dense, or routed experts under a frozen router.
#[derive(Debug)]
enum LayerFfn {
    Dense(Ffn),
    Moe { router: Linear, experts: Vec<Ffn> },
}

#[derive(Debug)]
struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attn_out: Linear,
    attn_ln: LayerNorm,
    ffn: LayerFfn,
    out_ln: LayerNorm,
}

impl Layer {
    /// The linear maps that can carry LoRA, in order: attention (q, k, v, output), then the
    /// FFN's (each expert's in turn; not the router).
    fn linears_mut(&mut self) -> Vec<&mut Linear> {
        let ffn: Vec<&mut Ffn> = match &mut self.ffn {
            LayerFfn::Dense(f) => vec![f],
            LayerFfn::Moe { experts, .. } => experts.iter_mut().collect(),
        };
        let mut v = vec![
            &mut self.query,
            &mut self.key,
            &mut self.value,
            &mut self.attn_out,
        ];
        v.extend(ffn.into_iter().flat_map(|f| [&mut f.inter, &mut f.out]));
        v
    }

    /// Whether any linear map of the layer carries a LoRA adapter.
    fn has_lora(&self) -> bool {
        let ffn: Vec<&Linear> = match &self.ffn {
            LayerFfn::Dense(f) => vec![&f.inter, &f.out],
            LayerFfn::Moe { router, experts } => std::iter::once(router)
                .chain(experts.iter().flat_map(|f| [&f.inter, &f.out]))
                .collect(),
        };
        [&self.query, &self.key, &self.value, &self.attn_out]
            .into_iter()
            .chain(ffn)
            .any(|l| l.lora.is_some())
    }
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
        if let Some(m) = &cfg.moe
            && (m.num_experts < 1
                || m.num_experts_per_tok < 1
                || m.num_experts_per_tok > m.num_experts
                || m.sparse_layers.is_empty()
                || m.sparse_layers
                    .iter()
                    .any(|&l| l as i64 >= cfg.num_hidden_layers))
        {
            return Err(ModelError::InvalidConfig(format!(
                "MoE-BERT needs 1 <= num_experts_per_tok <= num_experts and sparse layers in \
                 [0, {}): {m:?}",
                cfg.num_hidden_layers
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
            let sparse = cfg
                .moe
                .as_ref()
                .filter(|m| m.sparse_layers.contains(&(i as usize)));
            let ffn = match sparse {
                None => LayerFfn::Dense(Ffn::new(&vs, &format!("{p}."), &cfg, std)?),
                Some(m) => {
                    let router =
                        Linear::new(&vs, &format!("{p}.moe.gate"), d, m.num_experts, false, std)?;
                    let _ = router.weight.f_set_requires_grad(false)?;
                    let experts = (0..m.num_experts)
                        .map(|e| Ffn::new(&vs, &format!("{p}.moe.experts.{e}."), &cfg, std))
                        .collect::<Result<Vec<_>>>()?;
                    LayerFfn::Moe { router, experts }
                }
            };
            layers.push(Layer {
                query: lin("attention.self.query", d, d)?,
                key: lin("attention.self.key", d, d)?,
                value: lin("attention.self.value", d, d)?,
                attn_out: lin("attention.output.dense", d, d)?,
                attn_ln: LayerNorm::new(&vs, &format!("{p}.attention.output.LayerNorm"), d, eps)?,
                ffn,
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
    /// `[0, type_vocab_size)`); None: all 0 (single-segment input). A context holding
    /// [`ForwardCtx::prefix`] `(k, h)` starts from `h` at block `k` (the embeddings and the
    /// first `k` blocks skipped; `token_type_ids` are then those `h` was computed with).
    pub fn encode(
        &self,
        batch: &Batch,
        token_type_ids: Option<&Tensor>,
        ctx: &mut ForwardCtx,
    ) -> Result<Tensor> {
        self.encode_layers(batch, token_type_ids, ctx, self.layers.len())
    }

    /// The hidden state after the embeddings and blocks up to `stop` (exclusive), starting
    /// from the context's prefix when it holds one (see [`Bert::encode`]).
    fn encode_layers(
        &self,
        batch: &Batch,
        token_type_ids: Option<&Tensor>,
        ctx: &mut ForwardCtx,
        stop: usize,
    ) -> Result<Tensor> {
        batch.validate(self.cfg.vocab_size, None)?;
        batch.check_positions(self.cfg.max_position_embeddings, "max_position_embeddings")?;
        let (b, t) = (batch.batch_size(), batch.seq_len());
        let device = batch.input_ids.device();
        let d = self.cfg.hidden_size;
        let (first, mut h) = match ctx.prefix.take() {
            Some((k, hidden)) => {
                if k > stop {
                    return Err(ModelError::InvalidConfig(format!(
                        "a forward pass from the hidden states after {k} blocks cannot stop at block {stop}"
                    )));
                }
                if hidden.size() != [b, t, d] {
                    return Err(ModelError::ShapeMismatch {
                        what: format!("cached hidden states after {k} blocks"),
                        expected: vec![b, t, d],
                        got: hidden.size(),
                    });
                }
                let skipped_router = self.sparse_layers().iter().any(|&l| l < k);
                if skipped_router && (ctx.collect_routing || ctx.router_inputs.is_some()) {
                    return Err(ModelError::InvalidConfig(format!(
                        "a forward pass from the hidden states after {k} blocks skips a sparse \
                         layer's router, so it cannot collect routing"
                    )));
                }
                let kind = self.word.weight.kind();
                (k, hidden.f_to_kind(kind)?.f_to(device)?)
            }
            None => (0, self.embed(batch, token_type_ids, ctx)?),
        };
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
        for (i, l) in self.layers.iter().enumerate().take(stop).skip(first) {
            let q = split_heads(&l.query.forward(&h, ctx)?, nh, hd)?;
            let k = split_heads(&l.key.forward(&h, ctx)?, nh, hd)?;
            let v = split_heads(&l.value.forward(&h, ctx)?, nh, hd)?;
            let a = attend_fused(&q, &k, &v, &mask, Some((hd as f64).powf(-0.5)))?;
            let a = l.attn_out.forward(&a, ctx)?;
            h = l.attn_ln.forward(&h.f_add(&a)?, ctx)?;
            let f = match &l.ffn {
                LayerFfn::Dense(f) => {
                    f.forward_rows(self.cfg.hidden_act, &h, ctx, RowSpec::Dense, None)?
                }
                LayerFfn::Moe { router, experts } => {
                    self.moe_ffn(i, router, experts, &h, &batch.attention_mask, ctx)?
                }
            };
            h = l.out_ln.forward(&h.f_add(&f)?, ctx)?;
        }
        Ok(h)
    }

    /// The embeddings' output `[B, T, d]` (word + position + token type, then LayerNorm).
    fn embed(
        &self,
        batch: &Batch,
        token_type_ids: Option<&Tensor>,
        ctx: &mut ForwardCtx,
    ) -> Result<Tensor> {
        let (b, t) = (batch.batch_size(), batch.seq_len());
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
        self.emb_ln.forward(&h, ctx)
    }

    /// A sparse layer's FFN: top-k of the frozen router's softmax, renormalized, over
    /// owner-masked experts (see the module docs). The router is never recorded.
    fn moe_ffn(
        &self,
        layer: usize,
        router: &Linear,
        experts: &[Ffn],
        x: &Tensor,
        mask: &Tensor,
        ctx: &mut ForwardCtx,
    ) -> Result<Tensor> {
        let (e, k) = (self.num_experts(), self.top_k());
        if let Some(inputs) = ctx.router_inputs.as_mut() {
            inputs.push((layer, x.shallow_clone()));
        }
        let probs = router
            .forward(x, &mut ForwardCtx::new(false))?
            .f_softmax(-1, None::<Kind>)?;
        let (w, sel) = probs.f_topk(k, -1, true, true)?;
        let w = w.f_div(&w.f_sum_dim_intlist(-1, true, None::<Kind>)?)?;
        let owners = routing_and_owners(ctx, layer, &sel, &w, mask, x.size()[0], e)?;
        let act = self.cfg.hidden_act;
        dispatch(
            x,
            &sel,
            &w,
            None,
            e,
            owners.as_ref(),
            ctx,
            |j, xe, rows, m, ctx| experts[j].forward_rows(act, xe, ctx, rows, m),
        )
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
        let mut v = serde_json::json!({
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
        });
        if let (Some(m), Some(obj)) = (&c.moe, v.as_object_mut()) {
            obj.insert(
                "architectures".into(),
                serde_json::json!(["RaptorMoeBertForSequenceClassification"]),
            );
            obj.insert(
                "raptor_moe".into(),
                serde_json::json!({
                    "num_experts": m.num_experts,
                    "num_experts_per_tok": m.num_experts_per_tok,
                    "sparse_layers": m.sparse_layers,
                }),
            );
        }
        Some(v)
    }

    fn moe_shape(&self) -> Option<MoeShape> {
        let m = self.cfg.moe.as_ref()?;
        Some(MoeShape::new(
            m.sparse_layers.clone(),
            m.num_experts,
            m.num_experts_per_tok,
        ))
    }

    fn router_params(&self) -> Vec<String> {
        self.layers
            .iter()
            .filter_map(|l| match &l.ffn {
                LayerFfn::Moe { router, .. } => Some(router.param_names()),
                LayerFfn::Dense(_) => None,
            })
            .flatten()
            .collect()
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
        Some(self.cfg.num_labels)
    }

    fn linears_mut(&mut self) -> (&VarStore, Vec<&mut Linear>) {
        let mut v: Vec<&mut Linear> = self
            .layers
            .iter_mut()
            .flat_map(Layer::linears_mut)
            .collect();
        v.extend(self.pooler.as_mut());
        v.push(&mut self.classifier);
        (&self.vs, v)
    }

    fn forward(&self, batch: &Batch, ctx: &mut ForwardCtx) -> Result<Tensor> {
        self.forward_with_token_types(batch, None, ctx)
    }

    fn frozen_prefix(&self, trainable: &[String]) -> Option<FrozenPrefix> {
        let trains = |prefix: &str| {
            trainable.iter().any(|n| n.starts_with(prefix))
                || self
                    .vs
                    .variables()
                    .iter()
                    .any(|(n, v)| n.starts_with(prefix) && v.requires_grad())
        };
        if trains("bert.embeddings.") {
            return None;
        }
        let mut layers = self.layers.len();
        for (i, l) in self.layers.iter().enumerate() {
            if l.has_lora() || trains(&format!("bert.encoder.layer.{i}.")) {
                layers = i;
                break;
            }
        }
        (layers > 0).then_some(FrozenPrefix {
            layers,
            width: self.cfg.hidden_size,
            of: self.layers.len(),
        })
    }

    fn prefix_hidden(&self, batch: &Batch, layers: usize) -> Result<Tensor> {
        if layers > self.layers.len() {
            return Err(ModelError::InvalidConfig(format!(
                "a prefix of {layers} blocks of a BERT with {}",
                self.layers.len()
            )));
        }
        let mut ctx = ForwardCtx::new(false);
        tch::no_grad(|| self.encode_layers(batch, None, &mut ctx, layers))
    }
}
