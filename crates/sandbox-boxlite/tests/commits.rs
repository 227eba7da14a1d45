//! Commits from a box, everything but the boot: the box's mount list
//! (`sandbox_boxlite::git::commit_mounts`) is applied with bubblewrap, real git inside writes
//! as a box's git would, and the host side — the generation's layout and its read-back by the
//! store quarantine (`sandbox_git::quarantine::generation`) — is the system under test. Each
//! attack is made from inside; the task branch moves on the host and nothing else does.

// A panic is how a test reports failure; the workspace lints against unwrap/expect apply to
// shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use sandbox_boxlite::git::{commit_mounts, git_mounts, order_for_guest, CommitDirs, GitData};
use sandbox_boxlite::spec::{check_mount, Mount};
use sandbox_git::quarantine::generation::{BoxGit, Generation, GenerationEnd};
use sandbox_testkit::git;

/// A repository with one commit on `main` and a linked worktree `task` on branch `task`.
struct Repo {
    dir: tempfile::TempDir,
    main: PathBuf,
    task: PathBuf,
    common: PathBuf,
}

fn repo() -> Repo {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("main");
    std::fs::create_dir(&main).unwrap();
    std::fs::write(main.join("README"), "hello\n").unwrap();
    let task = dir.path().join("task");
    sandbox_testkit::linked_worktree(&main, &task);
    Repo {
        main: main.canonicalize().unwrap(),
        task: task.canonicalize().unwrap(),
        common: main.join(".git").canonicalize().unwrap(),
        dir,
    }
}

