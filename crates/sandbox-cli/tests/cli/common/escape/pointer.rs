//! The `pointer` family: the git pointers of the worktree and their repair.

use std::path::{Path, PathBuf};
use std::process::Output;

use super::fixture::{host_git, Fixture};
use super::harness::{judge, ran, Attack, Verdict, MARK};

/// The git pointers of the worktree (HEAD, .git, commondir) and their repair.
pub(super) fn pointer_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "re-point another worktree's HEAD in <common>/worktrees",
            needs: None,
            run: |f, b| {
                // Only worktrees/<this one> is writable: a second task's gitdir is not.
                f.other_task();
                let head = f.common.join("worktrees/other-task/HEAD");
                let before = std::fs::read_to_string(&head).unwrap();
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; echo 'ref: refs/heads/trunk' > '{}'",
                        head.display()
                    ),
                );
                let after = std::fs::read_to_string(&head).unwrap();
                judge(&out, after != before, "the other worktree's HEAD changed")
            },
        },
        Attack {
            name: "rewrite the worktree's .git pointer",
            needs: None,
            run: |f, b| {
                let evil = f.task.join("evil-gitdir");
                let script = format!(
                    "echo {MARK}; mkdir -p evil-gitdir/hooks; printf 'gitdir: {}\\n' > .git",
                    evil.display()
                );
                pointer_attack(f, b, &f.task.join(".git"), &script)
            },
        },
        Attack {
            name: "rewrite <gitdir>/commondir",
            needs: None,
            run: |f, b| {
                let pointer = f.common.join("worktrees/task/commondir");
                let script = format!(
                    "echo {MARK}; echo /tmp/evil-common > '{}'",
                    pointer.display()
                );
                pointer_attack(f, b, &pointer, &script)
            },
        },
        Attack {
            name: "make the pointer repair write through a planted symlink",
            needs: None,
            run: |f, b| {
                // The repair after the run used to write `.<name>.sandbox-restore` beside the
                // pointer (following symlinks) and rename it over the pointer. Plant symlinks
                // at those names, and at the unprefixed spelling, pointing at files outside
                // the worktree, then rewrite two pointers so that a repair happens.
                //
                // The judgement has two halves. A victim that changed is the escape this row
                // is about (the host's own repair wrote for the agent). But the host backend
                // repairs nothing, so it can never write through the link: the control would
                // prove nothing. So a pointer left tampered also counts as escaped. Under
                // host the pointers stay rewritten (the control escapes); a backend holds
                // only if both pointers are back *and* both victims are untouched.
                let gitdir = f.common.join("worktrees/task");
                let victims = [
                    f.outside.join("repair-victim-1.txt"),
                    f.outside.join("repair-victim-2.txt"),
                ];
                for v in &victims {
                    std::fs::write(v, "original\n").unwrap();
                }
                let pointers = [f.task.join(".git"), gitdir.join("commondir")];
                let plant = |dir: &Path, name: &str, victim: &Path| {
                    [
                        format!(".{name}.sandbox-restore"),
                        format!("{name}.sandbox-restore"),
                    ]
                    .map(|link| {
                        format!(
                            "ln -s '{}' '{}'; ",
                            victim.display(),
                            dir.join(link).display()
                        )
                    })
                    .concat()
                };
                let script = format!(
                    "echo {MARK}; {}{}printf 'gitdir: /tmp/evil\\n' > .git; echo /tmp/evil-common > '{}'",
                    plant(&f.task, ".git", &victims[0]),
                    plant(&gitdir, "commondir", &victims[1]),
                    pointers[1].display(),
                );
                let before = pointers
                    .each_ref()
                    .map(|p| std::fs::read_to_string(p).unwrap());
                let out = f.run(b, &[], &script);
                if let Err(v) = ran(&out) {
                    return v;
                }
                for v in &victims {
                    let now = std::fs::read_to_string(v).unwrap_or_default();
                    if now != "original\n" {
                        return Verdict::Escaped(format!(
                            "the repair wrote through a planted symlink: {} now {now:?}\n{}",
                            v.display(),
                            crate::common::text(&out)
                        ));
                    }
                }
                pointers_verdict(&out, &pointers, &before)
            },
        },
        Attack {
            name: "replace .git by a directory whose hooks run on the host's next git",
            needs: None,
            run: |f, b| {
                // The agent swaps the `.git` pointer file for a git directory of its own
                // (objects borrowed from the real repository, so it is a valid one) whose
                // config points core.hooksPath at hooks it wrote. It also fills the names the
                // old repair moved a directory aside to (`.git.sandbox-quarantine-<seconds>`)
                // with non-empty directories, so that a predictable move would fail. Judged
                // from outside: after the run the *host* runs git in the worktree; a hook
                // that ran is the escape, and the pointer file must be back.
                let marker = f.outside.join("hook-ran");
                let hooks = f.task.join("evil-hooks");
                let index = f.common.join("worktrees/task/index");
                let script = format!(
                    "echo {MARK}; set -e; mkdir -p '{hooks}'; \
                     printf '#!/bin/sh\\necho pwned > {marker}\\n' > '{hooks}/post-checkout'; \
                     cp '{hooks}/post-checkout' '{hooks}/pre-commit'; \
                     chmod +x '{hooks}/post-checkout' '{hooks}/pre-commit'; \
                     rev=$(git rev-parse HEAD); \
                     mkdir -p .evil/refs/heads .evil/objects/info; \
                     echo '{objects}' > .evil/objects/info/alternates; \
                     echo \"$rev\" > .evil/refs/heads/feature; \
                     echo 'ref: refs/heads/feature' > .evil/HEAD; \
                     cp '{index}' .evil/index; \
                     printf '[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n\\thooksPath = {hooks}\\n' > .evil/config; \
                     now=$(date +%s); for s in $(seq $((now - 2)) $((now + 120))); do \
                       mkdir -p \".git.sandbox-quarantine-$s/x\"; done; \
                     rm .git; mv .evil .git; echo swapped",
                    hooks = hooks.display(),
                    marker = marker.display(),
                    objects = f.common.join("objects").display(),
                    index = index.display(),
                );
                let pointer = f.task.join(".git");
                let before = std::fs::read_to_string(&pointer).unwrap();
                let out = f.run(b, &[], &script);
                if let Err(v) = ran(&out) {
                    return v;
                }
                let host_git = [
                    host_git(&f.task, &["status", "--short"]),
                    host_git(&f.task, &["checkout", "-q", "-b", "after-the-run"]),
                ];
                if marker.exists() {
                    return Verdict::Escaped(format!(
                        "a hook the agent wrote ran in the host's git\n{}\nhost git: {}",
                        crate::common::text(&out),
                        host_git
                            .iter()
                            .map(crate::common::text)
                            .collect::<Vec<_>>()
                            .join("\n")
                    ));
                }
                pointers_verdict(&out, &[pointer], &[before])
            },
        },
    ]
}

