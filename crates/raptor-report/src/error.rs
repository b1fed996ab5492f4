//! The error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong in `raptor-report`. Each variant says what was wrong with
/// which input, so a driver can print it as is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// An input needs at least one value (or series, category, …).
    #[error("{what}: nothing given (at least one is needed)")]
    Empty {
        /// Which input.
        what: String,
    },
    /// A value is NaN or infinite (or, on a log axis, not positive).
    #[error("{what}: invalid value {value} at index {index}")]
    InvalidValue {
        /// Which input.
        what: String,
        /// Position in the input.
        index: usize,
        /// The offending value.
        value: f64,
    },
    /// Two inputs that must have the same length do not.
    #[error("{what}: lengths differ ({left} vs {right})")]
    LengthMismatch {
        /// Which inputs.
        what: String,
        /// Length of the first.
        left: usize,
        /// Length of the second.
        right: usize,
    },
    /// A parameter is outside its domain.
    #[error("{what} = {value} is out of range ({expected})")]
    OutOfRange {
        /// Which parameter.
        what: &'static str,
        /// The offending value.
        value: f64,
        /// The allowed range, in words.
        expected: &'static str,
    },
    /// A table is malformed (bad slug, ragged rows).
    #[error("table {slug:?}: {reason}")]
    InvalidTable {
        /// The table's slug.
        slug: String,
        /// What is wrong.
        reason: String,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Serializing to JSON failed.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The embedded font could not be registered with the plotting library.
    #[error("embedded font: {0}")]
    Font(String),
    /// The plotting library failed to draw.
    #[error("drawing {path}: {message}")]
    Draw {
        /// The plot being drawn.
        path: PathBuf,
        /// The plotting library's message.
        message: String,
    },
    /// Encoding the PNG failed.
    #[error("encoding {path}: {source}")]
    Png {
        /// The plot being encoded.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: png::EncodingError,
    },
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, ReportError>;
