//! The quarantine while a command runs: a thread of its own watches the writable layer with
//! inotify and syncs it on every change, so commits reach the repository as they are made.
//! The last sync, after every process of the run is gone, is the one that counts; the live
//! ones only make it early.
//!
//! The thread sets up its watches once the command has run for [`WATCH_AFTER`], then syncs
//! once before waiting, so nothing written before the watches existed waits for the end. A
//! directory created in the layer (a nested branch name) is watched as it appears.

// Live sync needs inotify (Linux); elsewhere the quarantine, which needs a private view
// anyway, would apply everything at the end.
#[cfg(target_os = "linux")]
use std::collections::HashMap;
#[cfg(target_os = "linux")]
use std::os::fd::AsFd;
use std::os::fd::OwnedFd;
#[cfg(target_os = "linux")]
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
#[cfg(target_os = "linux")]
use std::time::Duration;

#[cfg(target_os = "linux")]
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
#[cfg(target_os = "linux")]
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

use super::error::QuarantineError;
use super::report::StoreReport;
use super::StoreQuarantine;

/// A quarantine synced live. [`LiveQuarantine::finish`] ends it; dropping it without that
/// removes the layer unsynced (the run never started).
pub struct LiveQuarantine {
    store: Arc<StoreQuarantine>,
    /// Closing the write end wakes the thread to stop.
    stop: Option<OwnedFd>,
    /// The thread says here that it let go of the store. It is not joined: closing an inotify
    /// descriptor waits for an SRCU grace period (up to 15 ms here), which nothing needs to
    /// wait for.
    released: Option<mpsc::Receiver<()>>,
    /// The command's git trace events, read to explain failures on pinned refs, and the
    /// push remotes the run may reach.
    trace: Option<(super::trace::GitTrace, Vec<std::path::PathBuf>)>,
}

impl std::fmt::Debug for LiveQuarantine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveQuarantine")
            .field("store", &self.store)
            .finish()
    }
}

#[cfg(target_os = "linux")]
/// What a change in the layer looks like to inotify (reads are not changes).
fn change_mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_ONLYDIR
}

#[cfg(target_os = "linux")]
struct Watches {
    inotify: Inotify,
    dirs: HashMap<WatchDescriptor, PathBuf>,
}

#[cfg(target_os = "linux")]
impl Watches {
    /// Watches `dir` and every directory below it.
    fn add_tree(&mut self, dir: &Path) {
        let Ok(wd) = self.inotify.add_watch(dir, change_mask()) else {
            return;
        };
        self.dirs.insert(wd, dir.to_path_buf());
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                self.add_tree(&entry.path());
            }
        }
    }

    /// Reads the pending events; watches new directories among them.
    fn drain(&mut self) {
        let Ok(events) = self.inotify.read_events() else {
            return;
        };
        for event in events {
            let new_dir = event.mask.contains(AddWatchFlags::IN_ISDIR)
                && event
                    .mask
                    .intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO);
            if let (true, Some(parent), Some(name)) =
                (new_dir, self.dirs.get(&event.wd).cloned(), event.name)
            {
                self.add_tree(&parent.join(name));
            }
        }
    }
}

#[cfg(target_os = "linux")]
fn run(store: Arc<StoreQuarantine>, stop: OwnedFd, released: mpsc::Sender<()>) {
    let watches = watch_and_sync(&store, &stop);
    // The store (and with it the layer's removal) goes back to the caller first; the watches
    // close afterwards, on this thread's own time.
    drop(store);
    let _ = released.send(());
    drop(watches);
}

#[cfg(target_os = "linux")]
/// How long a command runs before it is watched. A shorter one is synced once, when it ends,
/// right away anyway; and closing an inotify descriptor waits for an SRCU grace period (up to
/// 15 ms on the build machine), paid at the latest when the process exits — more than a
/// short command itself takes.
const WATCH_AFTER: Duration = Duration::from_millis(150);

