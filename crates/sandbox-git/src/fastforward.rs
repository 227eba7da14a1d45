//! One fast-forward of `<b>` to `s/<b>`, done the way `git merge --ff-only` does it, and never
//! forced.
//!
//! If a worktree has `<b>` checked out, its files and index move with the branch:
//!
//! 1. Refuse (report `blocked`) if any file the update touches has uncommitted changes —
//!    staged, unstaged, or an untracked/ignored file in the way. Other changes are kept.
//! 2. Take the worktree's `index.lock`, exactly as git does, so no `git commit` can run in
//!    that worktree meanwhile. If git holds it, report `busy` and retry later.
//! 3. Check out `s/<b>`'s tree over `<b>`'s (libgit2 safe checkout) into a *copy* of the index.
//! 4. Move `<b>` with compare-and-swap (`reference_matching` with the old id): a branch that
//!    moved since we looked is never overwritten. If the swap fails, restore the touched
//!    files (they were clean, so nothing is lost) and leave the real index alone.
//! 5. Commit the index copy through the held lock (rename onto `index.lock`, then onto
//!    `index`), which also releases the lock.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

use git2::build::CheckoutBuilder;
use git2::{
    CheckoutNotificationType, Delta, Index, Oid, Repository, RepositoryState, Status,
    StatusOptions, Tree,
};

use crate::error::ViewError;
use crate::events::BlockReason;
use crate::repo::{self, Checkout};
use crate::status::{self, SyncState};
use crate::util::{canon, q};
use crate::view::View;

/// At most this many paths are listed in a `blocked` report.
const MAX_PATHS: usize = 20;

/// What one check of a view found or did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    InSync {
        commit: Oid,
    },
    /// `<b>` is ahead of `s/<b>`: nothing for the watcher to do.
    Behind {
        branch: Oid,
    },
    FastForwarded {
        from: Oid,
        to: Oid,
        commits: usize,
        worktree: Option<PathBuf>,
    },
    Diverged {
        branch: Oid,
        child: Oid,
        child_ahead: usize,
        branch_ahead: usize,
        merge_base: Option<String>,
    },
    Blocked {
        branch: Oid,
        child: Oid,
        worktree: PathBuf,
        reason: BlockReason,
        paths: Vec<String>,
        message: String,
        resolve: Vec<String>,
    },
    /// Someone moved `<b>` between our read and our swap; look again.
    Raced,
    /// `<b>` does not exist (deleted on the host); nothing to fast-forward.
    BranchMissing,
    /// The view is gone.
    Gone {
        reason: String,
    },
}

/// Looks at `view` once and fast-forwards `<b>` if that is due and safe.
///
/// `exclude` names worktree entries (views) whose checkout must never be written by the host.
pub(crate) fn step(
    common: &Repository,
    view: &View,
    exclude: &[String],
) -> Result<Step, ViewError> {
    step_with(common, view, exclude, &mut || {})
}

