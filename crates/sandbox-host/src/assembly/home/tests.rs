use super::*;

#[test]
fn keys_are_stable_readable_and_distinct() {
    let a = key_of(Path::new("/work/proj"));
    assert_eq!(a, key_of(Path::new("/work/proj")));
    assert!(a.starts_with("proj-"), "{a}");
    assert_ne!(a, key_of(Path::new("/other/proj")));
    assert!(!key_of(Path::new("/x/.hidden dir")).contains([' ', '/', '.']));
}

#[test]
fn a_tree_with_a_credential_file_is_granted_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let home = std::fs::canonicalize(dir.path()).unwrap();
    let nvm = home.join(".nvm");
    let etc = nvm.join("versions/node/v20/etc");
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::create_dir_all(nvm.join("versions/node/v20/bin")).unwrap();
    std::fs::write(etc.join("npmrc"), "//registry.npmjs.org/:_authToken=secret").unwrap();
    std::fs::write(etc.join("other"), "").unwrap();
    std::fs::write(nvm.join("nvm.sh"), "").unwrap();
    let mut masked = Vec::new();
    // Nothing kept: every call searches.
    let mut grants = scan::Scans::default().tree_grants(&nvm, &home, &mut masked);
    grants.sort();
    assert_eq!(
        grants,
        vec![
            nvm.join("nvm.sh"),
            nvm.join("versions/node/v20/bin"),
            etc.join("other"),
        ]
    );
    assert_eq!(masked.len(), 1);
    assert_eq!(masked[0].path, etc.join("npmrc"));
    // No secret: the tree itself.
    std::fs::remove_file(etc.join("npmrc")).unwrap();
    let mut masked = Vec::new();
    assert_eq!(
        scan::Scans::default().tree_grants(&nvm, &home, &mut masked),
        vec![nvm.clone()]
    );
    assert!(masked.is_empty());
}

#[test]
fn a_scan_of_the_home_finds_home_anchored_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let home = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    std::fs::write(home.join(".ssh/id_ed25519"), "key").unwrap();
    std::fs::create_dir_all(home.join("proj")).unwrap();
    std::fs::write(home.join("proj/.npmrc"), "token").unwrap();
    let hits: Vec<(PathBuf, &str)> = scan_secrets(&home, &home, 3)
        .into_iter()
        .map(|h| (h.path, h.kind.id))
        .collect();
    assert_eq!(
        hits,
        vec![
            (home.join(".ssh"), "ssh"),
            (home.join("proj/.npmrc"), "npmrc")
        ]
    );
    // Outside the home only the tails count.
    assert_eq!(scan_secrets(&home.join("proj"), &home, 3).len(), 1);
}

#[test]
fn human_sizes() {
    assert_eq!(human_bytes(512), "512 B");
    assert_eq!(human_bytes(2048), "2.0 KiB");
    assert_eq!(human_bytes(3 << 30), "3.0 GiB");
}

#[test]
fn each_task_has_its_own_key_and_none_is_the_projects_shared_one() {
    let t = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(t.path()).unwrap();
    let (main, a, b) = (root.join("main"), root.join("a"), root.join("b"));
    sandbox_testkit::linked_worktree(&main, &a);
    sandbox_testkit::add_worktree(&main, &b, "b");
    let key = |dir: &Path, per_task: bool| {
        let policy = sandbox_policy::build(sandbox_policy::PolicyRequest {
            workdir: dir.to_path_buf(),
            ..Default::default()
        })
        .unwrap();
        home_key(&policy, per_task)
    };
    let shared = key(&main, false);
    assert_eq!(
        shared,
        key(&a, false),
        "per-project: one home for the worktrees"
    );
    let tasks = [key(&main, true), key(&a, true), key(&b, true)];
    for (i, k) in tasks.iter().enumerate() {
        assert_ne!(k, &shared, "a task's home is not the shared one");
        assert!(tasks[i + 1..].iter().all(|other| other != k), "{tasks:?}");
        assert_eq!(k, &key([&main, &a, &b][i], true), "stable");
    }
    // Outside a repository there is one task: the directory.
    let plain = root.join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    assert_eq!(key(&plain, true), key_of(&plain));
}

/// Mount points a run does not need are kept while another run of the project holds the
/// home (and this run still holds it shared), removed by a run that is alone.
#[test]
fn unneeded_mount_points_go_only_when_no_other_run_holds_the_home() {
    use std::os::fd::AsRawFd as _;
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("homes/proj");
    std::fs::create_dir_all(dir.join(".npm")).unwrap();
    std::fs::create_dir_all(dir.join(".rustup")).unwrap();
    let rel = |p: &str| PathBuf::from(p);
    // A run that needed both.
    drop(places::keep_mount_points(&dir, &[rel(".npm"), rel(".rustup")]).unwrap());
    let other = flock(&users_lock(&dir), libc::LOCK_SH).unwrap();
    let this = places::keep_mount_points(&dir, &[rel(".rustup")]).unwrap();
    assert!(dir.join(".npm").is_dir(), "another run lives: kept");
    // This run holds the home: `sandbox home reset` cannot take it.
    drop(other);
    assert!(idle(&dir).is_err(), "the run's shared lock is held");
    drop(this);
    let alone = places::keep_mount_points(&dir, &[rel(".rustup")]).unwrap();
    assert!(!dir.join(".npm").exists(), "alone: removed");
    assert!(dir.join(".rustup").is_dir());
    assert!(idle(&dir).is_err());
    drop(alone);
    let probe = idle(&dir).unwrap();
    assert!(crate::sys::flock(probe.as_raw_fd(), libc::LOCK_UN).is_ok());
}
