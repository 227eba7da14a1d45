//! `sandbox view …` end to end: the real binary, real repositories, real git commits.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(30);

struct Env {
    _tmp: tempfile::TempDir,
    base: PathBuf,
    main: PathBuf,
    task: PathBuf,
}

impl Env {
    /// A repository "app" with a linked task worktree "T-1" (branch T-1) holding ignored and
    /// untracked files.
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(tmp.path()).unwrap();
        let main = base.join("app");
        std::fs::create_dir(&main).unwrap();
        let e = Env {
            _tmp: tmp,
            task: base.join("T-1"),
            main,
            base,
        };
        write(&e.main, "README.md", "hello\n");
        write(&e.main, ".gitignore", ".env\nnode_modules/\n");
        sandbox_testkit::linked_worktree_on(&e.main, &e.task, "main", "T-1");
        write(&e.task, ".env", "SECRET=1\n");
        write(&e.task, "node_modules/x/index.js", "x\n");
        write(&e.task, "scratch.txt", "untracked\n");
        e
    }

    fn apply_env(&self, c: &mut Command) {
        c.env("HOME", &self.base)
            .env("XDG_DATA_HOME", self.base.join("data"))
            .env("XDG_RUNTIME_DIR", self.base.join("run"))
            .env("XDG_CONFIG_HOME", self.base.join("config"))
            .env("XDG_STATE_HOME", self.base.join("state"))
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_AUTHOR_NAME", "Test Author")
            .env("GIT_AUTHOR_EMAIL", "author@example.com")
            .env("GIT_COMMITTER_NAME", "Test Committer")
            .env("GIT_COMMITTER_EMAIL", "committer@example.com")
            .env_remove("GIT_DIR")
            .env_remove("SANDBOX_LOG");
    }

    fn git(&self, dir: &Path, args: &[&str]) -> String {
        let mut c = Command::new("git");
        self.apply_env(&mut c);
        let out = c.current_dir(dir).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn commit(&self, dir: &Path, file: &str, content: &str) -> String {
        write(dir, file, content);
        self.git(dir, &["add", "-A"]);
        self.git(dir, &["commit", "-qm", file]);
        self.git(dir, &["rev-parse", "HEAD"])
    }

    fn sandbox(&self, dir: &Path) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sandbox"));
        self.apply_env(&mut c);
        c.current_dir(dir);
        c
    }

    fn run(&self, dir: &Path, args: &[&str]) -> Output {
        self.sandbox(dir).args(args).output().unwrap()
    }

    /// Runs and expects success; returns stdout.
    fn ok(&self, dir: &Path, args: &[&str]) -> String {
        let out = self.run(dir, args);
        assert!(
            out.status.success(),
            "sandbox {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, dir: &Path, args: &[&str]) -> Value {
        serde_json::from_str(&self.ok(dir, args)).unwrap()
    }

    fn view_path(&self) -> PathBuf {
        self.base.join("data/sandbox/views/app/T-1-sandbox")
    }
}

fn write(dir: &Path, rel: &str, content: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, content).unwrap();
}

/// Asserts a failure: exit status 1 and one `sandbox: …` line on stderr containing `needles`.
fn fails_with(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "expected one line: {err}");
    assert!(err.starts_with("sandbox: "), "{err}");
    for n in needles {
        assert!(err.contains(n), "missing {n:?} in: {err}");
    }
}

#[test]
fn create_prints_the_path_of_a_tracked_files_only_view_and_reuses_it() {
    let e = Env::new();
    let out = e.ok(&e.task, &["view", "create"]);
    assert_eq!(out.trim(), e.view_path().to_str().unwrap());
    let v = e.view_path();
    assert!(v.join("README.md").is_file());
    assert!(v.join(".gitignore").is_file());
    for absent in [".env", "node_modules", "scratch.txt"] {
        assert!(!v.join(absent).exists(), "{absent} is in the view");
    }
    assert_eq!(e.git(&v, &["rev-parse", "--abbrev-ref", "HEAD"]), "s/T-1");

    let j = e.json(&e.task, &["view", "create", "--json"]);
    assert_eq!(j["outcome"], "reused");
    assert_eq!(j["view_path"], v.to_str().unwrap());
    assert_eq!(j["branch"], "T-1");
    assert_eq!(j["child_branch"], "s/T-1");
    assert_eq!(j["sync"]["state"], "in_sync");
    let mounts = j["mounts"].as_array().unwrap();
    let find = |purpose: &str| {
        mounts
            .iter()
            .find(|m| m["purpose"] == purpose)
            .unwrap()
            .clone()
    };
    assert_eq!(find("git_hooks")["writable"], false);
    assert_eq!(find("git_config")["writable"], false);
    // No ref or object of the repository is writable: new ones go to the store layer.
    assert!(mounts
        .iter()
        .all(|m| m["purpose"] != "git_refs" && m["purpose"] != "git_objects"));
    assert_eq!(find("git_store_layer")["writable"], true);
    assert_eq!(
        find("git_store_layer")["host_path"],
        format!("{}.git-layer", v.display())
    );
    assert_eq!(find("worktree")["host_path"], v.to_str().unwrap());
    assert_eq!(
        find("git_worktree_admin")["host_path"],
        e.main.join(".git/worktrees/T-1-sandbox").to_str().unwrap()
    );
}

