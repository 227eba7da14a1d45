//! What the host takes back from a linked worktree's own git dir (`<common>/worktrees/<wt>/`)
//! after a run: the pure rules. The run writes that directory (a commit writes `index`,
//! `HEAD`, `COMMIT_EDITMSG`, …), and the user's next git on the host reads it, so anything
//! there git would follow or run is the agent's code on the host: `COMMIT_EDITMSG ->
//! ~/.bashrc` (the next `git commit --amend --no-edit` writes through the link), a
//! `config.worktree` with `core.fsmonitor` (dormant until `git sparse-checkout set` turns the
//! extension on), a rebase stopped before an `exec` line (run by `git rebase --continue`).
//!
//! The host keeps only what it understands — each name of [`classify`], as regular files and
//! directories, never links — and sets aside everything else (the walk and the renames are
//! `sandbox-host`'s `gitguard`). The index is read for what it hides ([`IndexSummary`]) and
//! for gitlinks whose `.git` could hold a planted repository ([`gitlink_pointer_allowed`]).

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// What a top-level name of the worktree's git dir is to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// A file git reads as data (`HEAD`, `ORIG_HEAD`, `COMMIT_EDITMSG`, `MERGE_MSG`, …):
    /// kept when it is a regular file.
    Data,
    /// `index`: kept when a regular file; then read ([`IndexSummary`]).
    Index,
    /// `config.worktree`: kept only with the bytes it had at the start.
    ConfigWorktree,
    /// `refs/`, `logs/`, `info/`: kept when holding only directories and regular files.
    Tree,
    /// `rebase-merge/`, `rebase-apply/`, `sequencer/`: as a tree, and only when what a later
    /// `--continue` on the host would do is the run's own business ([`sequencer_problem`]).
    Sequencer,
    /// Set aside by an earlier check: no git reads the name.
    SetAside,
    /// Anything else: set aside.
    Unknown,
}

/// The suffix of a name the check moved aside (`<name>.sandbox-set-aside-<random>`).
pub const SET_ASIDE: &str = ".sandbox-set-aside-";

/// Files git keeps in a worktree's git dir and reads only as data.
const DATA: &[&str] = &[
    "HEAD",
    "commondir",
    "gitdir",
    "locked",
    "ORIG_HEAD",
    "FETCH_HEAD",
    "MERGE_HEAD",
    "MERGE_MSG",
    "MERGE_MODE",
    "MERGE_AUTOSTASH",
    "SQUASH_MSG",
    "AUTO_MERGE",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
    "REBASE_HEAD",
    "COMMIT_EDITMSG",
    "TAG_EDITMSG",
    "NOTES_EDITMSG",
    "EDIT_DESCRIPTION",
    "addp-hunk-edit.diff",
];

pub fn classify(name: &str) -> Kept {
    match name {
        "index" => Kept::Index,
        "config.worktree" => Kept::ConfigWorktree,
        "refs" | "logs" | "info" => Kept::Tree,
        "rebase-merge" | "rebase-apply" | "sequencer" => Kept::Sequencer,
        _ if DATA.contains(&name) || name.starts_with("BISECT_") => Kept::Data,
        _ if name.contains(SET_ASIDE) => Kept::SetAside,
        _ => Kept::Unknown,
    }
}

/// git's own merge strategies: a strategy of another name is a `git-merge-<name>` program
/// looked up on the host.
const STRATEGIES: &[&str] = &["ort", "recursive", "resolve", "octopus", "ours", "subtree"];

