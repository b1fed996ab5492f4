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
    /// Print the build information: versions (read, not written in), CUDA availability.
    Info {
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Run the reproduction tables (what `cargo xtask reproduce` runs).
    Reproduce {
        /// Output folder for the Markdown and JSON tables.
        #[arg(long, default_value = "results")]
        out: PathBuf,
        /// Repository root (fixtures are read from `<root>/fixtures`).
        #[arg(long, default_value = ".")]
        root: PathBuf,
        /// Smaller sizes and fewer repetitions.
        #[arg(long, conflicts_with = "full")]
        quick: bool,
        /// The paper-sized grid (more updates, seeds and larger models; for a GPU or a long
        /// CPU run).
        #[arg(long)]
        full: bool,
        /// Run only these parts (default: all): paper, dpmuon, backbones, environment,
        /// accountant, routing, kernels, muon.
        #[arg(long = "only")]
        only: Vec<String>,
        /// Per-user cache with the corpora of `cargo xtask setup --data` (default:
        /// `$RAPTOR_CACHE_DIR`, `$XDG_CACHE_HOME/raptor` or `~/.cache/raptor`).
        #[arg(long)]
        cache: Option<PathBuf>,
        /// Folder with the data-to-text files (`e2e/`, `dart/`); default `<root>/../shared/data`.
        #[arg(long)]
        d2t_data: Option<PathBuf>,
        /// Device of the training runs: `cpu`, `cuda` or `cuda:N`.
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Training runs at once, each a worker process with one libtorch thread (default: the
        /// CPU threads; 1 on a GPU).
        #[arg(long)]
        jobs: Option<usize>,
        /// Print the tables as one JSON array on stdout (progress stays on stderr).
        #[arg(long)]
        json: bool,
    },
    /// One run of the reproduce grid (the worker process of `reproduce`): trains into `--dir`
    /// and writes its `summary.json`.
    #[command(hide = true)]
    ReproduceRun {
        /// The run config (TOML, absolute paths).
        #[arg(long)]
        config: PathBuf,
        /// The run folder.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Export a finished run's model (e.g. a non-private pretraining run) as a Hugging Face
    /// folder (`config.json` + `model.safetensors`) that `model.path` can start from.
    Export {
        /// The run folder.
        #[arg(long)]
        run: PathBuf,
        /// The folder to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Sparse upcycling: turn a dense Llama-style Hugging Face folder into a Mixtral-style MoE
    /// folder, or a BERT folder into a MoE-BERT folder (raptor's layout, `model.kind =
    /// "moe-bert"`): every layer's MLP copied into E experts, a new random router, seeded and
    /// frozen in training. Tokenizer files beside the checkpoint are copied.
    Upcycle(cli::upcycle::UpcycleArgs),
    /// Train privately from a config file (RAPTOR, its baselines, DP-SGD/Adam/Muon/MuonBC).
    Train(cli::train::TrainArgs),
    /// Evaluate a run folder on a data file.
    Eval(cli::train::EvalArgs),
    /// Audit a run config empirically: one training run with secret canaries, an ε lower bound
    /// beside the certified upper bound (`<run>/audit.json`).
    Audit(cli::audit::AuditArgs),
    /// `account`, `calibrate`, `plan` and `routing`: the libtorch-free subcommands of
    /// `raptor_cli` (also the `raptor-acct` program).
    #[command(flatten)]
    Acct(raptor_cli::Command),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info { json } => info(json),
        Command::Reproduce {
            out,
            root,
            quick,
            full,
            only,
            cache,
            d2t_data,
            device,
            jobs,
            json,
        } => {
            let d2t_data = d2t_data.unwrap_or_else(|| root.join("..").join("shared").join("data"));
            let workers = jobs.unwrap_or_else(|| {
                if device == "cpu" {
                    std::thread::available_parallelism().map_or(1, |n| n.get())
                } else {
                    1
                }
            });
            reproduce::run(
                &reproduce::Context {
                    root,
                    out,
                    quick,
                    full,
                    cache,
                    d2t_data,
                    inputs: None,
                    backbones: None,
                    device,
                    exe: std::env::current_exe().ok(),
                    workers,
                    json,
                },
                &only,
            )
            .map(|_| ())
        }
        Command::ReproduceRun { config, dir } => reproduce_run(&config, &dir),
        Command::Export { run, out } => raptor_train::run::export_run(&run, &out)
            .map(|()| println!("exported {} to {}", run.display(), out.display()))
            .map_err(anyhow::Error::from),
        Command::Upcycle(args) => cli::upcycle::run_upcycle(args),
        Command::Train(args) => cli::train::run_train(args),
        Command::Eval(args) => cli::train::run_eval(args),
        Command::Audit(args) => cli::audit::run_audit(args),
        Command::Acct(command) => command.run().map_err(anyhow::Error::from),
    };
    if let Err(err) = result {
        eprintln!("error: {err:#}");
        std::process::exit(cli::EXIT_BAD_INPUT);
    }
}

fn reproduce_run(config: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(config)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", config.display()))?;
    let cfg = raptor_train::config::RunConfig::from_toml(&text)?;
    let mut quiet = |_: u64, _: u64, _: &raptor_train::trainer::UpdateMetrics, _: Option<f64>| {};
    reproduce::paper::run_one(&cfg, dir, &mut quiet)?;
    Ok(())
}

/// Which libtorch build this program linked: `cuda` (libtorch_cuda.so linked, as `cargo xtask
/// setup` installs on a machine with an NVIDIA driver or with `--cuda`) or `cpu` (the CPU-only
/// install: no CUDA device can be used).
fn libtorch_build() -> &'static str {
    if raptor_models::CUDA_LINKED {
        "cuda"
    } else {
        "cpu"
    }
}

fn info(json: bool) -> anyhow::Result<()> {
    let libtorch = raptor_train::libtorch_version();
    let (available, devices) = (tch::Cuda::is_available(), tch::Cuda::device_count());
    if json {
        return cli::print_json(&serde_json::json!({
            "raptor": env!("CARGO_PKG_VERSION"),
            "tch": raptor_train::TCH_VERSION,
            "libtorch": libtorch,
            "cuda_linked": raptor_models::CUDA_LINKED,
            "libtorch_build": libtorch_build(),
            "cuda_available": available,
            "cuda_devices": devices,
        }));
    }
    println!("raptor {}", env!("CARGO_PKG_VERSION"));
    println!(
        "tch {} / libtorch {libtorch} (loaded)",
        raptor_train::TCH_VERSION
    );
    println!("libtorch build: {}", libtorch_build());
    println!("cuda linked: {}", raptor_models::CUDA_LINKED);
    println!("cuda available: {available}");
    println!("cuda devices: {devices}");
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The argument parser of `raptor` never panics on arbitrary command lines (issue 14's
    //! fuzzing of the CLI's arguments; the parsers of the files they name have their own
    //! harnesses). 2,000 cases by default; `RAPTOR_FUZZ_CASES=N` for a long run.
    use super::Cli;
    use clap::{CommandFactory, Parser};
    use proptest::prelude::*;

    fn cases() -> u32 {
        std::env::var("RAPTOR_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2000)
    }

    fn word(vocabulary: Vec<String>) -> impl Strategy<Value = String> {
        let values = prop::sample::select(vec![
            "0",
            "1",
            "-1",
            "0.5",
            "1e-5",
            "nan",
            "inf",
            "-inf",
            "18446744073709551616",
            "",
            "=",
            "--",
            "-",
            "x.toml",
            "/nonexistent",
            "cpu",
            "cuda:7",
            "🦖",
        ]);
        prop_oneof![
            4 => prop::sample::select(vocabulary),
            3 => values.prop_map(str::to_string),
            1 => any::<f64>().prop_map(|v| v.to_string()),
            1 => ".{0,12}",
        ]
    }

    #[test]
    fn the_command_definition_is_consistent() {
        Cli::command().debug_assert();
        let v = raptor_cli::argv_vocabulary(&Cli::command());
        for w in [
            "train", "eval", "audit", "upcycle", "account", "--config", "--resume",
        ] {
            assert!(v.iter().any(|x| x == w), "{w} missing from {v:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

        #[test]
        fn command_lines_never_panic(
            words in proptest::collection::vec(word(raptor_cli::argv_vocabulary(&Cli::command())), 0..12),
        ) {
            let argv: Vec<String> =
                std::iter::once("raptor".to_string()).chain(words).collect();
            // An error (usage, help, version) or a parsed command: never a panic.
            let _ = Cli::try_parse_from(&argv);
        }
    }
}
