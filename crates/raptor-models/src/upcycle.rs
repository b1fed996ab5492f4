//! Sparse upcycling (Komatsuzaki et al., "Sparse upcycling", 2023): a dense Llama-style
//! [`Decoder`] becomes a Mixtral-style MoE [`Decoder`] whose experts are copies of each layer's
//! dense SwiGLU MLP, with a new router drawn at random (seeded) and frozen like every router;
//! a dense [`Bert`] becomes a MoE-BERT ([`upcycle_bert`], raptor's own layout described in
//! [`crate::BertMoeConfig`]) the same way. [`upcycle_folder`] does it from a checkpoint folder
//! to a checkpoint folder (the library form of `raptor upcycle`), optionally training the new
//! routers of a MoE-BERT on public tokens first ([`train_bert_routers`]). [`route_folder`] and
//! [`train_routers_to_partition`] train the routers of a Switch encoder or a MoE-BERT toward a
//! public partition of the records (a domain or source label per record), so that a record's
//! owner expert is the expert of its kind of record.
//!
//! Tensor names: `model.layers.{i}.mlp.{gate,up,down}_proj.weight` →
//! `model.layers.{i}.block_sparse_moe.experts.{e}.{w1,w3,w2}.weight` for every expert `e`;
//! the router is `model.layers.{i}.block_sparse_moe.gate.weight`; every other tensor is copied
//! unchanged. With every layer upcycled the result is an ordinary `MixtralForCausalLM`
//! checkpoint ([`crate::checkpoint::save_pretrained`]). Mixtral renormalizes the top-k gate
//! weights to sum to 1, so while the experts are identical copies the upcycled model computes
//! exactly the dense model's function, whatever the router.
//!
//! ```
//! use raptor_models::upcycle::{UpcycleOptions, upcycle_llama};
//! use raptor_models::{Decoder, DecoderConfig, DecoderFamily, DecoderHead, Model};
//! let dense = Decoder::new(
//!     DecoderConfig::tiny(DecoderFamily::Llama, DecoderHead::LanguageModel),
//!     tch::Device::Cpu,
//! )?;
//! let moe = upcycle_llama(&dense, &UpcycleOptions::new(4, 2))?;
//! assert_eq!((moe.num_experts(), moe.top_k()), (4, 2));
//! assert_eq!(moe.config().family, DecoderFamily::Mixtral);
//! # Ok::<(), raptor_models::ModelError>(())
//! ```

mod folder;
mod partition;
pub use folder::{RouterTokens, UpcycleReport, UpcycledLayout, upcycle_folder};
pub use partition::{
    ExpertSpread, LayerAgreement, PartitionReport, PartitionTokens, expert_spread, folder_report,
    partition_agreement, route_folder, router_inputs, train_routers_to_partition,
};

use crate::bert::{Bert, BertMoeConfig};
use crate::decoder::{Decoder, DecoderFamily, MoeConfig};
use crate::error::{ModelError, Result};
use crate::model::Model;
use tch::{Kind, Tensor};

/// Settings of [`upcycle_llama`].
#[derive(Debug, Clone, PartialEq)]
pub struct UpcycleOptions {
    /// Experts per upcycled layer (E ≥ 1).
    pub num_experts: i64,
    /// Experts per token (1 ≤ k ≤ E).
    pub top_k: i64,
    /// Layers to upcycle (None: all; a Mixtral checkpoint needs all).
    pub layers: Option<Vec<usize>>,
    /// Standard deviation of the router's N(0, σ²) initialization.
    pub router_std: f64,
    /// Seed of the router initialization.
    pub seed: u64,
}

impl UpcycleOptions {
    /// E experts, top-k, every layer, router σ = 0.02, seed 0.
    pub fn new(num_experts: i64, top_k: i64) -> Self {
        Self {
            num_experts,
            top_k,
            layers: None,
            router_std: 0.02,
            seed: 0,
        }
    }
}

/// The sorted, deduplicated layers to upcycle (None: all `n`; possibly none), checked against
/// `n`, and the options' E, k and σ.
fn chosen_layers(opts: &UpcycleOptions, n: usize) -> Result<Vec<usize>> {
    if opts.num_experts < 1 || opts.top_k < 1 || opts.top_k > opts.num_experts {
        return Err(ModelError::InvalidConfig(format!(
            "upcycling needs 1 <= top_k ({}) <= num_experts ({})",
            opts.top_k, opts.num_experts
        )));
    }
    if !(opts.router_std.is_finite() && opts.router_std >= 0.0) {
        return Err(ModelError::InvalidConfig(format!(
            "router_std {} must be finite and non-negative",
            opts.router_std
        )));
    }
    match &opts.layers {
        None => Ok((0..n).collect()),
        Some(v) => {
            let mut v = v.clone();
            v.sort_unstable();
            v.dedup();
            if let Some(&l) = v.iter().find(|&&l| l >= n) {
                return Err(ModelError::InvalidConfig(format!(
                    "layer {l} to upcycle is outside the {n} layers"
                )));
            }
            Ok(v)
        }
    }
}

