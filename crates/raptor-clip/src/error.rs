//! The crate's error type.

/// Everything that can go wrong in raptor-clip. Each variant carries the offending values.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum ClipError {
    /// Two sizes that must agree do not.
    #[error("shape mismatch for {what}: expected {expected}, got {got}")]
    ShapeMismatch {
        /// Which input.
        what: String,
        /// The expected size or shape.
        expected: String,
        /// The size or shape that was given.
        got: String,
    },
    /// A clipping bound is not a finite positive number.
    #[error("clipping bound {name} = {value} must be finite and > 0")]
    InvalidBound {
        /// Which bound, for the message: a group key as displayed, `group g` for the kernels'
        /// group at position g, a block name, or "bound".
        name: String,
        /// The value given.
        value: f64,
    },
    /// A per-record weight lies outside [0, 1] (or is not finite).
    #[error("weight of record {index} is {value}, must lie in [0, 1]")]
    InvalidWeight {
        /// Record index.
        index: usize,
        /// The value given.
        value: f64,
    },
    /// A gradient contains NaN or an infinity.
    #[error("non-finite gradient for record {record} in {part} (squared norm {value})")]
    NonFinite {
        /// Record (example) index.
        record: usize,
        /// Block or group name where it was detected.
        part: String,
        /// The offending squared norm (NaN or inf).
        value: f64,
    },
    /// The block grouping is not a partition of the blocks.
    #[error("invalid grouping: {reason}")]
    InvalidGrouping {
        /// What is wrong.
        reason: String,
    },
    /// The noise multiplier is not a finite positive number.
    #[error("noise multiplier {value} must be finite and > 0")]
    InvalidNoiseMultiplier {
        /// The value given.
        value: f64,
    },
    /// The L2 sensitivity is not a finite positive number.
    #[error("sensitivity {value} must be finite and > 0")]
    InvalidSensitivity {
        /// The value given.
        value: f64,
    },
    /// The public denominator is not a finite positive number.
    #[error("public denominator {value} must be finite and > 0")]
    InvalidDenominator {
        /// The value given.
        value: f64,
    },
    /// A token mask holds values other than 0 and 1.
    #[error("token mask must be boolean or 0/1, found a value {value}")]
    InvalidMask {
        /// An offending value.
        value: f64,
    },
    /// A schedule name that is not one of the kernel's (see `plan::Schedule`'s `Display`).
    #[error("unknown clip schedule {value:?} (expected rows(1|2|4|8), columns(1|2|4) or two-pass)")]
    InvalidSchedule {
        /// The text given.
        value: String,
    },
    /// A wisdom file could not be read, written or parsed.
    #[error("wisdom: {0}")]
    Wisdom(#[from] raptor_plan::PlanError),
    /// The operating system's random source failed.
    #[error("OS random source failed: {0}")]
    Rng(String),
    /// libtorch reported an error (tch backend).
    #[error("libtorch: {0}")]
    Torch(String),
}

#[cfg(feature = "tch")]
impl From<tch::TchError> for ClipError {
    fn from(e: tch::TchError) -> Self {
        ClipError::Torch(e.to_string())
    }
}
