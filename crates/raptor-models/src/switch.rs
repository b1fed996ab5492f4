//! Switch-Transformers-style MoE encoder classifier (T5 blocks, top-1 routing).
//!
//! Variable names equal Hugging Face `SwitchTransformersEncoderModel` tensor names
//! (`shared.weight`, `encoder.block.{i}.layer.0.SelfAttention.{q,k,v,o}.weight`,
//! `encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight`,
//! `encoder.block.{i}.layer.{0,1}.layer_norm.weight`, dense `encoder.block.{i}.layer.1.mlp.{wi,wo}.weight`,
//! sparse `encoder.block.{i}.layer.1.mlp.router.classifier.weight` and
//! `encoder.block.{i}.layer.1.mlp.experts.expert_{e}.{wi,wo}.weight`, `encoder.final_layer_norm.weight`),
//! plus the classification head `classifier.{weight,bias}`.

use crate::batch::Batch;
use crate::blocks::{attend, masked_mean, split_heads};
use crate::error::{ModelError, Result};
use crate::layers::{Act, Embedding, ForwardCtx, Linear, RmsNorm, mask_min, new_var};
use crate::model::{Model, MoeShape};
use crate::moe::{dispatch, routing_and_owners};
use crate::tape::{Part, Rows};
use tch::nn::{Init, VarStore};
use tch::{Device, Kind, Tensor};

/// Configuration of [`SwitchEncoder`] (field names follow Hugging Face `SwitchTransformersConfig`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SwitchConfig {
    /// Vocabulary size.
    pub vocab_size: i64,
    /// Hidden size.
    pub d_model: i64,
    /// Per-head key/value size.
    pub d_kv: i64,
    /// FFN inner size (dense and experts).
    pub d_ff: i64,
    /// Number of encoder blocks.
    pub num_layers: i64,
    /// Attention heads.
    pub num_heads: i64,
    /// Experts per sparse layer.
    pub num_experts: i64,
    /// Block i is sparse when `i % step == 1 || step == 1` (Hugging Face's rule; 0: none).
    pub encoder_sparse_step: i64,
    /// Relative attention buckets.
    pub relative_attention_num_buckets: i64,
    /// Relative attention max distance.
    pub relative_attention_max_distance: i64,
    /// RMS norm ε.
    pub layer_norm_epsilon: f64,
    /// Expert capacity (tokens per expert per sequence); None: no token dropping. Must be None
    /// for private training.
    pub expert_capacity: Option<i64>,
    /// Router bias.
    pub router_bias: bool,
    /// FFN activation.
    pub dense_act_fn: Act,
    /// Classes of the classification head (mean-pooled, `classifier` with bias).
    pub num_labels: i64,
}

impl SwitchConfig {
    /// A tiny configuration for tests.
    pub fn tiny() -> Self {
        Self {
            vocab_size: 50,
            d_model: 16,
            d_kv: 4,
            d_ff: 24,
            num_layers: 4,
            num_heads: 2,
            num_experts: 4,
            encoder_sparse_step: 2,
            relative_attention_num_buckets: 8,
            relative_attention_max_distance: 16,
            layer_norm_epsilon: 1e-6,
            expert_capacity: None,
            router_bias: false,
            dense_act_fn: Act::Relu,
            num_labels: 3,
        }
    }

    /// google/switch-base-8 encoder sizes (capacity off).
    pub fn switch_base(num_experts: i64, num_labels: i64) -> Self {
        Self {
            vocab_size: 32128,
            d_model: 768,
            d_kv: 64,
            d_ff: 3072,
            num_layers: 12,
            num_heads: 12,
            num_experts,
            encoder_sparse_step: 2,
            relative_attention_num_buckets: 32,
            relative_attention_max_distance: 128,
            layer_norm_epsilon: 1e-6,
            expert_capacity: None,
            router_bias: false,
            dense_act_fn: Act::Relu,
            num_labels,
        }
    }