#[test]
fn list_and_status_work_from_anywhere_in_the_project() {
    let e = Env::new();
    e.ok(&e.task, &["view", "create", "--task", "T-1"]);
    // From the main worktree, by -C, and from inside the view.
    for (dir, args) in [
        (&e.main, vec!["view", "list", "--json"]),
        (
            &e.base,
            vec!["view", "list", "--json", "-C", e.main.to_str().unwrap()],
        ),
        (&e.view_path(), vec!["view", "list", "--json"]),
    ] {
        let j = e.json(dir, &args);
        let arr = j.as_array().unwrap();
        assert_eq!(arr.len(), 1, "{j}");
        assert_eq!(arr[0]["task"], "T-1");
        assert_eq!(arr[0]["sync"]["state"], "in_sync");
        assert_eq!(arr[0]["watcher"]["running"], false);
    }
    let text = e.ok(&e.main, &["view", "list"]);
    assert!(text.contains("T-1") && text.contains("in sync"), "{text}");

    let agent = e.commit(&e.view_path(), "agent.txt", "a\n");
    let st = e.json(&e.main, &["view", "status", "T-1", "--json"]);
    assert_eq!(st["sync"]["state"], "ahead");
    assert_eq!(st["sync"]["ahead"], 1);
    assert_eq!(st["child_commit"], agent.as_str());
    assert_eq!(st["problems"].as_array().unwrap().len(), 0);
    let human = e.ok(&e.main, &["view", "status", "T-1"]);
    assert!(
        human.contains("ahead") && human.contains("not running"),
        "{human}"
    );
    assert!(human.contains("sandbox view watch T-1"), "{human}");
}

#[test]
fn invalid_and_unknown_names_are_refused_clearly() {
    let e = Env::new();
    for (task, why) in [
        ("../../etc", "single name"),
        ("a b", "valid git ref"),
        ("x.lock", "valid git ref"),
        ("..", "outside the views root"),
    ] {
        let out = e.run(&e.task, &["view", "create", "--task", task]);
        fails_with(&out, &["invalid task name", why, "--task"]);
    }
    assert!(!e
        .base
        .join("data/sandbox/views/app")
        .join("..")
        .join("etc-sandbox")
        .exists());
    let out = e.run(&e.main, &["view", "status", "nope"]);
    fails_with(
        &out,
        &["no sandbox view for task \"nope\"", "sandbox view create"],
    );
    let out = e.run(&e.base, &["view", "create"]);
    fails_with(&out, &["not inside a git repository", "-C"]);
}

#[test]
fn remove_refuses_unmerged_commits_unless_forced() {
    let e = Env::new();
    e.ok(&e.task, &["view", "create"]);
    let agent = e.commit(&e.view_path(), "agent.txt", "a\n");
    let out = e.run(&e.main, &["view", "remove", "T-1"]);
    fails_with(
        &out,
        &[
            "s/T-1",
            "1 commit(s) not on \"T-1\"",
            "--force",
            "merge s/T-1",
        ],
    );
    assert!(e.view_path().exists());

    let out = e.run(&e.main, &["view", "remove", "T-1", "--force"]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&agent), "the dropped tip is not shown: {err}");
    assert!(!e.view_path().exists());
    let branches = e.git(&e.main, &["branch", "--list", "s/*"]);
    assert_eq!(branches, "");
    assert_eq!(
        e.json(&e.main, &["view", "list", "--json"]),
        Value::Array(vec![])
    );
}

#[test]
fn remove_of_a_merged_view_needs_no_force() {
    let e = Env::new();
    e.ok(&e.task, &["view", "create"]);
    e.commit(&e.view_path(), "agent.txt", "a\n");
    e.git(&e.task, &["merge", "-q", "--ff-only", "s/T-1"]);
    e.ok(&e.main, &["view", "remove", "T-1"]);
    assert!(!e.view_path().exists());
}

#[test]
fn the_views_root_comes_from_the_trusted_config() {
    let e = Env::new();
    let root = e.base.join("elsewhere/views");
    write(
        &e.base.join("config/sandbox"),
        "config.yaml",
        &format!("views:\n  root: {}\n", root.display()),
    );
    let out = e.ok(&e.task, &["view", "create"]);
    assert_eq!(out.trim(), root.join("app/T-1-sandbox").to_str().unwrap());
}

