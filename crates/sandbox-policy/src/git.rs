//! Git layout discovery (the only I/O in this crate besides path canonicalisation): is the
//! workdir a linked worktree, a main worktree, or not a repository; where is the common dir;
//! is `extensions.worktreeConfig` on; which pointer files must not change.

use std::path::{Path, PathBuf};

use crate::error::PolicyError;
use crate::model::{GitLayout, PointerFile};

/// What discovery found for a working directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovered {
    /// The worktree root (canonical).
    pub root: PathBuf,
    pub layout: GitLayout,
    /// `user.name` and `user.email` as git would use them here, read on the host so that a
    /// sandbox that cannot read `$HOME/.gitconfig` can still commit as the user.
    pub identity: Option<(String, String)>,
}

fn canonical(path: &Path) -> Result<PathBuf, PolicyError> {
    std::fs::canonicalize(path).map_err(|e| PolicyError::Path {
        path: path.to_path_buf(),
        cause: e.to_string(),
    })
}

/// Inside a sandbox (a nested `sandbox run`), `$HOME/.gitconfig` exists but cannot be opened,
/// and libgit2 treats that as a hard error when it opens a repository. Git itself is told
/// `GIT_CONFIG_GLOBAL=/dev/null` there; do the same for libgit2 by pointing its global search
/// path somewhere empty. Outside a sandbox the global config is readable and nothing changes.
fn skip_unreadable_global_config() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
        let xdg = std::env::var_os("XDG_CONFIG_HOME")
            .map(std::path::PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".config")));
        let candidates = [
            home.map(|h| h.join(".gitconfig")),
            xdg.map(|x| x.join("git/config")),
        ];
        let unreadable = candidates.iter().flatten().any(|p| {
            matches!(std::fs::File::open(p), Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied)
        });
        let told_to_skip = std::env::var_os("GIT_CONFIG_GLOBAL").is_some_and(|v| v == "/dev/null");
        if unreadable || told_to_skip {
            // SAFETY: libgit2's option setters must not race other libgit2 calls. This runs
            // once, inside `Once`, before this crate's first repository open; every caller of
            // `discover` waits for it. The product's binaries call `discover` before any other
            // libgit2 use (the CLI from its main thread; the daemon never reaches this branch,
            // as it runs on the host where the global config is readable).
            let _ = unsafe {
                git2::opts::set_search_path(
                    git2::ConfigLevel::Global,
                    "/nonexistent/sandbox-no-global-gitconfig",
                )
            };
        }
    });
}

/// `core.hooksPath` as git uses it in the worktree `root`: libgit2 has expanded `~`; a
/// relative path is relative to where hooks run, the worktree root. Canonical when it exists.
fn resolve_hooks_path(root: &Path, path: &Path) -> PathBuf {
    let joined = root.join(path);
    std::fs::canonicalize(&joined).unwrap_or(joined)
}

