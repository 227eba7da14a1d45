//! The watcher's thread: what it follows (repositories, views, what it reported), its loop,
//! and when a check is due.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::Instant;

use git2::Repository;
use notify::{RecursiveMode, Watcher as _};

use super::options::WatchOptions;
use crate::error::ViewError;
use crate::events::{BlockReason, WatchEvent};
use crate::lock::{self, WatchLock};
use crate::meta;
use crate::names;
use crate::repo;
use crate::util::canon;
use crate::view::View;

/// What the watcher's thread is told: file events, and the handle's requests.
pub(super) enum Msg {
    Fs { paths: Vec<PathBuf>, rescan: bool },
    Add(Box<View>, Sender<Result<(), ViewError>>),
    Remove(String, String),
    Stop,
}

/// The identity of a reported problem, so each one is reported once.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Reported {
    Diverged(git2::Oid, git2::Oid),
    Blocked(BlockReason, git2::Oid, git2::Oid, Vec<String>),
    BranchMissing,
    Error(String),
}

pub(super) struct ViewState {
    pub(super) view: View,
    _lock: WatchLock,
    pub(super) report_file: PathBuf,
    pub(super) reported: Option<Reported>,
    pub(super) retry_at: Option<Instant>,
    pub(super) busy_since: Option<Instant>,
    /// Found gone during this round (why); dropped and reported at its end.
    pub(super) gone: Option<String>,
}

impl ViewState {
    /// Blocked by uncommitted changes in the task worktree: only the user can resolve that.
    fn waits_for_user(&self) -> bool {
        matches!(
            self.reported,
            Some(Reported::Blocked(BlockReason::Dirty, ..))
        )
    }
}

pub(super) struct RepoState {
    common_dir: PathBuf,
    pub(super) repo: Repository,
    watched: Vec<PathBuf>,
    pub(super) views: Vec<ViewState>,
    /// First and last file event since the last check.
    pending: Option<(Instant, Instant)>,
}

pub(super) struct Worker {
    pub(super) opts: WatchOptions,
    pub(super) sink: Box<dyn FnMut(WatchEvent) + Send>,
    pub(super) notifier: notify::RecommendedWatcher,
    pub(super) repos: Vec<RepoState>,
}

