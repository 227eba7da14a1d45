//! Repository layout: which project a directory belongs to, which branch a task worktree is
//! on, and which worktrees have a branch checked out.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use git2::{Repository, RepositoryOpenFlags};
use serde::{Deserialize, Serialize};

use crate::error::ViewError;
use crate::names;
use crate::util::{canon, read_pointer};

/// A repository, as sandbox views see it: its name and its common git directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Project {
    /// The main worktree's directory name, or the bare repository's name without `.git`.
    pub name: String,
    /// The common git directory (canonical), shared by all worktrees.
    pub common_dir: PathBuf,
}

/// Finds the repository containing `dir` (any worktree, any subdirectory).
pub(crate) fn discover(dir: &Path) -> Result<Repository, ViewError> {
    Repository::discover(dir).map_err(|e| ViewError::NotARepository {
        path: dir.to_path_buf(),
        message: e.message().to_string(),
    })
}

/// Opens exactly `path` (a worktree or git dir), without searching upwards or reading `GIT_*`.
pub(crate) fn open_exact(path: &Path) -> Result<Repository, git2::Error> {
    Repository::open_ext(
        path,
        RepositoryOpenFlags::NO_SEARCH,
        std::iter::empty::<&OsStr>(),
    )
}

pub(crate) fn open_common(common_dir: &Path) -> Result<Repository, ViewError> {
    open_exact(common_dir).map_err(ViewError::git(format!(
        "cannot open the repository at {}",
        common_dir.display()
    )))
}

/// The project of an open repository.
pub(crate) fn project_of(repo: &Repository) -> Result<Project, ViewError> {
    let common_dir = canon(repo.commondir());
    let common = open_common(&common_dir)?;
    let name = match common.workdir() {
        Some(wd) => canon(wd)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        None => {
            let n = common_dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            n.strip_suffix(".git")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .unwrap_or(n)
        }
    };
    names::validate_project(&name)?;
    Ok(Project { name, common_dir })
}

/// A worktree with its branch: what a view is made from.
#[derive(Debug, Clone)]
pub(crate) struct TaskCheckout {
    pub worktree: PathBuf,
    pub branch: String,
    pub head: git2::Oid,
}

/// The worktree root and branch of the repository opened at a task worktree.
pub(crate) fn task_checkout(repo: &Repository) -> Result<TaskCheckout, ViewError> {
    let worktree = match repo.workdir() {
        Some(w) => canon(w),
        None => {
            return Err(ViewError::BareRepository {
                path: repo.path().to_path_buf(),
            })
        }
    };
    let head = repo.find_reference("HEAD").map_err(ViewError::git(format!(
        "cannot read HEAD of {}",
        worktree.display()
    )))?;
    let target = match head.symbolic_target() {
        Some(t) => t.to_string(),
        None => return Err(ViewError::DetachedHead { worktree }),
    };
    let branch = match target.strip_prefix("refs/heads/") {
        Some(b) => b.to_string(),
        None => return Err(ViewError::DetachedHead { worktree }),
    };
    names::validate_branch(&branch)?;
    let head = match repo.refname_to_id(&target) {
        Ok(id) => id,
        Err(e) if e.code() == git2::ErrorCode::NotFound => {
            return Err(ViewError::UnbornBranch { worktree, branch })
        }
        Err(e) => return Err(ViewError::git(format!("cannot resolve {target}"))(e)),
    };
    Ok(TaskCheckout {
        worktree,
        branch,
        head,
    })
}

/// A worktree that has a branch checked out (or is rebasing/bisecting it).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Checkout {
    /// The worktree's root directory.
    pub path: PathBuf,
    /// Its git directory: `<common>` for the main worktree, `<common>/worktrees/<name>`.
    pub gitdir: PathBuf,
}

/// Does the git dir `gitdir` have `refname` checked out, or is it in the middle of rebasing
/// or bisecting it (when HEAD is detached but the branch still belongs to that worktree)?
fn holds_branch(gitdir: &Path, refname: &str) -> bool {
    let head = std::fs::read_to_string(gitdir.join("HEAD")).unwrap_or_default();
    if head.trim_end().strip_prefix("ref: ") == Some(refname) {
        return true;
    }
    let short = refname.strip_prefix("refs/heads/").unwrap_or(refname);
    ["rebase-merge/head-name", "rebase-apply/head-name"]
        .iter()
        .any(|f| std::fs::read_to_string(gitdir.join(f)).is_ok_and(|s| s.trim_end() == refname))
        || std::fs::read_to_string(gitdir.join("BISECT_START")).is_ok_and(|s| s.trim_end() == short)
}

/// The worktrees (main and linked) that hold `refname`.
///
/// Views' own administrative directories (`exclude`) are skipped, and so is any worktree whose
/// files lie under `views_root`: a sandboxed agent can write its view's admin directory
/// (`HEAD`, `gitdir`), so nothing read from there may steer where the host writes files.
pub(crate) fn checkouts_of(
    common: &Repository,
    common_dir: &Path,
    refname: &str,
    exclude: &[String],
    views_root: &Path,
) -> Result<Vec<Checkout>, ViewError> {
    let mut out = Vec::new();
    if !common.is_bare() {
        if let Some(wd) = common.workdir() {
            if holds_branch(common_dir, refname) {
                out.push(Checkout {
                    path: canon(wd),
                    gitdir: common_dir.to_path_buf(),
                });
            }
        }
    }
    let names = common
        .worktrees()
        .map_err(ViewError::git("cannot list worktrees"))?;
    for name in names.iter().flatten() {
        if exclude.iter().any(|e| e == name) {
            continue;
        }
        let admin = common_dir.join("worktrees").join(name);
        if !holds_branch(&admin, refname) {
            continue;
        }
        let Some(dotgit) = read_pointer(&admin.join("gitdir"), "", &admin) else {
            continue;
        };
        let Some(path) = dotgit.parent().map(canon) else {
            continue;
        };
        // A worktree whose directory is gone has no files to update.
        if !path.is_dir() || path.starts_with(views_root) {
            continue;
        }
        out.push(Checkout {
            path,
            gitdir: admin,
        });
    }
    Ok(out)
}
