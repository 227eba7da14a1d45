//! Why a policy could not be built or compiled. Every message names the path, flag or port
//! and says what to do.

use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum PolicyError {
    #[error("{path}: {cause}", path = .path.display())]
    Path { path: PathBuf, cause: String },

    #[error("grant {flag} {path}: the path does not exist (create it first, or fix the typo)", path = .path.display())]
    MissingGrant { flag: &'static str, path: PathBuf },

    #[error("{path}: {cause}", path = .path.display())]
    Git { path: PathBuf, cause: String },

    #[error("port {port}: {cause}")]
    Port { port: u32, cause: &'static str },

    #[error("conflicting options: {0}")]
    Conflict(String),

    /// The git data of this worktree cannot be protected by this backend.
    #[error("{0}")]
    UnprotectedGit(String),

    #[error("{backend} cannot enforce {what}: {why}")]
    Unsupported {
        backend: &'static str,
        what: String,
        why: String,
    },
}