/// Whether bubblewrap can apply a mount list here; a skip otherwise.
fn bwrap_works(id: &str) -> bool {
    let ok = Command::new("bwrap")
        .args(["--ro-bind", "/", "/", "--dev", "/dev", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        sandbox_testkit::skip(id, "bwrap cannot make a mount namespace here");
    }
    ok
}

/// The layout as `box.create` discovers it.
fn git_data(workdir: &Path) -> GitData {
    let found = sandbox_policy::git::discover(workdir).unwrap().unwrap();
    GitData {
        common_dir: found.layout.common_dir.clone(),
        pointers: found
            .layout
            .pointers
            .iter()
            .map(|f| f.path.clone())
            .collect(),
        hooks_path: found.layout.hooks_path.clone(),
    }
}

/// Runs `script` in "the box": the image read-only (here: this host's root), the box's
/// mounts applied in their order, git blind to the host's configuration. Returns stdout.
fn in_box(mounts: &[Mount], cwd: &Path, script: &str) -> (bool, String, String) {
    let mut cmd = Command::new("bwrap");
    cmd.args(["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]);
    for m in mounts {
        cmd.arg(if m.read_only { "--ro-bind" } else { "--bind" })
            .arg(&m.host)
            .arg(&m.guest);
    }
    let out = cmd
        .arg("--chdir")
        .arg(cwd)
        .args(["sh", "-c", script])
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "Box")
        .env("GIT_AUTHOR_EMAIL", "box@example.com")
        .env("GIT_COMMITTER_NAME", "Box")
        .env("GIT_COMMITTER_EMAIL", "box@example.com")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A box over `repo`'s task worktree whose commits come back: its git directories, the
/// first busy period begun, and its mount list.
struct Box_ {
    git: BoxGit,
    generation: Option<Generation>,
    mounts: Vec<Mount>,
    records: PathBuf,
    scratch: PathBuf,
}

fn open_box(repo: &Repo) -> Box_ {
    let root = repo.dir.path().join("box");
    let records = repo.dir.path().join("records");
    let scratch = repo.dir.path().join("scratch");
    let gitdir = repo.common.join("worktrees/task");
    let git = BoxGit::new(&repo.common, &gitdir, &root).unwrap();
    let generation = Generation::begin(&git, &[&records], &scratch).unwrap();
    let data = git_data(&repo.task);
    let commits = CommitDirs {
        writable: git.writable(),
        pointer: git.pointer(),
        dot_git: repo.task.join(".git"),
    };
    let mut mounts = vec![check_mount(&repo.task, &repo.task, false).unwrap()];
    mounts.extend(commit_mounts(&data, &repo.task, &commits).unwrap());
    order_for_guest(&mut mounts);
    Box_ {
        git,
        generation: Some(generation),
        mounts,
        records,
        scratch,
    }
}

impl Box_ {
    fn run(&self, repo: &Repo, script: &str) -> String {
        let (ok, out, err) = in_box(&self.mounts, &repo.task, script);
        assert!(ok, "the box's script failed: {err}");
        out
    }

    fn end(&mut self) -> GenerationEnd {
        self.generation.take().unwrap().end()
    }

    fn begin(&mut self) {
        self.generation =
            Some(Generation::begin(&self.git, &[&self.records], &self.scratch).unwrap());
    }
}

fn rev(dir: &Path, name: &str) -> String {
    git(dir, &["rev-parse", "--verify", "-q", name])
}

fn exists(dir: &Path, name: &str) -> bool {
    sandbox_testkit::git_command(dir)
        .args(["rev-parse", "--verify", "-q", name])
        .output()
        .unwrap()
        .status
        .success()
}

#[test]
fn a_commit_in_the_box_moves_the_task_branch_and_nothing_else_the_box_wrote_is_taken() {
    if !bwrap_works("commits::a_commit_in_the_box") {
        return;
    }
    let repo = repo();
    let main_before = rev(&repo.main, "refs/heads/main");
    let pointer_before = std::fs::read_to_string(repo.task.join(".git")).unwrap();
    let secret = repo.dir.path().join("secret");
    std::fs::write(&secret, "0123456789012345678901234567890123456789\n").unwrap();
    let pwned = repo.dir.path().join("pwned");
    let mut b = open_box(&repo);
    let script = format!(
        r#"set -e
echo change >> README
git commit -qam "from the box"
G=$(git rev-parse --git-common-dir)
# A host branch moved, a new branch, a new symbolic ref to a host branch.
git update-ref refs/heads/main HEAD
git branch made-in-box
git symbolic-ref refs/heads/alias refs/heads/main
# A config and a hook in the generation (they would run on the host's next git command).
git config core.fsmonitor "touch {pwned}"
rm "$G/hooks" && mkdir "$G/hooks"
printf '#!/bin/sh\ntouch {pwned}\n' > "$G/hooks/post-checkout" && chmod +x "$G/hooks/post-checkout"
# The real common dir is read-only here, and so is the worktree's .git.
if touch "{common}/hooks/post-checkout" 2>/dev/null; then echo "common dir writable"; exit 1; fi
if (printf 'gitdir: /elsewhere\n' > .git) 2>/dev/null; then echo ".git writable"; exit 1; fi
# A link planted in the generation, to a file of the host's.
ln -s {secret} "$G/refs/heads/leak"
git rev-parse HEAD"#,
        pwned = pwned.display(),
        common = repo.common.display(),
        secret = secret.display(),
    );
    let commit = b.run(&repo, &script);
    // Before the end of the busy period the host has none of it.
    assert_eq!(rev(&repo.main, "refs/heads/task"), main_before);
    let end = b.end();
    let report = end.store.unwrap();
    assert_eq!(end.notes, Vec::<String>::new());
    // The task branch moved, to the box's commit, whose objects are in the repository now.
    assert_eq!(rev(&repo.main, "refs/heads/task"), commit);
    git(
        &repo.main,
        &["cat-file", "-e", &format!("{commit}^{{tree}}")],
    );
    assert_eq!(report.task_branch.as_deref(), Some("refs/heads/task"));
    // A new branch is the task's own; a host branch stays; a symbolic ref is never made.
    assert_eq!(rev(&repo.main, "refs/heads/made-in-box"), commit);
    assert_eq!(rev(&repo.main, "refs/heads/main"), main_before);
    assert!(!exists(&repo.main, "refs/heads/alias"));
    assert!(!exists(&repo.main, "refs/heads/leak"));
    let refused: Vec<&str> = report.refused.iter().map(|r| r.name.as_str()).collect();
    for name in ["refs/heads/alias", "refs/heads/leak", "refs/heads/main"] {
        assert!(refused.contains(&name), "{name} refused: {report:?}");
    }
    // Nothing of the generation's config or hooks reached the repository, nor the pointer.
    let config = std::fs::read_to_string(repo.common.join("config")).unwrap();
    assert!(!config.contains("fsmonitor"), "{config}");
    assert!(!repo.common.join("hooks/post-checkout").exists());
    assert_eq!(
        std::fs::read_to_string(repo.task.join(".git")).unwrap(),
        pointer_before
    );
    git(&repo.task, &["checkout", "-q", "-b", "after"]);
    assert!(
        !pwned.exists(),
        "a hook or config of the box ran on the host"
    );
    // The index came back: the host's git sees the box's commit as clean.
    assert_eq!(git(&repo.task, &["status", "--porcelain"]), "");
    // The generation is gone from the box's directory; `current` names nothing.
    assert!(!b.git.writable().join("current").exists());
}

#[test]
fn head_may_move_to_a_branch_of_the_task_but_not_to_a_host_branch() {
    if !bwrap_works("commits::head_may_move") {
        return;
    }
    let repo = repo();
    let mut b = open_box(&repo);
    b.run(&repo, "git symbolic-ref HEAD refs/heads/main");
    let end = b.end();
    end.store.unwrap();
    assert_eq!(end.notes.len(), 1, "{:?}", end.notes);
    assert!(end.notes[0].contains("does not own"), "{:?}", end.notes);
    let head = repo.common.join("worktrees/task/HEAD");
    assert_eq!(
        std::fs::read_to_string(&head).unwrap(),
        "ref: refs/heads/task\n"
    );
    // The next busy period: a branch the box makes is the task's, and HEAD may name it.
    b.begin();
    b.run(
        &repo,
        "git checkout -q -b feature && git commit -q --allow-empty -m f",
    );
    let end = b.end();
    end.store.unwrap();
    assert_eq!(end.notes, Vec::<String>::new());
    assert_eq!(
        std::fs::read_to_string(&head).unwrap(),
        "ref: refs/heads/feature\n"
    );
    assert!(exists(&repo.main, "refs/heads/feature"));
}

#[test]
fn a_generation_replaced_by_a_link_or_an_index_link_takes_nothing() {
    if !bwrap_works("commits::a_generation_replaced") {
        return;
    }
    let repo = repo();
    // Another repository of the user's, with a branch the box would like imported.
    let other = repo.dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    git(&other, &["init", "-q", "-b", "secret"]);
    git(&other, &["commit", "-q", "--allow-empty", "-m", "private"]);
    let private = rev(&other, "refs/heads/secret");
    let mut b = open_box(&repo);
    let script = format!(
        r#"set -e
W={writable}
GEN=$(readlink "$W/current")
mv "$W/$GEN" "$W/moved"
ln -s {other}/.git "$W/$GEN""#,
        writable = b.git.writable().display(),
        other = other.display(),
    );
    b.run(&repo, &script);
    let end = b.end();
    let e = end.store.unwrap_err().to_string();
    assert!(e.contains("not a directory"), "{e}");
    assert!(!exists(&repo.main, &format!("{private}^{{commit}}")));
    assert!(!exists(&repo.main, "refs/heads/secret"));
    assert!(
        other.join(".git").is_dir(),
        "the link's target is left alone"
    );

    // An index replaced by a link to a file of the host's is not copied back.
    let index_before = std::fs::read(repo.common.join("worktrees/task/index")).unwrap();
    let secret = repo.dir.path().join("secret");
    std::fs::write(&secret, "DIRC not really an index").unwrap();
    b.begin();
    let script = format!(
        r#"set -e
G=$(git rev-parse --git-dir)
ln -sf {secret} "$G/index""#,
        secret = secret.display()
    );
    b.run(&repo, &script);
    let end = b.end();
    end.store.unwrap();
    assert_eq!(end.notes.len(), 1, "{:?}", end.notes);
    assert!(end.notes[0].contains("index"), "{:?}", end.notes);
    assert_eq!(
        std::fs::read(repo.common.join("worktrees/task/index")).unwrap(),
        index_before
    );
}

/// The control: with the common dir writable in the box (`unprotectedGit`'s mounts), the
/// same hook lands in the repository — the attacks above are real, and the generation is
/// what stops them.
#[test]
fn control_with_the_common_dir_writable_the_hook_lands() {
    if !bwrap_works("commits::control") {
        return;
    }
    let repo = repo();
    let data = git_data(&repo.task);
    let mut mounts = vec![check_mount(&repo.task, &repo.task, false).unwrap()];
    mounts.extend(git_mounts(&data, &repo.task, true).unwrap());
    order_for_guest(&mut mounts);
    let script = "G=$(git rev-parse --git-common-dir) && printf '#!/bin/sh\\n' > \"$G/hooks/post-checkout\" && git commit -q --allow-empty -m c && git update-ref refs/heads/main HEAD";
    let (ok, _, err) = in_box(&mounts, &repo.task, script);
    assert!(ok, "{err}");
    assert!(repo.common.join("hooks/post-checkout").exists());
    assert_eq!(
        rev(&repo.main, "refs/heads/main"),
        rev(&repo.main, "refs/heads/task")
    );
}
