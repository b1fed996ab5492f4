//! # raptor-clip
//!
//! Per-example clipping kernels for differentially private training, clipped sums, and the
//! Gaussian privatizer with public denominators.
//!
//! - [`clip_rows`]: gradients as rows of a `B × P` matrix, one bound, optional weight-then-clip.
//! - [`clip_blocks`]: gradients as a list of named blocks, in every [`Grouping`]: flat,
//!   grouped (each group its own bound), per-block (DP-Muon's per-matrix bounds) and
//!   global-over-groups (one factor from the norm over all groups).
//! - [`Privatizer`]: clipped sum + N(0, (σΔ)²) divided by a [`PublicDenominator`]; noise from
//!   ChaCha20 seeded by the OS unless a seed is explicitly requested (not for production).
//! - `tensor` and `linear` (feature `tch`): the same clipping on libtorch tensors (CPU or CUDA,
//!   the device of the inputs) and the ghost-norm / book-keeping kernels for linear layers.
//!
//! The slice kernel is fused: each record's rows are read from memory once; the norm is
//! computed and the scaled row accumulated while the row is still in cache (see the crate
//! README for measured throughput against libtorch's two-pass norm-then-mv).

mod error;
mod kernel;
mod privatizer;
mod slice;

#[cfg(feature = "tch")]
pub mod linear;
#[cfg(feature = "tch")]
pub mod tensor;

pub use error::ClipError;
pub use kernel::stream_read_sum;
pub use privatizer::{Privatizer, PublicDenominator, Release, ReleasedBlock};
pub use slice::{
    Block, BlockClipOutput, ClipOutput, Group, Grouping, clip_blocks, clip_rows, joint_sensitivity,
};
