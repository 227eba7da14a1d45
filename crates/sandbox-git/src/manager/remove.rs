//! Removing a view: its directory, worktree entry, git store layer, `s/<b>` and record.

use git2::{BranchType, Oid, Repository};
use serde::{Deserialize, Serialize};

use super::project_lock::ProjectLock;
use super::ViewManager;
use crate::error::ViewError;
use crate::meta;
use crate::names;
use crate::repo;
use crate::util::{q, short};
use crate::view::View;

/// The result of `remove`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Removed {
    #[serde(flatten)]
    pub view: View,
    /// Commits on `s/<b>` that were not on `<b>` and were dropped (only with `force`).
    pub dropped_commits: usize,
    /// Where `s/<b>` pointed when it was deleted (recover with `git branch s/<b> <id>`).
    pub child_tip: Option<String>,
}

impl ViewManager {
    /// Removes the view's directory, its worktree entry, `s/<b>` and its record. Refuses
    /// while `s/<b>` holds commits that `<b>` lacks, unless `force`.
    pub fn remove(&self, view: &View, force: bool) -> Result<Removed, ViewError> {
        let root = self.root()?.unwrap_or_else(|| self.root.clone());
        // The record was validated on read; check the path once more before deleting.
        let expected = names::view_path(&root, &view.project, &view.task)?;
        if view.view_path != expected {
            return Err(ViewError::OutsideViewsRoot {
                path: view.view_path.clone(),
                root,
            });
        }
        let _lock = ProjectLock::take(&root.join(&view.project))?;
        let common = repo::open_common(&view.common_dir).ok();
        let mut child_tip: Option<Oid> = None;
        let mut unmerged = 0;
        if let Some(common) = &common {
            if let Ok(c) = common.refname_to_id(&view.child_ref()) {
                child_tip = Some(c);
                unmerged = match common.refname_to_id(&view.branch_ref()) {
                    Ok(b) => {
                        common
                            .graph_ahead_behind(c, b)
                            .map_err(ViewError::git("cannot compare branches"))?
                            .0
                    }
                    Err(_) => count_commits(common, c),
                };
                if unmerged > 0 && !force {
                    return Err(ViewError::Unmerged {
                        child: view.child_branch.clone(),
                        branch: view.branch.clone(),
                        count: unmerged,
                        tip: short(&c),
                        worktree: view.task_worktree.clone(),
                    });
                }
            }
        }
        if view.view_path.symlink_metadata().is_ok() {
            std::fs::remove_dir_all(&view.view_path).map_err(ViewError::io(
                "cannot remove the view directory",
                &view.view_path,
            ))?;
        }
        let admin = view.admin_dir();
        if admin.symlink_metadata().is_ok() {
            std::fs::remove_dir_all(&admin)
                .map_err(ViewError::io("cannot remove the worktree entry", &admin))?;
        }
        let layer = view.store_layer_dir();
        if layer.symlink_metadata().is_ok() {
            use std::os::unix::fs::PermissionsExt;
            // overlayfs leaves its work/work without permissions.
            let _ = std::fs::set_permissions(
                layer.join("work/work"),
                std::fs::Permissions::from_mode(0o700),
            );
            std::fs::remove_dir_all(&layer)
                .map_err(ViewError::io("cannot remove the git store layer", &layer))?;
        }
        if let (Some(common), Some(tip)) = (&common, child_tip) {
            match common.find_branch(&view.child_branch, BranchType::Local) {
                Ok(mut branch) => {
                    // libgit2 deletes only if the ref still holds the value it just read,
                    // so a commit landing meanwhile keeps the branch.
                    let moved = branch.get().target() != Some(tip);
                    if moved {
                        return Err(ViewError::Git {
                            action: format!("deleting {}", view.child_branch),
                            message: format!(
                                "it moved while the view was being removed; it was kept. Delete it yourself if you mean to: git -C {} branch -D {}",
                                q(&view.task_worktree),
                                view.child_branch
                            ),
                        });
                    }
                    branch.delete().map_err(ViewError::git(format!(
                        "cannot delete branch {}",
                        view.child_branch
                    )))?;
                }
                Err(e) if e.code() == git2::ErrorCode::NotFound => {}
                Err(e) => {
                    return Err(ViewError::git(format!("cannot find {}", view.child_branch))(e))
                }
            }
        }
        meta::remove(&root, &view.project, &view.task)?;
        Ok(Removed {
            view: view.clone(),
            dropped_commits: if force { unmerged } else { 0 },
            child_tip: child_tip.map(|o| o.to_string()),
        })
    }
}

/// Commits reachable from `tip` (capped; only used when `<b>` itself is gone).
fn count_commits(repo: &Repository, tip: Oid) -> usize {
    let Ok(mut walk) = repo.revwalk() else {
        return 1;
    };
    if walk.push(tip).is_err() {
        return 1;
    }
    walk.take(100_000).count().max(1)
}
