//! raptor-cli: the privacy accounting, calibration, budget planning and routing subcommands, with
//! no libtorch.
//!
//! The `raptor-acct` program (this crate's binary) runs them; the `raptor` program (crate
//! `raptor`, which links libtorch for training) embeds the same [`Command`] enum, so both
//! programs have one implementation. Each module owns one subcommand family: its clap `Args`
//! and its `run` function.
//!
//! - [`account`]: `account` (ε of a composition), `calibrate` (σ for a target ε),
//!   `plan` (RAPTOR budget plans);
//! - [`routing`]: owner statistics and layer selection for router outputs of a public corpus.
//!
//! ```
//! use clap::Parser;
//! use raptor_cli::Command;
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(subcommand)]
//!     command: Command,
//! }
//!
//! let cli = Cli::try_parse_from([
//!     "prog", "account", "--q", "0.01", "--sigma", "1", "--steps", "100", "--delta", "1e-5",
//! ])?;
//! assert!(matches!(cli.command, Command::Account(_)));
//! # Ok::<(), clap::Error>(())
//! ```

use std::io::Write;

pub mod account;
pub mod routing;

/// Exit code for bad input (invalid arguments, malformed files, a regime the accountant refuses):
/// the message goes to stderr and nothing to stdout.
pub const EXIT_BAD_INPUT: i32 = 2;

/// Exit code when the result could not be written (stdout closed, for example).
pub const EXIT_OUTPUT: i32 = 1;

/// Everything that can go wrong in a subcommand. Each variant carries the offending value or the
/// underlying error; its message already includes the underlying error's (no separate `source`,
/// so an error-chain printer such as anyhow's `{:#}` does not repeat it).
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// An argument or a combination of arguments is invalid.
    #[error("{0}")]
    InvalidArgument(String),
    /// The accountant rejected the input or cannot handle the regime (its message says which
    /// value and what to do).
    #[error("{context}: {error}")]
    Accountant {
        /// What was being computed.
        context: &'static str,
        /// The accountant's error.
        error: raptor_accountant::AccountantError,
    },
    /// The routing data is malformed or inconsistent.
    #[error("{context}: {error}")]
    Routing {
        /// What was being read or computed.
        context: String,
        /// The routing crate's error.
        error: raptor_routing::RoutingError,
    },
    /// An input file could not be opened.
    #[error("cannot open {path}: {error}")]
    Open {
        /// The file.
        path: String,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The result could not be written to stdout.
    #[error("cannot write the result: {0}")]
    Output(String),
}

impl CliError {
    /// The process exit code for this error: [`EXIT_OUTPUT`] when the result could not be
    /// written, [`EXIT_BAD_INPUT`] otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Output(_) => EXIT_OUTPUT,
            _ => EXIT_BAD_INPUT,
        }
    }

    fn accountant(
        context: &'static str,
    ) -> impl FnOnce(raptor_accountant::AccountantError) -> Self {
        move |error| CliError::Accountant { context, error }
    }
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, CliError>;

/// The subcommands that need no libtorch, for embedding in a clap `Subcommand` enum (with
/// `#[command(flatten)]`) or as the top level of a program.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// ε of a composition of Poisson-subsampled Gaussian mechanisms (PRV bounds and RDP).
    Account(account::AccountArgs),
    /// σ for a target (ε, δ) at sampling rate q over T steps.
    Calibrate(account::CalibrateArgs),
    /// RAPTOR budget plans (additive and joint split) for the shared and expert streams.
    Plan(account::PlanArgs),
    /// Owner statistics and layer selection for router outputs of a public corpus (JSON lines).
    Routing(routing::RoutingArgs),
}

impl Command {
    /// Run the subcommand, printing its result on stdout.
    pub fn run(self) -> Result<()> {
        match self {
            Command::Account(a) => account::run_account(a),
            Command::Calibrate(a) => account::run_calibrate(a),
            Command::Plan(a) => account::run_plan(a),
            Command::Routing(a) => routing::run(a),
        }
    }
}

/// Print a value as one JSON object on stdout (the `--json` form of every subcommand).
pub fn print_json<T: serde::Serialize>(value: &T) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value).map_err(|e| CliError::Output(e.to_string()))?;
    writeln!(out).map_err(|e| CliError::Output(e.to_string()))?;
    Ok(())
}

/// Write text to stdout (a closed stdout is an [`CliError::Output`] error, not a panic as with
/// `println!`).
pub fn print_text(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| CliError::Output(e.to_string()))
}