/// Upcycles a dense BERT into a MoE-BERT (raptor's layout, see [`crate::BertMoeConfig`]): each chosen
/// layer's FFN `bert.encoder.layer.{l}.{intermediate,output}.dense.*` is copied into E experts
/// `bert.encoder.layer.{l}.moe.experts.{e}.{intermediate,output}.dense.*`, and a router
/// `bert.encoder.layer.{l}.moe.gate.weight` `[E, d]` is drawn N(0, σ²) from a seeded ChaCha8
/// stream (seed + the layer's position in the list). Every other tensor (embeddings,
/// attention, layer norms, pooler, classifier) is copied unchanged; LoRA adapters are not. The
/// top-k gates are renormalized, so while the experts are identical the MoE-BERT computes the
/// dense model's function.
///
/// ```
/// use raptor_models::upcycle::{UpcycleOptions, upcycle_bert};
/// use raptor_models::{Bert, BertConfig, Model};
/// let dense = Bert::new(BertConfig::tiny(2), tch::Device::Cpu)?;
/// let moe = upcycle_bert(&dense, &UpcycleOptions::new(8, 2))?;
/// assert_eq!((moe.num_experts(), moe.top_k(), moe.sparse_layers()), (8, 2, vec![0, 1]));
/// # Ok::<(), raptor_models::ModelError>(())
/// ```
pub fn upcycle_bert(dense: &Bert, opts: &UpcycleOptions) -> Result<Bert> {
    let c = dense.config();
    if c.moe.is_some() {
        return Err(ModelError::InvalidConfig(
            "upcycling needs a dense BERT, not a MoE-BERT".into(),
        ));
    }
    let layers = chosen_layers(opts, c.num_hidden_layers.max(0) as usize)?;
    if layers.is_empty() {
        return Err(ModelError::InvalidConfig(
            "no layer to upcycle (an empty layer list)".into(),
        ));
    }
    let mut cfg = c.clone();
    cfg.moe = Some(BertMoeConfig {
        num_experts: opts.num_experts,
        num_experts_per_tok: opts.top_k,
        sparse_layers: layers.clone(),
    });
    let mut moe = Bert::new(cfg, dense.var_store().device())?;
    match_kind(dense, &mut moe, "bert.embeddings.word_embeddings.weight");
    let renamed = |name: &str| -> Vec<String> {
        for &l in &layers {
            let p = format!("bert.encoder.layer.{l}.");
            if let Some(rest) = name.strip_prefix(&p)
                && (rest.starts_with("intermediate.dense.") || rest.starts_with("output.dense."))
            {
                return (0..opts.num_experts)
                    .map(|e| format!("{p}moe.experts.{e}.{rest}"))
                    .collect();
            }
        }
        vec![name.to_string()]
    };
    let routers: Vec<String> = layers
        .iter()
        .map(|l| format!("bert.encoder.layer.{l}.moe.gate.weight"))
        .collect();
    copy_and_route(dense, &moe, renamed, &routers, opts)?;
    Ok(moe)
}

/// Converts the new `moe` model's variables to the kind of `dense`'s tensor `probe` (double,
/// half or bfloat16; anything else, or no such tensor, leaves them float).
fn match_kind<A: Model, B: Model>(dense: &A, moe: &mut B, probe: &str) {
    match dense.var_store().variables().get(probe).map(Tensor::kind) {
        Some(Kind::Double) => moe.var_store_mut().double(),
        Some(Kind::Half) => moe.var_store_mut().half(),
        Some(Kind::BFloat16) => moe.var_store_mut().bfloat16(),
        _ => {}
    }
}

