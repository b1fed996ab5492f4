//! Building blocks: linear maps with optional LoRA, norms, embeddings, the forward context.

use crate::error::{ModelError, Result};
use crate::tape::{Part, Rows, Tape};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use std::collections::BTreeMap;
use tch::nn::{Init, VarStore};
use tch::{Kind, Tensor};

/// State of one forward pass: recording for the per-sample engine, training mode (dropout),
/// owner maps for owner-masked experts, router outputs.
#[derive(Debug, Default)]
pub struct ForwardCtx {
    pub(crate) tape: Option<Tape>,
    /// Training mode: LoRA dropout is active.
    pub train: bool,
    /// Owner map per sparse layer (block index → `[B]` i64 owning expert of each record).
    /// When set, expert `e`'s trainable parameters get gradient only from records it owns.
    pub owners: BTreeMap<usize, Tensor>,
    /// Collect router outputs into [`ForwardCtx::routing`].
    pub collect_routing: bool,
    /// Router outputs of the sparse layers, in forward order (when `collect_routing`).
    pub routing: Vec<RouterOutput>,
    /// LoRA adapters whose linear name matches one of these patterns are switched off
    /// (their delta is skipped), e.g. RAPTOR's shared-only logits with expert LoRA disabled.
    pub lora_disabled: Vec<String>,
    /// Seed of this step's LoRA dropout masks. Each record's mask at each adapter is drawn
    /// from a generator keyed by (this seed, the record's id, the adapter's module name), so a
    /// record gets the same mask whether it is run alone or in any batch. `None`: a seed is
    /// drawn from libtorch's global generator at the first dropout of the pass (fresh masks
    /// every step, reproducible under `tch::manual_seed`). Set a new seed per step.
    pub dropout_seed: Option<u64>,
    /// Ids of the batch's records (`[B]`, e.g. their indices in the dataset) keying their
    /// dropout masks; `None`: their positions `0..B` in the batch.
    pub record_ids: Option<Vec<u64>>,
    /// When `Some`, each sparse layer of a MoE-BERT appends (layer, the hidden states `[B, T,
    /// d]` its router reads) here: what `train_bert_routers` of the `upcycle` module trains on.
    pub router_inputs: Option<Vec<(usize, Tensor)>>,
    /// Start the forward pass from cached hidden states instead of the token ids: `(k, h)`,
    /// `h` `[B, T, d]` the output of the embeddings and the first `k` blocks for this batch
    /// (what [`crate::Model::prefix_hidden`] returns, e.g. from a [`crate::PrefixCache`];
    /// rows past a record's length may hold anything finite, zeros in a cache). A model takes
    /// it at the start of its forward pass (the context then holds `None`). Only models whose
    /// [`crate::Model::frozen_prefix`] can return a prefix read it; the others compute from
    /// the token ids as usual.
    pub prefix: Option<(usize, Tensor)>,
}

impl ForwardCtx {
    /// Inference / plain training context (nothing recorded).
    pub fn new(train: bool) -> Self {
        Self {
            train,
            ..Self::default()
        }
    }

    /// Context that records every trainable op for [`crate::PerSampleGrads`].
    pub fn private(train: bool) -> Self {
        Self {
            tape: Some(Tape::default()),
            train,
            ..Self::default()
        }
    }

    /// Sets the owner map of sparse layer `layer` (`owners`: `[B]` i64).
    pub fn with_owners(mut self, layer: usize, owners: Tensor) -> Self {
        self.owners.insert(layer, owners);
        self
    }

    /// Takes the recorded tape (None when the context was not built with [`ForwardCtx::private`]).
    pub fn take_tape(&mut self) -> Option<Tape> {
        self.tape.take()
    }

