//! The box methods: a box is created with a fixed policy, started, stopped (its commands
//! killed, their ends reported) and removed. The registry itself is `crate::registry`.

use crate::locks::Locked as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_host::assembly::{self, Defaults, Request as PolicyAsk, TmpdirRequest};
use sandbox_host::seam::{BackendKind, BackendOptions, Progress, Step};
use sandbox_host::{HostError, Run};
use sandbox_protocol::{
    encode_event, BoxCreateParams, BoxState, BoxStateEvent, ErrorCode, RpcError,
};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

use super::state::{
    announce, denied, invalid, refuse_host_token, unavailable, Conn, Control, Outbound, Phase,
    State,
};
use crate::registry::{self, BoxEntry, Registry};
use crate::token::Scope;

pub(super) async fn box_create(
    state: &Arc<State>,
    conn: &Arc<Conn>,
    mut p: BoxCreateParams,
) -> Result<Value, RpcError> {
    let started = Instant::now();
    registry::validate_name("box name", &p.name)?;
    let kind = state
        .opts
        .backends
        .parse(p.backend.as_deref().unwrap_or("native"))
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
    // A VM box (BoxLite) is described beyond its policy: an image, sizes, mounts, which its
    // backend checks and makes the box from. The other backends take none of them.
    let vm = if kind == BackendKind::Boxlite {
        super::microvm::refuse_host_fields(&p)?;
        super::microvm::size_from_limits(&mut p, state.opts.defaults.resources);
        Some(super::microvm::vm_request(&p))
    } else {
        super::microvm::refuse_vm_fields(&p, kind.as_str())?;
        None
    };

    // The one policy assembly `sandbox run` uses. A VM box's policy is its workdir and
    // network only: the guest sees its mounts, nothing of the configuration's grants.
    let (defaults, ask) = match &vm {
        Some(_) => (
            Defaults::default(),
            super::microvm::policy_ask(&p, &workdir),
        ),
        None => policy_ask(state, &p, kind, workdir),
    };
    let assembled = assembly::assemble(&defaults, ask).map_err(|e| match e {
        HostError::Tmpdir { .. } => RpcError::new(ErrorCode::Internal, e.to_string()),
        other => invalid(format!("box {}: {other}", p.name)),
    })?;
    let id = crate::token::generate("")
        .map_err(|e| RpcError::new(ErrorCode::Internal, e.to_string()))?[..12]
        .to_string();
    // Prepared now, through the seam, so that a box whose boundary cannot be set up (or
    // whose grants reach the daemon's own state) is refused at creation, loudly; every
    // `box.exec` then runs in this session. Off the runtime's threads (a VM's runtime takes
    // seconds to open), each named step announced as a `creating` boxState as it happens.
    let options = BackendOptions {
        allow_degraded: p.allow_degraded,
        vm,
        ..state.opts.backend.clone()
    };
    let progress = StepEvents {
        state: state.clone(),
        conn: conn.clone(),
        box_id: id.clone(),
        name: p.name.clone(),
        started,
    };
    let backends = state.opts.backends.clone();
    let prepared = tokio::task::spawn_blocking(move || {
        Run::prepare(&backends, kind, assembled, &options, &progress)
    })
    .await
    .map_err(|e| RpcError::new(ErrorCode::Internal, format!("box.create: {e}")))?;
    let run = prepared.map_err(|e| prepare_failed(&p.name, e))?;
    // The checks of a killed run of this worktree were done as the box prepared.
    for line in run.recovered().iter().flat_map(|r| r.lines()) {
        tracing::warn!(box_name = %p.name, "{line}");
    }
    let enforcement = run.enforcement().clone();
    let extra = super::microvm::created_extra(&run);
    {
        let mut boxes = state.boxes.locked();
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
        insert(
            state,
            &mut boxes,
            &p,
            Prepared {
                id: id.clone(),
                kind,
                run: Arc::new(run),
            },
        )?;
    }
    Ok(announce_created(state, conn, &p, &id, kind, started, &enforcement, extra).await)
}

