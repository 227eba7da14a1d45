//! What a run's home holds beside its own files: the agents' private copies, and the mount
//! points of what is bound into it (made beneath the home, nothing followed out of it).

use super::*;
use sandbox_policy::{GrantReason, Policy};
use std::path::{Path, PathBuf};

/// An agent profile's private copies of files in the home (`~/.gemini/projects.json`) are put
/// in the private home itself, fresh from the host's each run, not bound over their path: an
/// agent replaces such a file by renaming a new one over it, or deletes and re-creates it,
/// which a mount point refuses (`EBUSY`). The host never reads them back. Written through
/// descriptors (a run may have left a link in the way); each copy then names its place.
///
/// A copy holds the host's data (an MCP server's command line and environment), so it lasts
/// only as long as runs that were given it: the ones an earlier run placed, listed beside the
/// home (`homes/.<key>.copies`, outside the run's reach), are removed when this run is not
/// given them (`--agent none`, another agent). A run of the same project still using one at
/// that moment finds it gone, as a new agent home would be.
pub(super) fn place_copies(
    policy: &mut Policy,
    home: &Path,
    dir: &Path,
) -> Result<(), (PathBuf, String)> {
    let manifest = side_file(dir, "copies");
    let before: Vec<PathBuf> = std::fs::read_to_string(&manifest)
        .map(|text| text.lines().map(PathBuf::from).collect())
        .unwrap_or_default();
    let mut placed_rel: Vec<PathBuf> = Vec::new();
    let mut private = None;
    for copy in &mut policy.fs.copies {
        let Ok(rel) = copy.path.strip_prefix(home) else {
            continue;
        };
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
            continue;
        };
        let placed = dir.join(rel);
        let err = |e: std::io::Error| (placed.clone(), format!("placing a private copy: {e}"));
        let bytes = std::fs::read(&copy.copy).map_err(err)?;
        if private.is_none() {
            private = Some(crate::beneath::Dir::open(dir).map_err(err)?);
        }
        let Some(root) = &private else {
            continue;
        };
        root.make_dirs(parent)
            .and_then(|at| at.replace_file(name, &bytes))
            .map_err(err)?;
        copy.copy = placed;
        placed_rel.push(rel.to_path_buf());
    }
    let stale: Vec<&PathBuf> = before
        .iter()
        .filter(|rel| !placed_rel.contains(rel))
        .collect();
    if !stale.is_empty() {
        let root =
            crate::beneath::Dir::open(dir).map_err(|e| (dir.to_path_buf(), e.to_string()))?;
        for rel in stale {
            let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
                continue;
            };
            // Only a file: whatever else the run left there is its own.
            if let Ok(at) = root.walk(parent) {
                if matches!(at.kind(name), Ok(Some(crate::beneath::Kind::File { .. }))) {
                    let _ = at.unlink(name);
                }
            }
        }
    }
    if placed_rel != before {
        let text: String = placed_rel
            .iter()
            .map(|rel| format!("{}\n", rel.display()))
            .collect();
        let homes = dir.parent().unwrap_or(dir);
        let written = tempfile::NamedTempFile::new_in(homes)
            .and_then(|mut f| f.write_all(text.as_bytes()).map(|()| f))
            .and_then(|f| f.persist(&manifest).map_err(|e| e.error));
        written.map_err(|e| {
            (
                manifest.clone(),
                format!("recording the private copies: {e}"),
            )
        })?;
    }
    Ok(())
}