    /// Whether block `i` has a sparse FFN.
    pub fn is_sparse(&self, i: i64) -> bool {
        let s = self.encoder_sparse_step;
        s > 0 && (i % s == 1 || s == 1)
    }
}

#[derive(Debug)]
enum Ffn {
    Dense {
        wi: Linear,
        wo: Linear,
    },
    Sparse {
        router: Linear,
        experts: Vec<(Linear, Linear)>,
    },
}

#[derive(Debug)]
struct Block {
    ln0: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ln1: RmsNorm,
    ffn: Ffn,
}

impl Block {
    /// The linear maps that can carry LoRA, in order: attention (q, k, v, o), then the FFN's
    /// (`wi`, `wo` of each expert in turn; not the router).
    fn linears_mut(&mut self) -> Vec<&mut Linear> {
        let mut v = vec![&mut self.q, &mut self.k, &mut self.v, &mut self.o];
        match &mut self.ffn {
            Ffn::Dense { wi, wo } => v.extend([wi, wo]),
            Ffn::Sparse { experts, .. } => {
                v.extend(experts.iter_mut().flat_map(|(wi, wo)| [wi, wo]))
            }
        }
        v
    }
}

/// Switch-style MoE encoder with a mean-pooling classification head.
#[derive(Debug)]
pub struct SwitchEncoder {
    cfg: SwitchConfig,
    vs: VarStore,
    shared: Embedding,
    rel_bias: Embedding,
    blocks: Vec<Block>,
    final_ln: RmsNorm,
    classifier: Linear,
}

impl SwitchEncoder {
    /// Builds a randomly initialized model (Hugging Face's init scheme) on `device`.
    pub fn new(cfg: SwitchConfig, device: Device) -> Result<Self> {
        if cfg.d_model <= 0 || cfg.num_heads <= 0 || cfg.d_kv <= 0 || cfg.num_layers <= 0 {
            return Err(ModelError::InvalidConfig(format!("bad sizes in {cfg:?}")));
        }
        if cfg.relative_attention_num_buckets < 4 {
            return Err(ModelError::InvalidConfig(
                "relative_attention_num_buckets must be at least 4".into(),
            ));
        }
        let vs = VarStore::new(device);
        let d = cfg.d_model;
        let inner = cfg.num_heads * cfg.d_kv;
        let shared = Embedding::new(&vs, "shared", cfg.vocab_size, d, 1.0)?;
        let rel_bias = Embedding {
            name: "encoder.block.0.layer.0.SelfAttention.relative_attention_bias".into(),
            weight: new_var(
                &vs,
                "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                &[cfg.relative_attention_num_buckets, cfg.num_heads],
                Init::Randn {
                    mean: 0.0,
                    stdev: (d as f64).powf(-0.5),
                },
            )?,
        };
        let mut blocks = Vec::new();
        for i in 0..cfg.num_layers {
            let p = format!("encoder.block.{i}");
            let att = format!("{p}.layer.0.SelfAttention");
            let ffn = if cfg.is_sparse(i) {
                let mlp = format!("{p}.layer.1.mlp");
                let router = Linear::new(
                    &vs,
                    &format!("{mlp}.router.classifier"),
                    d,
                    cfg.num_experts,
                    cfg.router_bias,
                    1.0,
                )?;
                let mut experts = Vec::new();
                for e in 0..cfg.num_experts {
                    let ep = format!("{mlp}.experts.expert_{e}");
                    experts.push((
                        Linear::new(
                            &vs,
                            &format!("{ep}.wi"),
                            d,
                            cfg.d_ff,
                            false,
                            (d as f64).powf(-0.5),
                        )?,
                        Linear::new(
                            &vs,
                            &format!("{ep}.wo"),
                            cfg.d_ff,
                            d,
                            false,
                            (d as f64).powf(-0.5),
                        )?,
                    ));
                }
                Ffn::Sparse { router, experts }
            } else {
                Ffn::Dense {
                    wi: Linear::new(
                        &vs,
                        &format!("{p}.layer.1.mlp.wi"),
                        d,
                        cfg.d_ff,
                        false,
                        (d as f64).powf(-0.5),
                    )?,
                    wo: Linear::new(
                        &vs,
                        &format!("{p}.layer.1.mlp.wo"),
                        cfg.d_ff,
                        d,
                        false,
                        (cfg.d_ff as f64).powf(-0.5),
                    )?,
                }
            };
            blocks.push(Block {
                ln0: RmsNorm::new(
                    &vs,
                    &format!("{p}.layer.0.layer_norm"),
                    d,
                    cfg.layer_norm_epsilon,
                )?,
                q: Linear::new(
                    &vs,
                    &format!("{att}.q"),
                    d,
                    inner,
                    false,
                    ((d * cfg.d_kv) as f64).powf(-0.5),
                )?,
                k: Linear::new(
                    &vs,
                    &format!("{att}.k"),
                    d,
                    inner,
                    false,
                    (d as f64).powf(-0.5),
                )?,
                v: Linear::new(
                    &vs,
                    &format!("{att}.v"),
                    d,
                    inner,
                    false,
                    (d as f64).powf(-0.5),
                )?,
                o: Linear::new(
                    &vs,
                    &format!("{att}.o"),
                    inner,
                    d,
                    false,
                    (inner as f64).powf(-0.5),
                )?,
                ln1: RmsNorm::new(
                    &vs,
                    &format!("{p}.layer.1.layer_norm"),
                    d,
                    cfg.layer_norm_epsilon,
                )?,
                ffn,
            });
        }
        let final_ln = RmsNorm::new(&vs, "encoder.final_layer_norm", d, cfg.layer_norm_epsilon)?;
        let classifier = Linear::new(&vs, "classifier", d, cfg.num_labels, true, 0.02)?;
        let mut m = Self {
            cfg,
            vs,
            shared,
            rel_bias,
            blocks,
            final_ln,
            classifier,
        };
        m.freeze_routers()?;
        Ok(m)
    }

