//! The daemon: one per user, owning every box and every backend runtime, serving any number of
//! control connections on a Unix socket and the status-hook endpoint on loopback TCP.
//!
//! Per connection: one reader decodes frames and dispatches requests **concurrently**; one
//! writer drains a single bounded queue that carries replies and events alike. Because a
//! command's `output` and `exit` events are queued by the one task that owns the command,
//! and replies that report its end are queued only after that, the client always sees a
//! command's output before its exit and its exit before such a reply.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;

use sandbox_exec::{
    CommandPolicy, CommandRequest, CommandSpec, OutputLimits, OutputMode, SpawnOptions, StdinMode,
    WorkspaceGuard,
};
use sandbox_host::assembly::{
    self, CommandIdentity, Defaults, Request as PolicyAsk, TmpdirRequest,
};
use sandbox_host::backend::{self, BackendKind, BackendOptions, LogProgress};
use sandbox_host::HostError;

use crate::boxes::{self, AgentStatus, BoxEntry, Registry};
use crate::exec::{self, Control, ExecCtx, Executor, Outbound, Phase, StdinMsg};
use crate::protocol::{
    self, encode_event, encode_reply, BoxCreateParams, BoxExecParams, BoxState, BoxStateEvent,
    Decoded, ErrorCode, Frame, FrameReader, Id, OutputEncoder, Request, RpcError, MAX_FRAME_BYTES,
    MAX_REQUEST_BYTES, PROTOCOL,
};
use crate::runtime::{RuntimeError, RuntimePaths};
use crate::token::{Scope, TokenStore};

/// Frames a connection's queue holds before producers wait (replies and events alike).
const QUEUE: usize = 64;
/// `exec.stdin` writes one exec may have queued before further ones get `stdinBusy`.
const STDIN_QUEUE: usize = 16;
/// After the command exits, output is still forwarded this long (a descendant may hold the
/// pipe; it is killed with the group, but one that left the group could keep it open).
const DRAIN: Duration = Duration::from_millis(500);

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
    /// Where boxes' private TMPDIRs are created (the system temp dir when `None`). The
    /// supervisor passes a directory it removes after the daemon is gone, so a killed daemon
    /// leaks nothing.
    pub box_tmp_root: Option<PathBuf>,
}

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

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DaemonError {
    let what = what.into();
    move |source| DaemonError::Io { what, source }
}

/// A running exec as the dispatcher sees it.
struct ExecHandle {
    box_name: String,
    conn: u64,
    control: mpsc::Sender<Control>,
    stdin: Option<mpsc::Sender<StdinMsg>>,
    phase: watch::Receiver<Phase>,
}

/// The daemon's shared state.
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
        for (id, tx) in self.conns.lock().expect("conns lock").iter() {
            if Some(*id) != except {
                let _ = tx.try_send(Outbound::Frame(frame.to_vec()));
            }
        }
    }
}

/// Runs the daemon until `shutdown`, SIGTERM, SIGINT or SIGHUP. Blocking.
pub fn run(opts: DaemonOptions) -> Result<(), DaemonError> {
    let paths = opts.runtime.clone();
    paths.ensure_dir()?;
    let _lock = take_lock(&paths)?;

    // Descendants that leave their group and lose their parent come back to us, so the
    // daemon can kill them; see `exec::sweep_orphans_if_idle`.
    if let Err(e) = sandbox_exec::process_group::become_subreaper() {
        tracing::warn!(error = %e, "could not become a child subreaper");
    }
    let tokens = TokenStore::new().map_err(io_err("generating the host token"))?;
    paths.write_host_token(tokens.host())?;
    let executor = Executor::start().map_err(io_err("starting the spawner thread"))?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sandbox-daemon")
        .enable_all()
        .build()
        .map_err(io_err("starting the async runtime"))?;
    let box_tmp_root = opts.box_tmp_root.clone();
    let result = rt.block_on(serve(opts, tokens, executor));
    let _ = std::fs::remove_file(paths.socket());
    let _ = std::fs::remove_file(paths.host_token());
    // Do not wait for stray blocking tasks (a hook connection mid-read).
    rt.shutdown_timeout(Duration::from_millis(200));
    // Every command is stopped by now. The supervisor removes this directory too, but it may
    // be the one that was killed (that is why this daemon is stopping), so do it here as well.
    if let Some(root) = box_tmp_root {
        let _ = std::fs::remove_dir_all(root);
    }
    result
}

fn take_lock(paths: &RuntimePaths) -> Result<nix::fcntl::Flock<std::fs::File>, DaemonError> {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let path = paths.lock();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(io_err(format!("opening {}", path.display())))?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(mut lock) => {
            let _ = lock.set_len(0);
            let _ = lock.rewind();
            let _ = writeln!(lock, "{}", std::process::id());
            Ok(lock)
        }
        Err((mut file, _)) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            Err(DaemonError::AlreadyRunning {
                pid: pid.trim().to_string(),
                socket: paths.socket(),
            })
        }
    }
}

