use super::*;
use std::os::unix::fs::symlink;

fn start_in(dir: &Path) -> (GitDirAtStart, PathBuf) {
    let gitdir = dir.join("common/worktrees/t");
    std::fs::create_dir_all(gitdir.join("refs/bisect")).unwrap();
    std::fs::write(gitdir.join("HEAD"), "ref: refs/heads/t\n").unwrap();
    std::fs::write(gitdir.join("config.worktree"), "[core]\n").unwrap();
    let start = GitDirAtStart {
        gitdir: gitdir.clone(),
        common: dir.join("common"),
        worktree: None,
        config_worktree: Some(b"[core]\n".to_vec()),
        index: None,
        main: false,
    };
    (start, gitdir)
}

#[test]
fn links_and_unknown_names_are_set_aside_and_never_followed() {
    let dir = tempfile::tempdir().unwrap();
    let (start, gitdir) = start_in(dir.path());
    let victim = dir.path().join("bashrc");
    std::fs::write(&victim, "# original\n").unwrap();
    symlink(&victim, gitdir.join("COMMIT_EDITMSG")).unwrap();
    symlink(&victim, gitdir.join("refs/bisect/bad")).unwrap();
    std::fs::create_dir(gitdir.join("hooks")).unwrap();
    std::fs::write(gitdir.join("ORIG_HEAD"), "0".repeat(40) + "\n").unwrap();
    let report = audit_gitdir(&start, &|_| true);
    let moved: Vec<_> = report.set_aside.iter().map(|s| s.path.clone()).collect();
    assert_eq!(moved.len(), 3, "{report:?}");
    for name in ["COMMIT_EDITMSG", "refs/bisect/bad", "hooks"] {
        assert!(moved.contains(&gitdir.join(name)), "{name}: {report:?}");
        assert!(
            std::fs::symlink_metadata(gitdir.join(name)).is_err(),
            "{name}"
        );
    }
    for s in &report.set_aside {
        let to = s.moved_to.as_ref().unwrap();
        assert_eq!(to.parent(), Some(gitdir.as_path()), "{s}");
        assert!(to.to_string_lossy().contains(".sandbox-set-aside-"), "{s}");
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "# original\n");
    assert!(gitdir.join("ORIG_HEAD").exists() && gitdir.join("config.worktree").exists());
    // What was set aside stays aside, unreported, on the next check.
    assert_eq!(audit_gitdir(&start, &|_| true), GitDirReport::default());
}

#[test]
fn config_worktree_only_as_it_was_and_rebase_state_only_without_exec() {
    let dir = tempfile::tempdir().unwrap();
    let (start, gitdir) = start_in(dir.path());
    std::fs::write(gitdir.join("config.worktree"), "[core]\nfsmonitor = x\n").unwrap();
    let rebase = gitdir.join("rebase-merge");
    std::fs::create_dir(&rebase).unwrap();
    std::fs::write(rebase.join("head-name"), "refs/heads/t\n").unwrap();
    std::fs::write(rebase.join("git-rebase-todo"), "pick 1 a\n").unwrap();
    let own = |name: &str| name == "refs/heads/t";
    let report = audit_gitdir(&start, &own);
    assert_eq!(report.set_aside.len(), 1, "{report:?}");
    assert!(report.set_aside[0].why.contains("config.worktree changed"));
    assert!(
        rebase.join("git-rebase-todo").exists(),
        "a plain rebase stays"
    );
    std::fs::write(rebase.join("git-rebase-todo"), "break\nexec make\n").unwrap();
    let report = audit_gitdir(&start, &own);
    assert_eq!(report.set_aside.len(), 1, "{report:?}");
    assert!(report.set_aside[0].why.contains("exec make"), "{report:?}");
    assert!(!rebase.exists());
}

#[test]
fn pseudorefs_and_per_worktree_refs_only_as_object_ids() {
    let dir = tempfile::tempdir().unwrap();
    let (start, gitdir) = start_in(dir.path());
    let oid = format!("{}\n", "a".repeat(40));
    std::fs::write(gitdir.join("ORIG_HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(gitdir.join("REBASE_HEAD"), &oid).unwrap();
    std::fs::write(gitdir.join("refs/bisect/bad"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(gitdir.join("refs/bisect/good"), &oid).unwrap();
    let report = audit_gitdir(&start, &|_| true);
    let moved: Vec<_> = report.set_aside.iter().map(|s| s.path.clone()).collect();
    assert_eq!(moved.len(), 2, "{report:?}");
    assert!(moved.contains(&gitdir.join("ORIG_HEAD")), "{report:?}");
    assert!(
        moved.contains(&gitdir.join("refs/bisect/bad")),
        "{report:?}"
    );
    assert!(gitdir.join("REBASE_HEAD").exists() && gitdir.join("refs/bisect/good").exists());
}

#[test]
fn state_files_are_read_whole_and_a_strategy_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (start, gitdir) = start_in(dir.path());
    let rebase = gitdir.join("rebase-merge");
    std::fs::create_dir(&rebase).unwrap();
    // Past the first MiB an older check read.
    let todo = format!("{}exec touch /tmp/x\n", "# padding\n".repeat(200_000));
    std::fs::write(rebase.join("git-rebase-todo"), todo).unwrap();
    let report = audit_gitdir(&start, &|_| true);
    assert!(report.set_aside[0].why.contains("exec touch"), "{report:?}");
    std::fs::create_dir(&rebase).unwrap();
    std::fs::write(rebase.join("git-rebase-todo"), "pick 1 a\n").unwrap();
    std::fs::write(rebase.join("strategy"), "ort /../evil\n").unwrap();
    let report = audit_gitdir(&start, &|_| true);
    assert!(report.set_aside[0].why.contains("strategy"), "{report:?}");
    assert!(!rebase.exists());
}

#[test]
fn a_gitlink_pointer_leads_beneath_modules_through_no_link() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let modules = root.join("repo/.git/modules");
    std::fs::create_dir_all(modules.join("sub")).unwrap();
    std::fs::create_dir_all(root.join("task/sub")).unwrap();
    std::fs::create_dir_all(root.join("task/p/q")).unwrap();
    std::fs::create_dir_all(root.join("task/repo/.git/modules/sub")).unwrap();
    symlink(root.join("task/p/q"), root.join("task/lnk")).unwrap();
    let sub = open_dir(&root.join("task/sub")).unwrap();
    let leads = |text: &str| pointer_leads_into(&sub, text.as_bytes(), &modules);
    assert!(leads("gitdir: ../../repo/.git/modules/sub\n"));
    // Lexically beneath modules/, really the worktree's own `task/repo/...`.
    assert!(!leads("gitdir: ../lnk/../../repo/.git/modules/sub\n"));
    assert!(!leads("gitdir: ../../repo/.git/modules\n"));
    assert!(!leads("gitdir: ../../repo/.git/modules/sub/..\n"));
    assert!(!leads("gitdir: ../../repo/.git/modules/sub"));
    assert!(!leads("gitdir: ../repo/.git/modules/sub\n"));
}
