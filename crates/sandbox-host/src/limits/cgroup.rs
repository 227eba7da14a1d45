//! The resource limits' effects on Linux: the probe of what this machine offers
//! ([`probe`], described as a [`Machine`] for the pure planner in
//! `sandbox_policy::compile::limits`), a run's groups ([`RunGroups`]: created below this
//! process's own group, set, joined by the child prelude, read, removed) and the removal of a
//! killed run's groups ([`recover`]).
//!
//! Groups are only ever created below the group this process is in (its own, or one
//! delegated to it); a parent group's settings are never written. Every group a run creates
//! is named in a record of the run journal's directory, locked by this process while it
//! lives; the next run removes the groups of a record whose lock is free (its owner died).

use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sandbox_exec::JoinCgroups;
use sandbox_policy::compile::limits::{
    self, Controller, GroupPlan, LimitsPlan, Machine, Mechanism, Usage, V1Parent, V2Parent,
};
use serde::{Deserialize, Serialize};

use crate::error::HostError;

mod cleanup;
mod mounts;
pub use mounts::{parse_mountinfo, parse_proc_cgroup, CgroupMount};

pub(crate) use cleanup::process_alive;
use cleanup::remove;
pub use cleanup::{recover, sweep};

/// Where this process's group of a hierarchy mounted at `mount` is: the mount point and the
/// process's path below the mount's root (None when the group is outside what it shows).
fn group_dir(mount: &CgroupMount, path: &str) -> Option<PathBuf> {
    let rest = if mount.root == "/" {
        path
    } else {
        path.strip_prefix(mount.root.as_str())?
    };
    let rest = rest.trim_start_matches('/');
    Some(if rest.is_empty() {
        mount.mount_point.clone()
    } else {
        mount.mount_point.join(rest)
    })
}

/// A directory we may create groups in (write and search).
fn writable(path: &Path) -> bool {
    use nix::unistd::AccessFlags;
    nix::unistd::access(path, AccessFlags::W_OK | AccessFlags::X_OK).is_ok()
}

fn writable_file(path: &Path) -> bool {
    nix::unistd::access(path, nix::unistd::AccessFlags::W_OK).is_ok()
}

fn controller_named(name: &str) -> Option<Controller> {
    Controller::ALL.into_iter().find(|c| c.name() == name)
}

/// What this machine offers for resource limits, from `/proc/self/mountinfo`,
/// `/proc/self/cgroup` and the groups' own files. No side effects.
pub fn probe() -> Machine {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_mountinfo(&t))
        .unwrap_or_default();
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .map(|t| parse_proc_cgroup(&t))
        .unwrap_or_default();
    let root = nix::unistd::geteuid().is_root();
    let systemd_user = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .is_some_and(|d| d.join("systemd/private").exists());
    let mut machine = Machine {
        root,
        systemd_user,
        ..Machine::default()
    };
    probe_v2(&mounts, &own, &mut machine);
    for controller in Controller::ALL {
        match probe_v1(&mounts, &own, controller) {
            Ok(parent) => machine.v1.push(parent),
            Err(why) => machine.v1_why_not.push((controller, why)),
        }
    }
    machine
}