async fn serve(
    opts: DaemonOptions,
    tokens: TokenStore,
    executor: Executor,
) -> Result<(), DaemonError> {
    let socket = opts.runtime.socket();
    // We hold the lock, so a socket file here is a dead daemon's.
    let _ = std::fs::remove_file(&socket);
    let listener =
        UnixListener::bind(&socket).map_err(io_err(format!("binding {}", socket.display())))?;
    crate::runtime::set_mode(&socket, 0o600)?;
    let hook_listener = tokio::net::TcpListener::bind(("127.0.0.1", opts.hook_port.unwrap_or(0)))
        .await
        .map_err(io_err(format!(
            "binding the hook endpoint on 127.0.0.1:{} (service.hook_port)",
            opts.hook_port.unwrap_or(0)
        )))?;
    let hook_port = hook_listener
        .local_addr()
        .map_err(io_err("reading the hook port"))?
        .port();

    let (shutdown, mut shutdown_rx) = watch::channel(false);
    let state = Arc::new(State {
        tokens,
        boxes: Mutex::new(Registry::default()),
        execs: Mutex::new(HashMap::new()),
        tasks: Mutex::new(HashMap::new()),
        conns: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(1),
        executor,
        shutdown,
        shutting_down: AtomicBool::new(false),
        hook_port,
        opts,
    });
    tokio::spawn(crate::hooks::serve(hook_listener, state.clone()));
    eprintln!(
        "sandbox: daemon {} listening on {} (protocol {PROTOCOL}); status hooks on {}",
        std::process::id(),
        socket.display(),
        state.hook_url()
    );

    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(io_err("installing SIGTERM"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(io_err("installing SIGINT"))?;
    let mut hup = signal(SignalKind::hangup()).map_err(io_err("installing SIGHUP"))?;
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(connection(state.clone(), stream));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = until_true(&mut shutdown_rx) => break,
            _ = term.recv() => { stop_everything(&state).await; break }
            _ = int.recv() => { stop_everything(&state).await; break }
            _ = hup.recv() => { stop_everything(&state).await; break }
        }
    }
    drop(listener);
    let _ = std::fs::remove_file(&socket);
    let _ = state.shutdown.send(true);
    // Let connections flush what is queued (the shutdown reply, last events); bounded so a
    // client that stopped reading cannot keep the daemon alive.
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    Ok(())
}

async fn until_true(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// Stops every command of every box and waits until their groups are gone.
async fn stop_everything(state: &Arc<State>) {
    state.shutting_down.store(true, Ordering::SeqCst);
    let names = state.boxes.lock().expect("boxes lock").names();
    for name in names {
        let _ = stop_box(state, &name, false, None).await;
    }
}

struct Conn {
    id: u64,
    out: mpsc::Sender<Outbound>,
    authed: AtomicBool,
    /// Execs this connection started that have not reported their exit yet.
    execs: watch::Sender<usize>,
    /// Task tokens issued on this connection: they are revoked when it closes, so a
    /// `sandbox run` that ends (or is killed) takes its token with it.
    leased_tokens: Mutex<Vec<String>>,
}

impl Conn {
    async fn reply(&self, id: Option<&Id>, outcome: &Result<Value, RpcError>) {
        let _ = self
            .out
            .send(Outbound::Frame(encode_reply(id, outcome)))
            .await;
    }
}

#[derive(PartialEq)]
enum Flow {
    Continue,
    Close,
}

async fn connection(state: Arc<State>, stream: UnixStream) {
    // The socket is 0600 in a 0700 directory; this check also holds if someone widened them.
    let me = nix::unistd::geteuid().as_raw();
    match stream.peer_cred() {
        Ok(cred) if cred.uid() == me => {}
        other => {
            tracing::warn!(?other, "refused a connection from another user");
            return;
        }
    }
    let conn_id = state.next_id();
    let (rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::channel(QUEUE);
    let writer = tokio::spawn(write_loop(wr, rx));
    let conn = Arc::new(Conn {
        id: conn_id,
        out: tx,
        authed: AtomicBool::new(false),
        execs: watch::channel(0).0,
        leased_tokens: Mutex::new(Vec::new()),
    });
    let mut reader = FrameReader::new(rd, MAX_FRAME_BYTES);
    let mut inflight = JoinSet::new();
    let mut shutdown = state.shutdown.subscribe();
    loop {
        tokio::select! {
            frame = reader.next() => match frame {
                Ok(Some(frame)) => {
                    if on_frame(&state, &conn, frame, &mut inflight).await == Flow::Close {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(conn = conn_id, error = %e, "read failed");
                    break;
                }
            },
            Some(_) = inflight.join_next(), if !inflight.is_empty() => {}
            _ = until_true(&mut shutdown) => break,
        }
    }
    // No more requests. Finish the ones in flight and this connection's commands (a client
    // may send its requests and close its writing side), unless the peer is gone entirely:
    // then there is no one to report to and its commands are killed.
    let fd = {
        use std::os::fd::AsRawFd;
        reader.get_ref().as_ref().as_raw_fd()
    };
    let mut execs = conn.execs.subscribe();
    let finished = async {
        while inflight.join_next().await.is_some() {}
        let _ = execs.wait_for(|n| *n == 0).await;
    };
    tokio::pin!(finished);
    let mut writer = writer;
    loop {
        tokio::select! {
            _ = &mut finished => break,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                if peer_hung_up(fd) {
                    // Dropping the queue's receiver tells every exec task of this
                    // connection that its client is gone.
                    writer.abort();
                }
            }
        }
    }
    state.conns.lock().expect("conns lock").remove(&conn_id);
    for token in conn.leased_tokens.lock().expect("lease lock").drain(..) {
        state.tokens.revoke_token(&token);
    }
    drop(conn);
    drop(reader);
    let _ = (&mut writer).await;
}

/// True when the peer closed its end completely (not just its writing side).
fn peer_hung_up(fd: std::os::fd::RawFd) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::BorrowedFd;
    // SAFETY: `fd` belongs to the connection's read half, which the caller keeps alive for
    // the duration of this call.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let mut fds = [PollFd::new(borrowed, PollFlags::POLLOUT)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(_) => fds[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR)),
        Err(_) => true,
    }
}

