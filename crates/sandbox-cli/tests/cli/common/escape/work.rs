//! Normal work that must still succeed inside the sandbox, and what must hold on the host
//! afterwards.

use super::fixture::{host_git, rev_parse, Fixture};
use super::harness::{accepted, block_net_flags, free_listener};

/// Normal work that must succeed inside the sandbox.
pub struct Work {
    pub name: &'static str,
    pub flags: fn(&Fixture) -> Vec<String>,
    pub script: &'static str,
    pub expect: &'static str,
    /// Needs the git store quarantine (native with the private view): without it the
    /// repository's common dir is read-only apart from objects, refs and logs, and git
    /// cannot take the `packed-refs.lock` a ref deletion needs.
    pub needs_quarantine: bool,
    /// What must hold in the repository on the host afterwards, given the run's stdout.
    pub after: fn(&Fixture, &str) -> Result<(), String>,
}

fn nothing_after(_: &Fixture, _: &str) -> Result<(), String> {
    Ok(())
}

/// The host's `feature` is the sandbox's final HEAD (printed last by the script), and trunk
/// and the repository are intact.
fn task_branch_reached_the_host(f: &Fixture, stdout: &str) -> Result<(), String> {
    let head = stdout.lines().last().unwrap_or_default().trim();
    let feature = rev_parse(f, "feature");
    if feature != head {
        return Err(format!(
            "feature is {feature} on the host, the sandbox ended at {head}"
        ));
    }
    fsck_clean(f)
}

fn fsck_clean(f: &Fixture) -> Result<(), String> {
    let fsck = host_git(&f.main, &["fsck", "--strict", "--no-dangling"]);
    if !fsck.status.success() {
        return Err(format!(
            "git fsck on the host: {}",
            crate::common::text(&fsck)
        ));
    }
    let trunk = host_git(&f.main, &["log", "-1", "--format=%s", "trunk"]);
    if String::from_utf8_lossy(&trunk.stdout).trim() != "init" {
        return Err(format!("trunk changed: {}", crate::common::text(&trunk)));
    }
    Ok(())
}

/// The rebase the run left stopped is the user's to finish: `git rebase --continue` on the
/// host completes it (the after-run check kept its state).
fn rebase_continues_on_the_host(f: &Fixture, _: &str) -> Result<(), String> {
    let out = host_git(&f.task, &["rebase", "--continue"]);
    let log = host_git(&f.task, &["log", "--format=%s", "-2"]);
    let subjects = String::from_utf8_lossy(&log.stdout).replace('\n', " ");
    if !out.status.success() || subjects != "two init " {
        return Err(format!(
            "rebase --continue on the host: {}; log: {subjects}",
            crate::common::text(&out)
        ));
    }
    Ok(())
}

/// The backends the quarantine runs under (native with its view, directly or in the daemon).
pub fn has_quarantine(backend: &str) -> bool {
    backend == "native" || backend == "native@daemon"
}

