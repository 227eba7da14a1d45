//! Whole-group termination and orphan cleanup: no descendant survives a finished run.
//!
//! Every child is a session and process-group leader (`setsid` before exec), so one `killpg`
//! reaches everything that stayed in the group. A descendant that calls `setsid` itself leaves
//! the group; for that case the owning process can become a *child subreaper*
//! ([`become_subreaper`]), so such orphans are re-parented to it and [`kill_orphans`] finds them.

use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

/// Default time between SIGTERM and SIGKILL.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(2);

/// Returns true while any process is still in group `pgid`.
pub fn group_alive(pgid: Pid) -> bool {
    !matches!(killpg(pgid, None), Err(Errno::ESRCH))
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
        reap_exited_orphans();
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
        reap_exited_orphans();
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
        // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes one integer argument and touches no
        // memory of ours.
        let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
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

/// Reaps children that have already exited, without blocking and without touching children
/// listed in `keep` (those belong to a runtime that waits for them itself).
fn reap_exited_orphans() {
    // Only orphans re-parented to us are reaped here; the run's own leader is waited for by
    // its owner. We cannot tell them apart by waitpid(-1) without stealing the leader's status,
    // so reap by pid.
    for pid in child_pids() {
        if ORPHAN_GUARD.is_leader(pid) {
            continue;
        }
        let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
    }
}

/// Kills every child of this process except the given run leaders (and their groups), then
/// reaps them. Repeats until none are left (their own orphans re-parent to us as they die),
/// bounded to a few rounds. Used by a single-run owner (the CLI) after its run ended.
pub fn kill_orphans(except: &[Pid]) {
    for _round in 0..20 {
        let orphans: Vec<Pid> = child_pids()
            .into_iter()
            .filter(|p| !except.contains(p) && !ORPHAN_GUARD.is_leader(*p))
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

/// The set of run leaders currently owned by this process, so orphan reaping never steals
/// a leader's exit status from the task that waits for it.
pub(crate) struct LeaderRegistry {
    leaders: std::sync::Mutex<Vec<Pid>>,
}

impl LeaderRegistry {
    pub(crate) fn add(&self, pid: Pid) {
        self.leaders.lock().expect("leader registry").push(pid);
    }
    pub(crate) fn remove(&self, pid: Pid) {
        self.leaders
            .lock()
            .expect("leader registry")
            .retain(|p| *p != pid);
    }
    fn is_leader(&self, pid: Pid) -> bool {
        self.leaders.lock().expect("leader registry").contains(&pid)
    }
}

pub(crate) static ORPHAN_GUARD: LeaderRegistry = LeaderRegistry {
    leaders: std::sync::Mutex::new(Vec::new()),
};
