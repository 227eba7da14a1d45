//! BoxLite boxes in the daemon: the one BoxLite runtime of the user's home, opened on the
//! first `box.create` with `backend: "boxlite"`, and the box methods for boxes that are VMs.
//!
//! The generic handlers (`boxes`, `exec`) keep the registry, the exec table, the ordering of
//! replies and events, `box.stop`'s waits and `box.remove`'s checks; this module adds what a
//! VM needs: the image and disks at `box.create`, the boot at `box.start`, commands through
//! BoxLite's guest agent at `box.exec`, and the VM's stop and removal.
//!
//! Without the cargo feature `boxlite` the backend is not in the build and `box.create`
//! refuses it before anything here runs.

#[cfg(feature = "boxlite")]
use crate::locks::Locked as _;
use std::sync::Arc;
#[cfg(feature = "boxlite")]
use std::time::Instant;

#[cfg(feature = "boxlite")]
use sandbox_boxlite::git::{check_against_git, git_mounts, order_for_guest, GitData};
#[cfg(feature = "boxlite")]
use sandbox_boxlite::spec::{self, BoxSpec, Mount, NetTarget};
#[cfg(feature = "boxlite")]
use sandbox_protocol::ErrorCode;
use sandbox_protocol::{BoxCreateParams, RpcError};
#[cfg(feature = "boxlite")]
use serde_json::json;

use super::{invalid, unavailable};

