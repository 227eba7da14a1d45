//! The git store quarantine end to end, beyond the escape suite's rows: commits reach the
//! repository while the command still runs, two tasks commit side by side, and a refused
//! update is reported on stderr and in `--report-json`.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use common::escape::{self, Fixture};

/// Whether this machine gives the native backend its private view (the quarantine needs it).
fn quarantine_unavailable(f: &Fixture) -> Option<String> {
    let out = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args(["policy", "show", "--json"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    (!text.contains("git store quarantined"))
        .then(|| "the native backend has no private view on this machine, so no quarantine".into())
}

#[test]
fn a_commit_reaches_the_repository_while_the_command_runs() {
    let f = Fixture::new();
    if let Some(why) = quarantine_unavailable(&f) {
        common::skip("private-view", why);
        return;
    }
    let before = escape::rev_parse(&f, "feature");
    // Watch the repository's refs before the run: the host's update is an event there.
    let (tx, changed) = mpsc::channel();
    let mut watcher = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
        // Not reads: `git rev-parse` below opens the refs it reads.
        if e.is_ok_and(|e| !e.kind.is_access()) {
            let _ = tx.send(());
        }
    })
    .unwrap();
    notify::Watcher::watch(
        &mut watcher,
        &f.common.join("refs/heads"),
        notify::RecursiveMode::Recursive,
    )
    .unwrap();
    let mut child = KillOnDrop(f
        .env
        .cmd()
        .current_dir(&f.task)
        .args(["run", "--backend", "native", "--", "sh", "-c"])
        .arg("echo live > live.txt && git add live.txt && git commit -qm live && git rev-parse HEAD && read line")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap());
    let mut stdout = BufReader::new(child.0.stdout.take().unwrap());
    let mut head = String::new();
    stdout.read_line(&mut head).unwrap();
    let head = head.trim().to_string();
    assert_eq!(head.len(), 40, "the command printed no commit id");
    // The command is still running (it waits for a line): the ref must arrive anyway.
    let mut seen = escape::rev_parse(&f, "feature");
    while seen != head {
        changed
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("feature never reached {head} while the command ran (still {seen}, was {before})"));
        seen = escape::rev_parse(&f, "feature");
    }
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "the command ended before the ref arrived"
    );
    child.0.stdin.take().unwrap().write_all(b"done\n").unwrap();
    let out = child.wait();
    assert!(out.status.success(), "{}", common::text(&out));
}

/// A run that must not outlive a failed test (it waits on its stdin).
struct KillOnDrop(std::process::Child);

