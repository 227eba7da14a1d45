//! Creating, reusing, checking and removing views, against real repositories.

use crate::common::*;
use sandbox_git::{CreateOutcome, MountPurpose, SyncState, ViewError};

#[test]
fn a_view_holds_only_tracked_files_on_the_child_branch() {
    let f = Fixture::new();
    let task = f.task("task1");
    let created = f.manager().create_or_reuse(&task, None).unwrap();
    let v = &created.view;
    assert_eq!(created.outcome, CreateOutcome::Created);
    assert_eq!(created.sync, SyncState::InSync);
    assert_eq!(v.task, "task1");
    assert_eq!(v.project, "app");
    assert_eq!(v.branch, "task1");
    assert_eq!(v.child_branch, "s/task1");
    assert_eq!(v.view_path, f.views_root.join("app/task1-sandbox"));
    assert_eq!(v.task_worktree, task);
    assert_eq!(v.common_dir, f.main.join(".git"));

    // Exactly the tracked files: no .env, node_modules, target, untracked notes.
    let tracked: Vec<String> = {
        let mut t: Vec<String> = f
            .git(&task, &["ls-files"])
            .lines()
            .map(str::to_string)
            .collect();
        t.sort();
        t
    };
    assert_eq!(files_in(&v.view_path), tracked);
    for absent in [".env", "node_modules", "target", "notes.txt"] {
        assert!(
            !v.view_path.join(absent).exists(),
            "{absent} leaked into the view"
        );
    }
    // A git worktree on s/task1 at task1's commit, clean.
    assert_eq!(
        f.git(&v.view_path, &["rev-parse", "--abbrev-ref", "HEAD"]),
        "s/task1"
    );
    assert_eq!(f.rev("s/task1"), f.rev("task1"));
    assert_eq!(f.git(&v.view_path, &["status", "--porcelain"]), "");
    assert!(v.problems().is_empty(), "{:?}", v.problems());
    // Found again from anywhere in the project.
    let m = f.manager();
    let project = m.project_of(&f.main.join("src")).unwrap();
    assert_eq!(m.list(Some(&project)).unwrap(), vec![v.clone()]);
    assert_eq!(m.find(&project, "task1").unwrap(), *v);
    let from_view = m.project_of(&v.view_path).unwrap();
    assert_eq!(from_view, project);
}

#[test]
fn creating_again_reuses_a_healthy_view_and_recreates_a_deleted_one() {
    let f = Fixture::new();
    let task = f.task("task1");
    let m = f.manager();
    let first = m.create_or_reuse(&task, None).unwrap();
    let again = m.create_or_reuse(&task.join("src"), None).unwrap();
    assert_eq!(again.outcome, CreateOutcome::Reused);
    assert_eq!(again.view, first.view);

    // The agent's commit survives the view directory being deleted by hand.
    let agent = f.commit(&first.view.view_path, &[("agent.txt", "a\n")], "agent");
    std::fs::remove_dir_all(&first.view.view_path).unwrap();
    let back = m.create_or_reuse(&task, None).unwrap();
    assert_eq!(back.outcome, CreateOutcome::Recreated);
    assert_eq!(back.sync, SyncState::Ahead { ahead: 1 });
    assert_eq!(f.git(&back.view.view_path, &["rev-parse", "HEAD"]), agent);
    assert_eq!(read(&back.view.view_path, "agent.txt"), "a\n");
}

