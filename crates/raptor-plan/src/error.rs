//! The crate's error type.

/// Everything that can go wrong in raptor-plan.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// A wisdom file could not be read or written.
    #[error("wisdom file {path}: {reason}")]
    WisdomIo {
        /// The file.
        path: String,
        /// The operating system's message.
        reason: String,
    },
    /// A wisdom text is not in the expected format.
    #[error("corrupt wisdom (line {line}): {reason}")]
    CorruptWisdom {
        /// 1-based line number of the first offending line (0: the whole text).
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A key or a choice holds characters the wisdom format cannot store.
    #[error("invalid wisdom entry {what} {value:?}: {reason}")]
    InvalidEntry {
        /// "key" or "choice".
        what: &'static str,
        /// The offending value.
        value: String,
        /// What is wrong.
        reason: &'static str,
    },
}
