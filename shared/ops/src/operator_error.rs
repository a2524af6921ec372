//! Why an operator's action did not happen: the one error of the operator commands, the operations
//! API and the rules under both. The CLI turns it into an exit code ([`OperatorError::exit_code`]),
//! the API into an RFC 9457 problem.

use std::process::ExitCode;

/// Why an operator's command or request did not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// An argument is malformed.
    #[error("{0}")]
    Invalid(String),
    /// The named tenant, key, payment, dead letter or run does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The action does not apply to the current state; nothing was changed.
    #[error("{0}")]
    Refused(String),
    /// The operator's role does not allow the action; nothing was changed.
    #[error("{0}")]
    Forbidden(String),
    /// Too much of the same work is under way (password checks); nothing was done: try again in a
    /// moment.
    #[error("{0}")]
    Busy(String),
    /// Something failed underneath (the database, the provider).
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

impl OperatorError {
    /// The process exit code for this failure: 1 failed (e.g. the database is unreachable), 2 bad
    /// usage or argument, 3 the named thing does not exist, 4 refused (the action does not apply to
    /// the thing's current state), 5 not allowed for the operator's role. A command that succeeds
    /// exits 0, and `main` exits 78 when the configuration is invalid.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            Self::Failed(_) | Self::Busy(_) => 1,
            Self::Invalid(_) => 2,
            Self::NotFound(_) => 3,
            Self::Refused(_) => 4,
            Self::Forbidden(_) => 5,
        })
    }

    /// The one-line message for stderr, with the cause chain of an underlying failure.
    pub fn one_line(&self) -> String {
        match self {
            Self::Failed(error) => format!("{error:#}"),
            other => other.to_string(),
        }
    }
}
