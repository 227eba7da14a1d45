//! The quarantine's host side against a real repository: what lands in the writable layer is
//! written here directly, as the overlay would write it (the overlay itself, the pins and the
//! attacks through them are tested end to end in sandbox-cli's escape suite). These cover what
//! a pin cannot: refs the sandbox could still write, objects that lie, and races with git on
//! the host.

// A panic is how a test or a benchmark reports failure; the workspace lints against
// unwrap/expect apply to shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use sandbox_git::quarantine::StoreQuarantine;
use sandbox_testkit::git;

struct Repo {
    _dir: tempfile::TempDir,
    main: PathBuf,
    common: PathBuf,
    /// A scratch clone in which the "sandbox" makes objects, copied into the layer by hand.
    scratch: PathBuf,
    private: PathBuf,
}

fn repo() -> Repo {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("main");
    std::fs::create_dir(&main).unwrap();
    git(&main, &["init", "-q", "-b", "trunk"]);
    std::fs::write(main.join("README"), "hello\n").unwrap();
    git(&main, &["add", "."]);
    git(&main, &["commit", "-qm", "init"]);
    git(&main, &["branch", "task"]);
    let scratch = dir.path().join("scratch");
    git(
        dir.path(),
        &[
            "clone",
            "-q",
            main.to_str().unwrap(),
            scratch.to_str().unwrap(),
        ],
    );
    let common = std::fs::canonicalize(main.join(".git")).unwrap();
    let private = dir.path().join("private");
    Repo {
        main,
        common,
        scratch,
        private,
        _dir: dir,
    }
}

/// A commit made in the scratch clone; its loose objects copied into the layer.
fn commit_into(repo: &Repo, upper: &Path, message: &str) -> String {
    std::fs::write(repo.scratch.join("file"), message).unwrap();
    git(&repo.scratch, &["add", "file"]);
    git(&repo.scratch, &["commit", "-qm", message]);
    let head = git(&repo.scratch, &["rev-parse", "HEAD"]);
    let objects = repo.scratch.join(".git/objects");
    for oid in git(&repo.scratch, &["rev-list", "--objects", "-1", "HEAD"])
        .lines()
        .chain(
            git(
                &repo.scratch,
                &["ls-tree", "-r", "HEAD", "--format=%(objectname)"],
            )
            .lines(),
        )
    {
        let oid = oid.split(' ').next().unwrap();
        let from = objects.join(&oid[..2]).join(&oid[2..]);
        if from.exists() {
            let to = upper.join("objects").join(&oid[..2]).join(&oid[2..]);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(&from, &to).unwrap();
        }
    }
    head
}

fn write_ref(upper: &Path, name: &str, oid: &str) {
    let path = upper.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, format!("{oid}\n")).unwrap();
}

fn rev(repo: &Repo, name: &str) -> String {
    git(&repo.main, &["rev-parse", "--verify", "-q", name])
}

#[test]
fn only_the_task_branch_and_new_refs_reach_the_repository() {
    let repo = repo();
    let trunk = rev(&repo, "trunk");
    let q = StoreQuarantine::prepare(&repo.common, Some("refs/heads/task"), &repo.private).unwrap();
    let upper = q.layers().upper.clone();
    assert_eq!(q.layers().pinned_refs, vec!["refs/heads/trunk".to_string()]);
    let commit = commit_into(&repo, &upper, "work");
    write_ref(&upper, "refs/heads/task", &commit);
    write_ref(&upper, "refs/heads/trunk", &commit);
    write_ref(&upper, "refs/heads/new", &commit);
    write_ref(&upper, "refs/tags/new-tag", &commit);
    q.sync(true).unwrap();
    let report = q.report();

    assert_eq!(rev(&repo, "task"), commit);
    assert_eq!(rev(&repo, "new"), commit);
    assert_eq!(rev(&repo, "new-tag"), commit);
    assert_eq!(rev(&repo, "trunk"), trunk, "trunk must not move");
    assert!(report.objects_imported >= 3, "{report:?}");
    let refused: Vec<&str> = report.refused.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(refused, vec!["refs/heads/trunk"], "{report:?}");
    git(&repo.main, &["fsck", "--strict", "--no-dangling"]);
    // The host's reflog of the task branch says where the update came from.
    let reflog = git(
        &repo.main,
        &["reflog", "show", "--format=%gs", "-1", "task"],
    );
    assert!(reflog.starts_with("sandbox: "), "{reflog}");
}

