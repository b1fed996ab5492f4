//! The model interface, LoRA attachment, freezing by name pattern, and the private step.

use crate::batch::{Batch, Task, per_record_loss};
use crate::error::{ModelError, Result};
use crate::grad::{ClipOutput, ClipPolicy, GroupKey, ParamGroups, PerSampleGrads};
use crate::layers::{ForwardCtx, Linear, name_matches};
use std::collections::BTreeMap;
use tch::nn::VarStore;
use tch::{Kind, Tensor};

/// What every model in this crate offers to trainers.
pub trait Model {
    /// The variables (names equal Hugging Face tensor names).
    fn var_store(&self) -> &VarStore;
    /// Mutable variables (kind or device changes).
    fn var_store_mut(&mut self) -> &mut VarStore;
    /// Vocabulary size.
    fn vocab_size(&self) -> i64;
    /// Number of classes for classification heads (None: a language-model head).
    fn num_labels(&self) -> Option<i64>;
    /// What the head computes (default: classification when the model has
    /// [`Model::num_labels`], language modelling otherwise).
    fn task(&self) -> Task {
        match self.num_labels() {
            Some(_) => Task::Classification,
            None => Task::LanguageModel,
        }
    }
    /// The experts of a MoE model (default: none, a dense model); [`Model::sparse_layers`],
    /// [`Model::num_experts`] and [`Model::top_k`] read it.
    fn moe_shape(&self) -> Option<MoeShape> {
        None
    }
    /// Block indices of the sparse (MoE) layers, sorted, without repeats (default: those of
    /// [`Model::moe_shape`]; none for a dense model).
    fn sparse_layers(&self) -> Vec<usize> {
        self.moe_shape()
            .map(|s| s.sparse_layers)
            .unwrap_or_default()
    }
    /// Experts per sparse layer (default: that of [`Model::moe_shape`]; 0 for a dense model).
    fn num_experts(&self) -> i64 {
        self.moe_shape().map_or(0, |s| s.num_experts)
    }
    /// Experts per token (default: that of [`Model::moe_shape`]; 0 for a dense model).
    fn top_k(&self) -> i64 {
        self.moe_shape().map_or(0, |s| s.top_k)
    }
    /// Expert capacity (token dropping), if on (default: off).
    fn expert_capacity(&self) -> Option<i64> {
        None
    }
    /// All linear maps that can carry LoRA, with the VarStore to create adapter variables in.
    fn linears_mut(&mut self) -> (&VarStore, Vec<&mut Linear>);
    /// Router parameter names (always frozen; default: none, a dense model).
    fn router_params(&self) -> Vec<String> {
        Vec::new()
    }
    /// The Hugging Face `config.json` of this model (what `save_pretrained` of the `checkpoint` module
    /// writes beside the weights); None when the family cannot be exported.
    fn hf_config_json(&self) -> Option<serde_json::Value> {
        None
    }
    /// Logits: `[B, C]` for classification, `[B, T, V]` for language modelling.
    fn forward(&self, batch: &Batch, ctx: &mut ForwardCtx) -> Result<Tensor>;

    /// The frozen prefix of this model while the parameters named in `trainable` train: the
    /// embeddings and the first `layers` blocks when none of their parameters is in
    /// `trainable` or requires a gradient, none of them carries a LoRA adapter (whose dropout
    /// or switching off would make their output vary) and they hold no other randomness, so
    /// that each record's hidden states after them are a fixed function of its tokens, the
    /// same at every update. `None` when no block is frozen, or when the model cannot start a
    /// forward pass from cached hidden states (the default; [`Bert`](crate::Bert) can).
    fn frozen_prefix(&self, trainable: &[String]) -> Option<FrozenPrefix> {
        let _ = trainable;
        None
    }

    /// Hidden states `[B, T, d]` after the embeddings and the first `layers` blocks (no
    /// gradient, no dropout, natural routing): what a forward pass started with
    /// [`ForwardCtx::prefix`] `= (layers, h)` continues from. Errors for models without a
    /// [`Model::frozen_prefix`] and for `layers` beyond the model's blocks.
    fn prefix_hidden(&self, batch: &Batch, layers: usize) -> Result<Tensor> {
        let _ = batch;
        Err(ModelError::InvalidConfig(format!(
            "this model cannot start a forward pass from cached hidden states (asked for {layers} blocks)"
        )))
    }

    /// Per-record losses `[B]` (see [`per_record_loss`]).
    fn per_record_loss(&self, batch: &Batch, ctx: &mut ForwardCtx) -> Result<Tensor> {
        batch.validate(self.vocab_size(), self.num_labels())?;
        let logits = self.forward(batch, ctx)?;
        per_record_loss(&logits, batch, self.task())
    }
}

/// The experts of a MoE model ([`Model::moe_shape`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeShape {
    /// Block indices of the sparse layers, sorted, without repeats.
    pub sparse_layers: Vec<usize>,
    /// Experts per sparse layer.
    pub num_experts: i64,
    /// Experts per token.
    pub top_k: i64,
}

