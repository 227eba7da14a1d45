//! The `git_formats` family: state files of the worktree's own git dir that the after-run
//! check must read exactly as git does. Each attack leaves bytes that an earlier, looser
//! reading kept (the first MiB of a todo, the first word of a strategy, a `key = value`
//! reader, `refs/`-only update-refs, pseudorefs as data, a lexical gitlink pointer), then
//! plays the user's next step on the host with the real `git`.

use super::fixture::{host_git, rev_parse, unique, Fixture};
use super::harness::{judge, ran, Attack, Verdict, MARK};

/// Inside the run: two commits on the task branch, then an interactive rebase onto the
/// first one's parent that stops at a `break` before picking the second — a pick git must
/// merge (its parent is not `HEAD`), with the strategy the state names. `$g` is the git dir.
const STOPPED_REBASE: &str = "g=$(git rev-parse --absolute-git-dir); \
     echo one > one && git add one && git commit -q -m one && \
     echo two > two && git add two && git commit -q -m two && \
     c=$(git rev-parse HEAD) && \
     printf '#!/bin/sh\\nprintf \"break\\\\npick %s\\\\n\" > \"$1\"\\n' $c > .ed && chmod +x .ed && \
     GIT_SEQUENCE_EDITOR=\"$PWD/.ed\" git rebase -q -i HEAD~2 >/dev/null 2>&1; \
     test -d \"$g/rebase-merge\"";

/// A program the sequencer reaches as `git-merge-ort /../evil`: the directory `git-merge-ort `
/// (with its space) and `evil` beside it, in the worktree. `mark` is what it touches.
fn merge_program(mark: &std::path::Path) -> String {
    format!(
        "mkdir -p 'git-merge-ort ' && printf '#!/bin/sh\\ntouch {}\\n' > evil && chmod +x evil",
        mark.display()
    )
}

/// A run that leaves `setup` behind, then the user's `git <host...>` in the worktree; escaped
/// when `mark` exists.
fn ran_on_host(f: &Fixture, b: &str, setup: &str, host: &[&str], what: &str) -> Verdict {
    let mark = f.outside.join(format!("git-formats-ran-{}", unique()));
    let script = setup.replace("MARKFILE", &mark.display().to_string());
    let out = f.run(b, &[], &format!("echo {MARK}; {script}"));
    if let Err(v) = ran(&out) {
        return v;
    }
    let _ = host_git(&f.task, host);
    judge(&out, mark.exists(), what)
}

/// A stopped cherry-pick of two commits whose `sequencer/opts` is `opts`; the user's
/// `cherry-pick --continue` picks the second with the strategy git reads there.
fn cherry_pick_with_opts(f: &Fixture, b: &str, opts: &str) -> Verdict {
    let setup = format!(
        "g=$(git rev-parse --absolute-git-dir); {program} && \
         echo y > y && git add y && git commit -q -m y && x=$(git rev-parse HEAD) && \
         git branch side-{n} && git reset -q --hard HEAD~1 && h=$(git rev-parse HEAD) && \
         mkdir -p \"$g/sequencer\" && echo $h > \"$g/sequencer/head\" && \
         echo $h > \"$g/sequencer/abort-safety\" && \
         printf 'pick %s y\\npick %s y\\n' $x $x > \"$g/sequencer/todo\" && \
         printf '{opts}' > \"$g/sequencer/opts\"",
        program = merge_program(std::path::Path::new("MARKFILE")),
        n = unique(),
    );
    ran_on_host(
        f,
        b,
        &setup,
        &["cherry-pick", "--continue"],
        "the user's cherry-pick --continue ran the planted merge program",
    )
}

