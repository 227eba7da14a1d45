//! What the daemon's modules share: its state, a connection as the tasks serving its requests
//! see it, the channels between a running exec and the requests that reach it, and the small
//! helpers every handler uses. Nothing here imports a handler, so every module can import it.

use crate::locks::Locked as _;
use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use nix::sys::signal::Signal;
use sandbox_exec::StreamKind;
use sandbox_protocol::{
    encode_event, encode_reply, BoxState, BoxStateEvent, ErrorCode, ExitEvent, Id, RpcError,
};
use serde_json::Value;
use tokio::sync::mpsc::OwnedPermit;
use tokio::sync::{mpsc, oneshot, watch};

use super::options::DaemonOptions;
use super::spawner::Executor;
use crate::registry::{AgentStatus, Registry};
use crate::token::{Lease, TokenStore};

/// The daemon's shared state.
///
/// Lock order: `boxes`, then `execs`. Both are held together to register and to forget an exec
/// (`exec::forget_exec`), so that a box's `execs` and the exec table never disagree; no code
/// takes `boxes` while holding `execs`. The other locks (`tasks`, `conns`, the token store's)
/// are never held while taking `boxes` or `execs`.
pub(crate) struct State {
    pub(crate) tokens: TokenStore,
    pub(crate) boxes: Mutex<Registry>,
    pub(super) execs: Mutex<HashMap<u64, ExecHandle>>,
    /// Last status of `sandbox run` tasks, by task name.
    pub(crate) tasks: Mutex<HashMap<String, AgentStatus>>,
    /// Authenticated connections, for `boxState` broadcasts.
    pub(super) conns: Mutex<HashMap<u64, mpsc::Sender<Outbound>>>,
    pub(super) next_id: AtomicU64,
    pub(super) executor: Executor,
    pub(super) shutdown: watch::Sender<bool>,
    pub(super) shutting_down: AtomicBool,
    pub(crate) hook_port: u16,
    pub(super) opts: DaemonOptions,
    /// The one BoxLite runtime of `opts.boxlite_home`, opened by the first box (its backend
    /// in `opts.backends` holds it too), shut down with the daemon.
    #[cfg(feature = "boxlite")]
    pub(super) boxlite: Arc<sandbox_boxlite::Engines>,
}

impl State {
    pub(super) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn hook_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.hook_port)
    }

    /// Sends `frame` to every authenticated connection but `except`, without waiting: a
    /// connection that does not read cannot stall the daemon (it misses the notice instead).
    pub(super) fn broadcast(&self, frame: &[u8], except: Option<u64>) {
        for (id, tx) in self.conns.locked().iter() {
            if Some(*id) != except {
                let _ = tx.try_send(Outbound::Frame(frame.to_vec()));
            }
        }
    }
}

/// Emits a `boxState` event: first to the requesting connection (waiting for room, so it
/// precedes the reply), then to every other connection without waiting.
pub(super) async fn announce(
    state: &State,
    conn: Option<&Conn>,
    entry_id: &str,
    name: &str,
    st: BoxState,
    elapsed: Option<Duration>,
) {
    let frame = encode_event(
        "boxState",
        &BoxStateEvent {
            box_id: entry_id.to_string(),
            name: name.to_string(),
            state: st,
            elapsed_ms: elapsed.map(|d| d.as_millis() as u64),
            step: None,
            step_state: None,
            step_ms: None,
            step_error: None,
        },
    );
    if let Some(conn) = conn {
        let _ = conn.out.send(Outbound::Frame(frame.clone())).await;
    }
    state.broadcast(&frame, conn.map(|c| c.id));
}

/// What a connection's writer sends, in order. Output stays raw bytes until the writer
/// encodes it, so the exec thread only moves buffers.
#[derive(Debug)]
pub(super) enum Outbound {
    /// A finished JSON frame (a reply or an event without bytes), no newline.
    Frame(Vec<u8>),
    Output {
        exec_id: u64,
        stream: StreamKind,
        data: Bytes,
    },
    /// The end of an exec: the writer flushes any held partial UTF-8 first.
    Exit(ExitEvent),
}

