//! # raptor-clip
//!
//! Per-example clipping kernels for differentially private training, clipped sums, and the
//! Gaussian privatizer with public denominators.
//!
//! - [`clip_rows`]: gradients as rows of a `B × P` matrix, one bound, optional weight-then-clip.
//! - [`clip_blocks`]: gradients as a list of named blocks, in every [`Grouping`]: flat,
//!   grouped (each group its own bound), per-block (DP-Muon's per-matrix bounds) and
//!   global-over-groups (one factor from the norm over all groups).
//! - [`ParamGroups`] and [`ClipPolicy`]: grouped clipping by parameter name (which group each
//!   parameter is in, each group's bound or one global bound), with groups keyed by the
//!   caller's own type ([`GroupKey`]: e.g. an enum of streams), the one definition the model
//!   adapters' per-sample engine and these kernels share ([`ParamGroups::grouping`] gives the
//!   kernels' block-index [`Grouping`] and each position's key); a release's sensitivity comes
//!   from it.
//! - [`Privatizer`]: clipped sum + N(0, (σΔ)²) divided by a [`PublicDenominator`]; noise from
//!   ChaCha20 seeded by the OS unless a seed is explicitly requested (not for production).
//! - `tensor` and `linear` (feature `tch`): the same clipping on libtorch tensors (CPU or CUDA,
//!   the device of the inputs) and the ghost-norm / book-keeping kernels for linear layers;
//!   `tensor::ClippedSum` → `Privatizer::release_clipped` → `tensor::TensorRelease` is the
//!   typed release of the training path.
//!
//! The slice kernels plan for the machine they run on ([`plan`]): the fused pipelines (each
//! record's rows read from memory once; the norm is computed and the scaled row accumulated
//! while the row is still in cache) and libtorch's two-pass norms-then-`Gᵀf` schedule are
//! timed on the first call of each shape class with the caller's data, the fastest kept (and
//! optionally saved to a wisdom file, `RAPTOR_WISDOM`). Cache sizes are read at run time. The
//! schedules agree within f32 rounding (see [`plan`] for the tolerance and why a timing-based
//! choice is harmless for privacy). See the crate README for measured speed against libtorch.
//!
//! # Example
//!
//! ```
//! use raptor_clip::{Block, Grouping, Privatizer, PublicDenominator, clip_blocks};
//! # fn main() -> Result<(), raptor_clip::ClipError> {
//! let (b, shared_w, expert_w) = (3, 4, 2);
//! let shared = vec![0.1f32; b * shared_w]; // B × 4 per-example gradients of the shared stream
//! let expert = vec![0.5f32; b * expert_w]; // B × 2 of expert 0 (zero rows for non-owned records)
//! let blocks = [Block::new("attn.lora", &shared, shared_w), Block::new("expert0", &expert, expert_w)];
//! let grouping = Grouping::Grouped {
//!     groups: vec![vec![0], vec![1]], // group 0: the shared block; group 1: expert 0's
//!     bounds: vec![1.0, 0.5],
//! };
//! let residual_weights = [1.0, 0.3, 0.0]; // weight-then-clip
//! let clipped = clip_blocks(&blocks, &grouping, Some(&residual_weights))?;
//! let mut privatizer = Privatizer::new(1.1)?; // σ; ChaCha20 seeded from the OS
//! let shared_release = privatizer.release_group(&clipped, 0, PublicDenominator::new(64.0)?)?;
//! let expert_release = privatizer.release_group(&clipped, 1, PublicDenominator::new(16.0)?)?;
//! assert_eq!(shared_release.blocks()[0].values().len(), 4);
//! assert_eq!(expert_release.sensitivity(), 0.5);
//! assert!(!expert_release.is_seeded_insecure());
//! # Ok(())
//! # }
//! ```

mod error;
mod grouping;
mod kernel;
pub mod plan;
mod privatizer;
pub mod routed;
mod slice;
pub mod workload;

#[cfg(feature = "tch")]
pub mod linear;
#[cfg(feature = "tch")]
pub mod tensor;

pub use error::ClipError;
pub use grouping::{ClipPolicy, GroupKey, ParamGroups};
pub use kernel::stream_read_sum;
pub use privatizer::{
    NOISE_CHUNK, Privatizer, PublicDenominator, Release, ReleasedBlock, SEEDED_WARNING,
};
pub use slice::{
    Block, BlockClipOutput, ClipOutput, Grouping, clip_blocks, clip_rows, joint_sensitivity,
};
