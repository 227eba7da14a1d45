//! Running commands for the daemon: one dedicated thread spawns every command and owns it
//! until its process group is gone.
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
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;
use tokio::process::ChildStdin;
use tokio::sync::mpsc::OwnedPermit;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use sandbox_exec::process_group::signal_group;
use sandbox_exec::{ExecError, ExitOutcome, Running};
use sandbox_host::{Live, Reaped, Reaper, Run};

use sandbox_protocol::{ErrorCode, ExitEvent, RpcError};

use super::connection::Outbound;

/// How far an exec has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Running,
    /// The command and its process group are gone.
    Ended,
    /// Its `exit` event is in the connection's queue (or the connection is gone), and the
    /// daemon has forgotten it: both happen in one step (see [`ExecEnd`]).
    Reported,
}

/// The end of an exec, handed back to the daemon to publish.
pub struct ExecEnd {
    pub exit: ExitEvent,
    /// Room for `exit` in the connection's queue, reserved before any lock is taken; `None`
    /// when the connection is gone (nobody to tell).
    pub permit: Option<OwnedPermit<Outbound>>,
    /// To be set to [`Phase::Reported`] in the same step that queues `exit`.
    pub phase: watch::Sender<Phase>,
}

/// Requests from `exec.kill` / `box.stop`.
#[derive(Debug, Clone, Copy)]
pub enum Control {
    Signal(Signal),
    /// SIGTERM now, SIGKILL after `grace` if the command is still there.
    Terminate {
        grace: Duration,
    },
}

