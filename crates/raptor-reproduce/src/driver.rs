//! The driver of `raptor-reproduce`: the tables behind `cargo xtask reproduce`.
//!
//! Each part of the workspace contributes one module of this crate with a
//! `pub fn tables(ctx: &Context) -> anyhow::Result<Vec<Table>>` function. The driver runs the
//! parts in order, prints each table as Markdown and writes `results/<slug>.md` and
//! `results/<slug>.json`.

use raptor_train::config::DeviceSpec;
use std::path::PathBuf;

use crate::{accountant, backbones, dpmuon, kernels, muon, paper, routing};

/// Everything a part needs to know about the run.
#[derive(Debug, Clone)]
pub struct Context {
    /// Repository root (fixtures are read from `<root>/fixtures`).
    pub root: PathBuf,
    /// Output folder (`results/` by default).
    pub out: PathBuf,
    /// The sizes the parts run at.
    pub profile: Profile,
    /// Per-user cache (prepared corpora, tokenizers, pretrained models); None: the default
    /// (`$RAPTOR_CACHE_DIR`, `$XDG_CACHE_HOME/raptor` or `~/.cache/raptor`).
    pub cache: Option<PathBuf>,
    /// Folder holding the data-to-text files (`e2e/`, `dart/`).
    pub d2t_data: PathBuf,
    /// Explicit inputs of the paper parts (tests); None: the real data.
    pub inputs: Option<paper::Inputs>,
    /// Explicit inputs of the `backbones` part (tests: tiny checkpoints); None: the real
    /// checkpoints and corpora of `cargo xtask setup --models --data`.
    pub backbones: Option<backbones::Inputs>,
    /// Device of the training runs (`cpu`, `cuda`, `cuda:N`).
    pub device: DeviceSpec,
    /// The `raptor-reproduce` program, to run the training grid in parallel worker processes
    /// (its hidden subcommand [`paper::runs::WORKER_COMMAND`]); None: one run after another in
    /// this process.
    pub exe: Option<PathBuf>,
    /// Worker processes at once (each with one libtorch thread).
    pub workers: usize,
    /// Print the tables as one JSON array on stdout instead of Markdown.
    pub json: bool,
}

pub use raptor_report::Table;

/// The sizes of a reproduction: each training part (`paper`, `dpmuon`, `backbones`) has a
/// `Scale` per profile, the building-block parts a smaller and a larger setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// `--quick`: tiny models and a few updates (the tests of this driver).
    Quick,
    /// The default: every part's design (public pretraining, public proxy, positive control,
    /// paired seeds, diagnostics) at sizes that fit about half an hour on 2 CPU cores: fewer
    /// seeds, records and updates, so its intervals are wide.
    Small,
    /// `--standard`: the evidence grids behind the README's tables (5 paired seeds; hours on
    /// 2 CPU cores, resumable).
    Standard,
    /// `--full`: the paper-sized grid (larger models, every record; a GPU).
    Full,
}

impl Profile {
    /// The profile the flags name (`--quick`, `--standard`, `--full`; none: [`Profile::Small`]).
    pub fn from_flags(quick: bool, standard: bool, full: bool) -> Self {
        match (quick, standard, full) {
            (true, _, _) => Self::Quick,
            (_, _, true) => Self::Full,
            (_, true, _) => Self::Standard,
            _ => Self::Small,
        }
    }

    /// The profile's name, as the command line spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Quick => "quick",
            Self::Small => "default",
            Self::Standard => "standard",
            Self::Full => "full",
        }
    }
}

/// The sizes of one part under each [`Profile`]: a constructor per profile, and the choice
/// between them ([`ProfileScale::for_profile`]), so that every part reads its profile the same
/// way.
pub trait ProfileScale: Sized {
    /// `--quick`: tiny models and a few updates (the tests of this driver).
    fn quick() -> Self;
    /// No profile flag: the part's design at sizes that fit the default reproduction's budget.
    fn small() -> Self;
    /// `--standard`: the evidence grid behind the README's tables.
    fn standard() -> Self;
    /// `--full`: the paper-sized setting (a GPU or a long CPU run).
    fn full() -> Self;

    /// The sizes of `profile`.
    fn for_profile(profile: Profile) -> Self {
        match profile {
            Profile::Quick => Self::quick(),
            Profile::Small => Self::small(),
            Profile::Standard => Self::standard(),
            Profile::Full => Self::full(),
        }
    }
}

impl Context {
    /// Whether this is the test profile (`--quick`).
    pub fn quick(&self) -> bool {
        self.profile == Profile::Quick
    }
}

/// The parts, in the order they run. Each returns its tables.
type Part = fn(&Context) -> anyhow::Result<Vec<Table>>;