    /// The configuration.
    pub fn config(&self) -> &SwitchConfig {
        &self.cfg
    }

    fn freeze_routers(&mut self) -> Result<()> {
        for b in &self.blocks {
            if let Ffn::Sparse { router, .. } = &b.ffn {
                let _ = router.weight.f_set_requires_grad(false)?;
                if let Some(bias) = &router.bias {
                    let _ = bias.f_set_requires_grad(false)?;
                }
            }
        }
        Ok(())
    }

    /// `[1, H, T, T]` relative-position buckets → bias values, as Hugging Face computes them.
    fn position_buckets(&self, t: i64, device: Device) -> Result<Tensor> {
        let nb = self.cfg.relative_attention_num_buckets / 2; // bidirectional
        let max_exact = nb / 2;
        let max_distance = self.cfg.relative_attention_max_distance;
        let ctxp = Tensor::f_arange(t, (Kind::Int64, device))?.f_unsqueeze(1)?;
        let memp = Tensor::f_arange(t, (Kind::Int64, device))?.f_unsqueeze(0)?;
        let rel = memp.f_sub(&ctxp)?;
        let mut buckets = rel.f_gt(0)?.f_to_kind(Kind::Int64)?.f_mul_scalar(nb)?;
        let rp = rel.f_abs()?;
        let is_small = rp.f_lt(max_exact)?;
        let large = rp
            .f_to_kind(Kind::Float)?
            .f_div_scalar(max_exact as f64)?
            .f_log()?
            .f_div_scalar(((max_distance as f64) / (max_exact as f64)).ln())?
            .f_mul_scalar((nb - max_exact) as f64)?
            .f_to_kind(Kind::Int64)?
            .f_add_scalar(max_exact)?;
        let large = large.f_clamp_max(nb - 1)?;
        buckets = buckets.f_add(&rp.f_where_self(&is_small, &large)?)?;
        Ok(buckets)
    }

