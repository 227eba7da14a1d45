//! BoxLite boxes in the daemon: what of a VM box is the daemon's own.
//!
//! A BoxLite box is prepared through the run seam like every other (`boxes::box_create`:
//! one assembly, `Run::prepare` with the `creating` steps, one registration): the daemon's
//! registry links `sandbox_boxlite::BoxliteProvider::daemon` over its one BoxLite runtime
//! ([`with_engines`]), and that backend checks the box's description, opens the runtime and
//! creates the box. Its commands are armed in its run and launched in its guest
//! (`sandbox_boxlite::session`), each with the daemon's one event loop (`command::run_exec`).
//!
//! What stays here: the VM fields of `box.create` as the backend's [`VmRequest`], BoxLite's
//! failures as protocol errors, `box.create`'s extra reply fields, the boot's steps at
//! `box.start`, and the VM's stop and removal (on the box's `BoxSession`, from its run), and
//! the runtime's shutdown with the daemon.
//!
//! Without the cargo feature `boxlite` the backend is not in the build and `box.create`
//! refuses it before anything here runs.

#[cfg(feature = "boxlite")]
use crate::locks::Locked as _;
use std::path::Path;
use std::sync::Arc;
#[cfg(feature = "boxlite")]
use std::time::Instant;

use sandbox_host::assembly::Request as PolicyAsk;
use sandbox_host::seam::{VmMount, VmRequest};
#[cfg(feature = "boxlite")]
use sandbox_protocol::ErrorCode;
use sandbox_protocol::{BoxCreateParams, RpcError};
#[cfg(feature = "boxlite")]
use serde_json::json;
use serde_json::Value;

use super::state::invalid;
#[cfg(not(feature = "boxlite"))]
use super::state::State;
#[cfg(feature = "boxlite")]
use super::state::{denied, unavailable};

/// The VM fields of `box.create`, as the backend's description of the box (checked there).
pub(super) fn vm_request(p: &BoxCreateParams) -> VmRequest {
    VmRequest {
        name: p.name.clone(),
        image: p.image.clone(),
        rootfs: p.rootfs.clone(),
        cpus: p.cpus,
        memory_mib: p.memory_mib,
        disk_size_gb: p.disk_size_gb,
        mounts: p
            .mounts
            .iter()
            .map(|m| VmMount {
                host: m.host.clone(),
                guest: m.guest.clone().unwrap_or_else(|| m.host.clone()),
                read_only: m.read_only,
            })
            .collect(),
        allow_net: p.allow_net.clone(),
        env: p.env.clone(),
        unprotected_git: p.unprotected_git,
    }
}

/// Where `cpus`/`memoryMib` are not given, `cpuMillis` and the configuration's limits
/// (`limits:`, the same fields `--cpus`/`--memory` set) size the box. Kept in the box's
/// parameters, as it was created.
pub(super) fn size_from_limits(p: &mut BoxCreateParams, resources: [Option<Option<u64>>; 3]) {
    let [memory, _, cpu] = resources;
    let (cpus, memory_mib) =
        sandbox_policy::compile::limits::vm_size(p.cpu_millis.or(cpu.flatten()), memory.flatten());
    p.cpus = p.cpus.or(cpus);
    p.memory_mib = p.memory_mib.or(memory_mib);
}

/// The policy of a VM box: its workdir and network, nothing of the configuration's grants
/// (a guest sees its mounts and nothing else; its mounts are checked by the backend as
/// grants), no TMPDIR (the guest has its own).
pub(super) fn policy_ask(p: &BoxCreateParams, workdir: &Path) -> PolicyAsk {
    PolicyAsk {
        workdir: workdir.to_path_buf(),
        block_net: p.block_net,
        ..PolicyAsk::default()
    }
}

/// Refuses the fields of the backends on the host's kernel for a VM box.
pub(super) fn refuse_host_fields(p: &BoxCreateParams) -> Result<(), RpcError> {
    if !p.allow_ports.is_empty()
        || !p.allow_domains.is_empty()
        || !p.allow_read.is_empty()
        || !p.credentials.is_empty()
        || !p.publish.is_empty()
    {
        return Err(invalid(format!(
            "box {}: boxlite takes mounts and allowNet, not allowRead, allowPorts, \
             allowDomains, credentials or publish (its port forwarding is not wired yet)",
            p.name
        )));
    }
    Ok(())
}

