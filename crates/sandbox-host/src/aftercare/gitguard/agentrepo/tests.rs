use super::*;
use std::os::unix::fs::symlink;
use std::process::Command;

/// `git` with the environment Gemini CLI 0.61.0 gives its shadow repository
/// (`GitService.getShadowRepoEnv`: its own global config, its command-line overrides).
fn shadow_git(repo: &Path, work: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new("git");
    cmd.args(args)
        .current_dir(work)
        .env("GIT_DIR", repo.join(".git"))
        .env("GIT_WORK_TREE", work)
        .env("GIT_CONFIG_GLOBAL", repo.join(".gitconfig"))
        .env("GIT_CONFIG_SYSTEM", repo.join(".gitconfig_system_empty"))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "Gemini CLI")
        .env("GIT_AUTHOR_EMAIL", "gemini-cli@google.com")
        .env("GIT_COMMITTER_NAME", "Gemini CLI")
        .env("GIT_COMMITTER_EMAIL", "gemini-cli@google.com");
    cmd.output().unwrap()
}

/// A checkpoint repository as Gemini CLI leaves it, with one checkpoint of `work`.
fn gemini_repo(root: &Path, work: &Path) -> PathBuf {
    let repo = root.join("project");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(
        repo.join(".gitconfig"),
        "[user]\n  name = Gemini CLI\n  email = gemini-cli@google.com\n[commit]\n  gpgsign = false\n",
    )
    .unwrap();
    std::fs::write(repo.join(".gitconfig_system_empty"), "").unwrap();
    std::fs::write(repo.join(".gitignore"), "target/\n").unwrap();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(args)
            .current_dir(&repo)
            .env("GIT_CONFIG_GLOBAL", repo.join(".gitconfig"))
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    git(&["init", "-q", "--initial-branch", "main"]);
    git(&["commit", "-q", "--allow-empty", "-m", "Initial commit"]);
    std::fs::write(work.join("a.txt"), "one\n").unwrap();
    assert!(shadow_git(&repo, work, &["add", "."]).status.success());
    let out = shadow_git(&repo, work, &["commit", "-q", "--no-verify", "-m", "cp"]);
    assert!(out.status.success(), "{out:?}");
    repo
}

#[test]
fn a_checkpoint_repository_as_the_agent_leaves_it_is_kept_whole() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let root = dir.path().join("history");
    let repo = gemini_repo(&root, &work);
    // opencode's snapshot repository beside it: its own config keys and shared objects.
    let snap = dir.path().join("snapshot/p/h");
    let out = Command::new("git")
        .args(["init", "-q", "--bare"])
        .arg(&snap)
        .output()
        .unwrap();
    assert!(out.status.success());
    for (k, v) in [
        ("core.autocrlf", "false"),
        ("core.longpaths", "true"),
        ("core.symlinks", "true"),
        ("core.fsmonitor", "false"),
        ("feature.manyFiles", "true"),
        ("index.version", "4"),
        ("index.threads", "true"),
        ("core.untrackedCache", "true"),
    ] {
        let out = Command::new("git")
            .arg("--git-dir")
            .arg(&snap)
            .args(["config", k, v])
            .output()
            .unwrap();
        assert!(out.status.success());
    }
    std::fs::write(
        snap.join("objects/info/alternates"),
        format!("{}\n", repo.join(".git/objects").display()),
    )
    .unwrap();
    // What `git gc` leaves there (opencode runs it to prune): a split commit-graph.
    std::fs::create_dir_all(snap.join("objects/info/commit-graphs")).unwrap();
    std::fs::write(
        snap.join("objects/info/commit-graphs/commit-graph-chain"),
        "",
    )
    .unwrap();
    let report = audit_agent_repos(&[root.clone(), dir.path().join("snapshot")]);
    assert_eq!(report, GitDirReport::default());
    // A link in it is set aside.
    let chain = snap.join("objects/info/commit-graphs/graph-x.graph");
    symlink("/dev/zero", &chain).unwrap();
    let report = audit_agent_repos(&[dir.path().join("snapshot")]);
    assert_eq!(report.set_aside.len(), 1, "{report:?}");
    assert!(chain.symlink_metadata().is_err());
    let out = shadow_git(&repo, &work, &["rev-parse", "HEAD~1"]);
    assert!(
        out.status.success(),
        "the checkpoints are still there: {out:?}"
    );
    assert!(snap.join("objects/info/alternates").is_file());
}

