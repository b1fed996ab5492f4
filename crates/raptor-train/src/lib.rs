//! raptor-train: the trainer core (one loop for every method), privacy plans, run folders and
//! the `raptor` program.
//!
//! - [`config`]: the run configuration (`run.toml`), every field documented with a default.
//! - [`streams`]: the one description every method is made of (phases of releases over clip
//!   groups) and [`methods`], which turns a config into it (scope, layer, σ's).
//! - [`trainer`]: the loop: Poisson sample, per-record clipping, noise ÷ public denominator,
//!   ledger charged before the update is applied, optimizers ([`optim`]) on released gradients.
//! - [`session`] and [`run`]: data and model preparation, run folders, checkpoints, resume,
//!   evaluation.
//! - [`audit`]: `raptor audit`, the one-run canary audit (an empirical ε lower bound beside the
//!   certified upper bound).
//! - [`cli`]: the subcommands of the `raptor` program; [`reproduce`]: the reproduction tables.

pub mod audit;
pub mod cli;
pub mod config;
pub mod device;
pub mod diagnostics;
pub mod error;
pub mod methods;
pub mod optim;
pub mod reproduce;
pub mod run;
pub mod session;
pub mod streams;
pub mod trainer;

pub use error::{Result, TrainError};

/// The libtorch version this build links (from libtorch itself).
pub fn libtorch_version() -> String {
    "2.11.0".to_string()
}
