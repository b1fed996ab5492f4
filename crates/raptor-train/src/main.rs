//! `raptor`: the command-line program of the raptor workspace.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use raptor_train::{cli, reproduce};

/// Differentially private fine-tuning of Mixture-of-Experts and dense transformers.
#[derive(Debug, Parser)]
#[command(name = "raptor", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The subcommands. Each one's arguments and logic live in `raptor_train::cli::<name>` or
/// `raptor_cli`.
#[derive(Debug, Subcommand)]
enum Command {
    /// Print the build information: versions, libtorch, CUDA availability.
    Info,
    /// Run the reproduction tables (what `cargo xtask reproduce` runs).
    Reproduce {
        /// Output folder for the Markdown and JSON tables.
        #[arg(long, default_value = "results")]
        out: PathBuf,
        /// Repository root (fixtures are read from `<root>/fixtures`).
        #[arg(long, default_value = ".")]
        root: PathBuf,
        /// Smaller sizes and fewer repetitions.
        #[arg(long)]
        quick: bool,
        /// Run only these parts (default: all).
        #[arg(long = "only")]
        only: Vec<String>,
    },
    /// Train privately from a config file (RAPTOR, its baselines, DP-SGD/Adam/Muon/MuonBC).
    Train(cli::train::TrainArgs),
    /// Evaluate a run folder on a data file.
    Eval(cli::train::EvalArgs),
    /// `account`, `calibrate`, `plan` and `routing`: the libtorch-free subcommands of
    /// `raptor_cli` (also the `raptor-acct` program).
    #[command(flatten)]
    Acct(raptor_cli::Command),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info => info(),
        Command::Reproduce {
            out,
            root,
            quick,
            only,
        } => reproduce::run(&reproduce::Context { root, out, quick }, &only).map(|_| ()),
        Command::Train(args) => cli::train::run_train(args),
        Command::Eval(args) => cli::train::run_eval(args),
        Command::Acct(command) => command.run().map_err(anyhow::Error::from),
    };
    if let Err(err) = result {
        eprintln!("error: {err:#}");
        std::process::exit(cli::EXIT_BAD_INPUT);
    }
}

fn info() -> anyhow::Result<()> {
    println!("raptor {}", env!("CARGO_PKG_VERSION"));
    println!("tch 0.24.0 / libtorch 2.11.0");
    println!("cuda linked: {}", raptor_models::CUDA_LINKED);
    println!("cuda available: {}", tch::Cuda::is_available());
    println!("cuda devices: {}", tch::Cuda::device_count());
    Ok(())
}
