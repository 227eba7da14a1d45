//! How to run the daemon, and why it could not start.

use std::path::PathBuf;
use std::time::Duration;

use sandbox_host::assembly::Defaults;
use sandbox_host::seam::{BackendOptions, Backends};

use crate::runtime::{RuntimeError, RuntimePaths};

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

pub(super) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DaemonError {
    let what = what.into();
    move |source| DaemonError::Io { what, source }
}
