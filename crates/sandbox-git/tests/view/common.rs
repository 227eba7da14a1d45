//! Real repositories in temp dirs, the real `git` CLI, isolated from the machine's config.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

use sandbox_git::{View, ViewManager, WatchEvent, WatcherHandle};
use tempfile::TempDir;

/// Generous: the machine is shared with other builds. Tests wait for conditions, never sleep.
pub const TIMEOUT: Duration = Duration::from_secs(30);

pub fn git_cmd(dir: &Path, home: &Path) -> Command {
    let mut c = Command::new("git");
    c.current_dir(dir)
        .env("HOME", home)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "Test Author")
        .env("GIT_AUTHOR_EMAIL", "author@example.com")
        .env("GIT_COMMITTER_NAME", "Test Committer")
        .env("GIT_COMMITTER_EMAIL", "committer@example.com")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE");
    c
}

pub struct Fixture {
    pub tmp: TempDir,
    /// The main worktree of the repository "app".
    pub main: PathBuf,
    pub views_root: PathBuf,
    pub runtime: PathBuf,
}

impl Fixture {
    pub fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(tmp.path()).unwrap();
        let main = base.join("app");
        std::fs::create_dir(&main).unwrap();
        let f = Fixture {
            views_root: base.join("data/views"),
            runtime: base.join("runtime"),
            main,
            tmp,
        };
        f.git(&f.main, &["init", "-q", "-b", "main"]);
        write(&f.main, "README.md", "hello\n");
        write(&f.main, "src/lib.rs", "pub fn x() {}\n");
        write(&f.main, "other.txt", "other\n");
        write(&f.main, ".gitignore", "node_modules/\n.env\ntarget/\n");
        f.git(&f.main, &["add", "."]);
        f.git(&f.main, &["commit", "-qm", "initial"]);
        f
    }

    pub fn home(&self) -> PathBuf {
        self.tmp.path().to_path_buf()
    }

    pub fn git(&self, dir: &Path, args: &[&str]) -> String {
        let out = git_cmd(dir, &self.home()).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "git {args:?} in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Runs git and returns whether it succeeded (for commands expected to fail).
    pub fn git_ok(&self, dir: &Path, args: &[&str]) -> bool {
        git_cmd(dir, &self.home())
            .args(args)
            .output()
            .unwrap()
            .status
            .success()
    }

    pub fn rev(&self, rev: &str) -> String {
        self.git(&self.main, &["rev-parse", rev])
    }

    /// A linked task worktree on a new branch `name`, with an ignored `.env`, an ignored
    /// `node_modules/`, and an untracked file in it.
    pub fn task(&self, name: &str) -> PathBuf {
        let path = self.main.parent().unwrap().join(name);
        sandbox_testkit::add_worktree(&self.main, &path, name);
        write(&path, ".env", "SECRET=1\n");
        write(&path, "node_modules/dep/index.js", "x\n");
        write(&path, "target/debug/out", "bin\n");
        write(&path, "notes.txt", "untracked\n");
        path
    }

    pub fn manager(&self) -> ViewManager {
        ViewManager::new(&self.views_root).with_runtime_dir(&self.runtime)
    }

    /// Writes files and commits them with the git CLI in `dir`; returns the new commit id.
    pub fn commit(&self, dir: &Path, files: &[(&str, &str)], msg: &str) -> String {
        for (p, c) in files {
            write(dir, p, c);
        }
        self.git(dir, &["add", "-A"]);
        self.git(dir, &["commit", "-qm", msg]);
        self.git(dir, &["rev-parse", "HEAD"])
    }

    pub fn watch(&self, views: Vec<View>) -> (WatcherHandle, Events) {
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = self.manager().watch(views, sink(tx)).unwrap();
        (handle, Events { rx })
    }
}

pub fn sink(tx: Sender<WatchEvent>) -> impl FnMut(WatchEvent) + Send + 'static {
    move |e| {
        let _ = tx.send(e);
    }
}

pub fn write(dir: &Path, rel: &str, content: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, content).unwrap();
}

pub fn read(dir: &Path, rel: &str) -> String {
    std::fs::read_to_string(dir.join(rel)).unwrap()
}

/// Every file under `dir` except `.git`, relative, sorted.
pub fn files_in(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
            if rel == ".git" {
                continue;
            }
            if e.file_type().unwrap().is_dir() {
                walk(base, &p, out);
            } else {
                out.push(rel);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

pub struct Events {
    pub rx: Receiver<WatchEvent>,
}

impl Events {
    /// The first event matching `pred` within the timeout; on timeout the panic lists the
    /// events seen on the way.
    pub fn wait(&self, what: &str, pred: impl Fn(&WatchEvent) -> bool) -> WatchEvent {
        let deadline = Instant::now() + TIMEOUT;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(e) if pred(&e) => return e,
                Ok(e) => seen.push(e),
                Err(_) => panic!("timed out waiting for {what}; events seen: {seen:#?}"),
            }
        }
    }
}
