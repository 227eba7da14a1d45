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
    std::fs::write(gitdir.join("ORIG_HEAD"), "0".repeat(40)).unwrap();
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
