//! The fast-forward of a branch that a worktree has checked out: its files and index move
//! with it, the way `git merge --ff-only` moves them (the module docs of `fastforward` list
//! the steps), or nothing moves and the step says why.

use std::path::{Path, PathBuf};

use git2::build::CheckoutBuilder;
use git2::{CheckoutNotificationType, Index, Oid, Repository, RepositoryState, Tree};

use super::index::{IndexLock, Scratch};
use super::outcome::Step;
use super::paths::{dirty_paths, touched_paths};
use super::swap::swap;
use crate::error::ViewError;
use crate::events::BlockReason;
use crate::repo::{self, Checkout};
use crate::util::{canon, q};
use crate::view::View;

/// At most this many paths are listed in a `blocked` report.
const MAX_PATHS: usize = 20;

/// The `blocked` steps of one update: all of the same move of `<b>`, in the same worktree.
struct Blocked<'a> {
    from: Oid,
    to: Oid,
    co: &'a Checkout,
}

impl Blocked<'_> {
    fn step(
        &self,
        reason: BlockReason,
        mut paths: Vec<String>,
        message: String,
        resolve: Vec<String>,
    ) -> Step {
        paths.truncate(MAX_PATHS);
        Step::Blocked {
            branch: self.from,
            child: self.to,
            worktree: self.co.path.clone(),
            reason,
            paths,
            message,
            resolve,
        }
    }

    /// Files the update would change have uncommitted changes (or are in its way).
    fn dirty(&self, paths: Vec<String>) -> Step {
        let wt_q = q(&self.co.path);
        let shown = paths.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
        let more = if paths.len() > 5 {
            format!(" and {} more", paths.len() - 5)
        } else {
            String::new()
        };
        self.step(
            BlockReason::Dirty,
            paths,
            format!(
                "{} has uncommitted changes in files the update would change ({shown}{more})",
                self.co.path.display()
            ),
            vec![
                format!("git -C {wt_q} stash"),
                format!("git -C {wt_q} commit -a"),
                "then the watcher retries on its own".to_string(),
            ],
        )
    }
}

fn state_name(state: RepositoryState) -> &'static str {
    use RepositoryState::*;
    match state {
        Clean => "clean state",
        Merge => "merge",
        Revert | RevertSequence => "revert",
        CherryPick | CherryPickSequence => "cherry-pick",
        Bisect => "bisect",
        Rebase | RebaseInteractive | RebaseMerge => "rebase",
        ApplyMailbox | ApplyMailboxOrRebase => "git am",
    }
}

/// Moves `<b>` from `from` to `to` together with the files and index of the one worktree `co`
/// that has it checked out.
pub(super) fn update_checkout(
    view: &View,
    co: &Checkout,
    from: Oid,
    to: Oid,
    commits: usize,
    before_swap: &mut dyn FnMut(),
) -> Result<Step, ViewError> {
    let wt_q = q(&co.path);
    let blocked = Blocked { from, to, co };
    let wt = open_worktree(view, co)?;
    let state = wt.state();
    if state != RepositoryState::Clean {
        return Ok(blocked.step(
            BlockReason::OperationInProgress,
            Vec::new(),
            format!(
                "{} is in the middle of a {}",
                co.path.display(),
                state_name(state)
            ),
            vec![format!(
                "finish or abort it (git -C {wt_q} status tells how); the watcher retries"
            )],
        ));
    }
    let tree = |id: Oid| {
        wt.find_commit(id)
            .and_then(|c| c.tree())
            .map_err(ViewError::git(format!("cannot read commit {id}")))
    };
    let (from_tree, to_tree) = (tree(from)?, tree(to)?);
    let (touched, added) = touched_paths(&wt, &from_tree, &to_tree)?;
    // First without the lock: a dirty worktree never sees our index.lock come and go.
    let dirty = dirty_paths(&wt, &co.path, &touched, &added)?;
    if !dirty.is_empty() {
        return Ok(blocked.dirty(dirty));
    }

    let Some(lock) = IndexLock::acquire(&co.gitdir)? else {
        let lock_path = co.gitdir.join("index.lock");
        return Ok(blocked.step(
            BlockReason::Busy,
            Vec::new(),
            format!(
                "another git command is using {} ({} exists)",
                co.path.display(),
                lock_path.display()
            ),
            vec![format!(
                "if no git command is running there, remove the stale lock: rm {}",
                q(&lock_path)
            )],
        ));
    };
    // Under the lock nothing can commit in this worktree; re-check what we decided on.
    if wt.refname_to_id(&view.branch_ref()).ok() != Some(from)
        || std::fs::read_to_string(co.gitdir.join("HEAD"))
            .unwrap_or_default()
            .trim_end()
            != format!("ref: {}", view.branch_ref())
    {
        return Ok(Step::Raced);
    }
    let real_index = co.gitdir.join("index");
    let scratch = Scratch(co.gitdir.join("sandbox-ff.index"));
    let _ = std::fs::remove_file(format!("{}.lock", scratch.0.display()));
    std::fs::copy(&real_index, &scratch.0)
        .map_err(ViewError::io("cannot copy the index", &real_index))?;
    let mut index = Index::open(&scratch.0).map_err(ViewError::git(format!(
        "cannot read the index of {}",
        co.path.display()
    )))?;
    if index.has_conflicts() {
        return Ok(blocked.step(
            BlockReason::Conflicts,
            Vec::new(),
            format!(
                "{} has unresolved conflicts in its index",
                co.path.display()
            ),
            vec![format!("resolve them (git -C {wt_q} status)")],
        ));
    }
    wt.set_index(&mut index)
        .map_err(ViewError::git("cannot use the index copy"))?;
    let dirty = dirty_paths(&wt, &co.path, &touched, &added)?;
    if !dirty.is_empty() {
        return Ok(blocked.dirty(dirty));
    }
    let new_dirs = new_dirs(&co.path, &added);

    let (result, conflicts) = check_out(&wt, &to_tree);
    if let Err(e) = result {
        if e.code() == git2::ErrorCode::Conflict || !conflicts.is_empty() {
            // libgit2 finds conflicts before it writes anything.
            return Ok(blocked.dirty(conflicts));
        }
        restore(&co.path, &from_tree, &touched, &added, &new_dirs);
        return Err(ViewError::git(format!(
            "cannot update the files of {}",
            co.path.display()
        ))(e));
    }

    before_swap();
    if !swap(&wt, view, from, to)? {
        restore(&co.path, &from_tree, &touched, &added, &new_dirs);
        return Ok(Step::Raced);
    }
    if let Err(e) = lock.commit(&scratch.0) {
        return Err(ViewError::Io {
            action: format!(
                "fast-forwarded {} and its files, but could not write the index; \
                 run `git -C {wt_q} reset` to bring the index up to date. Writing",
                view.branch
            ),
            path: real_index,
            source: e,
        });
    }
    Ok(Step::FastForwarded {
        from,
        to,
        commits,
        worktree: Some(co.path.clone()),
    })
}

