//! Where a gitlink pointer leads, resolved as git resolves it: component by component from
//! the submodule directory's descriptor, no link followed, kept only strictly beneath
//! `<common>/modules` (compared by device and inode on the way up).

use super::*;
use sandbox_git::quarantine::gitdir::gitlink_pointer_components;
use std::ffi::OsStr;
use std::fs::File;
use std::path::Path;

/// Whether the gitlink pointer `bytes`, in the submodule directory `dir`, is in git's exact
/// relative form and leads, through the filesystem as git resolves it (each `..` the real
/// parent), to a directory strictly beneath `modules` (`<common>/modules`): component by
/// component from `dir`'s descriptor, `O_NOFOLLOW`, so a link anywhere on the way refuses it
/// (git would follow it, and a link's `..` is not the lexical one).
pub(super) fn pointer_leads_into(dir: &File, bytes: &[u8], modules: &Path) -> bool {
    let Some(parts) = gitlink_pointer_components(bytes) else {
        return false;
    };
    let Ok(modules) = open_dir(modules).and_then(|m| m.metadata()) else {
        return false;
    };
    let mut at = match dir.try_clone() {
        Ok(at) => at,
        Err(_) => return false,
    };
    for part in parts {
        match open_subdir(&at, OsStr::new(part)) {
            Ok(next) => at = next,
            Err(_) => return false,
        }
    }
    beneath(at, &modules)
}

/// Whether directory `at` lies strictly beneath the directory `above` (by device and inode,
/// walking up through each real `..`).
pub(super) fn beneath(mut at: File, above: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    let same = |m: &std::fs::Metadata| m.dev() == above.dev() && m.ino() == above.ino();
    let Ok(mut here) = at.metadata() else {
        return false;
    };
    if same(&here) {
        return false;
    }
    // Bounded: no real path is this deep.
    for _ in 0..4096 {
        let Ok(parent) = open_subdir(&at, OsStr::new("..")) else {
            return false;
        };
        let Ok(up) = parent.metadata() else {
            return false;
        };
        if same(&up) {
            return true;
        }
        if up.dev() == here.dev() && up.ino() == here.ino() {
            return false; // the root
        }
        (at, here) = (parent, up);
    }
    false
}
