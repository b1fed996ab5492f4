//! `raptor train` and `raptor eval`: private fine-tuning from a config file, into a run folder.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;

use raptor_train::config::{DEFAULT_CONFIG, RunConfig};

/// Train a model privately (or non-privately for the reference methods) from a config file.
#[derive(Debug, Clone, clap::Args)]
pub struct TrainArgs {
    /// The run configuration (TOML; `--print-default-config` shows every field).
    #[arg(long, required_unless_present_any = ["print_default_config", "resume"])]
    pub config: Option<PathBuf>,
    /// Continue an interrupted run from its folder (its own config.toml is used; a `--config`
    /// given too must be the same config, or the command fails naming the fields that differ).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Folder under which the run folder `<method>-<time>-<pid>` is created.
    #[arg(long, default_value = "runs")]
    pub runs_dir: PathBuf,
    /// Print the commented default configuration and exit.
    #[arg(long)]
    pub print_default_config: bool,
    /// Print the run record as one JSON object instead of a summary (no progress bar).
    #[arg(long)]
    pub json: bool,
}

/// Evaluate a run on a data file.
#[derive(Debug, Clone, clap::Args)]
pub struct EvalArgs {
    /// The run folder.
    #[arg(long)]
    pub run: PathBuf,
    /// Records to evaluate (a table with the run's columns); default: the run's validation file.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Runs `raptor train`.
pub fn run_train(args: TrainArgs) -> anyhow::Result<()> {
    if args.print_default_config {
        print!("{DEFAULT_CONFIG}");
        return Ok(());
    }
    let cfg = match (&args.config, &args.resume) {
        (Some(p), Some(run)) => {
            // A run resumes with the config it started with (its privacy plan, schedule and
            // data are fixed); a --config beside --resume must be that config.
            let given = RunConfig::from_file(p)?;
            let stored = run.join("config.toml");
            let text = std::fs::read_to_string(&stored)
                .with_context(|| format!("cannot read {}", stored.display()))?;
            let diff = given.differences(&RunConfig::from_toml(&text)?)?;
            if !diff.is_empty() {
                anyhow::bail!(
                    "{} differs from the config {} started with ({}): a run resumes with its own config; drop --config to resume it, or train a new run",
                    p.display(),
                    run.display(),
                    diff.join(", ")
                );
            }
            given
        }
        (None, Some(_)) => RunConfig::default(),
        (Some(p), None) => RunConfig::from_file(p)?,
        (None, None) => anyhow::bail!("give --config <run.toml> or --resume <run folder>"),
    };
    // Under mpirun/srun: one rank per process, rank 0 writes and prints (see raptor_train::dist).
    #[cfg(feature = "mpi")]
    let mpi = if raptor_train::dist::launched_by_mpi() {
        Some(
            raptor_train::dist::Mpi::init()
                .context("MPI was already initialized in this process")?,
        )
    } else {
        None
    };
    #[cfg(feature = "mpi")]
    let comm: &dyn raptor_train::dist::Collective = match &mpi {
        Some(m) => m,
        None => &raptor_train::dist::Solo,
    };
    #[cfg(not(feature = "mpi"))]
    let comm: &dyn raptor_train::dist::Collective = {
        let k = raptor_train::dist::launcher_size();
        if k > 1 {
            anyhow::bail!(
                "started by an MPI launcher with {k} processes, but this raptor was built without \
                 MPI: each process would train alone. Rebuild with `cargo build --release -p \
                 raptor-train --features mpi` (needs libopenmpi-dev and libclang-dev)"
            );
        }
        &raptor_train::dist::Solo
    };
    let quiet = !comm.is_writer();
    let stop = Arc::new(AtomicBool::new(false));
    {
        let s = stop.clone();
        // First signal: finish the current update, checkpoint, exit; the handler stays.
        let _ = ctrlc_like(move || s.store(true, Ordering::SeqCst));
    }
    let bar = super::update_bar(args.json || quiet);
    let mut eps_shown = String::from("eps -");
    let mut progress =
        |done: u64, total: u64, m: &raptor_train::trainer::UpdateMetrics, eps: Option<f64>| {
            bar.set_length(total);
            bar.set_position(done);
            if let Some(e) = eps {
                eps_shown = format!("eps {e:.3}");
            }
            bar.set_message(format!("{eps_shown}  loss {:.4}  [{}]", m.loss, m.phase));
        };
    let result = raptor_train::run::train_with(
        &cfg,
        &args.runs_dir,
        args.resume.as_deref(),
        &mut progress,
        Some(stop),
        comm,
    );
    bar.finish_and_clear();
    let (dir, record) = match result {
        Ok(r) => r,
        Err(e) if comm.size() > 1 => {
            // The other ranks would wait forever in the next collective: end the whole job.
            eprintln!("error on rank {}: {e}", comm.rank());
            comm.abort(1)
        }
        Err(e) => return Err(e.into()),
    };
    if quiet {
        return Ok(());
    }
    if args.json {
        return super::print_json(&record);
    }
    println!("run folder: {}", dir.display());
    println!(
        "method {}  records {}  updates {}  ({:.2} updates/s)",
        record.method, record.train_records, record.updates, record.updates_per_second
    );
    match &record.epsilon {
        Some(e) => println!(
            "privacy: epsilon <= {:.4} (estimate {:.4}, lower {:.4}) at delta = {:e}, target {}",
            e.upper, e.estimate, e.lower, e.delta, record.privacy_plan.epsilon
        ),
        None => println!("privacy: none (epsilon = infinity: a non-private reference method)"),
    }
    if let Some(ev) = &record.eval {
        match ev.accuracy {
            Some(a) => println!(
                "validation: accuracy {a:.4}  loss {:.4}  ({} records)",
                ev.loss, ev.records
            ),
            None => println!(
                "validation: NLL {:.4}  perplexity {:.3}  ({} records)",
                ev.loss,
                ev.perplexity.unwrap_or(f64::NAN),
                ev.records
            ),
        }
    }
    if let Some(g) = &record.generation {
        println!(
            "generation: BLEU {:.2}  ROUGE-L {:.2}  ({} sources, beams {})",
            g.bleu, g.rouge_l, g.sources, g.beams
        );
    }
    for n in &record.notes {
        println!("note: {n}");
    }
    Ok(())
}

/// Runs `raptor eval`.
pub fn run_eval(args: EvalArgs) -> anyhow::Result<()> {
    let report = raptor_train::run::eval_run(&args.run, args.data.as_deref())
        .with_context(|| format!("evaluating {}", args.run.display()))?;
    if args.json {
        return super::print_json(&report);
    }
    if let Some(g) = &report.generation {
        println!(
            "BLEU {:.2}  ROUGE-L {:.2}  ({} sources, beams {})",
            g.bleu, g.rouge_l, g.sources, g.beams
        );
    }
    let m = report.metrics;
    match m.accuracy {
        Some(a) => println!(
            "accuracy {a:.4}  loss {:.4}  ({} records)",
            m.loss, m.records
        ),
        None => println!(
            "NLL {:.4}  perplexity {:.3}  ({} records)",
            m.loss,
            m.perplexity.unwrap_or(f64::NAN),
            m.records
        ),
    }
    Ok(())
}

/// Installs a SIGINT/SIGTERM handler that calls `f` (once per signal).
fn ctrlc_like(f: impl Fn() + Send + Sync + 'static) -> anyhow::Result<()> {
    let flag = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, flag.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, flag.clone())?;
    std::thread::spawn(move || {
        loop {
            if flag.swap(false, Ordering::SeqCst) {
                f();
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    });
    Ok(())
}
