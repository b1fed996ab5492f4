//! raptor-train: the private step and its config — what a run of any method does between
//! drawing a Poisson sample and charging the ledger — and nothing else.
//!
//! - [`config`] (crate `raptor-config`, re-exported): the run configuration (`run.toml`), every
//!   field documented with a default, and its one validator.
//! - [`streams`]: the one description every method is made of (phases of releases over clip
//!   groups) and [`methods`], the pure function that turns a config into it (scope, layer, σ's).
//! - [`trainer`]: the loop: Poisson sample, per-record clipping, noise ÷ public denominator,
//!   ledger charged before the update is applied, optimizers (crate `raptor-optim`, re-exported
//!   as [`optim`]) on released gradients.
//! - [`dist`] (crate `raptor-dist`, re-exported): data-parallel private training over MPI
//!   (cargo feature `mpi`): rank 0 samples and adds the noise once, the clipped sums are
//!   all-reduced (the trainer's side is `trainer/collective.rs`).
//!
//! Everything that prepares or records a run (data and model preparation, run folders,
//! checkpoints and resume, records, export, the start report, diagnostics, public clip
//! calibration, upcycling glue, device choice) is crate `raptor-run`, above this one; the audit
//! (`raptor-audit`), the `raptor` program and the experiment driver (`raptor-reproduce`) are
//! above that.

pub mod error;
pub mod methods;
pub mod streams;
pub mod trainer;

pub use error::{Result, TrainError};

/// The run configuration (crate `raptor-config`, re-exported): `run.toml`'s types, their
/// choices and their one validator.
pub use raptor_config as config;

/// The optimizers on released gradients (crate `raptor-optim`).
pub use raptor_optim as optim;

/// The collective operations of data-parallel training (crate `raptor-dist`: one process, or
/// MPI under the cargo feature `mpi`).
pub use raptor_dist as dist;

/// Whether this build of the library holds the planted noise bugs of the audit's tests (the
/// test/audit-only cargo feature `planted-faults`, turned on through crate `raptor-audit`'s
/// feature of the same name); the `raptor` program refuses to build when it does.
pub const PLANTED_FAULTS: bool = cfg!(feature = "planted-faults");

/// The `tch` version this program was built with (read from the workspace's `Cargo.lock` at
/// build time).
pub const TCH_VERSION: &str = env!("RAPTOR_TCH_VERSION");

/// The version of the libtorch this process loaded, read at run time from the library's own
/// folder: `build-version` (a libtorch zip) or `version.py` (the PyPI `torch` package), found
/// through `/proc/self/maps`. Where that is not possible (another OS, an unusual layout) it says
/// so instead of guessing.
pub fn libtorch_version() -> String {
    // Any call into libtorch makes sure the library is mapped.
    let _ = tch::Cuda::is_available();
    loaded_libtorch_dir()
        .and_then(|d| read_libtorch_version(&d))
        .unwrap_or_else(|| "unknown (the loaded libtorch folder has no version file)".into())
}

/// The folder of the loaded `libtorch_cpu` (the parent of its `lib/`).
fn loaded_libtorch_dir() -> Option<std::path::PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let lib = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            std::path::Path::new(p)
                .file_name()
                .and_then(|f| f.to_str())
                .is_some_and(|f| f.starts_with("libtorch_cpu."))
        })?;
    let lib = std::path::Path::new(lib);
    Some(lib.parent()?.parent()?.to_path_buf())
}

/// `build-version` or `version.py`'s `__version__` in a libtorch folder.
fn read_libtorch_version(dir: &std::path::Path) -> Option<String> {
    if let Ok(v) = std::fs::read_to_string(dir.join("build-version")) {
        let v = v.trim();
        if !v.is_empty() {
            return Some(v.to_string());
        }
    }
    let py = std::fs::read_to_string(dir.join("version.py")).ok()?;
    py.lines()
        .find(|l| l.trim_start().starts_with("__version__"))
        .and_then(|l| l.split(['\'', '"']).nth(1))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    #[test]
    fn versions_are_read_not_written() {
        // This workspace pins tch 0.24.0, which needs libtorch 2.11.0 (`cargo xtask setup`).
        assert_eq!(super::TCH_VERSION, "0.24.0");
        let v = super::libtorch_version();
        assert!(v.starts_with("2.11.0"), "{v}");
        let dir = std::env::temp_dir().join(format!("raptor-ltv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok();
        std::fs::write(
            dir.join("version.py"),
            "git_version = 'x'\n__version__ = '9.9.9+cpu'\n",
        )
        .ok();
        assert_eq!(
            super::read_libtorch_version(&dir).as_deref(),
            Some("9.9.9+cpu")
        );
        std::fs::write(dir.join("build-version"), "8.8.8\n").ok();
        assert_eq!(super::read_libtorch_version(&dir).as_deref(), Some("8.8.8"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
