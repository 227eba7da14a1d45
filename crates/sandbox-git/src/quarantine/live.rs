//! The quarantine while a command runs: every change in the writable layer wakes a thread
//! that syncs it, so commits reach the repository as they are made. The last sync, after
//! every process of the run is gone, is the one that counts; the live ones only make it early.

use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use notify::{RecursiveMode, Watcher as _};

use super::{QuarantineError, StoreQuarantine, StoreReport};

enum Wake {
    Changed,
    Stop,
}

/// A quarantine synced live. [`LiveQuarantine::finish`] ends it; dropping it without that
/// removes the layer unsynced (the run never started).
pub struct LiveQuarantine {
    store: Arc<StoreQuarantine>,
    wake: mpsc::Sender<Wake>,
    thread: Option<JoinHandle<()>>,
    _watcher: Option<notify::RecommendedWatcher>,
}

impl std::fmt::Debug for LiveQuarantine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveQuarantine")
            .field("store", &self.store)
            .finish()
    }
}

impl LiveQuarantine {
    /// Starts watching. Without a watcher (inotify exhausted) the run still works: the final
    /// sync applies everything, only later.
    pub fn start(store: StoreQuarantine) -> Self {
        let store = Arc::new(store);
        let (wake, wakes) = mpsc::channel();
        let notify_wake = wake.clone();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if event.is_ok_and(|e| !e.kind.is_access()) {
                let _ = notify_wake.send(Wake::Changed);
            }
        })
        .and_then(|mut w| {
            w.watch(store.upper(), RecursiveMode::Recursive)?;
            Ok(w)
        });
        let watcher = match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "git quarantine: no live sync, applying at the end");
                None
            }
        };
        let syncing = store.clone();
        let thread = std::thread::Builder::new()
            .name("git-quarantine".into())
            .spawn(move || {
                while let Ok(Wake::Changed) = wakes.recv() {
                    // Coalesce a burst (one commit is a dozen events) into one pass.
                    let mut stop = false;
                    while let Ok(next) = wakes.try_recv() {
                        stop |= matches!(next, Wake::Stop);
                    }
                    if let Err(e) = syncing.sync(false) {
                        tracing::warn!(error = %e, "git quarantine: live sync failed");
                    }
                    if stop {
                        break;
                    }
                }
            })
            .ok();
        LiveQuarantine {
            store,
            wake,
            thread,
            _watcher: watcher,
        }
    }

    pub fn layers(&self) -> &super::Layers {
        self.store.layers()
    }

    /// Call once every process of the run is gone: stops the live sync, applies what is left,
    /// and returns what was done. The layer is removed when the last reference goes.
    pub fn finish(mut self) -> Result<StoreReport, QuarantineError> {
        self.stop();
        self.store.sync(true)?;
        Ok(self.store.report())
    }

    fn stop(&mut self) {
        self._watcher = None;
        let _ = self.wake.send(Wake::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for LiveQuarantine {
    fn drop(&mut self) {
        self.stop();
    }
}
