//! Subcommands of the `raptor` program (this binary's modules, not part of the `raptor_train`
//! library: they use `anyhow`, the library has one `thiserror` enum). Each module owns one
//! subcommand (its clap `Args` and its `run` function); `main.rs` only dispatches.

use std::io::Write;

// `account`, `calibrate`, `plan` and `routing` are `raptor_cli`'s (shared with the
// libtorch-free `raptor-acct`); `main.rs` embeds its `Command` enum.
pub mod audit;
pub mod export;
pub mod init;
pub mod progress;
pub mod train;
pub mod upcycle;

/// Exit code for bad input (invalid arguments, malformed files): errors go to stderr.
pub const EXIT_BAD_INPUT: i32 = raptor_cli::EXIT_BAD_INPUT;

/// Print a value as one JSON object on stdout (the `--json` form of every subcommand).
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

/// The progress bar of a training subcommand (`train`, `audit`): hidden with `--json`, so
/// stdout holds only the JSON object.
pub(crate) fn update_bar(hidden: bool) -> indicatif::ProgressBar {
    if hidden {
        return indicatif::ProgressBar::hidden();
    }
    let b = indicatif::ProgressBar::new(0);
    b.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} updates  {msg}  ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    b
}
