//! Everything that can go wrong with a view, each saying what failed, where, and what to do.

use std::path::PathBuf;

/// An error from creating, finding, removing or watching a sandbox view.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    /// A task, branch or project name that cannot be used.
    #[error("invalid {kind} {name:?}: {reason}{hint}")]
    InvalidName {
        kind: &'static str,
        name: String,
        reason: String,
        /// What to do instead, with a leading "; ".
        hint: String,
    },

    /// A computed view path that would not be directly inside the views root.
    #[error("the view path {path} would lie outside the views root {root}; choose another task name (--task)", path = .path.display(), root = .root.display())]
    OutsideViewsRoot { path: PathBuf, root: PathBuf },

    #[error("{path}: not inside a git repository ({message}); run this from a task worktree or pass -C <task worktree>", path = .path.display())]
    NotARepository { path: PathBuf, message: String },

    #[error("{path} is a bare repository; a sandbox view is made from a task worktree with a branch checked out (pass -C <worktree>)", path = .path.display())]
    BareRepository { path: PathBuf },

    #[error("task worktree {worktree} has a detached HEAD; check out the task's branch first (git -C {worktree} switch <branch>)", worktree = .worktree.display())]
    DetachedHead { worktree: PathBuf },

    #[error("branch {branch:?} in {worktree} has no commits yet; make a first commit, then create the view", worktree = .worktree.display())]
    UnbornBranch { worktree: PathBuf, branch: String },

    #[error("{path} is itself a sandbox view (under the views root {root}); run this from the task worktree the view was made for", path = .path.display(), root = .root.display())]
    IsAView { path: PathBuf, root: PathBuf },

    /// `s/<b>` exists and shares no line of history with `<b>` that a fast-forward could use.
    #[error("branch {child:?} already exists at {child_commit} and is neither an ancestor nor a descendant of {branch:?} ({branch_commit}); \
             a view on it could never fast-forward {branch:?}. Keep its commits under another name (git branch -m {child} {child}-old) \
             or delete it (git branch -D {child}), then create the view again")]
    ChildBranchUnrelated {
        branch: String,
        child: String,
        branch_commit: String,
        child_commit: String,
    },

    /// The metadata slot for this project/task belongs to another repository.
    #[error("the sandbox view {view_path} belongs to another repository ({other}), not {this}; pass another task name (--task) or remove that view", view_path = .view_path.display(), other = .other.display(), this = .this.display())]
    NameTaken {
        view_path: PathBuf,
        other: PathBuf,
        this: PathBuf,
    },

    #[error("{path} already exists but is not a recorded sandbox view; move it away or pass another task name (--task)", path = .path.display())]
    PathOccupied { path: PathBuf },

    #[error("the sandbox view for task {task:?} follows branch {recorded:?}, but {worktree} is now on {current:?}; switch back, or remove the view (sandbox view remove {task}) and create it again", worktree = .worktree.display())]
    BranchMismatch {
        task: String,
        recorded: String,
        current: String,
        worktree: PathBuf,
    },

    #[error("no sandbox view for task {task:?} of project {project:?} under {root}; create one with `sandbox view create -C <task worktree>` (see `sandbox view list`)", root = .root.display())]
    NotFound {
        task: String,
        project: String,
        root: PathBuf,
    },

    #[error("the sandbox view {view_path} for task {task:?} is not healthy: {problems}; remove it (sandbox view remove {task}) and create it again", view_path = .view_path.display())]
    Unhealthy {
        task: String,
        view_path: PathBuf,
        problems: String,
    },

    /// `remove` without `--force` while `s/<b>` holds work that `<b>` does not have.
    #[error("branch {child:?} holds {count} commit(s) not on {branch:?} (tip {tip}); removing the view would drop them. \
             Bring them over first (git -C {worktree} merge {child}), or pass --force to delete them", worktree = .worktree.display())]
    Unmerged {
        child: String,
        branch: String,
        count: usize,
        tip: String,
        worktree: PathBuf,
    },

    /// Another process already runs a watcher for this view.
    #[error("the sandbox view for task {task:?} is already watched by {who} (lock {lock}); one watcher per view: stop that one first, or leave it running", who = match .pid { Some(p) => format!("process {p}"), None => "another process".to_string() }, lock = .lock.display())]
    AlreadyWatched {
        task: String,
        pid: Option<u32>,
        lock: PathBuf,
    },

    #[error("view metadata {path}: {message}; remove the file if the view is gone", path = .path.display())]
    Metadata { path: PathBuf, message: String },

    #[error("{action} {path}: {source}", path = .path.display())]
    Io {
        action: String,
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("git: {action}: {message}")]
    Git { action: String, message: String },

    #[error("cannot watch {path}: {message}", path = .path.display())]
    Watch { path: PathBuf, message: String },
}

impl ViewError {
    pub(crate) fn io(
        action: impl Into<String>,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> ViewError {
        let action = action.into();
        let path = path.into();
        move |source| ViewError::Io {
            action,
            path,
            source,
        }
    }

    pub(crate) fn git(action: impl Into<String>) -> impl FnOnce(git2::Error) -> ViewError {
        let action = action.into();
        move |e| ViewError::Git {
            action,
            message: e.message().to_string(),
        }
    }
}
