//! Real repositories in temp dirs and real sandbox views.

use std::path::{Path, PathBuf};
use std::process::Command;

use sandbox_git::{View, ViewManager};
use tempfile::TempDir;

/// Reports a check that cannot run here, with the reason. Never a silent pass. Written
/// straight to stderr, past libtest's capture, so it shows in every run and CI log.
pub fn skip(reason: impl std::fmt::Display) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "skipped: {reason}");
}

pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "T")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "T")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A repository `<base>/<repo>` with a linked task worktree `<base>/<task dir>` on `task`.
pub struct Repo {
    pub _tmp: TempDir,
    pub base: PathBuf,
    pub main: PathBuf,
    pub task: PathBuf,
    pub views: ViewManager,
}

impl Repo {
    pub fn new(repo: &str, task_dir: &str) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(tmp.path()).unwrap();
        let main = base.join(repo);
        std::fs::create_dir_all(&main).unwrap();
        git(&main, &["init", "-q", "-b", "main"]);
        std::fs::write(main.join("README.md"), "hi\n").unwrap();
        git(&main, &["add", "."]);
        git(&main, &["commit", "-qm", "initial"]);
        let task = base.join(task_dir);
        std::fs::create_dir_all(task.parent().unwrap()).unwrap();
        git(
            &main,
            &[
                "worktree",
                "add",
                "-q",
                task.to_str().unwrap(),
                "-b",
                "task",
            ],
        );
        let views = ViewManager::new(base.join("views")).with_runtime_dir(base.join("run"));
        Repo {
            _tmp: tmp,
            base,
            main,
            task,
            views,
        }
    }

    pub fn view(&self, worktree: &Path) -> View {
        self.views.create_or_reuse(worktree, None).unwrap().view
    }
}
