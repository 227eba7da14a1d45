use super::*;
use sandbox_policy::PointerFile;

/// A linked worktree's layout whose worktree is `root` (only its `.git` pointer matters here).
fn layout(root: &Path, allowed: bool) -> GitLayout {
    std::fs::write(root.join(".git"), "gitdir: /repo/.git/worktrees/t\n").unwrap();
    GitLayout {
        is_linked: true,
        common_dir: "/repo/.git".into(),
        worktree_gitdir: "/repo/.git/worktrees/t".into(),
        worktree_config: false,
        pointers: vec![PointerFile {
            path: root.join(".git"),
            content: "gitdir: /repo/.git/worktrees/t\n".into(),
        }],
        task_branch: None,
        hooks_path: None,
        push_remotes: Vec::new(),
        absent_pointers: Vec::new(),
        allow_nested_git: allowed,
    }
}

fn mkdirs(root: &Path, rel: &str) -> PathBuf {
    let p = root.join(rel);
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// A directory git takes for a bare repository.
fn bare(dir: &Path) {
    mkdirs(dir, "objects");
    mkdirs(dir, "refs");
    std::fs::write(dir.join("HEAD"), "ref: refs/heads/main\n").unwrap();
}

fn exists(p: &Path) -> bool {
    p.symlink_metadata().is_ok()
}

#[test]
fn what_was_there_before_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let l = layout(root, false);
    // A vendored repository with a submodule of its own (a bare-looking git dir inside).
    mkdirs(root, "vendor/v/.git/hooks");
    bare(&mkdirs(root, "vendor/v/.git"));
    bare(&mkdirs(root, "vendor/v/.git/modules/m"));
    mkdirs(root, "sub");
    std::fs::write(root.join("sub/.git"), "gitdir: ../.git/modules/sub\n").unwrap();
    bare(&mkdirs(root, "fixtures/r.git"));
    let start = NestedAtStart::scan(&l).unwrap();
    assert_eq!(start.len(), 3, "{start:?}");
    // The run works in them and around them.
    std::fs::write(root.join("vendor/v/.git/hooks/x"), "data").unwrap();
    std::fs::write(root.join("vendor/v/README"), "data").unwrap();
    bare(&mkdirs(root, "vendor/v/.git/modules/new"));
    std::fs::write(root.join("fixtures/r.git/HEAD"), "ref: refs/heads/other\n").unwrap();
    mkdirs(root, "target/debug/build");
    let report = audit_nested(&start);
    assert_eq!(report, NestedReport::default());
    assert!(root.join("vendor/v/.git").is_dir());
    assert!(root.join("sub/.git").is_file());
    assert!(root.join("fixtures/r.git/HEAD").is_file());
}

#[test]
fn repositories_the_run_creates_are_set_aside_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let root = mkdirs(dir.path(), "wt");
    let l = layout(&root, false);
    mkdirs(&root, "node_modules/pkg");
    let start = NestedAtStart::scan(&l).unwrap();
    // `git init sub/x`, a `.git` file pointing out, a `.git` link, a bare repository, one
    // deep in an ignored tree: each is found.
    mkdirs(&root, "sub/x/.git/hooks");
    mkdirs(&root, "other");
    std::fs::write(root.join("other/.git"), "gitdir: /tmp/evil\n").unwrap();
    let outside = mkdirs(dir.path(), "evil");
    mkdirs(&root, "linked");
    std::os::unix::fs::symlink(&outside, root.join("linked/.git")).unwrap();
    bare(&mkdirs(&root, "b.git"));
    mkdirs(&root, "node_modules/pkg/deep/er/.git");
    // A link to a directory is not walked into (it is not the worktree's).
    mkdirs(dir.path(), "elsewhere/y/.git");
    std::os::unix::fs::symlink(dir.path().join("elsewhere"), root.join("away")).unwrap();

    let report = audit_nested(&start);
    let paths: Vec<_> = report.repos.iter().map(|r| r.path.clone()).collect();
    let want = [
        "b.git",
        "linked/.git",
        "node_modules/pkg/deep/er/.git",
        "other/.git",
        "sub/x/.git",
    ]
    .map(|p| root.join(p));
    let mut sorted = paths.clone();
    sorted.sort();
    assert_eq!(sorted, want, "{report:?}");
    for repo in &report.repos {
        assert_eq!(repo.change, NestedChange::Created, "{repo}");
        assert!(!repo.kept && repo.error.is_none(), "{repo}");
        let moved = repo.moved_to.as_ref().unwrap();
        assert!(exists(moved), "{repo}");
        assert!(
            moved.to_string_lossy().contains(".sandbox-set-aside-"),
            "{repo}"
        );
        assert!(repo.to_string().contains("set aside"), "{repo}");
        assert!(repo.to_string().contains("--allow-nested-git"), "{repo}");
    }
    for gone in ["sub/x/.git", "other/.git", "linked/.git", "b.git/HEAD"] {
        assert!(!exists(&root.join(gone)), "{gone} is out of git's sight");
    }
    assert!(outside.is_dir(), "a link's target is not touched");
    assert!(dir.path().join("elsewhere/y/.git").is_dir());
    assert!(
        audit_nested(&start).repos.is_empty(),
        "nothing left to find"
    );
}

