//! Creating a view, or finding the existing one healthy: `s/<b>` prepared, the worktree
//! added, its record written, the directories its mounts need made.

use std::path::Path;

use git2::{Oid, Repository, WorktreeAddOptions};
use serde::{Deserialize, Serialize};

use super::project_lock::ProjectLock;
use super::ViewManager;
use crate::error::ViewError;
use crate::meta;
use crate::names;
use crate::repo;
use crate::status::{self, SyncState};
use crate::util::{canon, read_pointer, short};
use crate::view::View;

/// What `create_or_reuse` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CreateOutcome {
    /// A new view was made.
    Created,
    /// A healthy view existed and is returned as is.
    Reused,
    /// The view was recorded but its directory was gone: it was checked out again on the
    /// existing `s/<b>`, whose commits are kept.
    Recreated,
}

/// The result of `create_or_reuse`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Created {
    #[serde(flatten)]
    pub view: View,
    pub outcome: CreateOutcome,
    /// Where `s/<b>` stands relative to `<b>` now.
    pub sync: SyncState,
}

impl ViewManager {
    /// Creates the view of the task worktree containing `task_worktree`, or returns the
    /// existing one if it is healthy. `task` defaults to the worktree directory's name.
    pub fn create_or_reuse(
        &self,
        task_worktree: &Path,
        task: Option<&str>,
    ) -> Result<Created, ViewError> {
        let root = self.created_root()?;
        let repo = repo::discover(task_worktree)?;
        let project = repo::project_of(&repo)?;
        let checkout = repo::task_checkout(&repo)?;
        if checkout.worktree.starts_with(&root) {
            return Err(ViewError::IsAView {
                path: checkout.worktree,
                root,
            });
        }
        let task = match task {
            Some(t) => t.to_string(),
            None => checkout
                .worktree
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        names::validate_task(&task)?;
        let view_path = names::view_path(&root, &project.name, &task)?;
        let project_dir = root.join(&project.name);
        let _lock = ProjectLock::take(&project_dir)?;
        // A symlinked project directory could lead out of the root.
        if canon(&project_dir).parent() != Some(root.as_path()) {
            return Err(ViewError::OutsideViewsRoot {
                path: view_path,
                root,
            });
        }
        let view = View {
            project: project.name.clone(),
            task: task.clone(),
            child_branch: names::child_branch(&checkout.branch)?,
            branch: checkout.branch.clone(),
            view_path,
            task_worktree: checkout.worktree.clone(),
            common_dir: project.common_dir.clone(),
            worktree_name: names::worktree_name(&task),
        };
        let common = repo::open_common(&project.common_dir)?;

        let outcome = match meta::read(&root, &project.name, &task)? {
            Some(recorded) => {
                if recorded.common_dir != project.common_dir {
                    return Err(ViewError::NameTaken {
                        view_path: recorded.view_path,
                        other: recorded.common_dir,
                        this: project.common_dir,
                    });
                }
                if recorded.branch != checkout.branch {
                    return Err(ViewError::BranchMismatch {
                        task,
                        recorded: recorded.branch,
                        current: checkout.branch,
                        worktree: checkout.worktree,
                    });
                }
                let problems = view.problems();
                if problems.is_empty() {
                    if recorded.task_worktree != view.task_worktree {
                        // The task worktree was moved (git worktree move): follow it.
                        meta::write(&root, &view)?;
                    }
                    CreateOutcome::Reused
                } else if !view.view_path.exists() {
                    self.clear_stale_admin(&view)?;
                    prepare_child(&common, &view, checkout.head)?;
                    add_worktree(&common, &view)?;
                    meta::write(&root, &view)?;
                    CreateOutcome::Recreated
                } else {
                    return Err(ViewError::Unhealthy {
                        task,
                        view_path: view.view_path,
                        problems: problems.join("; "),
                    });
                }
            }
            None => {
                if view.view_path.symlink_metadata().is_ok() {
                    return Err(ViewError::PathOccupied {
                        path: view.view_path,
                    });
                }
                self.clear_stale_admin(&view)?;
                prepare_child(&common, &view, checkout.head)?;
                add_worktree(&common, &view)?;
                meta::write(&root, &view)?;
                CreateOutcome::Created
            }
        };
        ensure_mount_sources(&view.common_dir)?;
        ensure_store_layer(&view)?;
        let sync = self.sync_of(&common, &view)?;
        Ok(Created {
            view,
            outcome,
            sync,
        })
    }

    /// A `worktrees/<name>` entry left behind by a view whose directory is gone is removed;
    /// anything else by that name is someone else's and stops us.
    fn clear_stale_admin(&self, view: &View) -> Result<(), ViewError> {
        let admin = view.admin_dir();
        if admin.symlink_metadata().is_err() {
            return Ok(());
        }
        let points_to_view = read_pointer(&admin.join("gitdir"), "", &admin)
            .is_some_and(|p| p == view.view_path.join(".git"));
        if points_to_view && !view.view_path.exists() {
            std::fs::remove_dir_all(&admin).map_err(ViewError::io(
                "cannot remove the stale worktree entry",
                &admin,
            ))?;
            Ok(())
        } else {
            Err(ViewError::PathOccupied { path: admin })
        }
    }
}

/// Makes `s/<b>` ready for a new view: created at `<b>`, kept if it is at or ahead of `<b>`,
/// moved up to `<b>` if it is behind, refused if the two have diverged.
fn prepare_child(common: &Repository, view: &View, head: Oid) -> Result<(), ViewError> {
    let child_ref = view.child_ref();
    match common.refname_to_id(&child_ref) {
        Ok(existing) => match status::relation(common, head, existing)? {
            SyncState::InSync | SyncState::Ahead { .. } => Ok(()),
            SyncState::Behind { .. } => {
                // Start the view at <b>, as a new one would; compare-and-swap so a writer
                // racing us is never overwritten.
                common
                    .reference_matching(
                        &child_ref,
                        head,
                        true,
                        existing,
                        &format!("sandbox: view starts at {}", view.branch),
                    )
                    .map_err(ViewError::git(format!(
                        "cannot move {} up to {}",
                        view.child_branch, view.branch
                    )))?;
                Ok(())
            }
            SyncState::Diverged { .. } | SyncState::Missing { .. } => {
                Err(ViewError::ChildBranchUnrelated {
                    branch: view.branch.clone(),
                    child: view.child_branch.clone(),
                    branch_commit: short(&head),
                    child_commit: short(&existing),
                })
            }
        },
        Err(e) if e.code() == git2::ErrorCode::NotFound => {
            let commit = common
                .find_commit(head)
                .map_err(ViewError::git(format!("cannot read commit {head}")))?;
            common
                .branch(&view.child_branch, &commit, false)
                .map_err(ViewError::git(format!(
                    "cannot create branch {}",
                    view.child_branch
                )))?;
            Ok(())
        }
        Err(e) => Err(ViewError::git(format!("cannot read {child_ref}"))(e)),
    }
}

/// `git worktree add <view> s/<b>`, through libgit2: a plain checkout of tracked files.
fn add_worktree(common: &Repository, view: &View) -> Result<(), ViewError> {
    if let Some(parent) = view.view_path.parent() {
        std::fs::create_dir_all(parent).map_err(ViewError::io("cannot create", parent))?;
    }
    let reference = common
        .find_reference(&view.child_ref())
        .map_err(ViewError::git(format!("cannot find {}", view.child_branch)))?;
    let mut opts = WorktreeAddOptions::new();
    opts.reference(Some(&reference));
    if let Err(e) = common.worktree(&view.worktree_name, &view.view_path, Some(&opts)) {
        // Leave nothing half-made: both paths were checked to be absent before.
        let _ = std::fs::remove_dir_all(&view.view_path);
        let _ = std::fs::remove_dir_all(view.admin_dir());
        let hint = if e.message().contains("already checked out") {
            format!(
                " ({} is checked out in another worktree; switch that one to another branch)",
                view.child_branch
            )
        } else {
            String::new()
        };
        return Err(ViewError::Git {
            action: format!(
                "cannot add the worktree {} on {}",
                view.view_path.display(),
                view.child_branch
            ),
            message: format!("{}{hint}", e.message()),
        });
    }
    Ok(())
}

/// VM backends mount `logs/` and `hooks/`; git creates them lazily, a mount needs them now.
/// The view's git store layer, private to the user (what lands there is the VM's until the
/// host applies it).
fn ensure_store_layer(view: &View) -> Result<(), ViewError> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = view.store_layer_dir();
    for sub in ["upper", "work"] {
        let p = dir.join(sub);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&p)
            .map_err(ViewError::io("cannot create", &p))?;
    }
    Ok(())
}

fn ensure_mount_sources(common_dir: &Path) -> Result<(), ViewError> {
    for d in ["logs", "hooks", "refs"] {
        let p = common_dir.join(d);
        if !p.exists() {
            std::fs::create_dir_all(&p).map_err(ViewError::io("cannot create", &p))?;
        }
    }
    Ok(())
}
