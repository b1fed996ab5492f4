//! The crate's error type.

use std::fmt;
use std::path::PathBuf;

/// Everything that can go wrong while configuring, training or evaluating.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A bad config value or combination (the message names the field).
    #[error("config: {0}")]
    Config(String),
    /// A config that does not validate: every problem found, each naming its setting.
    #[error("config: {0}")]
    Invalid(ConfigIssues),
    /// A config file that does not validate: the file, and every problem found in it.
    #[error("config: {}: {issues}", path.display())]
    InvalidFile {
        /// The config file.
        path: std::path::PathBuf,
        /// Every problem found, each naming its setting.
        issues: ConfigIssues,
    },
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

/// One problem of a config: the setting (`section.field`, or several joined by ` / `) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// The setting the problem is about (`privacy.epsilon`).
    pub setting: String,
    /// Why its value is rejected.
    pub reason: String,
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.setting, self.reason)
    }
}

/// Every problem [`crate::config::RunConfig::validate`] found, in the order of the config's sections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssues(pub Vec<ConfigIssue>);

impl ConfigIssues {
    /// Whether `setting` is among the problems.
    pub fn mentions(&self, setting: &str) -> bool {
        self.0.iter().any(|i| i.setting == setting)
    }
}

impl fmt::Display for ConfigIssues {
    /// One problem on one line; several as a list, one per line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_slice() {
            [one] => write!(f, "{one}"),
            all => {
                write!(f, "{} problems:", all.len())?;
                for i in all {
                    write!(f, "\n  - {i}")?;
                }
                Ok(())
            }
        }
    }
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, TrainError>;
