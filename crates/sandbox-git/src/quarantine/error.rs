//! What goes wrong laying out or reading back a quarantine.

use std::path::{Path, PathBuf};

/// An error laying out or reading back the quarantine.
#[derive(Debug, thiserror::Error)]
pub enum QuarantineError {
    #[error("git store quarantine: {what} {path}: {source}", path = .path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("git store quarantine: {what}: {source}")]
    Git {
        what: &'static str,
        source: git2::Error,
    },
    /// The run would take a branch it does not own for its task branch.
    #[error("git: refusing to run in {worktree}: {reason}", worktree = .worktree.display())]
    TaskBranch { worktree: PathBuf, reason: String },
}

pub(super) fn io<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> QuarantineError + 'a {
    move |source| QuarantineError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

pub(super) fn git(what: &'static str) -> impl FnOnce(git2::Error) -> QuarantineError {
    move |source| QuarantineError::Git { what, source }
}
