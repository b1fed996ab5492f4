//! The error type of this crate.

/// Everything that can go wrong in `raptor-eval`. Each variant carries the offending values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum EvalError {
    /// A metric needs at least one value.
    #[error("{what}: no values (at least one is needed)")]
    Empty {
        /// Which input.
        what: &'static str,
    },
    /// Two inputs that must have the same length do not.
    #[error("{what}: lengths differ ({left} vs {right})")]
    LengthMismatch {
        /// Which inputs.
        what: &'static str,
        /// Length of the first.
        left: usize,
        /// Length of the second.
        right: usize,
    },
    /// A value is NaN or infinite (or otherwise outside its domain).
    #[error("{what}: invalid value {value} at index {index}")]
    InvalidValue {
        /// Which input.
        what: &'static str,
        /// Position in the input.
        index: usize,
        /// The offending value.
        value: f64,
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
    /// Counts that must satisfy an order do not (e.g. correct ≤ guesses ≤ canaries).
    #[error("invalid counts: {0}")]
    InvalidCounts(String),
    /// A hypothesis has no reference.
    #[error("hypothesis {index}: no reference")]
    NoReference {
        /// 0-based index of the hypothesis.
        index: usize,
    },
}

/// A corpus metric's inputs: one reference list per hypothesis, at least one hypothesis.
pub(crate) fn check_corpus(hypotheses: usize, references: usize) -> Result<(), EvalError> {
    if hypotheses != references {
        return Err(EvalError::LengthMismatch {
            what: "hypotheses and references",
            left: hypotheses,
            right: references,
        });
    }
    if hypotheses == 0 {
        return Err(EvalError::Empty { what: "hypotheses" });
    }
    Ok(())
}
