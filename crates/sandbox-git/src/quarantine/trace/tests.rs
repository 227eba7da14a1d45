use super::*;

fn pins() -> (PathBuf, Vec<String>) {
    (
        PathBuf::from("/r/.git"),
        vec!["refs/heads/users".into(), "refs/tags/v1".into()],
    )
}

fn failure(argv: &[&str], errors: &[&str]) -> Failure {
    Failure {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        errors: errors.iter().map(|s| s.to_string()).collect(),
        pushed_to: Vec::new(),
    }
}

#[test]
fn a_line_only_when_git_names_a_pinned_file() {
    let (common, refs) = pins();
    let pins = Pins {
        common: &common,
        pinned_refs: &refs,
        push_remotes: &[],
    };
    let delete = failure(
        &["/usr/lib/git-core/git", "branch", "-D", "users"],
        &["could not delete reference refs/heads/users: unable to unlink '/r/.git/refs/heads/users': Device or resource busy"],
    );
    // Not a pin: a longer name, another repository, `packed-refs` (the run may write its
    // own), a failure of its own.
    let others = [
        failure(
            &["git", "gc"],
            &["error replacing /r/.git/packed-refs: Device or resource busy"],
        ),
        failure(
            &["git", "branch", "-D", "users2"],
            &["unable to unlink '/r/.git/refs/heads/users2': x"],
        ),
        failure(
            &["git", "gc"],
            &["error replacing /other/.git/packed-refs: Device or resource busy"],
        ),
        failure(&["git", "commit"], &["nothing to commit"]),
    ];
    let none = |_: &Path| None;
    let lines = explain(&[delete], &pins, &none);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("`git branch -D users`")
            && lines[0].contains("refs/heads/users is not this task's"),
        "{}",
        lines[0]
    );
    assert_eq!(explain(&others, &pins, &none), Vec::<String>::new());
}

#[test]
fn a_push_to_a_local_repository_names_the_flag_unless_granted() {
    let (common, refs) = pins();
    let granted = [PathBuf::from("/srv/granted.git")];
    let pins = Pins {
        common: &common,
        pinned_refs: &refs,
        push_remotes: &granted,
    };
    let repo = |p: &Path| {
        ["/srv/remote.git", "/srv/granted.git"]
            .contains(&p.to_str().unwrap())
            .then(|| p.to_path_buf())
    };
    let push = |to: &str| Failure {
        argv: vec!["git".into(), "push".into(), "origin".into()],
        errors: vec![format!("'{to}' does not appear to be a git repository")],
        pushed_to: vec![to.into()],
    };
    let lines = explain(&[push("/srv/remote.git")], &pins, &repo);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("`--allow-push /srv/remote.git`"),
        "{}",
        lines[0]
    );
    for quiet in [push("/srv/granted.git"), push("/srv/elsewhere.git")] {
        assert_eq!(explain(&[quiet], &pins, &repo), Vec::<String>::new());
    }
}

#[test]
fn words_are_quoted_for_a_shell() {
    assert_eq!(
        command_line(&["git".into(), "tag".into(), "-d".into(), "it's $(x)".into()]),
        "git tag -d 'it'\\''s $(x)'"
    );
}

#[test]
fn events_are_grouped_by_their_first_process_and_bounded() {
    let mut c = Collected::default();
    c.event(br#"{"event":"start","sid":"a","argv":["git","gc"]}"#);
    c.event(br#"{"event":"start","sid":"a/b","argv":["git","pack-refs"]}"#);
    c.event(br#"{"event":"error","sid":"a/b","msg":"one"}"#);
    c.event(br#"{"event":"error","sid":"a","msg":"two"}"#);
    c.event(br#"{"event":"start","sid":"a/c","argv":["git-receive-pack","/r.git"]}"#);
    c.event(b"not json");
    for i in 0..1000 {
        c.event(format!(r#"{{"event":"start","sid":"q{i}","argv":["git","status"]}}"#).as_bytes());
    }
    for _ in 0..100 {
        c.event(br#"{"event":"error","sid":"a","msg":"more"}"#);
    }
    assert!(c.trees.len() <= MAX_TREES);
    let failures = c.failures();
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].argv, ["git", "gc"]);
    assert_eq!(failures[0].errors.len(), MAX_ERRORS);
    assert_eq!(failures[0].errors[..2], ["one", "two"]);
    assert_eq!(failures[0].pushed_to, ["/r.git"]);
}

#[cfg(target_os = "linux")]
#[test]
fn real_git_reports_through_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let trace = GitTrace::listen(dir.path()).unwrap();
    let out = std::process::Command::new("git")
        .args(["-C", "/nonexistent-sandbox-dir", "status"])
        .env("GIT_TRACE2_EVENT", trace.target())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let failures = trace.finish();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(
        failures[0].argv[1..],
        ["-C", "/nonexistent-sandbox-dir", "status"]
    );
    assert!(
        !dir.path().read_dir().unwrap().any(|_| true),
        "the socket is removed"
    );
}
