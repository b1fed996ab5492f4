//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong while configuring, training or evaluating.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A bad config value or combination (the message names the field).
    #[error("config: {0}")]
    Config(String),
    /// From the config crate: a config that does not parse or validate (every problem found,
    /// each naming its setting, and the file where there is one).
    #[error(transparent)]
    RunConfig(#[from] raptor_config::ConfigError),
    /// Bad data (the message names the file and record).
    #[error("data: {0}")]
    Data(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A run folder or checkpoint is missing, locked or inconsistent.
    #[error("run folder: {0}")]
    Run(String),
    /// A plan that breaks an invariant of the trainer (a bug of the method that built it).
    #[error("plan: {0}")]
    Plan(#[from] crate::streams::PlanIssue),
    /// From the models crate.
    #[error(transparent)]
    Model(#[from] raptor_models::ModelError),
    /// From the accountant.
    #[error(transparent)]
    Accountant(#[from] raptor_accountant::AccountantError),
    /// From the clipping crate.
    #[error(transparent)]
    Clip(#[from] raptor_clip::ClipError),
    /// From the Muon crate.
    #[error(transparent)]
    Muon(#[from] raptor_muon::MuonError),
    /// From the optimizers.
    #[error(transparent)]
    Optim(#[from] raptor_optim::OptimError),
    /// From a collective operation of data-parallel training.
    #[error(transparent)]
    Dist(#[from] raptor_dist::DistError),
    /// From the routing crate.
    #[error(transparent)]
    Routing(#[from] raptor_routing::RoutingError),
    /// From libtorch.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// JSON (de)serialization.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, TrainError>;
