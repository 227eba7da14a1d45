//! The `store` family: the git store (objects, other branches, refs, alternates) and what
//! the user's git reads from it.

use std::process::{Output, Stdio};

use super::fixture::{git, host_git, rev_parse, unique, DAEMON, NATIVE_NOUSERNS, NOUSERNS_WRAPPER};
use super::harness::{judge, ran, Attack, Verdict, MARK};

/// Rows of the git store quarantine, also named in `escape.rs` (no quarantine, no hold).
pub const REPLACE_OBJECT: &str =
    "git replace a blob of trunk, so the host reads the agent's content";
pub const SHADOW_REF: &str = "shadow trunk by a new tag of the same name";
pub const HEAD_ON_A_FUTURE_BRANCH: &str =
    "leave HEAD on a branch that does not exist yet, moved once the user creates it";
pub const HEAD_PARKED_THEN_KILLED: &str =
    "park HEAD on trunk and get SIGKILLed before the check, then move trunk in the next run";

/// The git store: objects, other branches, refs, alternates.
pub(super) fn store_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "rewrite an existing blob of trunk",
            needs: None,
            run: |f, b| {
                // Another object's bytes in place of README's blob: the host's next checkout
                // of trunk would write them without a word.
                let blob = rev_parse(f, "trunk:README");
                let other = rev_parse(f, "trunk:hello.c");
                let path = |oid: &str| f.common.join("objects").join(&oid[..2]).join(&oid[2..]);
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; chmod u+w '{0}'; cat '{1}' > '{0}'",
                        path(&blob).display(),
                        path(&other).display()
                    ),
                );
                let now = host_git(&f.main, &["cat-file", "blob", &blob]);
                judge(
                    &out,
                    !now.status.success() || now.stdout != b"hello\n",
                    "trunk's README blob changed",
                )
            },
        },
        Attack {
            name: "move trunk (update-ref, and by writing its file)",
            needs: None,
            run: |f, b| {
                let before = rev_parse(f, "trunk");
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; git commit -q --allow-empty -m evil; \
                         git update-ref refs/heads/trunk HEAD; git rev-parse HEAD > '{0}'",
                        f.common.join("refs/heads/trunk").display()
                    ),
                );
                judge(&out, rev_parse(f, "trunk") != before, "trunk moved")
            },
        },
        Attack {
            name: "delete trunk",
            needs: None,
            run: |f, b| {
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; git update-ref -d refs/heads/trunk; rm -f '{}'",
                        f.common.join("refs/heads/trunk").display()
                    ),
                );
                let gone = !host_git(
                    &f.main,
                    &["rev-parse", "--verify", "-q", "refs/heads/trunk"],
                )
                .status
                .success();
                judge(&out, gone, "trunk deleted")
            },
        },
        Attack {
            name: "rewrite packed-refs to move a packed trunk",
            needs: None,
            run: |f, b| {
                git(&f.main, &["pack-refs", "--all"]);
                let packed = f.common.join("packed-refs");
                let before = std::fs::read_to_string(&packed).unwrap();
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; git commit -q --allow-empty -m evil; \
                         printf '%s refs/heads/trunk\\n' \"$(git rev-parse HEAD)\" > '{0}'",
                        packed.display()
                    ),
                );
                let after = std::fs::read_to_string(&packed).unwrap_or_default();
                judge(&out, after != before, "packed-refs rewritten")
            },
        },
        Attack {
            name: "add objects/info/alternates pointing outside",
            needs: None,
            run: |f, b| {
                let alternates = f.common.join("objects/info/alternates");
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; mkdir -p '{0}'; echo '{1}' > '{0}/alternates'",
                        alternates.parent().unwrap().display(),
                        f.outside.display()
                    ),
                );
                judge(&out, alternates.exists(), "alternates added")
            },
        },
        Attack {
            name: "move another task's branch",
            needs: None,
            run: |f, b| {
                f.other_task();
                let before = rev_parse(f, "other");
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; git commit -q --allow-empty -m evil; \
                         git update-ref refs/heads/other HEAD; git branch -f other HEAD"
                    ),
                );
                judge(
                    &out,
                    rev_parse(f, "other") != before,
                    "the other task's branch moved",
                )
            },
        },
        Attack {
            name: REPLACE_OBJECT,
            needs: None,
            run: |f, b| {
                // trunk never moves, yet every reader on the host sees the agent's README.
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; git replace \"$(git rev-parse trunk:README)\" \
                         \"$(echo evil | git hash-object -w --stdin)\""
                    ),
                );
                let now = host_git(&f.main, &["show", "trunk:README"]);
                judge(
                    &out,
                    now.stdout != b"hello\n",
                    "the host's trunk:README shows the agent's blob (refs/replace)",
                )
            },
        },
        Attack {
            name: SHADOW_REF,
            needs: None,
            run: |f, b| {
                let before = rev_parse(f, "trunk");
                // A tag wins over a branch of the same name (git's lookup order), a branch
                // over a remote-tracking one: `git reset --hard trunk` would take the tag.
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; git commit -q --allow-empty -m evil; git tag trunk HEAD"
                    ),
                );
                judge(
                    &out,
                    rev_parse(f, "trunk") != before,
                    "`trunk` resolves to the agent's new tag on the host",
                )
            },
        },
        Attack {
            name: "switch HEAD to another task's branch, then move it in the next run",
            needs: None,
            run: |f, b| {
                f.other_task();
                let before = rev_parse(f, "other");
                // The next run takes the branch HEAD names for its task branch.
                let first = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; git symbolic-ref HEAD refs/heads/other"),
                );
                if let Err(v) = ran(&first) {
                    return v;
                }
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; git commit -q --allow-empty -m evil"),
                );
                judge(
                    &out,
                    rev_parse(f, "other") != before,
                    "the other task's branch moved in the second run",
                )
            },
        },
        Attack {
            name: HEAD_ON_A_FUTURE_BRANCH,
            needs: None,
            run: |f, b| {
                let first = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; git symbolic-ref HEAD refs/heads/later"),
                );
                if let Err(v) = ran(&first) {
                    return v;
                }
                // The user creates the branch (it does not exist, so the run could name it).
                git(&f.main, &["branch", "later", "trunk"]);
                let before = rev_parse(f, "later");
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; git commit -q --allow-empty -m evil"),
                );
                if refused_at_start(&out) {
                    return Verdict::Blocked;
                }
                judge(
                    &out,
                    rev_parse(f, "later") != before,
                    "the user's new branch moved in the next run",
                )
            },
        },
        Attack {
            name: HEAD_PARKED_THEN_KILLED,
            needs: None,
            run: |f, b| {
                if b.ends_with(DAEMON) {
                    return Verdict::Skipped(
                        "daemon-is-not-killed",
                        "the attack is a SIGKILL of `sandbox run` before its check".into(),
                    );
                }
                let before = rev_parse(f, "trunk");
                // Park HEAD on trunk, then the sandbox is killed outright: no check after it.
                let (mut cmd, backend) = if b == NATIVE_NOUSERNS {
                    (f.env.cmd_under(&NOUSERNS_WRAPPER), "native")
                } else {
                    (f.env.cmd(), b)
                };
                let mut child = cmd
                    .current_dir(&f.task)
                    .args(["run", "--backend", backend, "--", "sh", "-c"])
                    .arg("git symbolic-ref HEAD refs/heads/trunk && echo parked && read line")
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                let mut line = String::new();
                let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
                let _ = std::io::BufRead::read_line(&mut stdout, &mut line);
                if line.trim() != "parked" {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Verdict::NotRun(format!("the first run printed {line:?}"));
                }
                // The wrapper of native-nouserns execs sandbox: the pid is sandbox's own.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(child.id() as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let _ = child.wait();
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; git commit -q --allow-empty -m evil"),
                );
                if refused_at_start(&out) {
                    return Verdict::Blocked;
                }
                judge(
                    &out,
                    rev_parse(f, "trunk") != before,
                    "trunk moved in the run after the killed one",
                )
            },
        },
        Attack {
            name: "link COMMIT_EDITMSG to ~/.bashrc, so the user's commit --amend writes it",
            needs: None,
            run: |f, b| {
                let bashrc = f.home.join(".bashrc");
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; g=$(git rev-parse --git-dir); rm -f \"$g/COMMIT_EDITMSG\"; \
                         ln -s '{}' \"$g/COMMIT_EDITMSG\"",
                        bashrc.display()
                    ),
                );
                // The user's next amend writes its message through the link.
                let _ = host_git(&f.task, &["commit", "-q", "--amend", "--no-edit"]);
                let now = std::fs::read_to_string(&bashrc).unwrap_or_default();
                judge(
                    &out,
                    now != "# original\n",
                    "~/.bashrc now holds a commit message",
                )
            },
        },
        Attack {
            name: "plant config.worktree with core.fsmonitor, run by the user's sparse-checkout",
            needs: None,
            run: |f, b| {
                let mark = f.outside.join(format!("worktree-config-ran-{}", unique()));
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; printf '#!/bin/sh\\ntouch {}\\n' > .fsm && chmod +x .fsm \
                         && printf '[core]\\n\\tfsmonitor = %s/.fsm\\n' \"$PWD\" \
                         > \"$(git rev-parse --git-dir)/config.worktree\"",
                        mark.display()
                    ),
                );
                // Dormant until the user turns per-worktree config on, as sparse-checkout does.
                let _ = host_git(&f.task, &["sparse-checkout", "set", "--no-cone", "/*"]);
                let _ = host_git(&f.task, &["status", "--short"]);
                judge(
                    &out,
                    mark.exists(),
                    "the user's git status ran the fsmonitor",
                )
            },
        },
        Attack {
            name: "stop a rebase before an exec line, run by the user's rebase --continue",
            needs: None,
            run: |f, b| {
                let mark = f.outside.join(format!("rebase-exec-ran-{}", unique()));
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; printf '#!/bin/sh\\nprintf \"break\\\\nexec touch {}\\\\n\" \
                         > \"$1\"\\n' > .ed && chmod +x .ed && \
                         GIT_SEQUENCE_EDITOR=\"$PWD/.ed\" git rebase -q -i HEAD; \
                         cat \"$(git rev-parse --git-dir)/rebase-merge/git-rebase-todo\"",
                        mark.display()
                    ),
                );
                let _ = host_git(&f.task, &["rebase", "--continue"]);
                judge(
                    &out,
                    mark.exists(),
                    "the user's rebase --continue ran the exec line",
                )
            },
        },
        Attack {
            name: "hide an edit from the user's git status with skip-worktree",
            needs: None,
            run: |f, b| {
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; echo evil >> README; git update-index --skip-worktree README"
                    ),
                );
                let status = host_git(&f.task, &["status", "--porcelain"]);
                let hidden = status.stdout.is_empty()
                    && std::fs::read_to_string(f.task.join("README")).unwrap_or_default()
                        != "hello\n";
                // Reporting it is not enough (stderr is the agent's to read): the bit must be
                // gone, so that the user's own git status shows the edit.
                judge(&out, hidden, "git status shows nothing of the edit")
            },
        },
        Attack {
            name: "stage a gitlink into <gitdir>/modules, so the user's git status runs its config",
            needs: None,
            run: |f, b| {
                let n = unique();
                let mark = f.outside.join(format!("gitdir-modules-ran-{n}"));
                let sub = format!("sub-{n}");
                // git's own layout for a linked worktree's submodules, in the git dir the
                // run writes: `.git` is a pointer, the repository lies in <gitdir>/modules.
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; g=$(git rev-parse --absolute-git-dir); \
                         mkdir -p {sub} \"$g/modules\" && git init -q --separate-git-dir \"$g/modules/{sub}\" {sub} && \
                         printf '#!/bin/sh\\ntouch {mark}\\n' > \"$g/modules/{sub}/fsm\" && \
                         chmod +x \"$g/modules/{sub}/fsm\" && \
                         git -C {sub} config core.fsmonitor \"$g/modules/{sub}/fsm\" && \
                         git -C {sub} commit -q --allow-empty -m s && \
                         git update-index --add --cacheinfo \
                           160000,$(git -C {sub} rev-parse HEAD),{sub}",
                        mark = mark.display()
                    ),
                );
                if let Err(v) = ran(&out) {
                    return v;
                }
                let _ = host_git(&f.task, &["status", "--short"]);
                judge(
                    &out,
                    mark.exists(),
                    "the user's git status ran the submodule's fsmonitor",
                )
            },
        },
    ]
}

/// Whether the run was refused before its command because `HEAD` names a branch the
/// worktree's runs do not own.
fn refused_at_start(out: &Output) -> bool {
    !String::from_utf8_lossy(&out.stdout).contains(MARK)
        && String::from_utf8_lossy(&out.stderr).contains("git: refusing to run in")
}