async fn on_frame(
    state: &Arc<State>,
    conn: &Arc<Conn>,
    frame: Frame,
    inflight: &mut JoinSet<()>,
) -> Flow {
    let (id, request) = match protocol::decode_frame(&frame) {
        Decoded::Blank => return Flow::Continue,
        Decoded::Error(id, e) => {
            conn.reply(id.as_ref(), &Err(e)).await;
            return Flow::Continue;
        }
        Decoded::Request(id, r) => (id, r),
    };
    drop(frame);
    let authed = conn.authed.load(Ordering::SeqCst);
    match request {
        Request::Hello(p) => {
            // Sequential on purpose: nothing after it on this connection may run before the
            // connection is authenticated.
            if let Err(e) = protocol::check_protocol(p.protocol.as_deref()) {
                conn.reply(Some(&id), &Err(e)).await;
                return Flow::Continue;
            }
            if crate::token::same(&p.token, state.tokens.host()) {
                conn.authed.store(true, Ordering::SeqCst);
                state
                    .conns
                    .lock()
                    .expect("conns lock")
                    .insert(conn.id, conn.out.clone());
                tracing::debug!(conn = conn.id, client = ?p.client, "authenticated");
                let result = json!({
                    "protocol": PROTOCOL,
                    "pid": std::process::id(),
                    "connectionId": conn.id,
                });
                conn.reply(Some(&id), &Ok(result)).await;
                Flow::Continue
            } else {
                let e = RpcError::new(
                    ErrorCode::Unauthenticated,
                    "host.hello: wrong token; the connection is closed",
                );
                conn.reply(Some(&id), &Err(e)).await;
                Flow::Close
            }
        }
        Request::Describe(p) => {
            let outcome =
                protocol::check_protocol(p.protocol.as_deref()).map(|()| describe(state, conn));
            conn.reply(Some(&id), &outcome).await;
            Flow::Continue
        }
        _ if !authed => {
            let e = RpcError::new(
                ErrorCode::Unauthenticated,
                format!(
                    "send host.hello with the host token (in {}) first",
                    state.opts.runtime.host_token().display()
                ),
            );
            conn.reply(Some(&id), &Err(e)).await;
            Flow::Continue
        }
        Request::ExecStdin(p) => {
            // Queued here, in arrival order, so pipelined writes reach the pipe in order.
            let rx = match queue_stdin(state, p) {
                Ok(rx) => rx,
                Err(e) => {
                    conn.reply(Some(&id), &Err(e)).await;
                    return Flow::Continue;
                }
            };
            let conn = conn.clone();
            inflight.spawn(async move {
                let outcome = match rx.await {
                    Ok(Ok(())) => Ok(json!({ "ok": true })),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(RpcError::new(
                        ErrorCode::StdinClosed,
                        "stdin: the command ended before the data was written",
                    )),
                };
                conn.reply(Some(&id), &outcome).await;
            });
            Flow::Continue
        }
        request => {
            let conn = conn.clone();
            let state = state.clone();
            inflight.spawn(async move {
                let mut after = None;
                let outcome = handle(&state, &conn, request, &mut after).await;
                conn.reply(Some(&id), &outcome).await;
                if let Some(after) = after {
                    after();
                }
            });
            Flow::Continue
        }
    }
}

