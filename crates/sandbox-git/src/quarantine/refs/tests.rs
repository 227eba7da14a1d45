use std::collections::HashMap;

use git2::Oid;

use super::*;

fn oid(n: u8) -> Oid {
    Oid::from_bytes(&[n; 20]).unwrap()
}

fn start() -> HashMap<String, Option<Oid>> {
    [
        ("refs/heads/main".to_string(), Some(oid(1))),
        ("refs/heads/task".to_string(), Some(oid(2))),
        ("refs/tags/v1".to_string(), Some(oid(1))),
    ]
    .into()
}

fn verdict(
    name: &str,
    wanted: Option<Oid>,
    applied: &[(&str, Option<Oid>)],
    created: &[&str],
) -> RefVerdict {
    let applied = applied.iter().map(|(n, v)| (n.to_string(), *v)).collect();
    let created = created.iter().map(|n| n.to_string()).collect();
    judge(
        name,
        wanted,
        Some("refs/heads/task"),
        &start(),
        &applied,
        &created,
    )
}

#[test]
fn head_may_be_left_on_the_runs_own_branches_or_detached_only() {
    let exists =
        |name: &str| ["refs/heads/main", "refs/heads/task", "refs/heads/new"].contains(&name);
    let task = Some("refs/heads/task");
    let allowed = |found: &str| head_allowed(found, task, &["refs/heads/new"], exists);
    assert!(allowed("ref: refs/heads/task\n"));
    assert!(allowed("ref: refs/heads/new\n"), "created by the run");
    assert!(
        allowed("ref: refs/heads/unborn\n"),
        "does not exist: only a commit makes it"
    );
    assert!(allowed(&format!("{}\n", oid(7))), "detached");
    assert!(
        !allowed("ref: refs/heads/main\n"),
        "another existing branch"
    );
    assert!(!allowed("ref: refs/tags/v1\n"), "not a branch");
    assert!(!allowed("ref: refs/heads/../../x\n"), "not a ref name");
    assert!(!allowed("(symlink to /elsewhere)"));
    assert!(!allowed("(missing)"));
    assert!(
        !head_allowed("ref: refs/heads/main\n", None, &[], exists),
        "detached at the start"
    );
}

#[test]
fn the_task_branch_moves_but_is_not_deleted() {
    assert_eq!(
        verdict("refs/heads/task", Some(oid(3)), &[], &[]),
        RefVerdict::Apply {
            expected: Some(oid(2))
        }
    );
    assert_eq!(
        verdict(
            "refs/heads/task",
            Some(oid(4)),
            &[("refs/heads/task", Some(oid(3)))],
            &[]
        ),
        RefVerdict::Apply {
            expected: Some(oid(3))
        }
    );
    assert_eq!(
        verdict("refs/heads/task", Some(oid(2)), &[], &[]),
        RefVerdict::Unchanged
    );
    assert!(matches!(
        verdict("refs/heads/task", None, &[], &[]),
        RefVerdict::Refuse(_)
    ));
}

#[test]
fn other_existing_refs_never_change() {
    for name in ["refs/heads/main", "refs/tags/v1"] {
        assert!(
            matches!(verdict(name, Some(oid(9)), &[], &[]), RefVerdict::Refuse(_)),
            "{name}"
        );
        assert!(
            matches!(verdict(name, None, &[], &[]), RefVerdict::Refuse(_)),
            "{name}"
        );
        assert_eq!(verdict(name, Some(oid(1)), &[], &[]), RefVerdict::Unchanged);
    }
}

#[test]
fn refs_the_run_creates_are_its_own() {
    assert_eq!(
        verdict("refs/heads/side", Some(oid(5)), &[], &[]),
        RefVerdict::Apply { expected: None }
    );
    assert_eq!(
        verdict("refs/heads/side", None, &[], &[]),
        RefVerdict::Unchanged
    );
    let applied = [("refs/heads/side", Some(oid(5)))];
    assert_eq!(
        verdict(
            "refs/heads/side",
            Some(oid(6)),
            &applied,
            &["refs/heads/side"]
        ),
        RefVerdict::Apply {
            expected: Some(oid(5))
        }
    );
    assert_eq!(
        verdict("refs/heads/side", None, &applied, &["refs/heads/side"]),
        RefVerdict::Apply {
            expected: Some(oid(5))
        }
    );
    // Deleted and created again: still its own.
    let deleted = [("refs/heads/side", None)];
    assert_eq!(
        verdict(
            "refs/heads/side",
            Some(oid(7)),
            &deleted,
            &["refs/heads/side"]
        ),
        RefVerdict::Apply { expected: None }
    );
    assert!(matches!(
        verdict("HEAD", Some(oid(5)), &[], &[]),
        RefVerdict::Refuse(_)
    ));
}

