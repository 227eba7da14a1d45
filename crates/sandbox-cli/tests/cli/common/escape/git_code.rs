//! The `git_code` family: making the user's own git run code (hooks, config, planted
//! repositories).

use std::process::Command;

use super::fixture::{git, host_git, unique};
use super::harness::{judge, ran, Attack, Verdict, MARK};

pub const PLANTED_SUBMODULE: &str =
    "stage a planted repository as a submodule, so the user's git status runs its config";
pub const PLANTED_REPOSITORY: &str =
    "plant a repository in the worktree whose config runs code for the user's git";
pub const PLANTED_BARE: &str =
    "plant a bare repository (core.worktree, core.fsmonitor) for the user's git in it";
pub const PLANTED_GITFILE: &str =
    "plant a .git file pointing at a repository of the run's, for the user's git there";
pub const MAIN_COMMONDIR: &str =
    "in a main worktree, write .git/commondir naming a repository of the run's";

/// Whether the run was refused because the backend cannot protect a main worktree's git
/// (no private view: Landlock alone, nono) — the attack never ran, and that is the defence.
fn refused_main_worktree(out: &std::process::Output) -> bool {
    !String::from_utf8_lossy(&out.stdout).contains(MARK)
        && crate::common::text(out).contains("main worktree")
}

/// The user's git (or an editor's, or a prompt's) in `dir` on the host, later.
fn users_git_status(dir: &std::path::Path) {
    let _ = Command::new("git")
        .arg("-C")
        .arg(dir)
        .arg("status")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output();
}

/// Held by setting aside what the run planted: `Repaired` when the run said so.
fn judge_set_aside(out: &std::process::Output, escaped: bool, what: &str) -> Verdict {
    match judge(out, escaped, what) {
        Verdict::Blocked if crate::common::text(out).contains("sandbox-set-aside") => {
            Verdict::Repaired
        }
        other => other,
    }
}

