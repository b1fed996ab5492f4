//! The driver of `raptor-reproduce`: the tables behind `cargo xtask reproduce`.
//!
//! Each part of the workspace contributes one module of this crate with a
//! `pub fn tables(ctx: &Context) -> anyhow::Result<Vec<Table>>` function (the training parts
//! also take the [`Overrides`] of their inputs). The driver runs the parts in order, prints each
//! table as Markdown and writes `results/<slug>.md` and `results/<slug>.json`. What the parts
//! share (the context, the profiles and their sizes) lives in `context`, which imports no part:
//! the parts import it, and only this module imports the parts.

pub use crate::context::{Context, Profile, Table};
use crate::{accountant, backbones, dpmuon, kernels, muon, paper, routing};

/// Inputs that replace a part's real data (the tests: tiny corpora and checkpoints); None: the
/// real data of the cache.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// The inputs of the `paper` and `dpmuon` parts.
    pub paper: Option<paper::Inputs>,
    /// The inputs of the `backbones` part.
    pub backbones: Option<backbones::Inputs>,
}

/// The parts, in the order they run. Each returns its tables.
type Part<'a> = Box<dyn Fn(&Context) -> anyhow::Result<Vec<Table>> + 'a>;

fn parts(o: &Overrides) -> Vec<(&'static str, Part<'_>)> {
    vec![
        ("environment", Box::new(environment)),
        ("accountant", Box::new(accountant::tables)),
        ("routing", Box::new(routing::tables)),
        ("kernels", Box::new(kernels::tables)),
        ("muon", Box::new(muon::tables)),
        ("paper", Box::new(|c| paper::tables(c, o.paper.as_ref()))),
        ("dpmuon", Box::new(|c| dpmuon::tables(c, o.paper.as_ref()))),
        (
            "backbones",
            Box::new(|c| backbones::tables(c, o.backbones.as_ref())),
        ),
    ]
}

/// Run every part (or those named in `only`), print and write the tables, and rewrite
/// `results/README.md` from every part's latest tables (parts not run this time keep theirs).
/// Returns the tables of this run.
pub fn run(ctx: &Context, overrides: &Overrides, only: &[String]) -> anyhow::Result<Vec<Table>> {
    std::fs::create_dir_all(&ctx.out)?;
    let known: Vec<&str> = parts(overrides).iter().map(|(n, _)| *n).collect();
    if let Some(bad) = only.iter().find(|o| !known.contains(&o.as_str())) {
        anyhow::bail!("--only {bad}: unknown part (parts: {})", known.join(", "));
    }
    let index_dir = ctx.out.join("parts");
    std::fs::create_dir_all(&index_dir)?;
    let mut all = Vec::new();
    for (name, part) in parts(overrides) {
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
