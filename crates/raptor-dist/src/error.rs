//! The crate's error type.

/// What a collective operation can report instead of completing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DistError {
    /// The ranks disagree about an operation (its buffer's length, its order): the message says
    /// what each side had.
    #[error("collective: {0}")]
    Mismatch(String),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, DistError>;
