//! The mounts of a project's VM, as data: for every sandbox view of the project, the view
//! (writable), its own worktree admin dir `worktrees/<view>` (writable) and its git store layer
//! (writable); the repository's common dir once, read-only. Nothing else — no home directory.
//! Guest paths equal host paths so that the view's `.git` pointer resolves inside.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use sandbox_git::{MountPurpose, View};

use crate::error::LimaError;

/// One Lima mount (`mounts:` entry).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LimaMount {
    pub location: PathBuf,
    pub mount_point: PathBuf,
    pub writable: bool,
}

/// The guest side of one view: what provisioning stacks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewLayout {
    /// A short stable id of the view (its mount namespace in the guest is named by it).
    pub id: String,
    pub view_path: PathBuf,
    pub common_dir: PathBuf,
    pub admin_dir: PathBuf,
    pub layer_dir: PathBuf,
}

/// A short id for a view path: the first 12 hex digits of its SHA-256.
pub fn view_id(view_path: &Path) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(view_path.as_os_str().as_encoded_bytes());
    digest.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

/// A path the guest's tools can take: absolute, UTF-8, no control characters (lima-init parses
/// cloud-init's mount list line by line), and none of `,` `:` `\`, which overlayfs options
/// cannot carry.
fn check(path: &Path) -> Result<(), LimaError> {
    let bad = |why| {
        Err(LimaError::BadPath {
            path: path.to_path_buf(),
            why,
        })
    };
    let Some(text) = path.to_str() else {
        return bad("it is not UTF-8");
    };
    if !path.is_absolute() {
        return bad("it is not absolute");
    }
    if text.chars().any(char::is_control) {
        return bad("it contains a control character");
    }
    if text.contains([',', ':', '\\']) {
        return bad(
            "the guest's git store overlay cannot layer a path containing ',', ':' or '\\'",
        );
    }
    Ok(())
}

/// The mount list for `views` (all of one project's views), parents before children, each
/// path once; and the guest layout of each view.
pub fn project_mounts(views: &[View]) -> Result<(Vec<LimaMount>, Vec<ViewLayout>), LimaError> {
    let mut views: Vec<&View> = views.iter().collect();
    views.sort_by(|a, b| a.view_path.cmp(&b.view_path));
    let mut commons: Vec<LimaMount> = Vec::new();
    let mut own: Vec<LimaMount> = Vec::new();
    let mut layouts = Vec::new();
    for view in views {
        for m in view.vm_mounts() {
            let wanted = matches!(
                m.purpose,
                MountPurpose::Worktree
                    | MountPurpose::GitCommonDir
                    | MountPurpose::GitStoreLayer
                    | MountPurpose::GitWorktreeAdmin
            );
            // hooks/ and config lie inside the read-only common dir: already read-only.
            if !wanted || !m.is_dir {
                continue;
            }
            check(&m.host_path)?;
            let mount = LimaMount {
                location: m.host_path.clone(),
                mount_point: m.guest_path.clone(),
                writable: m.writable,
            };
            let list = if m.purpose == MountPurpose::GitCommonDir {
                &mut commons
            } else {
                &mut own
            };
            if !list.iter().any(|x| x.location == mount.location) {
                list.push(mount);
            }
        }
        layouts.push(ViewLayout {
            id: view_id(&view.view_path),
            view_path: view.view_path.clone(),
            common_dir: view.common_dir.clone(),
            admin_dir: view.admin_dir(),
            layer_dir: view.store_layer_dir(),
        });
    }
    // A common dir must be mounted before the admin dirs nested in it.
    commons.extend(own);
    Ok((commons, layouts))
}

/// The mounts `want` has that `have` lacks (by location and mode).
pub fn missing(want: &[LimaMount], have: &[LimaMount]) -> Vec<LimaMount> {
    want.iter().filter(|m| !have.contains(m)).cloned().collect()
}
