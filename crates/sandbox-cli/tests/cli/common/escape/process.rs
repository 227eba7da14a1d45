//! The `process` family: reaching processes outside (signals, ptrace, their environment,
//! their terminal, the keyring).

use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use super::fixture::{rand_suffix, unique, DAEMON, NATIVE_NOUSERNS};
use super::harness::{judge, Attack, Verdict, MARK};

/// Reaching processes outside: signals, ptrace, their environment, their terminal, the keyring.
pub(super) fn process_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "read another process's environment from /proc",
            needs: None,
            run: |f, b| {
                let secret = "sandbox-test-environ-secret";
                let mut victim = f.spawn_outside(&["sleep", "30"], &[("VICTIM_SECRET", secret)]);
                let pid = victim.id();
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; cat /proc/{pid}/environ | tr '\\0' '\\n'"),
                );
                let _ = victim.kill();
                let _ = victim.wait();
                judge(
                    &out,
                    String::from_utf8_lossy(&out.stdout).contains(secret),
                    "environ read",
                )
            },
        },
        Attack {
            name: "kill a process outside the sandbox",
            needs: None,
            run: |f, b| {
                let mut victim = f.spawn_outside(&["sleep", "30"], &[]);
                let pid = victim.id() as i32;
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; kill -9 {pid} && echo signal-sent"),
                );
                let dead = victim_died(&mut victim, &out, "signal-sent");
                judge(&out, dead, "victim killed")
            },
        },
        Attack {
            name: "ptrace a process outside and kill it through the tracer",
            needs: Some("/usr/bin/python3"),
            run: |f, b| {
                if let Some(why) = ptrace_unavailable() {
                    return Verdict::Skipped("ptrace", why);
                }
                let mut victim = f.spawn_outside(&["sleep", "30"], &[]);
                let pid = victim.id();
                // PTRACE_ATTACH, wait for the stop, then PTRACE_CONT delivering SIGKILL: a kill
                // that goes through ptrace access, not through kill(2).
                let script = format!(
                    "echo {MARK}; /usr/bin/python3 -c \"import ctypes,os\n\
                     c=ctypes.CDLL(None,use_errno=True)\n\
                     c.ptrace.argtypes=[ctypes.c_long,ctypes.c_long,ctypes.c_void_p,ctypes.c_void_p]\n\
                     if c.ptrace(16,{pid},None,None)!=0: raise SystemExit('attach: '+os.strerror(ctypes.get_errno()))\n\
                     os.waitpid({pid},0)\n\
                     c.ptrace(7,{pid},None,9)\n\
                     print('traced-and-killed')\""
                );
                let out = f.run(b, &[], &script);
                let dead = victim_died(&mut victim, &out, "traced-and-killed");
                judge(&out, dead, "victim killed through ptrace")
            },
        },
        Attack {
            name: "push keystrokes into the terminal (TIOCSTI)",
            needs: Some("/usr/bin/python3"),
            run: |f, b| {
                if b.ends_with(DAEMON) {
                    return Verdict::Skipped(
                        "box-exec-no-terminal",
                        "box.exec gives a command no terminal, so there is none to push \
                         keystrokes into"
                            .into(),
                    );
                }
                let pty = nix::pty::openpty(None, None).unwrap();
                let script = format!(
                    "echo {MARK}; /usr/bin/python3 -c \"import fcntl,termios\nfor c in b'id\\n': fcntl.ioctl(0, termios.TIOCSTI, bytes([c]))\""
                );
                let out = f.run_with(b, &[], &script, Stdio::from(pty.slave.try_clone().unwrap()));
                // From outside: was anything queued as *input* on the terminal?
                let queued = pending_input(&pty.slave);
                judge(&out, queued > 0, "keystrokes injected")
            },
        },
        Attack {
            name: TIOCSETD_ATTACK,
            needs: Some("/usr/bin/python3"),
            run: |f, b| {
                if b.ends_with(DAEMON) {
                    return Verdict::Skipped(
                        "box-exec-no-terminal",
                        "box.exec gives a command no terminal, so there is none to change".into(),
                    );
                }
                let pty = nix::pty::openpty(None, None).unwrap();
                // A discipline other than N_TTY that this kernel has registered (no module
                // is loaded for it), so the change shows from outside; else N_TTY again,
                // and only the attacker's word shows the call went through.
                let disc = other_line_discipline().unwrap_or(0);
                let script = format!(
                    "echo {MARK}; /usr/bin/python3 -c \"import fcntl,termios,struct\n\
                     fcntl.ioctl(0, termios.TIOCSETD, struct.pack('i', {disc}))\n\
                     print('discipline-set')\""
                );
                let out = f.run_with(b, &[], &script, Stdio::from(pty.slave.try_clone().unwrap()));
                let now = line_discipline(&pty.slave);
                let said = String::from_utf8_lossy(&out.stdout).contains("discipline-set");
                judge(
                    &out,
                    now != 0 || said,
                    &format!("line discipline of the terminal set to {disc} (now {now})"),
                )
            },
        },
        Attack {
            name: "read a key from the user's keyring (@u)",
            needs: Some("/usr/bin/keyctl"),
            run: |f, b| {
                // The user keyring is shared by every process of the uid, whatever session
                // keyring a process has; `sandbox run` may start the command in a new one.
                if b == NATIVE_NOUSERNS {
                    // Each user namespace has its own user keyrings, and this column's
                    // harness is one: it would hide the key, not the sandbox. (On a host
                    // without user namespaces the command shares the user's keyring, as in
                    // the native column.)
                    return Verdict::Skipped(
                        "userns-own-keyring",
                        "the column's own user namespace has its own user keyring".into(),
                    );
                }
                let name = format!("sandbox-test-key-{}-{}", std::process::id(), unique());
                let secret = format!("sandbox-keyring-secret-{}", rand_suffix());
                let added = Command::new("keyctl")
                    .args(["add", "user", &name, &secret, "@u"])
                    .output()
                    .unwrap();
                if !added.status.success() {
                    return Verdict::Skipped(
                        "keyctl",
                        format!(
                            "keyctl add refused outside the sandbox: {}",
                            crate::common::text(&added)
                        ),
                    );
                }
                let id = String::from_utf8_lossy(&added.stdout).trim().to_string();
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; id=$(keyctl search @u user {name}) && keyctl print \"$id\"; \
                         keyctl print %user:{name}"
                    ),
                );
                let _ = Command::new("keyctl").args(["unlink", &id, "@u"]).output();
                judge(
                    &out,
                    String::from_utf8_lossy(&out.stdout).contains(&secret),
                    "key read from the user keyring",
                )
            },
        },
    ]
}

