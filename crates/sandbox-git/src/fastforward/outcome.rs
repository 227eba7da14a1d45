//! What one check of a view found or did.

use std::path::PathBuf;

use git2::Oid;

use crate::events::BlockReason;

/// What one check of a view found or did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    InSync {
        commit: Oid,
    },
    /// `<b>` is ahead of `s/<b>`: nothing for the watcher to do.
    Behind {
        branch: Oid,
    },
    FastForwarded {
        from: Oid,
        to: Oid,
        commits: usize,
        worktree: Option<PathBuf>,
    },
    Diverged {
        branch: Oid,
        child: Oid,
        child_ahead: usize,
        branch_ahead: usize,
        merge_base: Option<String>,
    },
    Blocked {
        branch: Oid,
        child: Oid,
        worktree: PathBuf,
        reason: BlockReason,
        paths: Vec<String>,
        message: String,
        resolve: Vec<String>,
    },
    /// Someone moved `<b>` between our read and our swap; look again.
    Raced,
    /// `<b>` does not exist (deleted on the host); nothing to fast-forward.
    BranchMissing,
    /// The view is gone.
    Gone {
        reason: String,
    },
}