/// Everything the view mounts inside the real home's path needs a mount point in the private
/// home (which is bound from the host, not built on a tmpfs): each made here, as a real
/// directory or file — a link the run left in its way is removed, so a mount cannot be
/// redirected elsewhere in the view. A toolchain's link (`~/.nix-profile`) is recreated.
/// Returns the mount points, relative to the home, parents first (links not among them).
///
/// All through descriptors ([`crate::beneath`]): another run of the project writes this home
/// while we work, and may swap a directory we just checked for a link; each component is
/// opened without following one, so such a swap makes a step fail (the run does not start)
/// instead of creating or removing anything outside the home.
pub(super) fn prepare_mount_points(policy: &Policy) -> Result<Vec<PathBuf>, (PathBuf, String)> {
    use crate::beneath::{Dir, Kind};
    let mut made: Vec<PathBuf> = Vec::new();
    let Some(home) = &policy.fs.home else {
        return Ok(made);
    };
    let mut targets: Vec<PathBuf> = Vec::new();
    for grant in policy.fs.read.iter().chain(policy.fs.write.iter()) {
        if grant.reason == GrantReason::Home {
            continue;
        }
        targets.push(grant.path.clone());
    }
    targets.extend(home.caches.iter().map(|c| c.path.clone()));
    targets.extend(policy.fs.devices.iter().cloned());
    let mut root = None;
    for target in targets {
        let Ok(rel) = target.strip_prefix(&home.path) else {
            continue;
        };
        if rel.as_os_str().is_empty() {
            continue;
        }
        // The source is the host's own (the real home), read by path as any grant is.
        let link = match std::fs::symlink_metadata(&target) {
            Ok(m) if m.file_type().is_symlink() => std::fs::read_link(&target).ok(),
            _ => None,
        };
        let is_dir = target.is_dir();
        if root.is_none() {
            root = Some(Dir::open(&home.dir).map_err(|e| (home.dir.clone(), e.to_string()))?);
        }
        let Some(root) = &root else {
            continue;
        };
        let mut at = root
            .dir(std::ffi::OsStr::new("."))
            .map_err(|e| (home.dir.clone(), e.to_string()))?;
        let mut relative = PathBuf::new();
        let comps: Vec<_> = rel.components().collect();
        for (i, c) in comps.iter().enumerate() {
            let std::path::Component::Normal(name) = c else {
                return Err((target.clone(), "not beneath the home".into()));
            };
            relative.push(name);
            let fail = |e: std::io::Error| {
                let at = home.dir.join(&relative);
                (at, format!("preparing a mount point: {e}"))
            };
            let last = i + 1 == comps.len();
            if last {
                if let Some(link) = &link {
                    if at.read_link(name).map_err(fail)?.as_ref() != Some(link) {
                        at.remove_all(name).map_err(fail)?;
                        at.symlink(link, name).map_err(fail)?;
                    }
                    break;
                }
            }
            let want_dir = !last || is_dir;
            if !made.contains(&relative) {
                made.push(relative.clone());
            }
            let kind = at.kind(name).map_err(fail)?;
            let ok = match kind {
                Some(Kind::Dir) => want_dir,
                Some(Kind::File { .. }) => !want_dir,
                _ => false,
            };
            if !ok {
                if kind.is_some() {
                    at.remove_all(name).map_err(fail)?;
                }
                if want_dir {
                    at.mkdir(name, 0o755).map_err(fail)?;
                } else {
                    at.create_file(name).map_err(fail)?;
                }
            }
            if !last {
                at = at.dir(name).map_err(fail)?;
            }
        }
    }
    Ok(made)
}

/// Records the mount points `needed` (relative to the home `dir`, parents first, as
/// [`prepare_mount_points`] made them) beside the home (`homes/.<key>.points`, the host's)
/// and returns the home's users lock, held shared for the run. Those an earlier run recorded
/// that this one does not need are removed now when no other run of the project lives, else
/// kept on the record for a later run to remove. Called with the home's preparing lock held,
/// so no run records or removes meanwhile; nothing is written when the record is unchanged.
pub(super) fn keep_mount_points(dir: &Path, needed: &[PathBuf]) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsRawFd as _;
    use std::os::unix::ffi::OsStrExt as _;
    let record = side_file(dir, "points");
    let recorded: Vec<PathBuf> = std::fs::read(&record)
        .map(|bytes| {
            bytes
                .split(|b| *b == 0)
                .filter(|p| !p.is_empty())
                .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p)))
                .collect()
        })
        .unwrap_or_default();
    let stale: Vec<PathBuf> = recorded
        .iter()
        .filter(|p| !needed.contains(p))
        .cloned()
        .collect();
    let users = {
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(users_lock(dir))?
    };
    let mut keep = needed.to_vec();
    // Exclusive only while no other run of the project holds the home. Taken before the
    // shared lock, never as a conversion of it: a conversion that fails drops the lock held.
    if !stale.is_empty() {
        if crate::sys::flock(users.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB).is_ok() {
            remove_mount_points(dir, &stale);
        } else {
            keep.extend(stale);
        }
    }
    // Shared for the run (from exclusive, a downgrade: no run waits for the home meanwhile,
    // they wait for its preparing lock, which the caller holds).
    crate::sys::flock(users.as_raw_fd(), libc::LOCK_SH)?;
    if keep != recorded {
        let mut bytes = Vec::new();
        for p in &keep {
            bytes.extend_from_slice(p.as_os_str().as_bytes());
            bytes.push(0);
        }
        let homes = dir.parent().unwrap_or(dir);
        let mut f = tempfile::NamedTempFile::new_in(homes)?;
        f.write_all(&bytes)?;
        f.persist(&record).map_err(|e| e.error)?;
    }
    Ok(users)
}

/// Removes the mount points `rel` (parents first) under `dir` that are still empty, children
/// first, through descriptors: a run could have put a link in their place.
pub(super) fn remove_mount_points(dir: &Path, rel: &[PathBuf]) {
    use crate::beneath::{Dir, Kind};
    let Ok(home) = Dir::open(dir) else {
        return;
    };
    for path in rel.iter().rev() {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            continue;
        };
        let Ok(at) = home.walk(parent) else {
            continue;
        };
        // Only what is as the preparation left it: an empty directory or an empty file.
        let removed = match at.kind(name) {
            Ok(Some(Kind::Dir)) => at.rmdir(name),
            Ok(Some(Kind::File { empty: true })) => at.unlink(name),
            _ => continue,
        };
        if let Err(e) = removed {
            tracing::trace!(path = %path.display(), error = %e, "mount point kept");
        }
    }
}