/// Why a later `git rebase --continue` (or `cherry-pick --continue`, `am --continue`) on the
/// host must not pick up file `file` of the sequencer state `dir` with `content`, if so:
/// a todo line that runs a command (`exec`), a ref the rebase would move at its end
/// (`head-name`, `update-ref`, `update-refs`) that the run may not own (`may_own` says which
/// branches it may), or a merge strategy that is not git's own. Pure.
pub fn sequencer_problem(
    dir: &str,
    file: &str,
    content: &str,
    may_own: &dyn Fn(&str) -> bool,
) -> Option<String> {
    let todo = matches!(
        (dir, file),
        ("rebase-merge", "git-rebase-todo") | ("sequencer", "todo")
    );
    for line in content.lines() {
        let line = line.trim();
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        if todo && !line.starts_with('#') {
            if matches!(first, "exec" | "x") {
                return Some(format!(
                    "{dir}/{file} would run `{}` on the host's next `--continue`",
                    line.chars().take(80).collect::<String>()
                ));
            }
            if matches!(first, "update-ref" | "u") {
                let name = words.next().unwrap_or_default();
                if !may_own(name) {
                    return Some(format!(
                        "{dir}/{file} would move {name}, which the run may not move"
                    ));
                }
            }
        }
        if file == "update-refs" && first.starts_with("refs/") && !may_own(first) {
            return Some(format!(
                "{dir}/update-refs would move {first}, which the run may not move"
            ));
        }
        if file == "head-name" && first != "detached" && !may_own(first) {
            return Some(format!(
                "{dir}/head-name would move {first} at the end of the rebase, which the run \
                 may not move"
            ));
        }
        let strategy = match file {
            "strategy" => Some(first),
            "opts" => line
                .split_once('=')
                .filter(|(k, _)| k.trim() == "strategy")
                .map(|(_, v)| v.trim()),
            _ => None,
        };
        if let Some(s) = strategy.filter(|s| !s.is_empty() && !STRATEGIES.contains(s)) {
            return Some(format!(
                "{dir}/{file} names the merge strategy {s:?}, which would run git-merge-{s} on \
                 the host"
            ));
        }
    }
    None
}

/// What an index holds that the user's `git status` would not show or would follow.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexSummary {
    /// Paths marked skip-worktree: an edit there is hidden from `git status` and `git diff`.
    pub skip_worktree: BTreeSet<String>,
    /// Paths marked assume-unchanged: the same.
    pub assume_unchanged: BTreeSet<String>,
    /// Paths of gitlinks (submodules): `git status` enters each one's `.git`.
    pub gitlinks: BTreeSet<String>,
}

const SKIP_WORKTREE: u16 = 1 << 14;
const ASSUME_UNCHANGED: u16 = 0x8000;
const GITLINK: u32 = 0o160000;

impl IndexSummary {
    /// Reads the index file at `path` (libgit2's reader).
    pub fn read(path: &Path) -> Result<Self, git2::Error> {
        let index = git2::Index::open(path)?;
        let mut summary = IndexSummary::default();
        for entry in index.iter() {
            let path = String::from_utf8_lossy(&entry.path).into_owned();
            if entry.flags_extended & SKIP_WORKTREE != 0 {
                summary.skip_worktree.insert(path.clone());
            }
            if entry.flags & ASSUME_UNCHANGED != 0 {
                summary.assume_unchanged.insert(path.clone());
            }
            if entry.mode == GITLINK {
                summary.gitlinks.insert(path);
            }
        }
        Ok(summary)
    }

    /// One line per path that `self` marks or links and `before` did not.
    pub fn new_since(&self, before: &IndexSummary) -> Vec<String> {
        let hidden = |bit: &'static str| {
            move |path: &String| {
                format!(
                    "git: the run marked {path} {bit} in the index: git status and git diff \
                     no longer show its changes (`git update-index --no-{bit} {path}` on the \
                     host undoes it)"
                )
            }
        };
        let skip = self.skip_worktree.difference(&before.skip_worktree);
        let assume = self.assume_unchanged.difference(&before.assume_unchanged);
        let links = self.gitlinks.difference(&before.gitlinks);
        skip.map(hidden("skip-worktree"))
            .chain(assume.map(hidden("assume-unchanged")))
            .chain(links.map(|path| {
                format!(
                    "git: the run added the submodule (gitlink) {path} to the index; look at \
                     `git diff --cached` before running git in it"
                )
            }))
            .collect()
    }
}

/// Whether index bytes may hold a gitlink: its mode (0o160000) is four bytes `00 00 e0 00`
/// in every entry that has it, so bytes without them hold none — no parse needed. (The
/// bytes can occur elsewhere: then the index is read.)
pub fn may_hold_gitlinks(index: &[u8]) -> bool {
    memchr::memmem::find(index, &[0, 0, 0xe0, 0]).is_some()
}

