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
use std::path::Path;

use super::gitformats;

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

/// Why a later `git rebase --continue` (or `cherry-pick --continue`, `am --continue`) on the
/// host must not pick up file `file` of the sequencer state `dir` with `content`, if so. Each
/// file git reads back as more than text is parsed whole under the grammar git writes it in
/// ([`gitformats`]): a todo list of git's commands with no `exec`; `head-name`, `update-ref`
/// lines and `update-refs` naming only branches the run may own (`may_own`); a merge strategy
/// exactly one of git's own; `sequencer/opts` read by git's own config parser; the object ids
/// git keeps there as object ids. Anything else in the directory is data git shows or copies
/// (messages, `author-script`, `rewritten-list`). Pure but for `opts` (git parses it).
pub fn sequencer_problem(
    dir: &str,
    file: &str,
    content: &[u8],
    may_own: &dyn Fn(&str) -> bool,
) -> Option<String> {
    let result = match (dir, file) {
        (_, "git-rebase-todo" | "done") | ("sequencer", "todo") => {
            gitformats::todo_list(content, may_own)
        }
        (_, "update-refs") => gitformats::update_refs(content, may_own),
        (_, "head-name") => gitformats::head_name(content, may_own),
        (_, "strategy") => gitformats::strategy_file(content),
        ("sequencer", "opts") => gitformats::sequencer_opts(content),
        ("sequencer", "head" | "abort-safety")
        | (_, "onto" | "orig-head" | "amend" | "squash-onto") => (content.is_empty()
            || gitformats::object_id_file(content))
        .then_some(())
        .ok_or_else(|| "not an object id".to_string()),
        _ => Ok(()),
    };
    result.err().map(|why| format!("{dir}/{file} {why}"))
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

/// The path a gitlink's `.git` file holds, when it is in the exact form git writes it
/// (`submodule.c`, `connect_work_tree_and_git_dir`: relative): `gitdir: `, one or more `../`,
/// then plain names (no `.`, no `..`, no empty one), a newline, nothing else. git takes the
/// bytes after `gitdir: ` as they are (`setup.c`, `read_gitfile_gently`: only the newline is
/// dropped) and resolves them through the filesystem, links included; the host resolves the
/// components this returns one by one, by descriptor, following no link, and keeps the
/// pointer only when that lands beneath `<common>/modules/` (`gitguard`). Pure.
pub fn gitlink_pointer_components(bytes: &[u8]) -> Option<Vec<&str>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let path = text.strip_prefix("gitdir: ")?.strip_suffix('\n')?;
    let parts: Vec<&str> = path.split('/').collect();
    let ups = parts.iter().take_while(|p| **p == "..").count();
    let names = &parts[ups..];
    let plain = |p: &&str| !p.is_empty() && *p != "." && *p != ".." && !p.contains(['\n', '\0']);
    (ups > 0 && !names.is_empty() && names.iter().all(plain)).then_some(parts)
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
        let problem =
            |dir: &str, file: &str, text: &str| sequencer_problem(dir, file, text.as_bytes(), &own);
        let todo = "pick 1234 a\nbreak\nexec touch /tmp/x\n";
        assert!(problem("rebase-merge", "git-rebase-todo", todo).is_some());
        assert!(problem("sequencer", "todo", "x make\n").is_some());
        let comment = "# exec is a command\npick 1 a\nbreak\n";
        assert!(problem("rebase-merge", "git-rebase-todo", comment).is_none());
        assert!(problem("rebase-merge", "done", todo).is_some());
        assert!(problem("rebase-merge", "done", "pick 1 a\n").is_none());
        let update = "pick 1 a\nupdate-ref refs/heads/main\n";
        assert!(problem("rebase-merge", "git-rebase-todo", update).is_some());
        let update = "pick 1 a\nupdate-ref refs/heads/task\n";
        assert!(problem("rebase-merge", "git-rebase-todo", update).is_none());
        assert!(problem("rebase-merge", "head-name", "refs/heads/main\n").is_some());
        assert!(problem("rebase-merge", "head-name", "refs/heads/task\n").is_none());
        assert!(problem("rebase-apply", "head-name", "detached HEAD\n").is_none());
        let refs = "refs/heads/main\n1234\n5678\n";
        assert!(problem("rebase-merge", "update-refs", refs).is_some());
        assert!(problem("rebase-merge", "strategy", "evil\n").is_some());
        assert!(problem("rebase-merge", "strategy", "ort /../evil\n").is_some());
        assert!(problem("rebase-merge", "strategy", "ort\n").is_none());
        assert!(problem("sequencer", "opts", "[options]\n\tstrategy = evil\n").is_some());
        assert!(problem("sequencer", "opts", "[options] strategy = evil\n").is_some());
        assert!(problem("rebase-merge", "onto", "ref: refs/heads/main\n").is_some());
        assert!(problem("rebase-merge", "message", "anything").is_none());
    }

    #[test]
    fn gitlink_pointers_only_in_gits_relative_form() {
        let ok = |text: &'static str| gitlink_pointer_components(text.as_bytes());
        assert_eq!(
            ok("gitdir: ../.git/modules/sub\n"),
            Some(vec!["..", ".git", "modules", "sub"])
        );
        assert!(ok("gitdir: ../../../repo/.git/modules/a/b\n").is_some());
        for bad in [
            "gitdir: ../.git/modules/sub",
            "gitdir:../.git/modules/sub\n",
            "gitdir: /repo/.git/modules/sub\n",
            "gitdir: ../.git/modules/sub/..\n",
            "gitdir: ../.git/modules/./sub\n",
            "gitdir: ../.git//modules/sub\n",
            "gitdir: ../.git/modules/sub/\n",
            "gitdir: ..\n",
            "gitdir: .planted\n",
            "gitdir: ../x\n\n",
            "not a pointer\n",
        ] {
            assert!(ok(bad).is_none(), "{bad:?}");
        }
    }
}
