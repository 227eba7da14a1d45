//! Real repositories in temp dirs and real sandbox views.

use std::path::{Path, PathBuf};

use sandbox_git::{View, ViewManager};
use tempfile::TempDir;

pub use sandbox_testkit::{git, skip};

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
        std::fs::write(main.join("README.md"), "hi\n").unwrap();
        let task = base.join(task_dir);
        std::fs::create_dir_all(task.parent().unwrap()).unwrap();
        sandbox_testkit::linked_worktree(&main, &task);
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
