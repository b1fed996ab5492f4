//! `raptor train` and `raptor eval`: private fine-tuning from a config file, into a run folder.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;

use crate::quickstart::{QuickStart, Resolved};
use raptor_train::config::{
    Choice, DEFAULT_CONFIG, Method, MethodFamily, RunConfig, Scope, parse_choice,
};

use super::progress::{Mode, Reporter};

/// Train a model privately (or non-privately for the reference methods) from a config file,
/// or from a data file alone (`--data`: columns detected, documented defaults).
#[derive(Debug, Clone, clap::Args)]
pub struct TrainArgs {
    /// The run configuration (TOML; `--print-default-config` shows every field, `raptor init
    /// --data train.csv` writes one from the data). Without a `[model]` table the pretrained
    /// all-MiniLM-L6-v2 is used (fetched into the cache on first use).
    #[arg(
        long,
        required_unless_present_any = ["print_default_config", "resume", "data"],
        conflicts_with = "data"
    )]
    pub config: Option<PathBuf>,
    /// Continue an interrupted run from its folder (its own config.toml is used; a `--config`
    /// given too must be the same config, or the command fails naming the fields that differ).
    #[arg(long, conflicts_with = "data")]
    pub resume: Option<PathBuf>,
    /// Folder under which the run folder `<method>-<time>-<pid>` is created.
    #[arg(long, default_value = "runs")]
    pub runs_dir: PathBuf,
    /// Print the commented default configuration and exit.
    #[arg(long)]
    pub print_default_config: bool,
    /// Print the run record as one JSON object instead of a summary.
    #[arg(long)]
    pub json: bool,
    /// Show nothing while training (no start summary, no progress); the result is still printed.
    #[arg(long)]
    pub quiet: bool,
    /// Also show the mean loss of each private batch. It is computed from private records
    /// without noise, so it is NOT private: a diagnostic for the data owner.
    #[arg(long)]
    pub show_private_loss: bool,
    /// Train from this data file alone (CSV, TSV or JSONL), with no config file.
    #[command(flatten)]
    pub quick: QuickArgs,
}

/// A run from a data file alone: `raptor train --data` and `raptor init --data`.
#[derive(Debug, Clone, clap::Args)]
pub struct QuickArgs {
    /// The training file (CSV, TSV or JSONL): the text and label columns are detected (and
    /// printed, with what was assumed), the rest comes from documented defaults.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// A validation file with the same columns (default: 10 % of the training file held out).
    #[arg(long, requires = "data")]
    pub validation: Option<PathBuf>,
    /// The method (default: dp-adam over LoRA on the pretrained backbone; raptor and its
    /// baselines use the backbone upcycled to a MoE; expert-only is refused here, since it
    /// would leave the new classification head untrained).
    #[arg(long, requires = "data", value_parser = parse_method)]
    pub method: Option<Method>,
    /// Target epsilon.
    #[arg(long, requires = "data", default_value_t = 8.0)]
    pub epsilon: f64,
    /// The text column (default: detected).
    #[arg(long, requires = "data")]
    pub text_column: Option<String>,
    /// The label column (default: detected).
    #[arg(long, requires = "data")]
    pub label_column: Option<String>,
    /// A randomly initialized model instead of the pretrained backbone (rarely learns).
    #[arg(long, requires = "data")]
    pub random_init: bool,
}

/// A method name as in configs (`raptor`, `dp-adam`, …).
pub fn parse_method(s: &str) -> Result<Method, String> {
    parse_choice(s).map_err(|_| format!("one of {}", Method::accepted()))
}