/// One control connection, as the tasks serving its requests see it.
pub(super) struct Conn {
    pub(super) id: u64,
    pub(super) out: mpsc::Sender<Outbound>,
    pub(super) authed: AtomicBool,
    /// Execs this connection started that have not reported their exit yet.
    pub(super) execs: watch::Sender<usize>,
    /// Task tokens issued on this connection: they are revoked when it closes, so a
    /// `sandbox run` that ends (or is killed) takes its token with it.
    pub(super) leased_tokens: Mutex<Vec<String>>,
    /// The socket (a duplicate of its descriptor), to ask the kernel whether the peer is gone.
    pub(super) socket: Arc<OwnedFd>,
}

impl Conn {
    pub(super) async fn reply(&self, id: Option<&Id>, outcome: &Result<Value, RpcError>) {
        let _ = self
            .out
            .send(Outbound::Frame(encode_reply(id, outcome)))
            .await;
    }
}

/// A task token's lease: it lasts while the peer of the connection it was issued on has not
/// closed its end. Asked each time the token is used, so a killed `sandbox run`'s token stops
/// working the moment the kernel closes the run's socket, not when the daemon notices.
pub(super) struct PeerLease(pub(super) Arc<OwnedFd>);

impl Lease for PeerLease {
    fn ended(&self) -> bool {
        peer_hung_up(self.0.as_fd())
    }
}

/// True when the peer closed its end completely (not just its writing side).
pub(super) fn peer_hung_up(fd: BorrowedFd<'_>) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(_) => fds[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR)),
        Err(_) => true,
    }
}

/// A running exec as the dispatcher sees it.
pub(super) struct ExecHandle {
    pub(super) box_name: String,
    pub(super) conn: u64,
    pub(super) control: mpsc::Sender<Control>,
    pub(super) stdin: Option<mpsc::Sender<StdinMsg>>,
    pub(super) phase: watch::Receiver<Phase>,
}

/// How far an exec has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Phase {
    Running,
    /// The command and its process group are gone.
    Ended,
    /// Its `exit` event is in the connection's queue (or the connection is gone), and the
    /// daemon has forgotten it: both happen in one step (see [`ExecEnd`]).
    Reported,
}

/// The end of an exec, handed back to the daemon to publish.
pub(super) struct ExecEnd {
    pub(super) exit: ExitEvent,
    /// Room for `exit` in the connection's queue, reserved before any lock is taken; `None`
    /// when the connection is gone (nobody to tell).
    pub(super) permit: Option<OwnedPermit<Outbound>>,
    /// To be set to [`Phase::Reported`] in the same step that queues `exit`.
    pub(super) phase: watch::Sender<Phase>,
}

/// Requests from `exec.kill` / `box.stop`.
#[derive(Debug, Clone, Copy)]
pub(super) enum Control {
    Signal(Signal),
    /// SIGTERM now, SIGKILL after `grace` if the command is still there.
    Terminate {
        grace: Duration,
    },
}

/// One `exec.stdin` write, answered when it reached the pipe.
pub(super) struct StdinMsg {
    pub(super) data: Vec<u8>,
    pub(super) close: bool,
    pub(super) reply: oneshot::Sender<Result<(), RpcError>>,
}

/// Work to do once a request's reply is queued (`box.exec` lets its command's events flow,
/// `shutdown` stops the daemon).
pub(super) type After = Option<Box<dyn FnOnce() + Send>>;

/// Resolves once the watched flag (the daemon's shutdown) is set.
pub(super) async fn until_true(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// The host token never enters a sandbox, whichever way a client tries to pass it.
pub(super) fn refuse_host_token(
    state: &State,
    env: &std::collections::BTreeMap<String, String>,
) -> Result<(), RpcError> {
    if env
        .values()
        .any(|value| crate::token::same(value, state.tokens.host()))
    {
        return Err(denied("the host token never enters a sandbox"));
    }
    Ok(())
}

pub(super) fn invalid(message: impl Into<String>) -> RpcError {
    RpcError::new(ErrorCode::InvalidParams, message)
}

pub(super) fn unavailable(message: impl Into<String>) -> RpcError {
    RpcError::new(ErrorCode::BackendUnavailable, message)
}

pub(super) fn denied(message: impl Into<String>) -> RpcError {
    RpcError::new(ErrorCode::Denied, message)
}
