//! The crate's error type.

use std::fmt;
use std::path::PathBuf;

/// Everything that can go wrong while reading, building or validating a run configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A bad config value or combination, or a file that does not parse (the message names the
    /// setting, and the file and line where there is one).
    #[error("config: {0}")]
    Value(String),
    /// A config that does not validate: every problem found, each naming its setting.
    #[error("config: {0}")]
    Invalid(ConfigIssues),
    /// A config file that does not validate: the file, and every problem found in it.
    #[error("config: {}: {issues}", path.display())]
    InvalidFile {
        /// The config file.
        path: PathBuf,
        /// Every problem found, each naming its setting.
        issues: ConfigIssues,
    },
    /// A config file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
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

/// Every problem [`crate::RunConfig::validate`] found, in the order of the config's sections.
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
pub type Result<T> = std::result::Result<T, ConfigError>;
