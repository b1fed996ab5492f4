//! `cargo xtask setup`: provision libtorch 2.11.0 and wire it into the workspace.
//!
//! Resolution order:
//! 1. `LIBTORCH` set by the user (not by our `.cargo/config.toml`, which points at
//!    `target/libtorch`): its version is checked, and `target/libtorch` is linked to it.
//! 2. `LIBTORCH_USE_PYTORCH` set: the `torch` package of the active `python3` is used
//!    (version checked), and `target/libtorch` is linked to it.
//! 3. Otherwise PyPI `torch==2.11.0` is installed once into a virtual environment in a per-user
//!    cache folder (`$RAPTOR_CACHE_DIR`, else `$XDG_CACHE_HOME/raptor`, else `~/.cache/raptor`),
//!    shared by every clone, and `target/libtorch` is linked to its `torch` package.
//!
//! `.cargo/config.toml` then gives torch-sys `LIBTORCH=target/libtorch` and every binary an
//! rpath to `target/libtorch/lib`; `target/nvidia` (next to it) lets libtorch's own
//! `$ORIGIN/../../nvidia/...` rpath find the CUDA libraries of the PyPI wheel.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

/// The libtorch version tch 0.24.0 requires.
pub const TORCH_VERSION: &str = "2.11.0";
/// Free disk space the PyPI install needs (the CUDA wheel and its libraries: about 4.7 GB).
const NEEDED_BYTES: u64 = 6 * 1024 * 1024 * 1024;

/// Where libtorch came from.
#[derive(Debug)]
pub struct Libtorch {
    /// The libtorch folder (has `lib/` and `include/`).
    pub dir: PathBuf,
    /// Human-readable origin.
    pub origin: String,
}

/// The per-user cache folder.
pub fn cache_dir() -> anyhow::Result<PathBuf> {
    if let Some(d) = std::env::var_os("RAPTOR_CACHE_DIR") {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(d).join("raptor"));
    }
    let home = std::env::var_os("HOME")
        .context("neither RAPTOR_CACHE_DIR, XDG_CACHE_HOME nor HOME is set: set RAPTOR_CACHE_DIR to a writable folder")?;
    Ok(PathBuf::from(home).join(".cache").join("raptor"))
}

/// The virtual environment holding `torch==2.11.0`.
pub fn torch_venv() -> anyhow::Result<PathBuf> {
    Ok(cache_dir()?.join(format!("torch-{TORCH_VERSION}")))
}

/// Read the version of a libtorch folder: `build-version` (libtorch zip) or `version.py`
/// (the PyPI `torch` package). Returns e.g. `2.11.0+cu130`.
pub fn libtorch_version(dir: &Path) -> Option<String> {
    if let Ok(v) = std::fs::read_to_string(dir.join("build-version")) {
        return Some(v.trim().to_string());
    }
    let py = std::fs::read_to_string(dir.join("version.py")).ok()?;
    py.lines().find_map(|l| {
        let rest = l.strip_prefix("__version__")?;
        let v = rest.split(['\'', '"']).nth(1)?;
        Some(v.to_string())
    })
}

fn base_version(v: &str) -> &str {
    v.split('+').next().unwrap_or(v)
}

fn check_version(dir: &Path, what: &str) -> anyhow::Result<String> {
    if !dir.join("lib").is_dir() {
        bail!(
            "{what} = {} has no lib/ folder: it is not a libtorch installation.\n\
             Point it at a libtorch {TORCH_VERSION} folder (with lib/ and include/), or unset it \
             and run `cargo xtask setup` to install one.",
            dir.display()
        );
    }
    match libtorch_version(dir) {
        Some(v) if base_version(&v) == TORCH_VERSION => Ok(v),
        Some(v) => bail!(
            "{what} = {} is libtorch {v}, but tch 0.24.0 needs libtorch {TORCH_VERSION} exactly.\n\
             Either point {what} at a libtorch {TORCH_VERSION} (e.g. `pip install torch=={TORCH_VERSION}` \
             in a virtual environment), or unset {what} and run `cargo xtask setup`, which installs \
             one into {}.",
            dir.display(),
            torch_venv()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        ),
        None => bail!(
            "cannot tell the version of the libtorch at {what} = {} (no build-version or version.py).\n\
             tch 0.24.0 needs libtorch {TORCH_VERSION}; unset {what} and run `cargo xtask setup` to install it.",
            dir.display()
        ),
    }
}

/// Is `LIBTORCH` set by the user (as opposed to our `[env]` entry, which cargo sets for
/// `cargo run -p xtask` too)?
fn user_libtorch(root: &Path) -> Option<PathBuf> {
    let v = PathBuf::from(std::env::var_os("LIBTORCH")?);
    let ours = root.join("target").join("libtorch");
    if v == ours || v.ends_with("target/libtorch") {
        return None;
    }
    Some(v)
}