impl QuickArgs {
    /// The config these arguments resolve to, with what was detected and assumed; the backbone
    /// is fetched (or built) into the cache first, since the rule reads its layers and
    /// positions.
    pub fn resolve(&self, data: &std::path::Path, quiet: bool) -> anyhow::Result<Resolved> {
        let q = QuickStart {
            train: data.to_path_buf(),
            validation: self.validation.clone(),
            method: self.method,
            epsilon: self.epsilon,
            text_column: self.text_column.clone(),
            label_column: self.label_column.clone(),
            random_init: self.random_init,
        };
        // The columns first: a file that cannot be read fails before anything is fetched.
        let first = crate::quickstart::resolve(&q, Default::default())?;
        if self.random_init {
            return Ok(first);
        }
        let mut probe = first.config.clone();
        crate::provision::provide(&mut probe, quiet)?;
        let facts = probe
            .model
            .path
            .as_deref()
            .map(crate::provision::backbone_facts)
            .unwrap_or_default();
        Ok(crate::quickstart::resolve(&q, facts)?)
    }
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
    let mode = Mode::detect(args.quiet);
    let reporter = Reporter::new(mode, args.show_private_loss);
    let cfg = match (&args.config, &args.resume, &args.quick.data) {
        (_, _, Some(data)) => {
            let r = args.quick.resolve(data, args.quiet)?;
            reporter.note(&format!("{}: {} records", data.display(), r.records));
            for n in &r.notes {
                reporter.note(&format!("  {n}"));
            }
            let mut cfg = r.config;
            let cwd = std::env::current_dir().context("cannot read the current folder")?;
            crate::provision::provide(&mut cfg, args.quiet)?;
            cfg.resolve_paths_against(&cwd);
            cfg
        }
        (Some(p), Some(run), None) => {
            // A run resumes with the config it started with (its privacy plan, schedule and
            // data are fixed); a --config beside --resume must be that config.
            let given = load_config(p, args.quiet)?;
            let stored = run.join("config.toml");
            let text = std::fs::read_to_string(&stored)
                .with_context(|| format!("cannot read {}", stored.display()))?;
            let diff = given.differences(&RunConfig::from_written_toml(&text)?)?;
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
        (None, Some(_), None) => RunConfig::default(),
        (Some(p), None, None) => load_config(p, args.quiet)?,
        (None, None, None) => {
            anyhow::bail!("give --data <train.csv>, --config <run.toml> or --resume <run folder>")
        }
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
    let mut reporter = if quiet {
        Reporter::new(Mode::Quiet, false)
    } else {
        reporter
    };
    let result = {
        let cell = std::cell::RefCell::new(&mut reporter);
        let mut on_start = |info: &raptor_run::launch::StartInfo| cell.borrow_mut().start(info);
        let mut progress =
            |done: u64, total: u64, m: &raptor_train::trainer::UpdateMetrics, eps: Option<f64>| {
                cell.borrow_mut().update(done, total, m, eps);
            };
        raptor_run::launch::train_reporting(
            &cfg,
            &args.runs_dir,
            args.resume.as_deref(),
            &mut on_start,
            &mut progress,
            Some(stop),
            comm,
        )
    };
    reporter.finish();
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
    // One file per run for scripts: the summary the experiment driver's runs have too.
    raptor_run::Summary::from_record(&record, raptor_run::peak_rss_mib()).write(&dir)?;
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
    // Computed without noise: private unless the validation file was declared public.
    let (tag, shown) = match &record.validation {
        Some(v) if v.public => ("public validation records", "record.json"),
        _ => (
            "PRIVATE: held-out private records, no noise",
            "private/record.json",
        ),
    };
    if let Some(ev) = record.eval() {
        match ev.accuracy {
            Some(a) => println!(
                "validation: accuracy {a:.4}  loss {:.4}  ({} records; {tag}; in {shown})",
                ev.loss, ev.records
            ),
            None => println!(
                "validation: NLL {:.4}  perplexity {:.3}  ({} records; {tag}; in {shown})",
                ev.loss,
                ev.perplexity.unwrap_or(f64::NAN),
                ev.records
            ),
        }
    }
    if let Some(g) = record.generation() {
        println!(
            "generation: BLEU {:.2}  ROUGE-L {:.2}  ({} sources, beams {}; {tag}; in {shown})",
            g.bleu, g.rouge_l, g.sources, g.beams
        );
    }
    for n in &record.notes {
        println!("note: {n}");
    }
    for l in end_lines(&dir, &cfg) {
        println!("{l}");
    }
    Ok(())
}

/// What was saved where, and the commands that use it.
fn end_lines(dir: &std::path::Path, cfg: &RunConfig) -> Vec<String> {
    let d = dir.display();
    let mut out = vec![
        format!(
            "saved in {d}: config.toml (the resolved config), record.json (what may be published: privacy plan, certified epsilon, public metrics), summary.json (the same in brief, for scripts), checkpoint/ (trained parameters, optimizer state, ledger)"
        ),
        format!(
            "private:  {d}/private/ (record.json, summary.json, metrics.jsonl: computed from private records without noise; never publish or share)"
        ),
        format!("evaluate: raptor eval --run {d} --data <file with the same columns>"),
        format!("repeat:   raptor train --config {d}/config.toml"),
    ];
    let adapters = match cfg.method.name().family() {
        MethodFamily::Streams | MethodFamily::MatchedScope => true,
        MethodFamily::Monolithic => matches!(cfg.method.name(), Method::DpAdamLora | Method::Lora),
        MethodFamily::Scoped => cfg.method.scope() == Some(Scope::Lora),
    };
    // The adapter form needs a dense BERT with a base checkpoint to load onto.
    let peft = cfg.model.kind == raptor_train::config::ModelKind::Bert && cfg.model.path.is_some();
    if adapters && !peft {
        out.push(format!(
            "export:   raptor export --run {d} --out <folder> --merged   (the LoRA adapters merged into a Hugging Face folder)"
        ));
    } else if adapters {
        out.push(format!(
            "export:   raptor export --run {d} --out <folder>   (a PEFT adapter for the base checkpoint; --merged: one Hugging Face folder)"
        ));
    } else {
        out.push(format!("export:   raptor export --run {d} --out <folder>"));
    }
    out
}

/// Reads a config file; a config without a `[model]` table gets the pretrained backbone
/// (fetched or built into the cache on first use), and a cached backbone it names is provided.
pub(crate) fn load_config(path: &std::path::Path, quiet: bool) -> anyhow::Result<RunConfig> {
    let mut cfg = RunConfig::from_file(path)?;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let has_model = toml::from_str::<toml::Table>(&text)
        .map(|t| t.contains_key("model"))
        .unwrap_or(true);
    if !has_model {
        crate::provision::apply_default_model(&mut cfg);
        if !quiet {
            eprintln!(
                "{}: no [model] table: using the pretrained {} (add a [model] table for another model or a random init)",
                path.display(),
                cfg.model
                    .path
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            );
        }
    }
    crate::provision::provide(&mut cfg, quiet)?;
    Ok(cfg)
}

/// Runs `raptor eval`.
pub fn run_eval(args: EvalArgs) -> anyhow::Result<()> {
    let report = raptor_run::eval_run(&args.run, args.data.as_deref())
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
