//! How a worktree's git data is shown in a box. Pure: the daemon discovers the layout on the
//! host and passes it in.
//!
//! Whatever a box writes there, the user's own git on the host reads next: a hook or a
//! `core.fsmonitor` in the common dir's config, or a `.git` pointer rewritten to a git dir of
//! the agent's, runs the agent's code on the host. So in a box:
//!
//! - the repository's common dir (hooks, config, objects, refs, the worktree admin dirs) is
//!   mounted read-only at its own path, also when it lies inside the writable workdir (a main
//!   worktree's `.git`: the read-only mount is stacked on the writable one);
//! - each pointer file outside the common dir (a linked worktree's `.git`) is mounted
//!   read-only on its own (BoxLite shows a read-only file as a copy made at boot);
//! - `core.hooksPath` inside the writable workdir (`.husky`) is mounted read-only on it;
//! - a writable mount of the caller's may not reach any of these.
//!
//! Git inside a box therefore cannot write what the host's git runs. A linked worktree's box
//! commits into a private generation of the common dir instead ([`commit_mounts`]), which
//! the host reads back by the quarantine's rules; with `unprotected_git` the common dir is
//! writable and the caller accepts that risk (docs/boxlite.md).

use std::path::{Path, PathBuf};

use crate::spec::{check_mount, Mount, SpecError};

/// A worktree's git data on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitData {
    /// The repository's common dir, canonical.
    pub common_dir: PathBuf,
    /// Files naming a git dir, which host-side git follows (`<worktree>/.git` of a linked
    /// worktree; `gitdir` and `commondir` in its admin dir).
    pub pointers: Vec<PathBuf>,
    /// `core.hooksPath`, resolved, when set: git on the host runs hooks from there, and
    /// projects keep it in the tree (`.husky`).
    pub hooks_path: Option<PathBuf>,
}

/// The mounts that show `git` in a box at the same paths as on the host, in the order they
/// must be made after the mount of `workdir` (writable).
pub fn git_mounts(
    git: &GitData,
    workdir: &Path,
    unprotected: bool,
) -> Result<Vec<Mount>, SpecError> {
    let mut mounts = vec![check_mount(&git.common_dir, &git.common_dir, !unprotected)?];
    for pointer in &git.pointers {
        if pointer.starts_with(&git.common_dir) {
            continue; // inside the common dir's mount
        }
        mounts.push(check_mount(pointer, pointer, true)?);
    }
    match &git.hooks_path {
        Some(hooks) if !unprotected && hooks.starts_with(workdir) => {
            if !hooks.is_dir() {
                return Err(SpecError::Mount {
                    host: hooks.clone(),
                    why: format!(
                        "core.hooksPath lies in the writable workdir and does not exist yet: the \
                         box could create it and put hooks there that run on the host. Create \
                         it (`mkdir -p {}`) so it can be mounted read-only, or set \
                         `unprotectedGit`",
                        hooks.display()
                    ),
                });
            }
            if !hooks.starts_with(&git.common_dir) {
                mounts.push(check_mount(hooks, hooks, true)?);
            }
        }
        _ => {}
    }
    Ok(mounts)
}

/// Where a box's commits go instead of the common dir (docs/boxlite.md, "Git from inside a
/// box"): the host's generation directories of `sandbox_git::quarantine::generation`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitDirs {
    /// Mounted writable at its own path: the `current` link and the generations.
    pub writable: PathBuf,
    /// The file mounted read-only over the worktree's `.git`, naming the current generation.
    pub pointer: PathBuf,
    /// The worktree's own `.git` pointer file on the host.
    pub dot_git: PathBuf,
}

/// The mounts of a linked worktree whose commits the host takes back: those of
/// [`git_mounts`] (the common dir read-only, `core.hooksPath` in the tree read-only), with the
/// worktree's `.git` shown as `commits.pointer` (read-only) and the box's writable
/// generation directory at its own path. Git in the box then writes a copy of the common
/// dir that the host reads back by its rules; the real one stays read-only.
pub fn commit_mounts(
    git: &GitData,
    workdir: &Path,
    commits: &CommitDirs,
) -> Result<Vec<Mount>, SpecError> {
    let mut mounts: Vec<Mount> = git_mounts(git, workdir, false)?
        .into_iter()
        .filter(|m| m.guest != commits.dot_git)
        .collect();
    mounts.push(check_mount(&commits.pointer, &commits.dot_git, true)?);
    mounts.push(check_mount(&commits.writable, &commits.writable, false)?);
    Ok(mounts)
}

/// Refuses a writable mount of the caller's that would let the box write `git`'s common dir
/// or a pointer file: one at, inside or above the common dir, or above a pointer.
pub fn check_against_git(mount: &Mount, git: &GitData) -> Result<(), SpecError> {
    if mount.read_only {
        return Ok(());
    }
    let reaches = |protected: &Path| protected.starts_with(&mount.host);
    let why = if reaches(&git.common_dir) || mount.host.starts_with(&git.common_dir) {
        format!(
            "it is writable and reaches the repository's git directory {}: a hook or config \
             written there runs on the host the next time you use git",
            git.common_dir.display()
        )
    } else if let Some(hooks) = git
        .hooks_path
        .as_deref()
        .filter(|h| reaches(h) || mount.host.starts_with(h))
    {
        format!(
            "it is writable and reaches core.hooksPath {}: hooks written there run on the \
             host at your next commit",
            hooks.display()
        )
    } else if let Some(pointer) = git.pointers.iter().find(|p| reaches(p)) {
        format!(
            "it is writable and contains the git pointer {}: rewritten, it sends your git on \
             the host to a git directory of the box's",
            pointer.display()
        )
    } else {
        return Ok(());
    };
    Err(SpecError::Mount {
        host: mount.host.clone(),
        why: format!("{why}; mount it read-only, or set `unprotectedGit` (`--unprotected-git`) to accept the risk"),
    })
}

