//! The exec methods: `box.exec` checks and starts a command in a box, `exec.stdin` and
//! `exec.kill` reach a running one, and an exec that ends is reported and forgotten here, in
//! one step ([`forget_exec`]).

use crate::locks::Locked as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use sandbox_exec::{
    CommandPolicy, ExecError, OutputLimits, OutputMode, SpawnOptions, StdinMode, WorkspaceGuard,
};
use sandbox_host::assembly::CommandIdentity;
use sandbox_host::run::NotStarted;
use sandbox_host::{HostError, Invocation, Run};
use sandbox_protocol::{
    self as protocol, BoxExecParams, BoxState, ErrorCode, ExecKillParams, RpcError, SignalArg,
};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, watch};

use super::command::{self, ExecCtx, Started};
use super::spawner;
use super::state::{
    denied, invalid, refuse_host_token, unavailable, After, Conn, Control, ExecEnd, ExecHandle,
    Outbound, Phase, State, StdinMsg,
};
use crate::registry::BoxEntry;

/// `exec.stdin` writes one exec may have queued before further ones get `stdinBusy`.
const STDIN_QUEUE: usize = 16;
/// After the command exits, output is still forwarded this long (a descendant may hold the
/// pipe; it is killed with the group, but one that left the group could keep it open).
const DRAIN: Duration = Duration::from_millis(500);

/// `box.exec`: one command armed in the box's run (prepared once at `box.create`), started
/// — spawned on the spawner thread, or launched in a VM box's guest — and handed to its event
/// loop ([`command::run_exec`]), which reports its output and its `exit`. In three steps:
/// [`arm`] (checked and armed; a guest's command already launched), [`register`], then
/// [`spawn_on_host`] for a host command.
pub(super) async fn box_exec(
    state: &Arc<State>,
    conn: &Arc<Conn>,
    p: BoxExecParams,
    after: &mut After,
) -> Result<Value, RpcError> {
    let started = Instant::now();
    let Armed { box_id, run, start } = arm(state, &p).await?;
    let ctx = match register(state, conn, &p.name, &box_id, p.stdin) {
        Ok(ctx) => ctx,
        Err(e) => {
            // A guest's command already runs in its box: nobody will see it, so it ends now.
            if let Start::Guest(process, _) = &start {
                let _ = process.signals.send(libc::SIGKILL);
            }
            return Err(e);
        }
    };
    let exec_id = ctx.exec_id;
    // The reply carrying the execId goes out before any of the command's events.
    let (go_tx, go_rx) = oneshot::channel::<()>();
    let reply = match start {
        Start::Host(armed, guard) => {
            let pid = spawn_on_host(state, conn, &p, (armed, guard), run, ctx, go_rx).await?;
            json!({
                "execId": exec_id,
                "pid": pid,
                "launchMs": started.elapsed().as_millis() as u64,
            })
        }
        Start::Guest(process, live) => {
            let launch_ms = started.elapsed().as_millis() as u64;
            #[cfg(feature = "boxlite")]
            super::microvm::first_exec(state, conn, &box_id, &p.name, started).await;
            // Not on the spawner thread: nothing of it is a child of this process.
            tokio::spawn(async move {
                let _ = go_rx.await;
                command::run_exec(Started::Guest(process), live, run, ctx).await;
            });
            json!({ "execId": exec_id, "launchMs": launch_ms })
        }
    };
    *after = Some(Box::new(move || {
        let _ = go_tx.send(());
    }));
    Ok(reply)
}

/// A `box.exec` command checked and armed in its box's run, not yet registered.
struct Armed {
    box_id: String,
    run: Arc<Run>,
    start: Start,
}