fn probe_v2(mounts: &[CgroupMount], own: &[(Vec<String>, String)], machine: &mut Machine) {
    let Some(mount) = mounts.iter().find(|m| m.v2) else {
        machine.v2_why_not = "no cgroup2 file system is mounted".into();
        return;
    };
    let Some((_, path)) = own.iter().find(|(c, _)| c.is_empty()) else {
        machine.v2_why_not = "this process has no cgroup v2 group (/proc/self/cgroup)".into();
        return;
    };
    let Some(dir) = group_dir(mount, path) else {
        machine.v2_why_not = format!(
            "this process's group {path} is outside the mount at {}",
            mount.mount_point.display()
        );
        return;
    };
    if mount.read_only || !writable(&dir) || !writable_file(&dir.join("cgroup.procs")) {
        machine.v2_why_not = format!(
            "this process's group {} is not delegated to it (not writable)",
            dir.display()
        );
        return;
    }
    let ours = |file: &str, dir: &Path| -> Vec<Controller> {
        std::fs::read_to_string(dir.join(file))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(controller_named)
            .collect()
    };
    // The leaf an earlier run of this process moved it into: its group is the parent (still
    // to be vacated: the last run may have moved this process back by the time this one
    // holds it).
    if dir.file_name().and_then(|n| n.to_str()) == Some(leaf_name().as_str()) {
        if let Some(parent) = dir.parent().filter(|p| p.starts_with(&mount.mount_point)) {
            let enabled = ours("cgroup.subtree_control", parent);
            if !enabled.is_empty() && writable(parent) {
                machine.v2 = Some(V2Parent {
                    dir: parent.to_path_buf(),
                    enabled,
                    vacate: true,
                });
                return;
            }
        }
    }
    let enabled = ours("cgroup.subtree_control", &dir);
    if !enabled.is_empty() {
        machine.v2 = Some(V2Parent {
            dir,
            enabled,
            vacate: false,
        });
        return;
    }
    let available = ours("cgroup.controllers", &dir);
    if available.is_empty() {
        machine.v2_why_not = format!(
            "no memory, pids or cpu controller is available in this process's group {} \
             (they are in the v1 hierarchies, or not delegated)",
            dir.display()
        );
        return;
    }
    // A group with a process in it cannot enable controllers for groups below it; this
    // process can leave its group for a leaf below it only when it is alone there (a
    // scope of its own), or it would take the group away from the others.
    let others: Vec<String> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
        .filter(|p| *p != std::process::id().to_string())
        .map(str::to_string)
        .collect();
    let names: Vec<&str> = available.iter().map(|c| c.name()).collect();
    if !others.is_empty() || !writable_file(&dir.join("cgroup.subtree_control")) {
        machine.v2_why_not = format!(
            "this process's group {} has the controllers ({}) but does not enable them for \
             groups below it, and {} (a group with processes in it cannot enable them; run \
             sandbox in a scope of its own: `systemd-run --user --scope -p Delegate=yes \
             sandbox …`)",
            dir.display(),
            names.join(" "),
            if others.is_empty() {
                "its cgroup.subtree_control is not writable".to_string()
            } else {
                format!("other processes are in it ({})", others.len())
            }
        );
        return;
    }
    machine.v2 = Some(V2Parent {
        dir,
        enabled: available,
        vacate: true,
    });
}

/// The leaf group a run moves this process into when its own group must enable
/// controllers ([`V2Parent::vacate`]).
fn leaf_name() -> String {
    format!("sandbox-supervisor-{}", process_tag())
}

/// This process on this machine until it reboots: its pid and its start time (clock ticks
/// since boot, `/proc/self/stat`). The pid alone is not enough: a group a killed run left
/// behind (its record in another project's journal) carries the pid a later process gets,
/// and that process's run then failed with "creating the group: File exists".
pub(crate) fn process_tag() -> &'static str {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        let pid = std::process::id();
        match std::fs::read_to_string("/proc/self/stat")
            .ok()
            .as_deref()
            .and_then(start_time)
        {
            Some(start) => format!("{pid}-{start}"),
            None => pid.to_string(),
        }
    })
}

/// Field 22 (`starttime`) of a `/proc/PID/stat` line; the command name (field 2) may hold
/// spaces and parentheses, so fields are counted after its last `)`.
fn start_time(stat: &str) -> Option<u64> {
    let (_, after) = stat.rsplit_once(')')?;
    after.split_whitespace().nth(19)?.parse().ok()
}

/// This process moved into a leaf of `group` and enabled `enabled` there, for `users` runs.
#[derive(Debug)]
struct Vacated {
    group: PathBuf,
    leaf: PathBuf,
    enabled: Vec<Controller>,
    users: usize,
}

static VACATED: std::sync::Mutex<Option<Vacated>> = std::sync::Mutex::new(None);

fn vacated() -> std::sync::MutexGuard<'static, Option<Vacated>> {
    VACATED.lock().unwrap_or_else(|e| e.into_inner())
}