#[test]
fn a_ref_moved_on_the_host_during_the_run_is_not_overwritten() {
    let repo = repo();
    let q = StoreQuarantine::prepare(&repo.common, Some("refs/heads/task"), &repo.private).unwrap();
    let upper = q.layers().upper.clone();
    // The user commits on the task branch on the host meanwhile.
    std::fs::write(repo.main.join("README"), "host\n").unwrap();
    git(&repo.main, &["commit", "-qam", "host"]);
    git(&repo.main, &["branch", "-f", "task", "trunk"]);
    let host_task = rev(&repo, "task");
    let commit = commit_into(&repo, &upper, "sandbox");
    write_ref(&upper, "refs/heads/task", &commit);
    q.sync(true).unwrap();
    assert_eq!(rev(&repo, "task"), host_task);
    let report = q.report();
    assert!(
        report
            .refused
            .iter()
            .any(|r| r.name == "refs/heads/task" && r.reason.contains("moved on the host")),
        "{report:?}"
    );
}

#[test]
fn a_ref_created_on_the_host_during_the_run_is_not_the_runs() {
    let repo = repo();
    let q = StoreQuarantine::prepare(&repo.common, Some("refs/heads/task"), &repo.private).unwrap();
    let upper = q.layers().upper.clone();
    // Another task creates its branch after this run started (so it is not pinned here).
    git(&repo.main, &["branch", "other-task"]);
    let before = rev(&repo, "other-task");
    let commit = commit_into(&repo, &upper, "sandbox");
    write_ref(&upper, "refs/heads/other-task", &commit);
    q.sync(true).unwrap();
    assert_eq!(rev(&repo, "other-task"), before);
    assert_eq!(q.report().refused.len(), 1, "{:?}", q.report());
}

#[test]
fn an_object_whose_name_lies_never_replaces_one() {
    let repo = repo();
    let q = StoreQuarantine::prepare(&repo.common, Some("refs/heads/task"), &repo.private).unwrap();
    let upper = q.layers().upper.clone();
    let commit = commit_into(&repo, &upper, "lies");
    // The new blob's bytes under the name of a new, different object id.
    let blob = git(&repo.scratch, &["rev-parse", "HEAD:file"]);
    let liar = "0123456789abcdef0123456789abcdef01234567";
    let to = upper.join("objects").join(&liar[..2]).join(&liar[2..]);
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(upper.join("objects").join(&blob[..2]).join(&blob[2..]), &to).unwrap();
    // And garbage under the name of README's existing blob: skipped, the store has it.
    let readme = rev(&repo, "trunk:README");
    let existing = upper.join("objects").join(&readme[..2]).join(&readme[2..]);
    std::fs::create_dir_all(existing.parent().unwrap()).unwrap();
    std::fs::write(&existing, b"garbage").unwrap();
    q.sync(true).unwrap();
    let report = q.report();
    assert!(
        report
            .rejected_objects
            .iter()
            .any(|o| o.path.ends_with(&liar[2..]) && o.reason.contains("hashes to")),
        "{report:?}"
    );
    assert_eq!(git(&repo.main, &["cat-file", "blob", &readme]), "hello");
    assert!(!repo
        .common
        .join("objects")
        .join(&liar[..2])
        .join(&liar[2..])
        .exists());
    // The honest objects still arrived.
    git(&repo.main, &["cat-file", "-e", &commit]);
}

#[test]
fn a_pack_written_inside_is_taken_in_by_its_content() {
    let repo = repo();
    let q = StoreQuarantine::prepare(&repo.common, Some("refs/heads/task"), &repo.private).unwrap();
    let upper = q.layers().upper.clone();
    std::fs::write(repo.scratch.join("file"), "packed").unwrap();
    git(&repo.scratch, &["add", "file"]);
    git(&repo.scratch, &["commit", "-qm", "packed"]);
    let commit = git(&repo.scratch, &["rev-parse", "HEAD"]);
    // A full pack of the clone, as `git gc` inside would write one.
    git(&repo.scratch, &["repack", "-q", "-a", "-d"]);
    let packs = repo.scratch.join(".git/objects/pack");
    for entry in std::fs::read_dir(&packs).unwrap().flatten() {
        std::fs::copy(
            entry.path(),
            upper.join("objects/pack").join(entry.file_name()),
        )
        .unwrap();
    }
    write_ref(&upper, "refs/heads/task", &commit);
    q.sync(true).unwrap();
    assert_eq!(rev(&repo, "task"), commit, "{:?}", q.report());
    git(&repo.main, &["fsck", "--strict", "--no-dangling"]);
}