#[test]
fn a_rewritten_dot_git_file_is_put_back() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let l = layout(root, false);
    mkdirs(root, "sub");
    let dot_git = root.join("sub/.git");
    std::fs::write(&dot_git, "gitdir: ../.git/modules/sub\n").unwrap();
    let start = NestedAtStart::scan(&l).unwrap();
    std::fs::write(&dot_git, "gitdir: /tmp/evil\n").unwrap();
    let report = audit_nested(&start);
    assert_eq!(report.repos.len(), 1, "{report:?}");
    let repo = &report.repos[0];
    assert_eq!(repo.change, NestedChange::Repointed);
    assert!(repo.restored, "{repo}");
    assert!(repo.to_string().contains("restored"), "{repo}");
    assert_eq!(
        std::fs::read_to_string(&dot_git).unwrap(),
        "gitdir: ../.git/modules/sub\n"
    );
    // Replaced by a directory: moved aside, the pointer written back.
    std::fs::remove_file(&dot_git).unwrap();
    mkdirs(root, "sub/.git/hooks");
    let report = audit_nested(&start);
    assert!(report.repos[0].restored, "{report:?}");
    assert!(report.repos[0].moved_to.is_some(), "{report:?}");
    assert!(dot_git.is_file());
}

#[test]
fn with_the_grant_new_repositories_are_kept_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let l = layout(root, true);
    let start = NestedAtStart::scan(&l).unwrap();
    mkdirs(root, "sub/x/.git");
    let report = audit_nested(&start);
    assert_eq!(report.repos.len(), 1, "{report:?}");
    assert!(report.repos[0].kept, "{report:?}");
    assert!(report.repos[0].to_string().contains("kept"));
    assert!(root.join("sub/x/.git").is_dir());
}

#[test]
fn too_deep_to_search_is_reported_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let l = layout(root, false);
    let start = NestedAtStart::scan(&l).unwrap();
    // Created level by level: the whole path is longer than PATH_MAX.
    let mut at = std::fs::File::open(root).unwrap();
    for _ in 0..MAX_DEPTH + 3 {
        at = open_subdir_creating(&at, "dddddddddddddddddddd");
    }
    let _ = at;
    let report = audit_nested(&start);
    assert_eq!(report.repos.len(), 1, "{report:?}");
    assert_eq!(report.repos[0].change, NestedChange::Unsearched);
    assert!(report.repos[0].to_string().contains("not searched"));
    let again = NestedAtStart::scan(&l).unwrap();
    assert!(audit_nested(&again).repos.is_empty());
}

fn open_subdir_creating(dir: &File, name: &str) -> File {
    nix::sys::stat::mkdirat(Some(dir.as_raw_fd()), name, Mode::from_bits_truncate(0o755)).unwrap();
    open_subdir(dir, OsStr::new(name)).unwrap()
}
