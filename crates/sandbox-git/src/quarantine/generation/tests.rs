use super::*;
use sandbox_testkit::git;

/// A generation whose record is locked — its daemon lives — is never touched by
/// [`recover`]; once the lock is gone (the daemon died: here the value is dropped without
/// its end, which closes the locked descriptor as the kernel does for a dead process) it
/// is read back against the start it recorded: the task branch moves, a stale index is not
/// taken over a worktree index changed since, and the generation and its record go.
#[test]
fn only_a_dead_daemons_generation_is_recovered() {
    let t = tempfile::tempdir().unwrap();
    let main = t.path().join("main");
    let task = t.path().join("task");
    sandbox_testkit::linked_worktree(&main, &task);
    let common = main.join(".git").canonicalize().unwrap();
    let boxes = t.path().join("boxes");
    std::fs::create_dir(&boxes).unwrap();
    let box_git = BoxGit::new(&common, &common.join("worktrees/task"), &boxes.join("b")).unwrap();
    let records = t.path().join("records");
    let generation = Generation::begin(&box_git, &[&records], &t.path().join("scratch")).unwrap();
    let gitdir = generation.dir().join("worktrees/task");
    let out = sandbox_testkit::git_command(&task)
        .env("GIT_DIR", &gitdir)
        .env("GIT_WORK_TREE", &task)
        .args(["commit", "-q", "--allow-empty", "-m", "in the box"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let before = git(&main, &["rev-parse", "task"]);

    assert!(recover(&boxes).is_empty(), "a live daemon's generation");
    assert!(generation.dir().is_dir());

    let dir = generation.dir();
    drop(generation);
    // The worktree's index changes after the period began: the box's copy is stale.
    std::fs::write(common.join("worktrees/task/index"), b"not the box's").unwrap();
    let recovered = recover(&boxes);
    assert_eq!(recovered.len(), 1, "{recovered:?}");
    let report = recovered[0].end.store.as_ref().unwrap();
    assert_eq!(report.applied.len(), 1, "{report:?}");
    assert_ne!(git(&main, &["rev-parse", "task"]), before);
    assert_eq!(
        std::fs::read(common.join("worktrees/task/index")).unwrap(),
        b"not the box's"
    );
    let lines = recovered[0].lines().join("\n");
    assert!(
        lines.contains("died mid-period") && lines.contains("index changed"),
        "{lines}"
    );
    assert!(!dir.exists());
    assert!(std::fs::read_dir(box_git.records_dir())
        .unwrap()
        .next()
        .is_none());
    assert!(recover(&boxes).is_empty(), "nothing is read back twice");
}