/// A git pointer file the sandbox may write: after the run it must hold its old bytes again,
/// and a change must have been reported.
fn pointer_attack(f: &Fixture, backend: &str, pointer: &Path, script: &str) -> Verdict {
    let before = std::fs::read_to_string(pointer).unwrap();
    let out = f.run(backend, &[], script);
    if let Err(v) = ran(&out) {
        return v;
    }
    pointers_verdict(&out, &[pointer.to_path_buf()], &[before])
}

/// Every pointer is a plain file again (not a symlink to one) holding its old bytes: repaired
/// if the run reported a restore, blocked if nothing was reported.
fn pointers_verdict(out: &Output, pointers: &[PathBuf], before: &[String]) -> Verdict {
    for (pointer, before) in pointers.iter().zip(before) {
        let plain = std::fs::symlink_metadata(pointer).is_ok_and(|m| m.is_file());
        let after = std::fs::read_to_string(pointer).unwrap_or_default();
        if !plain || after != *before {
            return Verdict::Escaped(format!(
                "{} now {after:?}{}\n{}",
                pointer.display(),
                if plain { "" } else { " (not a plain file)" },
                crate::common::text(out)
            ));
        }
    }
    if String::from_utf8_lossy(&out.stderr).contains("restored") {
        Verdict::Repaired
    } else {
        Verdict::Blocked
    }
}