fn python_torch_dir(python: &str) -> anyhow::Result<PathBuf> {
    let out = Command::new(python)
        .args([
            "-c",
            "import torch, os; print(os.path.dirname(torch.__file__))",
        ])
        .output()
        .with_context(|| format!("LIBTORCH_USE_PYTORCH is set but `{python}` could not be run"))?;
    if !out.status.success() {
        bail!(
            "LIBTORCH_USE_PYTORCH is set but `{python} -c 'import torch'` failed:\n{}\n\
             Install torch=={TORCH_VERSION} in that Python, or unset LIBTORCH_USE_PYTORCH and run \
             `cargo xtask setup`.",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The `torch` package folder inside a venv, if torch is installed there.
fn venv_torch_dir(venv: &Path) -> Option<PathBuf> {
    let lib = venv.join("lib");
    let entries = std::fs::read_dir(&lib).ok()?;
    for e in entries.flatten() {
        let p = e.path().join("site-packages").join("torch");
        if p.join("lib").is_dir() {
            return Some(p);
        }
    }
    None
}

fn free_bytes(dir: &Path) -> Option<u64> {
    let out = Command::new("df").args(["-Pk"]).arg(dir).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().nth(1)?;
    let avail_kb: u64 = line.split_whitespace().nth(3)?.parse().ok()?;
    Some(avail_kb * 1024)
}

fn find_python() -> anyhow::Result<String> {
    for cand in ["python3", "python"] {
        if let Ok(out) = Command::new(cand).arg("--version").output()
            && out.status.success()
        {
            return Ok(cand.to_string());
        }
    }
    bail!(
        "python3 was not found on PATH. `cargo xtask setup` installs libtorch {TORCH_VERSION} from \
         PyPI (`torch=={TORCH_VERSION}`) with Python's venv and pip.\n\
         Install Python 3.10+ with venv and pip (Debian/Ubuntu: `apt-get install python3 \
         python3-venv python3-pip`), or point LIBTORCH at an existing libtorch {TORCH_VERSION} folder."
    )
}

/// Run a command, streaming its output lines into a spinner; returns the captured tail.
fn run_with_progress(cmd: &mut Command, msg: &str) -> anyhow::Result<()> {
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    pb.enable_steady_tick(Duration::from_millis(200));
    pb.set_message(msg.to_string());
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start {cmd:?}"))?;
    let stderr = child.stderr.take();
    let err_thread = std::thread::spawn(move || {
        let mut lines = Vec::new();
        if let Some(s) = stderr {
            for l in BufReader::new(s).lines().map_while(Result::ok) {
                lines.push(l);
            }
        }
        lines
    });
    let mut tail: Vec<String> = Vec::new();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let short: String = line.trim().chars().take(100).collect();
            if !short.is_empty() {
                pb.set_message(format!("{msg}: {short}"));
                if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                    // No spinner on a pipe (CI logs): print the download/install steps.
                    if short.starts_with("Collecting")
                        || short.starts_with("Downloading")
                        || short.starts_with("Installing")
                        || short.starts_with("Successfully")
                    {
                        eprintln!("  {short}");
                    }
                }
            }
            tail.push(line);
            if tail.len() > 40 {
                tail.remove(0);
            }
        }
    }
    let status = child.wait()?;
    let errs = err_thread.join().unwrap_or_default();
    pb.finish_and_clear();
    if !status.success() {
        let all = format!("{}\n{}", tail.join("\n"), errs.join("\n"));
        if all.contains("No space left on device") || all.contains("Errno 28") {
            bail!(
                "{msg} failed: the disk is full (No space left on device).\n\
                 libtorch from PyPI needs about 6 GB. Free space, or set RAPTOR_CACHE_DIR to a \
                 folder on a larger disk, and run `cargo xtask setup` again."
            );
        }
        let last: Vec<&String> = errs.iter().rev().take(15).collect();
        let last: Vec<&str> = last.into_iter().rev().map(String::as_str).collect();
        bail!("{msg} failed ({status}):\n{}", last.join("\n"));
    }
    Ok(())
}

