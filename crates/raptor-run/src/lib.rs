//! raptor-run: everything around the private step — preparing a run (data, tokenizer, model,
//! owners, plan: [`session`]), running it in a run folder (checkpoints, resume, the ledger written
//! before each update is applied; the run loop at the crate root: [`train`], [`train_with`],
//! [`train_in`], [`train_prepared`]), recording it (`record.json` and the run's `private/`
//! folder: [`record`], [`summary`]), evaluating and exporting a finished run ([`export`]), the
//! start report ([`launch`]), RAPTOR's diagnostics gathered from the model ([`diagnostics`]),
//! clip bounds calibrated on public data ([`public_clip`]), the device ([`device`]) and the
//! public router text of sparse upcycling ([`upcycle`]).
//!
//! The private step itself — the config and its validator, the streams, the method → plan
//! function and the trainer — is crate `raptor-train`, below this one. The `raptor` program
//! (crate `raptor`), the audit (`raptor-audit`) and the experiment driver (`raptor-reproduce`)
//! are built on this crate.

pub mod device;
pub mod diagnostics;
pub mod error;
pub mod launch;
pub mod memory;
pub mod prefix;
pub mod public_clip;
mod run;
pub mod session;
pub mod upcycle;

pub use error::{Result, RunError};
pub use run::*;

/// The README's examples, compiled (and run where not `no_run`) as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
