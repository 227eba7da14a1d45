//! One command's event loop: it owns a started command (a child of the spawner thread, or a
//! command launched in a VM box's guest) until it ended, forwards its output, obeys
//! `exec.kill` and `box.stop`, and builds its `exit` event.
//!
//! Order is the point: every `output` event is queued before the `exit` event, on the same
//! queue, by this one task.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;
use tokio::process::ChildStdin;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use sandbox_exec::process_group::signal_group;
use sandbox_exec::{ExecError, ExitOutcome, Running};
use sandbox_host::seam::GuestExit;
use sandbox_host::{Live, Run};
use sandbox_protocol::{
    ErrorCode, ExitEvent, GitObjectRejected, GitRefApplied, GitRefRefused, GitStoreReport,
    NetConnection, RpcError,
};

use super::spawner::{reap_orphans_if_idle, recheck_when_idle};
use super::state::{Control, ExecEnd, Outbound, Phase, StdinMsg};

/// Everything an exec task needs besides the process.
pub(super) struct ExecCtx {
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

/// A started command, as the run seam gave it: a child of this process (spawned on the
/// spawner thread), or a command of a VM box launched in its guest.
pub(super) enum Started {
    Host(Box<Running>),
    Guest(sandbox_host::seam::GuestProcess),
}

/// How the wait for a command ended.
enum Waited {
    Host(Result<ExitOutcome, ExecError>),
    /// The guest's end, and (until the command is finished) what the host took back of its
    /// box's git writes.
    Guest(GuestExit, Option<sandbox_host::seam::GuestGit>),
}

/// The event loop of one command: owns it until it ended (its group is gone, or its guest
/// reported its end) and its `exit` event is queued. A host command's loop runs on the
/// spawner thread; a guest's anywhere.
///
/// Order is the point: every `output` event is queued before the `exit` event, on the same
/// queue, by this one task.
pub(super) async fn run_exec(started: Started, live: Live, run: Arc<Run>, mut ctx: ExecCtx) {
    let in_guest = matches!(started, Started::Guest(_));
    // A host command's handle outlives its wait: its output pumps are its, and must run until
    // the output is drained.
    let (mut host, mut output, target, guest_exit) = match started {
        Started::Host(mut running) => {
            let output = running.take_output();
            if let (Some(stdin), Some(rx)) = (running.take_stdin(), ctx.stdin.take()) {
                tokio::spawn(write_stdin(stdin, rx));
            }
            let pgid = running.pgid();
            (Some(running), output, Target::Group(pgid), None)
        }
        Started::Guest(process) => {
            if let (Some(stdin), Some(rx)) = (process.stdin, ctx.stdin.take()) {
                tokio::spawn(write_guest_stdin(stdin, rx));
            }
            (
                None,
                Some(process.output),
                Target::Guest(process.signals),
                Some(process.exit),
            )
        }
    };
    let wait: Pin<Box<dyn Future<Output = Waited> + Send + '_>> = match (&mut host, guest_exit) {
        (Some(running), _) => Box::pin(async move { Waited::Host(running.wait().await) }),
        (None, Some(exit)) => Box::pin(async move {
            let end = exit.await;
            Waited::Guest(end.exit, end.git)
        }),
        (None, None) => Box::pin(std::future::pending()),
    };
    let out = ctx.out.clone();
    let mut st = LoopState {
        target,
        kill_at: None,
        control_open: true,
        conn_gone: false,
    };
    let mut out_open = output.is_some();
    let mut waited: Option<Waited> = None;
    let mut drain_until: Option<Instant> = None;
    let mut cut_short = false;
    {
        let mut wait = wait;
        while waited.is_none() || out_open {
            let alive = waited.is_none();
            tokio::select! {
                biased;
                ctl = ctx.control.recv(), if alive && st.control_open => st.control(ctl),
                _ = sleep_until(st.kill_at), if alive && st.kill_at.is_some() => st.kill_now(),
                _ = out.closed(), if alive && !st.conn_gone => st.gone(),
                res = &mut wait, if alive => {
                    waited = Some(res);
                    // A guest's relay has queued all of its output before its end is known;
                    // a host command's descendant may still hold the pipe.
                    drain_until = (!in_guest).then(|| Instant::now() + ctx.drain);
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
        drop(wait);
    }
    drop(output);
    // The group is gone (`wait` saw to it).
    drop(host);
    // The loop ends only once the outcome is known.
    let mut waited = waited.unwrap_or_else(|| {
        Waited::Host(Err(ExecError::Io {
            context: "waiting for the command".into(),
            source: std::io::Error::other("its output ended before its exit was seen"),
        }))
    });
    let finished = match &mut waited {
        // Orphans that left the group are killed before the seam finishes the command, so
        // none can rewrite a git pointer after the check.
        Waited::Host(outcome) => {
            live.finish(outcome.as_ref().ok().copied(), reap_orphans_if_idle())
        }
        // Nothing of a guest's command runs on this host.
        Waited::Guest(exit, git) => live.finish_guest(exit, git.take()),
    };
    // The box's run (its TMPDIR) is let go only after its command is finished.
    drop(run);
    if let Some(git) = finished.recheck.clone() {
        // Other commands still run, and an orphan of this one cannot be told from theirs:
        // check this layout again once the daemon is idle and every orphan is gone.
        recheck_when_idle(git);
    }
    let exit = exit_event(ctx.exec_id, &waited, cut_short, &finished);
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

/// What `exec.kill`, `box.stop` and a gone connection signal.
enum Target {
    /// A host command's process group.
    Group(Pid),
    /// A guest's command, through its backend.
    Guest(mpsc::UnboundedSender<i32>),
}

impl Target {
    fn signal(&self, sig: Signal) {
        match self {
            Target::Group(pgid) => {
                signal_group(*pgid, Signal::SIGCONT);
                signal_group(*pgid, sig);
            }
            Target::Guest(tx) => {
                let _ = tx.send(sig as i32);
            }
        }
    }

    fn kill(&self) {
        match self {
            Target::Group(pgid) => signal_group(*pgid, Signal::SIGKILL),
            Target::Guest(tx) => {
                let _ = tx.send(libc::SIGKILL);
            }
        }
    }
}

struct LoopState {
    target: Target,
    kill_at: Option<Instant>,
    control_open: bool,
    conn_gone: bool,
}

impl LoopState {
    fn control(&mut self, ctl: Option<Control>) {
        match ctl {
            Some(Control::Signal(sig)) => self.target.signal(sig),
            Some(Control::Terminate { grace }) => {
                self.target.signal(Signal::SIGTERM);
                let at = Instant::now() + grace;
                self.kill_at = Some(self.kill_at.map_or(at, |k| k.min(at)));
            }
            None => self.control_open = false,
        }
    }

    fn kill_now(&mut self) {
        self.target.kill();
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

/// Writes `exec.stdin` data to a guest's command in arrival order, each answered when it
/// reached the guest (or failed).
async fn write_guest_stdin(
    stdin: mpsc::Sender<sandbox_host::seam::GuestInput>,
    mut rx: mpsc::Receiver<StdinMsg>,
) {
    while let Some(StdinMsg { data, close, reply }) = rx.recv().await {
        let (tx, written) = oneshot::channel();
        let input = sandbox_host::seam::GuestInput {
            data,
            close,
            reply: tx,
        };
        let res = match stdin.send(input).await {
            Ok(()) => written
                .await
                .unwrap_or_else(|_| Err(std::io::Error::other("the command's stdin is gone"))),
            Err(_) => Err(std::io::Error::other("the command's stdin is gone")),
        };
        let _ = reply.send(res.map_err(|e| stdin_closed_by(&e)));
        if close {
            break;
        }
    }
}

/// A guest's stdin write failed.
fn stdin_closed_by(e: &std::io::Error) -> RpcError {
    RpcError::new(ErrorCode::StdinClosed, format!("stdin: {e}"))
}

fn stdin_closed(why: &str) -> RpcError {
    RpcError::new(ErrorCode::StdinClosed, format!("stdin: {why}"))
}

/// The one builder of every `exit` event, a host command's and a VM box's alike: the code,
/// signal and timeout flag from the one exit outcome the seam judged, through the one exit
/// rule ([`sandbox_host::Outcome::status`]: 125 when the backend failed before the command
/// started or its guest lost it), with every note a `sandbox run` would print on stderr
/// joined into `errorMessage`.
fn exit_event(
    exec_id: u64,
    waited: &Waited,
    cut_short: bool,
    finished: &sandbox_host::Finished,
) -> ExitEvent {
    let mut notes: Vec<String> = Vec::new();
    if let Some(e) = finished.setup_error() {
        notes.push(e.to_string());
    }
    match waited {
        Waited::Host(Ok(ExitOutcome::TimedOut(after))) => notes.push(format!(
            "timed out after {} ms; its process group was killed",
            after.as_millis()
        )),
        Waited::Host(Err(e)) => notes.push(e.to_string()),
        Waited::Host(Ok(_)) | Waited::Guest(..) => {}
    }
    // What the guest said of the end (its agent's message, or its timeout's).
    if let Some(sandbox_host::seam::GuestNote(Some(note))) = &finished.guest {
        notes.push(note.clone());
    }
    if cut_short {
        notes.push(
            "output was cut short: a descendant that left the command's process group kept \
             the pipe open"
                .into(),
        );
    }
    notes.extend(finished.warnings());
    let git_store = match &finished.git_store {
        Some(Ok(report)) => Some(git_store_report(report)),
        _ => None,
    };
    let outcome = match waited {
        Waited::Host(waited) => finished.outcome(waited.as_ref().copied()),
        Waited::Guest(GuestExit::Ended { outcome, .. }, _) => finished.outcome(Ok(*outcome)),
        Waited::Guest(GuestExit::Lost(_), _) => sandbox_host::Outcome::SetupFailed,
    };
    let status = outcome.status();
    ExitEvent {
        exec_id,
        exit_code: status.code,
        signal: status.signal,
        timed_out: status.timed_out,
        error_message: (!notes.is_empty()).then(|| notes.join("; ")),
        git_store,
        connections: finished.connections.iter().map(net_connection).collect(),
    }
}

/// The git store quarantine's account of a command, as its `exit` event carries it.
fn git_store_report(report: &sandbox_git::quarantine::StoreReport) -> GitStoreReport {
    GitStoreReport {
        objects_imported: report.objects_imported,
        applied: report
            .applied
            .iter()
            .map(|r| GitRefApplied {
                name: r.name.clone(),
                old: r.old.clone(),
                new: r.new.clone(),
            })
            .collect(),
        refused: report
            .refused
            .iter()
            .map(|r| GitRefRefused {
                name: r.name.clone(),
                wanted: r.wanted.clone(),
                reason: r.reason.clone(),
            })
            .collect(),
        rejected_objects: report
            .rejected_objects
            .iter()
            .map(|o| GitObjectRejected {
                path: o.path.clone(),
                reason: o.reason.clone(),
            })
            .collect(),
    }
}

/// One connection through the run's proxy, as its `exit` event carries it (the words of
/// `--report-json`'s).
fn net_connection(c: &sandbox_net::Connection) -> NetConnection {
    use sandbox_net::Kind;
    NetConnection {
        host: c.host.clone(),
        port: c.port,
        kind: match c.kind {
            Kind::Connect => "connect",
            Kind::Http => "http",
            Kind::Socks => "socks",
            Kind::Credential => "credential",
            Kind::Inbound => "inbound",
        }
        .to_string(),
        allowed: c.allowed,
        rule: c.rule.clone(),
        address: c.address.map(|a| a.to_string()),
        bytes_up: c.bytes_up,
        bytes_down: c.bytes_down,
        error: c.error.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_git::quarantine::{AppliedRef, RefusedRef, RejectedObject, StoreReport};

    /// The typed conversions give the `exit` event the fields the JSON round trip they
    /// replace gave: the same names and values, camelCase on both sides.
    #[test]
    fn the_exit_events_reports_are_what_the_run_reported() {
        let report = StoreReport {
            task_branch: Some("task".into()),
            objects_imported: 3,
            applied: vec![AppliedRef {
                name: "refs/heads/task".into(),
                old: None,
                new: Some("abc".into()),
            }],
            refused: vec![RefusedRef {
                name: "refs/heads/main".into(),
                wanted: Some("def".into()),
                reason: "not the task's".into(),
            }],
            rejected_objects: vec![RejectedObject {
                path: "objects/ab/cd".into(),
                reason: "corrupt".into(),
            }],
            ..StoreReport::default()
        };
        let before: GitStoreReport =
            serde_json::from_value(serde_json::to_value(&report).unwrap()).unwrap();
        assert_eq!(git_store_report(&report), before);
        for (kind, address) in [
            (sandbox_net::Kind::Connect, Some("1.2.3.4".parse().unwrap())),
            (sandbox_net::Kind::Http, None),
            (sandbox_net::Kind::Socks, Some("::1".parse().unwrap())),
            (sandbox_net::Kind::Credential, None),
            (sandbox_net::Kind::Inbound, None),
        ] {
            let c = sandbox_net::Connection {
                host: "a.test".into(),
                port: 443,
                kind,
                allowed: true,
                rule: "a.test".into(),
                address,
                bytes_up: 1,
                bytes_down: 2,
                error: Some("reset".into()),
            };
            let before: NetConnection =
                serde_json::from_value(serde_json::to_value(&c).unwrap()).unwrap();
            assert_eq!(net_connection(&c), before, "{kind:?}");
        }
    }
}