/// Checks a `box.exec` request against its box (running, its working directory, no host
/// token) and arms the command in the box's run. A host command is admitted by the box's
/// guard; a guest's command is launched in its box now, registered before its events flow.
async fn arm(state: &State, p: &BoxExecParams) -> Result<Armed, RpcError> {
    if p.interactive {
        return Err(invalid(
            "box.exec: interactive (pty) execs are not offered by this daemon; use `sandbox \
             shell` for an interactive shell",
        ));
    }
    let (box_id, token, run) = {
        let boxes = state.boxes.locked();
        let entry = boxes.get(&p.name)?;
        running(entry)?;
        (entry.id.clone(), entry.token.clone(), entry.run.clone())
    };
    let policy = run.policy();
    let in_guest = run.runs_in_guest();

    // On this host the working directory must resolve (symlinks and `..` on the real
    // filesystem) inside the workspace or a granted path. In a guest it is a path of the
    // guest's: relative to the workdir, which is mounted at its own path.
    let (cwd, guard) = if in_guest {
        let root = &policy.workspace.root;
        let cwd = match &p.working_dir {
            Some(d) if d.is_absolute() => d.clone(),
            Some(d) => root.join(d),
            None => root.clone(),
        };
        (cwd, None)
    } else {
        let guard = sandbox_host::assembly::admission_guard(policy)
            .map_err(|e| denied(e.to_string()))?
            .check_args(false);
        let cwd = match &p.working_dir {
            Some(dir) => guard
                .check_path(&policy.workspace.cwd, dir)
                .map_err(|e| denied(e.to_string()))?,
            None => policy.workspace.cwd.clone(),
        };
        (cwd, Some(guard))
    };
    let argv = std::iter::once(p.command.clone())
        .chain(p.args.iter().cloned())
        .map(Into::into)
        .collect();
    refuse_host_token(state, &p.env)?;
    let extra: Vec<(String, String)> = p.env.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
    // Armed in the box's run, with the one environment assembly `sandbox run` uses too (a
    // guest's command gets its own variables only).
    let armed = run
        .arm(Invocation {
            argv,
            cwd: Some(cwd),
            who: &CommandIdentity {
                task: p.name.clone(),
                box_name: Some(p.name.clone()),
                hook: Some((state.hook_url(), token)),
            },
            extra_env: &extra,
            timeout: p.timeout_ms.map(Duration::from_millis),
        })
        .map_err(|e| match e {
            HostError::Command(e @ ExecError::InvalidRequest(_)) => {
                invalid(format!("box.exec: {e}"))
            }
            HostError::Command(e) => spawn_failed(&e),
            e @ HostError::Env { .. } => invalid(e.to_string()),
            other => unavailable(other.to_string()),
        })?;
    let start = match guard {
        Some(guard) => {
            guard
                .admit(armed.spec())
                .map_err(|e| denied(e.to_string()))?;
            Start::Host(armed, guard)
        }
        None => {
            let (process, live) = armed
                .launch(p.stdin)
                .await
                .map_err(|e| launch_failed(&p.name, &e))?;
            Start::Guest(process, live)
        }
    };
    Ok(Armed { box_id, run, start })
}

/// Registers a new exec of box `name` (of id `box_id`) for `conn`: its channels, in the box
/// and in the exec table in one step, as [`forget_exec`] undoes it. Done before the command
/// starts, so that its end (which unregisters it) can never come first. The box is checked
/// again under the lock: a `box.stop` that set it stopping while this command was being
/// prepared has already listed the commands it waits for, and a box removed and created anew
/// under the name has another policy.
fn register(
    state: &Arc<State>,
    conn: &Arc<Conn>,
    name: &str,
    box_id: &str,
    stdin: bool,
) -> Result<ExecCtx, RpcError> {
    let exec_id = state.next_id();
    let (control_tx, control_rx) = mpsc::channel(8);
    let (stdin_tx, stdin_rx) = if stdin {
        let (tx, rx) = mpsc::channel(STDIN_QUEUE);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let (phase_tx, phase_rx) = watch::channel(Phase::Running);
    {
        let mut boxes = state.boxes.locked();
        let mut execs = state.execs.locked();
        let entry = boxes.get_mut(name)?;
        if entry.id != box_id {
            return Err(RpcError::new(
                ErrorCode::NoSuchBox,
                format!("box {name:?} was removed meanwhile"),
            ));
        }
        running(entry)?;
        entry.execs.insert(exec_id);
        execs.insert(
            exec_id,
            ExecHandle {
                box_name: name.to_string(),
                conn: conn.id,
                control: control_tx,
                stdin: stdin_tx,
                phase: phase_rx,
            },
        );
        conn.execs.send_modify(|n| *n += 1);
    }
    let done: Box<dyn FnOnce(Option<ExecEnd>) + Send> = {
        let state = state.clone();
        let conn = conn.clone();
        let box_name = name.to_string();
        Box::new(move |finished| forget_exec(&state, &conn, &box_name, exec_id, finished))
    };
    Ok(ExecCtx {
        exec_id,
        out: conn.out.clone(),
        control: control_rx,
        stdin: stdin_rx,
        phase: phase_tx,
        drain: DRAIN,
        done,
    })
}

/// Spawns a registered host command on the spawner thread, where its event loop then runs
/// once `go` fires: its pid, or why it did not start (it is forgotten then).
async fn spawn_on_host(
    state: &State,
    conn: &Conn,
    p: &BoxExecParams,
    (armed, guard): (sandbox_host::Armed, WorkspaceGuard),
    run: Arc<Run>,
    ctx: ExecCtx,
    go: oneshot::Receiver<()>,
) -> Result<i32, RpcError> {
    let exec_id = ctx.exec_id;
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
        // The run's cgroups and process rlimit, like the child setup, are attached by
        // `PreparedCommand::spawn`.
        cgroups: None,
        process_rlimit: None,
    };
    let spawned = state
        .executor
        .run(move || match armed.spawn(options) {
            Ok((running, live)) => {
                let pid = running.pid().as_raw();
                spawner::note_started();
                tokio::spawn(async move {
                    // The reply carrying the execId goes out before any of its events.
                    let _ = go.await;
                    // The live command (nono's manifest and start marker; the box's run and
                    // its TMPDIR) lives until it is finished, after every process of it is
                    // gone.
                    command::run_exec(Started::Host(Box::new(running)), live, run, ctx).await;
                });
                Ok(pid)
            }
            Err(NotStarted { error, finished }) => {
                (ctx.done)(None);
                // Nothing started; the seam has released what it prepared.
                drop(finished);
                Err(error)
            }
        })
        .await;
    match spawned {
        Ok(Ok(pid)) => Ok(pid),
        Ok(Err(e)) => Err(spawn_failed(&e)),
        Err(e) => {
            forget_exec(state, conn, &p.name, exec_id, None);
            Err(e)
        }
    }
}