impl MoeShape {
    /// The shape of `num_experts` experts per sparse layer, `top_k` per token, over the blocks
    /// `sparse_layers` (sorted and deduplicated here).
    pub fn new(mut sparse_layers: Vec<usize>, num_experts: i64, top_k: i64) -> Self {
        sparse_layers.sort_unstable();
        sparse_layers.dedup();
        Self {
            sparse_layers,
            num_experts,
            top_k,
        }
    }
}

/// A model's frozen prefix ([`Model::frozen_prefix`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FrozenPrefix {
    /// Blocks after the embeddings whose output is fixed (≥ 1).
    pub layers: usize,
    /// Width d of the hidden states after them (`[B, T, d]`).
    pub width: i64,
    /// Blocks of the model in all (a prefix of all of them leaves only the pooling and head).
    pub of: usize,
}

/// LoRA settings.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoraConfig {
    /// Rank r.
    pub r: i64,
    /// α (the delta is scaled by α/r).
    pub alpha: f64,
    /// Dropout on the adapter input (training only).
    pub dropout: f64,
    /// Linear module names to adapt (patterns, see [`name_matches`]), e.g. `SelfAttention.q`,
    /// `*.experts.*.wi`, `mlp.wi`.
    pub targets: Vec<String>,
}

impl LoraConfig {
    /// RAPTOR's defaults: r = 8, α = 16, dropout 0.05.
    pub fn raptor(targets: Vec<String>) -> Self {
        Self {
            r: 8,
            alpha: 16.0,
            dropout: 0.05,
            targets,
        }
    }
}

/// Attaches LoRA adapters to every linear whose name matches a target pattern; returns the
/// adapted module names. Errors when nothing matches.
pub fn attach_lora<M: Model + ?Sized>(model: &mut M, cfg: &LoraConfig) -> Result<Vec<String>> {
    if cfg.r <= 0 || !(cfg.alpha.is_finite()) || !(0.0..1.0).contains(&cfg.dropout) {
        return Err(ModelError::InvalidConfig(format!(
            "LoRA needs r > 0, finite alpha, dropout in [0, 1): {cfg:?}"
        )));
    }
    let (vs, linears) = model.linears_mut();
    let mut done = Vec::new();
    for l in linears {
        if cfg.targets.iter().any(|p| name_matches(&l.name, p)) {
            l.attach_lora(vs, cfg.r, cfg.alpha, cfg.dropout)?;
            done.push(l.name.clone());
        }
    }
    if done.is_empty() {
        return Err(ModelError::InvalidConfig(format!(
            "no linear module matches the LoRA targets {:?}",
            cfg.targets
        )));
    }
    Ok(done)
}

