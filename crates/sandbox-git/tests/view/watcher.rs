//! The fast-forward watcher, with real git commits and real inotify events.

use std::time::Duration;

use crate::common::*;
use sandbox_git::{BlockReason, SyncState, ViewError, WatchEvent, WatchOptions, Watcher};

fn is_ff(task: &str, to: &str) -> impl Fn(&WatchEvent) -> bool {
    let (task, to) = (task.to_string(), to.to_string());
    move |e| matches!(e, WatchEvent::FastForwarded { task: t, to: x, .. } if *t == task && *x == to)
}

#[test]
fn a_commit_in_the_view_moves_the_branch_and_the_task_worktree() {
    let f = Fixture::new();
    let task = f.task("task1");
    let v = f.manager().create_or_reuse(&task, None).unwrap().view;
    // An unrelated local edit in the task worktree must survive, as with git merge --ff-only.
    write(&task, "other.txt", "local edit\n");
    let (_w, events) = f.watch(vec![v.clone()]);
    events.wait("watching", |e| matches!(e, WatchEvent::Watching { .. }));

    let agent = f.commit(
        &v.view_path,
        &[
            ("README.md", "changed by agent\n"),
            ("src/new/mod.rs", "// new\n"),
        ],
        "agent work",
    );
    let ev = events.wait("the fast-forward", is_ff("task1", &agent));
    let WatchEvent::FastForwarded {
        from,
        commits,
        worktree,
        ..
    } = ev
    else {
        unreachable!()
    };
    assert_eq!(commits, 1);
    assert_eq!(worktree.as_deref(), Some(task.as_path()));
    assert_eq!(from, f.rev("main"));
    assert_eq!(f.rev("task1"), agent);
    // Files and index follow; the local edit and ignored files stay.
    assert_eq!(read(&task, "README.md"), "changed by agent\n");
    assert_eq!(read(&task, "src/new/mod.rs"), "// new\n");
    assert_eq!(read(&task, "other.txt"), "local edit\n");
    assert_eq!(read(&task, ".env"), "SECRET=1\n");
    assert_eq!(
        f.git(&task, &["status", "--porcelain", "--untracked-files=no"]),
        "M other.txt"
    );
    assert!(!task.join(".git").is_dir());
    assert!(!v.common_dir.join("worktrees/task1/index.lock").exists());
    // The reflog says who moved it.
    let log = f.git(&task, &["reflog", "-1", "--format=%gs", "task1"]);
    assert!(log.contains("sandbox: fast-forward to s/task1"), "{log}");

    // A removal in the next commit is applied too.
    f.git(&v.view_path, &["rm", "-q", "src/lib.rs"]);
    f.git(&v.view_path, &["commit", "-qm", "remove lib"]);
    let second = f.git(&v.view_path, &["rev-parse", "HEAD"]);
    events.wait("the second fast-forward", is_ff("task1", &second));
    assert!(!task.join("src/lib.rs").exists());
    assert_eq!(
        f.git(&task, &["status", "--porcelain", "--untracked-files=no"]),
        "M other.txt"
    );
}

#[test]
fn a_parallel_host_commit_is_reported_as_divergence_and_nothing_is_lost() {
    let f = Fixture::new();
    let task = f.task("task1");
    let m = f.manager();
    let v = m.create_or_reuse(&task, None).unwrap().view;
    let (_w, events) = f.watch(vec![v.clone()]);
    events.wait("watching", |e| matches!(e, WatchEvent::Watching { .. }));

    let host = f.commit(&task, &[("host.txt", "host\n")], "host work");
    let agent = f.commit(&v.view_path, &[("agent.txt", "agent\n")], "agent work");
    let ev = events.wait("divergence", |e| matches!(e, WatchEvent::Diverged { .. }));
    let WatchEvent::Diverged {
        branch_commit,
        child_commit,
        resolve,
        child_ahead,
        branch_ahead,
        ..
    } = ev
    else {
        unreachable!()
    };
    assert_eq!(
        (branch_commit.as_str(), child_commit.as_str()),
        (host.as_str(), agent.as_str())
    );
    assert_eq!((child_ahead, branch_ahead), (1, 1));
    assert!(
        resolve.iter().any(|c| c.ends_with("merge s/task1")),
        "{resolve:?}"
    );
    // Nothing moved, both commits intact, the host worktree untouched.
    assert_eq!(f.rev("task1"), host);
    assert_eq!(f.rev("s/task1"), agent);
    assert!(!task.join("agent.txt").exists());
    let st = m.status(&v).unwrap();
    assert_eq!(st.sync.label(), "diverged");
    assert!(st.watcher.running);
    assert!(
        matches!(st.watcher.last_report, Some(WatchEvent::Diverged { .. })),
        "{:?}",
        st.watcher.last_report
    );

    // Following the suggested resolution clears it: the task branch now contains the view's.
    f.git(&task, &["merge", "-q", "--no-edit", "s/task1"]);
    let merged = f.rev("task1");
    events.wait(
        "resolution",
        |e| matches!(e, WatchEvent::Resolved { commit, .. } if *commit == merged),
    );
    assert_eq!(m.status(&v).unwrap().sync, SyncState::Behind { behind: 2 });
}

