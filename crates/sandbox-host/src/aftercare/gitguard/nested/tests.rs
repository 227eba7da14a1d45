use super::walk::open_subdir;
use super::*;
use sandbox_policy::PointerFile;
use std::fs::File;
use std::os::unix::fs::MetadataExt;

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
    let start = NestedAtStart::scan(&l, None).unwrap();
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
    let start = NestedAtStart::scan(&l, None).unwrap();
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
    let start = NestedAtStart::scan(&l, None).unwrap();
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
    let start = NestedAtStart::scan(&l, None).unwrap();
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
    let start = NestedAtStart::scan(&l, None).unwrap();
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
    let again = NestedAtStart::scan(&l, None).unwrap();
    assert!(audit_nested(&again).repos.is_empty());
}

fn open_subdir_creating(dir: &File, name: &str) -> File {
    nix::sys::stat::mkdirat(
        Some(dir.as_raw_fd()),
        name,
        nix::sys::stat::Mode::from_bits_truncate(0o755),
    )
    .unwrap();
    open_subdir(dir, OsStr::new(name)).unwrap()
}

/// How long ago a directory must have changed for the tests' walks to record it, and how
/// long they wait for what they made to be that old (the default is two seconds).
const RACY: Duration = Duration::from_millis(50);

fn settle() {
    std::thread::sleep(RACY * 3);
}

fn scan(l: &GitLayout, cache: Option<&Path>) -> NestedAtStart {
    NestedAtStart::scan_with(l, cache, RACY).unwrap()
}

fn found(report: &NestedReport) -> Vec<PathBuf> {
    let mut paths: Vec<_> = report.repos.iter().map(|r| r.path.clone()).collect();
    paths.sort();
    paths
}

#[test]
fn a_new_git_below_unchanged_directories_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let l = layout(root, false);
    mkdirs(root, "a/b/c");
    mkdirs(root, "a/d");
    std::fs::write(root.join("a/b/file"), "data").unwrap();
    settle();
    let start = scan(&l, None);
    assert_eq!(start.stats.read, 5, "{:?}", start.stats);
    // Only `c` changes: `a` and `a/b` are not read again, yet their subdirectories are
    // visited; a file's content changes nothing of its directory.
    mkdirs(root, "a/b/c/.git/hooks");
    std::fs::write(root.join("a/b/file"), "other data").unwrap();
    let (report, stats) = audit(&start);
    assert_eq!(found(&report), [root.join("a/b/c/.git")], "{report:?}");
    let stats = stats.unwrap();
    assert_eq!(
        stats,
        WalkStats {
            read: 1,
            reused: 3,
            stat_only: 1
        },
        "the root, a and a/b unchanged, a/d a leaf: only c read"
    );
    assert!(!root.join("a/b/c/.git").exists());
}

#[test]
fn a_modification_time_set_back_does_not_hide_a_new_git() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let l = layout(root, false);
    let sub = mkdirs(root, "sub/x");
    settle();
    let start = scan(&l, None);
    let before = std::fs::symlink_metadata(&sub).unwrap();
    // `git init sub/x`, then `touch -d` on sub/x: its modification time as it was.
    mkdirs(&sub, ".git/hooks");
    std::fs::File::open(&sub)
        .unwrap()
        .set_times(std::fs::FileTimes::new().set_modified(before.modified().unwrap()))
        .unwrap();
    let after = std::fs::symlink_metadata(&sub).unwrap();
    assert_eq!(after.modified().unwrap(), before.modified().unwrap());
    assert_ne!(
        (after.ctime(), after.ctime_nsec()),
        (before.ctime(), before.ctime_nsec()),
        "the change time is the present"
    );
    let (report, stats) = audit(&start);
    assert_eq!(found(&report), [sub.join(".git")], "{report:?}");
    assert_eq!(stats.unwrap().read, 1, "{stats:?}");
}

#[test]
fn a_directory_replaced_by_another_of_the_same_name_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let root = mkdirs(dir.path(), "wt");
    let l = layout(&root, false);
    mkdirs(&root, "a/b");
    // Made before the scan, outside the worktree: old enough to be trusted, were it known.
    mkdirs(dir.path(), "outside/b/.git/hooks");
    settle();
    let start = scan(&l, None);
    std::fs::rename(root.join("a/b"), dir.path().join("old")).unwrap();
    std::fs::rename(dir.path().join("outside/b"), root.join("a/b")).unwrap();
    let report = audit_nested(&start);
    assert_eq!(found(&report), [root.join("a/b/.git")], "{report:?}");
    assert_eq!(report.repos[0].change, NestedChange::Created);
}

#[test]
fn a_directory_changed_just_before_the_walk_is_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let l = layout(root, false);
    mkdirs(root, "a/b");
    // Within the racy window: a change in the same clock tick could keep its change time.
    let start = NestedAtStart::scan_with(&l, None, Duration::from_secs(3600)).unwrap();
    assert!(start.index.as_ref().unwrap().dirs.is_empty());
    let (report, stats) = audit(&start);
    assert!(report.repos.is_empty(), "{report:?}");
    assert_eq!(stats.unwrap().reused + stats.unwrap().stat_only, 0);
}

