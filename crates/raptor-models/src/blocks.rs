//! Shared transformer blocks that the model families compose from their configs: masks and
//! pooling (causal mask, last valid token, masked mean), the attention core (multi-head or grouped-query, additive bias/mask), rotary
//! position embeddings (with linear scaling), a rotary self-attention block with optional q/k
//! norms, gated (SwiGLU) and plain (GELU/ReLU) MLPs, a routed mixture-of-experts block with an
//! optional always-on shared expert, and the tied language-model head.
//!
//! Every block records its trainable ops through [`ForwardCtx`], so per-sample gradients stay
//! exact whatever family composes them.

use crate::error::{ModelError, Result};
use crate::layers::{Act, Embedding, ForwardCtx, Linear, RmsNorm, RowSpec, mask_min};
use crate::moe::{dispatch, routing_and_owners};
use crate::tape::{Part, Rows};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

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

/// Mean of `h` `[B, T, d]` over each record's valid tokens (`mask` `[B, T]`) → `[B, d]`.
pub(crate) fn masked_mean(h: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let m3 = mask.f_to_kind(h.kind())?.f_unsqueeze(2)?;
    Ok(h.f_mul(&m3)?
        .f_sum_dim_intlist(1, false, None::<Kind>)?
        .f_div(&m3.f_sum_dim_intlist(1, false, None::<Kind>)?)?)
}

/// The attention core: `softmax(q kᵀ · scale + bias) v` over heads. `q` `[B, H, T, hd]`,
/// `k`/`v` `[B, KVH, T, hd]` (grouped-query attention when KVH < H: each key/value head serves
/// H/KVH consecutive query heads), `bias` broadcastable to `[B, H, T, T]` (additive mask and/or
/// position bias). Returns `[B, T, H·hd]`. The scores are materialized (see [`attend_fused`]
/// for the form that does not).
pub(crate) fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: &Tensor,
    scale: Option<f64>,
) -> Result<Tensor> {
    let (k, v) = kv_per_query_head(q, k, v)?;
    attend_explicit(q, &k, &v, bias, scale)
}

/// [`attend`] by libtorch's fused attention (`scaled_dot_product_attention`; on the CPU a
/// blocked kernel with an online softmax): the `[B, H, T, T]` scores and probabilities are
/// never materialized, in the forward pass or in its backward, which recomputes them block by
/// block. The same function up to float round-off (tested against the explicit form). A bias
/// that requires a gradient, or of another dtype than `q`, takes the explicit form, whose
/// backward gives the bias its gradient. BERT's encoder uses it (the one-command workload's
/// attention: a key-padding mask); the other families keep the explicit form, which their
/// pinned seeded runs were recorded with.
pub(crate) fn attend_fused(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: &Tensor,
    scale: Option<f64>,
) -> Result<Tensor> {
    let (k, v) = kv_per_query_head(q, k, v)?;
    if bias.requires_grad() || bias.kind() != q.kind() {
        return attend_explicit(q, &k, &v, bias, scale);
    }
    let size = q.size();
    let (b, h, t, hd) = (size[0], size[1], size[2], size[3]);
    Ok(Tensor::f_scaled_dot_product_attention(
        q,
        &k,
        &v,
        Some(bias),
        0.0,
        false,
        scale.unwrap_or(1.0),
        false,
    )?
    .f_transpose(1, 2)?
    .f_reshape([b, t, h * hd])?)
}

/// `k`, `v` with each key/value head repeated for the query heads it serves (unchanged when
/// there are as many as query heads).
fn kv_per_query_head(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
    let h = q.size()[1];
    let kvh = k.size()[1];
    let (mut k, mut v) = (k.shallow_clone(), v.shallow_clone());
    if kvh != h {
        if kvh <= 0 || h % kvh != 0 {
            return Err(ModelError::InvalidConfig(format!(
                "{h} query heads are not a multiple of {kvh} key/value heads"
            )));
        }
        let rep = h / kvh;
        k = k.f_repeat_interleave_self_int(rep, 1, None::<i64>)?;
        v = v.f_repeat_interleave_self_int(rep, 1, None::<i64>)?;
    }
    Ok((k, v))
}