/// How a checked command is started: spawned here with its guard, or launched in a guest.
enum Start {
    Host(sandbox_host::Armed, WorkspaceGuard),
    Guest(sandbox_host::seam::GuestProcess, sandbox_host::Live),
}

/// A guest that could not start a command: the backend's own error (BoxLite's, with its log
/// paths) when it gave one.
fn launch_failed(name: &str, e: &HostError) -> RpcError {
    #[cfg(feature = "boxlite")]
    if let Some(e) = e
        .backend_source()
        .and_then(|s| s.downcast_ref::<sandbox_boxlite::BoxliteError>())
    {
        return super::microvm::engine_error(e);
    }
    unavailable(format!("box {name}: {e}"))
}

/// Only a running box takes commands.
fn running(entry: &BoxEntry) -> Result<(), RpcError> {
    if entry.state == BoxState::Running {
        return Ok(());
    }
    Err(RpcError::new(
        ErrorCode::BoxState,
        format!(
            "box {:?} is {}; box.start it first",
            entry.name,
            entry.state.as_str()
        ),
    ))
}

/// Forgets an exec: takes it out of its box and the exec table and off its connection's
/// count. For an exec that ran, `finished` also queues its `exit` event (into room reserved
/// beforehand, so nothing waits here) and marks it [`Phase::Reported`].
///
/// All of it happens under the registry and exec-table locks, which is the ordering guarantee
/// of `docs/protocol.md`: once an exec's `exit` is queued, every request served afterwards, on
/// any connection, finds the exec gone — `box.list`'s `runningExecs`, `box.remove`'s busy
/// check, `box.stop`, `exec.kill` and `exec.stdin` all read these two tables under their locks.
pub(super) fn forget_exec(
    state: &State,
    conn: &Conn,
    box_name: &str,
    exec_id: u64,
    finished: Option<ExecEnd>,
) {
    let mut boxes = state.boxes.locked();
    let mut execs = state.execs.locked();
    let phase = finished.map(
        |ExecEnd {
             exit,
             permit,
             phase,
         }| {
            if let Some(permit) = permit {
                permit.send(Outbound::Exit(exit));
            }
            phase
        },
    );
    if let Ok(entry) = boxes.get_mut(box_name) {
        entry.execs.remove(&exec_id);
    }
    if execs.remove(&exec_id).is_some() {
        conn.execs.send_modify(|n| *n = n.saturating_sub(1));
    }
    if let Some(phase) = phase {
        let _ = phase.send(Phase::Reported);
    }
}

pub(super) async fn exec_kill(state: &State, p: ExecKillParams) -> Result<Value, RpcError> {
    let control = match &p.signal {
        Some(sig) => Control::Signal(parse_signal(sig)?),
        None => Control::Terminate {
            grace: state.opts.kill_grace,
        },
    };
    let tx = {
        let execs = state.execs.locked();
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

pub(super) fn queue_stdin(
    state: &State,
    p: protocol::ExecStdinParams,
) -> Result<oneshot::Receiver<Result<(), RpcError>>, RpcError> {
    let data = protocol::decode_data(&p.data, p.encoding)?;
    let execs = state.execs.locked();
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

fn spawn_failed(e: &sandbox_exec::ExecError) -> RpcError {
    RpcError::new(ErrorCode::SpawnFailed, e.to_string())
        .with_data(json!({ "exitCode": e.exit_code() }))
}

/// Parses a signal given by number or name (`9`, `"KILL"`, `"SIGKILL"`).
fn parse_signal(arg: &SignalArg) -> Result<Signal, RpcError> {
    let bad = |what: String| {
        RpcError::new(
            ErrorCode::InvalidParams,
            format!("signal {what} is not a signal"),
        )
    };
    match arg {
        SignalArg::Num(n) => Signal::try_from(*n).map_err(|_| bad(n.to_string())),
        SignalArg::Name(name) => {
            let upper = name.to_ascii_uppercase();
            let full = if upper.starts_with("SIG") {
                upper
            } else {
                format!("SIG{upper}")
            };
            full.parse::<Signal>().map_err(|_| bad(format!("{name:?}")))
        }
    }
}