fn describe(state: &State, conn: &Conn) -> Value {
    // The same sample policy and judgement as `sandbox doctor`, with this daemon's trusted
    // backend settings, so the two never disagree about what is available.
    let backends: Vec<Value> = match tempfile::tempdir()
        .map_err(|source| HostError::Tmpdir {
            root: std::env::temp_dir(),
            source,
        })
        .and_then(|scratch| backend::sample_policy(scratch.path(), Some(state.hook_port)))
    {
        Ok(sample) => BackendKind::ALL
            .iter()
            .map(|&kind| {
                let a = backend::availability(kind, &sample, &state.opts.backend);
                json!({
                    "name": a.name,
                    "available": a.available,
                    "degraded": a.degraded,
                    "mechanism": a.enforcement.as_ref().map(|e| e.mechanism.clone()),
                    "reason": a.reason,
                })
            })
            .collect(),
        Err(e) => vec![json!({ "error": e.to_string() })],
    };
    json!({
        "protocol": PROTOCOL,
        "version": env!("CARGO_PKG_VERSION"),
        "pid": std::process::id(),
        "authenticated": conn.authed.load(Ordering::SeqCst),
        "backends": backends,
        "methods": protocol::METHODS,
        "events": ["output", "exit", "boxState"],
        "capabilities": [
            "concurrentDispatch",
            "orderedOutput",
            "binaryOutputBase64",
            "sharedBoxes",
            "statusHooks"
        ],
        "limits": { "maxRequestBytes": MAX_REQUEST_BYTES, "maxFrameBytes": MAX_FRAME_BYTES },
        "hookUrl": state.hook_url(),
        "hookPort": state.hook_port,
    })
}

fn queue_stdin(
    state: &State,
    p: protocol::ExecStdinParams,
) -> Result<oneshot::Receiver<Result<(), RpcError>>, RpcError> {
    let data = protocol::decode_data(&p.data, p.encoding)?;
    let execs = state.execs.lock().expect("execs lock");
    let handle = execs
        .get(&p.exec_id)
        .ok_or_else(|| no_such_exec(p.exec_id))?;
    let Some(tx) = &handle.stdin else {
        return Err(RpcError::new(
            ErrorCode::StdinClosed,
            format!("exec {} was started with stdin: false", p.exec_id),
        ));
    };
    let (reply, rx) = oneshot::channel();
    match tx.try_send(StdinMsg {
        data,
        close: p.close,
        reply,
    }) {
        Ok(()) => Ok(rx),
        Err(mpsc::error::TrySendError::Full(_)) => Err(RpcError::new(
            ErrorCode::StdinBusy,
            format!(
                "exec {}: {STDIN_QUEUE} earlier exec.stdin writes are still queued (the command \
                 is not reading); wait for their replies before sending more",
                p.exec_id
            ),
        )),
        Err(mpsc::error::TrySendError::Closed(_)) => Err(RpcError::new(
            ErrorCode::StdinClosed,
            format!("exec {}: stdin is closed", p.exec_id),
        )),
    }
}

fn no_such_exec(id: u64) -> RpcError {
    RpcError::new(
        ErrorCode::NoSuchExec,
        format!("no running exec {id} (it may have finished: see its exit event)"),
    )
}

type After = Option<Box<dyn FnOnce() + Send>>;

async fn handle(
    state: &Arc<State>,
    conn: &Arc<Conn>,
    request: Request,
    after: &mut After,
) -> Result<Value, RpcError> {
    if state.shutting_down.load(Ordering::SeqCst) && !matches!(request, Request::BoxList(_)) {
        return Err(RpcError::new(
            ErrorCode::ShuttingDown,
            "the daemon is shutting down",
        ));
    }
    match request {
        Request::Hello(_) | Request::Describe(_) | Request::ExecStdin(_) => {
            unreachable!("handled by the reader")
        }
        Request::BoxCreate(p) => box_create(state, conn, p).await,
        Request::BoxStart(p) => box_start(state, conn, &p.name).await,
        Request::BoxExec(p) => box_exec(state, conn, p, after).await,
        Request::ExecKill(p) => {
            let control = match &p.signal {
                Some(sig) => Control::Signal(exec::parse_signal(sig)?),
                None => Control::Terminate {
                    grace: state.opts.kill_grace,
                },
            };
            let tx = {
                let execs = state.execs.lock().expect("execs lock");
                execs
                    .get(&p.exec_id)
                    .ok_or_else(|| no_such_exec(p.exec_id))?
                    .control
                    .clone()
            };
            // An exec that already ended has closed its control channel: that is fine.
            let _ = tx.send(control).await;
            Ok(json!({ "ok": true }))
        }
        Request::BoxStop(p) => {
            stop_box(state, &p.name, p.force, Some(conn)).await?;
            Ok(json!({ "ok": true }))
        }
        Request::BoxRemove(p) => box_remove(state, conn, &p.name, p.force).await,
        Request::BoxList(_) => {
            let list = state.boxes.lock().expect("boxes lock").list();
            Ok(serde_json::to_value(list).expect("box info serialises"))
        }
        Request::TokenIssue(p) => {
            boxes::validate_name("task", &p.task)?;
            let token = state
                .tokens
                .issue(Scope::Task(p.task.clone()))
                .map_err(|e| RpcError::new(ErrorCode::Internal, e.to_string()))?;
            conn.leased_tokens
                .lock()
                .expect("lease lock")
                .push(token.clone());
            Ok(json!({ "token": token, "url": state.hook_url(), "port": state.hook_port }))
        }
        Request::Shutdown(_) => {
            stop_everything(state).await;
            let state = state.clone();
            *after = Some(Box::new(move || {
                let _ = state.shutdown.send(true);
            }));
            Ok(json!({ "ok": true }))
        }
    }
}