#[test]
fn the_layer_is_removed_with_the_quarantine() {
    let repo = repo();
    let q = StoreQuarantine::prepare(&repo.common, None, &repo.private).unwrap();
    let dir = q.layers().upper.parent().unwrap().to_path_buf();
    assert!(dir.is_dir());
    drop(q);
    assert!(!dir.exists());
}

#[test]
fn a_link_in_the_layer_never_makes_the_host_read_its_own_files() {
    let repo = repo();
    let q = StoreQuarantine::prepare(&repo.common, Some("refs/heads/task"), &repo.private).unwrap();
    let upper = q.layers().upper.clone();
    let commit = commit_into(&repo, &upper, "work");
    write_ref(&upper, "refs/heads/task", &commit);
    // The task branch's reflog is a link to a file of the host's whose last line is secret:
    // the host's reflog (which the sandbox can read) must not get that line.
    // (A link in a directory component: the final one alone would not be followed anyway.)
    let secrets = repo.main.parent().unwrap().join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    std::fs::write(secrets.join("task"), "x\tSECRET-LINE\n").unwrap();
    let heads = upper.join("logs/refs/heads");
    std::fs::remove_dir(&heads).unwrap();
    std::os::unix::fs::symlink(&secrets, &heads).unwrap();
    // And the whole refs/tags directory a link to a host directory holding a "ref".
    let elsewhere = repo.main.parent().unwrap().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("planted"), format!("{commit}\n")).unwrap();
    std::fs::remove_dir(upper.join("refs/tags")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, upper.join("refs/tags")).unwrap();
    q.sync(true).unwrap();
    assert_eq!(rev(&repo, "task"), commit);
    let reflog = git(
        &repo.main,
        &["reflog", "show", "--format=%gs", "-1", "task"],
    );
    assert!(!reflog.contains("SECRET"), "{reflog}");
    assert!(
        Command::new("git")
            .args(["rev-parse", "--verify", "-q", "refs/tags/planted"])
            .current_dir(&repo.main)
            .status()
            .unwrap()
            .code()
            != Some(0),
        "a ref read through a link was applied"
    );
}

#[test]
fn the_task_branch_moves_forward_over_a_commit_another_run_made() {
    let repo = repo();
    let q = StoreQuarantine::prepare(&repo.common, Some("refs/heads/task"), &repo.private).unwrap();
    let upper = q.layers().upper.clone();
    // Another run in the same worktree lands a commit first; this run builds on it.
    let theirs = commit_into(&repo, &upper, "theirs");
    git(
        &repo.main,
        &[
            "fetch",
            "-q",
            repo.scratch.to_str().unwrap(),
            &format!("{theirs}:refs/heads/task"),
            "--update-head-ok",
            "-f",
        ],
    );
    assert_eq!(rev(&repo, "task"), theirs);
    let ours = commit_into(&repo, &upper, "ours");
    write_ref(&upper, "refs/heads/task", &ours);
    q.sync(true).unwrap();
    assert_eq!(rev(&repo, "task"), ours, "{:?}", q.report());
    let applied = &q.report().applied[0];
    assert_eq!(applied.old.as_deref(), Some(theirs.as_str()));
}

#[test]
fn a_planted_packed_ref_name_never_leads_a_write_out_of_the_snapshot() {
    let r = repo();
    // An earlier run that could write packed-refs left a "ref" whose name climbs out.
    let trunk = rev(&r, "trunk");
    let packed = r.common.join("packed-refs");
    let mut text = std::fs::read_to_string(&packed).unwrap_or_default();
    text.push_str(&format!("{trunk} refs/heads/../../../../escaped\n"));
    std::fs::write(&packed, text).unwrap();
    let q = StoreQuarantine::prepare(&r.common, Some("refs/heads/task"), &r.private).unwrap();
    let snapshot = &q.layers().snapshot;
    // Where the name would have led from the snapshot and from its parents.
    for base in snapshot.ancestors().take(6) {
        assert!(!base.join("escaped").exists(), "{}", base.display());
    }
    assert!(
        !q.layers().pinned_refs.iter().any(|n| n.contains("..")),
        "{:?}",
        q.layers().pinned_refs
    );
}

