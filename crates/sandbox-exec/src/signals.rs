//! Relaying the terminal's signals to the child's process group.
//!
//! The child leads its own session, so Ctrl-C in the user's terminal reaches only this
//! process; [`SignalRelay`] forwards SIGINT, SIGTERM and SIGHUP to the child's whole group.

use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};

use crate::error::ExecError;

/// Listeners for the relayed signals. Install before spawning: once installed, these
/// signals no longer terminate this process, so none is lost in the window before waiting.
pub struct SignalRelay {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl SignalRelay {
    /// Must be called inside a tokio runtime.
    pub fn install() -> Result<Self, ExecError> {
        let listen =
            |kind| signal(kind).map_err(|e| ExecError::io("installing the signal relay", e));
        Ok(SignalRelay {
            int: listen(SignalKind::interrupt())?,
            term: listen(SignalKind::terminate())?,
            hup: listen(SignalKind::hangup())?,
        })
    }

    /// The next signal received.
    pub async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}