/// Emits a `boxState` event: first to the requesting connection (waiting for room, so it
/// precedes the reply), then to every other connection without waiting.
async fn announce(
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
        },
    );
    if let Some(conn) = conn {
        let _ = conn.out.send(Outbound::Frame(frame.clone())).await;
    }
    state.broadcast(&frame, conn.map(|c| c.id));
}

fn invalid(message: impl Into<String>) -> RpcError {
    RpcError::new(ErrorCode::InvalidParams, message)
}

fn unavailable(message: impl Into<String>) -> RpcError {
    RpcError::new(ErrorCode::BackendUnavailable, message)
}

async fn box_create(
    state: &Arc<State>,
    conn: &Arc<Conn>,
    mut p: BoxCreateParams,
) -> Result<Value, RpcError> {
    let started = Instant::now();
    boxes::validate_name("box name", &p.name)?;
    let kind = BackendKind::parse_usable(p.backend.as_deref().unwrap_or("native"))
        .map_err(|e| unavailable(e.to_string()))?;
    p.backend = Some(kind.as_str().to_string());
    let Some(workdir) = &p.workdir else {
        return Err(invalid(format!(
            "box.create: workdir is required for the {kind} backend (the task's worktree)"
        )));
    };
    let workdir = std::fs::canonicalize(workdir)
        .map_err(|e| invalid(format!("workdir {}: {e}", workdir.display())))?;
    p.workdir = Some(workdir.clone());

    refuse_host_token(state, &p.env)?;
    if let Some(reused) = reuse(state, &p)? {
        return Ok(reused);
    }

    // The one policy assembly `sandbox run` uses: the trusted defaults, this box's grants,
    // and the hook endpoint kept reachable under a network block.
    let defaults = Defaults {
        hook_port: Some(state.hook_port),
        ..state.opts.defaults.clone()
    };
    let assembled = assembly::assemble(
        &defaults,
        PolicyAsk {
            workdir,
            cwd: None,
            allow_read: p.allow_read.clone(),
            allow_write: p.allow_write.clone(),
            env: p.env.iter().map(|(n, v)| format!("{n}={v}")).collect(),
            block_net: p.block_net,
            allow_ports: p.allow_ports.clone(),
            allow_domains: p.allow_domains.clone(),
            timeout: p.timeout_ms.map(Duration::from_millis),
            unprotected_git: p.unprotected_git,
            tmpdir: Some(TmpdirRequest {
                prefix: format!("sandbox-box-{}-", p.name),
                root: state.opts.box_tmp_root.clone(),
            }),
        },
    )
    .map_err(|e| match e {
        HostError::Tmpdir { .. } => RpcError::new(ErrorCode::Internal, e.to_string()),
        other => invalid(format!("box {}: {other}", p.name)),
    })?;
    let policy = assembled.policy;
    // Prepared now, through the seam, so that a box whose boundary cannot be set up (or
    // whose grants reach the daemon's own state) is refused at creation, loudly; every
    // `box.exec` then runs in this session.
    let session = backend::prepare(
        kind,
        &policy,
        &BackendOptions {
            allow_degraded: p.allow_degraded,
            ..state.opts.backend.clone()
        },
        &LogProgress,
    )
    .map_err(|e| match e {
        HostError::TrustedPlace(_) => denied(format!("box {}: {e}", p.name)),
        other => unavailable(format!("box {}: {other}", p.name)),
    })?;
    let enforcement = session.enforcement().clone();

    let id = crate::token::generate("")
        .map_err(|e| RpcError::new(ErrorCode::Internal, e.to_string()))?[..12]
        .to_string();
    {
        let mut boxes = state.boxes.lock().expect("boxes lock");
        if boxes.contains(&p.name) {
            drop(boxes);
            // Created concurrently under the same name: the same rules as above, and the
            // other creation has registered it by now (under this same lock).
            return reuse(state, &p)?.ok_or_else(|| {
                RpcError::new(
                    ErrorCode::Internal,
                    format!(
                        "box {:?} was created and removed by other requests while this one \
                         prepared it; send box.create again",
                        p.name
                    ),
                )
            });
        }
        let token = state
            .tokens
            .issue(Scope::Box(p.name.clone()))
            .map_err(|e| RpcError::new(ErrorCode::Internal, e.to_string()))?;
        boxes.insert(BoxEntry {
            id: id.clone(),
            name: p.name.clone(),
            kind,
            allow_degraded: p.allow_degraded,
            params: p.clone(),
            policy,
            session,
            state: BoxState::Created,
            token,
            created_at_ms: boxes::now_ms(),
            execs: Default::default(),
            last_status: None,
            tmpdir: assembled.tmpdir,
        });
    }
    let elapsed = started.elapsed();
    announce(
        state,
        Some(conn),
        &id,
        &p.name,
        BoxState::Created,
        Some(elapsed),
    )
    .await;
    Ok(json!({
        "boxId": id,
        "name": p.name,
        "backend": kind.as_str(),
        "created": true,
        "state": BoxState::Created,
        "elapsedMs": elapsed.as_millis() as u64,
        "enforcement": enforcement,
    }))
}

