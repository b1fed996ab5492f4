//! `raptor-acct`: privacy accounting, σ calibration, RAPTOR budget plans and routing diagnostics,
//! without libtorch (the same subcommands as the `raptor` program).

use clap::Parser;

/// Certified privacy accounting for DP training (Poisson-subsampled Gaussian, PRV bounds with an
/// RDP cross-check), σ calibration, RAPTOR budget plans and MoE routing diagnostics.
///
/// Every subcommand takes `--json` for one JSON object on stdout; errors go to stderr with exit
/// code 2.
#[derive(Debug, Parser)]
#[command(name = "raptor-acct", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: raptor_cli::Command,
}

fn main() {
    let cli = Cli::parse();
    if let Err(err) = cli.command.run() {
        eprintln!("error: {err}");
        std::process::exit(err.exit_code());
    }
}
