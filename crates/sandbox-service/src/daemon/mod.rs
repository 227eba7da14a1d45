//! The daemon: one per user, owning every box and every backend runtime, serving any number of
//! control connections on a Unix socket and the status-hook endpoint on loopback TCP.
//!
//! One module per job:
//!
//! * [`lifecycle`]: starting (the single-daemon lock, the listeners), the accept loop, shutdown.
//! * [`connection`]: one control connection: its reader, its writer and the queue between them.
//! * [`dispatch`]: which handler serves which method; `host.describe`, `token.issue`, `shutdown`.
//! * [`boxes`]: `box.create`, `box.start`, `box.stop`, `box.remove`, `box.list`.
//! * [`exec`]: `box.exec`, `exec.stdin`, `exec.kill`, and the end of an exec.
//! * [`spawner`]: the thread that spawns every command and the task that owns each one.
//! * [`frames`]: the async frame reader (the protocol's sans-IO decoder over a socket).
//!
//! Per connection: one reader decodes frames and dispatches requests **concurrently**; one
//! writer drains a single bounded queue that carries replies and events alike. Because a
//! command's `output` and `exit` events are queued by the one task that owns the command,
//! and replies that report its end are queued only after that, the client always sees a
//! command's output before its exit and its exit before such a reply. Queuing the `exit` and
//! forgetting the exec are one step ([`exec`]), so no request sees one without the other.

mod boxes;
mod connection;
mod dispatch;
mod exec;
mod frames;
mod lifecycle;
pub(crate) mod microvm;
mod spawner;

use crate::locks::Locked as _;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use sandbox_host::assembly::Defaults;
use sandbox_host::seam::{BackendOptions, Backends};
use sandbox_protocol::{ErrorCode, RpcError};
use tokio::sync::{mpsc, watch};

use crate::registry::{AgentStatus, Registry};
use crate::runtime::{RuntimeError, RuntimePaths};
use crate::token::TokenStore;
use connection::Outbound;
use exec::ExecHandle;
use spawner::Executor;

pub use lifecycle::run;

/// How to run the daemon.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    pub runtime: RuntimePaths,
    /// Loopback port of the hook endpoint; `None` or 0 picks a free one.
    pub hook_port: Option<u16>,
    /// Grants and settings every box starts from (the user's trusted configuration): the
    /// same [`Defaults`] `sandbox run` assembles its policy from.
    pub defaults: Defaults,
    /// SIGTERM → SIGKILL grace when a command is stopped.
    pub kill_grace: Duration,
    /// Trusted backend settings (nono's path, the custom launcher, the trusted places) from
    /// the configuration; `allow_degraded` is taken from each box instead.
    pub backend: BackendOptions,
    /// The backends the binary links (the same registry the CLI chooses from).
    pub backends: Backends,
    /// Where boxes' private TMPDIRs are created (the system temp dir when `None`). The
    /// supervisor passes a directory it removes after the daemon is gone, so a killed daemon
    /// leaks nothing.
    pub box_tmp_root: Option<PathBuf>,
    /// BoxLite's home: its lock (one runtime per home: this daemon's), images, disks, boxes
    /// and logs. Persistent, so named boxes are kept across daemons.
    pub boxlite_home: PathBuf,
    /// How long `box.start` waits for a BoxLite guest's agent (default: the engine's).
    pub boxlite_ready_timeout: Option<Duration>,
    /// The daemon exits once it has had no box, no command and no client connection for this
    /// long (`None`: never). [`DEFAULT_IDLE_EXIT`] unless configured.
    pub idle_exit: Option<Duration>,
}

/// How long a daemon with no box, no command and no client lives on (docs/protocol.md): long
/// enough that a client reconnecting between two steps finds it warm, short enough that the
/// daemons started by `sandbox serve --stdio` do not accumulate.
pub const DEFAULT_IDLE_EXIT: Duration = Duration::from_secs(5 * 60);

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(
        "a sandbox daemon already runs for this user (pid {pid}, socket {socket}); one daemon \
         owns the runtimes: connect to it (`sandbox serve --stdio`) instead",
        socket = .socket.display()
    )]
    AlreadyRunning { pid: String, socket: PathBuf },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DaemonError {
    let what = what.into();
    move |source| DaemonError::Io { what, source }
}

/// The daemon's shared state.
///
/// Lock order: `boxes`, then `execs`. Both are held together to register and to forget an exec
/// (`exec::forget_exec`), so that a box's `execs` and the exec table never disagree; no code
/// takes `boxes` while holding `execs`. The other locks (`tasks`, `conns`, the token store's)
/// are never held while taking `boxes` or `execs`.
pub(crate) struct State {
    pub(crate) tokens: TokenStore,
    pub(crate) boxes: Mutex<Registry>,
    execs: Mutex<HashMap<u64, ExecHandle>>,
    /// Last status of `sandbox run` tasks, by task name.
    pub(crate) tasks: Mutex<HashMap<String, AgentStatus>>,
    /// Authenticated connections, for `boxState` broadcasts.
    conns: Mutex<HashMap<u64, mpsc::Sender<Outbound>>>,
    next_id: AtomicU64,
    executor: Executor,
    shutdown: watch::Sender<bool>,
    shutting_down: AtomicBool,
    pub(crate) hook_port: u16,
    opts: DaemonOptions,
    /// The one BoxLite runtime of `opts.boxlite_home`, opened by the first box (its backend
    /// in `opts.backends` holds it too), shut down with the daemon.
    #[cfg(feature = "boxlite")]
    boxlite: std::sync::Arc<sandbox_boxlite::Engines>,
}

impl State {
    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn hook_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.hook_port)
    }

    /// Sends `frame` to every authenticated connection but `except`, without waiting: a
    /// connection that does not read cannot stall the daemon (it misses the notice instead).
    fn broadcast(&self, frame: &[u8], except: Option<u64>) {
        for (id, tx) in self.conns.locked().iter() {
            if Some(*id) != except {
                let _ = tx.try_send(Outbound::Frame(frame.to_vec()));
            }
        }
    }
}

fn invalid(message: impl Into<String>) -> RpcError {
    RpcError::new(ErrorCode::InvalidParams, message)
}

fn unavailable(message: impl Into<String>) -> RpcError {
    RpcError::new(ErrorCode::BackendUnavailable, message)
}