#[test]
fn the_last_walk_is_kept_for_the_next_command_and_checked_there() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let root = mkdirs(dir.path(), "wt");
    let private = mkdirs(dir.path(), "private");
    let l = layout(&root, false);
    mkdirs(&root, "a/b/c");
    mkdirs(&root, "vendor/v/.git");
    settle();
    let first = scan(&l, Some(&private));
    assert_eq!(first.len(), 1);
    mkdirs(&root, "a/new/.git");
    let report = audit_nested(&first);
    assert_eq!(found(&report), [root.join("a/new/.git")], "{report:?}");
    let cache = cache_file(&private, &root);
    let mode = std::fs::metadata(&cache).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    // Between commands the user makes a repository: the next scan finds it, reading only
    // what changed since the audit: `a` (changed too close to the audit's walk to be
    // recorded), `a/new` (where the audit set one aside) and what it set aside, `a/b` and
    // its new `mine`. The audit after it leaves the user's repository alone.
    settle();
    mkdirs(&root, "a/b/mine/.git");
    let second = scan(&l, Some(&private));
    assert_eq!(second.len(), 2, "{second:?}");
    assert_eq!(second.stats.read, 5, "{:?}", second.stats);
    assert_eq!(
        second.stats.reused + second.stats.stat_only,
        4,
        "{:?}",
        second.stats
    );
    assert!(audit_nested(&second).repos.is_empty());

    // A damaged cache, or one others may write, is not used: everything is read again.
    for (bytes, mode) in [(b"garbage".as_slice(), 0o600), (b"".as_slice(), 0o600)] {
        std::fs::write(&cache, bytes).unwrap();
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(mode)).unwrap();
        let again = scan(&l, Some(&private));
        assert_eq!(again.len(), 2);
        assert_eq!(again.stats.reused + again.stats.stat_only, 0);
    }
    audit_nested(&second);
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o644)).unwrap();
    let again = scan(&l, Some(&private));
    assert_eq!(
        again.stats.reused + again.stats.stat_only,
        0,
        "{:?}",
        again.stats
    );
}

#[test]
fn the_cache_format_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let l = layout(root, false);
    mkdirs(root, "a/b\n c/d");
    bare(&mkdirs(root, "r.git"));
    mkdirs(root, "s/.git");
    settle();
    let start = scan(&l, None);
    let index = start.index.as_ref().unwrap();
    assert_eq!(index.dirs.len(), 8, "{index:?}");
    let decoded = Index::decode(&index.encode()).unwrap();
    assert_eq!(decoded.started, index.started);
    assert_eq!(decoded.dirs, index.dirs);
    let bytes = index.encode();
    for cut in [1, 9, bytes.len() / 2, bytes.len() - 1] {
        assert!(Index::decode(&bytes[..cut]).is_none(), "cut at {cut}");
    }
}

/// Times the walks of a tree: `SANDBOX_WALK_BENCH=/path cargo test -p sandbox-host --lib
/// walk_timing -- --ignored --nocapture`.
#[test]
#[ignore = "a timing probe for BENCHMARKS.md, not a test: run with SANDBOX_WALK_BENCH=<dir> and --ignored"]
fn walk_timing() {
    let root = PathBuf::from(std::env::var_os("SANDBOX_WALK_BENCH").unwrap());
    let runs = 9;
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let time = |f: &mut dyn FnMut()| {
        let t = std::time::Instant::now();
        f();
        t.elapsed().as_secs_f64() * 1000.0
    };
    let mut last = None;
    let full: Vec<f64> = (0..runs)
        .map(|_| {
            time(&mut || {
                last = Some(walk(&root, None, index::RACY, &mut |_, _, _, _, _| {}).unwrap())
            })
        })
        .collect();
    let (index, stats) = last.unwrap();
    println!(
        "full walk: median {:.1} ms ({stats:?}, {} directories recorded)",
        median(full),
        index.dirs.len()
    );
    let mut stats = None;
    let reused: Vec<f64> = (0..runs)
        .map(|_| {
            time(&mut || {
                stats = Some(
                    walk(&root, Some(&index), index::RACY, &mut |_, _, _, _, _| {})
                        .unwrap()
                        .1,
                )
            })
        })
        .collect();
    println!(
        "walk reusing the last: median {:.1} ms ({stats:?})",
        median(reused)
    );
    let file = std::env::temp_dir().join(format!("walk-bench-{}", std::process::id()));
    let store: Vec<f64> = (0..runs)
        .map(|_| time(&mut || index.store(&file).unwrap()))
        .collect();
    let load: Vec<f64> = (0..runs)
        .map(|_| time(&mut || assert!(Index::load(&file).is_some())))
        .collect();
    println!(
        "cache: {} bytes, store median {:.1} ms, load median {:.1} ms",
        std::fs::metadata(&file).unwrap().len(),
        median(store),
        median(load)
    );
    let _ = std::fs::remove_file(&file);
}
