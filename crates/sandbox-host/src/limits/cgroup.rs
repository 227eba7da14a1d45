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
use std::time::{Duration, Instant};

use sandbox_exec::JoinCgroups;
use sandbox_policy::compile::limits::{
    self, Controller, GroupPlan, LimitsPlan, Machine, Mechanism, Usage, V1Parent, V2Parent,
};
use serde::{Deserialize, Serialize};

use crate::error::HostError;

/// One mount of a cgroup hierarchy: where, the path inside the hierarchy it shows, and its
/// kind (`cgroup2`, or the v1 controllers it carries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    pub mount_point: PathBuf,
    pub root: String,
    pub v2: bool,
    pub controllers: Vec<String>,
    pub read_only: bool,
}

/// The cgroup mounts of `/proc/self/mountinfo`'s text.
pub fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fields: Vec<&str> = left.split_whitespace().collect();
            let mut right = right.split_whitespace();
            let fstype = right.next()?;
            let _source = right.next()?;
            let super_opts = right.next().unwrap_or("");
            let v2 = match fstype {
                "cgroup2" => true,
                "cgroup" => false,
                _ => return None,
            };
            let opts = fields.get(5).copied().unwrap_or("");
            Some(CgroupMount {
                root: fields.get(3)?.to_string(),
                mount_point: PathBuf::from(unescape(fields.get(4)?)),
                v2,
                controllers: if v2 {
                    Vec::new()
                } else {
                    super_opts.split(',').map(str::to_string).collect()
                },
                read_only: opts.split(',').any(|o| o == "ro"),
            })
        })
        .collect()
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            if let Some(n) = std::str::from_utf8(&bytes[i + 1..i + 4])
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
            {
                out.push(n);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `/proc/self/cgroup`'s lines: `(hierarchy controllers, path)`; v2's has no controllers.
pub fn parse_proc_cgroup(text: &str) -> Vec<(Vec<String>, String)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let _id = parts.next()?;
            let controllers = parts.next()?;
            let path = parts.next()?;
            Some((
                controllers
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_string)
                    .collect(),
                path.to_string(),
            ))
        })
        .collect()
}

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
        cause: e.to_string(),
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
                Mechanism::CgroupV2 => "cgroup.procs",
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

/// Removes one group: a process still in it (an orphan the daemon could not reap yet, a
/// killed run's survivor) is killed first — the group names exactly the run's processes.
/// True when the group is gone.
fn remove(dir: &Path) -> bool {
    // The kernel removes an exited process from its group at once (reaped or not), so the
    // wait below is for SIGKILL's delivery only; bounded all the same.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                for pid in std::fs::read_to_string(dir.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
                {
                    // A process of the run's own group; one already gone is no error.
                    let pid = nix::unistd::Pid::from_raw(pid);
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                }
                std::thread::yield_now();
            }
            Err(e) => {
                tracing::warn!(group = %dir.display(), error = %e, "could not remove the run's cgroup");
                return false;
            }
        }
    }
}

/// Removes the groups of every killed run recorded in `journal` (a record whose lock is
/// free); returns the groups removed.
pub fn recover(journal: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    crate::aftercare::journal::each_unowned(
        journal,
        RECORD_PREFIX,
        |path, record: Option<Record>| {
            let mut all_gone = true;
            for group in record.map(|r| r.groups).unwrap_or_default() {
                // Only a run's own groups: `sandbox-<pid>-<start>-<n>` (a record is the user's own
                // file, but a wrong path must still not remove anything else).
                let ours = group
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("sandbox-"));
                if !ours || !group.exists() {
                    continue;
                }
                if remove(&group) {
                    removed.push(group);
                } else {
                    all_gone = false;
                }
            }
            if all_gone {
                let _ = std::fs::remove_file(path);
            }
        },
    );
    removed
}