#[test]
fn what_would_run_code_on_the_host_is_set_aside_and_never_followed() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let root = dir.path().join("history");
    let repo = gemini_repo(&root, &work);
    let git = repo.join(".git");
    let marker = dir.path().join("marker");
    let evil = dir.path().join("evil");
    std::fs::write(
        &evil,
        format!("#!/bin/sh\necho ran >> {}\ncat\n", marker.display()),
    )
    .unwrap();
    std::fs::set_permissions(&evil, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // Each a way Gemini CLI's next checkpoint would run `evil` (or write through a link).
    let mut config = std::fs::read_to_string(git.join("config")).unwrap();
    config.push_str(&format!(
        "[filter \"x\"]\n\tclean = {0}\n[commit]\n\tgpgSign = true\n[gpg]\n\tprogram = {0}\n",
        evil.display()
    ));
    std::fs::write(git.join("config"), config).unwrap();
    std::fs::create_dir_all(git.join("info")).unwrap();
    std::fs::write(git.join("info/attributes"), "* filter=x\n").unwrap();
    std::fs::write(git.join("hooks/post-commit"), "#!/bin/sh\n").unwrap();
    std::fs::write(git.join("commondir"), "/elsewhere\n").unwrap();
    std::fs::write(git.join("objects/info/alternates"), "../../../x\n").unwrap();
    let victim = dir.path().join("bashrc");
    std::fs::write(&victim, "# mine\n").unwrap();
    std::fs::remove_file(repo.join(".gitignore")).unwrap();
    symlink(&victim, repo.join(".gitignore")).unwrap();
    // A second project's repository re-pointed by a `.git` file.
    std::fs::create_dir_all(root.join("other")).unwrap();
    std::fs::write(root.join("other/.git"), "gitdir: /tmp/evil\n").unwrap();
    std::fs::write(
        root.join("other/.gitconfig"),
        format!("[core]\n\tfsmonitor = {}\n", evil.display()),
    )
    .unwrap();

    let report = audit_agent_repos(std::slice::from_ref(&root));
    let moved: Vec<PathBuf> = report.set_aside.iter().map(|s| s.path.clone()).collect();
    for want in [
        git.join("config"),
        git.join("hooks/post-commit"),
        git.join("commondir"),
        git.join("objects/info/alternates"),
        repo.join(".gitignore"),
        root.join("other/.git"),
        root.join("other/.gitconfig"),
    ] {
        assert!(moved.contains(&want), "{}: {report:#?}", want.display());
        assert!(want.symlink_metadata().is_err(), "{}", want.display());
    }
    assert_eq!(moved.len(), 7, "{report:#?}");
    for s in &report.set_aside {
        let to = s.moved_to.as_ref().expect("moved");
        assert!(to.symlink_metadata().is_ok(), "{}", to.display());
        assert!(s.to_string().contains("set aside as"), "{s}");
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "# mine\n");
    // The next checkpoint, as the agent makes it, runs nothing and still lands.
    std::fs::write(work.join("a.txt"), "two\n").unwrap();
    assert!(shadow_git(&repo, &work, &["add", "."]).status.success());
    let out = shadow_git(&repo, &work, &["commit", "-q", "--no-verify", "-m", "cp2"]);
    assert!(out.status.success(), "{out:?}");
    assert!(!marker.exists(), "the planted program ran");
    // A second audit finds nothing more.
    assert_eq!(audit_agent_repos(&[root]), GitDirReport::default());
}

#[test]
fn only_the_data_keys_and_off_values_pass() {
    assert_eq!(
        config_problem(b"[core]\n\tbare = false\n[user]\n\tname = x\n"),
        None
    );
    assert_eq!(config_problem(b"[core]\n\tfsmonitor = false\n"), None);
    for bad in [
        &b"[core]\n\tfsmonitor = /x\n"[..],
        b"[core]\n\thooksPath = /x\n",
        b"[core] fsMonitor = /x\n",
        b"[include]\n\tpath = /x\n",
        b"[commit]\n\tgpgsign\n",
        b"[diff \"x\"]\n\ttextconv = /x\n",
        b"[core\n",
    ] {
        assert!(
            config_problem(bad).is_some(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    assert_eq!(alternates_problem(b"/r/.git/objects\n/s/objects\n"), None);
    for bad in [
        &b"x/objects\n"[..],
        b"/r/../objects\n",
        b"/r/hooks\n",
        b"\xff",
    ] {
        assert!(alternates_problem(bad).is_some());
    }
}
