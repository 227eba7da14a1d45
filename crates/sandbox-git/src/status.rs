//! Where a view stands: how `s/<branch>` relates to `<branch>`, whether the view is intact,
//! and whether a watcher is running for it.

use git2::{Oid, Repository};
use serde::{Deserialize, Serialize};

use crate::error::ViewError;
use crate::events::WatchEvent;
use crate::mounts::Mount;
use crate::view::View;

/// How `s/<branch>` (the view's commits) relates to `<branch>` (the task's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SyncState {
    /// Both point at the same commit.
    InSync,
    /// `s/<branch>` has `ahead` commits that `<branch>` lacks: a fast-forward is due.
    Ahead { ahead: usize },
    /// `<branch>` has `behind` commits that the view lacks (host commits); nothing to do for
    /// the watcher, but the agent does not see them.
    Behind { behind: usize },
    /// Both have commits the other lacks: the fast-forward fails until someone merges.
    Diverged {
        ahead: usize,
        behind: usize,
        merge_base: Option<String>,
    },
    /// One of the two branches does not exist.
    Missing { what: String },
}

impl SyncState {
    pub fn label(&self) -> &'static str {
        match self {
            SyncState::InSync => "in_sync",
            SyncState::Ahead { .. } => "ahead",
            SyncState::Behind { .. } => "behind",
            SyncState::Diverged { .. } => "diverged",
            SyncState::Missing { .. } => "missing",
        }
    }
}

/// Computes the relation of `child` to `branch`.
pub(crate) fn relation(repo: &Repository, branch: Oid, child: Oid) -> Result<SyncState, ViewError> {
    if branch == child {
        return Ok(SyncState::InSync);
    }
    let (ahead, behind) = repo
        .graph_ahead_behind(child, branch)
        .map_err(ViewError::git(
            "cannot compare the view's branch with the task's",
        ))?;
    Ok(match (ahead, behind) {
        (a, 0) => SyncState::Ahead { ahead: a },
        (0, b) => SyncState::Behind { behind: b },
        (a, b) => SyncState::Diverged {
            ahead: a,
            behind: b,
            merge_base: repo.merge_base(child, branch).ok().map(|o| o.to_string()),
        },
    })
}

/// Whether a watcher holds the view's lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatcherState {
    pub running: bool,
    pub pid: Option<u32>,
    /// The watcher's last problem report for this view (diverged, blocked, error), if it is
    /// running and the problem has not been resolved since.
    pub last_report: Option<WatchEvent>,
}

/// Everything `sandbox view status` shows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ViewStatus {
    #[serde(flatten)]
    pub view: View,
    pub branch_commit: Option<String>,
    pub child_commit: Option<String>,
    pub sync: SyncState,
    /// What is wrong with the view itself (empty when healthy).
    pub problems: Vec<String>,
    pub watcher: WatcherState,
    /// What a VM backend mounts for this view.
    pub mounts: Vec<Mount>,
}