pub(super) fn git_formats_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "hide an exec line past the first MiB of a stopped rebase's todo",
            needs: None,
            run: |f, b| {
                // 1,100 comment lines of 1 KiB pass the first MiB; many short ones would too,
                // but git's own sequencer takes minutes over 150,000 lines (the control).
                let setup = format!(
                    "{STOPPED_REBASE} && t=\"$g/rebase-merge/git-rebase-todo\" && \
                     {{ cat \"$t\"; yes \"# $(printf %01022d 0)\" | head -n 1100; \
                        echo 'exec touch MARKFILE'; }} > \"$t.new\" && mv \"$t.new\" \"$t\""
                );
                ran_on_host(
                    f,
                    b,
                    &setup,
                    &["rebase", "--continue"],
                    "the user's rebase --continue ran the exec line",
                )
            },
        },
        Attack {
            name: "a strategy of two words (ort /../evil), run by the user's rebase --continue",
            needs: None,
            run: |f, b| {
                let setup = format!(
                    "{STOPPED_REBASE} && {} && \
                     printf 'ort /../evil\\n' > \"$g/rebase-merge/strategy\"",
                    merge_program(std::path::Path::new("MARKFILE"))
                );
                ran_on_host(
                    f,
                    b,
                    &setup,
                    &["rebase", "--continue"],
                    "the user's rebase --continue ran ./evil as the merge strategy",
                )
            },
        },
        Attack {
            name: "a one-line [options] strategy in sequencer/opts, run by cherry-pick --continue",
            needs: None,
            run: |f, b| cherry_pick_with_opts(f, b, "[options] strategy = ort /../evil\\n"),
        },
        Attack {
            name: "a strategy key in other case in sequencer/opts, run by cherry-pick --continue",
            needs: None,
            run: |f, b| cherry_pick_with_opts(f, b, "[Options]\\n\\tStrategY = ort /../evil\\n"),
        },
        Attack {
            name: "ORIG_HEAD as ref: refs/heads/trunk, so the user's reset --hard moves trunk",
            needs: None,
            run: |f, b| {
                let before = rev_parse(f, "trunk");
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; git commit -q --allow-empty -m ahead && \
                         echo 'ref: refs/heads/trunk' > \"$(git rev-parse --git-dir)/ORIG_HEAD\""
                    ),
                );
                let _ = host_git(&f.task, &["reset", "-q", "--hard", "HEAD"]);
                judge(
                    &out,
                    rev_parse(f, "trunk") != before,
                    "the user's reset wrote ORIG_HEAD through the link: trunk moved",
                )
            },
        },
        Attack {
            name: "update-refs naming trunk as main-worktree/HEAD, moved by rebase --continue",
            needs: None,
            run: |f, b| {
                let before = rev_parse(f, "trunk");
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; {STOPPED_REBASE} && \
                         printf 'main-worktree/HEAD\\n%s\\n%s\\n' $(git rev-parse trunk) $c \
                         > \"$g/rebase-merge/update-refs\""
                    ),
                );
                let _ = host_git(&f.task, &["rebase", "--continue"]);
                judge(
                    &out,
                    rev_parse(f, "trunk") != before,
                    "the user's rebase --continue moved trunk",
                )
            },
        },
        Attack {
            name: "a gitlink pointer through a link (lexically in modules/), run by git status",
            needs: None,
            run: |f, b| {
                let n = unique();
                let repo = f
                    .common
                    .parent()
                    .unwrap()
                    .file_name()
                    .unwrap()
                    .to_string_lossy();
                // From <task>/sub-n, `../lnk/../../<repo>/.git/modules/sub-n` is lexically
                // the repository's modules/; through the link `lnk -> p/q` it is the
                // worktree's own `<task>/<repo>/.git/modules/sub-n`, planted by the run.
                let setup = format!(
                    "d=\"$PWD/{repo}/.git/modules/sub-{n}\"; mkdir -p p/q \"$d\" sub-{n} && ln -s p/q lnk && \
                     git init -q --separate-git-dir \"$d\" sub-{n} && \
                     printf '#!/bin/sh\\ntouch MARKFILE\\n' > \"$d/fsm\" && chmod +x \"$d/fsm\" && \
                     git -C sub-{n} config core.fsmonitor \"$d/fsm\" && \
                     git -C sub-{n} commit -q --allow-empty -m s && \
                     printf 'gitdir: ../lnk/../../{repo}/.git/modules/sub-{n}\\n' > sub-{n}/.git && \
                     git update-index --add --cacheinfo \
                       160000,$(git -C sub-{n} rev-parse HEAD),sub-{n}"
                );
                ran_on_host(
                    f,
                    b,
                    &setup,
                    &["status", "--short"],
                    "the user's git status ran the planted submodule's fsmonitor",
                )
            },
        },
    ]
}
