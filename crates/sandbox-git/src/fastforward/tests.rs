use super::*;
use crate::manager::ViewManager;

use sandbox_testkit::git;

/// The swap losing a race (someone moves `<b>` between our checkout and our swap) must
/// leave the task worktree exactly as it was and the other writer's commit in place.
#[test]
fn lost_race_restores_the_worktree() {
    let tmp = tempfile::tempdir().unwrap();
    let main = tmp.path().join("app");
    std::fs::create_dir(&main).unwrap();
    std::fs::write(main.join("a.txt"), "a\n").unwrap();
    std::fs::write(main.join("keep.txt"), "keep\n").unwrap();
    let task = tmp.path().join("task1");
    sandbox_testkit::linked_worktree_on(&main, &task, "main", "task1");
    let views = ViewManager::new(tmp.path().join("views"));
    let view = views.create_or_reuse(&task, None).unwrap().view;

    std::fs::write(view.view_path.join("a.txt"), "from the agent\n").unwrap();
    std::fs::create_dir(view.view_path.join("new")).unwrap();
    std::fs::write(view.view_path.join("new/b.txt"), "b\n").unwrap();
    git(&view.view_path, &["add", "."]);
    git(&view.view_path, &["commit", "-qm", "agent"]);
    // The racer's commit, somewhere else entirely.
    git(&main, &["commit", "-q", "--allow-empty", "-m", "host"]);
    // An unrelated local change in the task worktree must survive everything.
    std::fs::write(task.join("keep.txt"), "local edit\n").unwrap();
    let before = git(&task, &["rev-parse", "task1"]);
    let index_before = std::fs::read(view.common_dir.join("worktrees/task1/index")).unwrap();

    let common = repo::open_common(&view.common_dir).unwrap();
    let mut racer = || {
        git(&main, &["update-ref", "refs/heads/task1", "main"]);
    };
    let step = step_with(
        &common,
        &view,
        std::slice::from_ref(&view.worktree_name),
        &mut racer,
    )
    .unwrap();
    assert_eq!(step, Step::Raced);
    // The other writer's value stands; the agent's commit is still on s/task1.
    assert_eq!(
        git(&task, &["rev-parse", "task1"]),
        git(&main, &["rev-parse", "main"])
    );
    assert_ne!(git(&task, &["rev-parse", "s/task1"]), before);
    // Files as they were, the unrelated edit kept, no new files, index untouched, no lock.
    assert_eq!(std::fs::read_to_string(task.join("a.txt")).unwrap(), "a\n");
    assert_eq!(
        std::fs::read_to_string(task.join("keep.txt")).unwrap(),
        "local edit\n"
    );
    assert!(!task.join("new").exists());
    assert_eq!(
        std::fs::read(view.common_dir.join("worktrees/task1/index")).unwrap(),
        index_before
    );
    assert!(!view.common_dir.join("worktrees/task1/index.lock").exists());
    assert!(!view
        .common_dir
        .join("worktrees/task1/sandbox-ff.index")
        .exists());
}
