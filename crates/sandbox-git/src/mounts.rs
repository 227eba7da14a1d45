//! What a VM backend mounts for a view, as data.
//!
//! The git-data rule is the same for every backend: the agent writes the view and the view's
//! own `worktrees/<view>`; the repository's common git directory is read-only, whole. New
//! objects and ref updates go to the view's *git store layer*
//! ([`View::store_layer_dir`](crate::View::store_layer_dir)): the guest mounts an overlay on
//! the common dir with `<layer>/upper` as its writable layer and `<layer>/work` as its work
//! dir, exactly as the native backend's private view does on the host. The host reads the
//! layer back with [`crate::quarantine`] — objects by hash, `s/<branch>` and refs the VM
//! creates by compare-and-swap, nothing else — and the watcher alone moves `<branch>`. So
//! nothing inside the VM can move `<branch>`, another task's branch or a tag, replace an
//! object, or plant code (hooks, config) the host later runs.
//!
//! Guest paths equal host paths: the view's `.git` file names the common directory by its
//! absolute host path, so git inside the guest only works if the layout is the same.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::view::View;

/// Why a path is in the mount list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MountPurpose {
    /// The view itself: the agent's working directory.
    Worktree,
    /// The common git directory as a whole (read-only base under the writable overlays).
    GitCommonDir,
    /// The git store layer: the writable layer of the guest's overlay on the common dir
    /// (`upper/`, `work/`), which the host reads back and applies what is allowed from.
    GitStoreLayer,
    /// `worktrees/<view>`: the view's own HEAD and index.
    GitWorktreeAdmin,
    /// `hooks/`: executable on the host, so never writable from inside.
    GitHooks,
    /// `config`: can name programs the host's git runs, so never writable from inside.
    GitConfig,
}

/// One path a VM backend exposes to the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    pub host_path: PathBuf,
    /// Where the guest sees it: always the same as `host_path` (see the module docs).
    pub guest_path: PathBuf,
    pub writable: bool,
    /// A directory (mountable on its own) or a single file (enforced by the enclosing
    /// read-only mount; listed so policy displays and path-based backends see it).
    pub is_dir: bool,
    pub purpose: MountPurpose,
}

impl View {
    /// The paths a VM backend mounts for this view, with their mode. See [`mounts`](self).
    pub fn vm_mounts(&self) -> Vec<Mount> {
        for_view(self)
    }
}

impl Mount {
    fn new(host_path: PathBuf, writable: bool, is_dir: bool, purpose: MountPurpose) -> Self {
        Mount {
            guest_path: host_path.clone(),
            host_path,
            writable,
            is_dir,
            purpose,
        }
    }
}

/// The mounts for `view`, parents before children: mounting them in this order yields the
/// required layering (a read-only common directory with writable holes).
pub fn for_view(view: &View) -> Vec<Mount> {
    use MountPurpose::*;
    let c = &view.common_dir;
    vec![
        Mount::new(view.view_path.clone(), true, true, Worktree),
        Mount::new(c.clone(), false, true, GitCommonDir),
        Mount::new(c.join("hooks"), false, true, GitHooks),
        Mount::new(c.join("config"), false, false, GitConfig),
        Mount::new(view.store_layer_dir(), true, true, GitStoreLayer),
        Mount::new(
            c.join("worktrees").join(&view.worktree_name),
            true,
            true,
            GitWorktreeAdmin,
        ),
    ]
}