/// Opens the worktree `co`, refusing one whose `.git` does not lead to its entry in the
/// view's repository.
fn open_worktree(view: &View, co: &Checkout) -> Result<Repository, ViewError> {
    let wt_q = q(&co.path);
    let wt = repo::open_exact(&co.path).map_err(ViewError::git(format!(
        "cannot open the worktree {}",
        co.path.display()
    )))?;
    if canon(wt.commondir()) != view.common_dir || canon(wt.path()) != canon(&co.gitdir) {
        return Err(ViewError::Git {
            action: format!("checking {}", co.path.display()),
            message: format!(
                "its .git does not lead to {} of repository {}; repair it (git -C {wt_q} worktree repair)",
                co.gitdir.display(),
                view.common_dir.display()
            ),
        });
    }
    Ok(wt)
}

/// Directories the checkout will create, so a rollback can take them away again.
fn new_dirs(workdir: &Path, added: &[String]) -> Vec<PathBuf> {
    let mut new_dirs: Vec<PathBuf> = Vec::new();
    for p in added {
        let mut parent = Path::new(p).parent();
        while let Some(a) = parent.filter(|a| !a.as_os_str().is_empty()) {
            let full = workdir.join(a);
            if !full.symlink_metadata().is_ok_and(|m| m.is_dir()) && !new_dirs.contains(&full) {
                new_dirs.push(full);
            }
            parent = a.parent();
        }
    }
    new_dirs
}

/// Checks `to` out over the worktree, into the index `wt` uses (libgit2's safe checkout):
/// its result, and the paths it found in conflict.
fn check_out(wt: &Repository, to: &Tree) -> (Result<(), git2::Error>, Vec<String>) {
    let mut conflicts: Vec<String> = Vec::new();
    let result = {
        let mut cb = CheckoutBuilder::new();
        cb.safe();
        cb.notify_on(CheckoutNotificationType::CONFLICT);
        cb.notify(|_, path, _, _, _| {
            if let Some(p) = path {
                conflicts.push(p.to_string_lossy().into_owned());
            }
            true
        });
        wt.checkout_tree(to.as_object(), Some(&mut cb))
    };
    (result, conflicts)
}

/// Puts the touched files back as they were at `from`. They were clean before we wrote
/// them, so this restores exactly the user's files. Best effort: it runs on a failure path.
fn restore(
    workdir: &Path,
    from: &Tree,
    touched: &[String],
    added: &[String],
    new_dirs: &[PathBuf],
) {
    for p in added {
        let _ = std::fs::remove_file(workdir.join(p));
    }
    let mut dirs = new_dirs.to_vec();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for d in dirs {
        let _ = std::fs::remove_dir(d);
    }
    let old: Vec<&String> = touched
        .iter()
        .filter(|p| from.get_path(Path::new(p)).is_ok())
        .collect();
    // An empty path list would mean "everything": never force a whole checkout.
    if old.is_empty() {
        return;
    }
    // A fresh handle: its index is the real one, untouched by the update.
    let Ok(repo) = repo::open_exact(workdir) else {
        return;
    };
    let Ok(tree) = repo.find_tree(from.id()) else {
        return;
    };
    let mut cb = CheckoutBuilder::new();
    cb.force().update_index(false).disable_pathspec_match(true);
    for p in old {
        cb.path(p.as_str());
    }
    if let Err(e) = repo.checkout_tree(tree.as_object(), Some(&mut cb)) {
        tracing::error!("could not restore the files of {}: {e}", workdir.display());
    }
}
