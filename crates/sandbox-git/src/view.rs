//! The sandbox view itself: where its parts live, and whether it is intact on disk.
//!
//! The other modules build on this one (the view's record, its mounts, its status, the
//! fast-forward, the watcher, the manager); it imports none of them.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::repo;
use crate::util::{canon, read_pointer};

/// A sandbox view: a linked worktree of tracked files on `s/<branch>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct View {
    /// The repository's name (`<project>` in the view path).
    pub project: String,
    /// The task name (`<task>` in the view path).
    pub task: String,
    /// The task's branch `<b>`, which the watcher fast-forwards.
    pub branch: String,
    /// `s/<b>`, checked out in the view.
    pub child_branch: String,
    /// `<views root>/<project>/<task>-sandbox`: what a VM mounts as the agent's directory.
    pub view_path: PathBuf,
    /// The task worktree the view was made from.
    pub task_worktree: PathBuf,
    /// The repository's common git directory.
    pub common_dir: PathBuf,
    /// The view's name in `<common>/worktrees/` (`<task>-sandbox`).
    pub worktree_name: String,
}

impl View {
    /// `<views root>/<project>/<task>-sandbox.git-layer`: the writable layer of the git store
    /// the VM stacks over the read-only common dir (`upper/`, `work/`). See
    /// [`mounts`](crate::mounts).
    pub fn store_layer_dir(&self) -> PathBuf {
        let mut name = self.view_path.as_os_str().to_os_string();
        name.push(".git-layer");
        PathBuf::from(name)
    }

    /// `<common>/worktrees/<view>`: the view's HEAD, index and reflog.
    pub fn admin_dir(&self) -> PathBuf {
        self.common_dir.join("worktrees").join(&self.worktree_name)
    }

    pub fn branch_ref(&self) -> String {
        format!("refs/heads/{}", self.branch)
    }

    pub fn child_ref(&self) -> String {
        format!("refs/heads/{}", self.child_branch)
    }

    /// The views root this view lives in.
    pub(crate) fn views_root(&self) -> PathBuf {
        self.view_path
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }

    /// What is wrong with the view on disk (empty when healthy). Only reads.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let admin = self.admin_dir();
        let dotgit = self.view_path.join(".git");
        if !self.view_path.is_dir() {
            out.push(format!(
                "its directory {} is missing",
                self.view_path.display()
            ));
        } else {
            match read_pointer(&dotgit, "gitdir: ", &self.view_path) {
                Some(p) if canon(&p) == canon(&admin) => {}
                _ => out.push(format!(
                    "{} does not point to {} (was it rewritten from inside the sandbox?)",
                    dotgit.display(),
                    admin.display()
                )),
            }
        }
        if !admin.is_dir() {
            out.push(format!(
                "its worktree registration {} is missing",
                admin.display()
            ));
        } else {
            match read_pointer(&admin.join("gitdir"), "", &admin) {
                Some(p) if canon(&p) == canon(&dotgit) => {}
                _ => out.push(format!(
                    "{} does not point to {}",
                    admin.join("gitdir").display(),
                    dotgit.display()
                )),
            }
            let head = std::fs::read_to_string(admin.join("HEAD")).unwrap_or_default();
            if head.trim_end().strip_prefix("ref: ") != Some(self.child_ref().as_str()) {
                out.push(format!(
                    "its HEAD is not on {} (switch back inside the view: git switch {})",
                    self.child_branch, self.child_branch
                ));
            }
        }
        if let Ok(repo) = repo::open_common(&self.common_dir) {
            if repo.refname_to_id(&self.child_ref()).is_err() {
                out.push(format!("branch {} is missing", self.child_branch));
            }
        } else {
            out.push(format!(
                "its repository {} cannot be opened",
                self.common_dir.display()
            ));
        }
        out
    }
}
