//! The one write to `<b>`: a compare-and-swap.

use git2::{Oid, Repository};

use crate::error::ViewError;
use crate::view::View;

/// Moves `<b>` from `from` to `to` if it still is at `from`. `Ok(false)`: it was not.
pub(super) fn swap(repo: &Repository, view: &View, from: Oid, to: Oid) -> Result<bool, ViewError> {
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
