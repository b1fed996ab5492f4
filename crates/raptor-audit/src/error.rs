//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong while auditing a run.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// A bad audit option or combination, or a run config the audit cannot use (the message
    /// names the option).
    #[error("config: {0}")]
    Config(String),
    /// Bad data for canaries (the message names the record).
    #[error("data: {0}")]
    Data(String),
    /// The audit's own run went wrong after training (e.g. lost canary traces).
    #[error("audit: {0}")]
    Run(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// From the trainer core (crate `raptor-train`).
    #[error(transparent)]
    Train(#[from] raptor_train::TrainError),
    /// From preparing, running or recording the training run (crate `raptor-run`).
    #[error(transparent)]
    Training(#[from] raptor_run::RunError),
    /// From the accountant (the expert stream's own ε).
    #[error(transparent)]
    Accountant(#[from] raptor_accountant::AccountantError),
    /// From the audit statistics (crate `raptor-eval`).
    #[error("audit statistics: {0}")]
    Eval(#[from] raptor_eval::EvalError),
    /// JSON (de)serialization of the audit file.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, AuditError>;

/// Attaches a path to an I/O error.
pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> AuditError {
    let path = path.into();
    move |source| AuditError::Io { path, source }
}