fn install_torch(venv: &Path) -> anyhow::Result<PathBuf> {
    let python = find_python()?;
    let cache = venv.parent().context("venv path has no parent")?;
    std::fs::create_dir_all(cache)
        .with_context(|| format!("cannot create the cache folder {}", cache.display()))?;
    if let Some(free) = free_bytes(cache)
        && free < NEEDED_BYTES
    {
        bail!(
            "not enough disk space in {}: {:.1} GB free, libtorch from PyPI needs about {:.0} GB.\n\
             Free space or set RAPTOR_CACHE_DIR to a folder on a larger disk, then run \
             `cargo xtask setup` again.",
            cache.display(),
            free as f64 / 1e9,
            NEEDED_BYTES as f64 / 1e9
        );
    }
    // Install into a temporary venv and rename at the end, so an interrupted install is never
    // mistaken for a complete one.
    let tmp = cache.join(format!("torch-{TORCH_VERSION}.partial"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)
            .with_context(|| format!("cannot remove the stale {}", tmp.display()))?;
    }
    eprintln!("setup: creating a virtual environment in {}", tmp.display());
    let out = Command::new(&python)
        .args(["-m", "venv"])
        .arg(&tmp)
        .output()
        .with_context(|| format!("could not run `{python} -m venv`"))?;
    if !out.status.success() {
        bail!(
            "`{python} -m venv` failed: {}\n\
             Install Python's venv module (Debian/Ubuntu: `apt-get install python3-venv`).",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let pip = tmp.join("bin").join("pip");
    if !pip.exists() {
        bail!(
            "the virtual environment has no pip ({}): install Python's pip/ensurepip \
             (Debian/Ubuntu: `apt-get install python3-pip python3-venv`).",
            pip.display()
        );
    }
    eprintln!("setup: installing torch=={TORCH_VERSION} from PyPI (about 4.7 GB, a few minutes)");
    run_with_progress(
        Command::new(&pip).args([
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "--progress-bar",
            "off",
            &format!("torch=={TORCH_VERSION}"),
        ]),
        "pip install torch",
    )?;
    if venv.exists() {
        std::fs::remove_dir_all(venv)
            .with_context(|| format!("cannot replace {}", venv.display()))?;
    }
    // A venv records its absolute path in its scripts; torch itself does not care (we only
    // use its libraries), and pip inside it is not used again.
    std::fs::rename(&tmp, venv)
        .with_context(|| format!("cannot move {} to {}", tmp.display(), venv.display()))?;
    venv_torch_dir(venv).context("torch was installed but its package folder was not found")
}

fn symlink(target: &Path, link: &Path) -> anyhow::Result<()> {
    if let Ok(meta) = std::fs::symlink_metadata(link) {
        if meta.file_type().is_symlink() {
            if std::fs::read_link(link).ok().as_deref() == Some(target) {
                return Ok(());
            }
            std::fs::remove_file(link)?;
        } else {
            bail!(
                "{} exists and is not a symlink; remove it so setup can link libtorch there",
                link.display()
            );
        }
    }
    if let Some(parent) = link.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("cannot link {} -> {}", link.display(), target.display()))
}

/// The target folders whose binaries must find libtorch: `<root>/target` and
/// `$CARGO_TARGET_DIR` when set elsewhere.
fn target_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![root.join("target")];
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        let t = PathBuf::from(t);
        let t = if t.is_absolute() { t } else { root.join(t) };
        if !dirs.contains(&t) {
            dirs.push(t);
        }
    }
    dirs
}

fn link_into_workspace(root: &Path, libtorch: &Path) -> anyhow::Result<()> {
    let nvidia = libtorch
        .parent()
        .map(|p| p.join("nvidia"))
        .filter(|p| p.is_dir());
    for t in target_dirs(root) {
        symlink(libtorch, &t.join("libtorch"))?;
        if let Some(nv) = &nvidia {
            symlink(nv, &t.join("nvidia"))?;
        }
    }
    Ok(())
}

/// Provision libtorch and link it into the workspace. Idempotent: a second run does nothing
/// (beyond checking) and says so.
pub fn setup(root: &Path, verbose: bool) -> anyhow::Result<Libtorch> {
    let lt = if let Some(dir) = user_libtorch(root) {
        let v = check_version(&dir, "LIBTORCH")?;
        Libtorch {
            origin: format!("LIBTORCH (yours), version {v}"),
            dir,
        }
    } else if std::env::var_os("LIBTORCH_USE_PYTORCH").is_some() {
        let python = if std::env::var_os("VIRTUAL_ENV").is_some() {
            "python"
        } else {
            "python3"
        };
        let dir = python_torch_dir(python)?;
        let v = check_version(&dir, "LIBTORCH_USE_PYTORCH's torch")?;
        Libtorch {
            origin: format!("LIBTORCH_USE_PYTORCH ({python}), version {v}"),
            dir,
        }
    } else {
        let venv = torch_venv()?;
        match venv_torch_dir(&venv) {
            Some(dir)
                if libtorch_version(&dir).as_deref().map(base_version) == Some(TORCH_VERSION) =>
            {
                let v = libtorch_version(&dir).unwrap_or_default();
                Libtorch {
                    origin: format!(
                        "already installed in {} (version {v}), nothing to download",
                        venv.display()
                    ),
                    dir,
                }
            }
            found => {
                if let Some(dir) = found {
                    eprintln!(
                        "setup: {} holds libtorch {:?}, not {TORCH_VERSION}: reinstalling",
                        dir.display(),
                        libtorch_version(&dir)
                    );
                }
                let dir = install_torch(&venv)?;
                let v = check_version(&dir, "the installed torch")?;
                Libtorch {
                    origin: format!("installed into {} (version {v})", venv.display()),
                    dir,
                }
            }
        }
    };
    link_into_workspace(root, &lt.dir)?;
    if verbose {
        eprintln!("setup: libtorch {}", lt.origin);
        eprintln!(
            "setup: linked {} -> {}",
            root.join("target/libtorch").display(),
            lt.dir.display()
        );
        if lt.dir.join("lib").join("libtorch_cuda.so").exists() {
            eprintln!("setup: this libtorch has CUDA (libtorch_cuda.so): binaries force-link it");
        }
    }
    Ok(lt)
}