/// Copies every non-adapter tensor of `dense` to its `renamed` targets in `moe`, then draws
/// each router of `routers` (in order: seed + index).
fn copy_and_route<A: Model, B: Model>(
    dense: &A,
    moe: &B,
    renamed: impl Fn(&str) -> Vec<String>,
    routers: &[String],
    opts: &UpcycleOptions,
) -> Result<()> {
    let src = dense.var_store().variables();
    let dst = moe.var_store().variables();
    tch::no_grad(|| -> Result<()> {
        for (name, t) in &src {
            if name.contains(".lora_A.") || name.contains(".lora_B.") {
                continue;
            }
            for target in renamed(name) {
                let mut d = dst
                    .get(&target)
                    .ok_or_else(|| {
                        ModelError::InvalidConfig(format!(
                            "upcycled model lacks {target} (from {name})"
                        ))
                    })?
                    .shallow_clone();
                d.f_copy_(t)?;
            }
        }
        for (i, name) in routers.iter().enumerate() {
            let mut d = dst
                .get(name)
                .ok_or_else(|| ModelError::InvalidConfig(format!("upcycled model lacks {name}")))?
                .shallow_clone();
            let w = seeded_normal(&d.size(), opts.seed.wrapping_add(i as u64), opts.router_std)?;
            d.f_copy_(&w.f_to_kind(d.kind())?)?;
        }
        Ok(())
    })
}

/// Upcycles a dense Llama-style decoder into a Mixtral-style MoE decoder (see the module
/// docs). The new model has the dense model's kind and device; LoRA adapters are not copied.
pub fn upcycle_llama(dense: &Decoder, opts: &UpcycleOptions) -> Result<Decoder> {
    let c = dense.config();
    if c.family != DecoderFamily::Llama || c.moe.is_some() {
        return Err(ModelError::InvalidConfig(format!(
            "upcycling needs a dense llama decoder, not {}",
            c.family.model_type()
        )));
    }
    if c.qkv_bias || c.o_bias || c.mlp_bias {
        return Err(ModelError::InvalidConfig(
            "Mixtral has no attention or MLP biases: a Llama with attention_bias or mlp_bias cannot be upcycled into the Mixtral layout".into(),
        ));
    }
    let layers = chosen_layers(opts, c.num_hidden_layers.max(0) as usize)?;
    let mut cfg = c.clone();
    cfg.family = DecoderFamily::Mixtral;
    cfg.moe = Some(MoeConfig {
        num_experts: opts.num_experts,
        num_experts_per_tok: opts.top_k,
        expert_intermediate_size: c.intermediate_size,
        norm_topk_prob: true,
        shared_expert_intermediate_size: None,
        sparse_layers: layers.clone(),
    });
    let mut moe = Decoder::new(cfg, dense.var_store().device())?;
    match_kind(dense, &mut moe, "model.embed_tokens.weight");
    let renamed = |name: &str| -> Vec<String> {
        for &l in &layers {
            let p = format!("model.layers.{l}.mlp.");
            if let Some(rest) = name.strip_prefix(&p) {
                let (proj, tail) = rest.split_once('.').unwrap_or((rest, ""));
                let w = match proj {
                    "gate_proj" => "w1",
                    "up_proj" => "w3",
                    "down_proj" => "w2",
                    _ => return vec![name.to_string()],
                };
                return (0..opts.num_experts)
                    .map(|e| format!("model.layers.{l}.block_sparse_moe.experts.{e}.{w}.{tail}"))
                    .collect();
            }
        }
        vec![name.to_string()]
    };
    // Routers: N(0, σ²) from a seeded generator, independent of libtorch's global one.
    let routers: Vec<String> = layers
        .iter()
        .map(|l| format!("model.layers.{l}.block_sparse_moe.gate.weight"))
        .collect();
    copy_and_route(dense, &moe, renamed, &routers, opts)?;
    Ok(moe)
}

/// `N(0, std²)` of `shape` by Box–Muller over a ChaCha8 stream keyed by `seed` (reproducible
/// across platforms and libtorch versions).
fn seeded_normal(shape: &[i64], seed: u64, std: f64) -> Result<Tensor> {
    use rand_chacha::ChaCha8Rng;
    use rand_chacha::rand_core::{RngCore, SeedableRng};
    let n: usize = shape.iter().map(|&d| d.max(0) as usize).product();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut uniform = || (f64::from(rng.next_u32()) + 0.5) / 4_294_967_296.0;
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        let (u1, u2) = (uniform(), uniform());
        let r = (-2.0 * u1.ln()).sqrt();
        let a = 2.0 * std::f64::consts::PI * u2;
        v.push(std * r * a.cos());
        if v.len() < n {
            v.push(std * r * a.sin());
        }
    }
    Ok(Tensor::f_from_slice(&v)?.f_reshape(shape)?)
}

/// Settings of [`train_bert_routers`]: brief non-private training of the routers on
/// **public** text with the Switch load-balancing loss, after which they stay frozen.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterTraining {
    /// Adam steps per layer (each over every public token: full batch).
    pub steps: usize,
    /// Adam learning rate.
    pub lr: f64,
}