/// The explicit attention core of [`attend`] (scores materialized, then softmax; `k`, `v`
/// with one head per query head), for any bias, including one that requires a gradient.
fn attend_explicit(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: &Tensor,
    scale: Option<f64>,
) -> Result<Tensor> {
    let size = q.size();
    let (b, h, t, hd) = (size[0], size[1], size[2], size[3]);
    // Scaled and masked in place: the scores are `[B, H, T, T]`, the largest tensors of a
    // forward pass (a fresh one per operation costs an allocation and its page faults each
    // time), and the product's backward does not read its own output.
    let mut scores = q.f_matmul(&k.f_transpose(2, 3)?)?;
    if let Some(s) = scale {
        let _ = scores.f_mul_scalar_(s)?;
    }
    let _ = scores.f_add_(bias)?;
    let attn = scores.f_softmax(-1, None::<Kind>)?;
    Ok(attn
        .f_matmul(v)?
        .f_transpose(1, 2)?
        .f_reshape([b, t, h * hd])?)
}

/// `[B, T, n·hd]` → `[B, n, T, hd]`.
pub(crate) fn split_heads(x: &Tensor, n: i64, hd: i64) -> Result<Tensor> {
    let size = x.size();
    Ok(x.f_reshape([size[0], size[1], n, hd])?.f_transpose(1, 2)?)
}

/// Rotary position embedding scaling (Hugging Face `rope_type`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum RopeScaling {
    /// Plain RoPE (`default`).
    None,
    /// Position interpolation (`linear`): positions divided by `factor`.
    Linear {
        /// The divisor of the positions (> 0).
        factor: f64,
    },
}

/// Rotary position embeddings over the whole head (the "rotate half" convention of Llama,
/// Mixtral, Qwen and OLMoE in Hugging Face transformers).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rope {
    pub head_dim: i64,
    pub theta: f64,
    pub scaling: RopeScaling,
}

impl Rope {
    /// `(cos, sin)`, each `[T, head_dim]` in `kind`; computed in f32 like transformers.
    pub(crate) fn cos_sin(&self, t: i64, kind: Kind, device: Device) -> Result<(Tensor, Tensor)> {
        let hd = self.head_dim;
        let inv = Tensor::f_arange_start_step(0, hd, 2, (Kind::Float, device))?
            .f_div_scalar(hd as f64)?;
        let mut inv = Tensor::f_full([hd / 2], self.theta, (Kind::Float, device))?
            .f_pow(&inv)?
            .f_reciprocal()?;
        if let RopeScaling::Linear { factor } = self.scaling {
            inv = inv.f_div_scalar(factor)?;
        }
        let pos = Tensor::f_arange(t, (Kind::Float, device))?;
        let freqs = pos.f_unsqueeze(1)?.f_mul(&inv.f_unsqueeze(0)?)?;
        let emb = Tensor::f_cat(&[&freqs, &freqs], -1)?;
        Ok((emb.f_cos()?.f_to_kind(kind)?, emb.f_sin()?.f_to_kind(kind)?))
    }
}

/// Rotates `x` `[B, H, T, hd]` by `(cos, sin)`.
pub(crate) fn apply_rope(x: &Tensor, cs: &(Tensor, Tensor)) -> Result<Tensor> {
    let halves = x.f_chunk(2, -1)?;
    let r = Tensor::f_cat(&[&halves[1].f_neg()?, &halves[0]], -1)?;
    Ok(x.f_mul(&cs.0)?.f_add(&r.f_mul(&cs.1)?)?)
}

/// Sizes and switches of a [`RotaryAttention`] block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct AttentionSpec {
    pub hidden: i64,
    pub heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
    pub qkv_bias: bool,
    pub o_bias: bool,
    /// RMS norms over the projected queries (`heads·head_dim`) and keys (`kv_heads·head_dim`),
    /// OLMoE-style.
    pub qk_norm: bool,
    pub norm_eps: f64,
    pub clip_qkv: Option<f64>,
}

