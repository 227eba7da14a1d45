//! What the watcher reports. Serialised as one JSON object per line (`"event"` names the
//! variant, snake_case); `describe()` gives the one-line human form.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Why a fast-forward that is due did not happen (yet). The watcher retries on its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockReason {
    /// The worktree with `<branch>` checked out has uncommitted changes (staged, unstaged or
    /// untracked/ignored files in the way) in files the fast-forward would change.
    Dirty,
    /// That worktree is in the middle of a merge, rebase, cherry-pick, revert or bisect.
    OperationInProgress,
    /// That worktree's index has unresolved conflicts.
    Conflicts,
    /// Another git command holds the worktree's `index.lock` (for longer than a moment).
    Busy,
    /// `<branch>` is checked out in more than one worktree; git itself avoids that, and
    /// updating one of them would leave the other inconsistent.
    CheckedOutTwice,
}

/// One report from the watcher.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum WatchEvent {
    /// The watcher now follows this view (sent once per view, at start or when added).
    Watching {
        task: String,
        project: String,
        branch: String,
        child_branch: String,
        view_path: PathBuf,
        task_worktree: PathBuf,
    },
    /// `<branch>` moved forward to `<child_branch>`'s commit.
    FastForwarded {
        task: String,
        branch: String,
        child_branch: String,
        from: String,
        to: String,
        /// How many commits `<branch>` gained.
        commits: usize,
        /// The worktree whose files and index were updated with it, if one has `<branch>`
        /// checked out.
        worktree: Option<PathBuf>,
    },
    /// `<branch>` and `<child_branch>` both have commits the other lacks: nothing was moved.
    Diverged {
        task: String,
        branch: String,
        child_branch: String,
        branch_commit: String,
        child_commit: String,
        merge_base: Option<String>,
        /// Commits only on `<child_branch>` (the agent's).
        child_ahead: usize,
        /// Commits only on `<branch>` (made on the host).
        branch_ahead: usize,
        /// Commands, any one of which resolves it.
        resolve: Vec<String>,
    },
    /// A fast-forward is due but would overwrite something: the branch was left alone.
    Blocked {
        task: String,
        branch: String,
        child_branch: String,
        branch_commit: String,
        child_commit: String,
        worktree: PathBuf,
        reason: BlockReason,
        /// Files in the way (for `dirty`), at most 20.
        paths: Vec<String>,
        message: String,
        resolve: Vec<String>,
    },
    /// A problem reported earlier (diverged or blocked) is gone.
    Resolved {
        task: String,
        branch: String,
        commit: String,
    },
    /// The view was removed (its directory or its branch is gone); the watcher dropped it.
    ViewGone { task: String, reason: String },
    /// Something failed while checking the view; the watcher keeps going.
    Error { task: String, message: String },
    /// The watcher stopped.
    Stopped,
}

impl WatchEvent {
    /// The task this event is about (none for `stopped`).
    pub fn task(&self) -> Option<&str> {
        match self {
            WatchEvent::Watching { task, .. }
            | WatchEvent::FastForwarded { task, .. }
            | WatchEvent::Diverged { task, .. }
            | WatchEvent::Blocked { task, .. }
            | WatchEvent::Resolved { task, .. }
            | WatchEvent::ViewGone { task, .. }
            | WatchEvent::Error { task, .. } => Some(task),
            WatchEvent::Stopped => None,
        }
    }

    /// Is this something the user has to act on (diverged, blocked, error)?
    pub fn is_problem(&self) -> bool {
        matches!(
            self,
            WatchEvent::Diverged { .. } | WatchEvent::Blocked { .. } | WatchEvent::Error { .. }
        )
    }

    /// One line for a human.
    pub fn describe(&self) -> String {
        let short = |s: &str| s.chars().take(12).collect::<String>();
        match self {
            WatchEvent::Watching {
                task,
                branch,
                child_branch,
                view_path,
                ..
            } => format!(
                "view {task}: watching {child_branch} → {branch} ({})",
                view_path.display()
            ),
            WatchEvent::FastForwarded {
                task,
                branch,
                from,
                to,
                commits,
                worktree,
                ..
            } => format!(
                "view {task}: fast-forwarded {branch} {}..{} ({commits} commit{}){}",
                short(from),
                short(to),
                if *commits == 1 { "" } else { "s" },
                worktree
                    .as_ref()
                    .map(|w| format!(", updated {}", w.display()))
                    .unwrap_or_default()
            ),
            WatchEvent::Diverged {
                task,
                branch,
                child_branch,
                branch_commit,
                child_commit,
                resolve,
                ..
            } => format!(
                "view {task}: {branch} ({}) and {child_branch} ({}) have diverged: commits were made on both, nothing was moved; resolve with one of: {}",
                short(branch_commit),
                short(child_commit),
                resolve.join("  |  ")
            ),
            WatchEvent::Blocked {
                task,
                branch,
                message,
                resolve,
                ..
            } => {
                let mut s = format!("view {task}: not fast-forwarding {branch}: {message}");
                if !resolve.is_empty() {
                    s.push_str("; ");
                    s.push_str(&resolve.join("  |  "));
                }
                s
            }
            WatchEvent::Resolved {
                task,
                branch,
                commit,
            } => format!("view {task}: {branch} is in order again at {}", short(commit)),
            WatchEvent::ViewGone { task, reason } => {
                format!("view {task}: no longer watched: {reason}")
            }
            WatchEvent::Error { task, message } => format!("view {task}: {message}"),
            WatchEvent::Stopped => "watcher stopped".to_string(),
        }
    }
}
