//! The spawner thread: one dedicated thread spawns every command of the daemon, and each
//! host command's event loop ([`super::command::run_exec`]) runs on it until its process
//! group is gone.
//!
//! Why a dedicated thread: `PR_SET_PDEATHSIG` fires when the *thread* that forked the child
//! exits, not the process. Tokio's pool threads come and go, so a command spawned from one
//! could be SIGKILLed at a random moment (or, worse, the guarantee would silently not hold).
//! This thread lives as long as the daemon, so "the daemon died" is exactly when the kernel
//! kills each command's leader. The rest of the tree is the supervisor's job
//! ([`crate::reaper`]).
//!
//! The thread runs a current-thread Tokio runtime: the output pumps and the waits of every
//! command run here, which also makes "no command is running" a plain counter that nothing
//! else can race (see [`reap_orphans_if_idle`]).

use std::cell::{Cell, RefCell};

use tokio::sync::{mpsc, oneshot};

use sandbox_host::{Reaped, Reaper};
use sandbox_protocol::{ErrorCode, RpcError};

type Job = Box<dyn FnOnce() + Send>;

/// Handle to the spawner thread.
#[derive(Clone)]
pub struct Executor {
    jobs: mpsc::UnboundedSender<Job>,
}

thread_local! {
    /// Commands running on this (the spawner) thread.
    static RUNNING: Cell<usize> = const { Cell::new(0) };
    /// Git layouts of commands that ended while others ran, to check again when idle.
    static RECHECK: RefCell<Vec<sandbox_host::Recheck>> = const { RefCell::new(Vec::new()) };
    /// Kills the orphans of commands (the daemon is a child subreaper).
    static REAPER: Reaper = Reaper::install();
}

impl Executor {
    /// Starts the spawner thread.
    pub fn start() -> std::io::Result<Executor> {
        let (jobs, mut rx) = mpsc::unbounded_channel::<Job>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("sandbox-spawner".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                rt.block_on(async move {
                    while let Some(job) = rx.recv().await {
                        job();
                    }
                });
                // Only reached when the daemon drops its last handle while exiting; leaving
                // this thread then fires PDEATHSIG for anything still running, as intended.
            })?;
        ready_rx
            .recv()
            .map_err(|_| std::io::Error::other("the spawner thread died while starting"))??;
        Ok(Executor { jobs })
    }

    /// Runs `f` on the spawner thread (inside its runtime) and returns its result.
    pub async fn run<T, F>(&self, f: F) -> Result<T, RpcError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        self.jobs
            .send(Box::new(move || {
                let _ = tx.send(f());
            }))
            .map_err(|_| RpcError::new(ErrorCode::ShuttingDown, "the daemon is shutting down"))?;
        rx.await
            .map_err(|_| RpcError::new(ErrorCode::Internal, "the spawner thread dropped a job"))
    }
}

/// Counts a command as running. Call on the spawner thread right after a successful spawn.
pub fn note_started() {
    RUNNING.with(|r| r.set(r.get() + 1));
}

/// The run sequence's reap step for the daemon: marks a command as finished and, if it was
/// the last one, kills every orphan this daemon inherited as a child subreaper (descendants
/// that left their process group with `setsid` and whose parents died), then checks the git
/// pointers of commands that ended while others ran. Runs on the spawner thread, where spawns
/// also happen, so it can never mistake a command that is just being started for an orphan.
pub fn reap_orphans_if_idle() -> Reaped {
    let idle = RUNNING.with(|r| {
        r.set(r.get().saturating_sub(1));
        r.get() == 0
    });
    let reaped = REAPER.with(|reaper| reaper.reap_when_idle(idle));
    if idle {
        for git in RECHECK.with(|r| std::mem::take(&mut *r.borrow_mut())) {
            for t in sandbox_host::run::recheck(&git) {
                tracing::warn!("after an orphan was killed: {t}");
            }
        }
    }
    reaped
}

/// Keeps a finished command's git layout to check again once the daemon is idle: other
/// commands still run, and an orphan of this one cannot be told from theirs. Call on the
/// spawner thread.
pub fn recheck_when_idle(git: sandbox_host::Recheck) {
    RECHECK.with(|r| r.borrow_mut().push(git));
}