    /// LoRA dropout keep-mask (0/1, the kind of `x`) for the adapter of module `site` over
    /// input rows `x` (`[B, ..., in]` or routed `[N, in]`). Record r's rows draw their mask
    /// row-major from a ChaCha8 stream keyed by (seed, record id, site), so the mask of a
    /// record's first rows does not depend on the batch it is in.
    pub(crate) fn dropout_keep_mask(
        &mut self,
        site: &str,
        x: &Tensor,
        rows: RowSpec<'_>,
        p: f64,
    ) -> Result<Tensor> {
        if self.recording() && self.record_ids.is_none() {
            // Keyed by batch position, a record's mask would depend on which other records
            // were sampled before it: its sensitivity would no longer be its own.
            return Err(ModelError::InvalidConfig(format!(
                "LoRA dropout at {site} in private training needs the records' dataset ids \
                 (ClippedStep::with_record_ids / ForwardCtx::record_ids), so that each record's \
                 mask is its own; set dropout to 0 or pass the ids"
            )));
        }
        let seed = match self.dropout_seed {
            Some(s) => s,
            None => {
                let s = Tensor::f_randint(i64::MAX, [1], (Kind::Int64, tch::Device::Cpu))?
                    .f_int64_value(&[0])? as u64;
                self.dropout_seed = Some(s);
                s
            }
        };
        let size = x.size();
        let width = size.last().copied().unwrap_or(1).max(1);
        // (record index in the batch, number of rows) runs, in row order.
        let runs: Vec<(i64, i64)> = match rows {
            RowSpec::Dense => {
                let b = size.first().copied().unwrap_or(0);
                let per = if b > 0 {
                    x.numel() as i64 / (b * width)
                } else {
                    0
                };
                (0..b).map(|r| (r, per)).collect()
            }
            RowSpec::Routed(rec) => {
                let rec: Vec<i64> = Vec::try_from(rec.f_to(tch::Device::Cpu)?)?;
                let mut runs: Vec<(i64, i64)> = Vec::new();
                for r in rec {
                    match runs.last_mut() {
                        Some((last, n)) if *last == r => *n += 1,
                        _ => runs.push((r, 1)),
                    }
                }
                runs
            }
        };
        let site_key = fnv1a64(site.as_bytes());
        let mut keep: Vec<f32> = Vec::with_capacity(x.numel());
        for (r, n) in runs {
            let id = match &self.record_ids {
                Some(ids) => *ids
                    .get(r as usize)
                    .ok_or_else(|| ModelError::ShapeMismatch {
                        what: "ForwardCtx::record_ids (one id per record of the batch)".into(),
                        expected: vec![r + 1],
                        got: vec![ids.len() as i64],
                    })?,
                None => r as u64,
            };
            let mut key = [0u8; 32];
            key[..8].copy_from_slice(&seed.to_le_bytes());
            key[8..16].copy_from_slice(&id.to_le_bytes());
            key[16..24].copy_from_slice(&site_key.to_le_bytes());
            key[24..].copy_from_slice(b"loradrop");
            let mut rng = ChaCha8Rng::from_seed(key);
            for _ in 0..n * width {
                // 24 random bits → a uniform in [0, 1) exactly representable in f32.
                let u = f64::from(rng.next_u32() >> 8) / f64::from(1u32 << 24);
                keep.push(if u >= p { 1.0 } else { 0.0 });
            }
        }
        Ok(Tensor::f_from_slice(&keep)?
            .f_reshape(size.as_slice())?
            .f_to_kind(x.kind())?
            .f_to(x.device())?)
    }

    pub(crate) fn recording(&self) -> bool {
        self.tape.is_some()
    }

    /// Records op output `z` (when recording) and returns the tensor to use in its place.
    pub(crate) fn record(&mut self, z: Tensor, rows: Rows, parts: Vec<Part>) -> Result<Tensor> {
        match self.tape.as_mut() {
            Some(t) => t.push(z, rows, parts),
            None => Ok(z),
        }
    }

    /// [`Self::record`] with `z` itself as the handle ([`crate::tape::Tape::push_direct`]).
    pub(crate) fn record_direct(
        &mut self,
        z: Tensor,
        rows: Rows,
        parts: Vec<Part>,
    ) -> Result<Tensor> {
        match self.tape.as_mut() {
            Some(t) => t.push_direct(z, rows, parts),
            None => Ok(z),
        }
    }
}

/// 64-bit FNV-1a hash (stable across runs and platforms).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Whether `name` matches `pattern`: a pattern with `*` is a glob over the whole name (`*`
/// matches any run of characters, dots included); a pattern without `*` matches any name that
/// contains it as a dot-separated component sequence or plain substring.
///
/// ```
/// use raptor_models::name_matches;
/// assert!(name_matches("encoder.block.1.layer.0.SelfAttention.q", "SelfAttention.q"));
/// assert!(name_matches("model.layers.0.mlp.experts.3.up_proj", "*.experts.*.up_proj"));
/// assert!(!name_matches("model.layers.0.mlp.experts.3.up_proj", "*.experts.*.down_proj"));
/// ```
pub fn name_matches(name: &str, pattern: &str) -> bool {
    if !pattern.contains('*') {
        return name.contains(pattern);
    }
    glob_match(pattern, name)
}

