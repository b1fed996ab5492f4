//! Subcommands of the `raptor` program. Each module owns one subcommand (its clap `Args` and its
//! `run` function); `main.rs` only dispatches.

use std::io::Write;

/// `account`, `calibrate` and `plan` (shared with the libtorch-free `raptor-acct`).
pub use raptor_cli::account;
/// `routing` (shared with the libtorch-free `raptor-acct`).
pub use raptor_cli::routing;
pub mod audit;
pub mod train;

/// Exit code for bad input (invalid arguments, malformed files): errors go to stderr.
pub const EXIT_BAD_INPUT: i32 = raptor_cli::EXIT_BAD_INPUT;

/// Print a value as one JSON object on stdout (the `--json` form of every subcommand).
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}