fn controls(enable: bool, controllers: &[Controller]) -> String {
    let sign = if enable { '+' } else { '-' };
    controllers
        .iter()
        .map(|c| format!("{sign}{}", c.name()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A run's hold on `parent`: when this process vacated it (now or for a run still alive),
/// counted, so that the last run's end undoes it. True when held.
fn hold(parent: &V2Parent) -> Result<bool, HostError> {
    let mut state = vacated();
    if let Some(v) = state.as_mut().filter(|v| v.group == parent.dir) {
        v.users += 1;
        return Ok(true);
    }
    if !parent.vacate {
        return Ok(false);
    }
    let group = &parent.dir;
    let leaf = group.join(leaf_name());
    match std::fs::create_dir(&leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(cgroup_error(
                "creating this process's leaf group (its own group must enable the controllers)",
                &leaf,
                e,
            ))
        }
    }
    // "0" is the writer: the whole process, every thread, moves.
    if let Err(e) = std::fs::write(leaf.join("cgroup.procs"), "0") {
        let _ = std::fs::remove_dir(&leaf);
        return Err(cgroup_error(
            "moving this process into its leaf group",
            &leaf,
            e,
        ));
    }
    let path = group.join("cgroup.subtree_control");
    if let Err(e) = std::fs::write(&path, controls(true, &parent.enabled)) {
        // Another process is in the group after all (EBUSY): back where it was.
        let _ = std::fs::write(group.join("cgroup.procs"), "0");
        let _ = std::fs::remove_dir(&leaf);
        return Err(cgroup_error(
            "enabling the controllers for groups below this process's own group",
            &path,
            e,
        ));
    }
    *state = Some(Vacated {
        group: group.clone(),
        leaf,
        enabled: parent.enabled.clone(),
        users: 1,
    });
    Ok(true)
}

/// The end of a run's hold: the last one disables what was enabled, moves this process back
/// into its group and removes the leaf (only when the leaf holds this process alone).
fn release() {
    let mut state = vacated();
    let Some(v) = state.as_mut() else { return };
    v.users = v.users.saturating_sub(1);
    if v.users > 0 {
        return;
    }
    let me = std::process::id().to_string();
    let alone = std::fs::read_to_string(v.leaf.join("cgroup.procs"))
        .is_ok_and(|t| t.split_whitespace().all(|p| p == me));
    if !alone {
        return;
    }
    let undone = std::fs::write(
        v.group.join("cgroup.subtree_control"),
        controls(false, &v.enabled),
    )
    .and_then(|()| std::fs::write(v.group.join("cgroup.procs"), "0"))
    .and_then(|()| std::fs::remove_dir(&v.leaf));
    match undone {
        Ok(()) => *state = None,
        Err(e) => {
            tracing::warn!(group = %v.group.display(), error = %e, "could not undo this process's move into a leaf group")
        }
    }
}

fn probe_v1(
    mounts: &[CgroupMount],
    own: &[(Vec<String>, String)],
    controller: Controller,
) -> Result<V1Parent, String> {
    let name = controller.name();
    let Some(mount) = mounts
        .iter()
        .find(|m| !m.v2 && m.controllers.iter().any(|c| c == name))
    else {
        return Err(format!(
            "no v1 hierarchy with the {name} controller is mounted"
        ));
    };
    let Some((_, path)) = own.iter().find(|(c, _)| c.iter().any(|c| c == name)) else {
        return Err(format!(
            "this process has no group in the v1 {name} hierarchy"
        ));
    };
    let dir = group_dir(mount, path).ok_or_else(|| {
        format!(
            "this process's {name} group {path} is outside the mount at {}",
            mount.mount_point.display()
        )
    })?;
    if mount.read_only || !writable(&dir) {
        return Err(format!(
            "this process's {name} group {} is not writable (as root it is, where the \
             hierarchy is mounted read-write)",
            dir.display()
        ));
    }
    Ok(V1Parent {
        controller,
        memsw: controller == Controller::Memory && dir.join("memory.memsw.limit_in_bytes").exists(),
        dir,
    })
}

/// A killed run's groups, named in the journal's directory.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    version: u32,
    pid: u32,
    groups: Vec<PathBuf>,
}

const RECORD_PREFIX: &str = "cgroups";

fn write_record(
    dir: &Path,
    groups: Vec<PathBuf>,
) -> std::io::Result<crate::aftercare::journal::Locked> {
    let record = Record {
        version: 1,
        pid: std::process::id(),
        groups,
    };
    crate::aftercare::journal::write_locked(dir, RECORD_PREFIX, &record)
}

/// A run's name for its groups: unique on this machine until it reboots ([`process_tag`]).
fn group_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "sandbox-{}-{}",
        process_tag(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// One command's groups: created and set when armed, joined by its child first of all,
/// read when it ended, removed when dropped.
#[derive(Debug)]
pub struct RunGroups {
    groups: Vec<(GroupPlan, PathBuf)>,
    join: Arc<JoinCgroups>,
    /// Locked while the run lives; removed when its groups are.
    record: Option<crate::aftercare::journal::Locked>,
    /// A hold on this process's vacated group ([`hold`]), released after the groups go.
    held: bool,
}

fn cgroup_error(what: &'static str, path: &Path, e: std::io::Error) -> HostError {
    HostError::Cgroup {
        what,
        path: path.to_path_buf(),
        source: e,
    }
}

impl RunGroups {
    /// Creates the groups of `plan` below their parents, writes their limits and opens their
    /// `cgroup.procs`; the record in `journal` (when given) names them first, so a crash
    /// right after leaves nothing unnamed. A failure removes what was made.
    pub fn create(
        plan: &LimitsPlan,
        machine: &Machine,
        journal: Option<&Path>,
    ) -> Result<RunGroups, HostError> {
        let name = group_name();
        let planned = plan.groups(machine);
        let dirs: Vec<PathBuf> = planned.iter().map(|g| g.parent.join(&name)).collect();
        let v2 = machine
            .v2
            .as_ref()
            .filter(|_| planned.iter().any(|g| g.mechanism == Mechanism::CgroupV2));
        // A leaf this process may move into is named too, after the groups (removed last).
        let mut named = dirs.clone();
        if let Some(v2) = v2.filter(|v| v.vacate) {
            named.push(v2.dir.join(leaf_name()));
        }
        let record = match journal {
            Some(dir) => Some(write_record(dir, named).map_err(|e| {
                cgroup_error("writing the run journal's record of the groups in", dir, e)
            })?),
            None => None,
        };
        let mut made = RunGroups {
            groups: Vec::new(),
            join: Arc::new(JoinCgroups::new(Vec::new())),
            record,
            held: false,
        };
        if let Some(v2) = v2 {
            made.held = hold(v2)?;
        }
        let mut procs: Vec<OwnedFd> = Vec::new();
        for (group, dir) in planned.into_iter().zip(dirs) {
            std::fs::create_dir(&dir).map_err(|e| cgroup_error("creating the group", &dir, e))?;
            made.groups.push((group.clone(), dir.clone()));
            for (file, value, required) in &group.files {
                let path = dir.join(file);
                match std::fs::write(&path, value) {
                    Ok(()) => {}
                    Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(cgroup_error("setting the limit", &path, e)),
                }
            }
            // v1: the child joins by `tasks`, as the one thread it is right after fork (its
            // processes and threads follow it). `cgroup.procs` moves a whole thread group
            // under cgroup_threadgroup_rwsem, whose write side waits for an RCU grace period
            // when no migration ran lately — 8–20 ms per run when runs come seconds apart, as
            // an agent's do. v2 has no such file for a process: `cgroup.procs`.
            let file = match group.mechanism {
                Mechanism::CgroupV1 => "tasks",
                // (No group is planned for an rlimit.)
                Mechanism::CgroupV2 | Mechanism::RlimitNproc => "cgroup.procs",
            };
            let path = dir.join(file);
            let file = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(&path)
                .map_err(|e| cgroup_error("opening", &path, e))?;
            procs.push(file.into());
        }
        made.join = Arc::new(JoinCgroups::new(procs));
        Ok(made)
    }

    /// What the child prelude writes itself into.
    pub fn join(&self) -> Arc<JoinCgroups> {
        self.join.clone()
    }

    /// The groups' directories.
    #[cfg(test)]
    pub fn dirs(&self) -> impl Iterator<Item = &Path> {
        self.groups.iter().map(|(_, d)| d.as_path())
    }

    /// The kernel's counters of the run, read from its groups.
    pub fn usage(&self) -> Usage {
        let read = |dir: &Path, file: &str| std::fs::read_to_string(dir.join(file)).ok();
        let mut usage = Usage::default();
        for (group, dir) in &self.groups {
            for controller in &group.controllers {
                match (group.mechanism, controller) {
                    (Mechanism::CgroupV2, Controller::Memory) => {
                        usage.oom_kills =
                            read(dir, "memory.events").and_then(|t| limits::keyed(&t, "oom_kill"));
                        usage.peak_memory_bytes =
                            read(dir, "memory.peak").and_then(|t| limits::single(&t));
                    }
                    (Mechanism::CgroupV1, Controller::Memory) => {
                        usage.oom_kills = read(dir, "memory.oom_control")
                            .and_then(|t| limits::keyed(&t, "oom_kill"));
                        usage.peak_memory_bytes =
                            read(dir, "memory.max_usage_in_bytes").and_then(|t| limits::single(&t));
                    }
                    // No group is planned for an rlimit.
                    (Mechanism::RlimitNproc, Controller::Memory) => {}
                    (_, Controller::Pids) => {
                        usage.peak_processes =
                            read(dir, "pids.peak").and_then(|t| limits::single(&t));
                        usage.pids_limit_hits =
                            read(dir, "pids.events").and_then(|t| limits::keyed(&t, "max"));
                    }
                    (_, Controller::Cpu) => {
                        usage.cpu_throttled_periods =
                            read(dir, "cpu.stat").and_then(|t| limits::keyed(&t, "nr_throttled"));
                    }
                }
            }
        }
        usage
    }
}

impl Drop for RunGroups {
    fn drop(&mut self) {
        let mut all_gone = true;
        for (_, dir) in self.groups.iter().rev() {
            all_gone &= remove(dir);
        }
        if self.held {
            release();
        }
        // Kept when a group could not be removed: the next run tries again.
        if all_gone {
            if let Some(record) = self.record.take() {
                let _ = std::fs::remove_file(&record.path);
            }
        }
    }
}

#[cfg(test)]
mod tests;
