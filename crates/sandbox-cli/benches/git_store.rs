//! What does the git store quarantine cost? In one run, side by side:
//!
//! - **commit latency**: `git commit --allow-empty` timed inside a loop of the sandboxed
//!   command itself (so the sandbox's start is not counted) — on the host without a sandbox,
//!   under native with the view but without the quarantine (`--unprotected-git`), and under
//!   native with it;
//! - **commit → ref on the host**: after each commit inside a quarantined run, how long until
//!   the repository's task branch holds it (the live sync; waited for by inotify).
//!
//!     cargo bench -p sandbox-cli --bench git_store
//!
//! Prints median / p90 per commit and the ratio to the host.

// A panic is how a test or a benchmark reports failure; the workspace lints against
// unwrap/expect apply to shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const COMMITS: usize = 40;
const ROUNDS: usize = 5;
const VISIBLE_SAMPLES: usize = 40;

use sandbox_testkit::git;

struct Fixture {
    _dir: tempfile::TempDir,
    home: PathBuf,
    main: PathBuf,
    task: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::Builder::new()
        .prefix("sandbox-bench-git-")
        .tempdir()
        .unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join(".config")).unwrap();
    let main = dir.path().join("repo");
    std::fs::create_dir_all(&main).unwrap();
    std::fs::write(main.join("README"), "hello\n").unwrap();
    let task = dir.path().join("task");
    sandbox_testkit::linked_worktree_on(&main, &task, "trunk", "feature");
    git(&main, &["config", "user.name", "b"]);
    git(&main, &["config", "user.email", "b@b"]);
    Fixture {
        home,
        main: std::fs::canonicalize(main).unwrap(),
        task: std::fs::canonicalize(task).unwrap(),
        _dir: dir,
    }
}

fn sandbox(f: &Fixture) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandbox"));
    cmd.current_dir(&f.task)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", &f.home)
        .env("XDG_CONFIG_HOME", f.home.join(".config"))
        .env("XDG_RUNTIME_DIR", f.home.join("run"));
    cmd
}

/// The loop every variant runs: nanoseconds per commit, measured inside.
fn commit_loop() -> String {
    format!(
        "s=$(date +%s%N); i=0; while [ $i -lt {COMMITS} ]; do git commit -q --allow-empty -m c$i || exit 1; i=$((i+1)); done; e=$(date +%s%N); echo $(( (e-s)/{COMMITS} ))"
    )
}

fn per_commit(out: std::process::Output, what: &str) -> Duration {
    assert!(out.status.success(), "{what}: {out:?}");
    let ns: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    Duration::from_nanos(ns)
}

fn stats(samples: &mut [Duration]) -> (Duration, Duration) {
    samples.sort();
    (
        samples[samples.len() / 2],
        samples[(samples.len() * 9 / 10).min(samples.len() - 1)],
    )
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    let f = fixture();
    let policy = sandbox(&f).args(["policy", "show"]).output().unwrap();
    if !String::from_utf8_lossy(&policy.stdout).contains("git store quarantined") {
        println!("skipped: the native backend has no private view here, so no quarantine");
        return;
    }
    // Commit latency, round-robin so noise hits every variant alike.
    let loop_script = commit_loop();
    let mut host = Vec::new();
    let mut view = Vec::new();
    let mut quarantined = Vec::new();
    for _ in 0..ROUNDS {
        host.push(per_commit(
            Command::new("sh")
                .args(["-c", &loop_script])
                .current_dir(&f.task)
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .output()
                .unwrap(),
            "host",
        ));
        view.push(per_commit(
            sandbox(&f)
                .args([
                    "run",
                    "--backend",
                    "native",
                    "--unprotected-git",
                    "--",
                    "sh",
                    "-c",
                    &loop_script,
                ])
                .output()
                .unwrap(),
            "native --unprotected-git",
        ));
        quarantined.push(per_commit(
            sandbox(&f)
                .args(["run", "--backend", "native", "--", "sh", "-c", &loop_script])
                .output()
                .unwrap(),
            "native",
        ));
    }
    let (host_median, host_p90) = stats(&mut host);
    println!("commit latency ({COMMITS} commits x {ROUNDS} rounds, per commit, measured inside the command):");
    println!(
        "  {:<48} median {:>9}  p90 {:>9}  1.00x",
        "host, no sandbox",
        ms(host_median),
        ms(host_p90)
    );
    for (name, samples) in [
        ("native, view, no quarantine (--unprotected-git)", &mut view),
        ("native, view + git store quarantine", &mut quarantined),
    ] {
        let (median, p90) = stats(samples);
        println!(
            "  {:<48} median {:>9}  p90 {:>9}  {:.2}x",
            name,
            ms(median),
            ms(p90),
            median.as_secs_f64() / host_median.as_secs_f64()
        );
    }

    // Commit → ref visible on the host, while the command keeps running.
    let (tx, changed) = mpsc::channel();
    let mut watcher = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
        if e.is_ok_and(|e| !e.kind.is_access()) {
            let _ = tx.send(());
        }
    })
    .unwrap();
    notify::Watcher::watch(
        &mut watcher,
        &f.main.join(".git/refs/heads"),
        notify::RecursiveMode::Recursive,
    )
    .unwrap();
    let mut child = sandbox(&f)
        .args(["run", "--backend", "native", "--", "sh", "-c"])
        .arg("while read line; do git commit -q --allow-empty -m v && git rev-parse HEAD || exit 1; done")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut visible = Vec::new();
    for _ in 0..VISIBLE_SAMPLES {
        stdin.write_all(b"go\n").unwrap();
        let mut oid = String::new();
        stdout.read_line(&mut oid).unwrap();
        // From the moment the command has printed the commit (its `git commit` returned).
        let committed = Instant::now();
        let oid = oid.trim().to_string();
        while git(&f.main, &["rev-parse", "feature"]) != oid {
            changed
                .recv_timeout(Duration::from_secs(30))
                .expect("the commit never reached the repository");
        }
        visible.push(committed.elapsed());
        while changed.try_recv().is_ok() {}
    }
    drop(stdin);
    assert!(child.wait().unwrap().success());
    let (median, p90) = stats(&mut visible);
    println!("commit -> task branch on the host, live ({VISIBLE_SAMPLES} commits):");
    println!("  median {}  p90 {}", ms(median), ms(p90));
}
