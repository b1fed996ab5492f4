//! raptor-train: trainers, privacy plans, run records and the `raptor` program.
//!
//! The command-line program lives in `src/main.rs`; each subcommand is a module of [`cli`];
//! `raptor reproduce` (behind `cargo xtask reproduce`) is in [`reproduce`].

pub mod cli;
pub mod reproduce;
