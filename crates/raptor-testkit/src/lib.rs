//! Test support shared by the tests of the workspace's crates: what several crates' tests used to
//! carry a copy of.
//!
//! - [`fuzz`]: the case count of every no-panic fuzz harness ([`fuzz::fuzz_cases`], read from
//!   `RAPTOR_FUZZ_CASES`) and the byte generators those harnesses feed to parsers.
//! - [`argv`]: the words of a `clap` program's command lines and arbitrary command lines drawn
//!   from them, for the argument-parser harnesses of `raptor-acct`, `raptor` and
//!   `raptor-reproduce`.
//! - [`bad_inputs`]: the check of a crate's corpus of nasty inputs under
//!   `fixtures/bad-inputs/<crate>/` (each file gives an error whose message holds the text listed
//!   for it; every file is listed).
//! - [`golden`]: golden JSON files under `fixtures/` and the arrays in them.
//! - [`paths`]: the workspace root, fixtures, and the shared data folder beside the workspace.
//! - [`toy`]: the toy run config of the trainer's and the `raptor` program's tests.
//!
//! The crate is a `[dev-dependencies]` entry only (and serves `#[cfg(test)]` modules): no
//! library or program depends on it for its normal build, which `cargo xtask test` checks. It
//! has no libtorch and no error type: **its checks panic** with a message saying what failed,
//! which is how a test fails. A misconfiguration (a `RAPTOR_FUZZ_CASES` that is not a positive
//! whole number, a malformed `expected.tsv`) panics too, rather than silently testing less.
#![allow(clippy::panic)]

pub mod argv;
pub mod bad_inputs;
pub mod fuzz;
pub mod golden;
pub mod paths;
pub mod toy;

pub use fuzz::fuzz_cases;

/// The README's example, compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
