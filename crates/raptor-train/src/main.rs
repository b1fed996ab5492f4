//! `raptor`: the command-line program of the raptor workspace.

use clap::{Parser, Subcommand};
use raptor_train::cli;

/// Differentially private fine-tuning of Mixture-of-Experts and dense transformers.
#[derive(Debug, Parser)]
#[command(name = "raptor", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Print the build information: versions, libtorch, CUDA availability.
    Info,
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info => info(),
    };
    if let Err(err) = result {
        eprintln!("error: {err:#}");
        std::process::exit(cli::EXIT_BAD_INPUT);
    }
}

fn info() -> anyhow::Result<()> {
    println!("raptor {}", env!("CARGO_PKG_VERSION"));
    println!("libtorch: tch {}", "0.24.0");
    println!("cuda available: {}", tch::Cuda::is_available());
    println!("cuda devices: {}", tch::Cuda::device_count());
    Ok(())
}