#[cfg(target_os = "linux")]
/// Syncs on every change until `stop` wakes it; returns the watches to be closed.
fn watch_and_sync(store: &StoreQuarantine, stop: &OwnedFd) -> Option<Watches> {
    let mut first = [PollFd::new(stop.as_fd(), PollFlags::POLLIN)];
    let wait = PollTimeout::try_from(WATCH_AFTER).unwrap_or(PollTimeout::NONE);
    if poll(&mut first, wait).is_ok_and(|ready| ready > 0) {
        return None;
    }
    // A bounded layer is watched once the child has sent it (it mounts it before the
    // command starts; a child that fails first never does, and the stop ends the wait).
    if let Some(socket) = store.layer_socket() {
        let mut fds = [
            PollFd::new(socket, PollFlags::POLLIN),
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
        ];
        while poll(&mut fds, PollTimeout::NONE).is_err() {}
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            return None;
        }
        store.receive_layer();
    }
    let watches = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).map(|inotify| {
        let mut w = Watches {
            inotify,
            dirs: HashMap::new(),
        };
        w.add_tree(store.upper());
        w
    });
    let mut watches = match watches {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "git quarantine: no live sync, applying at the end");
            return None;
        }
    };
    loop {
        if let Err(e) = store.sync(false) {
            tracing::warn!(error = %e, "git quarantine: live sync failed");
        }
        let mut fds = [
            PollFd::new(watches.inotify.as_fd(), PollFlags::POLLIN),
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
        ];
        if poll(&mut fds, PollTimeout::NONE).is_err() {
            continue;
        }
        // The stop pipe's writer closed (POLLHUP), or wrote.
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            return Some(watches);
        }
        watches.drain();
    }
}

impl LiveQuarantine {
    /// Starts the live sync on a thread of its own. Without one (no threads, no inotify)
    /// the run still works: the final sync applies everything, only later.
    pub fn start(store: StoreQuarantine) -> Self {
        let store = Arc::new(store);
        let (released, stop) = live_sync(&store);
        LiveQuarantine {
            store,
            stop,
            released,
            trace: None,
        }
    }

    /// Listens for the command's git trace events in `dir` (the run's private TMPDIR, which
    /// the command reaches): returns the value of `GIT_TRACE2_EVENT` to give it, `None` when
    /// no listener could be set up (the run goes on without the explanations).
    /// `push_remotes`: the git dirs the run may push to (`--allow-push`).
    pub fn listen_for_git_errors(
        &mut self,
        dir: &std::path::Path,
        push_remotes: Vec<std::path::PathBuf>,
    ) -> Option<std::ffi::OsString> {
        let trace = super::trace::GitTrace::listen(dir)?;
        let target = trace.target();
        self.trace = Some((trace, push_remotes));
        Some(target)
    }

    /// Call once every process of the run is gone: stops the live sync, applies what is left,
    /// and returns what was done. The layer is removed when the last reference goes.
    pub fn finish(mut self) -> Result<StoreReport, QuarantineError> {
        self.halt();
        self.store.receive_layer();
        self.store.sync(true)?;
        let mut report = self.store.report();
        if let Some((trace, push_remotes)) = self.trace.take() {
            let failures = trace.finish();
            let pins = super::trace::Pins {
                common: self.store.common(),
                pinned_refs: &self.store.layers().pinned_refs,
                push_remotes: &push_remotes,
            };
            report.pinned_failures =
                super::trace::explain(&failures, &pins, &super::trace::local_repository);
        }
        Ok(report)
    }

    /// Stops the live sync and waits until its thread no longer uses the store.
    fn halt(&mut self) {
        drop(self.stop.take());
        if let Some(released) = self.released.take() {
            let _ = released.recv();
        }
    }
}

/// The live sync's thread: its "released" channel and the write end of its stop pipe.
type LiveSync = (Option<mpsc::Receiver<()>>, Option<OwnedFd>);

/// No inotify: no live sync; the final sync applies everything.
#[cfg(not(target_os = "linux"))]
fn live_sync(_store: &Arc<StoreQuarantine>) -> LiveSync {
    (None, None)
}

/// Starts the thread that syncs `store` on every change.
#[cfg(target_os = "linux")]
fn live_sync(store: &Arc<StoreQuarantine>) -> LiveSync {
    let pipe = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC);
    let (released, stop) = match pipe {
        Ok((read, write)) => {
            let syncing = store.clone();
            let (tx, rx) = mpsc::channel();
            let spawned = std::thread::Builder::new()
                .name("git-quarantine".into())
                .spawn(move || run(syncing, read, tx));
            match spawned {
                Ok(_) => (Some(rx), Some(write)),
                Err(e) => {
                    tracing::warn!(error = %e, "git quarantine: no live sync thread");
                    (None, None)
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "git quarantine: no live sync, applying at the end");
            (None, None)
        }
    };
    (released, stop)
}

impl Drop for LiveQuarantine {
    fn drop(&mut self) {
        self.halt();
    }
}