impl KillOnDrop {
    fn wait(mut self) -> std::process::Output {
        let child = std::mem::replace(
            &mut self.0,
            std::process::Command::new("true").spawn().unwrap(),
        );
        child.wait_with_output().unwrap()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn two_tasks_commit_in_parallel_in_two_worktrees() {
    let f = Fixture::new();
    if let Some(why) = quarantine_unavailable(&f) {
        common::skip("private-view", why);
        return;
    }
    let second = f.env.path().join("second");
    sandbox_testkit::add_worktree(&f.main, &second, "second");
    let script = "for i in 1 2 3 4 5; do echo $i > n.txt && git add n.txt && git commit -qm n$i || exit 1; done; git rev-parse HEAD";
    let spawn = |dir: &std::path::Path| {
        f.env
            .cmd()
            .current_dir(dir)
            .args(["run", "--backend", "native", "--", "sh", "-c", script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(&f.task), spawn(&second));
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    for (out, branch) in [(&a, "feature"), (&b, "second")] {
        assert!(out.status.success(), "{}", common::text(out));
        let head = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert_eq!(
            escape::rev_parse(&f, branch),
            head,
            "{branch}: {}",
            common::text(out)
        );
        let count = escape::host_git(
            &f.main,
            &["rev-list", "--count", &format!("trunk..{branch}")],
        );
        assert_eq!(String::from_utf8_lossy(&count.stdout).trim(), "5");
    }
    let fsck = escape::host_git(&f.main, &["fsck", "--strict", "--no-dangling"]);
    assert!(fsck.status.success(), "{}", common::text(&fsck));
}

#[test]
fn a_refused_update_is_reported_on_stderr_and_in_the_json_report() {
    let f = Fixture::new();
    if let Some(why) = quarantine_unavailable(&f) {
        common::skip("private-view", why);
        return;
    }
    // A new ref outside branches, tags and the stash is refused; the commit still lands.
    let report = f.env.path().join("report.json");
    let out = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args(["run", "--backend", "native", "--report-json"])
        .arg(&report)
        .args([
            "--",
            "sh",
            "-c",
            "git commit -q --allow-empty -m ok && git update-ref refs/notes/evil HEAD",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out));
    assert_eq!(escape::rev_parse(&f, "refs/notes/evil"), "", "applied");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("refused") && stderr.contains("refs/notes/evil"),
        "{stderr}"
    );
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let store = &json["gitStore"];
    assert_eq!(store["refused"][0]["name"], "refs/notes/evil", "{json:#}");
    assert_eq!(
        store["applied"][0]["name"], "refs/heads/feature",
        "{json:#}"
    );
    assert_eq!(json["exitCode"], 0);
}

/// Writes the host never applies (the repository's config, a hook) succeed inside and are gone
/// afterwards: each is named after the run and in the report, never dropped in silence, while
/// a change to the task branch's own config section (ordinary branch work) is not.
#[test]
fn config_and_hooks_written_inside_are_named_after_the_run_as_dropped() {
    let f = Fixture::new();
    if let Some(why) = quarantine_unavailable(&f) {
        common::skip("private-view", why);
        return;
    }
    let report = f.env.path().join("report.json");
    let out = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args(["run", "--backend", "native", "--report-json"])
        .arg(&report)
        .args([
            "--",
            "sh",
            "-c",
            "git config --local core.fsmonitor 'touch /tmp/x' && \
             git remote add other https://example.invalid/x.git && \
             git config branch.feature.description mine && \
             g=$(git rev-parse --git-common-dir) && printf '#!/bin/sh\\n' > \"$g/hooks/pre-commit\" && \
             git config --get remote.other.url && git commit -q --allow-empty -m ok",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out));
    // Inside, git saw its own writes; on the host none of them is there.
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("example.invalid"),
        "{}",
        common::text(&out)
    );
    let host = escape::host_git(&f.task, &["config", "--get", "remote.other.url"]);
    assert!(!host.status.success(), "applied on the host");
    assert!(!f.common.join("hooks/pre-commit").exists(), "hook applied");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("config (core.fsmonitor, remote.other.fetch, remote.other.url)"),
        "{stderr}"
    );
    assert!(stderr.contains("hooks/ (pre-commit)"), "{stderr}");
    assert!(!stderr.contains("branch.feature"), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let dropped = json["gitStore"]["dropped"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(dropped.len(), 2, "{json:#}");
    assert_eq!(json["gitStore"]["applied"][0]["name"], "refs/heads/feature");
}

/// `sandbox run --backend native -- sh -c SCRIPT` in the task worktree, which must succeed.
fn run_ok(f: &Fixture, script: &str) -> String {
    let out = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args(["run", "--backend", "native", "--", "sh", "-c", script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{script}: {}", common::text(&out));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_stash_pushed_over_the_users_keeps_both_entries() {
    let f = Fixture::new();
    if let Some(why) = quarantine_unavailable(&f) {
        common::skip("quarantine-unavailable", why);
        return;
    }
    std::fs::write(f.task.join("README"), "user's wip\n").unwrap();
    common::escape::git(&f.task, &["stash", "-q", "-m", "users"]);
    let users = escape::rev_parse(&f, "refs/stash");
    let stderr = run_ok(&f, "echo agent > README && git stash -q -m agents");
    assert!(!stderr.contains("refused"), "{stderr}");
    let list = escape::host_git(&f.task, &["stash", "list", "--format=%H %gs"]);
    let list = String::from_utf8_lossy(&list.stdout).into_owned();
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 2, "{list}");
    assert!(lines[0].ends_with("agents"), "{list}");
    assert!(lines[1].starts_with(&users), "{list}");
    // The next run pops its own entry: the user's is the stash again.
    let popped = run_ok(
        &f,
        "git stash pop -q && grep -q agent README && git checkout -q README",
    );
    assert_eq!(escape::rev_parse(&f, "refs/stash"), users, "{popped}");
    let list = escape::host_git(&f.task, &["stash", "list"]);
    assert_eq!(String::from_utf8_lossy(&list.stdout).lines().count(), 1);
    // Dropping the user's entry is refused, whenever the live sync took the push in: the
    // user's entry stays, and the run's is not lost either (in the stash, or named with the
    // `git stash store` that keeps it).
    let out = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args(["run", "--backend", "native", "--", "sh", "-c"])
        .arg("echo again > README && git stash -q && git rev-parse stash@{0} && git stash drop -q stash@{1}")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("does not keep every entry the repository had"),
        "{stderr}"
    );
    let list = escape::host_git(&f.task, &["stash", "list", "--format=%H"]);
    let list = String::from_utf8_lossy(&list.stdout).into_owned();
    assert!(
        list.lines().any(|l| l == users),
        "the user's entry is gone: {list}"
    );
    let runs = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        list.lines().any(|l| l == runs)
            || stderr.contains(&format!("git stash store -m sandbox {runs}")),
        "the run's stash {runs} is lost: {list} {stderr}"
    );
}

#[test]
fn later_runs_move_and_delete_the_refs_earlier_runs_created() {
    let f = Fixture::new();
    if let Some(why) = quarantine_unavailable(&f) {
        common::skip("quarantine-unavailable", why);
        return;
    }
    run_ok(
        &f,
        "git commit -q --allow-empty -m one && git branch side && git tag t1",
    );
    assert_ne!(escape::rev_parse(&f, "side"), "");
    let stderr = run_ok(
        &f,
        "git commit -q --allow-empty -m two && git branch -f side HEAD && git tag -d t1",
    );
    assert!(!stderr.contains("refused"), "{stderr}");
    assert_eq!(
        escape::rev_parse(&f, "side"),
        escape::rev_parse(&f, "feature")
    );
    assert_eq!(escape::rev_parse(&f, "refs/tags/t1"), "");
    run_ok(&f, "git branch -D side");
    assert_eq!(escape::rev_parse(&f, "refs/heads/side"), "");
    // A branch the user made is still not the runs' to delete.
    common::escape::git(&f.main, &["branch", "users"]);
    let out = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args([
            "run",
            "--backend",
            "native",
            "--",
            "git",
            "branch",
            "-D",
            "users",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", common::text(&out));
    assert_ne!(escape::rev_parse(&f, "refs/heads/users"), "");
    // The failure says why, from git's own report: the ref is pinned, not the task's.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "`git branch -D users` failed inside because refs/heads/users is not this task's"
        ) && stderr.contains("run `git branch -D users` on the host"),
        "{stderr}"
    );
}

/// `git gc` (which packs refs) and deleting the run's own refs work inside with every git:
/// git before 2.43 rewrites `packed-refs` for any deletion, so the frozen `packed-refs` is
/// the run's to rewrite in its layer, and the host judges the refs it names. A ref the task
/// does not own still fails at once, with a line that says why.
#[test]
fn git_gc_and_deleting_own_refs_work_inside_and_the_host_takes_the_runs_values() {
    let f = Fixture::new();
    if let Some(why) = quarantine_unavailable(&f) {
        common::skip("quarantine-unavailable", why);
        return;
    }
    let run = |script: &str| {
        f.env
            .cmd()
            .current_dir(&f.task)
            .args(["run", "--backend", "native", "--", "sh", "-c", script])
            .output()
            .unwrap()
    };
    let trunk = escape::rev_parse(&f, "trunk");
    let out = run(
        "git commit -q --allow-empty -m one && git tag gc-1 && git tag gc-2 && git gc -q && \
         git pack-refs --all && git tag -d gc-2 && git commit -q --allow-empty -m two",
    );
    // (gc cannot prune the loose copies of the host's pinned refs, says so, and succeeds.)
    assert!(out.status.success(), "{}", common::text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("refused"), "{stderr}");
    let feature = escape::rev_parse(&f, "feature");
    assert_ne!(feature, "");
    assert_eq!(
        escape::rev_parse(&f, "gc-1"),
        escape::rev_parse(&f, "feature~1")
    );
    assert_eq!(escape::rev_parse(&f, "refs/tags/gc-2"), "");
    assert_eq!(escape::rev_parse(&f, "trunk"), trunk, "trunk moved");
    // The next run sees the host's refs again and may delete its own tag.
    let out = run("git tag -d gc-1 >/dev/null && git log -1 --format=%s");
    assert!(out.status.success(), "{}", common::text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "two");
    assert_eq!(escape::rev_parse(&f, "refs/tags/gc-1"), "");

    // A ref the task does not own: refused inside, with the line naming it.
    let out = run("git update-ref -d refs/heads/trunk");
    assert!(!out.status.success(), "{}", common::text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("failed inside because refs/heads/trunk is not this task's"),
        "{stderr}"
    );
    assert_eq!(escape::rev_parse(&f, "trunk"), trunk);
    // A git command that fails for a reason of its own gets no such line.
    let out = run("git rev-parse --verify -q no-such-ref");
    assert!(!out.status.success(), "{}", common::text(&out));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("failed inside"),
        "{}",
        common::text(&out)
    );
}

#[test]
fn a_rebase_started_in_one_run_is_continued_in_the_next() {
    let f = Fixture::new();
    if let Some(why) = quarantine_unavailable(&f) {
        common::skip("quarantine-unavailable", why);
        return;
    }
    let first = run_ok(
        &f,
        "git commit -q --allow-empty -m one && git commit -q --allow-empty -m two && \
         GIT_SEQUENCE_EDITOR='sed -i 1s/^pick/edit/' git rebase -q -i HEAD~2",
    );
    assert!(!first.contains("set aside"), "{first}");
    // HEAD is detached mid-rebase: the next run's task branch is still feature (the record).
    let second = run_ok(
        &f,
        "git commit -q --amend --allow-empty -m amended && git rebase --continue",
    );
    assert!(
        !second.contains("set aside") && !second.contains("refused"),
        "{second}"
    );
    let log = escape::host_git(&f.main, &["log", "--format=%s", "-3", "feature"]);
    assert_eq!(
        String::from_utf8_lossy(&log.stdout),
        "two\namended\ninit\n",
        "{}",
        common::text(&log)
    );
    let head = std::fs::read_to_string(f.common.join("worktrees/task/HEAD")).unwrap();
    assert_eq!(head, "ref: refs/heads/feature\n");
}

/// The report often goes into the worktree, which the previous run could write: a link left
/// at its name must not make the host write the report (with strings the agent chose, such
/// as a pointer's content) into a file the link names — `~/.bashrc` would run them.
#[test]
fn the_json_report_replaces_a_link_planted_at_its_name() {
    let f = Fixture::new();
    let victim = f.home.join(".bashrc-victim");
    std::fs::write(&victim, "# the user's file\n").unwrap();
    let plant = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args(["run", "--backend", "native", "--", "ln", "-s"])
        .arg(&victim)
        .arg("report.json")
        .output()
        .unwrap();
    assert!(plant.status.success(), "{}", common::text(&plant));
    assert!(f.task.join("report.json").is_symlink());
    let out = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args([
            "run",
            "--backend",
            "native",
            "--report-json",
            "report.json",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out));
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "# the user's file\n"
    );
    let report = f.task.join("report.json");
    assert!(
        !report.is_symlink(),
        "the link was written through, not replaced"
    );
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(json["exitCode"], 0);
}