/// Causal self-attention with rotary positions, multi-head or grouped-query
/// (`{prefix}.{q,k,v,o}_proj`, optional `{prefix}.{q,k}_norm`).
#[derive(Debug)]
pub(crate) struct RotaryAttention {
    pub spec: AttentionSpec,
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
}

impl RotaryAttention {
    pub(crate) fn new(vs: &VarStore, prefix: &str, spec: AttentionSpec, std: f64) -> Result<Self> {
        let (d, qd, kvd) = (
            spec.hidden,
            spec.heads * spec.head_dim,
            spec.kv_heads * spec.head_dim,
        );
        let (q_norm, k_norm) = if spec.qk_norm {
            (
                Some(RmsNorm::new(
                    vs,
                    &format!("{prefix}.q_norm"),
                    qd,
                    spec.norm_eps,
                )?),
                Some(RmsNorm::new(
                    vs,
                    &format!("{prefix}.k_norm"),
                    kvd,
                    spec.norm_eps,
                )?),
            )
        } else {
            (None, None)
        };
        Ok(Self {
            spec,
            q: Linear::new(vs, &format!("{prefix}.q_proj"), d, qd, spec.qkv_bias, std)?,
            k: Linear::new(vs, &format!("{prefix}.k_proj"), d, kvd, spec.qkv_bias, std)?,
            v: Linear::new(vs, &format!("{prefix}.v_proj"), d, kvd, spec.qkv_bias, std)?,
            o: Linear::new(vs, &format!("{prefix}.o_proj"), qd, d, spec.o_bias, std)?,
            q_norm,
            k_norm,
        })
    }

    /// `x` `[B, T, d]`, `mask` the additive `[B, 1, T, T]` mask, `cs` the rotary tables.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        mask: &Tensor,
        cs: &(Tensor, Tensor),
        ctx: &mut ForwardCtx,
    ) -> Result<Tensor> {
        let s = &self.spec;
        let mut q = self.q.forward(x, ctx)?;
        let mut k = self.k.forward(x, ctx)?;
        let mut v = self.v.forward(x, ctx)?;
        if let Some(n) = &self.q_norm {
            q = n.forward(&q, ctx)?;
        }
        if let Some(n) = &self.k_norm {
            k = n.forward(&k, ctx)?;
        }
        if let Some(c) = s.clip_qkv {
            q = q.f_clamp(-c, c)?;
            k = k.f_clamp(-c, c)?;
            v = v.f_clamp(-c, c)?;
        }
        let q = apply_rope(&split_heads(&q, s.heads, s.head_dim)?, cs)?;
        let k = apply_rope(&split_heads(&k, s.kv_heads, s.head_dim)?, cs)?;
        let v = split_heads(&v, s.kv_heads, s.head_dim)?;
        let out = attend(&q, &k, &v, mask, Some((s.head_dim as f64).powf(-0.5)))?;
        self.o.forward(&out, ctx)
    }

    pub(crate) fn linears_mut(&mut self) -> [&mut Linear; 4] {
        [&mut self.q, &mut self.k, &mut self.v, &mut self.o]
    }
}

/// Gated MLP `down(act(gate(x)) ⊙ up(x))` (SwiGLU with SiLU): Llama's MLP and every expert of
/// Mixtral, Qwen2-MoE and OLMoE. The module names are the caller's (`gate_proj`/`up_proj`/
/// `down_proj`, or Mixtral's `w1`/`w3`/`w2`).
#[derive(Debug)]
pub(crate) struct GatedMlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
    pub act: Act,
}

/// Module names of a gated MLP's three projections.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GatedNames {
    pub gate: &'static str,
    pub up: &'static str,
    pub down: &'static str,
}

impl GatedNames {
    /// `gate_proj`, `up_proj`, `down_proj`.
    pub(crate) const PROJ: Self = Self {
        gate: "gate_proj",
        up: "up_proj",
        down: "down_proj",
    };
    /// Mixtral's experts: `w1` (gate), `w3` (up), `w2` (down).
    pub(crate) const W123: Self = Self {
        gate: "w1",
        up: "w3",
        down: "w2",
    };
}