#[test]
fn new_refs_only_as_branches_tags_or_the_stash() {
    for refused in [
        "refs/replace/0123456789012345678901234567890123456789",
        "refs/notes/commits",
        "refs/remotes/origin/evil",
        "refs/bisect/bad",
        "refs/evil",
        "refs/heads",
    ] {
        assert!(
            matches!(
                verdict(refused, Some(oid(5)), &[], &[]),
                RefVerdict::Refuse(_)
            ),
            "{refused}"
        );
    }
    for allowed in ["refs/heads/side", "refs/tags/v2", "refs/stash"] {
        assert_eq!(
            verdict(allowed, Some(oid(5)), &[], &[]),
            RefVerdict::Apply { expected: None },
            "{allowed}"
        );
    }
}

#[test]
fn a_new_ref_may_not_shadow_an_existing_one() {
    let host = [
        "refs/heads/main",
        "refs/tags/v1",
        "refs/remotes/origin/main",
        "refs/remotes/origin/HEAD",
        "refs/heads/dir/x",
    ];
    let exists = |n: &str| host.contains(&n);
    for (new, shadowed) in [
        ("refs/tags/main", "refs/heads/main"),
        ("refs/heads/v1", "refs/tags/v1"),
        ("refs/heads/origin/main", "refs/remotes/origin/main"),
        ("refs/tags/origin/main", "refs/remotes/origin/main"),
        ("refs/heads/origin", "refs/remotes/origin/HEAD"),
        ("refs/heads/origin/HEAD", "refs/remotes/origin/HEAD"),
        ("refs/heads/refs/heads/main", "refs/heads/main"),
        ("refs/heads/heads/main", "refs/heads/main"),
        ("refs/tags/tags/v1", "refs/tags/v1"),
        ("refs/heads/HEAD", "HEAD"),
        ("refs/tags/ORIG_HEAD", "ORIG_HEAD"),
    ] {
        assert_eq!(shadows(new, exists).as_deref(), Some(shadowed), "{new}");
        assert!(creation_refused(new, exists).is_some(), "{new}");
    }
    for fine in [
        "refs/heads/side",
        "refs/tags/v2",
        "refs/heads/dir/y",
        "refs/stash",
    ] {
        assert_eq!(shadows(fine, exists), None, "{fine}");
    }
    // Through the judge: the refs of the start count, and so do those the run applied.
    assert!(matches!(
        verdict("refs/tags/task", Some(oid(5)), &[], &[]),
        RefVerdict::Refuse(_)
    ));
    assert!(matches!(
        verdict(
            "refs/tags/side",
            Some(oid(5)),
            &[("refs/heads/side", Some(oid(4)))],
            &["refs/heads/side"]
        ),
        RefVerdict::Refuse(_)
    ));
    // A ref the run deleted no longer exists.
    assert_eq!(
        verdict(
            "refs/tags/side",
            Some(oid(5)),
            &[("refs/heads/side", None)],
            &["refs/heads/side"]
        ),
        RefVerdict::Apply { expected: None }
    );
}

#[test]
fn a_whiteout_falls_back_to_the_frozen_packed_refs() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let heads = dir.path().join("refs/heads");
    std::fs::create_dir_all(&heads).unwrap();
    std::fs::write(heads.join("task"), format!("{}\n", oid(3))).unwrap();
    std::fs::write(heads.join("task.lock"), "x").unwrap();
    std::fs::write(heads.join("junk"), "not an id\n").unwrap();
    symlink("/etc/passwd", heads.join("link")).unwrap();
    nix::unistd::mkfifo(&heads.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let packed: HashMap<String, Oid> = [("refs/heads/old".to_string(), oid(1))].into();
    let found: HashMap<String, Wanted> = changed(dir.path(), &packed, None, None)
        .into_iter()
        .collect();
    assert_eq!(found["refs/heads/task"], Wanted::Value(Some(oid(3))));
    assert!(!found.contains_key("refs/heads/task.lock"));
    for bad in ["refs/heads/junk", "refs/heads/link", "refs/heads/fifo"] {
        assert!(
            matches!(found[bad], Wanted::Unreadable(_)),
            "{bad}: {:?}",
            found[bad]
        );
    }
}