#[test]
fn a_dirty_task_worktree_blocks_the_move_until_it_is_clean() {
    let f = Fixture::new();
    let task = f.task("task1");
    let v = f.manager().create_or_reuse(&task, None).unwrap().view;
    let (_w, events) = f.watch(vec![v.clone()]);
    events.wait("watching", |e| matches!(e, WatchEvent::Watching { .. }));

    write(&task, "README.md", "my unsaved work\n");
    let before = f.rev("task1");
    let agent = f.commit(&v.view_path, &[("README.md", "agent\n")], "agent");
    let ev = events.wait("blocked", |e| matches!(e, WatchEvent::Blocked { .. }));
    let WatchEvent::Blocked {
        reason,
        paths,
        resolve,
        message,
        ..
    } = ev
    else {
        unreachable!()
    };
    assert_eq!(reason, BlockReason::Dirty);
    assert_eq!(paths, vec!["README.md".to_string()]);
    assert!(message.contains("README.md"), "{message}");
    assert!(resolve.iter().any(|r| r.ends_with("stash")), "{resolve:?}");
    assert_eq!(
        f.rev("task1"),
        before,
        "the branch moved under a dirty worktree"
    );
    assert_eq!(read(&task, "README.md"), "my unsaved work\n");
    assert!(!v.common_dir.join("worktrees/task1/index.lock").exists());

    // Stashing makes it clean: the watcher notices (index event) and finishes the job.
    f.git(&task, &["stash", "-q"]);
    events.wait("the fast-forward after stash", is_ff("task1", &agent));
    assert_eq!(read(&task, "README.md"), "agent\n");
    assert_eq!(
        f.git(&task, &["status", "--porcelain", "--untracked-files=no"]),
        ""
    );
}

#[test]
fn an_untracked_file_in_the_way_blocks_and_is_kept() {
    let f = Fixture::new();
    let task = f.task("task1");
    let v = f.manager().create_or_reuse(&task, None).unwrap().view;
    let (_w, events) = f.watch(vec![v.clone()]);
    events.wait("watching", |e| matches!(e, WatchEvent::Watching { .. }));
    // The agent commits notes.txt, which exists untracked in the task worktree.
    let before = f.rev("task1");
    f.commit(&v.view_path, &[("notes.txt", "agent notes\n")], "agent");
    let ev = events.wait("blocked", |e| matches!(e, WatchEvent::Blocked { .. }));
    assert!(
        matches!(ev, WatchEvent::Blocked { reason: BlockReason::Dirty, ref paths, .. } if paths == &["notes.txt"])
    );
    assert_eq!(f.rev("task1"), before);
    assert_eq!(read(&task, "notes.txt"), "untracked\n");
}

#[test]
fn packed_refs_and_gc_do_not_lose_the_trail() {
    let f = Fixture::new();
    let task = f.task("task1");
    let v = f.manager().create_or_reuse(&task, None).unwrap().view;
    let (_w, events) = f.watch(vec![v.clone()]);
    events.wait("watching", |e| matches!(e, WatchEvent::Watching { .. }));

    let first = f.commit(&v.view_path, &[("one.txt", "1\n")], "one");
    events.wait("first", is_ff("task1", &first));
    // Pack every ref (the loose files and their now-empty directories go away).
    f.git(&f.main, &["pack-refs", "--all", "--prune"]);
    assert!(!v.common_dir.join("refs/heads/s/task1").exists());
    assert!(!v.common_dir.join("refs/heads/s").exists());
    let second = f.commit(&v.view_path, &[("two.txt", "2\n")], "two");
    events.wait("after pack-refs", is_ff("task1", &second));

    // A full gc (packs objects and refs) on the host while the watcher runs.
    f.git(&f.main, &["gc", "-q", "--prune=now"]);
    let third = f.commit(&v.view_path, &[("three.txt", "3\n")], "three");
    events.wait("after gc", is_ff("task1", &third));
    assert_eq!(read(&task, "three.txt"), "3\n");
}

#[test]
fn a_commit_made_before_the_watcher_starts_is_picked_up() {
    let f = Fixture::new();
    let task = f.task("task1");
    let v = f.manager().create_or_reuse(&task, None).unwrap().view;
    let early = f.commit(&v.view_path, &[("early.txt", "e\n")], "early");
    let (_w, events) = f.watch(vec![v.clone()]);
    events.wait("the early commit", is_ff("task1", &early));
    assert_eq!(read(&task, "early.txt"), "e\n");
}