/// The policy request of a box whose commands run on this host: the trusted defaults, this
/// box's grants, and the hook endpoint kept reachable under a network block.
fn policy_ask(
    state: &State,
    p: &BoxCreateParams,
    kind: BackendKind,
    workdir: std::path::PathBuf,
) -> (Defaults, PolicyAsk) {
    let defaults = Defaults {
        hook_port: Some(state.hook_port),
        ..state.opts.defaults.clone()
    };
    let ask = PolicyAsk {
        workdir,
        cwd: None,
        allow_read: p.allow_read.clone(),
        allow_write: p.allow_write.clone(),
        env: p.env.iter().map(|(n, v)| format!("{n}={v}")).collect(),
        block_net: p.block_net,
        allow_ports: p.allow_ports.clone(),
        allow_domains: p.allow_domains.clone(),
        credentials: p.credentials.clone(),
        publish: p.publish.clone(),
        timeout: p.timeout_ms.map(Duration::from_millis),
        resources: [
            p.memory_mib.map(|m| (m > 0).then_some(m << 20)),
            p.pids.map(|n| (n > 0).then_some(n)),
            p.cpu_millis
                .or(p.cpus.map(|c| c * 1000))
                .map(|c| (c > 0).then_some(c)),
        ],
        unprotected_git: p.unprotected_git,
        push_remotes: Vec::new(),
        allow_nested_git: p.allow_nested_git,
        tmpdir: Some(TmpdirRequest {
            prefix: format!("sandbox-box-{}-", p.name),
            root: state.opts.box_tmp_root.clone(),
        }),
        agent: None,
        home: defaults.home.clone().filter(|_| kind.gets_private_home()),
    };
    (defaults, ask)
}

/// Why box `name` could not be prepared, as a protocol error: a grant reaching a trusted
/// place is `denied`; a backend's own failure its own code (BoxLite's: a refused description,
/// a kept box of another image, the runtime's failure with its logs); anything else
/// `backendUnavailable`.
fn prepare_failed(name: &str, e: HostError) -> RpcError {
    #[cfg(feature = "boxlite")]
    if let Some(e) = e
        .backend_source()
        .and_then(|s| s.downcast_ref::<sandbox_boxlite::PrepareError>())
    {
        return super::microvm::prepare_error(name, e);
    }
    match e {
        HostError::TrustedPlace(_) => denied(format!("box {name}: {e}")),
        other => unavailable(format!("box {name}: {other}")),
    }
}

/// A box its backend has prepared, ready for the registry.
struct Prepared {
    pub id: String,
    pub kind: BackendKind,
    pub run: Arc<Run>,
}

/// Registers a prepared box under `p.name` with a fresh box token. The caller holds the
/// registry's lock and has made sure the name is free.
fn insert(
    state: &State,
    boxes: &mut Registry,
    p: &BoxCreateParams,
    new: Prepared,
) -> Result<(), RpcError> {
    let token = state
        .tokens
        .issue(Scope::Box(p.name.clone()))
        .map_err(|e| RpcError::new(ErrorCode::Internal, e.to_string()))?;
    boxes.insert(BoxEntry {
        id: new.id,
        name: p.name.clone(),
        kind: new.kind,
        allow_degraded: p.allow_degraded,
        params: p.clone(),
        run: new.run,
        state: BoxState::Created,
        token,
        created_at_ms: registry::now_ms(),
        execs: Default::default(),
        last_status: None,
    });
    Ok(())
}

/// Announces a registered box as `created` and returns `box.create`'s reply: the fields every
/// backend gives, then the backend's own `extra` ones.
#[allow(clippy::too_many_arguments)]
async fn announce_created(
    state: &State,
    conn: &Arc<Conn>,
    p: &BoxCreateParams,
    id: &str,
    kind: BackendKind,
    started: Instant,
    enforcement: &sandbox_host::report::Enforcement,
    extra: Value,
) -> Value {
    let elapsed = started.elapsed();
    announce(
        state,
        Some(conn),
        id,
        &p.name,
        BoxState::Created,
        Some(elapsed),
    )
    .await;
    let mut reply = json!({
        "boxId": id,
        "name": p.name,
        "backend": kind.as_str(),
        "created": true,
        "state": BoxState::Created,
        "elapsedMs": elapsed.as_millis() as u64,
        "enforcement": enforcement,
    });
    if let (Some(reply), Value::Object(extra)) = (reply.as_object_mut(), extra) {
        reply.extend(extra);
    }
    reply
}