/// A persistent layer (a Lima VM's git store layer) on a real overlay: the host's common dir
/// below, `layer/upper` on top, mounted with `userxattr` the way the guest's provisioning
/// mounts it, in a user and mount namespace of its own (root or not). `script` runs there
/// with `$C` the common dir, as git inside the VM would.
fn overlay_session(common: &Path, layer: &Path, script: &str) -> Option<String> {
    let probe = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "true"])
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        sandbox_testkit::skip(
            "overlay-userns",
            "no user namespaces here (unshare --user --map-root-user fails): no overlay to stack",
        );
        return None;
    }
    let full = format!(
        "set -eu\nmount -t overlay overlay -o \"lowerdir=$C,upperdir=$L/upper,workdir=$L/work,userxattr\" \"$C\"\n\
         export GIT_CONFIG_NOSYSTEM=1 GIT_AUTHOR_NAME=vm GIT_AUTHOR_EMAIL=vm@vm \
         GIT_COMMITTER_NAME=vm GIT_COMMITTER_EMAIL=vm@vm\ng() {{ git --git-dir=\"$C\" \"$@\"; }}\n{script}\n"
    );
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "sh", "-c", &full])
        .env("C", common)
        .env("L", layer)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the session in the overlay failed ({}): {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Some(stdout)
}

/// A persistent layer beside the repository, laid out as a view's (`upper/`, `work/`).
fn persistent_layer(repo: &Repo) -> PathBuf {
    let layer = repo.private.parent().unwrap().join("layer");
    for d in ["upper", "work"] {
        std::fs::create_dir_all(layer.join(d)).unwrap();
    }
    layer
}

fn kind_in(upper: &Path, rel: &str) -> String {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    match upper.join(rel).symlink_metadata() {
        Ok(m) if m.file_type().is_char_device() => format!("c {}", m.rdev()),
        Ok(m) if m.is_dir() => "dir".into(),
        Ok(_) => "file".into(),
        Err(_) => "absent".into(),
    }
}

/// The whole workflow inside, over the real overlay: a commit on the task branch, a new
/// branch (applied), then in a second mount of the layer that branch deleted, another of the host's
/// deleted, `git gc` (refs packed into the layer's own `packed-refs`, loose objects and the
/// host's pack pruned, each leaving a whiteout). The host reads the whiteouts as deletions:
/// the task branch keeps its new commit (not the value the host's `packed-refs` had), the
/// run's own branch is deleted, the host's is not, a branch the host moved meanwhile (packed
/// inside with the host's value) is no refusal, no whiteout is reported as a bad object.
#[test]
fn whiteouts_of_a_persistent_layer_on_a_real_overlay_are_deletions() {
    let repo = repo();
    // The host's repository has a pack and a packed ref as well as loose ones.
    git(&repo.main, &["branch", "keep"]);
    git(&repo.main, &["tag", "v1"]);
    git(&repo.main, &["pack-refs", "--all"]);
    git(&repo.main, &["gc", "-q"]);
    git(&repo.main, &["update-ref", "refs/heads/task", "trunk"]);
    let trunk = rev(&repo, "trunk");
    let layer = persistent_layer(&repo);
    let upper = layer.join("upper");

    let q = StoreQuarantine::attach(&repo.common, Some("refs/heads/task"), &layer, &repo.private)
        .unwrap();
    let Some(out) = overlay_session(
        &repo.common,
        &layer,
        r#"t=$(g commit-tree -p task -m one "task^{tree}")
g update-ref refs/heads/task "$t"
g update-ref refs/heads/feature "$t"
echo "$t""#,
    ) else {
        return;
    };
    let one = out.trim().to_string();
    q.sync(true).unwrap();
    assert_eq!(rev(&repo, "task"), one);
    assert_eq!(rev(&repo, "feature"), one);
    // Meanwhile the host moves a branch of its own; the sandbox's `git gc` will pack the value
    // it sees, the host's, which is no change of the sandbox's to refuse.
    git(&repo.main, &["update-ref", "refs/heads/trunk", &one]);

    // Session 2: the overlay mounted again on the same layer (the VM restarted) while the
    // host's quarantine of the command goes on.
    let Some(out) = overlay_session(
        &repo.common,
        &layer,
        r#"g branch -q -D feature keep
echo change >"$C/../two"; b=$(g hash-object -w "$C/../two")
tr=$(printf '100644 blob %s\ttwo\n' "$b" | g mktree)
t=$(g commit-tree -p task -m two "$tr")
g update-ref refs/heads/task "$t"
g gc -q --prune=now
g fsck --strict --no-dangling >&2
echo "$t""#,
    ) else {
        return;
    };
    let two = out.trim().to_string();
    // What the overlay left: whiteouts for the host's loose refs and its pack, a packed-refs
    // of the layer's own.
    assert_eq!(kind_in(&upper, "refs/heads/feature"), "c 0");
    assert_eq!(kind_in(&upper, "refs/heads/task"), "c 0");
    assert_eq!(kind_in(&upper, "packed-refs"), "file");
    let host_pack = std::fs::read_dir(repo.common.join("objects/pack"))
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(".pack"))
        .unwrap()
        .file_name();
    assert_eq!(
        kind_in(
            &upper,
            &format!("objects/pack/{}", host_pack.to_string_lossy())
        ),
        "c 0"
    );

    q.sync(true).unwrap();
    let report = q.report();
    assert_eq!(rev(&repo, "task"), two, "the task branch moves: {report:?}");
    let feature = Command::new("git")
        .current_dir(&repo.main)
        .args(["rev-parse", "--verify", "-q", "refs/heads/feature"])
        .output()
        .unwrap();
    assert!(
        !feature.status.success(),
        "the run's own branch is deleted: {report:?}"
    );
    assert_eq!(rev(&repo, "keep"), trunk, "the host's branch stays");
    assert_eq!(rev(&repo, "trunk"), one, "as the host moved it");
    assert_eq!(rev(&repo, "v1"), trunk);
    let refused: Vec<&str> = report.refused.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(refused, vec!["refs/heads/keep"], "{report:?}");
    assert!(report.rejected_objects.is_empty(), "{report:?}");
    git(&repo.main, &["fsck", "--strict", "--no-dangling"]);
}