/// The run itself swaps the report's directory for a link to another (`out` → `~/victim`)
/// while the report is still to come: the host writes into the directory the user named
/// (opened before the command started), never through the link. With every backend, since
/// the command can do this wherever the worktree is writable: the host backend is the
/// control that the swap itself succeeds.
#[test]
fn the_json_report_lands_in_the_directory_named_before_the_run() {
    let f = Fixture::new();
    let victim = f.home.join("victim");
    std::fs::create_dir(&victim).unwrap();
    for backend in ["host", "native"] {
        let out_dir = f.task.join(format!("out-{backend}"));
        std::fs::create_dir(&out_dir).unwrap();
        let swap = format!(
            "mv out-{backend} moved-{backend} && ln -s {} out-{backend}",
            victim.display()
        );
        let out = f
            .env
            .cmd()
            .current_dir(&f.task)
            .args(["run", "--backend", backend, "--report-json"])
            .arg(format!("out-{backend}/report.json"))
            .args(["--", "sh", "-c", &swap])
            .output()
            .unwrap();
        assert!(out.status.success(), "{backend}: {}", common::text(&out));
        assert!(
            out_dir.is_symlink(),
            "{backend}: the command swapped the directory for a link"
        );
        assert_eq!(
            std::fs::read_dir(&victim).unwrap().count(),
            0,
            "{backend}: the report was written through the link"
        );
        let report = f.task.join(format!("moved-{backend}/report.json"));
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        assert_eq!(json["exitCode"], 0, "{backend}");
    }
}