fn parts() -> Vec<(&'static str, Part)> {
    vec![
        ("environment", environment),
        ("accountant", accountant::tables),
        ("routing", routing::tables),
        ("kernels", kernels::tables),
        ("muon", muon::tables),
        ("paper", paper::tables),
        ("dpmuon", dpmuon::tables),
        ("backbones", backbones::tables),
    ]
}

/// Run every part (or those named in `only`), print and write the tables, and rewrite
/// `results/README.md` from every part's latest tables (parts not run this time keep theirs).
/// Returns the tables of this run.
pub fn run(ctx: &Context, only: &[String]) -> anyhow::Result<Vec<Table>> {
    std::fs::create_dir_all(&ctx.out)?;
    let known: Vec<&str> = parts().iter().map(|(n, _)| *n).collect();
    if let Some(bad) = only.iter().find(|o| !known.contains(&o.as_str())) {
        anyhow::bail!("--only {bad}: unknown part (parts: {})", known.join(", "));
    }
    let index_dir = ctx.out.join("parts");
    std::fs::create_dir_all(&index_dir)?;
    let mut all = Vec::new();
    for (name, part) in parts() {
        if !only.is_empty() && !only.iter().any(|o| o == name) {
            continue;
        }
        eprintln!("reproduce: {name} ({} profile) ...", ctx.profile.name());
        let started = std::time::Instant::now();
        let tables = part(ctx)?;
        eprintln!(
            "reproduce: {name} done in {:.1} min",
            started.elapsed().as_secs_f64() / 60.0
        );
        for t in &tables {
            if !ctx.json {
                println!("{}", t.to_markdown());
            }
            t.write(&ctx.out)?;
        }
        let slugs: Vec<&str> = tables.iter().map(|t| t.slug.as_str()).collect();
        raptor_run::write_atomic(
            &index_dir.join(format!("{name}.json")),
            &serde_json::to_vec(&slugs)?,
        )?;
        all.extend(tables);
    }
    // The index: the paper tables first (what users come for), then the building blocks.
    let order = [
        "paper",
        "dpmuon",
        "backbones",
        "environment",
        "accountant",
        "routing",
        "kernels",
        "muon",
    ];
    let mut index = String::from(
        "# raptor reproduce\n\nWritten by `cargo xtask reproduce`; each table also has a `.json` twin, and the plots are the `.png` files linked under the tables.\n\n",
    );
    for name in order {
        let Ok(bytes) = std::fs::read(index_dir.join(format!("{name}.json"))) else {
            continue;
        };
        let slugs: Vec<String> = serde_json::from_slice(&bytes)?;
        for slug in slugs {
            if let Ok(md) = std::fs::read_to_string(ctx.out.join(format!("{slug}.md"))) {
                index.push_str(&md);
                index.push('\n');
            }
        }
    }
    raptor_run::write_atomic(&ctx.out.join("README.md"), index.as_bytes())?;
    if ctx.json {
        raptor_cli::print_json(&all)?;
    }
    Ok(all)
}

/// The environment the results came from.
fn environment(ctx: &Context) -> anyhow::Result<Vec<Table>> {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let rows = vec![
        vec!["raptor".into(), env!("CARGO_PKG_VERSION").into()],
        vec!["profile".into(), ctx.profile.name().into()],
        vec![
            "tch / libtorch (loaded)".into(),
            format!(
                "{} / {}",
                raptor_train::TCH_VERSION,
                raptor_train::libtorch_version()
            ),
        ],
        vec!["CUDA linked".into(), raptor_models::CUDA_LINKED.to_string()],
        vec![
            "CUDA available".into(),
            tch::Cuda::is_available().to_string(),
        ],
        vec!["CPU threads".into(), cores.to_string()],
        vec![
            "OS / arch".into(),
            format!("{} / {}", std::env::consts::OS, std::env::consts::ARCH),
        ],
    ];
    Ok(vec![Table {
        slug: "environment".into(),
        title: "Environment".into(),
        columns: vec!["item".into(), "value".into()],
        rows,
        notes: vec![],
    }])
}

/// An optimizer's schedule in a profile: how many updates, of which (expected) batch, at which
/// learning rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// Updates.
    pub updates: u64,
    /// Expected batch (records per update; capped at the records there are).
    pub batch: f64,
    /// Learning rate.
    pub lr: f64,
}

/// Sizes of a transformer built from scratch in a profile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dims {
    /// Model width (d_model).
    pub width: i64,
    /// Blocks.
    pub blocks: i64,
    /// Attention heads.
    pub heads: i64,
    /// Feed-forward size.
    pub ffn: i64,
    /// Experts per sparse layer (0 for a dense model).
    pub experts: i64,
}

/// Router training toward a public partition in a profile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouterSchedule {
    /// Adam steps.
    pub steps: usize,
    /// Learning rate.
    pub lr: f64,
    /// Public records read at most (0: all).
    pub max_records: usize,
}
