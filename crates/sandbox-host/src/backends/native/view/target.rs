//! Where a mount of the view lands, and where a bind's source is taken from. Inside a tree a run can write (the private home, the
//! worktree, a writable grant, a cache overlay), a run of the same project may swap a
//! directory for a link between the host's preparation and this child's mount: the target is
//! then opened beneath the directory above that tree, no link followed in any component
//! ([`sys::open_beneath`]), and the mount made onto the descriptor (`/proc/self/fd/N`).
//! Elsewhere (the view's own tmpfs, read-only binds) the path is used as it is.

use std::collections::BTreeSet;
use std::ffi::{CStr, CString};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;

use super::cstring;
use crate::error::HostError;
use crate::sys;

/// A mount target in the staging tree.
#[derive(Debug)]
pub(super) struct Target {
    /// Its path under the staging directory.
    path: CString,
    /// In a run-writable tree: the directory above the tree (ours) and the rest, opened
    /// beneath it.
    beneath: Option<(CString, CString)>,
}

/// The target `path` of the view under `staging`. `writable`: the view's paths where a tree
/// the run can write was mounted so far (as the plan's operations come, parents first). With
/// `staging` `/` and the host's paths of those trees, a bind's source on the host.
pub(super) fn target(
    staging: &Path,
    writable: &BTreeSet<PathBuf>,
    path: &Path,
) -> Result<Target, HostError> {
    let inside = |p: &Path| cstring(&staging.join(p.strip_prefix("/").unwrap_or(p)));
    // The outermost writable tree the path is strictly inside.
    let tree = path
        .ancestors()
        .skip(1)
        .filter(|a| writable.contains(*a))
        .last();
    let beneath = match tree.and_then(|t| t.parent().map(|above| (t, above))) {
        None => None,
        Some((_, above)) => {
            let rel = path.strip_prefix(above).unwrap_or(path);
            if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
                return Err(HostError::ViewPath {
                    path: path.to_path_buf(),
                    cause: "not a plain path beneath the tree it is mounted in".into(),
                });
            }
            Some((inside(above)?, cstring(rel)?))
        }
    };
    Ok(Target {
        path: inside(path)?,
        beneath,
    })
}

impl Target {
    /// A path of ours (the view's own tmpfs), used as it is.
    pub(super) fn plain(path: CString) -> Target {
        Target {
            path,
            beneath: None,
        }
    }

    /// Runs `f` on a path that names this target: its own, or `/proc/self/fd/N` of a
    /// descriptor opened beneath (closed afterwards). Async-signal safe.
    pub(super) fn at<R>(&self, f: impl FnOnce(&CStr) -> Result<R, Errno>) -> Result<R, Errno> {
        let Some((above, rel)) = &self.beneath else {
            return f(&self.path);
        };
        let fd = sys::open_beneath(above, rel)?;
        let mut buf = [0u8; 32];
        let result = f(sys::fd_path(fd, &mut buf));
        // `fd` was opened above and is not used after this close.
        let _ = sys::close(fd);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_target_inside_a_writable_tree_is_opened_beneath_the_tree() {
        let writable: BTreeSet<PathBuf> = [PathBuf::from("/home/u"), PathBuf::from("/home/u/p")]
            .into_iter()
            .collect();
        let staging = Path::new("/s");
        let t = target(staging, &writable, Path::new("/home/u/p/.git/hooks")).unwrap();
        assert_eq!(t.path.as_c_str(), c"/s/home/u/p/.git/hooks");
        let (above, rel) = t.beneath.unwrap();
        assert_eq!(
            (above.as_c_str(), rel.as_c_str()),
            (c"/s/home", c"u/p/.git/hooks")
        );
        // The tree's own mount point is on the view's tmpfs, as is everything outside.
        assert!(target(staging, &writable, Path::new("/home/u"))
            .unwrap()
            .beneath
            .is_none());
        assert!(target(staging, &writable, Path::new("/usr/lib"))
            .unwrap()
            .beneath
            .is_none());
        // A bind's source on the host: the same, without the staging directory.
        let from = target(Path::new("/"), &writable, Path::new("/home/u/p/sub")).unwrap();
        let (above, rel) = from.beneath.unwrap();
        assert_eq!((above.as_c_str(), rel.as_c_str()), (c"/home", c"u/p/sub"));
    }
}
