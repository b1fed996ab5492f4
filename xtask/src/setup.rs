//! `cargo xtask setup`: provision libtorch 2.11.0 and wire it into the workspace.
//!
//! Resolution order:
//! 1. `LIBTORCH` set by the user (not by our `.cargo/config.toml`, which points at
//!    `target/libtorch`): its version is checked, and `target/libtorch` is linked to it.
//! 2. `LIBTORCH_USE_PYTORCH` set: the `torch` package of the active `python3` is used
//!    (version checked), and `target/libtorch` is linked to it.
//! 3. Otherwise PyPI `torch==2.11.0` is installed once into a virtual environment in a per-user
//!    cache folder (`$RAPTOR_CACHE_DIR`, else `$XDG_CACHE_HOME/raptor`, else `~/.cache/raptor`),
//!    shared by every clone, and `target/libtorch` is linked to it. Which install depends on the
//!    machine ([`Variant`]):
//!    - **CUDA** (a machine with an NVIDIA driver, or `--cuda`): `torch` with all its
//!      dependencies (about 4.7 GB, of which 2.7 GB NVIDIA libraries and 0.6 GB triton), in
//!      `torch-2.11.0/`; `target/libtorch` is its `torch` package, and binaries force-link
//!      `libtorch_cuda.so`.
//!    - **CPU-only** (no NVIDIA driver, or `--cpu`): the `torch` wheel alone (`--no-deps`, about
//!      0.5 GB) plus the two small NVIDIA runtime wheels that `libtorch_cpu.so` itself needs
//!      (`libcudart`, `libcupti`: about 13 MB), in `torch-2.11.0-cpu/`; `target/libtorch` is a
//!      folder of links to that wheel's CPU libraries only (`libtorch-cpu/`, beside the `torch`
//!      package), so torch-sys links no `libtorch_cuda.so` and nothing needs cuBLAS or cuDNN.
//!
//!    An explicit `--cpu` / `--cuda` is remembered in `target/libtorch.variant`, so later
//!    `cargo xtask test` / `reproduce` runs keep it instead of detecting again.
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
/// Free disk space the CPU-only install needs (the torch wheel, unpacked: about 1.3 GB).
const NEEDED_BYTES_CPU: u64 = 2 * 1024 * 1024 * 1024;
/// The NVIDIA runtime wheels `libtorch_cpu.so` of the PyPI torch 2.11.0 wheel links against
/// (`libcudart.so.13`, `libcupti.so.13`), at the versions torch 2.11.0's own
/// `cuda-toolkit[cudart,cupti]==13.0.2` requirement resolves to. They are loaded but never used
/// on a machine without a GPU.
const CPU_RUNTIME_WHEELS: [&str; 2] =
    ["nvidia-cuda-runtime==13.0.96", "nvidia-cuda-cupti==13.0.85"];
/// Libraries of the torch wheel that belong to its CUDA build (left out of the CPU-only view).
const CUDA_ONLY_LIBS: [&str; 6] = [
    "libtorch_cuda.so",
    "libtorch_cuda_linalg.so",
    "libc10_cuda.so",
    "libcaffe2_nvrtc.so",
    "libtorch_nvshmem.so",
    "libtorch_python.so",
];
/// Name of the folder of links (inside the CPU venv's site-packages) used as libtorch.
const CPU_VIEW: &str = "libtorch-cpu";

/// Which libtorch install to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The torch wheel with its CUDA libraries (needs an NVIDIA driver to use a GPU).
    Cuda,
    /// The torch wheel's CPU libraries only.
    Cpu,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Cuda => "cuda",
            Variant::Cpu => "cpu",
        }
    }

    fn parse(s: &str) -> Option<Variant> {
        match s.trim() {
            "cuda" => Some(Variant::Cuda),
            "cpu" => Some(Variant::Cpu),
            _ => None,
        }
    }
}

/// Does this machine have an NVIDIA driver? (The kernel module's version file, a device node,
/// or `libcuda.so.1` known to the dynamic loader.)
pub fn nvidia_driver_present() -> bool {
    if Path::new("/proc/driver/nvidia/version").exists() || Path::new("/dev/nvidia0").exists() {
        return true;
    }
    Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so.1"))
        .unwrap_or(false)
}

/// The variant to install: the one asked for (saved for later runs), else the one saved by an
/// earlier explicit choice, else detection.
fn choose_variant(root: &Path, asked: Option<Variant>) -> anyhow::Result<(Variant, String)> {
    let saved = root.join("target").join("libtorch.variant");
    if let Some(v) = asked {
        std::fs::create_dir_all(root.join("target"))?;
        std::fs::write(&saved, format!("{}\n", v.name()))
            .with_context(|| format!("cannot write {}", saved.display()))?;
        return Ok((
            v,
            format!("--{} (saved in target/libtorch.variant)", v.name()),
        ));
    }
    if let Ok(text) = std::fs::read_to_string(&saved) {
        if let Some(v) = Variant::parse(&text) {
            return Ok((
                v,
                "target/libtorch.variant (an earlier --cpu/--cuda; delete it to detect again)"
                    .into(),
            ));
        }
        bail!(
            "{} says {:?}: expected `cpu` or `cuda`. Delete it, or run `cargo xtask setup --cpu` \
             or `--cuda`.",
            saved.display(),
            text.trim()
        );
    }
    Ok(if nvidia_driver_present() {
        (Variant::Cuda, "detected an NVIDIA driver".into())
    } else {
        (Variant::Cpu, "no NVIDIA driver found".into())
    })
}

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

