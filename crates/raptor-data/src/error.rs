//! The error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong in `raptor-data`. Each variant names the file and, where there
/// is one, the line (1-based, as an editor shows it), the record (0-based id) and the column.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// A file could not be opened, read or written.
    #[error("{}: {message}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        message: String,
    },
    /// The format of a table could not be told from its file name.
    #[error(
        "{}: cannot tell the format from the file name (expected .csv, .tsv or .jsonl/.ndjson); name it explicitly",
        path.display()
    )]
    UnknownFormat {
        /// The file.
        path: PathBuf,
    },
    /// A column the spec names is not in the header (or a JSONL object lacks the field).
    #[error("missing column `{column}` in {}{} (columns: {})", path.display(), line_suffix(*line), available.join(", "))]
    MissingColumn {
        /// The requested column.
        column: String,
        /// The file.
        path: PathBuf,
        /// The line (JSONL only; `None` for a CSV/TSV header).
        line: Option<u64>,
        /// The columns (fields) that are there.
        available: Vec<String>,
    },
    /// The text and label columns of a table could not be told apart
    /// ([`crate::detect::detect_columns`]).
    #[error("{}: {message}", path.display())]
    Undetectable {
        /// The file.
        path: PathBuf,
        /// Why, with the columns and what to do.
        message: String,
    },
    /// A pinned wheel could not be downloaded.
    #[error("cannot fetch {what}: {message}")]
    Fetch {
        /// `package==version`.
        what: String,
        /// Why, and how to bring the wheel by hand.
        message: String,
    },
    /// A line or record could not be parsed.
    #[error("{}, line {line}: {message}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// What is wrong.
        message: String,
    },
    /// An entry of a JSON list (e.g. a DART record) is invalid.
    #[error("{}, entry {entry}: {message}", path.display())]
    BadEntry {
        /// The file.
        path: PathBuf,
        /// 0-based index of the entry in the list.
        entry: usize,
        /// What is wrong.
        message: String,
    },
    /// A record's text column is empty (or only whitespace).
    #[error("{}, line {line} (record {record}): column `{column}` is empty", path.display())]
    EmptyText {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// 0-based record id.
        record: usize,
        /// The empty column.
        column: String,
    },
    /// A file holds no records (after any skipping).
    #[error("{}: the dataset is empty{}", path.display(), if *skipped > 0 { format!(" ({skipped} records skipped)") } else { String::new() })]
    EmptyDataset {
        /// The file.
        path: PathBuf,
        /// Records skipped by the empty-text policy.
        skipped: usize,
    },
    /// A record's label is not in the label map.
    #[error("record {record}: label `{label}` is not in the label map (labels: {})", known.join(", "))]
    UnknownLabel {
        /// The unseen label.
        label: String,
        /// 0-based record id.
        record: usize,
        /// The labels of the map, in index order.
        known: Vec<String>,
    },
    /// A record has no label where one is needed.
    #[error("record {record}: has no label (the table was read without a label column)")]
    MissingLabel {
        /// 0-based record id.
        record: usize,
    },
    /// A label map was given an invalid label list.
    #[error("invalid label list: {0}")]
    InvalidLabels(String),
    /// A fraction is not a finite number in [0, 1] (or fractions do not add up).
    #[error("{what}: fraction {value} must be a finite number in [0, 1]")]
    InvalidFraction {
        /// Which fraction.
        what: &'static str,
        /// The offending value.
        value: f64,
    },
    /// A record id appears twice in ids to split.
    #[error("record id {0} appears twice in the ids to split")]
    DuplicateId(usize),
    /// A downloaded file does not have the pinned SHA-256.
    #[error("{}: SHA-256 is {actual}, expected {expected} (a different or corrupted download; delete it and fetch again)", path.display())]
    Checksum {
        /// The file.
        path: PathBuf,
        /// The pinned hash.
        expected: String,
        /// The hash of the file.
        actual: String,
    },
    /// A wheel (zip archive) is unreadable or lacks the expected member.
    #[error("{}: archive member `{member}`: {message}", path.display())]
    Archive {
        /// The archive.
        path: PathBuf,
        /// The member.
        member: String,
        /// What is wrong.
        message: String,
    },
    /// A corpus of the cache has not been prepared (or a split name is unknown).
    #[error("{}: {message}", path.display())]
    NotPrepared {
        /// The expected file.
        path: PathBuf,
        /// What to do.
        message: String,
    },
    /// A multi-domain task's rules or records are invalid ([`crate::domains`]).
    #[error("multi-domain task: {0}")]
    InvalidDomains(String),
    /// An input is larger than the limit this crate reads.
    #[error("{}: larger than the limit of {limit} bytes", path.display())]
    TooLarge {
        /// The file (or archive member).
        path: PathBuf,
        /// The limit in bytes.
        limit: u64,
    },
}

fn line_suffix(line: Option<u64>) -> String {
    line.map(|l| format!(", line {l}")).unwrap_or_default()
}

impl DataError {
    pub(crate) fn io(path: &std::path::Path, e: &std::io::Error) -> Self {
        DataError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        }
    }
}