/// Refuses the VM fields for backends that run on the host's own file system.
pub(super) fn refuse_vm_fields(p: &BoxCreateParams, backend: &str) -> Result<(), RpcError> {
    let given: Vec<&str> = [
        ("image", p.image.is_some()),
        ("rootfs", p.rootfs.is_some()),
        ("diskSizeGb", p.disk_size_gb.is_some()),
        ("mounts", !p.mounts.is_empty()),
        ("allowNet", !p.allow_net.is_empty()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect();
    if given.is_empty() {
        return Ok(());
    }
    Err(invalid(format!(
        "box {}: {} are for the boxlite backend; the {backend} backend runs on this machine's \
         own file system",
        p.name,
        given.join(", ")
    )))
}

#[cfg(feature = "boxlite")]
/// A BoxLite failure as a protocol error: `backendUnavailable`, with the kind of failure and
/// the box's log paths as data.
pub(super) fn engine_error(e: &sandbox_boxlite::BoxliteError) -> RpcError {
    let code = match e {
        sandbox_boxlite::BoxliteError::Spec(_) => ErrorCode::InvalidParams,
        _ => ErrorCode::BackendUnavailable,
    };
    RpcError::new(code, e.to_string()).with_data(json!({
        "reason": e.reason(),
        "logs": e.logs(),
    }))
}

#[cfg(feature = "boxlite")]
/// Why the BoxLite backend could not prepare box `name`, as a protocol error: a refused
/// description is `invalidParams`, a mount reaching BoxLite's home `denied`, a box BoxLite
/// keeps from another image `boxExists`, the runtime's or the box's failure
/// [`engine_error`]'s.
pub(super) fn prepare_error(name: &str, e: &sandbox_boxlite::PrepareError) -> RpcError {
    use sandbox_boxlite::PrepareError as E;
    match e {
        E::Spec(_) | E::TwoMounts { .. } | E::GitLayout { .. } | E::BoxGit(_) => {
            invalid(format!("box {name}: {e}"))
        }
        E::ReachesHome { .. } => denied(format!("box {name}: {e}")),
        E::KeptOther { .. } => RpcError::new(ErrorCode::BoxExists, e.to_string()),
        E::Engine(e) => engine_error(e),
        E::KeptUnreadable(_) => unavailable(format!("box {name}: {e}")),
        E::StateDir { .. } | E::NoRequest | E::NoRuntime(_) => {
            RpcError::new(ErrorCode::Internal, format!("box {name}: {e}"))
        }
    }
}

/// `box.create`'s reply fields of a VM box: whether BoxLite kept it from an earlier daemon,
/// its id there and its logs. None for the others.
pub(super) fn created_extra(run: &sandbox_host::Run) -> Value {
    #[cfg(feature = "boxlite")]
    if let Some(vm) = run.session::<sandbox_boxlite::session::BoxSession>() {
        return json!({
            "kept": vm.kept(),
            "vmId": vm.vm_id(),
            "logs": vm.logs(),
        });
    }
    let _ = run;
    Value::Object(Default::default())
}

#[cfg(feature = "boxlite")]
/// Elapsed milliseconds.
pub(super) fn ms(since: Instant) -> u64 {
    since.elapsed().as_millis() as u64
}

#[cfg(feature = "boxlite")]
pub(super) use engine::*;

#[cfg(not(feature = "boxlite"))]
/// Without the engine there is no runtime to shut down.
pub(super) async fn shutdown(_state: &Arc<State>) {}

#[cfg(feature = "boxlite")]
mod engine {
    use std::time::Duration;

    use sandbox_boxlite::session::BoxSession;
    use sandbox_boxlite::{BoxliteProvider, Engines};
    use sandbox_host::BackendKind;
    use sandbox_protocol::{encode_event, BoxState, BoxStateEvent};
    use serde_json::Value;

    use super::super::options::DaemonOptions;
    use super::super::state::{announce, Conn, Outbound, State};
    use super::*;

    /// The daemon's one BoxLite runtime (of `opts.boxlite_home`, opened by the first box),
    /// and the registry with BoxLite's daemon form over it, where the binary links BoxLite.
    pub(in super::super) fn with_engines(mut opts: DaemonOptions) -> (DaemonOptions, Arc<Engines>) {
        let engines = Engines::new(opts.boxlite_home.clone(), opts.boxlite_ready_timeout);
        if opts.backends.contains(BackendKind::Boxlite) {
            opts.backends = opts.backends.with(BoxliteProvider::daemon(engines.clone()));
        }
        (opts, engines)
    }

    /// The VM of a box, from its run; `None` for boxes whose commands run on the host.
    pub(in super::super) fn vm_of(
        state: &State,
        name: &str,
    ) -> Result<Option<Arc<BoxSession>>, RpcError> {
        Ok(state.boxes.locked().get(name)?.run.session::<BoxSession>())
    }

    /// Where a box's named steps are announced (as `boxState` events).
    struct Steps<'a> {
        conn: &'a Conn,
        state: &'a State,
        id: &'a str,
        name: &'a str,
        started: Instant,
    }

    impl Steps<'_> {
        async fn step(&self, step: &str, outcome: Result<u64, String>, box_state: BoxState) {
            let (step_state, step_ms, step_error) = match outcome {
                Ok(ms) => ("done", Some(ms), None),
                Err(e) => ("failed", None, Some(e)),
            };
            let frame = encode_event(
                "boxState",
                &BoxStateEvent {
                    box_id: self.id.to_string(),
                    name: self.name.to_string(),
                    state: box_state,
                    elapsed_ms: Some(ms(self.started)),
                    step: Some(step.to_string()),
                    step_state: Some(step_state.to_string()),
                    step_ms,
                    step_error,
                },
            );
            let _ = self.conn.out.send(Outbound::Frame(frame.clone())).await;
            self.state.broadcast(&frame, Some(self.conn.id));
        }
    }

    /// `box.start` of a VM box: the boot, announced with its time, or the specific failure.
    pub(in super::super) async fn box_start(
        state: &Arc<State>,
        conn: &Arc<Conn>,
        name: &str,
        vm: Arc<BoxSession>,
    ) -> Result<Value, RpcError> {
        let _booting = vm.boot_lock().await;
        let id = {
            let boxes = state.boxes.locked();
            let entry = boxes.get(name)?;
            if entry.state == BoxState::Running {
                return Ok(json!({ "boxId": entry.id, "bootMs": 0, "state": BoxState::Running }));
            }
            entry.id.clone()
        };
        let started = Instant::now();
        // BoxLite carries output as text; where the box can run the relay, as bytes.
        let booted = vm.boot().await;
        Steps {
            conn,
            state,
            id: &id,
            name,
            started,
        }
        .step(
            "booting the VM",
            booted
                .as_ref()
                .map(|b| b.boot.as_millis() as u64)
                .map_err(|e| e.to_string()),
            BoxState::Created,
        )
        .await;
        let booted = booted.map_err(|e| engine_error(&e))?;
        {
            let mut boxes = state.boxes.locked();
            boxes.get_mut(name)?.state = BoxState::Running;
        }
        announce(
            state,
            Some(conn),
            &id,
            name,
            BoxState::Running,
            Some(booted.boot),
        )
        .await;
        Ok(json!({
            "boxId": id,
            "bootMs": booted.boot.as_millis() as u64,
            "state": BoxState::Running,
            "output": if booted.byte_exact { "bytes" } else { "text" },
        }))
    }

    /// The first command of a VM box: its launch time, as the box's named step.
    pub(in super::super) async fn first_exec(
        state: &Arc<State>,
        conn: &Arc<Conn>,
        box_id: &str,
        name: &str,
        started: Instant,
    ) {
        let Ok(Some(vm)) = vm_of(state, name) else {
            return;
        };
        if vm.first_exec() {
            Steps {
                conn,
                state,
                id: box_id,
                name,
                started,
            }
            .step("first exec", Ok(ms(started)), BoxState::Running)
            .await;
        }
    }

    /// Stops the VM after the generic stop has ended its commands.
    pub(in super::super) async fn stop_vm(vm: &BoxSession) {
        if let Err(e) = vm.stop().await {
            tracing::warn!("{e}");
        }
    }

    /// Removes the VM and its disks after the generic removal.
    pub(in super::super) async fn remove_vm(vm: &BoxSession) -> Result<(), RpcError> {
        vm.remove().await.map_err(|e| engine_error(&e))
    }

    /// The daemon is going: every VM of the runtime is stopped.
    pub(in super::super) async fn shutdown(state: &Arc<State>) {
        // Waits for an opening under way (a blocking lock): off the runtime's threads.
        let engines = state.boxlite.clone();
        let engine = tokio::task::spawn_blocking(move || engines.opened())
            .await
            .ok()
            .flatten();
        if let Some(engine) = engine {
            let _ = engine.shutdown(Duration::from_secs(10)).await;
        }
    }
}