pub fn normal_work() -> Vec<Work> {
    vec![
        Work {
            name: "build and run a C program",
            flags: |_| vec![],
            script: "cc -o hello hello.c && ./hello",
            expect: "built and ran",
            needs_quarantine: false,
            after: nothing_after,
        },
        Work {
            name: "run a test suite (make test)",
            flags: |_| vec![],
            script: "make -s test",
            expect: "tests-passed",
            needs_quarantine: false,
            after: nothing_after,
        },
        Work {
            name: "git add / commit / branch / log",
            flags: |_| vec![],
            script: "echo change >> README && git add README && git commit -qm 'from the sandbox' && git branch side && git log --format=%s -1 && git branch --list side",
            expect: "from the sandbox",
            needs_quarantine: false,
            after: nothing_after,
        },
        Work {
            name: "git stash / stash pop",
            flags: |_| vec![],
            script: "echo wip >> README && git stash -q && git diff --quiet && git stash pop -q 2>/dev/null; grep -q wip README && echo stash-ok",
            expect: "stash-ok",
            needs_quarantine: false,
            after: nothing_after,
        },
        Work {
            name: "commit, amend, rebase and reset the task branch (reaches the host)",
            flags: |_| vec![],
            script: "echo 1 > one.txt && git add one.txt && git commit -qm one \
                     && git commit -q --amend -m one-amended \
                     && echo 2 > two.txt && git add two.txt && git commit -qm two \
                     && echo 3 > three.txt && git add three.txt && git commit -qm three \
                     && git rebase -q --onto HEAD~2 HEAD~1 \
                     && git reset -q --soft HEAD~1 && git commit -qm three-again \
                     && test \"$(git log --format=%s -3 | tr '\\n' ' ')\" = 'three-again one-amended init ' \
                     && echo history-ok && git rev-parse HEAD",
            expect: "history-ok",
            needs_quarantine: false,
            after: task_branch_reached_the_host,
        },
        Work {
            name: "interactive rebase with an exec line, run inside",
            flags: |_| vec![],
            script: "echo 1 > one.txt && git add one.txt && git commit -qm one \
                     && echo 2 > two.txt && git add two.txt && git commit -qm two \
                     && GIT_SEQUENCE_EDITOR=true git rebase -q -i --exec 'echo exec-ran' HEAD~2 \
                     && test ! -d \"$(git rev-parse --git-dir)/rebase-merge\" \
                     && git rev-parse HEAD",
            expect: "exec-ran",
            needs_quarantine: false,
            after: task_branch_reached_the_host,
        },
        Work {
            name: "a rebase stopped inside, finished by the user's rebase --continue",
            flags: |_| vec![],
            script: "echo 1 > one.txt && git add one.txt && git commit -qm one \
                     && echo 2 > two.txt && git add two.txt && git commit -qm two \
                     && printf '#!/bin/sh\\nsed -i \"1i break\" \"$1\"\\n' > .ed \
                     && chmod +x .ed && GIT_SEQUENCE_EDITOR=\"$PWD/.ed\" \
                        git rebase -q -i --onto HEAD~2 HEAD~1 \
                     ; test -d \"$(git rev-parse --git-dir)/rebase-merge\" && echo stopped",
            expect: "stopped",
            needs_quarantine: false,
            after: rebase_continues_on_the_host,
        },
        Work {
            name: "stash push and pop the last stash (nothing left behind)",
            flags: |_| vec![],
            script: "echo wip >> README && git stash -q && git diff --quiet && git stash pop -q \
                     && grep -q wip README && test -z \"$(git stash list)\" && echo stash-ok",
            expect: "stash-ok",
            needs_quarantine: true,
            after: |f, _| {
                let list = host_git(&f.main, &["stash", "list"]);
                match String::from_utf8_lossy(&list.stdout).trim() {
                    "" => fsck_clean(f),
                    left => Err(format!("a stash was left in the repository: {left}")),
                }
            },
        },
        Work {
            name: "create and delete own branches and tags",
            flags: |_| vec![],
            script: "git branch side && git tag t1 && git branch -D side && git tag -d t1 \
                     && git commit -q --allow-empty -m kept && git branch keep && git tag keep-tag \
                     && echo refs-ok",
            expect: "refs-ok",
            needs_quarantine: true,
            after: |f, _| {
                for (rev, wanted) in [("side", false), ("t1", false), ("keep", true), ("keep-tag", true)] {
                    if rev_parse(f, rev).is_empty() == wanted {
                        return Err(format!(
                            "{rev} {} on the host",
                            if wanted { "is missing" } else { "is still there" }
                        ));
                    }
                }
                fsck_clean(f)
            },
        },
        Work {
            name: "git gc --auto inside does no harm",
            flags: |_| vec![],
            script: "for i in 1 2 3; do echo $i > gc$i.txt && git add gc$i.txt && git commit -qm gc$i; done; \
                     git -c gc.auto=1 -c gc.autoDetach=false gc --auto -q 2>/dev/null; \
                     git log --format=%s -1 | grep -q gc3 && echo gc-ok && git rev-parse HEAD",
            expect: "gc-ok",
            needs_quarantine: false,
            after: task_branch_reached_the_host,
        },
        Work {
            name: "git init a new nested repository the user allowed (--allow-nested-git)",
            flags: |_| vec!["--allow-nested-git".into()],
            script: "git init -q nested-new && git -C nested-new commit -q --allow-empty -m n \
                     && echo nested-ok",
            expect: "nested-ok",
            needs_quarantine: false,
            after: |f, _| {
                let log = host_git(&f.task.join("nested-new"), &["log", "--format=%s", "-1"]);
                match String::from_utf8_lossy(&log.stdout).trim() {
                    "n" => Ok(()),
                    _ => Err(format!("the allowed repository is not kept: {}", crate::common::text(&log))),
                }
            },
        },
        Work {
            name: "commit in a nested repository that was there before the run",
            flags: |f| {
                // Vendored on the host before the run (a submodule's `.git` file is the same
                // case: present at the start, left alone).
                let vendored = f.task.join("vendored");
                if !vendored.join(".git").exists() {
                    std::fs::create_dir_all(&vendored).unwrap();
                    super::fixture::git(&vendored, &["init", "-q", "-b", "main"]);
                    super::fixture::git(&vendored, &["config", "user.name", "V"]);
                    super::fixture::git(&vendored, &["config", "user.email", "v@x.invalid"]);
                    super::fixture::git(&vendored, &["commit", "-q", "--allow-empty", "-m", "v0"]);
                }
                vec![]
            },
            script: "git -C vendored commit -q --allow-empty -m inside && echo vendored-ok",
            expect: "vendored-ok",
            needs_quarantine: false,
            after: |f, _| {
                let log = host_git(&f.task.join("vendored"), &["log", "--format=%s", "-1"]);
                match String::from_utf8_lossy(&log.stdout).trim() {
                    "inside" => Ok(()),
                    _ => Err(format!("the vendored repository was touched: {}", crate::common::text(&log))),
                }
            },
        },
        Work {
            name: "open a new pseudo-terminal (script)",
            flags: |_| vec![],
            script: "script -qc 'echo in-a-pty' /dev/null",
            expect: "in-a-pty",
            needs_quarantine: false,
            after: nothing_after,
        },
        Work {
            name: "write and read TMPDIR",
            flags: |_| vec![],
            script: "test -n \"$TMPDIR\" && test \"$(stat -c %a \"$TMPDIR\")\" = 700 && echo tmp-ok > \"$TMPDIR/f\" && cat \"$TMPDIR/f\"",
            expect: "tmp-ok",
            needs_quarantine: false,
            after: nothing_after,
        },
        Work {
            name: "TCP connect to an allowed port under --block-net",
            flags: |_| vec![],
            script: "",
            expect: "",
            needs_quarantine: false,
            after: nothing_after,
        },
    ]
}

/// Runs the normal-work item; the TCP one is special-cased (it needs a live listener).
pub fn do_work(f: &Fixture, backend: &str, work: &Work) -> Result<(), String> {
    if work.script.is_empty() {
        let allowed = free_listener();
        let port = allowed.local_addr().unwrap().port();
        let out = f.run(
            backend,
            &block_net_flags(port),
            &format!("bash -c 'echo reached > /dev/tcp/127.0.0.1/{port}'"),
        );
        return match accepted(&allowed) {
            Some(text) if text.contains("reached") => Ok(()),
            _ => Err(crate::common::text(&out)),
        };
    }
    let out = f.run(backend, &(work.flags)(f), work.script);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && stdout.contains(work.expect) {
        (work.after)(f, &stdout).map_err(|e| format!("{e}\n{}", crate::common::text(&out)))
    } else {
        Err(crate::common::text(&out))
    }
}