/// Creates variable `name` (dot-separated, e.g. `encoder.block.0.layer.0.SelfAttention.q.weight`)
/// in `vs`, so the VarStore path equals the Hugging Face tensor name.
pub(crate) fn new_var(vs: &VarStore, name: &str, dims: &[i64], init: Init) -> Result<Tensor> {
    let comps: Vec<&str> = name.split('.').collect();
    let (last, dirs) = comps
        .split_last()
        .ok_or_else(|| ModelError::InvalidConfig(format!("empty parameter name {name:?}")))?;
    let mut p = vs.root();
    for c in dirs {
        p = p.sub(*c);
    }
    Ok(p.f_var(last, dims, init)?)
}

/// Activation functions used by the supported models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Act {
    /// max(0, x).
    Relu,
    /// Exact (erf) GELU.
    Gelu,
    /// Tanh-approximated GELU (`gelu_new`, GPT-2).
    GeluNew,
    /// x·sigmoid(x) (SwiGLU gate in OLMoE).
    Silu,
}

impl Act {
    /// Parses a Hugging Face activation name (`relu`, `gelu`, `gelu_new`, `gelu_pytorch_tanh`, `silu`, `swish`).
    pub fn from_hf(name: &str) -> Result<Self> {
        match name {
            "relu" => Ok(Act::Relu),
            "gelu" => Ok(Act::Gelu),
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Ok(Act::GeluNew),
            "silu" | "swish" => Ok(Act::Silu),
            other => Err(ModelError::InvalidConfig(format!(
                "unsupported activation {other:?}"
            ))),
        }
    }

    /// The Hugging Face name of the activation (`relu`, `gelu`, `gelu_new`, `silu`).
    pub fn hf_name(self) -> &'static str {
        match self {
            Act::Relu => "relu",
            Act::Gelu => "gelu",
            Act::GeluNew => "gelu_new",
            Act::Silu => "silu",
        }
    }

    pub(crate) fn apply(self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Act::Relu => x.f_relu()?,
            Act::Gelu => x.f_gelu("none")?,
            Act::GeluNew => x.f_gelu("tanh")?,
            Act::Silu => x.f_silu()?,
        })
    }
}

/// LoRA adapter `ΔW = (α/r)·B·A` on a linear map (A `[r, in]` Kaiming-uniform with a=√5, B `[out, r]` zero).
#[derive(Debug)]
pub struct Lora {
    /// `lora_A.weight` `[r, in]`.
    pub a: Tensor,
    /// `lora_B.weight` `[out, r]`.
    pub b: Tensor,
    /// α / r.
    pub scale: f64,
    /// Dropout on the adapter input (training mode only).
    pub dropout: f64,
}

/// How a linear map's rows map to records (dense `[B, T, in]` or routed tokens).
#[derive(Debug, Clone, Copy)]
pub(crate) enum RowSpec<'a> {
    Dense,
    Routed(&'a Tensor),
}

impl RowSpec<'_> {
    fn rows(&self) -> Rows {
        match self {
            RowSpec::Dense => Rows::Dense,
            RowSpec::Routed(r) => Rows::Routed {
                rec: r.shallow_clone(),
            },
        }
    }
}

/// Keeps the value of `x` but lets gradient through only where `mask` is 1:
/// `mask·x + (1−mask)·x.detach()`.
pub(crate) fn owner_masked(x: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let det = x.f_detach()?;
    Ok(det.f_add(&x.f_sub(&det)?.f_mul(mask)?)?)
}

/// A linear map `y = x Wᵀ + b` (PyTorch layout, W `[out, in]`) with an optional LoRA adapter.
#[derive(Debug)]
pub struct Linear {
    /// Hugging Face module name (parameters are `{name}.weight`, `{name}.bias`).
    pub name: String,
    /// Weight `[out, in]`.
    pub weight: Tensor,
    /// Optional bias `[out]`.
    pub bias: Option<Tensor>,
    /// Optional LoRA adapter.
    pub lora: Option<Lora>,
}

