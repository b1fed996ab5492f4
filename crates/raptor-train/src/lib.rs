//! raptor-train: trainers, privacy plans, run records and the `raptor` program.
//!
//! The command-line program lives in `src/main.rs`; each subcommand is a module of [`cli`].

pub mod cli;
