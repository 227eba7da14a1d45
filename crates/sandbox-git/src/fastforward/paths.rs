//! Which paths an update touches, and which of them the user has changed.

use std::path::Path;

use git2::{Delta, Repository, Status, StatusOptions, Tree};

use crate::error::ViewError;

/// The paths that differ between two trees, and those of them that are new.
pub(super) fn touched_paths(
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
pub(super) fn dirty_paths(
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
