//! raptor-muon: Newton–Schulz orthogonalization, Muon momentum and the DP-MuonBC bias
//! correction (DP-Muon: per-matrix clipping, one noise multiplier on the joint sensitivity,
//! momentum and Newton–Schulz as post-processing). See the crate README for usage, benchmarks
//! and limits.
//!
//! - [`ns`]: Newton–Schulz (Keller's quintic and the Taylor family `p_κ`), pure Rust on faer,
//!   with symmetric (one-triangle) Gram products.
//! - [`momentum`]: heavy-ball, EMA and Nesterov momentum (their coefficients, the closed form
//!   [`update_weights`]), lr adjustment, weight decay, [`Muon`]. The one definition of the
//!   momentum forms: `raptor-optim`'s tensor optimizers take their coefficients from here.
//! - [`bc`]: DP-MuonBC — exact buffer noise variance (closed form and step by step,
//!   [`RunningNoiseVariance`]) and the antithetic bias correction.
//! - [`diagnostics`]: Monte Carlo bias of plain vs corrected directions.
//! - [`mod@reference`]: slow SVD-based references (polar factor, NS applied to singular values).
//! - `tch_backend` (feature `tch`): the same Newton–Schulz on libtorch tensors (CPU/CUDA, f32/bf16).

pub mod bc;
pub mod diagnostics;
pub mod error;
pub mod form;
pub mod momentum;
pub mod ns;
pub mod reference;

pub use bc::{
    BcConfig, BcOutput, Fallback, NoiseSpec, RunningNoiseVariance, bias_corrected_direction,
    buffer_noise_variance, probe_rng_os, probe_rng_seeded,
};
pub use error::MuonError;
pub use momentum::{
    LookAhead, LrAdjust, MomentumCoefficients, MomentumForm, Muon, MuonConfig, momentum_update,
    update_weights,
};
pub use ns::{
    Normalization, NsConfig, NsPolynomial, NsProducts, NsSchedule, NsWorkspace, newton_schulz,
    newton_schulz_batch, newton_schulz_slice, newton_schulz_with, planned_ns_schedule,
    with_ns_schedule,
};

#[cfg(feature = "tch")]
pub mod tch_backend;
#[cfg(feature = "tch")]
pub use tch_backend::{TchPrecision, newton_schulz_tch, newton_schulz_tch_batch};

/// Re-export of the faer version used in the public API (`faer::Mat`, `faer::MatRef`).
pub use faer;