impl Worker {
    pub(super) fn run(mut self, rx: Receiver<Msg>) {
        loop {
            let msg = match self.next_deadline() {
                Some(at) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match msg {
                Ok(Msg::Fs { paths, rescan }) => self.note_change(&paths, rescan),
                Ok(Msg::Add(view, reply)) => {
                    let _ = reply.send(self.add(*view));
                }
                Ok(Msg::Remove(project, task)) => self.drop_view(&project, &task),
                Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {}
            }
            self.run_due();
        }
        for r in std::mem::take(&mut self.repos) {
            for p in &r.watched {
                let _ = self.notifier.unwatch(p);
            }
        }
        (self.sink)(WatchEvent::Stopped);
    }

    fn next_deadline(&self) -> Option<Instant> {
        let mut best: Option<Instant> = None;
        let mut consider = |t: Instant| best = Some(best.map_or(t, |b| b.min(t)));
        for r in &self.repos {
            if let Some((first, last)) = r.pending {
                consider((last + self.opts.debounce).min(first + self.opts.max_delay));
            }
            for v in &r.views {
                if let Some(t) = v.retry_at {
                    consider(t);
                }
            }
        }
        best
    }

    fn note_change(&mut self, paths: &[PathBuf], rescan: bool) {
        let now = Instant::now();
        for r in &mut self.repos {
            if rescan || paths.iter().any(|p| p.starts_with(&r.common_dir)) {
                r.pending = Some(r.pending.map_or((now, now), |(first, _)| (first, now)));
            }
        }
    }

    fn add(&mut self, mut view: View) -> Result<(), ViewError> {
        view.common_dir = canon(&view.common_dir);
        if self
            .repos
            .iter()
            .flat_map(|r| &r.views)
            .any(|v| v.view.project == view.project && v.view.task == view.task)
        {
            return Ok(());
        }
        names::validate_task(&view.task)?;
        names::validate_project(&view.project)?;
        let lock_file = lock::lock_path(&self.opts.lock_dir, &view.project, &view.task);
        let held = lock::acquire(&lock_file, &view.task)?;
        let report_file = lock::report_path(&self.opts.lock_dir, &view.project, &view.task);
        let _ = std::fs::remove_file(&report_file);

        let idx = match self
            .repos
            .iter()
            .position(|r| r.common_dir == view.common_dir)
        {
            Some(i) => i,
            None => {
                let state = self.watch_repo(&view.common_dir)?;
                self.repos.push(state);
                self.repos.len() - 1
            }
        };
        (self.sink)(WatchEvent::Watching {
            task: view.task.clone(),
            project: view.project.clone(),
            branch: view.branch.clone(),
            child_branch: view.child_branch.clone(),
            view_path: view.view_path.clone(),
            task_worktree: view.task_worktree.clone(),
        });
        let r = &mut self.repos[idx];
        r.views.push(ViewState {
            view,
            _lock: held,
            report_file,
            reported: None,
            // Check at once: a commit may have landed before (or while) we started.
            retry_at: Some(Instant::now()),
            busy_since: None,
            gone: None,
        });
        Ok(())
    }

    /// Opens a repository and registers its watches, before the first check, so no commit
    /// can fall between the check and the watch.
    fn watch_repo(&mut self, common_dir: &Path) -> Result<RepoState, ViewError> {
        let repo = repo::open_common(common_dir)?;
        let mut watched: Vec<PathBuf> = Vec::new();
        let plan = [
            (common_dir.to_path_buf(), RecursiveMode::NonRecursive),
            (common_dir.join("refs"), RecursiveMode::Recursive),
            (common_dir.join("logs"), RecursiveMode::Recursive),
            (common_dir.join("worktrees"), RecursiveMode::Recursive),
        ];
        for (path, mode) in plan {
            if !path.is_dir() {
                continue; // created later inside a watched parent: the parent reports it
            }
            if let Err(e) = self.notifier.watch(&path, mode) {
                for p in &watched {
                    let _ = self.notifier.unwatch(p);
                }
                return Err(ViewError::Watch {
                    path,
                    message: format!(
                        "{e} (if the inotify watch limit is reached, raise fs.inotify.max_user_watches)"
                    ),
                });
            }
            watched.push(path);
        }
        Ok(RepoState {
            common_dir: common_dir.to_path_buf(),
            repo,
            watched,
            views: Vec::new(),
            pending: None,
        })
    }

    fn drop_view(&mut self, project: &str, task: &str) {
        for r in &mut self.repos {
            r.views
                .retain(|v| !(v.view.project == project && v.view.task == task));
        }
        self.forget_idle_repos();
    }

    fn forget_idle_repos(&mut self) {
        let (idle, busy): (Vec<_>, Vec<_>) = std::mem::take(&mut self.repos)
            .into_iter()
            .partition(|r| r.views.is_empty());
        self.repos = busy;
        for r in idle {
            for p in &r.watched {
                let _ = self.notifier.unwatch(p);
            }
        }
    }

    fn run_due(&mut self) {
        let now = Instant::now();
        let (debounce, max_delay) = (self.opts.debounce, self.opts.max_delay);
        let mut gone = false;
        let settle = self.opts.settle;
        for ri in 0..self.repos.len() {
            let last_event = self.repos[ri].pending.map(|(_, last)| last);
            let repo_due = self.repos[ri]
                .pending
                .is_some_and(|(first, last)| now >= last + debounce || now >= first + max_delay);
            if repo_due {
                self.repos[ri].pending = None;
            }
            for vi in 0..self.repos[ri].views.len() {
                let vs = &mut self.repos[ri].views[vi];
                if repo_due && vs.waits_for_user() {
                    // Someone is working in the dirty task worktree: look again once it has
                    // been quiet for `settle`, not between two steps of their git command.
                    vs.retry_at = last_event.map(|last| last + settle);
                    continue;
                }
                let view_due = vs.retry_at.is_some_and(|t| now >= t);
                if repo_due || view_due {
                    gone |= self.check(ri, vi);
                }
            }
        }
        if gone {
            // Release the views' locks before saying they are gone, so whoever hears
            // `view_gone` also sees the watcher let go of them.
            let mut reports = Vec::new();
            for r in &mut self.repos {
                r.views.retain(|v| {
                    if let Some(reason) = &v.gone {
                        reports.push(WatchEvent::ViewGone {
                            task: v.view.task.clone(),
                            reason: reason.clone(),
                        });
                    }
                    v.gone.is_none()
                });
            }
            self.forget_idle_repos();
            for e in reports {
                (self.sink)(e);
            }
        }
    }

    /// Worktree entries of views, which the host must never write through.
    pub(super) fn exclusions(&self, ri: usize) -> Vec<String> {
        let r = &self.repos[ri];
        let mut names: Vec<String> = r
            .views
            .iter()
            .map(|v| v.view.worktree_name.clone())
            .collect();
        if let Some(v) = r.views.first() {
            let root = v.view.views_root();
            if let Ok(tasks) = meta::tasks(&root, &v.view.project) {
                names.extend(tasks.iter().map(|t| names::worktree_name(t)));
            }
        }
        names
    }
}