impl Linear {
    /// Names of its own parameters: `{name}.weight`, and `{name}.bias` when it has a bias
    /// (not those of a LoRA adapter).
    pub(crate) fn param_names(&self) -> Vec<String> {
        let mut v = vec![format!("{}.weight", self.name)];
        if self.bias.is_some() {
            v.push(format!("{}.bias", self.name));
        }
        v
    }

    pub(crate) fn new(
        vs: &VarStore,
        name: &str,
        in_dim: i64,
        out_dim: i64,
        bias: bool,
        std: f64,
    ) -> Result<Self> {
        let weight = new_var(
            vs,
            &format!("{name}.weight"),
            &[out_dim, in_dim],
            Init::Randn {
                mean: 0.0,
                stdev: std,
            },
        )?;
        let bias = if bias {
            Some(new_var(
                vs,
                &format!("{name}.bias"),
                &[out_dim],
                Init::Const(0.0),
            )?)
        } else {
            None
        };
        Ok(Self {
            name: name.to_string(),
            weight,
            bias,
            lora: None,
        })
    }

    /// Input features.
    pub fn in_features(&self) -> i64 {
        self.weight.size().get(1).copied().unwrap_or(0)
    }

    /// Output features.
    pub fn out_features(&self) -> i64 {
        self.weight.size().first().copied().unwrap_or(0)
    }

    /// Adds a LoRA adapter (variables `{name}.lora_A.weight`, `{name}.lora_B.weight`).
    pub(crate) fn attach_lora(
        &mut self,
        vs: &VarStore,
        r: i64,
        alpha: f64,
        dropout: f64,
    ) -> Result<()> {
        if self.lora.is_some() {
            return Err(ModelError::InvalidConfig(format!(
                "{} already has a LoRA adapter",
                self.name
            )));
        }
        let fan_in = self.in_features();
        // Kaiming-uniform with a = √5: gain √(2/(1+5)), bound gain·√(3/fan_in) = 1/√fan_in.
        let bound = 1.0 / (fan_in as f64).sqrt();
        let a = new_var(
            vs,
            &format!("{}.lora_A.weight", self.name),
            &[r, fan_in],
            Init::Uniform {
                lo: -bound,
                up: bound,
            },
        )?;
        let b = new_var(
            vs,
            &format!("{}.lora_B.weight", self.name),
            &[self.out_features(), r],
            Init::Const(0.0),
        )?;
        // Follow the base weight's kind and device (the VarStore may have been converted).
        let (kind, device) = (self.weight.kind(), self.weight.device());
        let (mut a, mut b) = (a, b);
        if a.kind() != kind || a.device() != device {
            let na = a.f_to_kind(kind)?.f_to(device)?;
            let nb = b.f_to_kind(kind)?.f_to(device)?;
            tch::no_grad(|| -> Result<()> {
                a.f_set_data(&na)?;
                b.f_set_data(&nb)?;
                Ok(())
            })?;
        }
        self.lora = Some(Lora {
            a,
            b,
            scale: alpha / r as f64,
            dropout,
        });
        Ok(())
    }

    /// `x [.., in]` → `[.., out]`; records trainable uses when the context is private.
    /// `mask` (broadcastable to the output, 1 = owner) applies owner masking to the trainable
    /// parts (the LoRA delta, or the whole output when the base weight itself is trained).
    pub(crate) fn forward_rows(
        &self,
        x: &Tensor,
        ctx: &mut ForwardCtx,
        rows: RowSpec<'_>,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let mut z = x.f_linear(&self.weight, self.bias.as_ref())?;
        let w_tr = self.weight.requires_grad();
        let b_tr = self.bias.as_ref().is_some_and(Tensor::requires_grad);
        if ctx.recording() && (w_tr || b_tr) {
            let mut parts = Vec::new();
            if w_tr {
                parts.push(Part::Weight {
                    param: format!("{}.weight", self.name),
                    a: x.f_detach()?,
                });
            }
            if b_tr {
                parts.push(Part::Bias {
                    param: format!("{}.bias", self.name),
                });
            }
            z = ctx.record(z, rows.rows(), parts)?;
        }
        if let Some(m) = mask
            && (w_tr || b_tr)
        {
            z = owner_masked(&z, m)?;
        }
        if let Some(l) = &self.lora {
            if ctx
                .lora_disabled
                .iter()
                .any(|p| name_matches(&self.name, p))
            {
                return Ok(z);
            }
            let xd = if ctx.train && l.dropout > 0.0 {
                let keep = ctx.dropout_keep_mask(&self.name, x, rows, l.dropout)?;
                x.f_mul(&keep)?.f_mul_scalar(1.0 / (1.0 - l.dropout))?
            } else {
                x.shallow_clone()
            };
            let mut u = xd.f_linear(&l.a, None::<&Tensor>)?;
            if ctx.recording() && l.a.requires_grad() {
                let parts = vec![Part::Weight {
                    param: format!("{}.lora_A.weight", self.name),
                    a: xd.f_detach()?,
                }];
                u = ctx.record_direct(u, rows.rows(), parts)?;
            }
            // The scale goes on the r-wide `u` rather than on the out-wide product: one pass
            // over an [rows, r] tensor instead of one over [rows, out]. B's recorded input is
            // then the scaled `u` (∂L/∂B = Σ ∂L/∂δᵀ (s·u) for δ = (s·u)Bᵀ).
            let us = u.f_mul_scalar(l.scale)?;
            let mut delta = us.f_linear(&l.b, None::<&Tensor>)?;
            if ctx.recording() && l.b.requires_grad() {
                let parts = vec![Part::Weight {
                    param: format!("{}.lora_B.weight", self.name),
                    a: us.f_detach()?,
                }];
                delta = ctx.record_direct(delta, rows.rows(), parts)?;
            }
            if let Some(m) = mask {
                delta = owner_masked(&delta, m)?;
            }
            z = z.f_add(&delta)?;
        }
        Ok(z)
    }