/// Whose group a name of ours is: `sandbox-<pid>-<start>-<n>` (a run's) or
/// `sandbox-supervisor-<pid>-<start>` (a vacated group's leaf), as `(pid, start time)`.
/// `None` for any other name, the pid-only names of older versions included: their owner's
/// liveness cannot be decided.
fn owner_of(name: &str) -> Option<(u32, u64)> {
    let rest = name.strip_prefix("sandbox-")?;
    let (rest, fields) = match rest.strip_prefix("supervisor-") {
        Some(rest) => (rest, 2),
        None => (rest, 3),
    };
    let parts: Vec<&str> = rest.split('-').collect();
    let numeric = |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    if parts.len() != fields || !parts.iter().all(numeric) {
        return None;
    }
    Some((parts[0].parse().ok()?, parts[1].parse().ok()?))
}

/// Whether the process of a [`process_tag`] lives (a group's, a throwaway cache layer's): a
/// process with that pid and that start time (`/proc/<pid>/stat`). A pid reused since by
/// another process has another start time.
pub(crate) fn process_alive(pid: u32, start: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .as_deref()
        .and_then(start_time)
        == Some(start)
}

/// The parents this process creates its groups in: each v1 controller's group and the v2
/// group (where a vacated group's leaf lies too).
fn parents(machine: &Machine) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = machine.v1.iter().map(|p| p.dir.clone()).collect();
    dirs.extend(machine.v2.iter().map(|p| p.dir.clone()));
    dirs.sort();
    dirs.dedup();
    dirs
}

/// Removes the empty groups of dead runs in the parents this process uses, whoever's journal
/// named them: a killed run's record is in its own run journal, and when that is gone (a
/// deleted state directory, a test's temporary home) nothing else would ever remove them.
/// Returns the groups removed.
///
/// Only names of ours whose owner is dead by its pid *and* start time ([`owner_of`],
/// [`process_alive`]): a live run's group — another project's, another daemon's — is never
/// touched. As a non-root user only groups this user owns. Only empty groups: `rmdir` fails
/// on a group with a process in it, and nothing is killed here (the journal's [`recover`]
/// kills what a killed run left in its groups, knowing them to be its own; a pid looked up
/// here could be of another pid namespace sharing this hierarchy).
pub fn sweep(machine: &Machine) -> Vec<PathBuf> {
    let me = nix::unistd::geteuid();
    sweep_in(&parents(machine), (!me.is_root()).then_some(me.as_raw()))
}