#[test]
fn the_daemon_reports_the_git_store_in_the_exit_event() {
    let f = Fixture::new();
    if let Some(why) = quarantine_unavailable(&f) {
        common::skip("private-view", why);
        return;
    }
    let daemon = common::daemon::Daemon::start(&f.env);
    let mut client = daemon.client();
    daemon
        .create(
            &mut client,
            "quarantine",
            &f.task,
            serde_json::json!({"backend": "native"}),
        )
        .unwrap();
    let reply = client
        .call(&common::daemon::req(
            "box.exec",
            serde_json::json!({
                "name": "quarantine",
                "command": "sh",
                "args": ["-c", "git commit -q --allow-empty -m boxed && git update-ref refs/heads/trunk HEAD; git branch made-here"],
            }),
        ))
        .unwrap();
    let exec_id = reply["execId"].as_u64().unwrap();
    let exit = loop {
        let event = client.next_event().unwrap();
        if event.exec_id == Some(exec_id) && event.kind.as_deref() == Some("exit") {
            break event;
        }
    };
    let store = exit.git_store.expect("an exit event with gitStore");
    let applied: Vec<&str> = store.applied.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(
        applied,
        vec!["refs/heads/feature", "refs/heads/made-here"],
        "{store:?}"
    );
    assert_eq!(
        escape::rev_parse(&f, "made-here"),
        escape::rev_parse(&f, "feature")
    );
    // trunk is pinned inside, so its update failed there and never reached the layer.
    assert_eq!(
        escape::host_git(&f.main, &["log", "-1", "--format=%s", "trunk"]).stdout,
        b"init\n"
    );
}

/// The quarantine for an unprivileged user, not only for root (who may remove what overlayfs
/// leaves without permissions, and mount where others may not): as `nobody`, a commit
/// reaches the task branch, another branch stays put, and no layer is left behind.
#[test]
fn the_quarantine_works_for_an_unprivileged_user() {
    let is_root = nix::unistd::geteuid().is_root();
    if is_root && !std::path::Path::new("/usr/bin/setpriv").exists() {
        common::skip("setpriv", "setpriv is missing");
        return;
    }
    let env = common::Env::new();
    let mode = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(m)).unwrap()
    };
    mode(env.path(), 0o755);
    let base = env.path().join("nobody");
    let home = base.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let bin = env.path().join("sandbox");
    sandbox_testkit::nobody::copy_executable(std::path::Path::new(common::BIN), &bin);
    mode(&bin, 0o755);
    if is_root {
        let (uid, gid) = (
            nix::unistd::Uid::from_raw(65534),
            nix::unistd::Gid::from_raw(65534),
        );
        nix::unistd::chown(base.as_path(), Some(uid), Some(gid)).unwrap();
        nix::unistd::chown(home.as_path(), Some(uid), Some(gid)).unwrap();
    }
    let as_user = |dir: &std::path::Path, args: &[&str]| -> std::process::Output {
        common::unprivileged(args)
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("XDG_RUNTIME_DIR", home.join("run"))
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_AUTHOR_NAME", "n")
            .env("GIT_AUTHOR_EMAIL", "n@example.com")
            .env("GIT_COMMITTER_NAME", "n")
            .env("GIT_COMMITTER_EMAIL", "n@example.com")
            .current_dir(dir)
            .output()
            .unwrap()
    };
    let ok = |out: std::process::Output| {
        assert!(out.status.success(), "{}", common::text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let repo = base.join("repo");
    ok(as_user(
        &base,
        &["git", "init", "-q", "-b", "trunk", repo.to_str().unwrap()],
    ));
    ok(as_user(
        &repo,
        &["git", "commit", "-q", "--allow-empty", "-m", "init"],
    ));
    let task = base.join("task");
    ok(as_user(
        &repo,
        &[
            "git",
            "worktree",
            "add",
            "-q",
            task.to_str().unwrap(),
            "-b",
            "feature",
        ],
    ));
    let policy = as_user(&task, &[bin.to_str().unwrap(), "policy", "show"]);
    if !String::from_utf8_lossy(&policy.stdout).contains("git store quarantined") {
        common::skip(
            "unprivileged-private-view",
            "no private view for an unprivileged user here, so no quarantine",
        );
        return;
    }
    let trunk = ok(as_user(&repo, &["git", "rev-parse", "trunk"]));
    let out = as_user(
        &task,
        &[
            bin.to_str().unwrap(),
            "run",
            "--",
            "sh",
            "-c",
            "git commit -q --allow-empty -m mine; git update-ref refs/heads/trunk HEAD; git rev-parse HEAD",
        ],
    );
    let head = ok(out.clone());
    assert_eq!(ok(as_user(&repo, &["git", "rev-parse", "feature"])), head);
    assert_eq!(ok(as_user(&repo, &["git", "rev-parse", "trunk"])), trunk);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("could not remove"), "{stderr}");
}

/// git inside waits for a lock the host holds (`packed-refs.lock` still shows through the
/// overlay; without the quarantine the refs are shared) rather than giving up after git's
/// default 100 ms.
#[test]
fn git_inside_waits_for_ref_locks_the_host_holds() {
    let f = Fixture::new();
    let out = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args(["run", "--backend", "native", "--", "sh", "-c"])
        .arg("git config --get core.filesRefLockTimeout; git config --get core.packedRefsTimeout")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "5000\n5000\n");
}

