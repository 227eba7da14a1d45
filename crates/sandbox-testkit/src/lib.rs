//! What the workspace's tests share, written once: a hermetic [`git`] and the repository with a
//! linked worktree most tests start from ([`linked_worktree`]; one more: [`add_worktree`]),
//! process checks
//! ([`alive`], [`wait_dead`]), a home as a real user's ([`home::lived_in`]), [`skip`] with the one list of skips a CI machine is allowed
//! ([`ALLOWED_IN_CI`]), the daemon's request builder ([`req`]) and the `limactl` stand-in
//! ([`limactl::Standin`]), running as an unprivileged user ([`nobody`]), and the loopback
//! network fixtures ([`net`]: a DNS answerer, a test CA, an HTTPS file server), a stand-in
//! for the agents' model APIs ([`model_api`]) and one for a git host over HTTPS
//! ([`git_host`]: real `git http-backend` behind TLS, taking one token). A
//! dev-dependency only (`publish = false`).

// Test code: a panic is how a helper reports that the test's setup failed, as in the tests
// themselves (the workspace lints against unwrap/expect apply to shipped code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod git_host;
pub mod home;
pub mod limactl;
pub mod model_api;
pub mod net;
pub mod nobody;
mod skip;

pub use skip::{in_ci, skip, AllowedSkip, ALLOWED_IN_CI};

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Writes a line straight to the test process's stderr. libtest captures `println!` and
/// `eprintln!` of passing tests; this does not go through that capture, so skip notices and
/// result tables show in every `cargo test` run (and in CI logs).
pub fn report(line: impl std::fmt::Display) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// `git` in `dir`, blind to the machine's and the user's configuration (no system or global
/// config file), with a fixed author and committer.
pub fn git_command(dir: &Path) -> Command {
    let mut cmd = Command::new("git");
    cmd.current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "T")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "T")
        .env("GIT_COMMITTER_EMAIL", "t@example.com");
    cmd
}

/// Runs `git ARGS` in `dir` ([`git_command`]); panics with its stderr unless it succeeds.
/// Returns its stdout, trimmed.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = git_command(dir).args(args).output().expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A repository at `main` (made if missing) whose first commit, on branch `main`, holds
/// what `main` already has (nothing: an empty commit), and a linked worktree at `task` on
/// branch `task`; with [`git`].
pub fn linked_worktree(main: &Path, task: &Path) {
    linked_worktree_on(main, task, "main", "task");
}

/// [`linked_worktree`] with the branches named by the test: the first commit (message `init`)
/// on `trunk`, the worktree at `task` on a new branch `branch`.
pub fn linked_worktree_on(main: &Path, task: &Path, trunk: &str, branch: &str) {
    std::fs::create_dir_all(main).unwrap();
    git(main, &["init", "-q", "-b", trunk]);
    git(main, &["add", "-A"]);
    git(main, &["commit", "-q", "--allow-empty", "-m", "init"]);
    add_worktree(main, task, branch);
}

/// One more linked worktree of the repository at `main`: at `path`, on a new branch
/// `branch` made from `main`'s `HEAD`; with [`git`].
pub fn add_worktree(main: &Path, path: &Path, branch: &str) {
    git(
        main,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            branch,
            path.to_str().unwrap(),
        ],
    );
}

/// True while `pid` exists and is not a zombie (a zombie is dead for our purposes).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next());
            state != Some("Z")
        }
        Err(_) => false,
    }
}

/// Waits (up to `within`) for `pid` to be gone. Polls: a process that is not our child gives
/// no event to wait for.
pub fn wait_dead(pid: i32, within: Duration) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    !alive(pid)
}

/// A request from JSON, parsed by the protocol's own decoder, so that tests write what a
/// client writes.
pub fn req(method: &str, params: serde_json::Value) -> sandbox_protocol::Request {
    use sandbox_protocol::{decode_frame, Decoded, Frame};
    let line =
        serde_json::to_vec(&serde_json::json!({"id": 0, "method": method, "params": params}))
            .expect("a JSON value serialises");
    match decode_frame(&Frame::Line(line)) {
        Decoded::Request(_, r) => r,
        other => panic!("{method}: {other:?}"),
    }
}