/// A running `sandbox view watch --json`, its stdout lines arriving on a channel.
struct Watch {
    child: Child,
    lines: Receiver<String>,
}

impl Watch {
    fn start(e: &Env, args: &[&str]) -> Watch {
        let mut child = e
            .sandbox(&e.main)
            .args(["view", "watch", "--json"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Watch { child, lines }
    }

    fn next_event(&self, name: &str) -> Value {
        let deadline = Instant::now() + TIMEOUT;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let v: Value = serde_json::from_str(&line)
                        .unwrap_or_else(|err| panic!("not JSON ({err}): {line}"));
                    assert!(v["time_unix_ms"].as_u64().is_some(), "{line}");
                    if v["event"] == name {
                        return v;
                    }
                    seen.push(line);
                }
                Err(_) => panic!("no {name} event; saw {seen:?}"),
            }
        }
    }

    /// Waits for the process to exit and returns (status code, stderr).
    fn finish(mut self) -> (Option<i32>, String) {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let mut err = String::new();
                use std::io::Read;
                self.child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap();
                return (status.code(), err);
            }
            assert!(Instant::now() < deadline, "sandbox view watch did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn watch_fast_forwards_reports_divergence_and_stops_on_sigterm() {
    let e = Env::new();
    e.ok(&e.task, &["view", "create"]);
    let w = Watch::start(&e, &[]);
    let ev = w.next_event("watching");
    assert_eq!(ev["task"], "T-1");
    // status sees the watcher: a live process holding the lock, with its pid.
    let st = e.json(&e.main, &["view", "status", "T-1", "--json"]);
    assert_eq!(st["watcher"]["running"], true);
    assert_eq!(st["watcher"]["pid"], w.child.id());

    let agent = e.commit(&e.view_path(), "agent.txt", "from the agent\n");
    let ev = w.next_event("fast_forwarded");
    assert_eq!(ev["to"], agent.as_str());
    assert_eq!(ev["worktree"], e.task.to_str().unwrap());
    assert_eq!(e.git(&e.main, &["rev-parse", "T-1"]), agent);
    assert_eq!(
        std::fs::read_to_string(e.task.join("agent.txt")).unwrap(),
        "from the agent\n"
    );

    // The user commits on T-1 while the agent commits on s/T-1.
    let host = e.commit(&e.task, "host.txt", "host\n");
    let agent2 = e.commit(&e.view_path(), "agent2.txt", "more\n");
    let ev = w.next_event("diverged");
    assert_eq!(ev["branch_commit"], host.as_str());
    assert_eq!(ev["child_commit"], agent2.as_str());
    let resolve: Vec<&str> = ev["resolve"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        resolve.iter().any(|c| c.contains("merge s/T-1")),
        "{resolve:?}"
    );
    assert_eq!(e.git(&e.main, &["rev-parse", "T-1"]), host);
    assert_eq!(e.git(&e.main, &["rev-parse", "s/T-1"]), agent2);
    let st = e.json(&e.main, &["view", "status", "T-1", "--json"]);
    assert_eq!(st["sync"]["state"], "diverged");
    assert_eq!(st["watcher"]["last_report"]["event"], "diverged");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(w.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    w.next_event("stopped");
    let pid = w.child.id();
    let (code, err) = w.finish();
    assert_eq!(code, Some(0), "{err}");
    // The divergence was also a line on stderr, with both commits.
    let line = err
        .lines()
        .find(|l| l.contains("diverged"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(line.starts_with("sandbox: view T-1:"), "{line}");
    assert!(
        line.contains(&host[..12]) && line.contains(&agent2[..12]),
        "{line}"
    );
    let st = e.json(&e.main, &["view", "status", "T-1", "--json"]);
    assert_eq!(
        st["watcher"]["running"], false,
        "pid {pid} still counted as running"
    );
    assert!(!e.main.join(".git/worktrees/T-1/index.lock").exists());
}

#[test]
fn watch_ends_when_its_view_is_removed_and_refuses_a_second_watcher() {
    let e = Env::new();
    e.ok(&e.task, &["view", "create"]);
    let w = Watch::start(&e, &["T-1"]);
    w.next_event("watching");
    let second = e.run(&e.main, &["view", "watch", "T-1"]);
    fails_with(
        &second,
        &["already watched", &format!("process {}", w.child.id())],
    );

    e.ok(&e.main, &["view", "remove", "T-1"]);
    let ev = w.next_event("view_gone");
    assert_eq!(ev["task"], "T-1");
    let (code, err) = w.finish();
    assert_eq!(code, Some(0), "{err}");
}