/// A box of this name exists: reuse it if it was created with the same parameters, refuse
/// otherwise (silently handing out a box with another policy would be a surprise).
fn reuse(state: &State, p: &BoxCreateParams) -> Result<Option<Value>, RpcError> {
    let boxes = state.boxes.lock().expect("boxes lock");
    let Ok(existing) = boxes.get(&p.name) else {
        return Ok(None);
    };
    if existing.params != *p {
        return Err(RpcError::new(
            ErrorCode::BoxExists,
            format!(
                "a box named {:?} exists with other settings; box.remove it first or use \
                 another name",
                p.name
            ),
        )
        .with_data(json!({ "existing": existing.params })));
    }
    Ok(Some(json!({
        "boxId": existing.id,
        "name": existing.name,
        "backend": existing.kind.as_str(),
        "created": false,
        "state": existing.state,
        "elapsedMs": 0,
    })))
}

async fn box_start(state: &State, conn: &Conn, name: &str) -> Result<Value, RpcError> {
    let (id, changed) = {
        let mut boxes = state.boxes.lock().expect("boxes lock");
        let entry = boxes.get_mut(name)?;
        let changed = match entry.state {
            BoxState::Created | BoxState::Stopped => {
                entry.state = BoxState::Running;
                true
            }
            BoxState::Running => false,
            other => {
                return Err(RpcError::new(
                    ErrorCode::BoxState,
                    format!("box {name:?} is {}; wait for it to settle", other.as_str()),
                ))
            }
        };
        (entry.id.clone(), changed)
    };
    if changed {
        // Native boxes have nothing to boot: the boundary is applied per command.
        announce(
            state,
            Some(conn),
            &id,
            name,
            BoxState::Running,
            Some(Duration::ZERO),
        )
        .await;
    }
    Ok(json!({ "boxId": id, "bootMs": 0, "state": BoxState::Running }))
}

