//! The `killed` family: what a SIGKILLed `sandbox run` must not leave behind (a process, a
//! rewritten git pointer).

use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, Stdio};
use std::time::Duration;

use super::fixture::{rand_suffix, unique, Fixture, DAEMON, NATIVE_NOUSERNS, NOUSERNS_WRAPPER};
use super::harness::{Attack, Verdict, MARK};
use crate::common::{pids_running, EXECED_FN};

/// The killed-supervisor rows (docs/security.md, "Processes and a killed sandbox").
pub const OUTLIVES_KILLED_SANDBOX: &str =
    "leave a process (setsid) that outlives a SIGKILLed sandbox";
pub const POINTER_THEN_KILLED: &str =
    "rewrite a git pointer and get SIGKILLed before the check, then run again";

/// `sandbox run --backend B -- sh -c SCRIPT` with piped stdio, for the rows that kill it.
fn spawn_run(f: &Fixture, b: &str, script: &str) -> Child {
    let (mut cmd, backend) = if b == NATIVE_NOUSERNS {
        (f.env.cmd_under(&NOUSERNS_WRAPPER), "native")
    } else {
        (f.env.cmd(), b)
    };
    cmd.current_dir(&f.task)
        .args(["run", "--backend", backend, "--", "sh", "-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Reads one line of `child`'s stdout: the attacker's "ready".
fn first_line(child: &mut Child) -> String {
    let mut line = String::new();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let _ = std::io::BufRead::read_line(&mut stdout, &mut line);
    line.trim().to_string()
}

/// SIGKILLs `sandbox` (the wrapper of native-nouserns execs it: the pid is sandbox's own)
/// and reaps it.
fn kill_sandbox(child: &mut Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = child.wait();
}

/// Waits for `pid` to exit, on its pidfd (an event, bounded by `within`): true when it did.
pub fn exits_within(pid: i32, within: Duration) -> bool {
    // SAFETY: pidfd_open(2) with a pid and no flags; the fd is owned below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return true; // already gone
    }
    // SAFETY: a fresh descriptor owned by nothing else.
    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
    let mut poll = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) on one pollfd of ours.
    let ready = unsafe { libc::poll(&mut poll, 1, within.as_millis() as i32) };
    ready == 1 || !sandbox_testkit::alive(pid)
}

pub(super) fn killed_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: OUTLIVES_KILLED_SANDBOX,
            needs: None,
            run: |f, b| {
                if b.ends_with(DAEMON) {
                    return Verdict::Skipped(
                        "daemon-is-not-killed",
                        "the attack is a SIGKILL of `sandbox run` (the daemon's commands use \
                         the same pid namespace: service::daemon_killed_with_sigkill_mid_exec_leaves_no_process)"
                            .into(),
                    );
                }
                let arg = format!("3000.{}{}", unique(), rand_suffix() % 1000);
                let mut child = spawn_run(
                    f,
                    b,
                    &format!(
                        "{EXECED_FN}; setsid sleep {arg} </dev/null >/dev/null 2>&1 & \
                         execed sleep $!; echo {MARK}; read line"
                    ),
                );
                if first_line(&mut child) != MARK {
                    kill_sandbox(&mut child);
                    return Verdict::NotRun("the run did not start its child".into());
                }
                // The child exists before sandbox is killed: the mark waited for its exec.
                let before = pids_running(&["sleep", &arg]);
                kill_sandbox(&mut child);
                if before.is_empty() {
                    return Verdict::NotRun(format!("no `sleep {arg}` was found running"));
                }
                let survivors: Vec<i32> = before
                    .into_iter()
                    .filter(|pid| !exits_within(*pid, Duration::from_secs(5)))
                    .collect();
                for pid in &survivors {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(*pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                if survivors.is_empty() {
                    Verdict::Blocked
                } else {
                    Verdict::Escaped(format!("still running after sandbox died: {survivors:?}"))
                }
            },
        },
        Attack {
            name: POINTER_THEN_KILLED,
            needs: None,
            run: |f, b| {
                if b.ends_with(DAEMON) {
                    return Verdict::Skipped(
                        "daemon-is-not-killed",
                        "the attack is a SIGKILL of `sandbox run` before its check".into(),
                    );
                }
                let pointer = f.task.join(".git");
                let original = std::fs::read_to_string(&pointer).unwrap();
                let evil = f.outside.join("evil-gitdir");
                let mut child = spawn_run(
                    f,
                    b,
                    &format!(
                        "printf 'gitdir: {}\\n' > .git; echo {MARK}; read line",
                        evil.display()
                    ),
                );
                let line = first_line(&mut child);
                kill_sandbox(&mut child);
                if line != MARK {
                    return Verdict::NotRun(format!("the first run printed {line:?}"));
                }
                if std::fs::read_to_string(&pointer).unwrap() == original {
                    return Verdict::Blocked;
                }
                // The next run in the worktree: it must do the killed run's check first.
                let report = f.env.path().join(format!("report-{}.json", unique()));
                let flags = vec!["--report-json".to_string(), report.display().to_string()];
                let out = f.run(b, &flags, &format!("echo {MARK}"));
                let restored = std::fs::read_to_string(&pointer).unwrap() == original;
                let reported = std::fs::read_to_string(&report).is_ok_and(|r| {
                    let r: serde_json::Value = serde_json::from_str(&r).unwrap();
                    r["recovered"][0]["tampering"][0]["restored"] == true
                }) && crate::common::text(&out)
                    .contains("was killed before its after-run checks");
                match (restored, reported) {
                    (true, true) => Verdict::Repaired,
                    (true, false) => Verdict::Escaped(format!(
                        "restored but not reported: {}",
                        crate::common::text(&out)
                    )),
                    _ => {
                        let _ = std::fs::write(&pointer, &original);
                        Verdict::Escaped("the next run kept the pointer".into())
                    }
                }
            },
        },
    ]
}
