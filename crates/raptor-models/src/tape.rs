//! Forward-pass recording for the per-sample gradient engine.
//!
//! Every trainable op records one [`Site`]: its output tensor `z` (whose gradient the engine
//! asks autograd for, in one backward call over all sites) and, per trainable parameter it
//! uses, what is needed to turn `∂L/∂z` into per-record gradients without materializing them:
//! the input activation of a linear map, the token ids of an embedding lookup, the normalized
//! input of a norm gain, the bucket map of the T5 relative attention bias.

use crate::error::Result;
use tch::Tensor;

/// How the rows of a site's output map to records.
#[derive(Debug)]
pub(crate) enum Rows {
    /// `z` is `[B, ...]`: the leading dimension is the record.
    Dense,
    /// `z` is `[N, out]` over routed tokens; `rec[n]` (i64, ascending) is the record of row n.
    Routed {
        /// Record index of each row, sorted ascending.
        rec: Tensor,
    },
}

/// One trainable parameter's use inside a site.
#[derive(Debug)]
pub(crate) enum Part {
    /// `z = a Wᵀ (+ ...)`: per-record grad `Σ_t g_t a_tᵀ` (`[out, in]`).
    Weight { param: String, a: Tensor },
    /// `z = ... + b`: per-record grad `Σ_t g_t`.
    Bias { param: String },
    /// `z = w ⊙ n (+ ...)`: per-record grad `Σ_t g_t ⊙ n_t`.
    Gain { param: String, n: Tensor },
    /// `z = W[ids]`: per-record grad `Σ_t e_{id_t} g_tᵀ` (`[V, d]`).
    Embedding {
        param: String,
        ids: Tensor,
        vocab: i64,
    },
    /// T5 relative bias: `z[b, h, q, k] = W[bucket[q, k], h]`, per-record grad over buckets.
    Buckets {
        param: String,
        buckets: Tensor,
        num_buckets: i64,
    },
}

impl Part {
    pub(crate) fn param(&self) -> &str {
        match self {
            Part::Weight { param, .. }
            | Part::Bias { param }
            | Part::Gain { param, .. }
            | Part::Embedding { param, .. }
            | Part::Buckets { param, .. } => param,
        }
    }
}

/// A recorded op output and the parameter uses that produced it.
#[derive(Debug)]
pub(crate) struct Site {
    /// Handle whose gradient is `∂L/∂z`: a one-element probe expanded to `z`'s shape
    /// ([`Tape::push`]), or `z` itself ([`Tape::push_direct`]).
    pub(crate) z: Tensor,
    pub(crate) rows: Rows,
    pub(crate) parts: Vec<Part>,
}

/// What a forward pass recorded (see the module docs). Build one with
/// [`crate::ForwardCtx::private`]; hand it to [`crate::PerSampleGrads::compute`].
#[derive(Debug, Default)]
pub struct Tape {
    pub(crate) sites: Vec<Site>,
}

impl Tape {
    /// Records op output `z` and returns the tensor to use downstream in its place:
    /// `z + p`, where `p` is a one-element zero leaf expanded to `z`'s shape. `∂L/∂p` (asked for
    /// at `p`'s expand node) equals `∂L/∂z`, and holding `p` costs one element where holding
    /// `z` would keep the op's whole output alive until the backward, even when autograd itself
    /// would have freed it (outputs that feed only additions, activations saving their own
    /// outputs, ...).
    pub(crate) fn push(&mut self, z: Tensor, rows: Rows, parts: Vec<Part>) -> Result<Tensor> {
        if parts.is_empty() {
            return Ok(z);
        }
        let ones = vec![1i64; z.dim()];
        let leaf =
            Tensor::f_zeros(ones.as_slice(), (z.kind(), z.device()))?.f_set_requires_grad(true)?;
        let probe = leaf.f_expand(z.size(), false)?;
        let out = z.f_add(&probe)?;
        self.sites.push(Site {
            z: probe,
            rows,
            parts,
        });
        Ok(out)
    }

    /// Records op output `z` itself as the handle (autograd is asked for the gradient of a
    /// non-leaf tensor) and returns it unchanged: no extra pass over `z` in the forward, at the
    /// price of keeping `z` alive until the backward. For the LoRA factors' outputs: `u = x Aᵀ`
    /// is `r` wide, and `δ = (s·u) Bᵀ` is what the adapter adds to the frozen output, as wide
    /// as a layer's output, but there the probe's `δ + p` would cost a full extra pass over it
    /// in every forward (a tenth of a private LoRA update on the bench model).
    pub(crate) fn push_direct(
        &mut self,
        z: Tensor,
        rows: Rows,
        parts: Vec<Part>,
    ) -> Result<Tensor> {
        if parts.is_empty() {
            return Ok(z);
        }
        self.sites.push(Site {
            z: z.shallow_clone(),
            rows,
            parts,
        });
        Ok(z)
    }

    /// Number of recorded sites.
    pub fn len(&self) -> usize {
        self.sites.len()
    }

    /// Whether nothing was recorded (no trainable parameter was used).
    pub fn is_empty(&self) -> bool {
        self.sites.is_empty()
    }
}
