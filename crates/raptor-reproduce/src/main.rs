//! `raptor-reproduce`: the experiment driver of the raptor workspace, the program behind
//! `cargo xtask reproduce` (and `raptor reproduce`, which runs it).
//!
//! It runs the parts (see [`driver`]): the building blocks (`environment`, `accountant`,
//! `routing`, `kernels`, `muon`), the papers' tables in miniature (`paper`, `dpmuon`: public
//! pretraining, then the private fine-tuning grid) and the real checkpoints (`backbones`), and
//! writes each table as Markdown and JSON (plots as PNG) under `--out`. The training grid runs
//! in worker processes, each this program started again with its hidden subcommand
//! [`paper::runs::WORKER_COMMAND`].

use raptor_train::config::DeviceSpec;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};

mod accountant;
mod backbones;
mod context;
mod dpmuon;
mod driver;
mod kernels;
mod muon;
mod paper;
mod routing;
#[cfg(test)]
mod tests;

/// Run the reproduction tables of raptor (what `cargo xtask reproduce` runs).
#[derive(Debug, Parser)]
#[command(
    name = "raptor-reproduce",
    version,
    about,
    long_about = None,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    /// The worker of a parallel run (hidden; not for direct use).
    #[command(subcommand)]
    worker: Option<Worker>,
    #[command(flatten)]
    args: ReproduceArgs,
}

/// The flags of a reproduction (those of the former `raptor reproduce`, same names and
/// defaults).
#[derive(Debug, clap::Args)]
struct ReproduceArgs {
    /// Output folder for the Markdown and JSON tables.
    #[arg(long, default_value = "results")]
    out: PathBuf,
    /// Repository root (fixtures are read from `<root>/fixtures`).
    #[arg(long, default_value = ".")]
    root: PathBuf,
    /// Tiny models and a few updates (a smoke test of every part).
    #[arg(long, conflicts_with_all = ["full", "standard"])]
    quick: bool,
    /// The evidence grids behind the README's tables: 8 paired seeds at ε 1 and 8, every
    /// record of the tasks, more updates and ablations (hours on 2 CPU cores; finished runs
    /// are reused). Without a profile flag the same designs run at sizes that fit half an
    /// hour on 2 CPU cores.
    #[arg(long, conflicts_with = "full")]
    standard: bool,
    /// The paper-sized grid (more updates, seeds and larger models; for a GPU or a long CPU
    /// run).
    #[arg(long)]
    full: bool,
    /// Run only these parts (default: all): paper, dpmuon, backbones, environment, accountant,
    /// routing, kernels, muon.
    #[arg(long = "only")]
    only: Vec<String>,
    /// Per-user cache with the corpora of `cargo xtask setup --data` (default:
    /// `$RAPTOR_CACHE_DIR`, `$XDG_CACHE_HOME/raptor` or `~/.cache/raptor`).
    #[arg(long)]
    cache: Option<PathBuf>,
    /// Fallback folder with the data-to-text files (`e2e/`, `dart/`), copied into the cache
    /// when their SHA-256 is the pinned one (before any download); default `<root>/../shared/data`.
    #[arg(long)]
    d2t_data: Option<PathBuf>,
    /// Device of the training runs: `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// Training runs at once, each a worker process with one libtorch thread (default: the CPU
    /// threads; 1 on a GPU).
    #[arg(long)]
    jobs: Option<usize>,
    /// Print the tables as one JSON array on stdout (progress stays on stderr).
    #[arg(long)]
    json: bool,
}

/// The hidden subcommand this program starts itself with for each run of the training grid.
#[derive(Debug, Subcommand)]
enum Worker {
    /// One run of the grid: trains into `--dir` and writes its `summary.json`
    /// ([`paper::run_one`]). Its name is [`paper::runs::WORKER_COMMAND`].
    #[command(name = "run-one", hide = true)]
    RunOne {
        /// The run config (TOML, absolute paths).
        #[arg(long)]
        config: PathBuf,
        /// The run folder.
        #[arg(long)]
        dir: PathBuf,
    },
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.worker {
        Some(Worker::RunOne { config, dir }) => run_one(&config, &dir),
        None => reproduce(cli.args),
    };
    if let Err(err) = result {
        eprintln!("error: {err:#}");
        std::process::exit(raptor_cli::EXIT_BAD_INPUT);
    }
}

/// Runs the parts asked for (all by default).
fn reproduce(a: ReproduceArgs) -> anyhow::Result<()> {
    let d2t_data = a
        .d2t_data
        .unwrap_or_else(|| a.root.join("..").join("shared").join("data"));
    let workers = a.jobs.unwrap_or_else(|| {
        if a.device == DeviceSpec::Cpu {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            1
        }
    });
    driver::run(
        &driver::Context {
            root: a.root,
            out: a.out,
            profile: driver::Profile::from_flags(a.quick, a.standard, a.full),
            cache: a.cache,
            d2t_data,
            device: a.device,
            exe: std::env::current_exe().ok(),
            workers,
            json: a.json,
        },
        &driver::Overrides::default(),
        &a.only,
    )
    .map(|_| ())
}

/// The worker: one run of the grid in this process, quietly.
fn run_one(config: &Path, dir: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(config)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", config.display()))?;
    let cfg = raptor_train::config::RunConfig::from_toml(&text)?;
    let mut quiet = |_: u64, _: u64, _: &raptor_train::trainer::UpdateMetrics, _: Option<f64>| {};
    paper::run_one(&cfg, dir, &mut quiet)?;
    Ok(())
}
