//! Watcher latency: from `git commit` returning in a view to `<branch>` pointing at that
//! commit (with the task worktree's files and index updated), over 200 commits.
//!
//!     cargo bench -p sandbox-git --bench watcher_latency
//!
//! A plain `main` (harness = false). The repository has a few hundred tracked files so the
//! status check and checkout do real work; each commit changes one file and adds one.

// A panic is how a test or a benchmark reports failure; the workspace lints against
// unwrap/expect apply to shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sandbox_git::{ViewManager, WatchEvent};

const COMMITS: usize = 200;
const WARMUP: usize = 5;
const BASELINE: usize = 50;

fn git(dir: &Path, home: &Path, args: &[&str]) {
    let out = sandbox_testkit::git_command(dir)
        .args(args)
        .env("HOME", home)
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(tmp.path()).unwrap();
    let main = base.join("app");
    std::fs::create_dir_all(main.join("src")).unwrap();
    git(&main, &base, &["init", "-q", "-b", "main"]);
    for i in 0..300 {
        std::fs::write(
            main.join(format!("src/file{i}.rs")),
            format!("// file {i}\n"),
        )
        .unwrap();
    }
    std::fs::write(main.join("bench.txt"), "0\n").unwrap();
    git(&main, &base, &["add", "."]);
    git(&main, &base, &["commit", "-qm", "initial"]);
    let task = base.join("task");
    git(
        &main,
        &base,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "task",
            task.to_str().unwrap(),
        ],
    );

    let views = ViewManager::new(base.join("views")).with_runtime_dir(base.join("run"));
    let view = views.create_or_reuse(&task, None).unwrap().view;
    let (tx, rx) = mpsc::channel();
    // Stamp events where they are emitted, so channel delivery is not counted.
    let watcher = views
        .watch(vec![view.clone()], move |e| {
            let _ = tx.send((Instant::now(), e));
        })
        .unwrap();
    let repo = git2::Repository::open(&view.common_dir).unwrap();

    let mut samples = Vec::with_capacity(COMMITS);
    let mut commit_times = Vec::with_capacity(COMMITS);
    for i in 0..WARMUP + COMMITS {
        std::fs::write(view.view_path.join("bench.txt"), format!("{i}\n")).unwrap();
        std::fs::write(view.view_path.join(format!("src/new{i}.rs")), "// new\n").unwrap();
        git(&view.view_path, &base, &["add", "-A"]);
        let started = Instant::now();
        git(
            &view.view_path,
            &base,
            &["commit", "-q", "-m", &format!("commit {i}")],
        );
        let committed = Instant::now();
        let expected = repo.refname_to_id(&view.child_ref()).unwrap();
        let landed = loop {
            let (at, event) = rx
                .recv_timeout(Duration::from_secs(30))
                .expect("no fast-forward within 30 s");
            match event {
                WatchEvent::FastForwarded { to, .. } if to == expected.to_string() => break at,
                WatchEvent::FastForwarded { .. } | WatchEvent::Watching { .. } => {}
                other => panic!("unexpected event: {other:?}"),
            }
        };
        assert_eq!(repo.refname_to_id(&view.branch_ref()).unwrap(), expected);
        if i >= WARMUP {
            // The watcher may finish before `git commit` has exited: that counts as zero.
            samples.push(landed.saturating_duration_since(committed));
            commit_times.push(committed - started);
        }
    }
    assert_eq!(
        std::fs::read_to_string(task.join("bench.txt")).unwrap(),
        format!("{}\n", WARMUP + COMMITS - 1),
        "the task worktree did not follow"
    );

    // Baseline in the same run: the same fast-forward done by hand with
    // `git merge --ff-only` in the task worktree (what the watcher saves the user from).
    drop(watcher);
    let mut by_hand = Vec::with_capacity(BASELINE);
    for i in 0..BASELINE {
        std::fs::write(view.view_path.join("bench.txt"), format!("manual {i}\n")).unwrap();
        git(
            &view.view_path,
            &base,
            &["commit", "-q", "-a", "-m", &format!("manual {i}")],
        );
        let started = Instant::now();
        git(&task, &base, &["merge", "-q", "--ff-only", "s/task"]);
        by_hand.push(started.elapsed());
    }
    by_hand.sort();

    samples.sort();
    commit_times.sort();
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    println!(
        "watcher latency: commit in view → branch updated ({COMMITS} commits, {WARMUP} warm-up)"
    );
    println!("  min    {}", ms(samples[0]));
    println!("  median {}", ms(percentile(&samples, 0.5)));
    println!("  p50    {}", ms(percentile(&samples, 0.5)));
    println!("  p99    {}", ms(percentile(&samples, 0.99)));
    println!("  max    {}", ms(*samples.last().unwrap()));
    println!("  mean   {}", ms(mean));
    println!(
        "  (for scale: `git commit` itself took median {}, p99 {})",
        ms(percentile(&commit_times, 0.5)),
        ms(percentile(&commit_times, 0.99))
    );
    println!(
        "  baseline, `git merge --ff-only` by hand ({BASELINE} runs): median {}, p99 {}; watcher median / baseline median = {:.2}",
        ms(percentile(&by_hand, 0.5)),
        ms(percentile(&by_hand, 0.99)),
        percentile(&samples, 0.5).as_secs_f64() / percentile(&by_hand, 0.5).as_secs_f64()
    );
    let target = Duration::from_millis(50);
    println!(
        "  target median < 50 ms: {}",
        if percentile(&samples, 0.5) < target {
            "met"
        } else {
            "NOT met"
        }
    );
}