/// The line-discipline attack's name. TIOCSETD needs no capability and the new session does
/// not stop it (the terminal is not the run's controlling one): the control must let it
/// through as root and as any other user.
const TIOCSETD_ATTACK: &str = "set a line discipline on the terminal (TIOCSETD)";

/// A registered line discipline other than N_TTY (`/proc/tty/ldiscs`: `name number`).
fn other_line_discipline() -> Option<i32> {
    let text = std::fs::read_to_string("/proc/tty/ldiscs").ok()?;
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<i32>().ok())
        .find(|n| *n != 0)
}

/// The terminal's line discipline (TIOCGETD), -1 if it cannot be read.
fn line_discipline(tty: &OwnedFd) -> i32 {
    let mut disc: libc::c_int = -1;
    // SAFETY: TIOCGETD writes one int to the pointed-to stack value.
    unsafe { libc::ioctl(tty.as_raw_fd(), libc::TIOCGETD, &mut disc) };
    disc
}

/// Bytes waiting in a terminal's input queue (FIONREAD on the slave).
fn pending_input(slave: &OwnedFd) -> i32 {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int to the pointed-to stack value.
    unsafe { libc::ioctl(slave.as_raw_fd(), libc::FIONREAD, &mut n) };
    n
}

/// Whether `victim` died, then reaps it either way. The attacker's own word (`sign` on its
/// stdout) only decides how long to wait: a delivered SIGKILL can take a moment to show on a
/// loaded machine. The verdict is the victim's state.
fn victim_died(victim: &mut Child, out: &Output, sign: &str) -> bool {
    let patience = if String::from_utf8_lossy(&out.stdout).contains(sign) {
        Duration::from_secs(5)
    } else {
        Duration::from_millis(100)
    };
    let deadline = std::time::Instant::now() + patience;
    let dead = loop {
        if victim.try_wait().unwrap().is_some() {
            break true;
        }
        if std::time::Instant::now() >= deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = victim.kill();
    let _ = victim.wait();
    dead
}

/// Why the host control could not ptrace a sibling here (Yama), if so: then the attack
/// proves nothing on this machine.
fn ptrace_unavailable() -> Option<String> {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok()?;
    match scope.trim() {
        "0" => None,
        "3" => Some("Yama ptrace_scope is 3: no process may ptrace here".into()),
        s if !nix::unistd::geteuid().is_root() => Some(format!(
            "Yama ptrace_scope is {s}: an unprivileged test cannot ptrace a non-descendant"
        )),
        _ => None,
    }
}