/// Root inside the VM owns its layer: it deletes whole directories of refs (a whiteout over
/// `refs/tags`, an opaque `refs/heads` made anew), deletes `packed-refs`, and plants a link.
/// Every deletion of a ref the run does not own is refused and reported, the link is never
/// read, and the task branch it rewrote in the opaque directory is still taken.
#[test]
fn an_opaque_refs_dir_and_deleted_ref_dirs_delete_nothing_of_the_hosts() {
    let repo = repo();
    git(&repo.main, &["branch", "keep"]);
    git(&repo.main, &["branch", "nested/one"]);
    git(&repo.main, &["tag", "v1"]);
    git(&repo.main, &["tag", "v2"]);
    git(&repo.main, &["pack-refs"]);
    let trunk = rev(&repo, "trunk");
    let layer = persistent_layer(&repo);
    let upper = layer.join("upper");
    let q = StoreQuarantine::attach(&repo.common, Some("refs/heads/task"), &layer, &repo.private)
        .unwrap();
    let Some(out) = overlay_session(
        &repo.common,
        &layer,
        r#"t=$(g commit-tree -p task -m one "task^{tree}")
rm -rf "$C/refs/heads" "$C/refs/tags" "$C/packed-refs"
mkdir "$C/refs/heads"
echo "$t" >"$C/refs/heads/task"
ln -s /etc/passwd "$C/refs/heads/link"
echo "$t""#,
    ) else {
        return;
    };
    let one = out.trim().to_string();
    assert_eq!(kind_in(&upper, "refs/tags"), "c 0");
    assert_eq!(kind_in(&upper, "packed-refs"), "c 0");
    assert_eq!(kind_in(&upper, "refs/heads"), "dir");
    q.sync(true).unwrap();
    let report = q.report();
    assert_eq!(rev(&repo, "task"), one, "{report:?}");
    for kept in ["trunk", "keep", "nested/one", "v1", "v2"] {
        assert_eq!(rev(&repo, kept), trunk, "{kept}: {report:?}");
    }
    let mut refused: Vec<&str> = report.refused.iter().map(|r| r.name.as_str()).collect();
    refused.sort();
    assert_eq!(
        refused,
        vec![
            "refs/heads/keep",
            "refs/heads/link",
            "refs/heads/nested/one",
            "refs/heads/trunk",
            "refs/tags/v1",
            "refs/tags/v2",
        ],
        "{report:?}"
    );
    git(&repo.main, &["fsck", "--strict", "--no-dangling"]);
}
