//! A generation's files: the copy of the common dir laid out, `current` pointed at it, and
//! removed when it is read back.

use std::path::Path;

use super::box_git::BoxGit;
use crate::quarantine::error::{io, QuarantineError};

pub(super) fn remove(path: &Path) {
    let gone = match path.symlink_metadata() {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(_) => Ok(()),
    };
    if let Err(e) = gone {
        tracing::warn!(path = %path.display(), error = %e, "could not remove a box's git generation");
    }
}

pub(super) fn random_suffix() -> String {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        // Unique enough within one process: the time and the pid.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        return format!("{:x}-{now:x}", std::process::id());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The copy of the common dir a box writes, laid out at `dir` (a private place).
pub(super) fn lay_out(git: &BoxGit, dir: &Path) -> Result<(), QuarantineError> {
    let common = &git.common;
    let mk = |p: &Path| std::fs::create_dir_all(p).map_err(io("creating", p));
    mk(dir)?;
    for file in ["HEAD", "config", "packed-refs", "shallow"] {
        copy_file(&common.join(file), &dir.join(file))?;
    }
    copy_refs(&common.join("refs"), &dir.join("refs"))?;
    mk(&dir.join("objects/pack"))?;
    mk(&dir.join("logs"))?;
    let alternates = dir.join("objects/info/alternates");
    mk(&dir.join("objects/info"))?;
    std::fs::write(
        &alternates,
        format!("{}\n", common.join("objects").display()),
    )
    .map_err(io("writing", &alternates))?;
    for link in ["hooks", "info"] {
        let at = dir.join(link);
        std::os::unix::fs::symlink(common.join(link), &at).map_err(io("linking", &at))?;
    }
    let admin = dir.join("worktrees").join(git.worktree_name());
    mk(&admin)?;
    for file in ["HEAD", "gitdir", "index", "ORIG_HEAD"] {
        copy_file(&git.worktree_gitdir.join(file), &admin.join(file))?;
    }
    let commondir = admin.join("commondir");
    std::fs::write(
        &commondir,
        format!("{}\n", git.writable().join("current").display()),
    )
    .map_err(io("writing", &commondir))?;
    Ok(())
}

/// Copies a regular file (nothing when it is missing).
fn copy_file(from: &Path, to: &Path) -> Result<(), QuarantineError> {
    match from.symlink_metadata() {
        Ok(meta) if meta.is_file() => {
            std::fs::copy(from, to).map_err(io("copying", from))?;
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Copies the loose refs under `from` (regular files only; no locks, no links).
fn copy_refs(from: &Path, to: &Path) -> Result<(), QuarantineError> {
    std::fs::create_dir_all(to).map_err(io("creating", to))?;
    let Ok(entries) = std::fs::read_dir(from) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let Ok(meta) = src.symlink_metadata() else {
            continue;
        };
        if meta.is_dir() {
            copy_refs(&src, &dst)?;
        } else if meta.is_file() && !src.to_string_lossy().ends_with(".lock") {
            std::fs::copy(&src, &dst).map_err(io("copying", &src))?;
        }
    }
    Ok(())
}

/// Points the box's `current` link at generation `name` (a new link renamed over it; whatever
/// the box left there instead is removed).
pub(super) fn point_current(git: &BoxGit, name: &str) -> Result<(), QuarantineError> {
    let current = git.writable().join("current");
    let staged = git.writable().join(format!(".current-{}", random_suffix()));
    std::os::unix::fs::symlink(name, &staged).map_err(io("linking", &staged))?;
    if std::fs::rename(&staged, &current).is_err() {
        // A directory the box made in its place.
        remove(&current);
        std::fs::rename(&staged, &current).map_err(io("linking", &current))?;
    }
    Ok(())
}