    /// Dense forward over `[B, ...]` rows.
    pub(crate) fn forward(&self, x: &Tensor, ctx: &mut ForwardCtx) -> Result<Tensor> {
        self.forward_rows(x, ctx, RowSpec::Dense, None)
    }
}

/// RMS layer norm without bias or centering (T5 / Switch / OLMoE): `w ⊙ x / √(mean(x²)+ε)`.
#[derive(Debug)]
pub struct RmsNorm {
    /// Module name (parameter `{name}.weight`).
    pub name: String,
    /// Gain `[d]`.
    pub weight: Tensor,
    /// ε.
    pub eps: f64,
}

impl RmsNorm {
    pub(crate) fn new(vs: &VarStore, name: &str, dim: i64, eps: f64) -> Result<Self> {
        Ok(Self {
            name: name.to_string(),
            weight: new_var(vs, &format!("{name}.weight"), &[dim], Init::Const(1.0))?,
            eps,
        })
    }

    pub(crate) fn forward(&self, x: &Tensor, ctx: &mut ForwardCtx) -> Result<Tensor> {
        let var = x
            .f_square()?
            .f_mean_dim(-1, true, None::<Kind>)?
            .f_add_scalar(self.eps)?;
        let n = x.f_mul(&var.f_rsqrt()?)?;
        let y = n.f_mul(&self.weight)?;
        if ctx.recording() && self.weight.requires_grad() {
            let parts = vec![Part::Gain {
                param: format!("{}.weight", self.name),
                n: n.f_detach()?,
            }];
            return ctx.record(y, Rows::Dense, parts);
        }
        Ok(y)
    }
}

/// Layer norm with gain and bias (GPT-2).
#[derive(Debug)]
pub struct LayerNorm {
    /// Module name (parameters `{name}.weight`, `{name}.bias`).
    pub name: String,
    /// Gain `[d]`.
    pub weight: Tensor,
    /// Bias `[d]`.
    pub bias: Tensor,
    /// ε.
    pub eps: f64,
}

impl LayerNorm {
    pub(crate) fn new(vs: &VarStore, name: &str, dim: i64, eps: f64) -> Result<Self> {
        Ok(Self {
            name: name.to_string(),
            weight: new_var(vs, &format!("{name}.weight"), &[dim], Init::Const(1.0))?,
            bias: new_var(vs, &format!("{name}.bias"), &[dim], Init::Const(0.0))?,
            eps,
        })
    }

