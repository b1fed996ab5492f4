//! The error type of this crate.

/// Everything that can go wrong in `raptor-routing`. Each variant carries the offending values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RoutingError {
    /// A layer needs at least one expert.
    #[error("num_experts must be at least 1, got {0}")]
    NoExperts(usize),
    /// The number of experts does not fit the `u32` expert indices of an owner map.
    #[error("num_experts = {0} is too large (at most {max})", max = u32::MAX)]
    TooManyExperts(usize),
    /// `top_k` must be in `1..=num_experts`.
    #[error("top_k must be in 1..={num_experts}, got {top_k}")]
    InvalidTopK {
        /// The requested top-k.
        top_k: usize,
        /// The number of experts of the layer.
        num_experts: usize,
    },
    /// A slice or tensor has the wrong length or shape.
    #[error("{what}: expected {expected}, got {actual}")]
    ShapeMismatch {
        /// Which argument.
        what: &'static str,
        /// What was expected (a length or a shape).
        expected: String,
        /// What was passed.
        actual: String,
    },
    /// An expert index of a valid token is not below `num_experts`.
    #[error(
        "token {token}, slot {slot}: expert index {index} is out of range (num_experts = {num_experts})"
    )]
    ExpertOutOfRange {
        /// Token position in the record.
        token: usize,
        /// Top-k slot.
        slot: usize,
        /// The offending index (as passed; negative tensor values are reported as is).
        index: i64,
        /// The number of experts of the layer.
        num_experts: usize,
    },
    /// A gate weight of a valid token is negative, NaN or infinite.
    #[error("token {token}, slot {slot}: gate weight {weight} is not a finite non-negative number")]
    InvalidWeight {
        /// Token position in the record.
        token: usize,
        /// Top-k slot.
        slot: usize,
        /// The offending weight.
        weight: f32,
    },
    /// A mask value is not 0/1 (or false/true).
    #[error("token {token}: mask value {value} is not 0 or 1")]
    InvalidMask {
        /// Token position in the record.
        token: usize,
        /// The offending value.
        value: f64,
    },
    /// Too many tokens for the offsets of one layer (more than `u64::MAX`, or than memory allows).
    #[error("layer holds too many tokens: {0}")]
    TooManyTokens(usize),
    /// Statistics need at least one record.
    #[error("statistics of an empty owner map (0 records) are undefined")]
    EmptyOwnerMap,
    /// Two owner maps (or layers) that must match do not.
    #[error("mismatch between {what}: {left} vs {right}")]
    Mismatch {
        /// What differs.
        what: &'static str,
        /// Left-hand value.
        left: usize,
        /// Right-hand value.
        right: usize,
    },
    /// Layer selection needs at least one candidate layer.
    #[error("layer selection needs at least one candidate layer")]
    NoCandidateLayers,
    /// A layer id was given twice.
    #[error("candidate layer id {0} appears twice")]
    DuplicateLayer(usize),
    /// A record of a JSON-lines input is malformed.
    #[error("line {line}: field `{field}`: {message}")]
    Parse {
        /// 1-based line number in the input.
        line: usize,
        /// Path of the offending field, e.g. `layers[1].experts[5][0]`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// Reading the input failed.
    #[error("I/O error: {0}")]
    Io(String),
    /// A libtorch call failed (feature `tch`).
    #[error("libtorch: {0}")]
    Tch(String),
    /// A synthetic corpus specification is invalid.
    #[error("invalid synthetic corpus: {0}")]
    InvalidSynth(String),
}

#[cfg(feature = "tch")]
impl From<tch::TchError> for RoutingError {
    fn from(e: tch::TchError) -> Self {
        RoutingError::Tch(e.to_string())
    }
}
