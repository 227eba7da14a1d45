use super::*;
use sandbox_policy::PointerFile;

fn layout(dir: &Path) -> GitLayout {
    let pointer = dir.join(".git");
    std::fs::write(&pointer, ORIGINAL).unwrap();
    GitLayout {
        is_linked: true,
        common_dir: dir.join("common"),
        worktree_gitdir: dir.join("common/worktrees/t"),
        worktree_config: false,
        pointers: vec![PointerFile {
            path: pointer,
            content: ORIGINAL.into(),
        }],
        task_branch: None,
        hooks_path: None,
        push_remotes: Vec::new(),
        absent_pointers: Vec::new(),
        allow_nested_git: false,
    }
}

const ORIGINAL: &str = "gitdir: /repo/.git/worktrees/t\n";

/// A linked worktree on branch `task`, with `main` existing beside it.
fn on_task(dir: &Path) -> (GitLayout, HeadAtStart) {
    let mut l = layout(dir);
    l.task_branch = Some("refs/heads/task".into());
    std::fs::create_dir_all(l.common_dir.join("refs/heads")).unwrap();
    std::fs::create_dir_all(&l.worktree_gitdir).unwrap();
    std::fs::write(
        l.common_dir.join("refs/heads/main"),
        format!("{}\n", "a".repeat(40)),
    )
    .unwrap();
    std::fs::write(l.worktree_gitdir.join("HEAD"), "ref: refs/heads/task\n").unwrap();
    let start = HeadAtStart::read(&l).unwrap();
    (l, start)
}

#[test]
fn head_left_on_an_existing_branch_is_put_back_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (l, start) = on_task(dir.path());
    let head = l.worktree_gitdir.join("HEAD");
    std::fs::write(&head, "ref: refs/heads/main\n").unwrap();
    let t = check_head(&start, &l, &report(&l, &[])).expect("reported");
    assert!(t.restored, "{t}");
    assert!(t.found.contains("refs/heads/main"), "{t}");
    assert_eq!(read(&head), "ref: refs/heads/task\n");
    // A link planted in its place is replaced as a link, never followed.
    let target = dir.path().join("target");
    std::fs::write(&target, "keep").unwrap();
    std::fs::remove_file(&head).unwrap();
    std::os::unix::fs::symlink(&target, &head).unwrap();
    assert!(check_head(&start, &l, &report(&l, &[])).unwrap().restored);
    assert_eq!(read(&target), "keep");
    assert!(std::fs::symlink_metadata(&head).unwrap().is_file());
}

#[test]
fn head_on_the_runs_own_or_a_new_branch_or_detached_stays() {
    let dir = tempfile::tempdir().unwrap();
    let (l, start) = on_task(dir.path());
    let head = l.worktree_gitdir.join("HEAD");
    for (content, created) in [
        ("ref: refs/heads/task\n", &[][..]),
        ("ref: refs/heads/feature\n", &["refs/heads/feature"][..]),
        ("ref: refs/heads/unborn\n", &[][..]),
        (&*format!("{}\n", "b".repeat(40)), &[][..]),
    ] {
        std::fs::write(&head, content).unwrap();
        assert_eq!(
            check_head(&start, &l, &report(&l, created)),
            None,
            "{content}"
        );
        assert_eq!(read(&head), content);
    }
    // `main` only in packed-refs still exists.
    std::fs::remove_file(l.common_dir.join("refs/heads/main")).unwrap();
    std::fs::write(
        l.common_dir.join("packed-refs"),
        format!(
            "# pack-refs with: peeled\n{} refs/heads/main\n",
            "a".repeat(40)
        ),
    )
    .unwrap();
    std::fs::write(&head, "ref: refs/heads/main\n").unwrap();
    assert!(check_head(&start, &l, &report(&l, &[])).is_some());
}

/// A quarantine's report with the layout's task branch and `created` created by the run.
fn report(l: &GitLayout, created: &[&str]) -> StoreReport {
    StoreReport {
        task_branch: l.task_branch.clone(),
        applied: created
            .iter()
            .map(|name| sandbox_git::quarantine::AppliedRef {
                name: name.to_string(),
                old: None,
                new: Some("b".repeat(40)),
            })
            .collect(),
        ..Default::default()
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

/// The pointer is a regular file (not a link to one) holding the recorded bytes again.
fn assert_restored(dir: &Path, t: &[Tampering]) {
    assert_eq!(t.len(), 1, "{t:?}");
    assert!(t[0].restored, "{}", t[0]);
    assert!(t[0].to_string().contains("restored it"));
    let pointer = dir.join(".git");
    assert!(std::fs::symlink_metadata(&pointer).unwrap().is_file());
    assert_eq!(read(&pointer), ORIGINAL);
}

#[test]
fn untouched_pointers_report_nothing() {
    let dir = tempfile::tempdir().unwrap();
    assert!(check_and_restore(&layout(dir.path())).is_empty());
}

#[test]
fn rewritten_pointer_is_restored() {
    let dir = tempfile::tempdir().unwrap();
    let l = layout(dir.path());
    std::fs::write(dir.path().join(".git"), "gitdir: /tmp/evil\n").unwrap();
    let t = check_and_restore(&l);
    assert_eq!(t[0].found, "gitdir: /tmp/evil\n");
    assert_restored(dir.path(), &t);
    // Nothing is left beside it.
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

#[test]
fn replaced_by_a_directory_is_quarantined_not_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let l = layout(dir.path());
    std::fs::remove_file(dir.path().join(".git")).unwrap();
    std::fs::create_dir_all(dir.path().join(".git/hooks")).unwrap();
    std::fs::write(dir.path().join(".git/config"), "[core]\nhooksPath=x\n").unwrap();
    // The names the old repair moved it to, taken in advance: they must not matter.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for s in now - 1..now + 5 {
        std::fs::create_dir_all(dir.path().join(format!(".git.sandbox-quarantine-{s}/x"))).unwrap();
    }
    let t = check_and_restore(&l);
    assert_eq!(t[0].found, "(directory)");
    let aside = t[0].quarantined.clone().unwrap();
    assert!(aside.join("config").exists());
    assert!(t[0].to_string().contains(&aside.display().to_string()));
    assert_restored(dir.path(), &t);
}

#[test]
fn symlinks_at_the_old_repair_names_are_not_written_through() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    std::fs::write(&victim, "untouched\n").unwrap();
    let l = layout(dir.path());
    for planted in ["..git.sandbox-restore", ".git.sandbox-restore"] {
        std::os::unix::fs::symlink(&victim, dir.path().join(planted)).unwrap();
    }
    std::fs::write(dir.path().join(".git"), "gitdir: /tmp/evil\n").unwrap();
    let t = check_and_restore(&l);
    assert_restored(dir.path(), &t);
    assert_eq!(read(&victim), "untouched\n");
    // The planted links are left alone (not followed, not reused).
    assert_eq!(
        read(&dir.path().join("..git.sandbox-restore")),
        "untouched\n"
    );
}

