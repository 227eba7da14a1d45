//! A commit made in the VM reaches `s/<branch>` on the host, and the watcher carries it to
//! `<branch>`: the host side for real, with a real repository and a real sandbox view, the
//! view's persistent git store layer filled by hand the way the guest's overlay writes it (no
//! VM boots here).

use std::path::Path;
use std::time::{Duration, Instant};

use sandbox_git::quarantine::StoreQuarantine;

use crate::common::{git, Repo};

/// A commit made in a clone of the view's branch, its loose objects copied into `upper`.
fn commit_into(repo: &Repo, child: &str, upper: &Path, message: &str) -> String {
    let scratch = repo.base.join("scratch");
    if !scratch.exists() {
        git(
            &repo.base,
            &[
                "clone",
                "-q",
                "-b",
                child,
                repo.main.to_str().unwrap(),
                scratch.to_str().unwrap(),
            ],
        );
    }
    std::fs::write(scratch.join("file"), message).unwrap();
    git(&scratch, &["add", "file"]);
    git(&scratch, &["commit", "-qm", message]);
    let head = git(&scratch, &["rev-parse", "HEAD"]);
    let objects = scratch.join(".git/objects");
    for dir in std::fs::read_dir(&objects).unwrap().flatten() {
        let name = dir.file_name().into_string().unwrap();
        if name.len() != 2 {
            continue;
        }
        for obj in std::fs::read_dir(dir.path()).unwrap().flatten() {
            let to = upper.join("objects").join(&name).join(obj.file_name());
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            let _ = std::fs::copy(obj.path(), &to);
        }
    }
    head
}

fn write_ref(upper: &Path, name: &str, oid: &str) {
    let path = upper.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, format!("{oid}\n")).unwrap();
}