async fn box_exec(
    state: &Arc<State>,
    conn: &Arc<Conn>,
    p: BoxExecParams,
    after: &mut After,
) -> Result<Value, RpcError> {
    let started = Instant::now();
    if p.interactive {
        return Err(invalid(
            "box.exec: interactive (pty) execs are not offered by this daemon; use `sandbox \
             shell` for an interactive shell",
        ));
    }
    let (kind, policy, token, session) = {
        let boxes = state.boxes.lock().expect("boxes lock");
        let entry = boxes.get(&p.name)?;
        if entry.state != BoxState::Running {
            return Err(RpcError::new(
                ErrorCode::BoxState,
                format!(
                    "box {:?} is {}; box.start it first",
                    p.name,
                    entry.state.as_str()
                ),
            ));
        }
        (
            entry.kind,
            entry.policy.clone(),
            entry.token.clone(),
            entry.session.clone(),
        )
    };

    // The working directory must resolve (symlinks and `..` on the real filesystem) inside
    // the workspace or a granted path.
    let mut guard = WorkspaceGuard::new(&policy.workspace.root)
        .map_err(|e| denied(e.to_string()))?
        .check_args(false);
    for grant in policy.fs.write.iter().chain(policy.fs.read.iter()) {
        guard = guard
            .allow_root(&grant.path)
            .map_err(|e| denied(e.to_string()))?;
    }
    let cwd = match &p.working_dir {
        Some(dir) => guard
            .check_path(&policy.workspace.cwd, dir)
            .map_err(|e| denied(e.to_string()))?,
        None => policy.workspace.cwd.clone(),
    };
    let argv = std::iter::once(p.command.clone())
        .chain(p.args.iter().cloned())
        .map(Into::into)
        .collect();
    let mut spec = CommandSpec::new(CommandRequest::Argv(argv), &cwd)
        .map_err(|e| invalid(format!("box.exec: {e}")))?;
    refuse_host_token(state, &p.env)?;
    let extra: Vec<(String, String)> = p.env.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
    // The one environment assembly `sandbox run` uses too.
    spec.env = assembly::command_env(
        &policy,
        kind,
        &CommandIdentity {
            task: p.name.clone(),
            box_name: Some(p.name.clone()),
            hook: Some((state.hook_url(), token)),
        },
        &extra,
        std::env::vars_os(),
    )
    .map_err(|e| invalid(e.to_string()))?;
    spec.timeout = p
        .timeout_ms
        .map(Duration::from_millis)
        .or(policy.limits.timeout);
    let prepared = session.command(spec).map_err(|e| match e {
        HostError::Command(e) => spawn_failed(&e),
        other => unavailable(other.to_string()),
    })?;
    guard
        .admit(&prepared.spec)
        .map_err(|e| denied(e.to_string()))?;

    let exec_id = state.next_id();
    let (control_tx, control_rx) = mpsc::channel(8);
    let (stdin_tx, stdin_rx) = if p.stdin {
        let (tx, rx) = mpsc::channel(STDIN_QUEUE);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let (phase_tx, phase_rx) = watch::channel(Phase::Running);
    let (go_tx, go_rx) = oneshot::channel::<()>();
    // Registered before the command starts, so that its end (which unregisters it) can never
    // come first.
    {
        let mut boxes = state.boxes.lock().expect("boxes lock");
        boxes.get_mut(&p.name)?.execs.insert(exec_id);
    }
    state.execs.lock().expect("execs lock").insert(
        exec_id,
        ExecHandle {
            box_name: p.name.clone(),
            conn: conn.id,
            control: control_tx,
            stdin: stdin_tx,
            phase: phase_rx,
        },
    );
    conn.execs.send_modify(|n| *n += 1);
    let done: Box<dyn FnOnce() + Send> = {
        let state = state.clone();
        let conn = conn.clone();
        let box_name = p.name.clone();
        Box::new(move || forget_exec(&state, &conn, &box_name, exec_id))
    };
    let options = SpawnOptions {
        stdin: if p.stdin {
            StdinMode::Piped
        } else {
            StdinMode::Null
        },
        output: OutputMode::Capture(OutputLimits::default()),
        // The backend's own child setup is attached by `PreparedCommand::spawn`.
        setup: None,
        policy: Some(Arc::new(guard) as Arc<dyn CommandPolicy>),
        kill_grace: state.opts.kill_grace,
        drain_timeout: DRAIN,
        // Safe here: the spawner thread lives as long as the daemon.
        die_with_parent: true,
    };
    let ctx = ExecCtx {
        exec_id,
        out: conn.out.clone(),
        control: control_rx,
        stdin: stdin_rx,
        phase: phase_tx,
        drain: DRAIN,
        done,
    };
    let spawned = state
        .executor
        .run(move || match prepared.spawn(options) {
            Ok(running) => {
                let pid = running.pid().as_raw();
                exec::note_started();
                tokio::spawn(async move {
                    // The reply carrying the execId goes out before any of its events.
                    let _ = go_rx.await;
                    // The prepared command (nono's manifest and start marker) lives until
                    // the seam finishes it, after every process of the command is gone.
                    exec::run_exec(running, prepared, ctx).await;
                });
                Ok(pid)
            }
            Err(e) => {
                (ctx.done)();
                // Nothing started; the seam still cleans up what it prepared.
                drop(prepared.finish(None));
                Err(e)
            }
        })
        .await;
    let pid = match spawned {
        Ok(Ok(pid)) => pid,
        Ok(Err(e)) => return Err(spawn_failed(&e)),
        Err(e) => {
            forget_exec(state, conn, &p.name, exec_id);
            return Err(e);
        }
    };
    *after = Some(Box::new(move || {
        let _ = go_tx.send(());
    }));
    Ok(json!({
        "execId": exec_id,
        "pid": pid,
        "launchMs": started.elapsed().as_millis() as u64,
    }))
}

fn forget_exec(state: &State, conn: &Conn, box_name: &str, exec_id: u64) {
    if state
        .execs
        .lock()
        .expect("execs lock")
        .remove(&exec_id)
        .is_some()
    {
        conn.execs.send_modify(|n| *n = n.saturating_sub(1));
    }
    if let Ok(entry) = state.boxes.lock().expect("boxes lock").get_mut(box_name) {
        entry.execs.remove(&exec_id);
    }
}

/// The host token never enters a sandbox, whichever way a client tries to pass it.
fn refuse_host_token(
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

fn denied(message: impl Into<String>) -> RpcError {
    RpcError::new(ErrorCode::Denied, message)
}

fn spawn_failed(e: &sandbox_exec::ExecError) -> RpcError {
    RpcError::new(ErrorCode::SpawnFailed, e.to_string())
        .with_data(json!({ "exitCode": e.exit_code() }))
}

/// Stops every command of a box and waits: for the requesting connection's own commands
/// until their `exit` events are queued (so they precede the reply), for the others until
/// their process groups are gone.
async fn stop_box(
    state: &Arc<State>,
    name: &str,
    force: bool,
    conn: Option<&Arc<Conn>>,
) -> Result<(), RpcError> {
    let id = {
        let mut boxes = state.boxes.lock().expect("boxes lock");
        let entry = boxes.get_mut(name)?;
        if entry.state == BoxState::Stopped {
            return Ok(());
        }
        entry.state = BoxState::Stopping;
        entry.id.clone()
    };
    announce(
        state,
        conn.map(|c| &**c),
        &id,
        name,
        BoxState::Stopping,
        None,
    )
    .await;
    let waits: Vec<(mpsc::Sender<Control>, watch::Receiver<Phase>, bool)> = {
        let execs = state.execs.lock().expect("execs lock");
        execs
            .values()
            .filter(|h| h.box_name == name)
            .map(|h| {
                let own = conn.is_some_and(|c| c.id == h.conn);
                (h.control.clone(), h.phase.clone(), own)
            })
            .collect()
    };
    let control = if force {
        Control::Signal(nix::sys::signal::Signal::SIGKILL)
    } else {
        Control::Terminate {
            grace: state.opts.kill_grace,
        }
    };
    for (tx, _, _) in &waits {
        let _ = tx.send(control).await;
    }
    for (_, mut phase, own) in waits {
        let want = if own { Phase::Reported } else { Phase::Ended };
        let _ = phase.wait_for(|p| *p >= want).await;
    }
    {
        let mut boxes = state.boxes.lock().expect("boxes lock");
        if let Ok(entry) = boxes.get_mut(name) {
            entry.state = BoxState::Stopped;
        }
    }
    announce(
        state,
        conn.map(|c| &**c),
        &id,
        name,
        BoxState::Stopped,
        None,
    )
    .await;
    Ok(())
}

async fn box_remove(
    state: &Arc<State>,
    conn: &Arc<Conn>,
    name: &str,
    force: bool,
) -> Result<Value, RpcError> {
    let busy = state
        .boxes
        .lock()
        .expect("boxes lock")
        .get(name)?
        .execs
        .len();
    if busy > 0 && !force {
        return Err(RpcError::new(
            ErrorCode::BoxBusy,
            format!("box {name:?} still runs {busy} command(s); box.stop it or pass force: true"),
        ));
    }
    stop_box(state, name, false, Some(conn)).await?;
    let entry = state.boxes.lock().expect("boxes lock").remove(name);
    let Some(entry) = entry else {
        return Err(RpcError::new(
            ErrorCode::NoSuchBox,
            format!("box {name:?} was removed meanwhile"),
        ));
    };
    state.tokens.revoke(&Scope::Box(name.to_string()));
    announce(state, Some(conn), &entry.id, name, BoxState::Removed, None).await;
    drop(entry); // removes its TMPDIR
    Ok(json!({ "ok": true }))
}

/// The connection's writer: the single consumer of its queue. Output is encoded here —
/// text as a JSON string, anything else as base64 — holding back an incomplete UTF-8
/// sequence at a chunk's end until the next chunk (or the exit) decides it.
async fn write_loop(mut wr: OwnedWriteHalf, mut rx: mpsc::Receiver<Outbound>) {
    let mut buf: Vec<u8> = Vec::with_capacity(256 * 1024);
    let mut enc = OutputEncoder::default();
    while let Some(item) = rx.recv().await {
        encode_item(item, &mut buf, &mut enc);
        // Batch whatever else is ready into one write.
        while buf.len() < (1 << 20) {
            match rx.try_recv() {
                Ok(item) => encode_item(item, &mut buf, &mut enc),
                Err(_) => break,
            }
        }
        if let Err(e) = wr.write_all(&buf).await {
            tracing::debug!(error = %e, "client went away");
            break;
        }
        buf.clear();
        if buf.capacity() > (4 << 20) {
            buf.shrink_to(256 * 1024);
        }
    }
}

fn encode_item(item: Outbound, buf: &mut Vec<u8>, enc: &mut OutputEncoder) {
    match item {
        Outbound::Frame(frame) => {
            buf.extend_from_slice(&frame);
            buf.push(b'\n');
        }
        Outbound::Output {
            exec_id,
            stream,
            data,
        } => enc.output(buf, exec_id, stream.as_str(), &data),
        Outbound::Exit(exit) => {
            enc.finish(buf, exit.exec_id);
            buf.extend_from_slice(&encode_event("exit", &exit));
            buf.push(b'\n');
        }
    }
}
