//! A command that runs in a guest (a VM box) rather than as a child of this process: its
//! backend starts it through the guest's agent ([`GuestLaunch`]), and what comes back is
//! channels — output, stdin, signals — and the one end ([`GuestExit`]). The run sequence treats
//! it as any other armed command ([`crate::run::Armed::launch`]): the same environment rule,
//! the same finish, the same exit rule.

use std::future::Future;
use std::pin::Pin;

use sandbox_exec::{CommandSpec, ExitOutcome, OutputReceiver};
use sandbox_git::quarantine::{QuarantineError, StoreReport};
use tokio::sync::{mpsc, oneshot};

use crate::error::HostError;

/// A boxed future a guest backend returns (the trait stays object-safe).
pub type GuestFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Starts commands in a guest. Implemented by a VM backend's session (BoxLite's:
/// `sandbox_boxlite::session`).
pub trait GuestLaunch: Send + Sync {
    /// Starts `spec` in the guest: its program, arguments, working directory (a path in the
    /// guest) and environment (the command's own variables only), and its timeout, which the
    /// backend enforces in the guest ([`ExitOutcome::TimedOut`]). `stdin`: whether the
    /// command gets a stdin to write to.
    fn launch(
        &self,
        spec: CommandSpec,
        stdin: bool,
    ) -> GuestFuture<Result<GuestProcess, HostError>>;
}

/// One write to a guest command's stdin, answered once it reached the guest (or failed).
#[derive(Debug)]
pub struct GuestInput {
    pub data: Vec<u8>,
    /// Close stdin after `data`.
    pub close: bool,
    pub reply: oneshot::Sender<std::io::Result<()>>,
}

/// A command started in a guest, as its backend hands it back.
pub struct GuestProcess {
    /// Its stdout and stderr as chunks, in order per stream; closed when both streams ended.
    pub output: OutputReceiver,
    /// Where its stdin is written (when it was started with one).
    pub stdin: Option<mpsc::Sender<GuestInput>>,
    /// Signals to deliver to the command in the guest (`SIGKILL` kills it).
    pub signals: mpsc::UnboundedSender<i32>,
    /// Resolves once the command ended in the guest.
    pub exit: GuestFuture<GuestEnd>,
}

/// A guest command's end, and what ending it did to the repository.
#[derive(Debug)]
pub struct GuestEnd {
    pub exit: GuestExit,
    /// Set when this command ended a busy period of a box whose commits come back
    /// (`sandbox_git::quarantine::generation`): what the host took of its git writes.
    pub git: Option<GuestGit>,
}

/// What the host took back of a box's git writes at the end of a busy period.
#[derive(Debug)]
pub struct GuestGit {
    /// The store quarantine's report, or why nothing was read back.
    pub store: Result<StoreReport, QuarantineError>,
    /// `HEAD`, the index and the generation: one line per thing refused.
    pub notes: Vec<String>,
}

impl std::fmt::Debug for GuestProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestProcess")
            .field("stdin", &self.stdin.is_some())
            .finish_non_exhaustive()
    }
}

/// How a guest command ended, as its backend judged the guest's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestExit {
    /// It ran and ended so; `note` is what the guest said about it (its agent's message, or
    /// the timeout's), for the `exit` event.
    Ended {
        outcome: ExitOutcome,
        note: Option<String>,
    },
    /// The guest lost the command (the VM or its agent went away): the box failed, nothing
    /// is known of the command's own end (exit 125).
    Lost(String),
}