#[test]
fn vm_commits_reach_the_child_branch_and_the_watcher_moves_the_task_branch() {
    let repo = Repo::new("app", "app-task");
    let view = repo.view(&repo.task);
    let layer = view.store_layer_dir();
    let upper = layer.join("upper");
    let private = repo.base.join("private");
    let child = view.child_ref();
    let before_main = git(&repo.main, &["rev-parse", "main"]);

    let (tx, rx) = std::sync::mpsc::channel();
    let _watcher = repo
        .views
        .watch(vec![view.clone()], move |e| {
            let _ = tx.send(e.describe());
        })
        .unwrap();

    // Session 1: the VM commits on s/<branch> and tries to move main.
    let q = StoreQuarantine::attach(&view.common_dir, Some(&child), &layer, &private).unwrap();
    let c1 = commit_into(&repo, &view.child_branch, &upper, "one");
    write_ref(&upper, &child, &c1);
    write_ref(&upper, "refs/heads/main", &c1);
    q.sync(true).unwrap();
    let report = q.report();
    assert_eq!(git(&repo.main, &["rev-parse", &child]), c1);
    assert_eq!(
        git(&repo.main, &["rev-parse", "main"]),
        before_main,
        "main must not move"
    );
    assert_eq!(report.refused.len(), 1, "{report:?}");
    drop(q);
    // The layer is the VM's and persists; the host's scratch is gone.
    assert!(upper.join(&child).exists());

    // The watcher fast-forwards <branch> (`task`) to s/task.
    let deadline = Instant::now() + Duration::from_secs(30);
    while git(&repo.main, &["rev-parse", &view.branch_ref()]) != c1 {
        assert!(
            Instant::now() < deadline,
            "the watcher did not move {}: {:?}",
            view.branch,
            rx.try_iter().collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Session 2 on the same persistent layer: what was applied reads as unchanged, a new
    // commit is applied.
    let q = StoreQuarantine::attach(&view.common_dir, Some(&child), &layer, &private).unwrap();
    q.sync(false).unwrap();
    assert!(
        q.report().applied.is_empty() && q.report().refused.len() == 1,
        "{:?}",
        q.report()
    );
    let c2 = commit_into(&repo, &view.child_branch, &upper, "two");
    write_ref(&upper, &child, &c2);
    q.sync(true).unwrap();
    assert_eq!(git(&repo.main, &["rev-parse", &child]), c2);
    git(&repo.main, &["fsck", "--strict", "--no-dangling"]);
}

#[test]
fn a_link_planted_in_place_of_the_layer_is_refused() {
    let repo = Repo::new("app", "app-task");
    let view = repo.view(&repo.task);
    let layer = view.store_layer_dir();
    std::fs::remove_dir_all(layer.join("upper")).unwrap();
    std::os::unix::fs::symlink(&view.common_dir, layer.join("upper")).unwrap();
    let err = StoreQuarantine::attach(
        &view.common_dir,
        Some(&view.child_ref()),
        &layer,
        &repo.base.join("p"),
    )
    .unwrap_err();
    assert!(err.to_string().contains("not a directory"), "{err}");
}

#[test]
fn a_link_planted_inside_the_layer_leads_no_mkdir_out() {
    let repo = Repo::new("app", "app-task");
    let view = repo.view(&repo.task);
    let layer = view.store_layer_dir();
    let outside = repo.base.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let refs = layer.join("upper/refs");
    let _ = std::fs::remove_dir_all(&refs);
    std::os::unix::fs::symlink(&outside, &refs).unwrap();
    let err = StoreQuarantine::attach(
        &view.common_dir,
        Some(&view.child_ref()),
        &layer,
        &repo.base.join("p"),
    )
    .unwrap_err();
    assert!(err.to_string().contains("not a directory"), "{err}");
    assert!(
        !outside.join("heads").exists(),
        "a directory was made through the link"
    );
}

/// The guest writes the directory holding its layer: after the host attached, it renames
/// `upper` and plants a link to another repository's `.git` under that name. The sync keeps
/// reading the directory it checked, so nothing of that repository — which the guest could
/// then read through the common dir — is imported, and what the guest really wrote still is.
#[test]
fn a_layer_swapped_for_a_link_after_attach_leads_the_sync_nowhere_else() {
    let repo = Repo::new("app", "app-task");
    let view = repo.view(&repo.task);
    let layer = view.store_layer_dir();
    let upper = layer.join("upper");
    let child = view.child_ref();
    // Another repository of the user's, with a commit and a branch of its own.
    let secret = repo.base.join("secret");
    std::fs::create_dir(&secret).unwrap();
    git(&secret, &["init", "-q", "-b", "secret-branch"]);
    std::fs::write(secret.join("key"), "the user's secret").unwrap();
    git(&secret, &["add", "key"]);
    git(&secret, &["commit", "-qm", "secret"]);
    let secret_head = git(&secret, &["rev-parse", "HEAD"]);

    let q = StoreQuarantine::attach(
        &view.common_dir,
        Some(&child),
        &layer,
        &repo.base.join("private"),
    )
    .unwrap();
    let moved = layer.join("moved");
    std::fs::rename(&upper, &moved).unwrap();
    std::os::unix::fs::symlink(secret.join(".git"), &upper).unwrap();
    let c1 = commit_into(&repo, &view.child_branch, &moved, "one");
    write_ref(&moved, &child, &c1);
    q.sync(true).unwrap();

    let has_secret = std::process::Command::new("git")
        .current_dir(&repo.main)
        .args(["cat-file", "-e", &secret_head])
        .status()
        .unwrap();
    assert!(
        !has_secret.success(),
        "the other repository's commit was imported"
    );
    let refs = git(&repo.main, &["for-each-ref", "--format=%(refname)"]);
    assert!(!refs.contains("secret-branch"), "{refs}");
    assert_eq!(
        git(&repo.main, &["rev-parse", &child]),
        c1,
        "what the guest wrote in the layer it holds is still taken"
    );
    let report = q.report();
    assert!(report.refused.is_empty(), "{report:?}");
}
