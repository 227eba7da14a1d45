//! A watcher's tuning.

use std::path::PathBuf;
use std::time::Duration;

/// Tuning for a watcher. The defaults suit interactive use.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// Where liveness locks go (`<runtime>/views`); see `ViewManager::with_runtime_dir`.
    pub lock_dir: PathBuf,
    /// Quiet time after the last file event before a repository is checked.
    pub debounce: Duration,
    /// Longest a check waits while events keep arriving.
    pub max_delay: Duration,
    /// How soon a blocked fast-forward (dirty worktree, failed check) is tried again when no
    /// file event prompts it earlier.
    pub retry: Duration,
    /// How long `index.lock` may be held by someone else before it is reported as `busy`.
    pub busy_grace: Duration,
    /// Quiet time after the last file event before a view blocked by a dirty task worktree is
    /// checked again. Changes there come from the user fixing it (`git stash`, `git commit`),
    /// whose git commands run in several steps: moving the branch between two of them (after
    /// `reset --hard` wrote the index, before it updates `HEAD`) would make the command fail.
    /// The agent's path (commits in the view) keeps `debounce`.
    pub settle: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions {
            lock_dir: crate::lock::default_runtime_dir().join("views"),
            debounce: Duration::from_millis(5),
            max_delay: Duration::from_millis(50),
            retry: Duration::from_secs(1),
            busy_grace: Duration::from_secs(2),
            settle: Duration::from_millis(200),
        }
    }
}
