//! The `device` family: the host's terminals and device nodes, and file modes the host would
//! honour (setuid).

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use super::harness::{judge, Attack, MARK};

/// Changing a host device node's mode needs its owner (root) outside the sandbox.
pub const TERMINAL_DEVICE_MODE: &str = "chmod a host device node (/dev/null)";

/// A file's ctime, in nanoseconds: every chmod changes it, even to the same mode.
fn ctime(path: &Path) -> i128 {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap();
    i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec())
}

/// What a pty master has to read now, without waiting.
fn drain(master: &OwnedFd) -> String {
    let flags = nix::fcntl::fcntl(master.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFL).unwrap();
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(master.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(flags)).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n @ 1..) = nix::unistd::read(master.as_raw_fd(), &mut buf) {
        seen.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&seen).into_owned()
}

/// The host's terminals and device nodes, and file modes the host would honour (setuid).
pub(super) fn device_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "read and write another terminal of the user (/dev/pts/N)",
            needs: None,
            run: |f, b| {
                // Another terminal of the user's (a pty the test holds), with a line typed
                // there and not yet read.
                let pty = nix::pty::openpty(None, None).unwrap();
                let path =
                    std::fs::read_link(format!("/proc/self/fd/{}", pty.slave.as_raw_fd())).unwrap();
                nix::unistd::write(&pty.master, b"typed-secret\n").unwrap();
                let script = format!(
                    "echo {MARK}; IFS= read -r line < {0} && echo \"got=$line\"; \
                     echo pwned-tty > {0}",
                    path.display()
                );
                let out = f.run(b, &[], &script);
                let read = String::from_utf8_lossy(&out.stdout).contains("got=typed-secret");
                let written = drain(&pty.master).contains("pwned-tty");
                judge(
                    &out,
                    read || written,
                    &format!("other terminal: read {read}, written {written}"),
                )
            },
        },
        Attack {
            name: TERMINAL_DEVICE_MODE,
            needs: None,
            run: |f, b| {
                // chmod to the mode it has: the host's node is left as it was, but its ctime
                // shows that the change went through.
                let before = ctime(Path::new("/dev/null"));
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; chmod \"$(stat -c %a /dev/null)\" /dev/null"),
                );
                let changed = ctime(Path::new("/dev/null")) != before;
                judge(&out, changed, "the host's /dev/null was chmod-ed")
            },
        },
        Attack {
            name: "leave a setuid binary in the worktree",
            needs: None,
            run: |f, b| {
                let planted = f.task.join("suid-sh");
                let created = f.task.join("suid-created");
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; cp /bin/sh ./suid-sh; chmod 4755 ./suid-sh; \
                         /usr/bin/python3 -c 'import os; os.close(os.open(\"suid-created\", \
                         os.O_CREAT | os.O_WRONLY, 0o6755))'"
                    ),
                );
                let setid = |p: &Path| {
                    std::fs::metadata(p).is_ok_and(|m| {
                        std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o6000 != 0
                    })
                };
                judge(
                    &out,
                    setid(&planted) || setid(&created),
                    "a setuid/setgid file was left in the worktree",
                )
            },
        },
    ]
}