/// A ref lock the host takes during the run (the quarantine's own sync takes the task
/// branch's) must never be seen inside: overlayfs keeps a lower-layer file it once looked up,
/// so a lock seen once would stay "held" inside after the host released it, and every later
/// git command of the run would fail on it.
#[test]
fn a_ref_lock_the_host_held_during_the_run_never_blocks_git_inside() {
    let f = Fixture::new();
    if let Some(why) = quarantine_unavailable(&f) {
        common::skip("private-view", why);
        return;
    }
    let lock = f.common.join("refs/heads/feature.lock");
    let common = f.common.to_str().unwrap().to_string();
    let mut child = KillOnDrop(
        f.env
            .cmd()
            .current_dir(&f.task)
            .args(["run", "--backend", "native", "--", "sh", "-c"])
            .arg(format!(
                "read a; test -e '{common}/refs/heads/feature.lock' && echo seen || echo absent; \
                 read b; git commit --allow-empty -qm 'after the lock' && git rev-parse HEAD"
            ))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stdin = child.0.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.0.stdout.take().unwrap());
    // The host holds the task branch's lock while the command looks at it…
    std::fs::write(&lock, "").unwrap();
    stdin.write_all(b"look\n").unwrap();
    let mut seen = String::new();
    stdout.read_line(&mut seen).unwrap();
    // …then releases it before the command commits.
    std::fs::remove_file(&lock).unwrap();
    stdin.write_all(b"commit\n").unwrap();
    let mut head = String::new();
    stdout.read_line(&mut head).unwrap();
    drop(stdin);
    let out = child.wait();
    assert_eq!(seen.trim(), "absent", "the host's lock showed inside");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(head.trim().len(), 40, "{out:?}");
    assert_eq!(escape::rev_parse(&f, "feature"), head.trim());
}

/// A small loose object that inflates to 1 GiB (1 MB of compressed zeros, written inside the
/// way git writes one) is imported into the repository with the host's `sandbox` process
/// staying far below the object's size: the host streams it. Measured from outside: the
/// peak resident size of the `sandbox` process (`ru_maxrss` of `wait4`, which also covers
/// what it waited for — the command inside, a small python).
#[test]
fn a_loose_object_inflating_to_a_gib_is_imported_in_bounded_memory() {
    let f = Fixture::new();
    if let Some(why) = quarantine_unavailable(&f) {
        common::skip("quarantine-unavailable", why);
        return;
    }
    if !std::path::Path::new("/usr/bin/python3").exists() {
        common::skip("python3", "python3 is missing");
        return;
    }
    const GIB: u64 = 1 << 30;
    let script = format!(
        "import hashlib, os, subprocess, zlib\n\
         n = {GIB}\n\
         head = b'blob %d\\0' % n\n\
         h = hashlib.sha1(head)\n\
         z = zlib.compressobj(1)\n\
         chunk = bytes(1 << 20)\n\
         parts = [z.compress(head)]\n\
         for _ in range(n >> 20):\n    h.update(chunk)\n    parts.append(z.compress(chunk))\n\
         parts.append(z.flush())\n\
         oid = h.hexdigest()\n\
         common = subprocess.check_output(['git', 'rev-parse', '--git-common-dir']).decode().strip()\n\
         d = os.path.join(common, 'objects', oid[:2])\n\
         os.makedirs(d, exist_ok=True)\n\
         with open(os.path.join(d, 'tmp_obj_x'), 'wb') as out:\n    out.write(b''.join(parts))\n\
         os.rename(os.path.join(d, 'tmp_obj_x'), os.path.join(d, oid[2:]))\n\
         print('OID', oid, sum(map(len, parts)))\n"
    );
    // Reaped by wait4 below, which also returns its peak RSS.
    #[allow(clippy::zombie_processes)]
    let child = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args(["run", "--", "/usr/bin/python3", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut stdout = child.stdout.unwrap();
    let mut stderr = child.stderr.unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let mut shown = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut shown).unwrap();
    let errors = reader.join().unwrap();
    let mut status = 0;
    // SAFETY: `rusage` is a C struct of integers, for which all-zero bytes are a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4(2) on our own child, writing one int and one rusage to our stack.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "status {status}: {shown}\n{errors}"
    );
    let oid = shown
        .split_whitespace()
        .skip_while(|w| *w != "OID")
        .nth(1)
        .unwrap_or_else(|| panic!("no object id: {shown}\n{errors}"))
        .to_string();
    // The object is in the repository now, whole.
    let size = std::process::Command::new("git")
        .args(["cat-file", "-s", &oid])
        .current_dir(&f.main)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&size.stdout).trim(),
        GIB.to_string(),
        "{}\n{errors}",
        common::text(&size)
    );
    let peak_kib = usage.ru_maxrss as u64;
    common::report(format_args!(
        "importing a 1 GiB loose object: sandbox's peak RSS {} MiB",
        peak_kib / 1024
    ));
    assert!(
        peak_kib < 256 * 1024,
        "the host's sandbox process peaked at {peak_kib} KiB importing a 1 GiB object"
    );
}

/// Filling the git store layer: the run's writes to the store stop at its bound with ENOSPC
/// inside, `sandbox` says afterwards that the layer was full and how to raise the bound, and
/// nothing of it lands in the host's memory-backed directories (`/dev/shm`). The control: the
/// same write under a bound large enough goes through.
#[test]
fn filling_the_git_store_layer_stops_at_its_bound_with_a_clear_error() {
    let write_24_mib = "head -c 25165824 /dev/urandom > big && git add big && echo added";
    for (mib, fits) in [(8, false), (128, true)] {
        let f = Fixture::new();
        if let Some(why) = quarantine_unavailable(&f) {
            common::skip("quarantine-unavailable", why);
            return;
        }
        if let Some(why) = tmpfs_without_user_xattrs() {
            common::skip("tmpfs-user-xattrs", why);
            return;
        }
        f.env.write_config(&format!(
            "backends:\n  native:\n    git_store_size_mib: {mib}\n"
        ));
        let shm = |uid: u32| {
            let dir = std::path::Path::new("/dev/shm").join(format!("sandbox-{uid}"));
            walk_size(&dir)
        };
        let uid = nix::unistd::geteuid().as_raw();
        let out = f
            .env
            .cmd()
            .current_dir(&f.task)
            .args(["run", "--", "sh", "-c", write_24_mib])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if fits {
            assert!(stdout.contains("added"), "{}", common::text(&out));
            assert!(!stderr.contains("layer was full"), "{}", common::text(&out));
            continue;
        }
        assert!(!stdout.contains("added"), "{}", common::text(&out));
        assert!(
            stderr.contains("No space left on device"),
            "{}",
            common::text(&out)
        );
        assert!(
            stderr.contains("git store layer was full (8 MiB)")
                && stderr.contains("git_store_size_mib"),
            "{}",
            common::text(&out)
        );
        // The layer was the run's own tmpfs: nothing of it was ever in the host's /dev/shm.
        assert!(shm(uid) < 1 << 20, "{} bytes in /dev/shm", shm(uid));
    }
}