#[test]
fn task_name_can_be_given_and_names_are_validated() {
    let f = Fixture::new();
    let task = f.task("task1");
    let m = f.manager();
    let v = m.create_or_reuse(&task, Some("T-42")).unwrap().view;
    assert_eq!(v.view_path, f.views_root.join("app/T-42-sandbox"));
    for bad in [
        "../escape",
        "a/b",
        "a b",
        "x.lock",
        "-rf",
        "..",
        ".hidden",
        "a~1",
    ] {
        let err = m.create_or_reuse(&task, Some(bad)).unwrap_err();
        assert!(matches!(err, ViewError::InvalidName { .. }), "{bad}: {err}");
        let msg = err.to_string();
        assert!(
            msg.contains("invalid task name") && msg.contains("--task"),
            "{msg}"
        );
    }
    // Nothing was created for the refused names.
    let mut entries: Vec<String> = std::fs::read_dir(f.views_root.join("app"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    assert_eq!(
        entries,
        vec![
            ".lock",
            "T-42-sandbox",
            "T-42-sandbox.git-layer",
            "T-42-sandbox.json"
        ]
    );
    assert!(!f
        .views_root
        .parent()
        .unwrap()
        .join("escape-sandbox")
        .exists());
}

#[test]
fn a_worktree_basename_that_is_no_valid_name_asks_for_task() {
    let f = Fixture::new();
    let path = f.main.parent().unwrap().join("my task");
    sandbox_testkit::add_worktree(&f.main, &path, "t2");
    let err = f
        .manager()
        .create_or_reuse(&path, None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"my task\"") && err.contains("--task"),
        "{err}"
    );
}

#[test]
fn detached_head_and_views_of_views_are_refused() {
    let f = Fixture::new();
    let task = f.task("task1");
    f.git(&task, &["switch", "-q", "--detach"]);
    let err = f.manager().create_or_reuse(&task, None).unwrap_err();
    assert!(matches!(err, ViewError::DetachedHead { .. }), "{err}");
    f.git(&task, &["switch", "-q", "task1"]);
    let v = f.manager().create_or_reuse(&task, None).unwrap().view;
    let err = f.manager().create_or_reuse(&v.view_path, None).unwrap_err();
    assert!(matches!(err, ViewError::IsAView { .. }), "{err}");
}

#[test]
fn an_unrelated_child_branch_stops_creation() {
    let f = Fixture::new();
    let task = f.task("task1");
    // s/task1 with a history of its own.
    f.git(&f.main, &["switch", "-q", "--orphan", "s/task1"]);
    f.commit(&f.main, &[("orphan.txt", "o\n")], "unrelated");
    f.git(&f.main, &["switch", "-q", "-f", "main"]);
    let before = f.rev("s/task1");
    let err = f.manager().create_or_reuse(&task, None).unwrap_err();
    assert!(
        matches!(err, ViewError::ChildBranchUnrelated { .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("neither an ancestor nor a descendant"),
        "{msg}"
    );
    assert!(msg.contains("git branch -m s/task1"), "{msg}");
    assert_eq!(f.rev("s/task1"), before, "the existing branch was touched");
    assert!(!f.views_root.join("app/task1-sandbox").exists());

    // A child branch that diverged (shares history but both moved) stops it too.
    f.git(&f.main, &["branch", "-f", "s/task1", "task1"]);
    let ahead = {
        f.git(&f.main, &["switch", "-q", "s/task1"]);
        let c = f.commit(&f.main, &[("a.txt", "a\n")], "on child");
        f.git(&f.main, &["switch", "-q", "main"]);
        c
    };
    f.commit(&task, &[("b.txt", "b\n")], "on task");
    let err = f.manager().create_or_reuse(&task, None).unwrap_err();
    assert!(
        matches!(err, ViewError::ChildBranchUnrelated { .. }),
        "{err}"
    );
    assert_eq!(f.rev("s/task1"), ahead);
}

#[test]
fn an_existing_child_branch_behind_is_moved_up_and_one_ahead_is_kept() {
    let f = Fixture::new();
    let task = f.task("task1");
    f.git(&f.main, &["branch", "s/task1", "task1"]);
    let host = f.commit(&task, &[("host.txt", "h\n")], "host");
    let c = f.manager().create_or_reuse(&task, None).unwrap();
    assert_eq!(c.sync, SyncState::InSync);
    assert_eq!(f.rev("s/task1"), host);

    let f = Fixture::new();
    let task = f.task("task1");
    f.git(&f.main, &["switch", "-q", "-c", "s/task1", "task1"]);
    let agent = f.commit(&f.main, &[("agent.txt", "a\n")], "agent");
    f.git(&f.main, &["switch", "-q", "main"]);
    let c = f.manager().create_or_reuse(&task, None).unwrap();
    assert_eq!(c.sync, SyncState::Ahead { ahead: 1 });
    assert_eq!(f.git(&c.view.view_path, &["rev-parse", "HEAD"]), agent);
}

#[test]
fn remove_refuses_unmerged_commits_unless_forced() {
    let f = Fixture::new();
    let task = f.task("task1");
    let m = f.manager();
    let v = m.create_or_reuse(&task, None).unwrap().view;
    let agent = f.commit(&v.view_path, &[("agent.txt", "a\n")], "agent");

    let err = m.remove(&v, false).unwrap_err();
    assert!(matches!(err, ViewError::Unmerged { count: 1, .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("--force") && msg.contains("merge s/task1"),
        "{msg}"
    );
    assert!(v.view_path.is_dir());
    assert_eq!(f.rev("s/task1"), agent);

    let removed = m.remove(&v, true).unwrap();
    assert_eq!(removed.dropped_commits, 1);
    assert_eq!(removed.child_tip.as_deref(), Some(agent.as_str()));
    assert!(!v.view_path.exists());
    assert!(!v.admin_dir().exists());
    assert!(!f.git_ok(&f.main, &["rev-parse", "--verify", "-q", "s/task1"]));
    assert!(m.list(None).unwrap().is_empty());
    // The task branch is untouched, and git agrees the worktree is gone.
    assert_eq!(f.rev("task1"), f.rev("main"));
    assert!(!f
        .git(&f.main, &["worktree", "list"])
        .contains("task1-sandbox"));
}

#[test]
fn remove_without_unmerged_commits_just_removes() {
    let f = Fixture::new();
    let task = f.task("task1");
    let m = f.manager();
    let v = m.create_or_reuse(&task, None).unwrap().view;
    // Merged work is not "unmerged".
    f.commit(&v.view_path, &[("agent.txt", "a\n")], "agent");
    f.git(&task, &["merge", "-q", "--ff-only", "s/task1"]);
    let removed = m.remove(&v, false).unwrap();
    assert_eq!(removed.dropped_commits, 0);
    assert!(!v.view_path.exists());
    assert!(!v.store_layer_dir().exists());
    assert!(!f.git_ok(&f.main, &["rev-parse", "--verify", "-q", "s/task1"]));
    assert!(task.join("agent.txt").exists());
    // And the view can be made again afterwards.
    let again = m.create_or_reuse(&task, None).unwrap();
    assert_eq!(again.outcome, CreateOutcome::Created);
}

#[test]
fn vm_mounts_keep_hooks_and_config_read_only() {
    let f = Fixture::new();
    let task = f.task("task1");
    let v = f.manager().create_or_reuse(&task, None).unwrap().view;
    let c = &v.common_dir;
    let got: Vec<(std::path::PathBuf, bool, MountPurpose)> = v
        .vm_mounts()
        .into_iter()
        .map(|m| {
            assert_eq!(m.guest_path, m.host_path);
            if m.is_dir {
                assert!(m.host_path.is_dir(), "{} missing", m.host_path.display());
            }
            (m.host_path, m.writable, m.purpose)
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (v.view_path.clone(), true, MountPurpose::Worktree),
            (c.clone(), false, MountPurpose::GitCommonDir),
            (c.join("hooks"), false, MountPurpose::GitHooks),
            (c.join("config"), false, MountPurpose::GitConfig),
            (v.store_layer_dir(), true, MountPurpose::GitStoreLayer),
            (
                c.join("worktrees/task1-sandbox"),
                true,
                MountPurpose::GitWorktreeAdmin
            ),
        ]
    );
    // The VM writes no ref and no object of the repository: of the common dir only the
    // view's own admin dir is writable; the rest goes to the private store layer.
    for m in v.vm_mounts().iter().filter(|m| m.writable) {
        assert!(
            !m.host_path.starts_with(c) || m.host_path == v.admin_dir(),
            "{} is writable",
            m.host_path.display()
        );
    }
    let layer = std::fs::metadata(v.store_layer_dir()).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&layer.permissions()) & 0o077,
        0
    );
    // Nothing of the task worktree is mounted.
    assert!(v
        .vm_mounts()
        .iter()
        .all(|m| !m.host_path.starts_with(&task)));
    let json = serde_json::to_value(v.vm_mounts()).unwrap();
    assert_eq!(json[2]["purpose"], "git_hooks");
    assert_eq!(json[2]["writable"], false);
}

#[test]
fn status_reports_ahead_behind_diverged_and_a_tampered_pointer() {
    let f = Fixture::new();
    let task = f.task("task1");
    let m = f.manager();
    let v = m.create_or_reuse(&task, None).unwrap().view;
    let s = m.status(&v).unwrap();
    assert_eq!(s.sync, SyncState::InSync);
    assert!(!s.watcher.running);
    assert!(s.problems.is_empty());

    f.commit(&v.view_path, &[("agent.txt", "a\n")], "agent");
    assert_eq!(m.status(&v).unwrap().sync, SyncState::Ahead { ahead: 1 });
    f.commit(&task, &[("host.txt", "h\n")], "host");
    assert!(matches!(
        m.status(&v).unwrap().sync,
        SyncState::Diverged {
            ahead: 1,
            behind: 1,
            merge_base: Some(_)
        }
    ));

    // An agent rewriting the view's .git pointer is noticed, and creation refuses to reuse.
    std::fs::write(v.view_path.join(".git"), "gitdir: /tmp/elsewhere\n").unwrap();
    let s = m.status(&v).unwrap();
    assert!(
        s.problems.iter().any(|p| p.contains("does not point to")),
        "{:?}",
        s.problems
    );
    let err = m.create_or_reuse(&task, None).unwrap_err();
    assert!(matches!(err, ViewError::Unhealthy { .. }), "{err}");
}

#[test]
fn project_name_of_a_bare_repository_drops_dot_git() {
    let f = Fixture::new();
    let bare = f.main.parent().unwrap().join("shop.git");
    f.git(
        &f.main,
        &[
            "clone",
            "-q",
            "--bare",
            f.main.to_str().unwrap(),
            bare.to_str().unwrap(),
        ],
    );
    let wt = f.main.parent().unwrap().join("shop-task");
    sandbox_testkit::add_worktree(&bare, &wt, "feature");
    let v = f.manager().create_or_reuse(&wt, None).unwrap().view;
    assert_eq!(v.project, "shop");
    assert_eq!(v.view_path, f.views_root.join("shop/shop-task-sandbox"));
    assert_eq!(
        f.git(&v.view_path, &["rev-parse", "--abbrev-ref", "HEAD"]),
        "s/feature"
    );
}

#[test]
fn a_second_repository_with_the_same_name_cannot_take_the_slot() {
    let f = Fixture::new();
    let task = f.task("task1");
    f.manager().create_or_reuse(&task, None).unwrap();
    // Another repository also called "app", with a worktree also called "task1".
    let other_root = f.main.parent().unwrap().join("elsewhere");
    std::fs::create_dir(&other_root).unwrap();
    let other = other_root.join("app");
    f.git(
        f.main.parent().unwrap(),
        &[
            "clone",
            "-q",
            f.main.to_str().unwrap(),
            other.to_str().unwrap(),
        ],
    );
    let other_task = other_root.join("task1");
    sandbox_testkit::add_worktree(&other, &other_task, "task1");
    let err = f.manager().create_or_reuse(&other_task, None).unwrap_err();
    assert!(matches!(err, ViewError::NameTaken { .. }), "{err}");
    assert!(err.to_string().contains("--task"), "{err}");
}
