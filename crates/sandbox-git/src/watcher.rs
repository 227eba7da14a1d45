//! The fast-forward watcher: when a commit lands on `s/<b>`, move `<b>` to it.
//!
//! Event-driven, not polling: one `notify` (inotify) watcher per process, watching each
//! repository's common git directory — `refs/` and `logs/` recursively (loose refs and their
//! reflogs), the directory itself (`packed-refs`, the main worktree's `HEAD` and `index`) and
//! `worktrees/` (each worktree's `HEAD`, `index` and reflog). Git writes refs through a
//! `.lock` file and a rename, so the rename is the event that matters; bursts (one commit
//! touches several files) are debounced into one check. A check only reads refs unless a
//! fast-forward is due, so a spurious wake-up costs microseconds.
//!
//! The only timers are retries of a fast-forward that was blocked (dirty worktree, busy
//! index) — those also retry on the next event in the repository.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use git2::Repository;
use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher as _};

use crate::error::ViewError;
use crate::events::{BlockReason, WatchEvent};
use crate::fastforward::{self, Step};
use crate::lock::{self, WatchLock};
use crate::meta;
use crate::names;
use crate::repo;
use crate::util::{canon, q, write_atomic};
use crate::view::View;

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

enum Msg {
    Fs { paths: Vec<PathBuf>, rescan: bool },
    Add(Box<View>, Sender<Result<(), ViewError>>),
    Remove(String, String),
    Stop,
}

/// Starts watchers. See the module documentation.
pub struct Watcher;

impl Watcher {
    /// Watches `views` and reports to `sink` (called on the watcher's own thread, in order).
    /// Fails if a view is already watched by another process (one watcher per view).
    pub fn start(
        views: Vec<View>,
        sink: impl FnMut(WatchEvent) + Send + 'static,
    ) -> Result<WatcherHandle, ViewError> {
        Self::start_with(views, WatchOptions::default(), sink)
    }

    pub fn start_with(
        views: Vec<View>,
        options: WatchOptions,
        sink: impl FnMut(WatchEvent) + Send + 'static,
    ) -> Result<WatcherHandle, ViewError> {
        let (tx, rx) = mpsc::channel();
        let fs_tx = tx.clone();
        let notifier = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let msg = match res {
                Ok(ev) => {
                    // Reads (ours included) are not changes.
                    if let EventKind::Access(kind) = ev.kind {
                        if kind != AccessKind::Close(AccessMode::Write) {
                            return;
                        }
                    }
                    let rescan = ev.need_rescan();
                    let paths: Vec<PathBuf> =
                        ev.paths.into_iter().filter(|p| !is_noise(p)).collect();
                    if paths.is_empty() && !rescan {
                        return;
                    }
                    Msg::Fs { paths, rescan }
                }
                Err(e) => Msg::Fs {
                    paths: e.paths,
                    rescan: true,
                },
            };
            let _ = fs_tx.send(msg);
        })
        .map_err(|e| ViewError::Watch {
            path: PathBuf::from("/"),
            message: format!("cannot start a file watcher: {e}"),
        })?;
        let worker = Worker {
            opts: options,
            sink: Box::new(sink),
            notifier,
            repos: Vec::new(),
        };
        let thread = std::thread::Builder::new()
            .name("sandbox-view-watcher".into())
            .spawn(move || worker.run(rx))
            .map_err(ViewError::io("cannot start the watcher thread", "/"))?;
        let handle = WatcherHandle {
            tx,
            thread: Some(thread),
        };
        for view in views {
            handle.add(view)?;
        }
        Ok(handle)
    }
}

/// Lock files and our scratch index come and go around every update; only the final
/// rename onto the real name means something changed.
fn is_noise(p: &Path) -> bool {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    name.ends_with(".lock") || name.starts_with("sandbox-ff.")
}

/// A running watcher. Dropping it (or `stop`) ends it after the check in progress, if any.
pub struct WatcherHandle {
    tx: Sender<Msg>,
    thread: Option<JoinHandle<()>>,
}

impl WatcherHandle {
    /// Starts following one more view (takes its liveness lock, checks it at once).
    pub fn add(&self, view: View) -> Result<(), ViewError> {
        let (reply, answer) = mpsc::channel();
        self.tx
            .send(Msg::Add(Box::new(view), reply))
            .map_err(|_| stopped())?;
        answer.recv().map_err(|_| stopped())?
    }

    /// Stops following a view (and releases its lock).
    pub fn remove(&self, view: &View) {
        let _ = self
            .tx
            .send(Msg::Remove(view.project.clone(), view.task.clone()));
    }

    /// Stops the watcher and waits for it.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for WatcherHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn stopped() -> ViewError {
    ViewError::Watch {
        path: PathBuf::from("/"),
        message: "the watcher has stopped".into(),
    }
}

/// The identity of a reported problem, so each one is reported once.
#[derive(Debug, Clone, PartialEq)]
enum Reported {
    Diverged(git2::Oid, git2::Oid),
    Blocked(BlockReason, git2::Oid, git2::Oid, Vec<String>),
    BranchMissing,
    Error(String),
}