#[cfg(feature = "boxlite")]
/// The box's description checked and compiled into a [`BoxSpec`]: the workdir mounted at its
/// own path read-write; the worktree's git data read-only at its own paths, stacked on the
/// workdir where it lies inside it (`sandbox_boxlite::git`: nothing the host's git runs can
/// be written from a box); the requested mounts, none of them a writable way to that data.
pub(super) fn box_spec(
    p: &BoxCreateParams,
    workdir: &std::path::Path,
) -> Result<BoxSpec, RpcError> {
    let bad = |e: spec::SpecError| invalid(format!("box {}: boxlite: {e}", p.name));
    let image = spec::image_source(p.image.as_deref(), p.rootfs.as_deref()).map_err(bad)?;
    let sizes = spec::check_sizes(p.cpus, p.memory_mib, p.disk_size_gb).map_err(bad)?;
    spec::check_env(&p.env).map_err(bad)?;
    let mut mounts = vec![spec::check_mount(workdir, workdir, false).map_err(bad)?];
    let git = match sandbox_policy::git::discover(workdir) {
        Ok(Some(found)) => Some(GitData {
            common_dir: found.layout.common_dir.clone(),
            pointers: found
                .layout
                .pointers
                .iter()
                .map(|f| f.path.clone())
                .collect(),
            hooks_path: found.layout.hooks_path.clone(),
        }),
        Ok(None) => None,
        Err(e) => {
            return Err(invalid(format!(
                "box {}: boxlite: reading the git layout of {}: {e}",
                p.name,
                workdir.display()
            )))
        }
    };
    if let Some(git) = &git {
        mounts.extend(git_mounts(git, &mounts[0].host, p.unprotected_git).map_err(bad)?);
    }
    for m in &p.mounts {
        let guest = m.guest.clone().unwrap_or_else(|| m.host.clone());
        let checked = spec::check_mount(&m.host, &guest, m.read_only).map_err(bad)?;
        if mounts.iter().any(|x: &Mount| x.guest == checked.guest) {
            return Err(invalid(format!(
                "box {}: two mounts at {} in the box",
                p.name,
                checked.guest.display()
            )));
        }
        if let (Some(git), false) = (&git, p.unprotected_git) {
            check_against_git(&checked, git).map_err(bad)?;
        }
        mounts.push(checked);
    }
    order_for_guest(&mut mounts);
    let allow_net = p
        .allow_net
        .iter()
        .map(|s| NetTarget::parse(s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(bad)?;
    if p.block_net && !allow_net.is_empty() {
        return Err(bad(spec::SpecError::AllowOnBlocked));
    }
    spec::check_device_budget(&mounts, p.block_net).map_err(bad)?;
    if !p.allow_ports.is_empty()
        || !p.allow_domains.is_empty()
        || !p.allow_read.is_empty()
        || !p.credentials.is_empty()
    {
        return Err(invalid(format!(
            "box {}: boxlite takes mounts and allowNet, not allowRead, allowPorts, \
             allowDomains or credentials",
            p.name
        )));
    }
    Ok(BoxSpec {
        name: p.name.clone(),
        image,
        cpus: sizes.cpus,
        memory_mib: sizes.memory_mib,
        disk_size_gb: sizes.disk_size_gb,
        mounts,
        allow_net,
        block_net: p.block_net,
        env: p.env.clone(),
        workdir: Some(workdir.to_path_buf()),
    })
}

/// Refuses the VM fields for backends that run on the host's own file system.
pub(super) fn refuse_vm_fields(p: &BoxCreateParams, backend: &str) -> Result<(), RpcError> {
    let given: Vec<&str> = [
        ("image", p.image.is_some()),
        ("rootfs", p.rootfs.is_some()),
        ("cpus", p.cpus.is_some()),
        ("memoryMib", p.memory_mib.is_some()),
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
/// Elapsed milliseconds.
pub(super) fn ms(since: Instant) -> u64 {
    since.elapsed().as_millis() as u64
}

/// The box registry holds a VM box's handle by its type.
#[cfg(feature = "boxlite")]
pub(crate) use engine::Vm;
#[cfg(feature = "boxlite")]
pub(super) use engine::*;

#[cfg(not(feature = "boxlite"))]
pub(super) use absent::*;

#[cfg(not(feature = "boxlite"))]
mod absent {
    //! Without the engine: boxlite boxes cannot exist, so these are never reached with one.
    use super::*;

    pub(crate) fn not_in_build() -> RpcError {
        unavailable(sandbox_boxlite::BoxliteError::NotInBuild.to_string())
    }

    pub(in super::super) async fn shutdown(_state: &Arc<super::super::State>) {}
}

#[cfg(feature = "boxlite")]
mod engine {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use futures_util::StreamExt as _;
    use sandbox_boxlite::boxlite::{BoxCommand, LiteBox};
    use sandbox_boxlite::engine::{Engine, EngineOptions};
    use sandbox_exec::StreamKind;
    use sandbox_protocol::{encode_event, BoxExecParams, BoxState, BoxStateEvent};
    use serde_json::Value;
    use tokio::sync::{mpsc, oneshot, watch};

    use super::super::boxes::{announce, announce_created, insert, Prepared};
    use super::super::connection::{Conn, Outbound};
    use super::super::dispatch::After;
    use super::super::exec::{refuse_host_token, ExecHandle};
    use super::super::spawner::{Control, ExecEnd, Phase, StdinMsg};
    use super::super::State;
    use super::*;

    /// The engine's handle on one box.
    pub(crate) struct Vm {
        pub(crate) engine: Arc<Engine>,
        pub(crate) litebox: LiteBox,
        /// BoxLite's id for the box (its directory under the home's `boxes/`).
        pub(crate) vm_id: String,
        first_exec: AtomicBool,
        /// Commands run under the byte-exact output relay (`sandbox_boxlite::relay`): the
        /// box can run it (its image has Perl), found out once after each boot.
        byte_exact: AtomicBool,
        /// Serialises boots: a second `box.start` waits for the first.
        booting: tokio::sync::Mutex<()>,
    }

    /// The daemon's one engine, opened on first use. Not kept when opening fails, so a user
    /// who fixes the runtime files does not have to restart the daemon.
    pub(crate) async fn engine(state: &State) -> Result<Arc<Engine>, RpcError> {
        let mut slot = state.boxlite.lock().await;
        if let Some(e) = &*slot {
            return Ok(e.clone());
        }
        let mut options = EngineOptions::new(state.opts.boxlite_home.clone());
        if let Some(t) = state.opts.boxlite_ready_timeout {
            options.ready_timeout = t;
        }
        let opened = tokio::task::spawn_blocking(move || Engine::open(options))
            .await
            .map_err(|e| RpcError::new(ErrorCode::Internal, format!("opening BoxLite: {e}")))?
            .map_err(|e| engine_error(&e))?;
        let opened = Arc::new(opened);
        *slot = Some(opened.clone());
        Ok(opened)
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

    /// `box.create` for `backend: "boxlite"`: the spec checked, the engine opened, the box
    /// created in BoxLite (or found there under its name, with its disk), and registered.
    pub(in super::super) async fn box_create(
        state: &Arc<State>,
        conn: &Arc<Conn>,
        p: BoxCreateParams,
        workdir: std::path::PathBuf,
        started: Instant,
    ) -> Result<Value, RpcError> {
        refuse_host_token(state, &p.env)?;
        let spec = box_spec(&p, &workdir)?;
        // The mounts are grants: none may reach the user's configuration, the remembered
        // choices or the daemon's token, nor BoxLite's own home. The policy comes from the one
        // assembly, with no configured grants on top: a guest sees its mounts and nothing else.
        let grants = |read_only: bool| -> Vec<std::path::PathBuf> {
            spec.mounts
                .iter()
                .filter(|m| m.read_only == read_only)
                .map(|m| m.host.clone())
                .collect()
        };
        let policy = sandbox_host::assembly::assemble(
            &sandbox_host::assembly::Defaults::default(),
            sandbox_host::assembly::Request {
                workdir: workdir.clone(),
                allow_write: grants(false),
                allow_read: grants(true),
                block_net: p.block_net,
                ..sandbox_host::assembly::Request::default()
            },
        )
        .map_err(|e| invalid(format!("box {}: {e}", p.name)))?
        .policy;
        sandbox_host::backend::check_trusted_places(
            sandbox_host::BackendKind::Boxlite,
            &policy,
            &state.opts.backend,
        )
        .map_err(|e| super::super::exec::denied(format!("box {}: {e}", p.name)))?;
        if let Some(m) = spec.mounts.iter().find(|m| {
            m.host.starts_with(&state.opts.boxlite_home)
                || state.opts.boxlite_home.starts_with(&m.host)
        }) {
            return Err(super::super::exec::denied(format!(
                "box {}: the mount {} reaches BoxLite's home {}",
                p.name,
                m.host.display(),
                state.opts.boxlite_home.display()
            )));
        }

        let id = crate::token::generate("")
            .map_err(|e| RpcError::new(ErrorCode::Internal, e.to_string()))?[..12]
            .to_string();
        let t = Instant::now();
        let engine = engine(state).await;
        Steps {
            conn,
            state,
            id: &id,
            name: &p.name,
            started,
        }
        .step(
            "opening the BoxLite runtime",
            engine
                .as_ref()
                .map(|_| ms(t))
                .map_err(|e| e.message.clone()),
            BoxState::Creating,
        )
        .await;
        let engine = engine?;
        let t = Instant::now();
        let created = engine.create(&spec).await;
        Steps {
            conn,
            state,
            id: &id,
            name: &p.name,
            started,
        }
        .step(
            "creating the box",
            created.as_ref().map(|_| ms(t)).map_err(|e| e.to_string()),
            BoxState::Creating,
        )
        .await;
        let (litebox, new_in_boxlite) = created.map_err(|e| engine_error(&e))?;
        if !new_in_boxlite {
            // Kept from an earlier daemon: only reused when it is the same image.
            let info = litebox
                .info()
                .await
                .map_err(|e| unavailable(format!("box {}: boxlite: {e}", p.name)))?;
            let wanted = match &spec.image {
                sandbox_boxlite::ImageSource::Registry(r) => r.clone(),
                sandbox_boxlite::ImageSource::Layout(d) => format!("rootfs:{}", d.display()),
            };
            if info.image != wanted {
                return Err(RpcError::new(
                    ErrorCode::BoxExists,
                    format!(
                        "BoxLite keeps a box named {:?} made from {}, not {wanted}; box.remove \
                         it first or use another name",
                        p.name, info.image
                    ),
                ));
            }
        }
        let vm_id = litebox.id().as_str().to_string();
        let vm = Arc::new(Vm {
            engine: engine.clone(),
            litebox,
            vm_id: vm_id.clone(),
            first_exec: AtomicBool::new(false),
            byte_exact: AtomicBool::new(false),
            booting: tokio::sync::Mutex::new(()),
        });
        let enforcement = sandbox_host::report::Enforcement {
            mechanism: "boxlite microVM (KVM)".into(),
            enforced: vec![
                "commands run in a hardware-isolated guest kernel".into(),
                "the guest sees only the box's image and its mounts".into(),
                if p.block_net {
                    "no network interface".into()
                } else if spec.allow_net.is_empty() {
                    "network open (no allowNet)".into()
                } else {
                    "outbound network only to allowNet".into()
                },
            ],
            notes: vec![if p.unprotected_git {
                "unprotected git: the repository's git directory is writable from the box \
                     (hooks and config included)"
                    .into()
            } else {
                "git data is mounted read-only (the .git pointer too): git in the box reads \
                     history and cannot commit"
                    .into()
            }],
            ..Default::default()
        };
        {
            let mut boxes = state.boxes.locked();
            if boxes.contains(&p.name) {
                return Err(RpcError::new(
                    ErrorCode::BoxExists,
                    format!(
                        "box {:?} was created meanwhile; send box.create again",
                        p.name
                    ),
                ));
            }
            insert(
                state,
                &mut boxes,
                &p,
                Prepared {
                    id: id.clone(),
                    kind: sandbox_host::BackendKind::Boxlite,
                    run: Arc::new(sandbox_host::Run::adopt(
                        sandbox_host::BackendKind::Boxlite,
                        policy,
                        Arc::new(VmSession(enforcement.clone())),
                    )),
                    vm: Some(vm.clone()),
                },
            )?;
        }
        let extra = json!({
            "kept": !new_in_boxlite,
            "vmId": vm_id,
            "logs": engine.log_paths(Some(&vm.vm_id)),
        });
        Ok(announce_created(
            state,
            conn,
            &p,
            &id,
            sandbox_host::BackendKind::Boxlite,
            started,
            &enforcement,
            extra,
        )
        .await)
    }

    /// The session a VM box holds for the generic registry: its commands never run on the
    /// host, so arming one through the seam is refused.
    struct VmSession(sandbox_host::report::Enforcement);

    impl sandbox_host::BackendSession for VmSession {
        fn enforcement(&self) -> &sandbox_host::report::Enforcement {
            &self.0
        }

        fn command(
            &self,
            _spec: sandbox_exec::CommandSpec,
        ) -> Result<sandbox_host::PreparedCommand, sandbox_host::HostError> {
            Err(sandbox_host::HostError::RunsInGuest {
                backend: sandbox_host::BackendKind::Boxlite,
            })
        }
    }

    /// `box.start` of a VM box: the boot, announced with its time, or the specific failure.
    pub(in super::super) async fn box_start(
        state: &Arc<State>,
        conn: &Arc<Conn>,
        name: &str,
        vm: Arc<Vm>,
    ) -> Result<Value, RpcError> {
        let _booting = vm.booting.lock().await;
        let id = {
            let boxes = state.boxes.locked();
            let entry = boxes.get(name)?;
            if entry.state == BoxState::Running {
                return Ok(json!({ "boxId": entry.id, "bootMs": 0, "state": BoxState::Running }));
            }
            entry.id.clone()
        };
        let started = Instant::now();
        let booted = vm.engine.start(name, &vm.litebox).await;
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
                .map(|d| d.as_millis() as u64)
                .map_err(|e| e.to_string()),
            BoxState::Created,
        )
        .await;
        let boot = booted.map_err(|e| engine_error(&e))?;
        // BoxLite carries output as text; where the box can run the relay, as bytes.
        let byte_exact = relay_works(name, &vm).await;
        vm.byte_exact.store(byte_exact, Ordering::SeqCst);
        {
            let mut boxes = state.boxes.locked();
            boxes.get_mut(name)?.state = BoxState::Running;
        }
        announce(state, Some(conn), &id, name, BoxState::Running, Some(boot)).await;
        Ok(json!({
            "boxId": id,
            "bootMs": boot.as_millis() as u64,
            "state": BoxState::Running,
            "output": if byte_exact { "bytes" } else { "text" },
        }))
    }

    /// Whether the booted box runs the output relay's interpreter.
    async fn relay_works(name: &str, vm: &Vm) -> bool {
        let (program, args) = sandbox_boxlite::relay::probe();
        let command = BoxCommand::new(program).args(args);
        match vm.engine.exec(name, &vm.litebox, command).await {
            Ok(execution) => {
                let works = matches!(execution.wait().await, Ok(r) if r.exit_code == 0);
                if !works {
                    tracing::warn!(
                        "box {name}: no perl in the image: its output is relayed as text \
                         (bytes that are not UTF-8 arrive as U+FFFD)"
                    );
                }
                works
            }
            Err(e) => {
                tracing::warn!("box {name}: probing for the output relay: {e}");
                false
            }
        }
    }

    /// Stops the VM after the generic stop has ended its commands.
    pub(in super::super) async fn stop_vm(name: &str, vm: &Vm) {
        if let Err(e) = vm.engine.stop(name, &vm.litebox).await {
            tracing::warn!("{e}");
        }
    }

    /// Removes the VM and its disks after the generic removal.
    pub(in super::super) async fn remove_vm(name: &str, vm: &Vm) -> Result<(), RpcError> {
        vm.engine.remove(name).await.map_err(|e| engine_error(&e))
    }

    /// The daemon is going: every VM of the runtime is stopped.
    pub(in super::super) async fn shutdown(state: &Arc<State>) {
        let engine = state.boxlite.lock().await.clone();
        if let Some(engine) = engine {
            let _ = engine.shutdown(Duration::from_secs(10)).await;
        }
    }

    /// `box.exec` in a VM box: the command through BoxLite's guest agent, its output as
    /// `output` events (byte for byte through the relay where the box runs it, else BoxLite's
    /// text, with invalid UTF-8 replaced),
    /// `exec.stdin`, `exec.kill` and the timeout, then `exit`.
    pub(in super::super) async fn box_exec(
        state: &Arc<State>,
        conn: &Arc<Conn>,
        p: BoxExecParams,
        vm: Arc<Vm>,
        workdir: std::path::PathBuf,
        after: &mut After,
    ) -> Result<Value, RpcError> {
        let started = Instant::now();
        refuse_host_token(state, &p.env)?;
        let cwd = match &p.working_dir {
            Some(d) if d.is_absolute() => d.clone(),
            Some(d) => workdir.join(d),
            None => workdir.clone(),
        };
        let byte_exact = vm.byte_exact.load(Ordering::SeqCst);
        let (program, args) = if byte_exact {
            sandbox_boxlite::relay::wrap(&p.command, &p.args)
        } else {
            (p.command.clone(), p.args.clone())
        };
        let mut command = BoxCommand::new(program)
            .args(args)
            .working_dir(cwd.display().to_string());
        for (k, v) in &p.env {
            command = command.env(k.clone(), v.clone());
        }
        let box_id = state.boxes.locked().get(&p.name)?.id.clone();
        let mut execution = vm
            .engine
            .exec(&p.name, &vm.litebox, command)
            .await
            .map_err(|e| engine_error(&e))?;
        let exec_id = state.next_id();
        let (control_tx, mut control_rx) = mpsc::channel(8);
        let (stdin_tx, stdin_rx) = if p.stdin {
            let (tx, rx) = mpsc::channel(16);
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let (phase_tx, phase_rx) = watch::channel(Phase::Running);
        let (go_tx, go_rx) = oneshot::channel::<()>();
        {
            let mut boxes = state.boxes.locked();
            let mut execs = state.execs.locked();
            let entry = boxes.get_mut(&p.name)?;
            entry.execs.insert(exec_id);
            execs.insert(
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
        }
        let launch_ms = ms(started);
        if !vm.first_exec.swap(true, Ordering::SeqCst) {
            Steps {
                conn,
                state,
                id: &box_id,
                name: &p.name,
                started,
            }
            .step("first exec", Ok(launch_ms), BoxState::Running)
            .await;
        }
        let timeout = p.timeout_ms.map(Duration::from_millis);
        let out = conn.out.clone();
        let state2 = state.clone();
        let conn2 = conn.clone();
        let name = p.name.clone();
        let mut stdout = execution.stdout();
        let mut stderr = execution.stderr();
        let stdin = execution.stdin();
        tokio::spawn(async move {
            let _ = go_rx.await;
            if let (Some(mut stdin), Some(mut rx)) = (stdin, stdin_rx) {
                tokio::spawn(async move {
                    while let Some(StdinMsg { data, close, reply }) = rx.recv().await {
                        let res = if data.is_empty() {
                            Ok(())
                        } else {
                            stdin.write_all(&data).await
                        };
                        if close {
                            stdin.close();
                        }
                        let _ = reply.send(res.map_err(|e| {
                            RpcError::new(ErrorCode::StdinClosed, format!("stdin: {e}"))
                        }));
                        if close {
                            break;
                        }
                    }
                });
            }
            let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
            let mut timed_out = false;
            let mut signal = None;
            // exec.kill without a signal and box.stop: SIGTERM, then the kill after the grace.
            let mut kill_at: Option<tokio::time::Instant> = None;
            let mut control_open = true;
            let (mut out_open, mut err_open) = (stdout.is_some(), stderr.is_some());
            let mut out_decoder = Relayed::new(byte_exact);
            let mut err_decoder = Relayed::new(byte_exact);
            let wait = execution.wait();
            tokio::pin!(wait);
            let result = loop {
                tokio::select! {
                    biased;
                    ctl = control_rx.recv(), if control_open => match ctl {
                        Some(Control::Signal(sig)) => {
                            signal = Some(sig as i32);
                            let _ = execution.signal(sig as i32).await;
                        }
                        Some(Control::Terminate { grace }) => {
                            signal = Some(libc::SIGTERM);
                            let _ = execution.signal(libc::SIGTERM).await;
                            let at = tokio::time::Instant::now() + grace;
                            kill_at = Some(kill_at.map_or(at, |k| k.min(at)));
                        }
                        None => control_open = false,
                    },
                    _ = sleep_until(kill_at), if kill_at.is_some() => {
                        kill_at = None;
                        signal = Some(libc::SIGKILL);
                        let _ = execution.kill().await;
                    }
                    _ = sleep_until(deadline), if deadline.is_some() && !timed_out => {
                        timed_out = true;
                        let _ = execution.kill().await;
                    }
                    line = next(&mut stdout), if out_open => match line {
                        Some(s) => {
                            let data = out_decoder.bytes(s);
                            if !data.is_empty() {
                                let _ = out.send(Outbound::Output { exec_id, stream: StreamKind::Stdout, data: data.into() }).await;
                            }
                        }
                        None => out_open = false,
                    },
                    line = next(&mut stderr), if err_open => match line {
                        Some(s) => {
                            let data = err_decoder.bytes(s);
                            if !data.is_empty() {
                                let _ = out.send(Outbound::Output { exec_id, stream: StreamKind::Stderr, data: data.into() }).await;
                            }
                        }
                        None => err_open = false,
                    },
                    res = &mut wait, if !out_open && !err_open => break res,
                }
            };
            // The one exit rule, from the guest's result: a negative code is the signal
            // that killed the command; a code above 128 after a signal we sent is that
            // signal's; a lost command is the box's failure (125).
            use sandbox_host::Outcome;
            let (outcome, error_message) = match result {
                Ok(r) if timed_out => (
                    Outcome::TimedOut(timeout.unwrap_or_default()),
                    Some(format!(
                        "timed out after {} ms; the command was killed in the box",
                        timeout.unwrap_or_default().as_millis()
                    ))
                    .or(r.error_message),
                ),
                Ok(r) if r.exit_code < 0 => (Outcome::Signaled(-r.exit_code), r.error_message),
                Ok(r) if r.exit_code > 128 && signal.is_some() => {
                    (Outcome::Signaled(r.exit_code - 128), r.error_message)
                }
                Ok(r) => (Outcome::Exited(r.exit_code), r.error_message),
                Err(e) => (
                    Outcome::SetupFailed,
                    Some(format!("boxlite: the command was lost: {e}")),
                ),
            };
            let exit = super::super::spawner::exit_event_of(
                exec_id,
                outcome,
                error_message.into_iter().collect(),
                None,
            );
            let _ = phase_tx.send(Phase::Ended);
            let permit = out.reserve_owned().await.ok();
            super::super::exec::forget_exec(
                &state2,
                &conn2,
                &name,
                exec_id,
                Some(ExecEnd {
                    exit,
                    permit,
                    phase: phase_tx,
                }),
            );
        });
        *after = Some(Box::new(move || {
            let _ = go_tx.send(());
        }));
        Ok(json!({ "execId": exec_id, "launchMs": launch_ms }))
    }

    /// One output stream of a command: the relay's lines decoded, or BoxLite's text as is.
    struct Relayed {
        decoder: Option<sandbox_boxlite::relay::Decoder>,
    }

    impl Relayed {
        fn new(byte_exact: bool) -> Self {
            Relayed {
                decoder: byte_exact.then(sandbox_boxlite::relay::Decoder::default),
            }
        }

        fn bytes(&mut self, text: String) -> Vec<u8> {
            match &mut self.decoder {
                None => text.into_bytes(),
                Some(d) => match d.push(&text) {
                    Ok(bytes) => bytes,
                    // Not the relay's (BoxLite's own words on a broken stream): as text.
                    Err(e) => {
                        tracing::warn!("{e}");
                        self.decoder = None;
                        text.into_bytes()
                    }
                },
            }
        }
    }

    async fn next<S: futures_util::Stream<Item = String> + Unpin>(
        s: &mut Option<S>,
    ) -> Option<String> {
        match s {
            Some(s) => s.next().await,
            None => None,
        }
    }

    async fn sleep_until(at: Option<tokio::time::Instant>) {
        match at {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }
}

// Two attributes, not `all(test, …)`: clippy knows a test module by a plain `cfg(test)`.
#[cfg(test)]
#[cfg(feature = "boxlite")]
mod tests {
    //! The git rules of a box's mounts, against real repositories and worktrees.
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use super::*;

    fn git(dir: &Path, args: &[&str]) {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
    }

    /// A repository with one commit, and a linked worktree `task` beside it.
    fn repo(root: &Path) -> (PathBuf, PathBuf) {
        let main = root.join("repo");
        std::fs::create_dir(&main).unwrap();
        git(&main, &["init", "-q", "-b", "main"]);
        git(
            &main,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-q",
                "--allow-empty",
                "-m",
                "first",
            ],
        );
        let task = root.join("task");
        git(
            &main,
            &[
                "worktree",
                "add",
                "-q",
                "-b",
                "task",
                task.to_str().unwrap(),
            ],
        );
        let layout = root.join("layout");
        std::fs::create_dir(&layout).unwrap();
        std::fs::write(layout.join("oci-layout"), "{}").unwrap();
        std::fs::write(layout.join("index.json"), "{}").unwrap();
        (main.canonicalize().unwrap(), task.canonicalize().unwrap())
    }

    /// A box without the network: these tests are about the mounts, and with the network a
    /// linked worktree's three mounts are refused (the device budget's own test below).
    fn params(root: &Path, mounts: serde_json::Value, unprotected: bool) -> BoxCreateParams {
        serde_json::from_value(json!({
            "name": "b", "backend": "boxlite", "rootfs": root.join("layout"),
            "mounts": mounts, "unprotectedGit": unprotected, "blockNet": true,
        }))
        .unwrap()
    }

    #[test]
    fn with_the_network_a_linked_worktree_is_refused_and_a_main_worktree_fits() {
        let t = tempfile::tempdir().unwrap();
        let (main, task) = repo(t.path());
        let mut online = params(t.path(), json!([]), false);
        online.block_net = false;
        let e = box_spec(&online, &task).unwrap_err().message;
        assert!(
            e.contains("--block-net") && e.contains("IrqsExhausted"),
            "{e}"
        );
        box_spec(&online, &main).unwrap();
    }

    fn seen(spec: &BoxSpec) -> Vec<(PathBuf, bool)> {
        spec.mounts
            .iter()
            .inspect(|m| assert_eq!(m.host, m.guest, "git data sits at its own path"))
            .map(|m| (m.host.clone(), m.read_only))
            .collect()
    }

    #[test]
    fn a_main_worktree_gets_its_git_dir_read_only_on_top_of_the_writable_tree() {
        let t = tempfile::tempdir().unwrap();
        let (main, _) = repo(t.path());
        let spec = box_spec(&params(t.path(), json!([]), false), &main).unwrap();
        assert_eq!(
            seen(&spec),
            [(main.clone(), false), (main.join(".git"), true)]
        );
        let unprotected = box_spec(&params(t.path(), json!([]), true), &main).unwrap();
        assert_eq!(
            seen(&unprotected),
            [(main.clone(), false), (main.join(".git"), false)]
        );
    }

    #[test]
    fn a_hooks_path_in_the_worktree_is_read_only_in_the_box() {
        let t = tempfile::tempdir().unwrap();
        let (main, task) = repo(t.path());
        git(&main, &["config", "core.hooksPath", ".husky"]);
        let e = box_spec(&params(t.path(), json!([]), false), &task)
            .unwrap_err()
            .message;
        assert!(e.contains("core.hooksPath"), "{e}");
        std::fs::create_dir(task.join(".husky")).unwrap();
        let spec = box_spec(&params(t.path(), json!([]), false), &task).unwrap();
        assert!(
            seen(&spec).contains(&(task.join(".husky"), true)),
            "{:?}",
            spec.mounts
        );
    }

    #[test]
    fn a_linked_worktree_gets_the_common_dir_and_its_pointer_read_only() {
        let t = tempfile::tempdir().unwrap();
        let (main, task) = repo(t.path());
        let spec = box_spec(&params(t.path(), json!([]), false), &task).unwrap();
        assert_eq!(
            seen(&spec),
            [
                (task.clone(), false),
                (main.join(".git"), true),
                (task.join(".git"), true)
            ]
        );
        assert!(task.join(".git").is_file(), "the pointer is a file mount");
    }

    #[test]
    fn a_writable_mount_that_reaches_git_data_is_refused_and_a_read_only_one_is_not() {
        let t = tempfile::tempdir().unwrap();
        let (main, task) = repo(t.path());
        for (host, names) in [
            (&main, ".git"),
            (&main.join(".git/hooks"), ".git"),
            (&task, "pointer"),
        ] {
            let mounts = json!([{"host": host, "guest": "/elsewhere"}]);
            let e = box_spec(&params(t.path(), mounts, false), &task)
                .unwrap_err()
                .message;
            assert!(e.contains("writable") && e.contains(names), "{e}");
            let ro = json!([{"host": host, "guest": "/elsewhere", "readOnly": true}]);
            box_spec(&params(t.path(), ro, false), &task).unwrap();
            let rw = json!([{"host": host, "guest": "/elsewhere"}]);
            box_spec(&params(t.path(), rw, true), &task).unwrap();
        }
    }

    #[test]
    fn a_mount_on_a_parent_of_the_worktree_is_made_before_it() {
        let t = tempfile::tempdir().unwrap();
        let (_, task) = repo(t.path());
        let empty = t.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        let parent = task.parent().unwrap();
        let mounts = json!([{"host": empty, "guest": parent}]);
        let spec = box_spec(&params(t.path(), mounts, false), &task).unwrap();
        assert_eq!(spec.mounts[0].guest, parent, "{:?}", spec.mounts);
    }
}
