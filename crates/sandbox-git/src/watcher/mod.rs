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

mod check;
mod options;
mod worker;

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Sender};
use std::thread::JoinHandle;

use notify::event::{AccessKind, AccessMode};
use notify::EventKind;

use crate::error::ViewError;
use crate::events::WatchEvent;
use crate::view::View;
use worker::{Msg, Worker};

pub use options::WatchOptions;

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