/// Why a run's git store layer cannot be a tmpfs of its own here, if so: the overlay needs
/// user xattrs on its upper layer, which tmpfs has from Linux 6.6 (a real probe: a tmpfs in a
/// new user + mount namespace, and a `user.` xattr set on it).
fn tmpfs_without_user_xattrs() -> Option<String> {
    let dir = tempfile::tempdir().unwrap();
    let probe = format!(
        "mount -t tmpfs probe {0} && /usr/bin/python3 -c \"import os; os.setxattr('{0}', 'user.probe', b'1')\"",
        dir.path().display()
    );
    let out = std::process::Command::new("unshare")
        .args(["-Urm", "sh", "-c", &probe])
        .output()
        .ok()?;
    (!out.status.success()).then(|| {
        format!(
            "tmpfs takes no user xattrs in a user namespace here (before Linux 6.6?), so the \
             git store layer stays on disk, unbounded: {}",
            common::text(&out)
        )
    })
}

/// The bytes of the regular files under `dir` (0 if it does not exist).
fn walk_size(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => walk_size(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

/// A bare repository beside the fixture's, holding its `main`, and the task's `origin`.
fn bare_remote(f: &Fixture) -> std::path::PathBuf {
    let remote = f.outside.join("remote.git");
    common::escape::git(
        &f.outside,
        &["init", "-q", "--bare", remote.to_str().unwrap()],
    );
    common::escape::git(&f.main, &["push", "-q", remote.to_str().unwrap(), "HEAD"]);
    common::escape::git(
        &f.task,
        &["remote", "add", "origin", remote.to_str().unwrap()],
    );
    remote
}

#[test]
fn a_push_to_a_local_bare_remote_needs_allow_push_and_lands_through_the_quarantine() {
    let f = Fixture::new();
    if let Some(why) = quarantine_unavailable(&f) {
        common::skip("quarantine-unavailable", why);
        return;
    }
    let remote = bare_remote(&f);
    let push = |flags: &[&str], script: &str| {
        f.env
            .cmd()
            .current_dir(&f.task)
            .args(["run", "--backend", "native"])
            .args(flags)
            .args(["--", "sh", "-c", script])
            .output()
            .unwrap()
    };
    let remote_ref = |name: &str| {
        let out = escape::host_git(&remote, &["rev-parse", "-q", "--verify", name]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    // Without the flag: the push fails, and says which flag would let it through.
    let out = push(
        &[],
        "git commit -q --allow-empty -m p1 && git push -q origin feature",
    );
    assert!(!out.status.success(), "{}", common::text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("`--allow-push {}`", remote.display())),
        "{stderr}"
    );
    assert_eq!(remote_ref("refs/heads/feature"), "");
    // With it (by the remote's name): the branch lands, and a later push moves it.
    let out = push(&["--allow-push", "origin"], "git push -q origin feature");
    assert!(out.status.success(), "{}", common::text(&out));
    assert_eq!(
        remote_ref("refs/heads/feature"),
        escape::rev_parse(&f, "feature")
    );
    let out = push(
        &["--allow-push", "origin"],
        "git commit -q --allow-empty -m p2 && git push -q origin feature",
    );
    assert!(out.status.success(), "{}", common::text(&out));
    let feature = escape::rev_parse(&f, "feature");
    assert_eq!(remote_ref("refs/heads/feature"), feature);
    // The repository's remote-tracking ref followed the remote, and nothing was refused.
    assert_eq!(
        escape::rev_parse(&f, "refs/remotes/origin/feature"),
        feature
    );
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("refused"),
        "{}",
        common::text(&out)
    );
    // The remote's trunk is not the task's: refused inside, unchanged on the host.
    let trunk = remote_ref("refs/heads/trunk");
    assert_ne!(trunk, "");
    let out = push(
        &["--allow-push", "origin"],
        "git push -q -f origin feature:trunk",
    );
    assert!(!out.status.success(), "{}", common::text(&out));
    assert_eq!(remote_ref("refs/heads/trunk"), trunk);
    // Objects arrived by content: the remote is whole.
    let fsck = escape::host_git(&remote, &["fsck", "--connectivity-only"]);
    assert!(fsck.status.success(), "{}", common::text(&fsck));
}

#[test]
fn a_hook_planted_in_the_push_remote_never_lands() {
    let f = Fixture::new();
    if let Some(why) = quarantine_unavailable(&f) {
        common::skip("quarantine-unavailable", why);
        return;
    }
    let remote = bare_remote(&f);
    let mark = f.outside.join("remote-hook-ran");
    // The attack: a hook (and a hooks path in its config) in the remote, from inside; the
    // user's next push from the host would run it.
    let plant = format!(
        "r={r}; printf '#!/bin/sh\\ntouch {m}\\n' > $r/hooks/pre-receive; chmod +x $r/hooks/pre-receive; \
         git config -f $r/config core.hooksPath $r/hooks; \
         mkdir -p $r/planted && cp $r/hooks/pre-receive $r/planted/ 2>/dev/null; \
         git push -q origin feature; true",
        r = remote.display(),
        m = mark.display()
    );
    let host_push = || {
        let out = escape::host_git(&f.task, &["push", "-q", "origin", "HEAD:refs/heads/check"]);
        assert!(out.status.success(), "{}", common::text(&out));
        escape::host_git(&remote, &["update-ref", "-d", "refs/heads/check"]);
    };
    for backend in ["native", "host"] {
        let mut cmd = f.env.cmd();
        cmd.current_dir(&f.task).args(["run", "--backend", backend]);
        if backend == "native" {
            cmd.args(["--allow-push", remote.to_str().unwrap()]);
        }
        let out = cmd.args(["--", "sh", "-c", &plant]).output().unwrap();
        assert!(out.status.success(), "{backend}: {}", common::text(&out));
        host_push();
        let ran = mark.exists();
        if backend == "host" {
            // The control: without a sandbox the planted hook runs on the user's push.
            assert!(
                ran,
                "host: the planted hook did not run: the attack is broken"
            );
        } else {
            assert!(
                !ran,
                "native: the hook planted in the push remote ran on the host"
            );
            assert!(!remote.join("hooks/pre-receive").exists());
            assert!(!remote.join("planted").exists());
            // The push itself went through.
            let out = escape::host_git(&remote, &["rev-parse", "-q", "--verify", "feature"]);
            assert!(out.status.success(), "{}", common::text(&out));
        }
    }
}

/// The record of which branch a worktree's runs own outlives a reboot (the runtime dir is
/// emptied then): a run SIGKILLed with `HEAD` parked on a branch of the user's before it
/// was checked, and a reboot after it, still leave the next run refused.
#[test]
fn the_task_record_survives_a_reboot() {
    let f = Fixture::new();
    if let Some(why) = quarantine_unavailable(&f) {
        common::skip("quarantine-unavailable", why);
        return;
    }
    run_ok(&f, "git commit -q --allow-empty -m one");
    let runtime = f.env.path().join("run");
    assert!(
        runtime.is_dir(),
        "the runtime dir is where the tests put it"
    );
    // The reboot, and what the killed run left: HEAD on a branch of the user's.
    std::fs::remove_dir_all(&runtime).unwrap();
    common::escape::git(&f.main, &["branch", "users"]);
    let users = escape::rev_parse(&f, "users");
    common::escape::git(&f.task, &["symbolic-ref", "HEAD", "refs/heads/users"]);
    let out = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args(["run", "--backend", "native", "--", "sh", "-c"])
        .arg("git commit -q --allow-empty -m moved")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", common::text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("this worktree's sandboxed runs own refs/heads/feature"),
        "{stderr}"
    );
    assert_eq!(escape::rev_parse(&f, "users"), users);
}

/// A main worktree's per-worktree files in `.git` get the same check after a run as a linked
/// worktree's git dir: a link planted at `COMMIT_EDITMSG` would make the user's next commit
/// write its message through it (here into a file outside), and a stopped rebase with an
/// `exec` line would run it on the user's `git rebase --continue`.
#[test]
fn a_main_worktrees_git_dir_is_checked_after_the_run() {
    let f = Fixture::new();
    if let Some(why) = quarantine_unavailable(&f) {
        common::skip("quarantine-unavailable", why);
        return;
    }
    let victim = f.outside.join("main-victim");
    let mark = f.outside.join("main-exec-ran");
    let plant = format!(
        "ln -sf {v} .git/COMMIT_EDITMSG && mkdir -p .git/rebase-merge && \
         printf 'exec touch {m}\\n' > .git/rebase-merge/git-rebase-todo && \
         echo refs/heads/trunk > .git/rebase-merge/head-name",
        v = victim.display(),
        m = mark.display()
    );
    for backend in ["host", "native"] {
        std::fs::write(&victim, "# mine\n").unwrap();
        let out = f
            .env
            .cmd()
            .current_dir(&f.main)
            .args(["run", "--backend", backend, "--", "sh", "-c", &plant])
            .output()
            .unwrap();
        assert!(out.status.success(), "{backend}: {}", common::text(&out));
        // The user's next commit writes its message to COMMIT_EDITMSG.
        let commit = escape::host_git(&f.main, &["commit", "-q", "--allow-empty", "-m", "users"]);
        assert!(commit.status.success(), "{}", common::text(&commit));
        let written = std::fs::read_to_string(&victim).unwrap() != "# mine\n";
        let rebase = f.main.join(".git/rebase-merge");
        let stopped = rebase.join("git-rebase-todo").exists();
        if backend == "host" {
            assert!(written && stopped, "host: the attack is broken");
            std::fs::remove_dir_all(&rebase).unwrap();
            std::fs::remove_file(f.main.join(".git/COMMIT_EDITMSG")).unwrap();
        } else {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !written,
                "native: the commit wrote through the planted link: {stderr}"
            );
            assert!(!stopped, "native: the rebase with exec stayed: {stderr}");
            assert!(stderr.contains("set aside"), "{stderr}");
        }
    }
    assert!(!mark.exists());
}