impl Default for RouterTraining {
    /// 100 steps at learning rate 10⁻³.
    fn default() -> Self {
        Self {
            steps: 100,
            lr: 1e-3,
        }
    }
}

/// How one sparse layer's router spreads a set of tokens over the experts.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RouterLoad {
    /// The sparse layer.
    pub layer: usize,
    /// Fraction of the top-k assignments that go to each expert (sums to 1).
    pub load: Vec<f64>,
    /// Coefficient of variation (standard deviation / mean) of `load`: 0 is perfectly
    /// balanced.
    pub load_cv: f64,
    /// The Switch load-balancing loss `E · Σ_e f_e P_e` (f: `load`, P: mean router
    /// probability of expert e); 1 when both are uniform.
    pub balance_loss: f64,
}

/// The valid tokens' router inputs `[n, d]` of every sparse layer of a MoE-BERT over
/// `batches` (no grad). Right after upcycling the experts are identical, so these hidden states
/// do not depend on any router: training the routers on them is exact.
///
/// # Errors
/// A model without sparse layers, or a batch the model rejects.
pub fn bert_router_inputs(
    moe: &Bert,
    batches: &[crate::Batch],
) -> Result<std::collections::BTreeMap<usize, Tensor>> {
    if moe.sparse_layers().is_empty() {
        return Err(ModelError::InvalidConfig(
            "router training needs a MoE-BERT (no sparse layer)".into(),
        ));
    }
    let mut per: std::collections::BTreeMap<usize, Vec<Tensor>> = Default::default();
    for b in batches {
        let mut ctx = crate::ForwardCtx::new(false);
        ctx.router_inputs = Some(Vec::new());
        let _ = tch::no_grad(|| moe.encode(b, None, &mut ctx))?;
        let valid = b.attention_mask.f_gt(0)?;
        for (layer, x) in ctx.router_inputs.take().unwrap_or_default() {
            let rows = x.f_index(&[Some(&valid)])?.f_to_kind(Kind::Float)?;
            per.entry(layer).or_default().push(rows);
        }
    }
    per.into_iter()
        .map(|(l, v)| -> Result<(usize, Tensor)> { Ok((l, Tensor::f_cat(&v, 0)?)) })
        .collect()
}

/// Router probabilities `[n, E]`, the hard load `f` `[E]` of the top-k choices and the
/// Switch loss `E · Σ f_e P_e` (differentiable in `w` through P).
fn balance(x: &Tensor, w: &Tensor, k: i64) -> Result<(Tensor, Tensor)> {
    let e = w.size().first().copied().unwrap_or(0);
    let p = x.f_matmul(&w.f_tr()?)?.f_softmax(-1, Kind::Float)?;
    let (_, sel) = p.f_detach()?.f_topk(k, -1, true, true)?;
    let n = (x.size().first().copied().unwrap_or(0) * k).max(1);
    let f = sel
        .f_one_hot(e)?
        .f_to_kind(Kind::Float)?
        .f_sum_dim_intlist([0i64, 1].as_slice(), false, Kind::Float)?
        .f_div_scalar(n as f64)?;
    let mean_p = p.f_mean_dim([0i64].as_slice(), false, Kind::Float)?;
    let loss = f
        .f_mul(&mean_p)?
        .f_sum(Kind::Float)?
        .f_mul_scalar(e as f64)?;
    Ok((f, loss))
}

fn load_of(layer: usize, x: &Tensor, w: &Tensor, k: i64) -> Result<RouterLoad> {
    let (f, loss) = tch::no_grad(|| balance(x, &w.f_to_kind(Kind::Float)?, k))?;
    let load: Vec<f64> = Vec::<f64>::try_from(&f.f_to_kind(Kind::Double)?)?;
    let mean = load.iter().sum::<f64>() / load.len().max(1) as f64;
    let var = load.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / load.len().max(1) as f64;
    Ok(RouterLoad {
        layer,
        load,
        load_cv: if mean > 0.0 { var.sqrt() / mean } else { 0.0 },
        balance_loss: loss.f_double_value(&[])?,
    })
}

/// Each sparse layer's router load on `inputs` (from [`bert_router_inputs`]).
///
/// # Errors
/// A layer of `inputs` that the model does not route.
pub fn bert_router_loads(
    moe: &Bert,
    inputs: &std::collections::BTreeMap<usize, Tensor>,
) -> Result<Vec<RouterLoad>> {
    let vars = moe.var_store().variables();
    inputs
        .iter()
        .map(|(&l, x)| {
            let name = format!("bert.encoder.layer.{l}.moe.gate.weight");
            let w = vars
                .get(&name)
                .ok_or_else(|| ModelError::InvalidConfig(format!("the model lacks {name}")))?;
            load_of(l, x, w, moe.top_k())
        })
        .collect()
}