/// Finds the git worktree containing `workdir`, if any. A bare repository or a path inside a
/// git directory is an error: there is no worktree to confine to, and the git data itself
/// (hooks, config) would be the writable tree.
pub fn discover(workdir: &Path) -> Result<Option<Discovered>, PolicyError> {
    skip_unreadable_global_config();
    let repo = match git2::Repository::discover(workdir) {
        Ok(repo) => repo,
        Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok(None),
        Err(e) => {
            return Err(PolicyError::Git {
                path: workdir.to_path_buf(),
                cause: e.message().to_string(),
            })
        }
    };
    let Some(root) = repo.workdir() else {
        return Err(PolicyError::Git {
            path: workdir.to_path_buf(),
            cause: "this is a bare repository or a git directory, not a worktree; run in a \
                    worktree (git worktree add)"
                .into(),
        });
    };
    let root = canonical(root)?;
    let gitdir = canonical(repo.path())?;
    let common_dir = canonical(repo.commondir())?;
    let workdir_canonical = canonical(workdir)?;
    if workdir_canonical.starts_with(&gitdir) || workdir_canonical.starts_with(&common_dir) {
        return Err(PolicyError::Git {
            path: workdir.to_path_buf(),
            cause: "the working directory is inside a git directory, not a worktree".into(),
        });
    }
    let is_linked = repo.is_worktree();
    let worktree_config = git2::Config::open(&common_dir.join("config"))
        .and_then(|c| c.get_bool("extensions.worktreeConfig"))
        .unwrap_or(false);

    let mut pointers = Vec::new();
    if is_linked {
        // `<root>/.git` says "gitdir: <common>/worktrees/<name>"; `<gitdir>/commondir` and
        // `<gitdir>/gitdir` lead back. All three live in writable places and all three decide
        // which config and hooks the *host's* git uses next time.
        for path in [
            root.join(".git"),
            gitdir.join("commondir"),
            gitdir.join("gitdir"),
        ] {
            if let Ok(content) = std::fs::read_to_string(&path) {
                pointers.push(PointerFile { path, content });
            }
        }
    }
    let mut absent_pointers = Vec::new();
    if !is_linked {
        // A main worktree's `.git` is written by the run (in the view, all but hooks, config
        // and info), and git reads `commondir` in any git dir, not only a linked worktree's
        // (`setup.c`: `get_common_dir_noenv`): one the run creates re-points the host's next
        // git at a repository of the run's. `gitdir` and `locked` are a linked worktree's
        // names too (read by `git worktree` once `commondir` makes this git dir one). Each is
        // recorded as it is, or as absent, and checked after the run like every pointer.
        for name in ["commondir", "gitdir", "locked"] {
            let path = gitdir.join(name);
            match std::fs::symlink_metadata(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => absent_pointers.push(path),
                Ok(meta) if meta.is_file() => {
                    if let Ok(content) = std::fs::read_to_string(&path) {
                        pointers.push(PointerFile { path, content });
                    }
                }
                _ => {}
            }
        }
    }
    // The task branch: what HEAD names now (a linked worktree's own HEAD). Read from the
    // file, not resolved: an unborn branch is still the task's.
    let task_branch = std::fs::read_to_string(gitdir.join("HEAD"))
        .ok()
        .and_then(|head| {
            head.trim_end()
                .strip_prefix("ref: ")
                .filter(|name| name.starts_with("refs/heads/"))
                .map(str::to_string)
        });
    let config = repo.config().ok().and_then(|mut c| c.snapshot().ok());
    let identity = config.as_ref().and_then(|c| {
        Some((
            c.get_string("user.name").ok()?,
            c.get_string("user.email").ok()?,
        ))
    });
    let hooks_path = config
        .as_ref()
        .and_then(|c| c.get_path("core.hooksPath").ok())
        .map(|p| resolve_hooks_path(&root, &p));
    Ok(Some(Discovered {
        root,
        identity,
        layout: GitLayout {
            is_linked,
            common_dir,
            worktree_gitdir: gitdir,
            worktree_config,
            pointers,
            task_branch,
            hooks_path,
            push_remotes: Vec::new(),
            absent_pointers,
            allow_nested_git: false,
        },
    }))
}