fn sweep_in(parents: &[PathBuf], only_uid: Option<u32>) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mut removed = Vec::new();
    for parent in parents {
        let Ok(entries) = std::fs::read_dir(parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some((pid, start)) = name.to_str().and_then(owner_of) else {
                continue;
            };
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_dir() || only_uid.is_some_and(|uid| meta.uid() != uid) {
                continue;
            }
            if process_alive(pid, start) {
                continue;
            }
            let dir = entry.path();
            match std::fs::remove_dir(&dir) {
                Ok(()) => removed.push(dir),
                // Another run swept it first.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::debug!(group = %dir.display(), error = %e, "a dead run's group was left (not empty, or not ours to remove)")
                }
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 /inner /sys/fs/cgroup/pids ro,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn the_start_time_is_counted_after_the_last_parenthesis() {
        let stat = "4242 (a) (b c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 \
                    1000 10";
        assert_eq!(start_time(stat), Some(987654));
        assert_eq!(start_time("1 (x) S 1"), None);
        let tag = process_tag();
        assert!(
            tag.starts_with(&format!("{}-", std::process::id())),
            "{tag}"
        );
    }

    /// A group a killed run left with this process's pid (its record in another project's
    /// journal, so nothing removed it) is not in this run's way: with names of the pid
    /// alone, the run failed with "creating the group: File exists".
    #[test]
    fn a_group_left_with_this_pid_does_not_stop_a_run() {
        let machine = probe();
        let Some(parent) = machine
            .v1
            .iter()
            .find(|p| p.controller == Controller::Pids)
            .map(|p| p.dir.clone())
        else {
            return sandbox_testkit::skip(
                "limits-unprivileged-cgroup",
                "no writable cgroup v1 pids group here (as root it is)",
            );
        };
        let left: Vec<PathBuf> = (0..4)
            .map(|n| parent.join(format!("sandbox-{}-{n}", std::process::id())))
            .collect();
        for dir in &left {
            std::fs::create_dir(dir).unwrap();
        }
        let limits = sandbox_policy::Limits {
            pids: Some(sandbox_policy::Limit {
                value: 64,
                source: sandbox_policy::LimitSource::Flag,
            }),
            ..sandbox_policy::Limits::default()
        };
        let plan = limits::plan(&limits, &machine);
        let made = RunGroups::create(&plan, &machine, None);
        for dir in &left {
            std::fs::remove_dir(dir).unwrap();
        }
        let made = made.unwrap();
        assert_eq!(made.dirs().count(), 1);
    }

    #[test]
    fn a_groups_owner_is_read_from_its_name() {
        assert_eq!(owner_of("sandbox-42-987654-3"), Some((42, 987654)));
        assert_eq!(owner_of("sandbox-supervisor-42-987654"), Some((42, 987654)));
        for other in [
            "sandbox-42-3",
            "sandbox-supervisor-42",
            "sandbox-42-987654-3-1",
            "sandbox-a-1-2",
            "sandbox--1-2",
            "user.slice",
            "sandbox-supervisor-42-1-2",
        ] {
            assert_eq!(owner_of(other), None, "{other}");
        }
    }

    /// The sweep on plain directories standing for a hierarchy's groups (the kernel's side is
    /// the CLI's `limits::` tests): a dead owner's empty group goes, whatever journal named it;
    /// a live owner's stays (this process, and the pid with another start time is dead); other
    /// names stay; a group with something in it stays; as a user, another user's stays.
    #[test]
    fn the_sweep_removes_only_dead_owners_empty_groups() {
        let root = tempfile::tempdir().unwrap();
        let parent = root.path().join("pids");
        std::fs::create_dir(&parent).unwrap();
        let me = std::process::id();
        let start: u64 = process_tag().rsplit('-').next().unwrap().parse().unwrap();
        // A pid no process has: above the kernel's largest pid_max.
        let dead = 4_194_305u32;
        let mk = |name: String| {
            let dir = parent.join(name);
            std::fs::create_dir(&dir).unwrap();
            dir
        };
        let live = mk(format!("sandbox-{me}-{start}-0"));
        let live_leaf = mk(format!("sandbox-supervisor-{me}-{start}"));
        let reused = mk(format!("sandbox-{me}-{}-0", start + 1));
        let gone = mk(format!("sandbox-{dead}-5-1"));
        let gone_leaf = mk(format!("sandbox-supervisor-{dead}-5"));
        let busy = mk(format!("sandbox-{dead}-5-2"));
        std::fs::write(busy.join("cgroup.procs"), "1\n").unwrap();
        let old = mk(format!("sandbox-{dead}-2"));
        let other = mk("user.slice".into());

        let uid = nix::unistd::geteuid().as_raw();
        assert!(
            sweep_in(std::slice::from_ref(&parent), Some(uid.wrapping_add(1))).is_empty(),
            "another user's groups are not a user's to remove"
        );
        let mut removed = sweep_in(std::slice::from_ref(&parent), Some(uid));
        removed.sort();
        let mut want = vec![reused, gone, gone_leaf];
        want.sort();
        assert_eq!(removed, want);
        for kept in [live, live_leaf, busy, old, other] {
            assert!(kept.is_dir(), "{} was kept", kept.display());
        }
    }

    #[test]
    fn the_probe_reads_mounts_and_own_groups() {
        let mounts = parse_mountinfo(MOUNTINFO);
        assert_eq!(mounts.len(), 4, "{mounts:?}");
        assert!(mounts[3].v2);
        assert_eq!(mounts[1].controllers, vec!["rw", "memory"]);
        assert!(mounts[2].read_only);
        let own = parse_proc_cgroup("9:name=systemd:/\n4:memory:/api/b2\n8:pids:/inner/x\n0::/\n");
        assert_eq!(own[1], (vec!["memory".to_string()], "/api/b2".to_string()));
        assert_eq!(own[3], (Vec::new(), "/".to_string()));
        assert_eq!(
            group_dir(&mounts[1], "/api/b2"),
            Some(PathBuf::from("/sys/fs/cgroup/memory/api/b2"))
        );
        assert_eq!(
            group_dir(&mounts[2], "/inner/x"),
            Some(PathBuf::from("/sys/fs/cgroup/pids/x"))
        );
        assert_eq!(group_dir(&mounts[2], "/elsewhere"), None);
        assert_eq!(
            group_dir(&mounts[3], "/"),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let err = probe_v1(&mounts, &own, Controller::Pids).unwrap_err();
        assert!(err.contains("not writable"), "{err}");
        assert_eq!(unescape("/a\\040b"), "/a b");
    }

    /// The v2 decisions on a group's files (the kernel's own behaviour is guest-test's limits
    /// part, on a real delegated hierarchy): controllers enabled below the group, a scope
    /// this process is alone in (vacated first), one shared with others (refused, naming the
    /// scope), and the leaf a run moved this process into (its parent is the group).
    #[test]
    fn the_v2_probe_vacates_only_a_group_this_process_is_alone_in() {
        let root = tempfile::tempdir().unwrap();
        let mount = CgroupMount {
            mount_point: root.path().to_path_buf(),
            root: "/".into(),
            v2: true,
            controllers: Vec::new(),
            read_only: false,
        };
        let scope = root.path().join("app.slice/run-1.scope");
        std::fs::create_dir_all(&scope).unwrap();
        let me = std::process::id().to_string();
        let write =
            |dir: &Path, file: &str, text: &str| std::fs::write(dir.join(file), text).unwrap();
        write(&scope, "cgroup.controllers", "cpuset cpu io memory pids\n");
        write(&scope, "cgroup.subtree_control", "");
        write(&scope, "cgroup.procs", &format!("{me}\n"));
        let probe = |path: &str| {
            let mut machine = Machine::default();
            probe_v2(
                std::slice::from_ref(&mount),
                &[(Vec::new(), path.to_string())],
                &mut machine,
            );
            machine
        };
        let alone = probe("/app.slice/run-1.scope");
        let v2 = alone.v2.expect("a scope of its own is used");
        assert!(v2.vacate);
        assert_eq!(v2.dir, scope);
        assert_eq!(
            v2.enabled,
            vec![Controller::Cpu, Controller::Memory, Controller::Pids]
        );

        write(&scope, "cgroup.procs", &format!("{me}\n1\n"));
        let shared = probe("/app.slice/run-1.scope");
        assert!(shared.v2.is_none());
        assert!(
            shared.v2_why_not.contains("other processes are in it")
                && shared.v2_why_not.contains("systemd-run --user --scope"),
            "{}",
            shared.v2_why_not
        );

        write(&scope, "cgroup.subtree_control", "memory pids\n");
        let leaf = scope.join(leaf_name());
        std::fs::create_dir(&leaf).unwrap();
        write(&leaf, "cgroup.procs", &format!("{me}\n"));
        write(&leaf, "cgroup.controllers", "memory pids\n");
        write(&leaf, "cgroup.subtree_control", "");
        let moved = probe(&format!("/app.slice/run-1.scope/{}", leaf_name()));
        let v2 = moved.v2.expect("the leaf's parent is the group");
        assert!(v2.vacate, "held as vacated");
        assert_eq!(v2.dir, scope);
        assert_eq!(v2.enabled, vec![Controller::Memory, Controller::Pids]);
    }
}
