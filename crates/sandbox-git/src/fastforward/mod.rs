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

mod checkout;
mod index;
mod outcome;
mod paths;
mod swap;
#[cfg(test)]
mod tests;

use git2::Repository;

use crate::error::ViewError;
use crate::events::BlockReason;
use crate::repo;
use crate::status::{self, SyncState};
use crate::util::q;
use crate::view::View;
use checkout::update_checkout;
use swap::swap;

pub(crate) use outcome::Step;

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