    fn attention(
        &self,
        blk: &Block,
        x: &Tensor,
        bias: &Tensor,
        ctx: &mut ForwardCtx,
    ) -> Result<Tensor> {
        let (h, dk) = (self.cfg.num_heads, self.cfg.d_kv);
        let q = split_heads(&blk.q.forward(x, ctx)?, h, dk)?;
        let k = split_heads(&blk.k.forward(x, ctx)?, h, dk)?;
        let v = split_heads(&blk.v.forward(x, ctx)?, h, dk)?;
        // T5 attention: no 1/√d scaling; relative position bias plus the padding mask.
        let out = attend(&q, &k, &v, bias, None)?;
        blk.o.forward(&out, ctx)
    }

    fn sparse_ffn(
        &self,
        layer: usize,
        router: &Linear,
        experts: &[(Linear, Linear)],
        x: &Tensor,
        mask: &Tensor,
        ctx: &mut ForwardCtx,
    ) -> Result<Tensor> {
        if let Some(inputs) = ctx.router_inputs.as_mut() {
            inputs.push((layer, x.shallow_clone()));
        }
        let logits = router.forward(x, &mut ForwardCtx::new(false))?;
        let probs = logits.f_softmax(-1, None::<Kind>)?;
        let sel = probs.f_argmax(-1, true)?;
        let gate = probs.f_gather(-1, &sel, false)?;
        let keep = match self.cfg.expert_capacity {
            Some(cap) => {
                let onehot = sel.f_squeeze_dim(-1)?.f_one_hot(self.cfg.num_experts)?;
                let prio = onehot.f_cumsum(1, Kind::Int64)?;
                let ok = prio.f_le(cap)?.f_logical_and(&onehot.f_gt(0)?)?;
                Some(ok.f_any_dim(-1, true)?)
            }
            None => None,
        };
        let owners = routing_and_owners(
            ctx,
            layer,
            &sel,
            &gate,
            mask,
            x.size()[0],
            self.cfg.num_experts,
        )?;
        let act = self.cfg.dense_act_fn;
        dispatch(
            x,
            &sel,
            &gate,
            keep.as_ref(),
            self.cfg.num_experts,
            owners.as_ref(),
            ctx,
            |e, xe, rows, m, ctx| {
                let (wi, wo) = &experts[e];
                let h = act.apply(&wi.forward_rows(xe, ctx, rows, m)?)?;
                wo.forward_rows(&h, ctx, rows, m)
            },
        )
    }
}