/// A box of this name exists: reuse it if it was created with the same parameters, refuse
/// otherwise (silently handing out a box with another policy would be a surprise).
fn reuse(state: &State, p: &BoxCreateParams) -> Result<Option<Value>, RpcError> {
    let boxes = state.boxes.locked();
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

pub(super) async fn box_start(
    state: &Arc<State>,
    conn: &Arc<Conn>,
    name: &str,
) -> Result<Value, RpcError> {
    #[cfg(feature = "boxlite")]
    if let Some(vm) = super::microvm::vm_of(state, name)? {
        return super::microvm::box_start(state, conn, name, vm).await;
    }
    let (id, changed) = {
        let mut boxes = state.boxes.locked();
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

/// `box.stop`; see [`stop_box`] for what it waits for.
pub(super) async fn box_stop(
    state: &Arc<State>,
    conn: &Arc<Conn>,
    name: &str,
    force: bool,
) -> Result<Value, RpcError> {
    stop_box(state, name, force, Some(conn)).await?;
    Ok(json!({ "ok": true }))
}

/// Stops every command of a box and waits: for the requesting connection's own commands
/// until their `exit` events are queued (so they precede the reply), for the others until
/// their process groups are gone.
pub(super) async fn stop_box(
    state: &Arc<State>,
    name: &str,
    force: bool,
    conn: Option<&Arc<Conn>>,
) -> Result<(), RpcError> {
    let id = {
        let mut boxes = state.boxes.locked();
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
        let execs = state.execs.locked();
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
    #[cfg(feature = "boxlite")]
    if let Ok(Some(vm)) = super::microvm::vm_of(state, name) {
        super::microvm::stop_vm(&vm).await;
    }
    {
        let mut boxes = state.boxes.locked();
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

/// Stops every command of every box and waits until their groups are gone.
pub(super) async fn stop_everything(state: &Arc<State>) {
    state.shutting_down.store(true, Ordering::SeqCst);
    let names = state.boxes.locked().names();
    for name in names {
        let _ = stop_box(state, &name, false, None).await;
    }
    super::microvm::shutdown(state).await;
}

pub(super) async fn box_remove(
    state: &Arc<State>,
    conn: &Arc<Conn>,
    name: &str,
    force: bool,
) -> Result<Value, RpcError> {
    let busy = state.boxes.locked().get(name)?.execs.len();
    if busy > 0 && !force {
        return Err(RpcError::new(
            ErrorCode::BoxBusy,
            format!("box {name:?} still runs {busy} command(s); box.stop it or pass force: true"),
        ));
    }
    stop_box(state, name, false, Some(conn)).await?;
    let entry = state.boxes.locked().remove(name);
    let Some(entry) = entry else {
        return Err(RpcError::new(
            ErrorCode::NoSuchBox,
            format!("box {name:?} was removed meanwhile"),
        ));
    };
    state.tokens.revoke(&Scope::Box(name.to_string()));
    #[cfg(feature = "boxlite")]
    if let Some(vm) = entry.run.session::<sandbox_boxlite::session::BoxSession>() {
        super::microvm::remove_vm(&vm).await?;
    }
    announce(state, Some(conn), &entry.id, name, BoxState::Removed, None).await;
    drop(entry); // removes its TMPDIR
    Ok(json!({ "ok": true }))
}

/// `box.list`: every box, whoever created it.
pub(super) fn box_list(state: &State) -> Value {
    let list = state.boxes.locked().list();
    crate::json::to_value(&list)
}

/// The backend's named preparation steps as `boxState` events of state `creating`: to the
/// connection that sent `box.create` (waiting for room, so every step precedes the reply), and
/// best-effort to every other connection, as [`announce`] does.
struct StepEvents {
    state: Arc<State>,
    conn: Arc<Conn>,
    box_id: String,
    name: String,
    started: Instant,
}

impl Progress for StepEvents {
    fn step(&self, step: Step) {
        let (step, step_state, step_ms, step_error) = match step {
            Step::Started { step } => (step, "started", None, None),
            Step::Done { step, elapsed_ms } => (step, "done", Some(elapsed_ms), None),
            Step::Failed { step, error } => (step, "failed", None, Some(error)),
        };
        let frame = encode_event(
            "boxState",
            &BoxStateEvent {
                box_id: self.box_id.clone(),
                name: self.name.clone(),
                state: BoxState::Creating,
                elapsed_ms: Some(self.started.elapsed().as_millis() as u64),
                step: Some(step.to_string()),
                step_state: Some(step_state.to_string()),
                step_ms,
                step_error,
            },
        );
        // On a blocking thread (box_create's spawn_blocking), never on the runtime's.
        let _ = self.conn.out.blocking_send(Outbound::Frame(frame.clone()));
        self.state.broadcast(&frame, Some(self.conn.id));
    }
}