/// Whether a gitlink's `.git` file reading `text`, in the submodule directory `dir`, leads to
/// git's own layout for submodules of the repository: `<common>/modules/<name>`. Anything else
/// — a directory of the run's, `<worktree git dir>/modules` (the run writes it), a path with
/// `..` out of `modules/` — may be a repository the run planted, whose `core.fsmonitor` the
/// user's `git status` at the top would run. Pure (lexical; `dir` must have no link in it).
pub fn gitlink_pointer_allowed(text: &str, dir: &Path, common: &Path) -> bool {
    let Some(target) = text
        .strip_prefix("gitdir:")
        .map(str::trim)
        .filter(|t| !t.is_empty() && !t.contains('\n'))
    else {
        return false;
    };
    let Some(resolved) = normalize(&dir.join(target)) else {
        return false;
    };
    resolved
        .strip_prefix(common.join("modules"))
        .is_ok_and(|rest| rest.components().next().is_some())
}

/// `path` with `.` and `..` taken lexically; `None` if it climbs above the root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                if !out.pop() || out.as_os_str().is_empty() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_host_keeps() {
        assert_eq!(classify("COMMIT_EDITMSG"), Kept::Data);
        assert_eq!(classify("BISECT_LOG"), Kept::Data);
        assert_eq!(classify("index"), Kept::Index);
        assert_eq!(classify("config.worktree"), Kept::ConfigWorktree);
        assert_eq!(classify("rebase-merge"), Kept::Sequencer);
        assert_eq!(classify("logs"), Kept::Tree);
        assert_eq!(classify("modules"), Kept::Unknown, "the run writes it");
        assert_eq!(classify("hooks"), Kept::Unknown);
        assert_eq!(classify("config"), Kept::Unknown);
        assert_eq!(classify("index.lock"), Kept::Unknown);
        assert_eq!(
            classify("COMMIT_EDITMSG.sandbox-set-aside-00ff"),
            Kept::SetAside
        );
    }

    #[test]
    fn sequencer_state_that_runs_or_moves_what_it_may_not() {
        let own = |name: &str| name == "refs/heads/task";
        let todo = "pick 1234 a\nbreak\nexec touch /tmp/x\n";
        assert!(sequencer_problem("rebase-merge", "git-rebase-todo", todo, &own).is_some());
        assert!(sequencer_problem("sequencer", "todo", "x make\n", &own).is_some());
        assert!(sequencer_problem(
            "rebase-merge",
            "git-rebase-todo",
            "# exec is a command\npick 1 a\nbreak\n",
            &own
        )
        .is_none());
        assert!(
            sequencer_problem("rebase-merge", "done", todo, &own).is_none(),
            "done is never run again"
        );
        let update = "pick 1 a\nupdate-ref refs/heads/main\n";
        assert!(sequencer_problem("rebase-merge", "git-rebase-todo", update, &own).is_some());
        let update = "pick 1 a\nupdate-ref refs/heads/task\n";
        assert!(sequencer_problem("rebase-merge", "git-rebase-todo", update, &own).is_none());
        assert!(
            sequencer_problem("rebase-merge", "head-name", "refs/heads/main\n", &own).is_some()
        );
        assert!(
            sequencer_problem("rebase-merge", "head-name", "refs/heads/task\n", &own).is_none()
        );
        assert!(sequencer_problem("rebase-apply", "head-name", "detached HEAD\n", &own).is_none());
        let refs = "refs/heads/main\n1234\n5678\n";
        assert!(sequencer_problem("rebase-merge", "update-refs", refs, &own).is_some());
        assert!(sequencer_problem("rebase-merge", "strategy", "evil\n", &own).is_some());
        assert!(sequencer_problem("rebase-merge", "strategy", "ort\n", &own).is_none());
        let opts = "[options]\n\tstrategy = evil\n";
        assert!(sequencer_problem("sequencer", "opts", opts, &own).is_some());
    }

    #[test]
    fn gitlinks_lead_only_into_the_common_dirs_modules() {
        let common = Path::new("/repo/.git");
        let dir = Path::new("/work/task/sub");
        let ok = |text: &str| gitlink_pointer_allowed(text, dir, common);
        assert!(ok("gitdir: /repo/.git/modules/sub\n"));
        assert!(ok("gitdir: ../../../repo/.git/modules/sub"));
        assert!(!ok("gitdir: /repo/.git/worktrees/task/modules/sub\n"));
        assert!(!ok(
            "gitdir: /repo/.git/modules/../worktrees/task/modules/sub"
        ));
        assert!(!ok("gitdir: /repo/.git/modules"));
        assert!(!ok("gitdir: .planted"));
        assert!(!ok("gitdir: /tmp/evil"));
        assert!(!ok("not a pointer"));
    }
}
