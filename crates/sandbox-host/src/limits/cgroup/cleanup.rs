//! Removing groups: a run's own when it ends (a process left in one is killed first), a
//! killed run's from its journal record, and any dead owner's found by its name.

use super::*;
use sandbox_policy::compile::limits::Machine;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Removes one group: a process still in it (an orphan the daemon could not reap yet, a
/// killed run's survivor) is killed first — the group names exactly the run's processes.
/// True when the group is gone.
pub(super) fn remove(dir: &Path) -> bool {
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
pub(super) fn owner_of(name: &str) -> Option<(u32, u64)> {
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
pub(super) fn parents(machine: &Machine) -> Vec<PathBuf> {
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

pub(super) fn sweep_in(parents: &[PathBuf], only_uid: Option<u32>) -> Vec<PathBuf> {
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
