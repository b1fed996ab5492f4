//! `raptor reproduce`: the tables behind `cargo xtask reproduce`.
//!
//! Each part of the workspace contributes one module here with a
//! `pub fn tables(ctx: &Context) -> anyhow::Result<Vec<Table>>` function. The driver runs the
//! parts in order, prints each table as Markdown and writes `results/<slug>.md` and
//! `results/<slug>.json`.

use std::path::PathBuf;

use serde::Serialize;

mod accountant;
mod kernels;
mod muon;
mod routing;

/// Everything a part needs to know about the run.
#[derive(Debug, Clone)]
pub struct Context {
    /// Repository root (fixtures are read from `<root>/fixtures`).
    pub root: PathBuf,
    /// Output folder (`results/` by default).
    pub out: PathBuf,
    /// `--quick`: smaller sizes and fewer repetitions (used by the tests of this driver).
    pub quick: bool,
}

/// One result table: a title, column names, rows of cells, and free-text notes.
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    /// File stem under `results/` (lowercase, `-` separated).
    pub slug: String,
    /// Human-readable title.
    pub title: String,
    /// Column headers.
    pub columns: Vec<String>,
    /// Rows; each has as many cells as there are columns.
    pub rows: Vec<Vec<String>>,
    /// Notes printed under the table (what was compared, machine, caveats).
    pub notes: Vec<String>,
}

impl Table {
    /// Render as a GitHub-flavoured Markdown table with a heading and the notes.
    pub fn to_markdown(&self) -> String {
        let mut s = format!("## {}\n\n", self.title);
        s.push_str(&format!("| {} |\n", self.columns.join(" | ")));
        s.push_str(&format!(
            "|{}\n",
            self.columns.iter().map(|_| "---|").collect::<String>()
        ));
        for row in &self.rows {
            s.push_str(&format!("| {} |\n", row.join(" | ")));
        }
        if !self.notes.is_empty() {
            s.push('\n');
            for n in &self.notes {
                s.push_str(&format!("- {n}\n"));
            }
        }
        s
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
    ]
}

/// Run every part (or those named in `only`), print and write the tables. Returns the tables.
pub fn run(ctx: &Context, only: &[String]) -> anyhow::Result<Vec<Table>> {
    std::fs::create_dir_all(&ctx.out)?;
    let mut all = Vec::new();
    for (name, part) in parts() {
        if !only.is_empty() && !only.iter().any(|o| o == name) {
            continue;
        }
        eprintln!("reproduce: {name} ...");
        let tables = part(ctx)?;
        for t in &tables {
            let md = t.to_markdown();
            println!("{md}");
            std::fs::write(ctx.out.join(format!("{}.md", t.slug)), &md)?;
            std::fs::write(
                ctx.out.join(format!("{}.json", t.slug)),
                serde_json::to_string_pretty(t)?,
            )?;
        }
        all.extend(tables);
    }
    let index: String = all
        .iter()
        .map(Table::to_markdown)
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(
        ctx.out.join("README.md"),
        format!("# raptor reproduce\n\n{index}"),
    )?;
    Ok(all)
}

/// The environment the results came from.
fn environment(_ctx: &Context) -> anyhow::Result<Vec<Table>> {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let rows = vec![
        vec!["raptor".into(), env!("CARGO_PKG_VERSION").into()],
        vec!["tch / libtorch".into(), "0.24.0 / 2.11.0".into()],
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