/// Trains every router of an (upcycled) MoE-BERT on public batches, non-privately: `steps`
/// Adam steps per layer on the Switch load-balancing loss `E · Σ_e f_e P_e` over all the
/// public tokens' router inputs ([`bert_router_inputs`]), starting from the current (seeded
/// random) router. The routers stay frozen (`requires_grad` false): private training never
/// updates them, and the owner maps RAPTOR derives from them are then a function of public
/// data only. Returns the loads before and after, per layer.
///
/// Only public records may be passed: nothing here is private.
///
/// # Errors
/// No public batch or token, a model without sparse layers, a batch the model rejects, or a
/// non-finite loss.
pub fn train_bert_routers(
    moe: &mut Bert,
    public: &[crate::Batch],
    opts: &RouterTraining,
) -> Result<(Vec<RouterLoad>, Vec<RouterLoad>)> {
    if public.is_empty() {
        return Err(ModelError::InvalidConfig(
            "router training needs at least one public batch".into(),
        ));
    }
    let inputs = bert_router_inputs(moe, public)?;
    let before = bert_router_loads(moe, &inputs)?;
    let k = moe.top_k();
    let vars = moe.var_store().variables();
    for (&l, x) in &inputs {
        if x.size().first().copied().unwrap_or(0) == 0 {
            return Err(ModelError::InvalidConfig(
                "router training: the public batches have no valid token".into(),
            ));
        }
        let name = format!("bert.encoder.layer.{l}.moe.gate.weight");
        let mut target = vars
            .get(&name)
            .ok_or_else(|| ModelError::InvalidConfig(format!("the model lacks {name}")))?
            .shallow_clone();
        adam_train_router(&mut target, l, opts.steps, opts.lr, |w| {
            Ok(balance(x, w, k)?.1)
        })?;
    }
    let after = bert_router_loads(moe, &inputs)?;
    Ok((before, after))
}

/// Trains one router weight in place by `steps` Adam steps (β 0.9 / 0.999, ε 1e-8, no weight
/// decay) on `loss(w)`, starting from a float copy of `target` (never a view of the
/// frozen router), then writes the result back in `target`'s kind. A non-finite loss is an
/// error naming `layer` and the step.
pub(crate) fn adam_train_router(
    target: &mut Tensor,
    layer: usize,
    steps: usize,
    lr: f64,
    mut loss: impl FnMut(&Tensor) -> Result<Tensor>,
) -> Result<()> {
    let w = target
        .f_detach()?
        .f_to_kind(Kind::Float)?
        .f_mul_scalar(1.0)?
        .f_set_requires_grad(true)?;
    let mut m = w.f_zeros_like()?;
    let mut v = w.f_zeros_like()?;
    let (b1, b2, eps) = (0.9f64, 0.999f64, 1e-8);
    for t in 1..=steps {
        let loss = loss(&w)?;
        let lv = loss.f_double_value(&[])?;
        if !lv.is_finite() {
            return Err(ModelError::InvalidConfig(format!(
                "router training of layer {layer}: non-finite loss at step {t}"
            )));
        }
        let g = Tensor::f_run_backward(&[&loss], &[&w], false, false)?
            .into_iter()
            .next()
            .ok_or_else(|| ModelError::InvalidConfig("no router gradient".into()))?;
        tch::no_grad(|| -> Result<()> {
            m = m.f_mul_scalar(b1)?.f_add(&g.f_mul_scalar(1.0 - b1)?)?;
            v = v
                .f_mul_scalar(b2)?
                .f_add(&g.f_mul(&g)?.f_mul_scalar(1.0 - b2)?)?;
            let mh = m.f_div_scalar(1.0 - b1.powi(t as i32))?;
            let vh = v.f_div_scalar(1.0 - b2.powi(t as i32))?;
            let step = mh
                .f_div(&vh.f_sqrt()?.f_add_scalar(eps)?)?
                .f_mul_scalar(lr)?;
            let mut w2 = w.shallow_clone();
            let _ = w2.f_sub_(&step)?;
            Ok(())
        })?;
    }
    tch::no_grad(|| -> Result<()> {
        let kind = target.kind();
        target.f_copy_(&w.f_detach()?.f_to_kind(kind)?)?;
        Ok(())
    })
}
