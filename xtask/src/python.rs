//! The Python package of the accountant (`crates/raptor-py`, built by maturin): `cargo xtask
//! wheel` and the pytest step of `cargo xtask test`.
//!
//! Both use one virtual environment in the cache folder (`<cache>/py-venv`) with pinned tools.
//! When a libtorch venv from `cargo xtask setup` exists, a `.pth` file lets the environment see
//! its torch (for the Opacus test) instead of a second, newer torch from PyPI.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};

use crate::{run_step, setup};

/// What `cargo xtask wheel` needs: maturin, and zig (from PyPI) to link the Linux wheel against
/// glibc 2.17 (manylinux2014) whatever the build machine's glibc.
const WHEEL_PACKAGES: [&str; 2] = ["maturin==1.16.0", "ziglang==0.17.0"];

/// What the pytest step needs (pinned). Opacus's `torch` requirement is met by the libtorch
/// venv's torch when there is one (its CUDA libraries still come with it: PyPI's Linux torch
/// wheel imports them even on a machine without a GPU).
const TEST_PACKAGES: [&str; 4] = [
    "maturin==1.16.0",
    "pytest==9.2.0",
    "dp-accounting==0.6.0",
    "opacus==1.6.0",
];

/// The crate of the Python package, relative to the workspace root.
const CRATE: &str = "crates/raptor-py";

/// The venv's python, created (and the packages installed, a no-op when present) as needed.
fn venv(packages: &[&str]) -> anyhow::Result<PathBuf> {
    let venv = setup::cache_dir()?.join("py-venv");
    let python = venv.join("bin").join("python");
    if !python.exists() {
        eprintln!("python: creating {}", venv.display());
        let status = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .context("python3 -m venv (is Python 3 with venv installed?)")?;
        if !status.success() {
            bail!("python3 -m venv {} failed", venv.display());
        }
    }
    // Let the venv see the libtorch venv's torch, when there is one (the CUDA or the CPU-only
    // install of `cargo xtask setup`): without it pip would fetch torch's newest release as
    // well (about 1.2 GB more on disk) only for the Opacus reference test.
    let torch_site = [setup::torch_venv()?, setup::torch_cpu_venv()?]
        .iter()
        .filter_map(|v| site_packages(&v.join("bin").join("python")))
        .find(|s| s.join("torch").exists());
    let site = site_packages(&python).context("the venv's site-packages")?;
    let pth = site.join("raptor-torch.pth");
    if let Some(torch_site) = torch_site {
        std::fs::write(&pth, format!("{}\n", torch_site.display()))?;
    } else if pth.exists() {
        std::fs::remove_file(&pth)?;
    }
    run_step(
        "pip install (pinned Python tools)",
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--progress-bar",
                "off",
            ])
            .args(packages),
    )?;
    Ok(python)
}

/// The first site-packages folder of a Python interpreter (None when it does not run).
fn site_packages(python: &Path) -> Option<PathBuf> {
    let out = Command::new(python)
        .args(["-c", "import site; print(site.getsitepackages()[0])"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Build the wheel with maturin into `out`; returns its path.
fn build_wheel(root: &Path, python: &Path, release: bool, out: &Path) -> anyhow::Result<PathBuf> {
    if out.exists() {
        for e in std::fs::read_dir(out)?.flatten() {
            if e.path().extension().is_some_and(|x| x == "whl") {
                std::fs::remove_file(e.path())?;
            }
        }
    }
    let mut cmd = Command::new(python);
    cmd.args(["-m", "maturin", "build", "--manifest-path"])
        .arg(root.join(CRATE).join("Cargo.toml"))
        .arg("--out")
        .arg(out)
        .args(["--interpreter"])
        .arg(python);
    if release {
        // The release wheel shows cargo's progress (a cold build takes minutes) and, on Linux,
        // is linked by zig against glibc 2.17: a manylinux2014 wheel for the distributions
        // clusters run. maturin finds zig as `python -m ziglang` on the PATH's python.
        cmd.arg("--release");
        if cfg!(target_os = "linux") {
            cmd.args(["--zig", "--compatibility", "manylinux2014"]);
            if let Some(bin) = python.parent() {
                let path = std::env::var_os("PATH").unwrap_or_default();
                let mut dirs = vec![bin.to_path_buf()];
                dirs.extend(std::env::split_paths(&path));
                cmd.env("PATH", std::env::join_paths(dirs)?);
            }
        }
    } else {
        cmd.args(["--quiet", "--profile", "dev"]);
    }
    run_step(
        &format!(
            "maturin build ({})",
            if release { "release" } else { "dev profile" }
        ),
        &mut cmd,
    )?;
    let wheel = std::fs::read_dir(out)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .with_context(|| format!("maturin wrote no wheel into {}", out.display()))?;
    Ok(wheel)
}

/// `cargo xtask wheel`: the release wheel (manylinux2014 on Linux) and the source
/// distribution under `target/wheels/`.
pub fn wheel(root: &Path) -> anyhow::Result<()> {
    let python = venv(&WHEEL_PACKAGES)?;
    let out = root.join("target").join("wheels");
    let wheel = build_wheel(root, &python, true, &out)?;
    for e in std::fs::read_dir(&out)?.flatten() {
        if e.path().to_string_lossy().ends_with(".tar.gz") {
            std::fs::remove_file(e.path())?;
        }
    }
    run_step(
        "maturin sdist",
        Command::new(&python)
            .args(["-m", "maturin", "sdist", "--manifest-path"])
            .arg(root.join(CRATE).join("Cargo.toml"))
            .arg("--out")
            .arg(&out),
    )?;
    let sdist = std::fs::read_dir(&out)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".tar.gz"))
        .with_context(|| format!("maturin wrote no sdist into {}", out.display()))?;
    println!("{}", wheel.display());
    println!("{}", sdist.display());
    println!("install it with: pip install {}", wheel.display());
    Ok(())
}

/// The pytest step of `cargo xtask test`: build the wheel (dev profile), install it into the
/// venv, run `crates/raptor-py/tests`.
pub fn test(root: &Path) -> anyhow::Result<()> {
    let start = Instant::now();
    let python = venv(&TEST_PACKAGES)?;
    let wheel = build_wheel(
        root,
        &python,
        false,
        &root.join("target").join("wheels-test"),
    )?;
    run_step(
        "pip install the wheel",
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--force-reinstall",
            ])
            .arg(&wheel),
    )?;
    // The reference packages must be there: a missing one fails the run instead of skipping.
    let torch = Command::new(&python)
        .args(["-c", "import torch"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    let required = if torch {
        "dp_accounting,opacus,torch"
    } else {
        eprintln!(
            "python: no torch in reach (no libtorch venv): the Opacus training loop is skipped"
        );
        "dp_accounting"
    };
    eprintln!("\n==> pytest crates/raptor-py/tests");
    let status = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(root.join(CRATE).join("tests"))
        .env("RAPTOR_PY_REQUIRE", required)
        .current_dir(root)
        .status()
        .context("could not start pytest")?;
    match status.code() {
        Some(0) => {}
        Some(5) => bail!("pytest collected no tests in {CRATE}/tests"),
        Some(c) => bail!("pytest failed (exit code {c}): see the failures above"),
        None => bail!("pytest was killed ({status})"),
    }
    eprintln!(
        "==> Python package tests: ok ({:.0} s)",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