/// The race of the test above made certain: the host takes the run's stash push in while
/// the command runs, and only then does the command drop the user's entry. The drop leaves
/// the top of the stash as the host has it, and is still refused and said.
#[test]
fn a_stash_drop_after_the_live_sync_took_the_push_is_refused_too() {
    let f = Fixture::new();
    if let Some(why) = quarantine_unavailable(&f) {
        common::skip("quarantine-unavailable", why);
        return;
    }
    std::fs::write(f.task.join("README"), "user's wip\n").unwrap();
    common::escape::git(&f.task, &["stash", "-q", "-m", "users"]);
    let users = escape::rev_parse(&f, "refs/stash");
    let (tx, changed) = mpsc::channel();
    let mut watcher = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
        if e.is_ok_and(|e| !e.kind.is_access()) {
            let _ = tx.send(());
        }
    })
    .unwrap();
    // refs/stash lies in refs/ itself.
    notify::Watcher::watch(
        &mut watcher,
        &f.common.join("refs"),
        notify::RecursiveMode::NonRecursive,
    )
    .unwrap();
    let go = f.task.join("go");
    let mut child = KillOnDrop(
        f.env
            .cmd()
            .current_dir(&f.task)
            .args(["run", "--backend", "native", "--", "sh", "-c"])
            .arg(
                "echo agent > README && git stash -q && git rev-parse stash@{0} && \
                 until [ -e go ]; do :; done; git stash drop -q stash@{1}",
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stdout = BufReader::new(child.0.stdout.take().unwrap());
    let mut runs = String::new();
    stdout.read_line(&mut runs).unwrap();
    let runs = runs.trim().to_string();
    while escape::rev_parse(&f, "refs/stash") != runs {
        changed
            .recv_timeout(Duration::from_secs(60))
            .expect("the run's stash never reached the repository while it ran");
    }
    std::fs::write(&go, "").unwrap();
    let out = child.wait();
    assert!(out.status.success(), "{}", common::text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("does not keep every entry the repository had"),
        "{stderr}"
    );
    let list = escape::host_git(&f.task, &["stash", "list", "--format=%H"]);
    let list = String::from_utf8_lossy(&list.stdout).into_owned();
    assert_eq!(
        list.lines().collect::<Vec<_>>(),
        [runs.as_str(), users.as_str()]
    );
}

/// A branch the run creates, which the host takes in while the command runs, and which the
/// command deletes afterwards: gone from the layer without a trace (nothing lay below it),
/// it must be gone from the repository too — `git stash` then `git stash pop` is the
/// everyday case.
#[test]
fn a_ref_created_and_deleted_again_after_the_live_sync_took_it_is_deleted() {
    let f = Fixture::new();
    if let Some(why) = quarantine_unavailable(&f) {
        common::skip("quarantine-unavailable", why);
        return;
    }
    let (tx, changed) = mpsc::channel();
    let mut watcher = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
        if e.is_ok_and(|e| !e.kind.is_access()) {
            let _ = tx.send(());
        }
    })
    .unwrap();
    notify::Watcher::watch(
        &mut watcher,
        &f.common.join("refs"),
        notify::RecursiveMode::Recursive,
    )
    .unwrap();
    let mut child = KillOnDrop(
        f.env
            .cmd()
            .current_dir(&f.task)
            .args(["run", "--backend", "native", "--", "sh", "-c"])
            .arg(
                "echo wip > README && git stash -q && git branch scratch && \
                 git rev-parse stash@{0} && until [ -e go ]; do :; done; \
                 git stash pop -q && git branch -q -D scratch",
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stdout = BufReader::new(child.0.stdout.take().unwrap());
    let mut stash = String::new();
    stdout.read_line(&mut stash).unwrap();
    let stash = stash.trim().to_string();
    while escape::rev_parse(&f, "refs/stash") != stash
        || escape::rev_parse(&f, "refs/heads/scratch").is_empty()
    {
        changed
            .recv_timeout(Duration::from_secs(60))
            .expect("the run's refs never reached the repository while it ran");
    }
    std::fs::write(f.task.join("go"), "").unwrap();
    let out = child.wait();
    assert!(out.status.success(), "{}", common::text(&out));
    assert_eq!(
        escape::rev_parse(&f, "refs/stash"),
        "",
        "{}",
        common::text(&out)
    );
    assert_eq!(escape::rev_parse(&f, "refs/heads/scratch"), "");
}

/// Beside a linked worktree, the main checkout is in the view only as its `.git`: the folders
/// the view makes to hold those mounts are sealed read-only, so a write there fails at once
/// (the tool says so) instead of landing in the private `/tmp` and vanishing. The worktree
/// stays writable and commits still land. Control: `--backend host` writes the user's file.
#[test]
fn a_write_beside_the_worktree_where_the_view_holds_only_mounts_fails_at_once() {
    let f = Fixture::new();
    if let Some(why) = quarantine_unavailable(&f) {
        common::skip("private-view", why);
        return;
    }
    let note = f.main.join("notes.txt");
    let beside = f.task.parent().unwrap().join("beside.txt");
    let script = format!(
        "echo x > '{}' || echo refused-note; echo y > '{}' || echo refused-beside; \
         echo w > inside.txt && git add inside.txt && git commit -qm inside && echo committed",
        note.display(),
        beside.display()
    );
    let run = |backend: &str| {
        f.env
            .cmd()
            .current_dir(&f.task)
            .args(["run", "--backend", backend, "--", "sh", "-c", &script])
            .output()
            .unwrap()
    };
    let out = run("native");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("refused-note")
            && stdout.contains("refused-beside")
            && stdout.contains("committed"),
        "{}",
        common::text(&out)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr)
            .matches("Read-only file system")
            .count(),
        2,
        "{}",
        common::text(&out)
    );
    assert!(!note.exists() && !beside.exists());
    assert_eq!(
        sandbox_testkit::git(&f.main, &["log", "-1", "--format=%s", "feature"]),
        "inside"
    );
    // `why` names the seal for the user's file there.
    let why = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args(["why", "--backend", "native"])
        .arg(&note)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&why.stdout).contains("sealed read-only"),
        "{}",
        common::text(&why)
    );
    // The control: without the sandbox the same script writes the user's files.
    let host = run("host");
    assert!(note.exists() && beside.exists(), "{}", common::text(&host));
}