/// Puts mounts in an order that lets each be made: a guest path before every path inside it
/// (a mount made later on a parent would hide the child). Stable for equal depths.
pub fn order_for_guest(mounts: &mut [Mount]) {
    mounts.sort_by_key(|m| m.guest.components().count());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(root: &Path, rel: &str) -> PathBuf {
        let p = root.join(rel);
        std::fs::create_dir_all(&p).unwrap();
        p.canonicalize().unwrap()
    }

    fn file(root: &Path, rel: &str) -> PathBuf {
        let p = root.join(rel);
        std::fs::write(&p, "gitdir: x\n").unwrap();
        p.canonicalize().unwrap()
    }

    fn rw(host: &Path) -> Mount {
        Mount {
            host: host.to_path_buf(),
            guest: PathBuf::from("/m"),
            read_only: false,
        }
    }

    #[test]
    fn the_common_dir_is_read_only_and_a_pointer_outside_it_too() {
        let t = tempfile::tempdir().unwrap();
        let common = dir(t.path(), "repo/.git");
        let inside = file(&dir(t.path(), "repo/.git/worktrees/task"), "gitdir");
        dir(t.path(), "task");
        let pointer = file(t.path(), "task/.git");
        let git = GitData {
            common_dir: common.clone(),
            pointers: vec![pointer.clone(), inside],
            hooks_path: None,
        };
        let mounts = git_mounts(&git, &t.path().join("task"), false).unwrap();
        let seen: Vec<(&Path, &Path, bool)> = mounts
            .iter()
            .map(|m| (m.host.as_path(), m.guest.as_path(), m.read_only))
            .collect();
        assert_eq!(
            seen,
            [
                (common.as_path(), common.as_path(), true),
                (pointer.as_path(), pointer.as_path(), true)
            ]
        );
        let unprotected = git_mounts(&git, &t.path().join("task"), true).unwrap();
        assert!(
            !unprotected[0].read_only,
            "unprotected: the common dir is writable"
        );
        assert!(unprotected[1].read_only, "the pointer stays read-only");
    }

    #[test]
    fn writable_mounts_that_reach_git_data_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let repo = dir(t.path(), "repo");
        let common = dir(t.path(), "repo/.git");
        let hooks = dir(t.path(), "repo/.git/hooks");
        let task = dir(t.path(), "task");
        let pointer = file(t.path(), "task/.git");
        let elsewhere = dir(t.path(), "elsewhere");
        let git = GitData {
            common_dir: common.clone(),
            pointers: vec![pointer],
            hooks_path: Some(task.join(".husky")),
        };
        for refused in [
            &repo,
            &common,
            &hooks,
            &task,
            &t.path().canonicalize().unwrap(),
        ] {
            let e = check_against_git(&rw(refused), &git)
                .unwrap_err()
                .to_string();
            assert!(e.contains("writable"), "{}: {e}", refused.display());
        }
        assert!(check_against_git(&rw(&elsewhere), &git).is_ok());
        let mut ro = rw(&repo);
        ro.read_only = true;
        assert!(check_against_git(&ro, &git).is_ok(), "read-only is fine");
    }

    #[test]
    fn a_hooks_path_in_the_workdir_is_mounted_read_only_and_a_missing_one_refused() {
        let t = tempfile::tempdir().unwrap();
        let common = dir(t.path(), "repo/.git");
        let task = dir(t.path(), "task");
        let mut git = GitData {
            common_dir: common,
            pointers: vec![],
            hooks_path: Some(task.join(".husky")),
        };
        let e = git_mounts(&git, &task, false).unwrap_err().to_string();
        assert!(e.contains("mkdir -p"), "{e}");
        assert!(git_mounts(&git, &task, true).is_ok(), "accepted risk");
        let husky = dir(t.path(), "task/.husky");
        let mounts = git_mounts(&git, &task, false).unwrap();
        assert!(
            mounts
                .iter()
                .any(|m| m.host == husky && m.guest == husky && m.read_only),
            "{mounts:?}"
        );
        // Outside the workdir it is not in the box at all.
        git.hooks_path = Some(dir(t.path(), "elsewhere/hooks"));
        assert_eq!(git_mounts(&git, &task, false).unwrap().len(), 1);
    }

    #[test]
    fn parents_are_mounted_before_what_lies_in_them() {
        let m = |guest: &str| Mount {
            host: PathBuf::from("/h"),
            guest: PathBuf::from(guest),
            read_only: false,
        };
        let mut mounts = vec![m("/w/.git"), m("/extra/a/b"), m("/w"), m("/extra")];
        order_for_guest(&mut mounts);
        let order: Vec<&Path> = mounts.iter().map(|m| m.guest.as_path()).collect();
        assert_eq!(
            order,
            [
                Path::new("/w"),
                Path::new("/extra"),
                Path::new("/w/.git"),
                Path::new("/extra/a/b")
            ]
        );
    }
}
