//! The reaping guarantee: when the daemon exits or is killed, every process it started dies.
//!
//! Three layers, each covering what the one before cannot:
//!
//! 1. **Process groups.** Every command leads its own session and group; a finished, killed or
//!    abandoned command takes its whole group with it ([`sandbox_exec::process_group`]).
//! 2. **`PR_SET_PDEATHSIG`.** Commands are spawned from one thread that lives as long as the
//!    daemon (`daemon/spawner.rs`), so the kernel SIGKILLs each command's leader the moment the
//!    daemon dies, whatever killed it.
//! 3. **The supervisor.** `sandbox serve` itself is a small parent process that runs the
//!    daemon as its child and is a *child subreaper*. When the daemon dies, its orphaned
//!    descendants — leaders, the rest of their groups, and processes that escaped their group
//!    with `setsid` — are re-parented to the supervisor, which kills and reaps them all before
//!    it exits. If the supervisor itself is killed, the daemon gets SIGTERM
//!    (`PR_SET_PDEATHSIG`) and shuts down in order, killing everything it started.
//!
//! What remains: SIGKILL to the supervisor *and* the daemon at the same instant (`kill -9` of
//! both). Layer 2 still kills every command leader; descendants of a leader that outlive it
//! are then re-parented to init.

use std::os::unix::process::CommandExt;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use sandbox_exec::process_group;

/// Runs `daemon` as a supervised child and returns its exit code once it and every
/// descendant it left behind are gone. Must be called before any thread is started.
pub fn supervise(mut daemon: std::process::Command) -> std::io::Result<i32> {
    process_group::become_subreaper()?;
    #[cfg(target_os = "linux")]
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and only calls prctl(2) and
    // getppid(2), both async-signal-safe; it touches no memory but its two integer captures.
    unsafe {
        daemon.pre_exec(move || {
            #[cfg(target_os = "linux")]
            {
                // If the supervisor dies, the daemon gets SIGTERM and stops in order.
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGTERM as libc::c_ulong,
                    0,
                    0,
                    0,
                ) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
            }
            Ok(())
        });
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let code = rt.block_on(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut child = tokio::process::Command::from(daemon).spawn()?;
        let pid = child
            .id()
            .map(|id| Pid::from_raw(id as i32))
            .ok_or_else(|| {
                std::io::Error::other("the daemon was reaped before its pid was read")
            })?;
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut hup = signal(SignalKind::hangup())?;
        // Forward stop requests to the daemon, which shuts down in order.
        let status = loop {
            tokio::select! {
                status = child.wait() => break status?,
                _ = term.recv() => { let _ = kill(pid, Signal::SIGTERM); }
                _ = int.recv() => { let _ = kill(pid, Signal::SIGINT); }
                _ = hup.recv() => { let _ = kill(pid, Signal::SIGHUP); }
            }
        };
        Ok::<_, std::io::Error>(status)
    })?;
    drop(rt);
    reap_everything();
    // The daemon's own code, or 128+N if signal N killed it: the one exit rule.
    Ok(sandbox_exec::ExitOutcome::from_status(code).code())
}

/// Kills and reaps every child of this process, repeatedly, until none is left: each kill can
/// re-parent the victim's own children to us, which the next round catches.
pub fn reap_everything() {
    let mut quiet_rounds = 0;
    for _ in 0..1000 {
        if process_group::child_pids().is_empty() {
            quiet_rounds += 1;
            if quiet_rounds >= 2 {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
            continue;
        }
        quiet_rounds = 0;
        process_group::kill_orphans(&[]);
    }
}