#[test]
fn a_symlinked_pointer_is_replaced_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    std::fs::write(&victim, "untouched\n").unwrap();
    let l = layout(dir.path());
    std::fs::remove_file(dir.path().join(".git")).unwrap();
    std::os::unix::fs::symlink(&victim, dir.path().join(".git")).unwrap();
    let t = check_and_restore(&l);
    assert_eq!(t[0].found, format!("(symlink to {})", victim.display()));
    assert_restored(dir.path(), &t);
    assert_eq!(read(&victim), "untouched\n");
}

#[test]
fn a_symlink_to_a_file_with_the_right_bytes_is_still_tampering() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let copy = outside.path().join("copy");
    std::fs::write(&copy, ORIGINAL).unwrap();
    let l = layout(dir.path());
    std::fs::remove_file(dir.path().join(".git")).unwrap();
    std::os::unix::fs::symlink(&copy, dir.path().join(".git")).unwrap();
    assert_restored(dir.path(), &check_and_restore(&l));
}

#[test]
fn a_fifo_at_the_pointer_does_not_stall_the_check() {
    let dir = tempfile::tempdir().unwrap();
    let l = layout(dir.path());
    std::fs::remove_file(dir.path().join(".git")).unwrap();
    nix::unistd::mkfifo(&dir.path().join(".git"), Mode::from_bits_truncate(0o600)).unwrap();
    let t = check_and_restore(&l);
    assert_eq!(t[0].found, "(not a regular file)");
    assert_restored(dir.path(), &t);
}

#[test]
fn a_symlinked_parent_directory_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::write(real.join(".git"), "something else\n").unwrap();
    std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
    let mut l = layout(dir.path());
    l.pointers[0].path = dir.path().join("link/.git");
    let t = check_and_restore(&l);
    assert_eq!(t.len(), 1);
    assert!(!t[0].restored);
    assert!(
        t[0].to_string().contains("could NOT restore it"),
        "{}",
        t[0]
    );
    assert_eq!(read(&real.join(".git")), "something else\n");
}

#[test]
fn config_bool_parsing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config");
    std::fs::write(
        &cfg,
        "[core]\n\tbare = false\n[extensions]\n\tworktreeConfig = true\n",
    )
    .unwrap();
    assert!(git_config_bool(&cfg, "extensions.worktreeConfig"));
    std::fs::write(&cfg, "[extensions]\n\tworktreeconfig = false\n").unwrap();
    assert!(!git_config_bool(&cfg, "extensions.worktreeConfig"));
}

/// A main git dir: `commondir`, `gitdir` and `locked` absent before the run. Git reads
/// `commondir` in any git dir, so one the run creates (a file, a link, a directory) is moved
/// aside — never deleted, never followed — and reported; a run that leaves none is silent.
#[test]
fn a_commondir_created_in_a_main_git_dir_is_moved_aside() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = layout(dir.path());
    let git = dir.path().join("repo/.git");
    std::fs::create_dir_all(&git).unwrap();
    l.is_linked = false;
    l.pointers.clear();
    l.common_dir = git.clone();
    l.worktree_gitdir = git.clone();
    l.absent_pointers = ["commondir", "gitdir", "locked"]
        .map(|n| git.join(n))
        .into();
    assert!(check_and_restore(&l).is_empty());

    let evil = dir.path().join("evil");
    std::fs::create_dir(&evil).unwrap();
    std::fs::write(git.join("commondir"), format!("{}\n", evil.display())).unwrap();
    std::os::unix::fs::symlink(&evil, git.join("gitdir")).unwrap();
    std::fs::create_dir(git.join("locked")).unwrap();
    let found = check_and_restore(&l);
    assert_eq!(found.len(), 3, "{found:?}");
    for t in &found {
        assert!(t.created && t.restored, "{t}");
        assert!(t.to_string().contains("moved it aside"), "{t}");
        assert!(
            t.path.symlink_metadata().is_err(),
            "{t}: gone from git's sight"
        );
        assert!(t.quarantined.as_ref().unwrap().symlink_metadata().is_ok());
    }
    assert!(
        found[0].found.contains(&evil.display().to_string()),
        "{found:?}"
    );
    assert!(found[1].found.contains("symlink"), "{found:?}");
    assert!(evil.is_dir(), "the link's target is untouched");
    assert!(check_and_restore(&l).is_empty(), "nothing left to find");
}
