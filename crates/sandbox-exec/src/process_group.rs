//! Whole-group termination and orphan cleanup: no descendant survives a finished run.
//!
//! Every child is a session and process-group leader (`setsid` before exec), so one `killpg`
//! reaches everything that stayed in the group. A descendant that calls `setsid` itself leaves
//! the group; for that case the owning process can become a *child subreaper*
//! ([`become_subreaper`]), so such orphans are re-parented to it and [`kill_orphans`] finds them.

use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

/// Default time between SIGTERM and SIGKILL.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(2);

/// Returns true while any live (non-zombie) process is still in group `pgid`.
///
/// `killpg(pgid, 0)` alone also counts zombies, which a subreaper collects only later; so
/// when it says "something is there", `/proc` is consulted to see whether that something is
/// still running. The common case (empty group) costs one syscall.
pub fn group_alive(pgid: Pid) -> bool {
    if matches!(killpg(pgid, None), Err(Errno::ESRCH)) {
        return false;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    let want = pgid.as_raw().to_string();
    entries.flatten().any(|entry| {
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            return false;
        };
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            return false;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            return false;
        };
        // Fields after "(comm)": state ppid pgrp …
        let mut fields = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest)
            .unwrap_or("")
            .split_whitespace();
        let state = fields.next();
        let pgrp = fields.nth(1);
        state != Some("Z") && state != Some("X") && pgrp == Some(want.as_str())
    })
}

/// Sends `signal` to the group, ignoring "no such group".
pub fn signal_group(pgid: Pid, signal: Signal) {
    match killpg(pgid, signal) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => tracing::debug!(%pgid, ?signal, error = %e, "killpg failed"),
    }
}

/// SIGTERM, wait up to `grace` for the group to empty, then SIGKILL. Blocking; returns when
/// the group is gone or after SIGKILL was sent. Zombies that are our own children are reaped
/// while waiting so that they do not keep the group "alive".
pub fn terminate_group_blocking(pgid: Pid, grace: Duration) {
    if !group_alive(pgid) {
        return;
    }
    signal_group(pgid, Signal::SIGCONT);
    signal_group(pgid, Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !group_alive(pgid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    signal_group(pgid, Signal::SIGKILL);
}

/// Async form of [`terminate_group_blocking`] for callers inside a tokio runtime.
pub async fn terminate_group(pgid: Pid, grace: Duration) {
    if !group_alive(pgid) {
        return;
    }
    signal_group(pgid, Signal::SIGCONT);
    signal_group(pgid, Signal::SIGTERM);
    let deadline = tokio::time::Instant::now() + grace;
    while tokio::time::Instant::now() < deadline {
        if !group_alive(pgid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    signal_group(pgid, Signal::SIGKILL);
}

/// Makes the calling process a child subreaper (`PR_SET_CHILD_SUBREAPER`): descendants
/// orphaned by their parents are re-parented here instead of to init, so they can be found
/// and killed when the run ends. Linux only; a no-op elsewhere.
pub fn become_subreaper() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        crate::sys::set_child_subreaper()?;
    }
    Ok(())
}

/// The pids of this process's current children (all threads), from
/// `/proc/self/task/*/children`.
pub fn child_pids() -> Vec<Pid> {
    let mut pids = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return pids;
    };
    for task in tasks.flatten() {
        let Ok(text) = std::fs::read_to_string(task.path().join("children")) else {
            continue;
        };
        pids.extend(
            text.split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
                .map(Pid::from_raw),
        );
    }
    pids
}

/// Kills every child of this process except `except` (and their groups), then reaps them.
/// Repeats until none are left (their own orphans re-parent to us as they die), bounded to a
/// few rounds. Only for a process that owns one run at a time (the CLI, after its run ended):
/// it waits for children by pid, which would steal the exit status of a concurrent run.
pub fn kill_orphans(except: &[Pid]) {
    for _round in 0..20 {
        let orphans: Vec<Pid> = child_pids()
            .into_iter()
            .filter(|p| !except.contains(p))
            .collect();
        if orphans.is_empty() {
            return;
        }
        for pid in &orphans {
            tracing::debug!(%pid, "killing orphaned descendant");
            // The orphan may lead its own group (it called setsid); kill that group too.
            signal_group(*pid, Signal::SIGKILL);
            let _ = nix::sys::signal::kill(*pid, Signal::SIGKILL);
        }
        for pid in &orphans {
            let _ = waitpid(*pid, None);
        }
    }
}