#[test]
fn many_views_at_once_and_one_removed_under_the_watcher() {
    let f = Fixture::new();
    let m = f.manager();
    let names = ["t1", "t2", "t3", "t4", "t5"];
    let views: Vec<_> = names
        .iter()
        .map(|n| m.create_or_reuse(&f.task(n), None).unwrap().view)
        .collect();
    let (_w, events) = f.watch(views.clone());
    for _ in &names {
        events.wait("watching", |e| matches!(e, WatchEvent::Watching { .. }));
    }
    // Commit in all five views at the same time.
    let commits: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = views
            .iter()
            .map(|v| {
                s.spawn(|| f.commit(&v.view_path, &[(&format!("{}.txt", v.task), "x\n")], "work"))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut pending: Vec<(String, String)> = names
        .iter()
        .map(|n| n.to_string())
        .zip(commits.iter().cloned())
        .collect();
    while !pending.is_empty() {
        let ev = events.wait("fast-forwards of all views", |e| {
            matches!(e, WatchEvent::FastForwarded { .. })
        });
        if let WatchEvent::FastForwarded { task, to, .. } = ev {
            pending.retain(|(t, c)| !(t == &task && c == &to));
        }
    }
    for (n, c) in names.iter().zip(&commits) {
        assert_eq!(&f.rev(n), c);
    }

    // Remove t2 while the watcher runs: it is dropped, the others keep working.
    m.remove(&views[1], false).unwrap();
    let ev = events.wait("t2 gone", |e| matches!(e, WatchEvent::ViewGone { .. }));
    assert_eq!(ev.task(), Some("t2"));
    assert!(
        !m.watcher_state(&views[1]).running,
        "t2's lock is still held"
    );
    let later = f.commit(&views[2].view_path, &[("later.txt", "l\n")], "later");
    events.wait("t3 after t2's removal", is_ff("t3", &later));
}

#[test]
fn the_branch_moves_alone_when_no_worktree_has_it_checked_out() {
    let f = Fixture::new();
    let task = f.task("task1");
    let v = f.manager().create_or_reuse(&task, None).unwrap().view;
    f.git(&task, &["switch", "-q", "-c", "elsewhere"]);
    let (_w, events) = f.watch(vec![v.clone()]);
    let agent = f.commit(&v.view_path, &[("agent.txt", "a\n")], "agent");
    let ev = events.wait("ff", is_ff("task1", &agent));
    assert!(matches!(
        ev,
        WatchEvent::FastForwarded { worktree: None, .. }
    ));
    assert!(!task.join("agent.txt").exists());
}

#[test]
fn a_held_index_lock_delays_the_move_and_is_reported_when_it_lingers() {
    let f = Fixture::new();
    let task = f.task("task1");
    let m = f.manager();
    let v = m.create_or_reuse(&task, None).unwrap().view;
    let lock = v.common_dir.join("worktrees/task1/index.lock");
    std::fs::write(&lock, "").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let opts = WatchOptions {
        lock_dir: f.runtime.join("views"),
        busy_grace: Duration::from_millis(300),
        ..WatchOptions::default()
    };
    let _w = Watcher::start_with(vec![v.clone()], opts, sink(tx)).unwrap();
    let events = Events { rx };
    let before = f.rev("task1");
    let agent = f.commit(&v.view_path, &[("agent.txt", "a\n")], "agent");
    let ev = events.wait("busy", |e| matches!(e, WatchEvent::Blocked { .. }));
    assert!(
        matches!(
            ev,
            WatchEvent::Blocked {
                reason: BlockReason::Busy,
                ..
            }
        ),
        "{ev:?}"
    );
    assert_eq!(f.rev("task1"), before);
    assert!(lock.exists(), "someone else's lock was removed");
    std::fs::remove_file(&lock).unwrap();
    events.wait("ff once the lock is gone", is_ff("task1", &agent));
    assert_eq!(read(&task, "agent.txt"), "a\n");
}

#[test]
fn one_watcher_per_view_and_status_sees_it() {
    let f = Fixture::new();
    let task = f.task("task1");
    let m = f.manager();
    let v = m.create_or_reuse(&task, None).unwrap().view;
    assert!(!m.watcher_state(&v).running);
    let (w, _events) = f.watch(vec![v.clone()]);
    let st = m.watcher_state(&v);
    assert!(st.running);
    assert_eq!(st.pid, Some(std::process::id()));
    // A second watcher (another process would get the same answer) is refused.
    let (tx, _rx) = std::sync::mpsc::channel();
    match m.watch(vec![v.clone()], sink(tx)) {
        Err(ViewError::AlreadyWatched { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a second watcher was allowed"),
    }
    drop(w);
    assert!(!m.watcher_state(&v).running);
}

#[test]
fn a_task_worktree_mid_merge_is_left_alone() {
    let f = Fixture::new();
    let task = f.task("task1");
    let v = f.manager().create_or_reuse(&task, None).unwrap().view;
    // A conflicting merge in progress in the task worktree.
    f.git(&f.main, &["switch", "-q", "-c", "side"]);
    f.commit(&f.main, &[("README.md", "side\n")], "side");
    f.git(&f.main, &["switch", "-q", "main"]);
    f.commit(&task, &[("README.md", "task\n")], "task");
    assert!(!f.git_ok(&task, &["merge", "-q", "side"]));
    // Bring s/task1 up to the task branch so the agent's commit is a clean fast-forward.
    f.git(&v.view_path, &["merge", "-q", "--ff-only", "task1"]);
    let (_w, events) = f.watch(vec![v.clone()]);
    let before = f.rev("task1");
    f.commit(&v.view_path, &[("agent.txt", "a\n")], "agent");
    let ev = events.wait("blocked", |e| matches!(e, WatchEvent::Blocked { .. }));
    assert!(
        matches!(
            ev,
            WatchEvent::Blocked {
                reason: BlockReason::OperationInProgress,
                ..
            }
        ),
        "{ev:?}"
    );
    assert_eq!(f.rev("task1"), before);
}

#[test]
fn the_main_worktree_can_be_the_task_worktree() {
    let f = Fixture::new();
    let v = f.manager().create_or_reuse(&f.main, None).unwrap().view;
    assert_eq!(v.task, "app");
    assert_eq!(v.branch, "main");
    let (_w, events) = f.watch(vec![v.clone()]);
    let agent = f.commit(&v.view_path, &[("agent.txt", "a\n")], "agent");
    let ev = events.wait("ff", is_ff("app", &agent));
    assert!(matches!(ev, WatchEvent::FastForwarded { worktree: Some(ref w), .. } if *w == f.main));
    assert_eq!(read(&f.main, "agent.txt"), "a\n");
    assert_eq!(
        f.git(&f.main, &["status", "--porcelain", "--untracked-files=no"]),
        ""
    );
    assert!(!f.main.join(".git/index.lock").exists());
    assert!(!f.main.join(".git/sandbox-ff.index").exists());
}

/// Everything under `worktrees/<view>` is writable from inside a VM. An agent that rewrites
/// its view's HEAD to claim `<b>` and its `gitdir` to point at some host directory must not
/// make the host write files there.
#[test]
fn a_view_claiming_the_branch_cannot_steer_host_writes() {
    let f = Fixture::new();
    let task = f.task("task1");
    let v = f.manager().create_or_reuse(&task, None).unwrap().view;
    // The task worktree leaves task1, so the forged entry would be the only candidate.
    f.git(&task, &["switch", "-q", "-c", "other"]);
    let victim = f.main.parent().unwrap().join("victim");
    std::fs::create_dir(&victim).unwrap();
    let admin = v.admin_dir();
    std::fs::write(
        victim.join(".git"),
        format!("gitdir: {}\n", admin.display()),
    )
    .unwrap();
    // The agent's commit, made while the view was still on s/task1.
    let agent = f.commit(&v.view_path, &[("payload.txt", "pwned\n")], "agent");
    f.git(&v.view_path, &["update-ref", "refs/heads/s/task1", &agent]);
    std::fs::write(admin.join("HEAD"), "ref: refs/heads/task1\n").unwrap();
    std::fs::write(admin.join("gitdir"), format!("{}/.git\n", victim.display())).unwrap();

    let (_w, events) = f.watch(vec![v.clone()]);
    let ev = events.wait("ff", is_ff("task1", &agent));
    assert!(
        matches!(ev, WatchEvent::FastForwarded { worktree: None, .. }),
        "{ev:?}"
    );
    assert_eq!(
        files_in(&victim),
        Vec::<String>::new(),
        "the host wrote into the forged path"
    );
}

#[test]
fn a_branch_with_slashes_is_followed_through_nested_ref_directories() {
    let f = Fixture::new();
    let path = f.main.parent().unwrap().join("topic");
    sandbox_testkit::add_worktree(&f.main, &path, "user/deep/topic");
    let v = f.manager().create_or_reuse(&path, None).unwrap().view;
    assert_eq!(v.child_branch, "s/user/deep/topic");
    let (_w, events) = f.watch(vec![v.clone()]);
    let agent = f.commit(&v.view_path, &[("agent.txt", "a\n")], "agent");
    events.wait("ff", is_ff("topic", &agent));
    assert_eq!(f.rev("user/deep/topic"), agent);
    assert_eq!(read(&path, "agent.txt"), "a\n");
}