impl Model for SwitchEncoder {
    fn hf_config_json(&self) -> Option<serde_json::Value> {
        let c = &self.cfg;
        let sparse = (0..c.num_layers).filter(|&i| c.is_sparse(i)).count() as i64;
        // transformers keeps a saved `encoder_sparse_step` (it sets saved attributes after
        // computing its own from `num_sparse_encoder_layers`), so any step round-trips.
        if c.expert_capacity.is_some() {
            return None;
        }
        Some(serde_json::json!({
            "model_type": "switch_transformers",
            "architectures": ["SwitchTransformersEncoderModel"],
            "vocab_size": c.vocab_size,
            "d_model": c.d_model,
            "d_kv": c.d_kv,
            "d_ff": c.d_ff,
            "num_layers": c.num_layers,
            "num_heads": c.num_heads,
            "num_experts": c.num_experts,
            "num_sparse_encoder_layers": sparse,
            "encoder_sparse_step": c.encoder_sparse_step,
            "relative_attention_num_buckets": c.relative_attention_num_buckets,
            "relative_attention_max_distance": c.relative_attention_max_distance,
            "layer_norm_epsilon": c.layer_norm_epsilon,
            "router_bias": c.router_bias,
            "router_jitter_noise": 0.0,
            "dense_act_fn": c.dense_act_fn.hf_name(),
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

    fn num_labels(&self) -> Option<i64> {
        Some(self.cfg.num_labels)
    }

    fn moe_shape(&self) -> Option<MoeShape> {
        let sparse = (0..self.cfg.num_layers)
            .filter(|&i| self.cfg.is_sparse(i))
            .map(|i| i as usize)
            .collect();
        Some(MoeShape::new(sparse, self.cfg.num_experts, 1))
    }

    fn expert_capacity(&self) -> Option<i64> {
        self.cfg.expert_capacity
    }

    fn linears_mut(&mut self) -> (&VarStore, Vec<&mut Linear>) {
        let mut v: Vec<&mut Linear> = self
            .blocks
            .iter_mut()
            .flat_map(Block::linears_mut)
            .collect();
        v.push(&mut self.classifier);
        (&self.vs, v)
    }

    fn router_params(&self) -> Vec<String> {
        self.blocks
            .iter()
            .filter_map(|b| match &b.ffn {
                Ffn::Sparse { router, .. } => Some(router.param_names()),
                Ffn::Dense { .. } => None,
            })
            .flatten()
            .collect()
    }

    fn forward(&self, batch: &Batch, ctx: &mut ForwardCtx) -> Result<Tensor> {
        let h = self.encode(batch, ctx)?;
        let pooled = masked_mean(&h, &batch.attention_mask)?;
        self.classifier.forward(&pooled, ctx)
    }
}

impl SwitchEncoder {
    /// The encoder's last hidden state `[B, T, d_model]` (after the final RMS norm, before mean
    /// pooling and the classification head): Hugging Face's `last_hidden_state`. Positions
    /// outside the attention mask are computed but carry no meaning.
    ///
    /// Layers are recorded into `ctx` exactly as in [`Model::forward`], which calls this.
    pub fn encode(&self, batch: &Batch, ctx: &mut ForwardCtx) -> Result<Tensor> {
        batch.validate(self.cfg.vocab_size, None)?;
        let ids = &batch.input_ids;
        let (b, t) = (batch.batch_size(), batch.seq_len());
        let mut h = self.shared.forward(ids, ctx)?;
        let kind = h.kind();
        let device = h.device();
        let maskf = batch.attention_mask.f_to_kind(kind)?;
        // Additive key mask [B, 1, 1, T].
        let ext = maskf
            .f_neg()?
            .f_add_scalar(1.0)?
            .f_mul_scalar(mask_min(kind))?
            .f_reshape([b, 1, 1, t])?;
        let buckets = self.position_buckets(t, device)?;
        let values = Tensor::f_embedding(&self.rel_bias.weight, &buckets, -1, false, false)?
            .f_permute([2, 0, 1])?
            .f_unsqueeze(0)?;
        let pos = if ctx.recording() && self.rel_bias.weight.requires_grad() {
            // Recorded per record (`[B, H, T, T]`, materialized by the recording's probe
            // addition) so that its gradient is per record.
            let pb = values.f_expand([b, -1, -1, -1], false)?;
            let parts = vec![Part::Buckets {
                param: format!("{}.weight", self.rel_bias.name),
                buckets: buckets.shallow_clone(),
                num_buckets: self.cfg.relative_attention_num_buckets,
            }];
            ctx.record(pb, Rows::Dense, parts)?
        } else {
            values
        };
        let bias = pos.f_add(&ext)?;
        for (i, blk) in self.blocks.iter().enumerate() {
            let n = blk.ln0.forward(&h, ctx)?;
            h = h.f_add(&self.attention(blk, &n, &bias, ctx)?)?;
            let n = blk.ln1.forward(&h, ctx)?;
            let f = match &blk.ffn {
                Ffn::Dense { wi, wo } => {
                    let a = self.cfg.dense_act_fn.apply(&wi.forward(&n, ctx)?)?;
                    wo.forward(&a, ctx)?
                }
                Ffn::Sparse { router, experts } => {
                    self.sparse_ffn(i, router, experts, &n, &batch.attention_mask, ctx)?
                }
            };
            h = h.f_add(&f)?;
        }
        self.final_ln.forward(&h, ctx)
    }
}