pub(crate) fn step_with(
    common: &Repository,
    view: &View,
    exclude: &[String],
    before_swap: &mut dyn FnMut(),
) -> Result<Step, ViewError> {
    if !view.view_path.is_dir() {
        return Ok(Step::Gone {
            reason: format!("its directory {} was removed", view.view_path.display()),
        });
    }
    let child = match common.refname_to_id(&view.child_ref()) {
        Ok(c) => c,
        Err(e) if e.code() == git2::ErrorCode::NotFound => {
            return Ok(Step::Gone {
                reason: format!("branch {} was deleted", view.child_branch),
            })
        }
        Err(e) => return Err(ViewError::git(format!("cannot read {}", view.child_branch))(e)),
    };
    let branch = match common.refname_to_id(&view.branch_ref()) {
        Ok(b) => b,
        Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok(Step::BranchMissing),
        Err(e) => return Err(ViewError::git(format!("cannot read {}", view.branch))(e)),
    };
    match status::relation(common, branch, child)? {
        SyncState::InSync => Ok(Step::InSync { commit: branch }),
        SyncState::Behind { .. } => Ok(Step::Behind { branch }),
        SyncState::Diverged {
            ahead,
            behind,
            merge_base,
        } => Ok(Step::Diverged {
            branch,
            child,
            child_ahead: ahead,
            branch_ahead: behind,
            merge_base,
        }),
        SyncState::Missing { .. } => Ok(Step::BranchMissing),
        SyncState::Ahead { ahead } => {
            let checkouts = repo::checkouts_of(
                common,
                &view.common_dir,
                &view.branch_ref(),
                exclude,
                &view.views_root(),
            )?;
            match checkouts.as_slice() {
                [] => {
                    before_swap();
                    if swap(common, view, branch, child)? {
                        Ok(Step::FastForwarded {
                            from: branch,
                            to: child,
                            commits: ahead,
                            worktree: None,
                        })
                    } else {
                        Ok(Step::Raced)
                    }
                }
                [one] => update_checkout(view, one, branch, child, ahead, before_swap),
                many => Ok(Step::Blocked {
                    branch,
                    child,
                    worktree: many[0].path.clone(),
                    reason: BlockReason::CheckedOutTwice,
                    paths: Vec::new(),
                    message: format!(
                        "{} is checked out in {} worktrees ({}); updating one would leave the others inconsistent",
                        view.branch,
                        many.len(),
                        many.iter()
                            .map(|c| c.path.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    resolve: vec![format!(
                        "switch all but one of them to another branch (git -C {} switch --detach)",
                        q(&many[1].path)
                    )],
                }),
            }
        }
    }
}

/// Moves `<b>` from `from` to `to` if it still is at `from`. `Ok(false)`: it was not.
fn swap(repo: &Repository, view: &View, from: Oid, to: Oid) -> Result<bool, ViewError> {
    let refname = view.branch_ref();
    let message = format!("sandbox: fast-forward to {}", view.child_branch);
    match repo.reference_matching(&refname, to, true, from, &message) {
        Ok(_) => Ok(true),
        Err(e) => match repo.refname_to_id(&refname) {
            // Moved by someone else, or its ref lock is held by a git command right now.
            Ok(now) if now != from => Ok(false),
            _ if e.code() == git2::ErrorCode::Locked => Ok(false),
            _ => Err(ViewError::git(format!("cannot update {}", view.branch))(e)),
        },
    }
}

/// The paths that differ between two trees, and those of them that are new.
fn touched_paths(
    repo: &Repository,
    from: &Tree,
    to: &Tree,
) -> Result<(Vec<String>, Vec<String>), ViewError> {
    let diff = repo
        .diff_tree_to_tree(Some(from), Some(to), None)
        .map_err(ViewError::git("cannot compare the two commits"))?;
    let mut touched = Vec::new();
    let mut added = Vec::new();
    for d in diff.deltas() {
        for f in [d.old_file(), d.new_file()] {
            if let Some(p) = f.path().and_then(Path::to_str) {
                touched.push(p.to_string());
            }
        }
        if d.status() == Delta::Added {
            if let Some(p) = d.new_file().path().and_then(Path::to_str) {
                added.push(p.to_string());
            }
        }
    }
    touched.sort();
    touched.dedup();
    Ok((touched, added))
}

/// Touched paths that have uncommitted changes (against the repository's current index),
/// plus anything on disk in the way of a new file.
fn dirty_paths(
    repo: &Repository,
    workdir: &Path,
    touched: &[String],
    added: &[String],
) -> Result<Vec<String>, ViewError> {
    let mut dirty = Vec::new();
    if !touched.is_empty() {
        let mut opts = StatusOptions::new();
        opts.include_untracked(true)
            .recurse_untracked_dirs(true)
            .include_ignored(true)
            .recurse_ignored_dirs(true)
            .include_unmodified(false)
            .disable_pathspec_match(true);
        for p in touched {
            opts.pathspec(p);
        }
        let statuses = repo
            .statuses(Some(&mut opts))
            .map_err(ViewError::git(format!(
                "cannot read the status of {}",
                workdir.display()
            )))?;
        for entry in statuses.iter() {
            if entry.status() != Status::CURRENT {
                if let Some(p) = entry.path() {
                    dirty.push(p.to_string());
                }
            }
        }
    }
    // A new file needs its directories: a file, symlink or directory already sitting at the
    // file's path or at one of its parents is in the way (git would refuse too).
    for p in added {
        let full = workdir.join(p);
        if full.symlink_metadata().is_ok_and(|m| m.is_dir()) {
            dirty.push(format!("{p}/"));
        }
        let mut parent = Path::new(p).parent();
        while let Some(a) = parent.filter(|a| !a.as_os_str().is_empty()) {
            let rel = a.to_string_lossy().into_owned();
            if !touched.contains(&rel)
                && workdir
                    .join(a)
                    .symlink_metadata()
                    .is_ok_and(|m| !m.is_dir())
            {
                dirty.push(rel);
            }
            parent = a.parent();
        }
    }
    dirty.sort();
    dirty.dedup();
    Ok(dirty)
}

/// The worktree's `index.lock`, taken exactly as git takes it (exclusive create).
struct IndexLock {
    lock: PathBuf,
    index: PathBuf,
    held: bool,
}

impl IndexLock {
    /// `Ok(None)`: someone else holds it.
    fn acquire(gitdir: &Path) -> Result<Option<IndexLock>, ViewError> {
        let lock = gitdir.join("index.lock");
        match OpenOptions::new().write(true).create_new(true).open(&lock) {
            Ok(_) => Ok(Some(IndexLock {
                lock,
                index: gitdir.join("index"),
                held: true,
            })),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(ViewError::io("cannot create", &lock)(e)),
        }
    }

    /// Installs `new_index` as the index; the rename onto `index` releases the lock.
    fn commit(mut self, new_index: &Path) -> std::io::Result<()> {
        std::fs::rename(new_index, &self.lock)?;
        std::fs::rename(&self.lock, &self.index)?;
        self.held = false;
        Ok(())
    }
}

impl Drop for IndexLock {
    fn drop(&mut self) {
        if self.held {
            let _ = std::fs::remove_file(&self.lock);
        }
    }
}

/// Removes a scratch file (and libgit2's lock for it) when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let mut lock = self.0.clone().into_os_string();
        lock.push(".lock");
        let _ = std::fs::remove_file(lock);
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

fn update_checkout(
    view: &View,
    co: &Checkout,
    from: Oid,
    to: Oid,
    commits: usize,
    before_swap: &mut dyn FnMut(),
) -> Result<Step, ViewError> {
    let wt_q = q(&co.path);
    let blocked =
        |reason: BlockReason, mut paths: Vec<String>, message: String, resolve: Vec<String>| {
            paths.truncate(MAX_PATHS);
            Step::Blocked {
                branch: from,
                child: to,
                worktree: co.path.clone(),
                reason,
                paths,
                message,
                resolve,
            }
        };
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
    let state = wt.state();
    if state != RepositoryState::Clean {
        return Ok(blocked(
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
    let dirty_report = |paths: Vec<String>| {
        let shown = paths.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
        let more = if paths.len() > 5 {
            format!(" and {} more", paths.len() - 5)
        } else {
            String::new()
        };
        blocked(
            BlockReason::Dirty,
            paths,
            format!(
                "{} has uncommitted changes in files the update would change ({shown}{more})",
                co.path.display()
            ),
            vec![
                format!("git -C {wt_q} stash"),
                format!("git -C {wt_q} commit -a"),
                "then the watcher retries on its own".to_string(),
            ],
        )
    };
    // First without the lock: a dirty worktree never sees our index.lock come and go.
    let dirty = dirty_paths(&wt, &co.path, &touched, &added)?;
    if !dirty.is_empty() {
        return Ok(dirty_report(dirty));
    }

    let Some(lock) = IndexLock::acquire(&co.gitdir)? else {
        let lock_path = co.gitdir.join("index.lock");
        return Ok(blocked(
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
        return Ok(blocked(
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
        return Ok(dirty_report(dirty));
    }
    // Directories the checkout will create, so a rollback can take them away again.
    let mut new_dirs: Vec<PathBuf> = Vec::new();
    for p in &added {
        let mut parent = Path::new(p).parent();
        while let Some(a) = parent.filter(|a| !a.as_os_str().is_empty()) {
            let full = co.path.join(a);
            if !full.symlink_metadata().is_ok_and(|m| m.is_dir()) && !new_dirs.contains(&full) {
                new_dirs.push(full);
            }
            parent = a.parent();
        }
    }

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
        wt.checkout_tree(to_tree.as_object(), Some(&mut cb))
    };
    if let Err(e) = result {
        if e.code() == git2::ErrorCode::Conflict || !conflicts.is_empty() {
            // libgit2 finds conflicts before it writes anything.
            return Ok(dirty_report(conflicts));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::ViewManager;

    use sandbox_testkit::git;

    /// The swap losing a race (someone moves `<b>` between our checkout and our swap) must
    /// leave the task worktree exactly as it was and the other writer's commit in place.
    #[test]
    fn lost_race_restores_the_worktree() {
        let tmp = tempfile::tempdir().unwrap();
        let main = tmp.path().join("app");
        std::fs::create_dir(&main).unwrap();
        git(&main, &["init", "-q", "-b", "main"]);
        std::fs::write(main.join("a.txt"), "a\n").unwrap();
        std::fs::write(main.join("keep.txt"), "keep\n").unwrap();
        git(&main, &["add", "."]);
        git(&main, &["commit", "-qm", "init"]);
        let task = tmp.path().join("task1");
        git(
            &main,
            &[
                "worktree",
                "add",
                "-q",
                "-b",
                "task1",
                task.to_str().unwrap(),
            ],
        );
        let views = ViewManager::new(tmp.path().join("views"));
        let view = views.create_or_reuse(&task, None).unwrap().view;

        std::fs::write(view.view_path.join("a.txt"), "from the agent\n").unwrap();
        std::fs::create_dir(view.view_path.join("new")).unwrap();
        std::fs::write(view.view_path.join("new/b.txt"), "b\n").unwrap();
        git(&view.view_path, &["add", "."]);
        git(&view.view_path, &["commit", "-qm", "agent"]);
        // The racer's commit, somewhere else entirely.
        git(&main, &["commit", "-q", "--allow-empty", "-m", "host"]);
        // An unrelated local change in the task worktree must survive everything.
        std::fs::write(task.join("keep.txt"), "local edit\n").unwrap();
        let before = git(&task, &["rev-parse", "task1"]);
        let index_before = std::fs::read(view.common_dir.join("worktrees/task1/index")).unwrap();

        let common = repo::open_common(&view.common_dir).unwrap();
        let mut racer = || {
            git(&main, &["update-ref", "refs/heads/task1", "main"]);
        };
        let step = step_with(
            &common,
            &view,
            std::slice::from_ref(&view.worktree_name),
            &mut racer,
        )
        .unwrap();
        assert_eq!(step, Step::Raced);
        // The other writer's value stands; the agent's commit is still on s/task1.
        assert_eq!(
            git(&task, &["rev-parse", "task1"]),
            git(&main, &["rev-parse", "main"])
        );
        assert_ne!(git(&task, &["rev-parse", "s/task1"]), before);
        // Files as they were, the unrelated edit kept, no new files, index untouched, no lock.
        assert_eq!(std::fs::read_to_string(task.join("a.txt")).unwrap(), "a\n");
        assert_eq!(
            std::fs::read_to_string(task.join("keep.txt")).unwrap(),
            "local edit\n"
        );
        assert!(!task.join("new").exists());
        assert_eq!(
            std::fs::read(view.common_dir.join("worktrees/task1/index")).unwrap(),
            index_before
        );
        assert!(!view.common_dir.join("worktrees/task1/index.lock").exists());
        assert!(!view
            .common_dir
            .join("worktrees/task1/sandbox-ff.index")
            .exists());
    }
}