impl GatedMlp {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        vs: &VarStore,
        prefix: &str,
        names: GatedNames,
        d: i64,
        inner: i64,
        bias: bool,
        act: Act,
        std: f64,
    ) -> Result<Self> {
        Ok(Self {
            gate: Linear::new(vs, &format!("{prefix}.{}", names.gate), d, inner, bias, std)?,
            up: Linear::new(vs, &format!("{prefix}.{}", names.up), d, inner, bias, std)?,
            down: Linear::new(vs, &format!("{prefix}.{}", names.down), inner, d, bias, std)?,
            act,
        })
    }

    /// Over rows `rows` with an optional owner mask (routed experts) or densely.
    pub(crate) fn forward_rows(
        &self,
        x: &Tensor,
        ctx: &mut ForwardCtx,
        rows: RowSpec<'_>,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let g = self
            .act
            .apply(&self.gate.forward_rows(x, ctx, rows, mask)?)?;
        let u = self.up.forward_rows(x, ctx, rows, mask)?;
        self.down.forward_rows(&g.f_mul(&u)?, ctx, rows, mask)
    }

    pub(crate) fn linears_mut(&mut self) -> [&mut Linear; 3] {
        [&mut self.gate, &mut self.up, &mut self.down]
    }
}

/// The always-on shared expert of a Qwen2-MoE layer: `sigmoid(gate(x)) · mlp(x)` on every
/// token. It is part of the shared stream: computed densely, never owner-masked, its
/// parameters belong with the attention and norms, not with any routed expert.
#[derive(Debug)]
pub(crate) struct SharedExpert {
    pub mlp: GatedMlp,
    pub gate: Linear,
}

/// How a routed MoE layer turns router logits into gate weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RoutingSpec {
    pub num_experts: i64,
    pub top_k: i64,
    /// Renormalize the top-k softmax probabilities to sum to 1 (Mixtral always does).
    pub norm_topk_prob: bool,
}

/// A top-k softmax-routed MoE layer: a frozen router (`{prefix}.gate`), experts, and an
/// optional shared expert.
#[derive(Debug)]
pub(crate) struct SparseMoe {
    pub routing: RoutingSpec,
    pub router: Linear,
    pub experts: Vec<GatedMlp>,
    pub shared: Option<SharedExpert>,
}

impl SparseMoe {
    /// `x` `[B, T, d]`, `mask` the batch's attention mask `[B, T]`; sparse layer index `layer`
    /// (the key of the owner maps and router outputs).
    pub(crate) fn forward(
        &self,
        layer: usize,
        x: &Tensor,
        mask: &Tensor,
        ctx: &mut ForwardCtx,
    ) -> Result<Tensor> {
        let r = &self.routing;
        // The router is frozen and never recorded (private training never trains it).
        let logits = self.router.forward(x, &mut ForwardCtx::new(false))?;
        let probs = logits.f_softmax(-1, None::<Kind>)?;
        let (mut w, sel) = probs.f_topk(r.top_k, -1, true, true)?;
        if r.norm_topk_prob {
            w = w.f_div(&w.f_sum_dim_intlist(-1, true, None::<Kind>)?)?;
        }
        let owners = routing_and_owners(ctx, layer, &sel, &w, mask, x.size()[0], r.num_experts)?;
        let mut out = dispatch(
            x,
            &sel,
            &w,
            None,
            r.num_experts,
            owners.as_ref(),
            ctx,
            |e, xe, rows, m, ctx| self.experts[e].forward_rows(xe, ctx, rows, m),
        )?;
        if let Some(s) = &self.shared {
            let y = s.mlp.forward_rows(x, ctx, RowSpec::Dense, None)?;
            let g = s.gate.forward(x, ctx)?.f_sigmoid()?;
            out = out.f_add(&y.f_mul(&g)?)?;
        }
        Ok(out)
    }