/// Sets `requires_grad` of every variable whose name matches one of `patterns` (routers stay
/// frozen whatever the pattern); returns the names changed.
pub fn set_trainable<M: Model + ?Sized>(
    model: &M,
    patterns: &[&str],
    trainable: bool,
) -> Result<Vec<String>> {
    let routers = model.router_params();
    let mut names = Vec::new();
    for (name, t) in model.var_store().variables() {
        if patterns.iter().any(|p| name_matches(&name, p))
            && !(trainable && routers.contains(&name))
        {
            let _ = t.f_set_requires_grad(trainable)?;
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Freezes every variable (start of "train only X" setups).
pub fn freeze_all<M: Model + ?Sized>(model: &M) -> Result<()> {
    for (_, t) in model.var_store().variables() {
        let _ = t.f_set_requires_grad(false)?;
    }
    Ok(())
}

/// Names of the trainable variables, sorted.
pub fn trainable_params<M: Model + ?Sized>(model: &M) -> Vec<String> {
    let mut v: Vec<String> = model
        .var_store()
        .variables()
        .into_iter()
        .filter(|(_, t)| t.requires_grad())
        .map(|(n, _)| n)
        .collect();
    v.sort();
    v
}

/// The per-sample half of a private training step over a model: forward in a recording
/// context, one backward, per-record norms, clip factors and clipped sums. It clips and adds no
/// noise: the trainer adds the Gaussian noise and divides by the public denominator when it
/// releases the sums (`raptor-train`, with `raptor-clip`'s privatizer). Rejects configurations
/// that break per-record sensitivity (capacity-based token dropping) at construction.
#[derive(Debug)]
pub struct ClippedStep<'m, M: Model + ?Sized> {
    model: &'m M,
    dropout_seed: Option<u64>,
    record_ids: Option<Vec<u64>>,
    prefix: Option<(usize, Tensor)>,
}

/// What one [`ClippedStep`] computed (clipped, not yet noised), with groups keyed by `K`.
#[derive(Debug)]
pub struct ClippedStepOutput<K: GroupKey> {
    /// Per-record losses `[B]` (detached).
    pub losses: Tensor,
    /// Norms, clip factors and clipped sums.
    pub clip: ClipOutput<K>,
}

impl<'m, M: Model + ?Sized> ClippedStep<'m, M> {
    /// Errors with [`ModelError::CapacityInPrivateTraining`] when the model drops tokens by capacity.
    pub fn new(model: &'m M) -> Result<Self> {
        if let Some(capacity) = model.expert_capacity() {
            return Err(ModelError::CapacityInPrivateTraining { capacity });
        }
        Ok(Self {
            model,
            dropout_seed: None,
            record_ids: None,
            prefix: None,
        })
    }

    /// Starts the forward pass from the batch's cached hidden states after the model's first
    /// `layers` blocks ([`ForwardCtx::prefix`]; `hidden` `[B, T, d]`). The per-sample results
    /// equal those of the full forward pass up to float round-off, provided the prefix is
    /// frozen ([`Model::frozen_prefix`]): nothing below it is recorded either way.
    pub fn with_prefix(mut self, layers: usize, hidden: Tensor) -> Self {
        self.prefix = Some((layers, hidden));
        self
    }

    /// Seeds this step's LoRA dropout masks ([`ForwardCtx::dropout_seed`]): record r's mask
    /// at each adapter is a function of (seed, record id, adapter), so a single-record pass
    /// with the same seed and id reproduces it. Without a seed, each call draws one from
    /// libtorch's global generator.
    pub fn with_dropout_seed(mut self, seed: u64) -> Self {
        self.dropout_seed = Some(seed);
        self
    }

    /// Ids of the batch's records keying their dropout masks ([`ForwardCtx::record_ids`];
    /// default: positions in the batch).
    pub fn with_record_ids(mut self, ids: Vec<u64>) -> Self {
        self.record_ids = Some(ids);
        self
    }

    /// Forward in a recording context (`owners`: per sparse layer `[B]` owner experts),
    /// one backward, per-sample norms, clipping and clipped sums.
    pub fn per_sample(
        &self,
        batch: &Batch,
        owners: &BTreeMap<usize, Tensor>,
        train: bool,
    ) -> Result<(Tensor, PerSampleGrads)> {
        let mut ctx = ForwardCtx::private(train);
        ctx.dropout_seed = self.dropout_seed;
        ctx.record_ids = self.record_ids.clone();
        ctx.prefix = self.prefix.as_ref().map(|(k, h)| (*k, h.shallow_clone()));
        for (l, o) in owners {
            ctx.owners.insert(*l, o.shallow_clone());
        }
        let losses = self.model.per_record_loss(batch, &mut ctx)?;
        let loss = losses.f_sum(Kind::Double)?.f_to_kind(losses.kind())?;
        let tape = ctx.take_tape().unwrap_or_default();
        let grads = PerSampleGrads::compute(tape, &loss, batch.batch_size())?;
        Ok((losses.f_detach()?, grads))
    }

    /// [`Self::per_sample`] then [`PerSampleGrads::into_clip`] (each recorded op's tensors are
    /// freed as soon as its clipped sums are taken).
    pub fn run<K: GroupKey>(
        &self,
        batch: &Batch,
        owners: &BTreeMap<usize, Tensor>,
        groups: &ParamGroups<K>,
        policy: &ClipPolicy<K>,
        weights: &BTreeMap<K, Tensor>,
        train: bool,
    ) -> Result<ClippedStepOutput<K>> {
        let (losses, grads) = self.per_sample(batch, owners, train)?;
        let clip = grads.into_clip(groups, policy, weights)?;
        Ok(ClippedStepOutput { losses, clip })
    }
}

/// Implements [`Model`] for a wrapper type by delegating every method to its field `$field`
/// (a family that is a configuration of a shared-block model, e.g. [`crate::OlmoeDecoder`]).
macro_rules! delegate_model {
    ($ty:ty, $field:ident) => {
        impl $crate::model::Model for $ty {
            fn var_store(&self) -> &tch::nn::VarStore {
                self.$field.var_store()
            }
            fn var_store_mut(&mut self) -> &mut tch::nn::VarStore {
                self.$field.var_store_mut()
            }
            fn vocab_size(&self) -> i64 {
                self.$field.vocab_size()
            }
            fn task(&self) -> $crate::batch::Task {
                self.$field.task()
            }
            fn num_labels(&self) -> Option<i64> {
                self.$field.num_labels()
            }
            fn moe_shape(&self) -> Option<$crate::model::MoeShape> {
                self.$field.moe_shape()
            }
            fn expert_capacity(&self) -> Option<i64> {
                self.$field.expert_capacity()
            }
            fn linears_mut(&mut self) -> (&tch::nn::VarStore, Vec<&mut $crate::layers::Linear>) {
                self.$field.linears_mut()
            }
            fn router_params(&self) -> Vec<String> {
                self.$field.router_params()
            }
            fn hf_config_json(&self) -> Option<serde_json::Value> {
                self.$field.hf_config_json()
            }
            fn forward(
                &self,
                batch: &$crate::batch::Batch,
                ctx: &mut $crate::layers::ForwardCtx,
            ) -> $crate::error::Result<tch::Tensor> {
                self.$field.forward(batch, ctx)
            }
        }
    };
}
pub(crate) use delegate_model;