struct ViewState {
    view: View,
    _lock: WatchLock,
    report_file: PathBuf,
    reported: Option<Reported>,
    retry_at: Option<Instant>,
    busy_since: Option<Instant>,
    /// Found gone during this round (why); dropped and reported at its end.
    gone: Option<String>,
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

struct RepoState {
    common_dir: PathBuf,
    repo: Repository,
    watched: Vec<PathBuf>,
    views: Vec<ViewState>,
    /// First and last file event since the last check.
    pending: Option<(Instant, Instant)>,
}

struct Worker {
    opts: WatchOptions,
    sink: Box<dyn FnMut(WatchEvent) + Send>,
    notifier: notify::RecommendedWatcher,
    repos: Vec<RepoState>,
}

impl Worker {
    fn run(mut self, rx: Receiver<Msg>) {
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
    fn exclusions(&self, ri: usize) -> Vec<String> {
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

    /// Checks one view; returns true if it is gone.
    fn check(&mut self, ri: usize, vi: usize) -> bool {
        let exclude = self.exclusions(ri);
        let now = Instant::now();
        let opts = self.opts.clone();
        let r = &mut self.repos[ri];
        let step = fastforward::step(&r.repo, &r.views[vi].view, &exclude);
        let vs = &mut r.views[vi];
        vs.retry_at = None;
        let v = vs.view.clone();
        let mut emit: Vec<WatchEvent> = Vec::new();
        let problem =
            |vs: &mut ViewState, key: Reported, event: WatchEvent, emit: &mut Vec<WatchEvent>| {
                if vs.reported.as_ref() != Some(&key) {
                    vs.reported = Some(key);
                    if let Ok(text) = serde_json::to_vec(&event) {
                        let _ = write_atomic(&vs.report_file, &text);
                    }
                    emit.push(event);
                }
            };
        let clear = |vs: &mut ViewState| {
            vs.busy_since = None;
            if vs.reported.take().is_some() {
                let _ = std::fs::remove_file(&vs.report_file);
                true
            } else {
                false
            }
        };
        let mut is_gone = false;
        match step {
            Ok(Step::InSync { commit }) | Ok(Step::Behind { branch: commit }) => {
                if clear(vs) {
                    emit.push(WatchEvent::Resolved {
                        task: v.task.clone(),
                        branch: v.branch.clone(),
                        commit: commit.to_string(),
                    });
                }
            }
            Ok(Step::FastForwarded {
                from,
                to,
                commits,
                worktree,
            }) => {
                clear(vs);
                emit.push(WatchEvent::FastForwarded {
                    task: v.task.clone(),
                    branch: v.branch.clone(),
                    child_branch: v.child_branch.clone(),
                    from: from.to_string(),
                    to: to.to_string(),
                    commits,
                    worktree,
                });
            }
            Ok(Step::Diverged {
                branch,
                child,
                child_ahead,
                branch_ahead,
                merge_base,
            }) => {
                vs.busy_since = None;
                let wt = q(&v.task_worktree);
                let event = WatchEvent::Diverged {
                    task: v.task.clone(),
                    branch: v.branch.clone(),
                    child_branch: v.child_branch.clone(),
                    branch_commit: branch.to_string(),
                    child_commit: child.to_string(),
                    merge_base,
                    child_ahead,
                    branch_ahead,
                    resolve: vec![
                        format!("git -C {wt} merge {}", v.child_branch),
                        format!("git -C {wt} rebase {}", v.child_branch),
                    ],
                };
                problem(vs, Reported::Diverged(branch, child), event, &mut emit);
            }
            Ok(Step::Blocked {
                branch,
                child,
                worktree,
                reason,
                paths,
                message,
                resolve,
            }) => {
                let report = if reason == BlockReason::Busy {
                    let since = *vs.busy_since.get_or_insert(now);
                    // A git command holding index.lock for a moment is normal: retry soon.
                    vs.retry_at = Some(now + opts.debounce.max(Duration::from_millis(20)));
                    now.duration_since(since) >= opts.busy_grace
                } else {
                    vs.busy_since = None;
                    vs.retry_at = Some(now + opts.retry);
                    true
                };
                if report {
                    let key = Reported::Blocked(reason.clone(), branch, child, paths.clone());
                    let event = WatchEvent::Blocked {
                        task: v.task.clone(),
                        branch: v.branch.clone(),
                        child_branch: v.child_branch.clone(),
                        branch_commit: branch.to_string(),
                        child_commit: child.to_string(),
                        worktree,
                        reason,
                        paths,
                        message,
                        resolve,
                    };
                    problem(vs, key, event, &mut emit);
                }
            }
            Ok(Step::Raced) => {
                // Someone moved the branch as we looked: look again shortly.
                vs.retry_at = Some(now + opts.debounce);
            }
            Ok(Step::BranchMissing) => {
                let event = WatchEvent::Error {
                    task: v.task.clone(),
                    message: format!(
                        "branch {} does not exist; nothing to fast-forward until it does (git -C {} branch {} {})",
                        v.branch,
                        q(&v.task_worktree),
                        v.branch,
                        v.child_branch
                    ),
                };
                problem(vs, Reported::BranchMissing, event, &mut emit);
            }
            Ok(Step::Gone { reason }) => {
                clear(vs);
                vs.gone = Some(reason);
                is_gone = true;
            }
            Err(e) => {
                vs.retry_at = Some(now + opts.retry);
                let message = e.to_string();
                let event = WatchEvent::Error {
                    task: v.task.clone(),
                    message: message.clone(),
                };
                problem(vs, Reported::Error(message), event, &mut emit);
            }
        }
        for e in emit {
            (self.sink)(e);
        }
        is_gone
    }
}