    pub(crate) fn linears_mut(&mut self) -> Vec<&mut Linear> {
        let mut v: Vec<&mut Linear> = Vec::new();
        for e in &mut self.experts {
            v.extend(e.linears_mut());
        }
        if let Some(s) = &mut self.shared {
            v.extend(s.mlp.linears_mut());
            v.push(&mut s.gate);
        }
        v
    }
}

/// Tied language-model head: `h · Eᵀ` with the token embedding `E`, recorded as a second use
/// of `{embedding}.weight`.
pub(crate) fn tied_lm_head(h: &Tensor, embed: &Embedding, ctx: &mut ForwardCtx) -> Result<Tensor> {
    let z = h.f_matmul(&embed.weight.f_transpose(0, 1)?)?;
    if ctx.recording() && embed.weight.requires_grad() {
        let parts = vec![Part::Weight {
            param: format!("{}.weight", embed.name),
            a: h.f_detach()?,
        }];
        return ctx.record(z, Rows::Dense, parts);
    }
    Ok(z)
}

#[cfg(test)]
mod tests {
    use super::{attend, attend_fused};
    use tch::{Device, Kind, Tensor};

    /// The fused attention equals the explicit form (scores, mask, softmax), outputs and the
    /// gradients of q, k and v, with key padding, a causal mask, no scale and grouped-query
    /// heads, in f32 and f64.
    #[test]
    fn fused_attention_matches_the_explicit_form() {
        // Under the generator's lock: other tests of this binary build seeded models.
        crate::rng::seeded(3, check_fused_attention);
    }

    fn check_fused_attention() {
        for kind in [Kind::Float, Kind::Double] {
            let (b, h, kvh, t, hd) = (3i64, 4i64, 2i64, 7i64, 5i64);
            let opts = (kind, Device::Cpu);
            // Record r keeps its first 7 - 2r tokens (key padding), as a BERT batch masks.
            let valid = Tensor::arange(t, (Kind::Int64, Device::Cpu))
                .unsqueeze(0)
                .lt_tensor(&(Tensor::from_slice(&[7i64, 5, 3]).unsqueeze(1)));
            let neg = Tensor::full([1], super::mask_min(kind), opts);
            let zero = Tensor::zeros([1], opts);
            let keys = zero.where_self(&valid.reshape([b, 1, 1, t]), &neg);
            let causal = Tensor::ones([t, t], (Kind::Bool, Device::Cpu)).tril(0);
            let causal_keys = zero.where_self(
                &valid
                    .reshape([b, 1, 1, t])
                    .logical_and(&causal.reshape([1, 1, t, t])),
                &neg,
            );
            for (bias, scale, heads) in [
                (&keys, Some(0.4), h),
                (&causal_keys, Some(0.4), kvh),
                (&keys, None, h),
            ] {
                let q = Tensor::randn([b, h, t, hd], opts).set_requires_grad(true);
                let k = Tensor::randn([b, heads, t, hd], opts).set_requires_grad(true);
                let v = Tensor::randn([b, heads, t, hd], opts).set_requires_grad(true);
                let w = Tensor::randn([b, t, h * hd], opts);
                let fused = attend_fused(&q, &k, &v, bias, scale).unwrap();
                let explicit = attend(&q, &k, &v, bias, scale).unwrap();
                let tol = if kind == Kind::Float { 1e-5 } else { 1e-12 };
                let diff = (&fused - &explicit).abs().max().double_value(&[]);
                assert!(diff < tol, "{kind:?} outputs differ by {diff}");
                let gf =
                    Tensor::run_backward(&[(&fused * &w).sum(kind)], &[&q, &k, &v], false, false);
                let ge = Tensor::run_backward(
                    &[(&explicit * &w).sum(kind)],
                    &[&q, &k, &v],
                    false,
                    false,
                );
                for (a, e) in gf.iter().zip(&ge) {
                    let diff = (a - e).abs().max().double_value(&[]);
                    assert!(diff < 10.0 * tol, "{kind:?} gradients differ by {diff}");
                }
            }
        }
    }
}
