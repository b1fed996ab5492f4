//! The crate's error type.

/// Everything that can go wrong in `raptor-models`. Bad input is reported with the offending
/// record, tensor or parameter named, never by a panic or a silently wrong number.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// An error reported by libtorch.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// A token id outside `[0, vocab_size)`.
    #[error(
        "record {record}: token id {id} at position {position} is out of range for a vocabulary of {vocab_size}"
    )]
    TokenOutOfRange {
        /// Record (row of the batch).
        record: usize,
        /// Position in the record.
        position: usize,
        /// The offending id.
        id: i64,
        /// The model's vocabulary size.
        vocab_size: i64,
    },
    /// A record without any valid token (or, for language modelling, without any target).
    #[error("record {record} is empty: {why}")]
    EmptyRecord {
        /// Record (row of the batch).
        record: usize,
        /// What is missing.
        why: String,
    },
    /// A label outside `[0, num_labels)`.
    #[error("record {record}: label {label} is out of range for {num_labels} labels")]
    LabelOutOfRange {
        /// Record (row of the batch).
        record: usize,
        /// The offending label.
        label: i64,
        /// Number of classes of the head.
        num_labels: i64,
    },
    /// A tensor of the wrong shape.
    #[error("shape mismatch for {what}: expected {expected:?}, got {got:?}")]
    ShapeMismatch {
        /// Which tensor.
        what: String,
        /// Expected shape (-1: any size).
        expected: Vec<i64>,
        /// Actual shape.
        got: Vec<i64>,
    },
    /// A mask entry other than 0 or 1, or a non-prefix mask where a prefix mask is required.
    #[error("record {record}: invalid attention mask: {why}")]
    InvalidMask {
        /// Record (row of the batch).
        record: usize,
        /// What is wrong.
        why: String,
    },
    /// Capacity-based token dropping is on while building a private-training step.
    #[error(
        "expert capacity is set (expert_capacity = {capacity}), and private training runs without \
         capacity-based token dropping. Here capacity is counted per sequence (a record's tokens \
         compete only with each other for an expert's slots), so it does not couple records; it is \
         refused because raptor's private training is specified without token dropping (a \
         batch-level capacity, as other Switch implementations count it, would make one record's \
         output depend on its batch peers). Set expert_capacity to None for private training \
         (capacity is an inference option only)"
    )]
    CapacityInPrivateTraining {
        /// The configured capacity.
        capacity: i64,
    },
    /// An invalid model or adapter configuration.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A checkpoint of another model family than the one asked for.
    #[error("{path} holds a {found} checkpoint, not a {expected} one")]
    WrongFamily {
        /// The checkpoint's path.
        path: String,
        /// What it holds.
        found: String,
        /// The family asked for.
        expected: String,
    },
    /// A trainable parameter that no caller-named group contains.
    #[error("trainable parameter {param} is in no parameter group")]
    UngroupedParameter {
        /// Parameter name.
        param: String,
    },
    /// A parameter name that the model or the per-sample engine does not know.
    #[error("unknown parameter {param}")]
    UnknownParameter {
        /// Parameter name.
        param: String,
    },
    /// A clipping bound or weight that is not usable.
    #[error("invalid clipping setup: {0}")]
    InvalidClip(String),
    /// An owner map that does not fit the model or batch.
    #[error("invalid owner map for layer {layer}: {why}")]
    InvalidOwners {
        /// Sparse layer (block index).
        layer: usize,
        /// What is wrong.
        why: String,
    },
    /// An error from a `raptor-clip` kernel (e.g. a non-finite per-example norm).
    #[error("clipping kernel: {0}")]
    Clip(#[from] raptor_clip::ClipError),
    /// An error from `raptor-routing` while building routing statistics.
    #[error("routing: {0}")]
    Routing(String),
    // ---- checkpoints, Hugging Face configs, tokenizers (checkpoint.rs, hf_config.rs, tokenizer.rs) ----
    /// A file or directory that could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint file that is not valid safetensors (or a shard index that is not valid JSON).
    #[error("{path}: corrupt checkpoint: {why}")]
    CorruptCheckpoint {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// Tensors the model needs that the checkpoint does not hold.
    #[error("{path}: missing tensor(s) {}{}", names.iter().take(8).cloned().collect::<Vec<_>>().join(", "), if names.len() > 8 { format!(" and {} more", names.len() - 8) } else { String::new() })]
    MissingTensors {
        /// The checkpoint.
        path: String,
        /// The missing tensor names (model names).
        names: Vec<String>,
    },
    /// Tensors in the checkpoint that the model has no variable for (strict loading).
    #[error("{path}: unexpected tensor(s) {}{}", names.iter().take(8).cloned().collect::<Vec<_>>().join(", "), if names.len() > 8 { format!(" and {} more", names.len() - 8) } else { String::new() })]
    UnexpectedTensors {
        /// The checkpoint.
        path: String,
        /// The unexpected tensor names (checkpoint names).
        names: Vec<String>,
    },
    /// A checkpoint tensor of a dtype that cannot be loaded into the variable.
    #[error("tensor {name}: dtype {found} cannot be loaded into a variable of kind {expected}")]
    TensorDtype {
        /// Tensor name.
        name: String,
        /// The variable's kind.
        expected: String,
        /// The checkpoint's dtype.
        found: String,
    },
    /// A Hugging Face `config.json` with a missing or invalid field.
    #[error("{path}: config field {field}: {why}")]
    HfConfig {
        /// The config file (or `<string>`).
        path: String,
        /// The field.
        field: String,
        /// What is wrong.
        why: String,
    },
    // ---- GGUF files (gguf.rs, gguf_model.rs) ----
    /// A GGUF file whose bytes do not parse or whose extents do not fit the file.
    #[error("{path}: corrupt GGUF at byte {offset}: {why}")]
    CorruptGguf {
        /// The file (or `<bytes>`).
        path: String,
        /// Byte offset where the problem was found.
        offset: u64,
        /// What is wrong.
        why: String,
    },
    /// A well-formed GGUF file using something this reader does not implement (a version, a
    /// tensor type, an architecture, a tokenizer model).
    #[error("{path}: unsupported GGUF content: {what}")]
    GgufUnsupported {
        /// The file (or `<bytes>`).
        path: String,
        /// What is unsupported.
        what: String,
    },
    /// A GGUF metadata key that the model needs, missing or of the wrong type.
    #[error("{path}: GGUF metadata {key}: {why}")]
    GgufMetadata {
        /// The file.
        path: String,
        /// The key.
        key: String,
        /// What is wrong.
        why: String,
    },
    /// A tokenizer that could not be built, trained, read or used.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, ModelError>;