    pub(crate) fn forward(&self, x: &Tensor, ctx: &mut ForwardCtx) -> Result<Tensor> {
        let record = ctx.recording() && (self.weight.requires_grad() || self.bias.requires_grad());
        if !record {
            // libtorch's fused layer norm (autograd handles trained gains outside a recording
            // context); the explicit form below exists to record the normalized input.
            let d = x.size().last().copied().unwrap_or(0);
            return Ok(x.f_layer_norm(
                [d].as_slice(),
                Some(&self.weight),
                Some(&self.bias),
                self.eps,
                true,
            )?);
        }
        let mu = x.f_mean_dim(-1, true, None::<Kind>)?;
        let xc = x.f_sub(&mu)?;
        let var = xc
            .f_square()?
            .f_mean_dim(-1, true, None::<Kind>)?
            .f_add_scalar(self.eps)?;
        let n = xc.f_mul(&var.f_rsqrt()?)?;
        let y = n.f_mul(&self.weight)?.f_add(&self.bias)?;
        if ctx.recording() {
            let mut parts = Vec::new();
            if self.weight.requires_grad() {
                parts.push(Part::Gain {
                    param: format!("{}.weight", self.name),
                    n: n.f_detach()?,
                });
            }
            if self.bias.requires_grad() {
                parts.push(Part::Bias {
                    param: format!("{}.bias", self.name),
                });
            }
            return ctx.record(y, Rows::Dense, parts);
        }
        Ok(y)
    }
}

/// Token (or position) embedding table `[V, d]`.
#[derive(Debug)]
pub struct Embedding {
    /// Module name (parameter `{name}.weight`).
    pub name: String,
    /// Table `[V, d]`.
    pub weight: Tensor,
}

impl Embedding {
    pub(crate) fn new(vs: &VarStore, name: &str, vocab: i64, dim: i64, std: f64) -> Result<Self> {
        Ok(Self {
            name: name.to_string(),
            weight: new_var(
                vs,
                &format!("{name}.weight"),
                &[vocab, dim],
                Init::Randn {
                    mean: 0.0,
                    stdev: std,
                },
            )?,
        })
    }

    /// Number of rows V.
    pub fn num_embeddings(&self) -> i64 {
        self.weight.size().first().copied().unwrap_or(0)
    }

    pub(crate) fn forward(&self, ids: &Tensor, ctx: &mut ForwardCtx) -> Result<Tensor> {
        let z = Tensor::f_embedding(&self.weight, ids, -1, false, false)?;
        if ctx.recording() && self.weight.requires_grad() {
            let parts = vec![Part::Embedding {
                param: format!("{}.weight", self.name),
                ids: ids.shallow_clone(),
                vocab: self.num_embeddings(),
            }];
            return ctx.record(z, Rows::Dense, parts);
        }
        Ok(z)
    }
}

/// Additive attention mask value for a float kind (most negative finite value).
pub(crate) fn mask_min(kind: Kind) -> f64 {
    match kind {
        Kind::Double => f64::MIN,
        Kind::Half => -65504.0,
        Kind::BFloat16 => -3.3895313892515355e38,
        _ => f32::MIN as f64,
    }
}

/// `*`-wildcard match of a whole name (`*` matches any run of characters, dots included).
///
/// ```
/// use raptor_models::checkpoint::glob_match; // also `raptor_models::layers::glob_match`
/// assert!(glob_match("*.attn.c_attn.weight", "transformer.h.3.attn.c_attn.weight"));
/// assert!(glob_match("decoder.*", "decoder.block.0.layer.0.SelfAttention.q.weight"));
/// assert!(!glob_match("*.attn.c_attn.weight", "transformer.h.3.attn.c_attn.lora_A.weight"));
/// ```
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, s) = (pattern.as_bytes(), name.as_bytes());
    let (mut pi, mut si) = (0usize, 0usize);
    let (mut star, mut mark) = (None::<usize>, 0usize);
    while si < s.len() {
        if pi < p.len() && p[pi] != b'*' && p[pi] == s[si] {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            mark = si;
            pi += 1;
        } else if let Some(st) = star {
            pi = st + 1;
            mark += 1;
            si = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

/// One sparse layer's router decisions, in the form `raptor-routing` takes
/// (`LayerRouting::push_tensors(&indices, &weights, &mask)`).
#[derive(Debug)]
pub struct RouterOutput {
    /// Block / layer index of the sparse layer.
    pub layer: usize,
    /// Selected experts `[B, T, k]` (i64).
    pub indices: Tensor,
    /// Gate weights `[B, T, k]` (the weights that multiply the expert outputs).
    pub weights: Tensor,
    /// Valid-token mask `[B, T]` (the batch's attention mask).
    pub mask: Tensor,
}

/// Whether `name` matches any of `patterns` ([`glob_match`]).
pub(crate) fn any_match(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|p| glob_match(p, name))
}