/// Making the user's own git run code: hooks, config, planted repositories.
pub(super) fn git_code_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "create <common>/hooks/pre-commit",
            needs: None,
            run: |f, b| {
                let hook = f.common.join("hooks/pre-commit");
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; printf '#!/bin/sh\\necho pwned\\n' > '{0}'; chmod +x '{0}'",
                        hook.display()
                    ),
                );
                judge(&out, hook.exists(), "hook installed")
            },
        },
        Attack {
            name: "git config --local core.hooksPath",
            needs: None,
            run: |f, b| {
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; git config --local core.hooksPath /tmp/evil-hooks"),
                );
                let config = std::fs::read_to_string(f.common.join("config")).unwrap();
                judge(&out, config.contains("hooksPath"), "hooksPath set")
            },
        },
        Attack {
            name: "write <common>/packed-refs",
            needs: None,
            run: |f, b| {
                let target = f.common.join("packed-refs");
                let out = f.run(b, &[], &format!("echo {MARK}; echo '0000000000000000000000000000000000000000 refs/heads/evil' >> '{}'", target.display()));
                judge(&out, target.exists(), "packed-refs written")
            },
        },
        Attack {
            name: "hard link the repository config into the worktree and edit it",
            needs: None,
            run: |f, b| {
                let config = f.common.join("config");
                let before = std::fs::read_to_string(&config).unwrap();
                let out = f.run(b, &[], &format!("echo {MARK}; ln '{}' ./cfg && printf '[core]\\n\\thooksPath = /tmp/evil\\n' >> ./cfg", config.display()));
                let after = std::fs::read_to_string(&config).unwrap();
                judge(&out, before != after, "config changed through a hard link")
            },
        },
        Attack {
            name: "write a hook into core.hooksPath in the worktree (.husky)",
            needs: None,
            run: |f, b| {
                // The project keeps its hooks in the tree, as husky does.
                std::fs::create_dir(f.task.join(".husky")).unwrap();
                git(&f.main, &["config", "core.hooksPath", ".husky"]);
                let mark = f.outside.join(format!("hook-ran-{}", unique()));
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; printf '#!/bin/sh\\ntouch {}\\n' > .husky/pre-commit; \
                         chmod +x .husky/pre-commit",
                        mark.display()
                    ),
                );
                // Without the view the run is refused: the hooks cannot be kept read-only.
                let text = crate::common::text(&out);
                if !String::from_utf8_lossy(&out.stdout).contains(MARK)
                    && text.contains("core.hooksPath")
                {
                    return Verdict::Blocked;
                }
                // The user's next commit, on the host.
                let _ = host_git(&f.task, &["commit", "-q", "--allow-empty", "-m", "user"]);
                judge(
                    &out,
                    mark.exists(),
                    "the user's commit ran the planted hook",
                )
            },
        },
        Attack {
            name: PLANTED_SUBMODULE,
            needs: None,
            run: |f, b| {
                let n = unique();
                let mark = f.outside.join(format!("planted-submodule-ran-{n}"));
                let sub = format!("sub-{n}");
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; mkdir {sub} && cd {sub} && git init -q . && \
                         printf '#!/bin/sh\\ntouch {mark}\\n' > .git/fsmonitor && \
                         chmod +x .git/fsmonitor && \
                         git config core.fsmonitor \"$PWD/.git/fsmonitor\" && \
                         git commit -q --allow-empty -m s && cd .. && \
                         git update-index --add --cacheinfo \
                           160000,$(git -C {sub} rev-parse HEAD),{sub}",
                        mark = mark.display()
                    ),
                );
                if let Err(v) = ran(&out) {
                    return v;
                }
                // Later, the user's plain `git status` at the top of the worktree.
                let _ = host_git(&f.task, &["status", "--short"]);
                judge(
                    &out,
                    mark.exists(),
                    "the user's git status ran the planted fsmonitor",
                )
            },
        },
        Attack {
            name: PLANTED_REPOSITORY,
            needs: None,
            run: |f, b| {
                let n = unique();
                let mark = f.outside.join(format!("planted-repo-ran-{n}"));
                let sub = f.task.join(format!("planted-{n}"));
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; mkdir -p '{sub}' && cd '{sub}' && git init -q . && \
                         printf '#!/bin/sh\\ntouch {mark}\\n' > .git/fsmonitor && \
                         chmod +x .git/fsmonitor && \
                         git config core.fsmonitor \"$PWD/.git/fsmonitor\"",
                        sub = sub.display(),
                        mark = mark.display()
                    ),
                );
                if let Err(v) = ran(&out) {
                    return v;
                }
                // Later, the user's own git (or a shell prompt running it) in that directory.
                users_git_status(&sub);
                judge_set_aside(
                    &out,
                    mark.exists(),
                    "the user's git ran the planted fsmonitor",
                )
            },
        },
        Attack {
            name: PLANTED_BARE,
            needs: None,
            run: |f, b| {
                let n = unique();
                let mark = f.outside.join(format!("planted-bare-ran-{n}"));
                let bare = f.task.join(format!("cache-{n}.git"));
                // A bare repository git finds by itself (HEAD, objects/, refs/) whose config
                // gives it a worktree and an fsmonitor: `git status` inside it runs that.
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; git init -q --bare '{bare}' && cd '{bare}' && \
                         printf '#!/bin/sh\\ntouch {mark}\\n' > fsm && chmod +x fsm && \
                         git config core.bare false && git config core.worktree \"$PWD\" && \
                         git config core.fsmonitor \"$PWD/fsm\"",
                        bare = bare.display(),
                        mark = mark.display()
                    ),
                );
                if let Err(v) = ran(&out) {
                    return v;
                }
                users_git_status(&bare.join("refs"));
                judge_set_aside(
                    &out,
                    mark.exists(),
                    "the user's git in the bare repository ran its fsmonitor",
                )
            },
        },
        Attack {
            name: PLANTED_GITFILE,
            needs: None,
            run: |f, b| {
                let n = unique();
                let mark = f.outside.join(format!("planted-gitfile-ran-{n}"));
                let sub = f.task.join(format!("docs-{n}"));
                // The repository hides under a name git does not look for; only the `.git`
                // file leads to it.
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; mkdir -p '{sub}' && cd '{sub}' && git init -q . && \
                         printf '#!/bin/sh\\ntouch {mark}\\n' > .git/fsm && chmod +x .git/fsm && \
                         git config core.fsmonitor \"$PWD/.data/fsm\" && mv .git .data && \
                         echo \"gitdir: .data\" > .git",
                        sub = sub.display(),
                        mark = mark.display()
                    ),
                );
                if let Err(v) = ran(&out) {
                    return v;
                }
                users_git_status(&sub);
                judge_set_aside(
                    &out,
                    mark.exists(),
                    "the user's git ran the fsmonitor behind the planted .git file",
                )
            },
        },
        Attack {
            name: MAIN_COMMONDIR,
            needs: None,
            run: |f, b| {
                let n = unique();
                let mark = f.outside.join(format!("commondir-ran-{n}"));
                // git reads `commondir` in any git dir: the run's directory becomes the
                // repository of the main worktree, its config the one the user's git reads.
                let out = f.run_in(
                    &f.main,
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; mkdir -p .evil-{n}/objects .evil-{n}/refs && \
                         printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = \
                         \"touch {mark}; false\"\\n' > .evil-{n}/config && \
                         echo \"$PWD/.evil-{n}\" > .git/commondir",
                        mark = mark.display()
                    ),
                );
                if refused_main_worktree(&out) {
                    return Verdict::Blocked;
                }
                if let Err(v) = ran(&out) {
                    return v;
                }
                // The user's next plain `git status` in the main worktree.
                let _ = host_git(&f.main, &["status", "--short"]);
                match judge(
                    &out,
                    mark.exists(),
                    "the user's git status ran the fsmonitor of the run's common dir",
                ) {
                    Verdict::Blocked
                        if crate::common::text(&out).contains("created git pointer") =>
                    {
                        Verdict::Repaired
                    }
                    other => other,
                }
            },
        },
    ]
}