/// The virtual environment holding `torch==2.11.0` with its CUDA dependencies.
pub fn torch_venv() -> anyhow::Result<PathBuf> {
    Ok(cache_dir()?.join(format!("torch-{TORCH_VERSION}")))
}

/// The virtual environment holding the CPU-only install.
pub fn torch_cpu_venv() -> anyhow::Result<PathBuf> {
    Ok(cache_dir()?.join(format!("torch-{TORCH_VERSION}-cpu")))
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

fn install_torch(venv: &Path, variant: Variant) -> anyhow::Result<PathBuf> {
    let python = find_python()?;
    let cache = venv.parent().context("venv path has no parent")?;
    std::fs::create_dir_all(cache)
        .with_context(|| format!("cannot create the cache folder {}", cache.display()))?;
    let needed = match variant {
        Variant::Cuda => NEEDED_BYTES,
        Variant::Cpu => NEEDED_BYTES_CPU,
    };
    if let Some(free) = free_bytes(cache)
        && free < needed
    {
        bail!(
            "not enough disk space in {}: {:.1} GB free, libtorch from PyPI ({}) needs about {:.0} GB.\n\
             Free space or set RAPTOR_CACHE_DIR to a folder on a larger disk, then run \
             `cargo xtask setup` again.",
            cache.display(),
            free as f64 / 1e9,
            variant.name(),
            needed as f64 / 1e9
        );
    }
    // Install into a temporary venv and rename at the end, so an interrupted install is never
    // mistaken for a complete one.
    let venv_name = venv
        .file_name()
        .context("venv path has no file name")?
        .to_string_lossy()
        .to_string();
    let tmp = cache.join(format!("{venv_name}.partial"));
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
    let torch = format!("torch=={TORCH_VERSION}");
    let mut pip_cmd = Command::new(&pip);
    pip_cmd.args([
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--progress-bar",
        "off",
    ]);
    match variant {
        Variant::Cuda => {
            eprintln!(
                "setup: installing {torch} with its CUDA libraries from PyPI (about 4.7 GB, a few minutes)"
            );
            pip_cmd.arg(&torch);
        }
        Variant::Cpu => {
            eprintln!(
                "setup: installing {torch} without its CUDA libraries from PyPI (about 0.5 GB; \
                 `cargo xtask setup --cuda` installs the GPU build)"
            );
            pip_cmd
                .arg("--no-deps")
                .arg(&torch)
                .args(CPU_RUNTIME_WHEELS);
        }
    }
    run_with_progress(&mut pip_cmd, "pip install torch")?;
    if variant == Variant::Cpu {
        let torch_dir = venv_torch_dir(&tmp)
            .context("torch was installed but its package folder was not found")?;
        make_cpu_view(&torch_dir)?;
    }
    if venv.exists() {
        std::fs::remove_dir_all(venv)
            .with_context(|| format!("cannot replace {}", venv.display()))?;
    }
    // A venv records its absolute path in its scripts; torch itself does not care (we only
    // use its libraries), and pip inside it is not used again.
    std::fs::rename(&tmp, venv)
        .with_context(|| format!("cannot move {} to {}", tmp.display(), venv.display()))?;
    installed_libtorch(venv, variant)
        .context("torch was installed but its package folder was not found")
}

/// The libtorch folder of an installed venv of this variant: the `torch` package (CUDA) or the
/// CPU-only view beside it.
fn installed_libtorch(venv: &Path, variant: Variant) -> Option<PathBuf> {
    let torch = venv_torch_dir(venv)?;
    match variant {
        Variant::Cuda => Some(torch),
        Variant::Cpu => {
            let view = torch.parent()?.join(CPU_VIEW);
            view.join("lib")
                .join("libtorch_cpu.so")
                .exists()
                .then_some(view)
        }
    }
}

/// Make `<site-packages>/libtorch-cpu/`: `lib/` with a link to every library of the torch wheel
/// except its CUDA ones, and links to `include/` and `version.py`. torch-sys pointed at it links
/// no `libtorch_cuda.so`. It sits beside `torch/` so the libraries' own
/// `$ORIGIN/../../nvidia/...` run path still finds `libcudart` and `libcupti`.
fn make_cpu_view(torch: &Path) -> anyhow::Result<PathBuf> {
    let site = torch
        .parent()
        .context("the torch package has no parent folder")?;
    let view = site.join(CPU_VIEW);
    if view.exists() {
        std::fs::remove_dir_all(&view)
            .with_context(|| format!("cannot replace {}", view.display()))?;
    }
    let lib = view.join("lib");
    std::fs::create_dir_all(&lib).with_context(|| format!("cannot create {}", lib.display()))?;
    let mut linked = 0usize;
    for entry in std::fs::read_dir(torch.join("lib"))
        .with_context(|| format!("cannot read {}", torch.join("lib").display()))?
    {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().to_string();
        if CUDA_ONLY_LIBS.contains(&name.as_str()) {
            continue;
        }
        // Relative links: the venv is installed under a temporary name and renamed.
        symlink(&Path::new("../../torch/lib").join(&name), &lib.join(&name))?;
        linked += 1;
    }
    if !lib.join("libtorch_cpu.so").exists() {
        bail!(
            "{} has no libtorch_cpu.so ({linked} files linked): not the PyPI torch {TORCH_VERSION} layout",
            torch.join("lib").display()
        );
    }
    for name in ["include", "version.py"] {
        symlink(&Path::new("../torch").join(name), &view.join(name))?;
    }
    Ok(view)
}

/// Make `link` point at `target`; true when it changed.
fn symlink(target: &Path, link: &Path) -> anyhow::Result<bool> {
    if let Ok(meta) = std::fs::symlink_metadata(link) {
        if meta.file_type().is_symlink() {
            if std::fs::read_link(link).ok().as_deref() == Some(target) {
                return Ok(false);
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
        .with_context(|| format!("cannot link {} -> {}", link.display(), target.display()))?;
    Ok(true)
}

/// The packages whose build outputs depend on which libtorch `target/libtorch` is (torch-sys
/// decides at build time whether to link `libtorch_cuda`, and our build scripts force-link it):
/// cargo cannot see a symlink change (`LIBTORCH` keeps its value), so they are cleaned.
const LIBTORCH_DEPENDENT: [&str; 12] = [
    "torch-sys",
    "raptor-models",
    "raptor-optim",
    "raptor-train",
    "raptor-run",
    "raptor-audit",
    "raptor",
    "raptor-reproduce",
    "raptor-clip",
    "raptor-muon",
    "raptor-routing",
    "raptor-benches",
];

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
        let had = std::fs::symlink_metadata(t.join("libtorch")).is_ok();
        let changed = symlink(libtorch, &t.join("libtorch"))?;
        if let Some(nv) = &nvidia {
            symlink(nv, &t.join("nvidia"))?;
        }
        if changed && had {
            eprintln!(
                "setup: target/libtorch now points at another libtorch: cleaning the packages built against the old one"
            );
            // `cargo clean -p` only cleans one profile's folder: the dev one (tests too) and the
            // release one (benches too).
            for profile in [None, Some("--release")] {
                let mut cmd =
                    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
                cmd.arg("clean").arg("--target-dir").arg(&t);
                cmd.args(profile);
                for p in LIBTORCH_DEPENDENT {
                    cmd.args(["-p", p]);
                }
                let status = cmd.status().context("could not run cargo clean")?;
                if !status.success() {
                    bail!("cargo clean of the libtorch-dependent packages failed ({status})");
                }
            }
        }
    }
    Ok(())
}

/// Provision libtorch and link it into the workspace. Idempotent: a second run does nothing
/// (beyond checking) and says so.
///
/// `asked` is an explicit `--cpu` / `--cuda` (remembered for later runs); `None` keeps an
/// earlier explicit choice or detects an NVIDIA driver. It has no effect when `LIBTORCH` or
/// `LIBTORCH_USE_PYTORCH` names the libtorch to use.
pub fn setup(root: &Path, verbose: bool, asked: Option<Variant>) -> anyhow::Result<Libtorch> {
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
        let (variant, why) = choose_variant(root, asked)?;
        let venv = match variant {
            Variant::Cuda => torch_venv()?,
            Variant::Cpu => torch_cpu_venv()?,
        };
        let what = match variant {
            Variant::Cuda => "the CUDA build",
            Variant::Cpu => "the CPU-only build",
        };
        match installed_libtorch(&venv, variant) {
            Some(dir)
                if libtorch_version(&dir).as_deref().map(base_version) == Some(TORCH_VERSION) =>
            {
                let v = libtorch_version(&dir).unwrap_or_default();
                Libtorch {
                    origin: format!(
                        "{what} ({why}), already installed in {} (version {v}), nothing to download",
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
                let dir = install_torch(&venv, variant)?;
                let v = check_version(&dir, "the installed torch")?;
                Libtorch {
                    origin: format!(
                        "{what} ({why}), installed into {} (version {v})",
                        venv.display()
                    ),
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
        } else {
            eprintln!(
                "setup: this libtorch is CPU-only (no libtorch_cuda.so): `device = \"cuda\"` is unavailable"
            );
        }
    }
    Ok(lt)
}
