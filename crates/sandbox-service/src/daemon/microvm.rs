//! BoxLite boxes in the daemon: the one BoxLite runtime of the user's home, opened on the
//! first `box.create` with `backend: "boxlite"`, and the box methods for boxes that are VMs.
//!
//! The generic handlers (`boxes`, `exec`) keep the registry, the exec table, the ordering of
//! replies and events, `box.stop`'s waits and `box.remove`'s checks, and every command's
//! event loop (`spawner::run_exec`): a VM box's commands are armed in its run and launched in
//! its guest through the run seam (`sandbox_boxlite::session`), like any other. This module
//! adds what only a VM needs from the daemon: the box's description and the engine at
//! `box.create`, the boot's steps at `box.start`, and the VM's stop and removal.
//!
//! Without the cargo feature `boxlite` the backend is not in the build and `box.create`
//! refuses it before anything here runs.

#[cfg(feature = "boxlite")]
use crate::locks::Locked as _;
use std::sync::Arc;
#[cfg(feature = "boxlite")]
use std::time::Instant;

#[cfg(feature = "boxlite")]
use sandbox_boxlite::git::{
    check_against_git, commit_mounts, git_mounts, order_for_guest, CommitDirs, GitData,
};
#[cfg(feature = "boxlite")]
use sandbox_boxlite::session::BoxGit;
#[cfg(feature = "boxlite")]
use sandbox_boxlite::spec::{self, BoxSpec, Mount, NetTarget};
#[cfg(feature = "boxlite")]
use sandbox_protocol::ErrorCode;
use sandbox_protocol::{BoxCreateParams, RpcError};
#[cfg(feature = "boxlite")]
use serde_json::json;

use super::{invalid, unavailable};

#[cfg(all(feature = "boxlite", test))]
/// [`box_spec_with`] for a box whose git writes do not come back.
pub(super) fn box_spec(
    p: &BoxCreateParams,
    workdir: &std::path::Path,
) -> Result<BoxSpec, RpcError> {
    box_spec_with(p, workdir, None).map(|(spec, _)| spec)
}

#[cfg(feature = "boxlite")]
/// Whether a linked worktree's box gets the commit mounts (docs/boxlite.md, "Commits from a
/// box"). Off for now: BoxLite 0.10.8 gives each mount a device of its own, and the fourth
/// mount (the box's git directory) exhausts libkrun's interrupts even without the network —
/// `RegisterVsockDevice(IrqsExhausted)`, measured in a booted box in the TCG guest — so such
/// a box never boots. On again once one share can carry several mounts.
const COMMITS_FROM_BOXES: bool = false;