/// One `exec.stdin` write, answered when it reached the pipe.
pub struct StdinMsg {
    pub data: Vec<u8>,
    pub close: bool,
    pub reply: oneshot::Sender<Result<(), RpcError>>,
}

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
fn reap_orphans_if_idle() -> Reaped {
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

/// Everything an exec task needs besides the process.
pub struct ExecCtx {
    pub exec_id: u64,
    pub out: mpsc::Sender<Outbound>,
    pub control: mpsc::Receiver<Control>,
    pub stdin: Option<mpsc::Receiver<StdinMsg>>,
    pub phase: watch::Sender<Phase>,
    /// How long output is still forwarded after the command exited.
    pub drain: Duration,
    /// Publishes the exec's end: queues its `exit` and forgets it, in one step. `None` when
    /// the command could not be started (its error is the `box.exec` reply instead).
    pub done: Box<dyn FnOnce(Option<ExecEnd>) + Send>,
}

/// Owns one command until its group is gone and its `exit` event is queued. Runs on the
/// spawner thread.
///
/// Order is the point: every `output` event is queued before the `exit` event, on the same
/// queue, by this one task.
pub async fn run_exec(mut running: Running, live: Live, run: Arc<Run>, mut ctx: ExecCtx) {
    let pgid = running.pgid();
    let mut output = running.take_output();
    if let (Some(stdin), Some(rx)) = (running.take_stdin(), ctx.stdin.take()) {
        tokio::spawn(write_stdin(stdin, rx));
    }
    let out = ctx.out.clone();
    let mut st = LoopState {
        pgid,
        kill_at: None,
        control_open: true,
        conn_gone: false,
    };
    let mut out_open = output.is_some();
    let mut outcome: Option<Result<ExitOutcome, ExecError>> = None;
    let mut drain_until: Option<Instant> = None;
    let mut cut_short = false;
    {
        let wait = running.wait();
        tokio::pin!(wait);
        while outcome.is_none() || out_open {
            let alive = outcome.is_none();
            tokio::select! {
                biased;
                ctl = ctx.control.recv(), if alive && st.control_open => st.control(ctl),
                _ = sleep_until(st.kill_at), if alive && st.kill_at.is_some() => st.kill_now(),
                _ = out.closed(), if alive && !st.conn_gone => st.gone(),
                res = &mut wait, if alive => {
                    outcome = Some(res);
                    drain_until = Some(Instant::now() + ctx.drain);
                }
                chunk = recv(&mut output), if out_open => match chunk {
                    Some(chunk) if !st.conn_gone => {
                        let item = Outbound::Output {
                            exec_id: ctx.exec_id,
                            stream: chunk.stream,
                            data: chunk.data,
                        };
                        // Wait for room in the client's queue (backpressure down to the
                        // command's pipe), but keep obeying kill requests meanwhile. The
                        // leader cannot be reaped while `wait` is not polled, so its process
                        // group id cannot be reused under a signal sent here.
                        let send = out.send(item);
                        tokio::pin!(send);
                        loop {
                            tokio::select! {
                                biased;
                                sent = &mut send => {
                                    if sent.is_err() { st.gone_if(alive) }
                                    break;
                                }
                                ctl = ctx.control.recv(), if alive && st.control_open => st.control(ctl),
                                _ = sleep_until(st.kill_at), if alive && st.kill_at.is_some() => st.kill_now(),
                            }
                        }
                    }
                    Some(_) => {}
                    None => out_open = false,
                },
                _ = sleep_until(drain_until), if drain_until.is_some() => {
                    // A descendant that escaped the group still holds the pipe open.
                    cut_short = true;
                    out_open = false;
                }
            }
        }
    }
    drop(output);
    // The loop ends only once the outcome is known.
    let outcome = outcome.unwrap_or_else(|| {
        Err(ExecError::Io {
            context: "waiting for the command".into(),
            source: std::io::Error::other("its output ended before its exit was seen"),
        })
    });
    // The group is gone (`wait` saw to it); orphans that left it are killed before the seam
    // finishes the command, so none can rewrite a git pointer after the check.
    drop(running);
    let finished = live.finish(outcome.as_ref().ok().copied(), reap_orphans_if_idle());
    // The box's run (its TMPDIR) is let go only after its command is finished.
    drop(run);
    if let Some(git) = finished.recheck.clone() {
        // Other commands still run, and an orphan of this one cannot be told from theirs:
        // check this layout again once the daemon is idle and every orphan is gone.
        RECHECK.with(|r| r.borrow_mut().push(git));
    }
    let exit = exit_event(ctx.exec_id, outcome, cut_short, &finished);
    if let Some(message) = &exit.error_message {
        tracing::info!(exec_id = ctx.exec_id, "{message}");
    }
    let _ = ctx.phase.send(Phase::Ended);
    // Wait for room for the `exit` event here, holding no lock; the daemon then queues it and
    // forgets the exec in one step: a request served after the `exit` is queued never finds
    // the exec, and on this connection a reply that shows it gone always follows its `exit`.
    let permit = if st.conn_gone {
        None
    } else {
        out.reserve_owned().await.ok()
    };
    (ctx.done)(Some(ExecEnd {
        exit,
        permit,
        phase: ctx.phase,
    }));
}

struct LoopState {
    pgid: Pid,
    kill_at: Option<Instant>,
    control_open: bool,
    conn_gone: bool,
}

impl LoopState {
    fn control(&mut self, ctl: Option<Control>) {
        match ctl {
            Some(Control::Signal(sig)) => {
                signal_group(self.pgid, Signal::SIGCONT);
                signal_group(self.pgid, sig);
            }
            Some(Control::Terminate { grace }) => {
                signal_group(self.pgid, Signal::SIGCONT);
                signal_group(self.pgid, Signal::SIGTERM);
                let at = Instant::now() + grace;
                self.kill_at = Some(self.kill_at.map_or(at, |k| k.min(at)));
            }
            None => self.control_open = false,
        }
    }

    fn kill_now(&mut self) {
        signal_group(self.pgid, Signal::SIGKILL);
        self.kill_at = None;
    }

    /// The connection that started the command is gone: nobody can read its output or stop
    /// it any more, so it ends now.
    fn gone(&mut self) {
        self.conn_gone = true;
        self.kill_now();
    }

    fn gone_if(&mut self, alive: bool) {
        if alive {
            self.gone();
        } else {
            self.conn_gone = true;
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn recv(rx: &mut Option<sandbox_exec::OutputReceiver>) -> Option<sandbox_exec::OutputChunk> {
    match rx {
        Some(rx) => rx.recv().await,
        None => None,
    }
}

/// Writes `exec.stdin` data in arrival order; each write is answered when it reached the
/// pipe (or failed).
async fn write_stdin(mut stdin: ChildStdin, mut rx: mpsc::Receiver<StdinMsg>) {
    let mut open = true;
    while let Some(msg) = rx.recv().await {
        if !open {
            let _ = msg.reply.send(Err(stdin_closed("it was closed earlier")));
            continue;
        }
        let mut res = Ok(());
        if !msg.data.is_empty() {
            res = stdin.write_all(&msg.data).await;
            if res.is_ok() {
                res = stdin.flush().await;
            }
        }
        match res {
            Ok(()) if msg.close => {
                let _ = stdin.shutdown().await;
                let _ = msg.reply.send(Ok(()));
                break;
            }
            Ok(()) => {
                let _ = msg.reply.send(Ok(()));
            }
            Err(e) => {
                open = false;
                let _ = msg.reply.send(Err(stdin_closed(&format!(
                    "the command no longer reads it ({e})"
                ))));
            }
        }
    }
    // Dropping `stdin` closes the pipe; later writers get `stdinClosed` from the sender side.
    drop(stdin);
    rx.close();
    while let Some(msg) = rx.recv().await {
        let _ = msg.reply.send(Err(stdin_closed("it was closed")));
    }
}

fn stdin_closed(why: &str) -> RpcError {
    RpcError::new(ErrorCode::StdinClosed, format!("stdin: {why}"))
}

/// The `exit` event: the command's outcome as the seam judged it, through the one exit rule
/// ([`sandbox_host::Outcome::status`]: 125 when the backend failed before the command
/// started), with every note a `sandbox run` would print on stderr.
fn exit_event(
    exec_id: u64,
    outcome: Result<ExitOutcome, ExecError>,
    cut_short: bool,
    finished: &sandbox_host::Finished,
) -> ExitEvent {
    let mut notes: Vec<String> = Vec::new();
    if let Some(e) = finished.setup_error() {
        notes.push(e.to_string());
    }
    match &outcome {
        Ok(ExitOutcome::TimedOut(after)) => notes.push(format!(
            "timed out after {} ms; its process group was killed",
            after.as_millis()
        )),
        Err(e) => notes.push(e.to_string()),
        Ok(_) => {}
    }
    if cut_short {
        notes.push(
            "output was cut short: a descendant that left the command's process group kept \
             the pipe open"
                .into(),
        );
    }
    notes.extend(finished.warnings());
    // The same fields, camelCase on both sides.
    let git_store = match &finished.git_store {
        Some(Ok(report)) => serde_json::to_value(report)
            .and_then(serde_json::from_value)
            .ok(),
        _ => None,
    };
    let mut event = exit_event_of(
        exec_id,
        finished.outcome(outcome.as_ref().copied()),
        notes,
        git_store,
    );
    // The same fields, camelCase on both sides.
    event.connections = finished
        .connections
        .iter()
        .filter_map(|c| {
            serde_json::to_value(c)
                .and_then(serde_json::from_value)
                .ok()
        })
        .collect();
    event
}

/// The one builder of every `exit` event, a host command's and a VM box's alike: the code,
/// signal and timeout flag from the one exit rule ([`sandbox_host::Outcome::status`]), the
/// notes joined into `errorMessage`.
pub(super) fn exit_event_of(
    exec_id: u64,
    outcome: sandbox_host::Outcome,
    notes: Vec<String>,
    git_store: Option<sandbox_protocol::GitStoreReport>,
) -> ExitEvent {
    let status = outcome.status();
    ExitEvent {
        exec_id,
        exit_code: status.code,
        signal: status.signal,
        timed_out: status.timed_out,
        error_message: (!notes.is_empty()).then(|| notes.join("; ")),
        git_store,
        connections: Vec::new(),
    }
}