/// The git dir of the local repository that `--allow-push ARG` names: a path (absolute, or
/// `./`/`../` from the worktree root, or a `file://` URL), or the name of a remote of the
/// worktree's repository whose push URL is one. Network remotes need no grant: refused here
/// with a line that says so.
pub fn resolve_push_remote(root: &Path, arg: &str) -> Result<PathBuf, PolicyError> {
    let fail = |cause: String| PolicyError::Git {
        path: root.to_path_buf(),
        cause: format!("--allow-push {arg}: {cause}"),
    };
    let looks_like_path = |s: &str| {
        s.starts_with('/')
            || s.starts_with("./")
            || s.starts_with("../")
            || s.starts_with("file://")
    };
    let url = if looks_like_path(arg) {
        arg.to_string()
    } else {
        let repo = git2::Repository::open(root).map_err(|e| fail(e.message().to_string()))?;
        let remote = repo.find_remote(arg).map_err(|_| {
            fail("no remote of that name (give a path, or a remote from `git remote -v`)".into())
        })?;
        let url = remote
            .pushurl()
            .or(remote.url())
            .unwrap_or_default()
            .to_string();
        if !looks_like_path(&url) {
            return Err(fail(format!(
                "its URL {url:?} is not a local path: a network remote needs no --allow-push                  (the network rules decide whether it is reachable)"
            )));
        }
        url
    };
    let path = PathBuf::from(url.strip_prefix("file://").unwrap_or(&url));
    let path = if path.is_absolute() {
        path
    } else {
        root.join(path)
    };
    let path =
        std::fs::canonicalize(&path).map_err(|e| fail(format!("{}: {e}", path.display())))?;
    let dot_git = path.join(".git");
    let gitdir = if dot_git.is_dir() {
        dot_git
    } else if ["HEAD", "objects", "refs"]
        .iter()
        .all(|n| path.join(n).exists())
    {
        path
    } else {
        return Err(fail(format!(
            "{} is not a git repository (a bare one, or a worktree with a .git directory)",
            path.display()
        )));
    };
    if root.starts_with(&gitdir) || gitdir.starts_with(root) {
        return Err(fail(format!(
            "{} is this worktree's own repository or lies inside the worktree: a push there              needs no --allow-push",
            gitdir.display()
        )));
    }
    Ok(gitdir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_testkit::git;

    fn repo_with_linked_worktree() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("main");
        std::fs::create_dir(&main).unwrap();
        std::fs::write(main.join("a.txt"), "a").unwrap();
        let task = dir.path().join("task");
        sandbox_testkit::linked_worktree_on(&main, &task, "trunk", "feature");
        (dir, main, task)
    }

    #[test]
    fn linked_worktree_layout() {
        let (_d, main, task) = repo_with_linked_worktree();
        std::fs::create_dir(task.join("sub")).unwrap();
        let found = discover(&task.join("sub")).unwrap().unwrap();
        let task = std::fs::canonicalize(&task).unwrap();
        let common = std::fs::canonicalize(main.join(".git")).unwrap();
        assert_eq!(found.root, task);
        assert!(found.layout.is_linked);
        assert_eq!(found.layout.common_dir, common);
        assert_eq!(found.layout.worktree_gitdir, common.join("worktrees/task"));
        assert!(!found.layout.worktree_config);
        assert_eq!(
            found.layout.task_branch.as_deref(),
            Some("refs/heads/feature")
        );
        let pointer_paths: Vec<_> = found.layout.pointers.iter().map(|p| &p.path).collect();
        assert!(pointer_paths.contains(&&task.join(".git")));
        assert!(found.layout.pointers[0].content.starts_with("gitdir: "));
        assert!(found.layout.landlock_protection_problem(&task).is_none());
        assert_eq!(
            found.layout.writable_dirs(),
            vec![
                common.join("objects"),
                common.join("refs"),
                common.join("logs"),
                common.join("worktrees/task")
            ]
        );
    }

    #[test]
    fn main_worktree_cannot_be_protected_by_landlock() {
        let (_d, main, _task) = repo_with_linked_worktree();
        let found = discover(&main).unwrap().unwrap();
        assert!(!found.layout.is_linked);
        let problem = found
            .layout
            .landlock_protection_problem(&found.root)
            .unwrap();
        assert!(problem.contains("main worktree"), "{problem}");
        assert!(problem.contains("--unprotected-git"), "{problem}");
        assert!(found.layout.writable_dirs().is_empty());
        let common = std::fs::canonicalize(main.join(".git")).unwrap();
        assert_eq!(
            found.layout.absent_pointers,
            ["commondir", "gitdir", "locked"].map(|n| common.join(n)),
            "a main git dir's worktree pointers are recorded as absent"
        );
        assert!(found.layout.pointers.is_empty());
        std::fs::write(common.join("locked"), "mine\n").unwrap();
        let found = discover(&main).unwrap().unwrap();
        assert_eq!(found.layout.pointers.len(), 1);
        assert_eq!(found.layout.pointers[0].path, common.join("locked"));
        assert_eq!(found.layout.pointers[0].content, "mine\n");
        assert_eq!(found.layout.absent_pointers.len(), 2);
    }

    #[test]
    fn worktree_config_extension_is_detected() {
        let (_d, main, task) = repo_with_linked_worktree();
        git(&main, &["config", "extensions.worktreeConfig", "true"]);
        let found = discover(&task).unwrap().unwrap();
        assert!(found.layout.worktree_config);
        let problem = found
            .layout
            .landlock_protection_problem(&found.root)
            .unwrap();
        assert!(problem.contains("worktreeConfig"), "{problem}");
    }

    #[test]
    fn not_a_repository_and_git_dirs() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(discover(dir.path()).unwrap(), None);
        let (_d, main, _task) = repo_with_linked_worktree();
        let err = discover(&main.join(".git/hooks")).unwrap_err();
        assert!(err.to_string().contains("git directory"), "{err}");
    }
}