#[cfg(feature = "boxlite")]
/// The box's description checked and compiled into a [`BoxSpec`]: the workdir mounted at its
/// own path read-write; the worktree's git data read-only at its own paths, stacked on the
/// workdir where it lies inside it (`sandbox_boxlite::git`: nothing the host's git runs can
/// be written from a box); the requested mounts, none of them a writable way to that data.
///
/// `commit_root`: for a linked worktree (without `unprotectedGit`), the box's git directory
/// on the host: its `.git` then names a generation of the common dir there, which the host
/// reads back at the end of each busy period (`sandbox_git::quarantine::generation`).
pub(super) fn box_spec_with(
    p: &BoxCreateParams,
    workdir: &std::path::Path,
    commit_root: Option<&std::path::Path>,
) -> Result<(BoxSpec, Option<BoxGit>), RpcError> {
    let bad = |e: spec::SpecError| invalid(format!("box {}: boxlite: {e}", p.name));
    let image = spec::image_source(p.image.as_deref(), p.rootfs.as_deref()).map_err(bad)?;
    let sizes = spec::check_sizes(p.cpus, p.memory_mib, p.disk_size_gb).map_err(bad)?;
    // Where `cpus`/`memoryMib` are not given, `cpuMillis` and the configuration's limits
    // (`limits:`, the same fields `--cpus`/`--memory` set) size the box.
    spec::check_env(&p.env).map_err(bad)?;
    let mut mounts = vec![spec::check_mount(workdir, workdir, false).map_err(bad)?];
    let mut commits = None;
    let git = match sandbox_policy::git::discover(workdir) {
        Ok(Some(found)) => {
            let linked = found.layout.worktree_gitdir != found.layout.common_dir;
            if let (true, false, Some(root)) = (linked, p.unprotected_git, commit_root) {
                let git = BoxGit::new(
                    &found.layout.common_dir,
                    &found.layout.worktree_gitdir,
                    root,
                )
                .map_err(|e| invalid(format!("box {}: boxlite: {e}", p.name)))?;
                commits = Some((git, workdir.join(".git")));
            }
            Some(GitData {
                common_dir: found.layout.common_dir.clone(),
                pointers: found
                    .layout
                    .pointers
                    .iter()
                    .map(|f| f.path.clone())
                    .collect(),
                hooks_path: found.layout.hooks_path.clone(),
            })
        }
        Ok(None) => None,
        Err(e) => {
            return Err(invalid(format!(
                "box {}: boxlite: reading the git layout of {}: {e}",
                p.name,
                workdir.display()
            )))
        }
    };
    match (&git, &commits) {
        (Some(git), Some((box_git, dot_git))) => {
            let dirs = CommitDirs {
                writable: box_git.writable(),
                pointer: box_git.pointer(),
                dot_git: dot_git.clone(),
            };
            mounts.extend(commit_mounts(git, &mounts[0].host, &dirs).map_err(bad)?);
        }
        (Some(git), None) => {
            mounts.extend(git_mounts(git, &mounts[0].host, p.unprotected_git).map_err(bad)?)
        }
        (None, _) => {}
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
        || !p.publish.is_empty()
    {
        return Err(invalid(format!(
            "box {}: boxlite takes mounts and allowNet, not allowRead, allowPorts, \
             allowDomains, credentials or publish (its port forwarding is not wired yet)",
            p.name
        )));
    }
    let spec = BoxSpec {
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
    };
    Ok((spec, commits.map(|(git, _)| git)))
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
/// Elapsed milliseconds.
pub(super) fn ms(since: Instant) -> u64 {
    since.elapsed().as_millis() as u64
}

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
    use std::time::Duration;

    use sandbox_boxlite::engine::{Engine, EngineOptions};
    use sandbox_boxlite::session::{BoxSession, Commits};
    use sandbox_protocol::{encode_event, BoxState, BoxStateEvent};
    use serde_json::Value;

    use super::super::boxes::{announce, announce_created, insert, Prepared};
    use super::super::connection::{Conn, Outbound};
    use super::super::exec::refuse_host_token;
    use super::super::State;
    use super::*;

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
        let mut p = p;
        let [memory, _, cpu] = state.opts.defaults.resources;
        let (cpus, memory_mib) = sandbox_policy::compile::limits::vm_size(
            p.cpu_millis.or(cpu.flatten()),
            memory.flatten(),
        );
        p.cpus = p.cpus.or(cpus);
        p.memory_mib = p.memory_mib.or(memory_mib);
        // The box's git directory: by its name, so a box BoxLite keeps across daemons finds
        // the one its mounts name.
        let state_dir = state.opts.backend.state_dir();
        let commit_root = state_dir.join(super::super::BOX_GIT_DIR).join(&p.name);
        if let (true, Err(e)) = (
            COMMITS_FROM_BOXES,
            std::fs::create_dir_all(state_dir.join(super::super::BOX_GIT_DIR)),
        ) {
            return Err(RpcError::new(
                ErrorCode::Internal,
                format!("box {}: creating {}: {e}", p.name, state_dir.display()),
            ));
        }
        let (spec, box_git) = box_spec_with(
            &p,
            &workdir,
            COMMITS_FROM_BOXES.then_some(commit_root.as_path()),
        )?;
        // The mounts are grants: none may reach the user's configuration, the remembered
        // choices or the daemon's token, nor BoxLite's own home. The policy comes from the one
        // assembly, with no configured grants on top: a guest sees its mounts and nothing else.
        // The box's git directory is the daemon's own, made for this box just above (as a
        // private home is a run's): its mounts are not grants, and it lies in the state
        // directory, which a grant may not reach. Every other mount is checked.
        let grants = |read_only: bool| -> Vec<std::path::PathBuf> {
            spec.mounts
                .iter()
                .filter(|m| m.read_only == read_only && !m.host.starts_with(&commit_root))
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
        sandbox_host::seam::check_trusted_places(
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
            } else if box_git.is_some() {
                "git data is mounted read-only (the .git pointer too); the box's git writes a \
                     private copy of the common dir whose commits the host takes back when no \
                     command runs: the task branch moves, nothing else does"
                    .into()
            } else {
                "git data is mounted read-only (the .git pointer too): git in the box reads \
                     history and cannot commit"
                    .into()
            }],
            ..Default::default()
        };
        let commits = box_git.map(|git| Commits {
            git,
            records: vec![state_dir.join("git-tasks")],
            scratch: state.opts.backend.private_dir().join("boxlite-git"),
        });
        let vm = Arc::new(BoxSession::new(
            engine.clone(),
            &p.name,
            litebox,
            enforcement.clone(),
            commits,
        ));
        let vm_id = vm.vm_id().to_string();
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
                        vm.clone(),
                    )),
                    vm: Some(vm.clone()),
                },
            )?;
        }
        let extra = json!({
            "kept": !new_in_boxlite,
            "vmId": vm_id,
            "logs": engine.log_paths(Some(&vm_id)),
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
        let Ok(Some(vm)) = super::super::boxes::vm_of(state, name) else {
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
        let engine = state.boxlite.lock().await.clone();
        if let Some(engine) = engine {
            let _ = engine.shutdown(Duration::from_secs(10)).await;
        }
    }
}

// Two attributes, not `all(test, …)`: clippy knows a test module by a plain `cfg(test)`.
#[cfg(test)]
#[cfg(feature = "boxlite")]
mod tests {
    //! The git rules of a box's mounts, against real repositories and worktrees.
    use std::path::{Path, PathBuf};

    use sandbox_testkit::git;

    use super::*;

    /// A repository with one commit, and a linked worktree `task` beside it.
    fn repo(root: &Path) -> (PathBuf, PathBuf) {
        let main = root.join("repo");
        let task = root.join("task");
        sandbox_testkit::linked_worktree(&main, &task);
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

    /// With a git directory for the box, a linked worktree's `.git` names the box's current
    /// generation (a read-only file of the host's), the generations' directory is writable at
    /// its own path, and the common dir stays read-only. A main worktree, and an unprotected
    /// box, are as before.
    #[test]
    fn a_linked_worktree_whose_commits_come_back_gets_the_generation_mounts() {
        let t = tempfile::tempdir().unwrap();
        let (main, task) = repo(t.path());
        let root = t.path().join("box-git");
        let (spec, git) =
            box_spec_with(&params(t.path(), json!([]), false), &task, Some(&root)).unwrap();
        let git = git.expect("a linked worktree's commits come back");
        let root = root.canonicalize().unwrap();
        let mounts: Vec<_> = spec
            .mounts
            .iter()
            .map(|m| (m.host.clone(), m.guest.clone(), m.read_only))
            .collect();
        assert_eq!(
            mounts,
            [
                (task.clone(), task.clone(), false),
                (main.join(".git"), main.join(".git"), true),
                (root.join("pointer"), task.join(".git"), true),
                (root.join("git"), root.join("git"), false),
            ]
        );
        assert_eq!(
            std::fs::read_to_string(git.pointer()).unwrap(),
            format!("gitdir: {}/git/current/worktrees/task\n", root.display())
        );
        for (dir, unprotected) in [(&main, false), (&task, true)] {
            let (_, none) =
                box_spec_with(&params(t.path(), json!([]), unprotected), dir, Some(&root)).unwrap();
            assert!(none.is_none(), "{}", dir.display());
        }
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
