//! What the user needs to know, through the real binary: a grant that exposes credentials,
//! an `--env NAME` that passes nothing, a remembered host backend, a missing `--`, and
//! `sandbox why PATH`.

use crate::common;

use std::process::{Output, Stdio};

use common::escape::Fixture;
use common::text;

fn sandbox(f: &Fixture, args: &[&str]) -> Output {
    f.env
        .cmd()
        .current_dir(&f.task)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_grant_exposing_credentials_warns_naming_them() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.home.join(".aws")).unwrap();
    std::fs::write(f.home.join(".aws/credentials"), "[default]\n").unwrap();
    let home = f.home.to_str().unwrap();
    let out = sandbox(&f, &["run", "--allow-read", home, "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let err = stderr(&out);
    assert!(
        err.contains("warning: the read grant ~ (granted on the command line)")
            && err.contains("~/.ssh (")
            && err.contains("~/.aws ("),
        "{err}"
    );
    // `policy show` says it too; a narrow grant says nothing.
    let out = sandbox(&f, &["policy", "show", "--allow-read", home]);
    assert!(stderr(&out).contains("~/.ssh ("), "{}", text(&out));
    std::fs::create_dir_all(f.home.join("notes")).unwrap();
    let notes = f.home.join("notes");
    let out = sandbox(
        &f,
        &["run", "--allow-read", notes.to_str().unwrap(), "--", "true"],
    );
    assert!(!stderr(&out).contains("warning"), "{}", text(&out));
    // From the configuration, too: the README's old `read_folders: [~/.cargo]`.
    std::fs::create_dir_all(f.home.join(".cargo")).unwrap();
    std::fs::write(
        f.home.join(".cargo/credentials.toml"),
        "[registry]\ntoken = \"x\"\n",
    )
    .unwrap();
    f.env.write_config("read_folders: [~/.cargo]\n");
    let out = sandbox(&f, &["run", "--", "true"]);
    assert!(
        stderr(&out).contains("~/.cargo (granted in the configuration)")
            && stderr(&out).contains("~/.cargo/credentials.toml"),
        "{}",
        text(&out)
    );
}

#[test]
fn an_unset_env_name_warns_and_a_set_one_does_not() {
    let f = Fixture::new();
    let out = f
        .env
        .cmd()
        .current_dir(&f.task)
        .env("SANDBOX_TEST_SET", "1")
        .args([
            "run",
            "--env",
            "SANDBOX_TEST_UNSET",
            "--env",
            "SANDBOX_TEST_SET",
            "--env",
            "SANDBOX_TEST_GIVEN=2",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let err = stderr(&out);
    assert!(
        err.contains("--env SANDBOX_TEST_UNSET: SANDBOX_TEST_UNSET is not set here"),
        "{err}"
    );
    assert!(
        !err.contains("SANDBOX_TEST_SET:") && !err.contains("GIVEN"),
        "{err}"
    );
}

#[test]
fn a_remembered_host_backend_says_no_isolation_on_every_run() {
    let f = Fixture::new();
    let out = sandbox(&f, &["use", "host"]);
    assert!(out.status.success(), "{}", text(&out));
    for _ in 0..2 {
        let out = sandbox(&f, &["run", "--", "true"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert!(
            stderr(&out).contains("no isolation") && stderr(&out).contains("sandbox use native"),
            "{}",
            text(&out)
        );
    }
    let out = sandbox(&f, &["exec", "--", "true"]);
    assert!(stderr(&out).contains("no isolation"), "{}", text(&out));
    assert!(out.stdout.is_empty(), "{}", text(&out));
    // Chosen on the command line it is said by the flag itself; the default is isolated.
    let out = sandbox(&f, &["run", "--backend", "host", "--", "true"]);
    assert!(!stderr(&out).contains("no isolation"), "{}", text(&out));
    sandbox(&f, &["use", "--clear"]);
    let out = sandbox(&f, &["run", "--", "true"]);
    assert!(!stderr(&out).contains("no isolation"), "{}", text(&out));
}

#[test]
fn a_missing_separator_says_where_to_put_it() {
    let f = Fixture::new();
    let out = sandbox(&f, &["run", "cargo", "build", "--release"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        stderr(&out).contains("put `--` before the command: sandbox run -- cargo build --release"),
        "{}",
        text(&out)
    );
    let out = sandbox(&f, &["exec", "--block-net", "pi-acp"]);
    assert!(
        stderr(&out).contains("sandbox exec --block-net -- pi-acp"),
        "{}",
        text(&out)
    );
    // A mistyped flag of ours, with the `--` in place: no such hint.
    let out = sandbox(&f, &["run", "--blok-net", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(!stderr(&out).contains("put `--`"), "{}", text(&out));
}

/// A flag people reach for that the sandbox spells another way gets the flag they meant, not
/// clap's nearest spelling (`--allow-net` is nearest `--allow-unix-sockets`).
#[test]
fn a_flag_meant_another_way_names_the_flag_that_does_it() {
    let f = Fixture::new();
    let out = sandbox(&f, &["run", "--allow-net", "example.com", "--", "true"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    let err = stderr(&out);
    assert!(
        err.contains("--block-net closes it, --allow-domain HOST opens only HOST")
            && !err.contains("--allow-unix-sockets"),
        "{}",
        text(&out)
    );
    let out = sandbox(&f, &["shell", "--offline"]);
    assert!(
        stderr(&out).contains("tip: --block-net gives"),
        "{}",
        text(&out)
    );
    // A plain typo keeps clap's own suggestion.
    let out = sandbox(&f, &["run", "--allow-rnead", "x", "--", "true"]);
    assert!(
        stderr(&out).contains("a similar argument exists: '--allow-read'"),
        "{}",
        text(&out)
    );
}

fn why(f: &Fixture, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["why", "--json"];
    all.extend_from_slice(args);
    let out = sandbox(f, &all);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn why_explains_what_decides_a_path_in_the_next_run() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.home.join(".claude")).unwrap();
    std::fs::write(f.home.join(".claude/settings.json"), "{}").unwrap();
    let at = |rel: &str| f.home.join(rel).display().to_string();

    let settings = why(&f, &[&at(".claude/settings.json"), "--agent", "claude"]);
    assert_eq!(settings["visible"], true, "{settings}");
    assert_eq!(settings["writable"], false, "{settings}");
    assert!(
        settings["because"][0]
            .as_str()
            .unwrap()
            .contains("Claude Code profile"),
        "{settings}"
    );
    let sessions = why(&f, &[&at(".claude/projects/s.jsonl"), "--agent", "claude"]);
    assert_eq!(sessions["writable"], true, "{sessions}");
    // Nothing was created by asking.
    assert!(!f.home.join(".claude/projects").exists());

    let worktree = why(&f, &["README"]);
    assert_eq!(worktree["writable"], true, "{worktree}");
    let hooks = why(
        &f,
        &[&f.common.join("hooks/pre-commit").display().to_string()],
    );
    // Under the git store quarantine a hook written inside lands in the run's layer only.
    assert!(
        hooks["decidedBy"]
            .as_str()
            .unwrap()
            .contains("never to the host's files"),
        "{hooks}"
    );
    // (The fixture lies under /tmp, which the view replaces with a private tmpfs.)
    let outside = why(&f, &[&f.outside.join("victim.txt").display().to_string()]);
    assert_eq!(outside["visible"], false, "{outside}");
    let ssh = why(&f, &[&at(".ssh/id_ed25519")]);
    assert!(
        ssh["decidedBy"]
            .as_str()
            .unwrap()
            .contains("not the host's file"),
        "{ssh}"
    );
    // The user's file leads: it is not visible; the path inside is the private home's.
    assert_eq!(ssh["hostFileVisible"], false, "{ssh}");
    let instead = ssh["insteadShows"].as_str().unwrap();
    assert!(
        instead != at(".ssh/id_ed25519") && instead.contains("/sandbox/homes/"),
        "{ssh}"
    );
    let said = sandbox(&f, &["why", &at(".ssh/id_ed25519")]);
    let said = String::from_utf8_lossy(&said.stdout);
    assert!(
        said.lines()
            .next()
            .is_some_and(|l| l.contains("your file is not visible in the next run")),
        "{said}"
    );
    // And a run agrees: the user's key is not what it reads there.
    std::fs::create_dir_all(f.home.join(".ssh")).unwrap();
    std::fs::write(f.home.join(".ssh/id_ed25519"), "the-users-own-key\n").unwrap();
    let read = sandbox(
        &f,
        &[
            "run",
            "--",
            "sh",
            "-c",
            &format!("cat '{}' || true", at(".ssh/id_ed25519")),
        ],
    );
    assert!(
        !String::from_utf8_lossy(&read.stdout).contains("the-users-own-key"),
        "{}",
        text(&read)
    );
    let granted = why(
        &f,
        &[
            &f.outside.join("victim.txt").display().to_string(),
            "--allow-read",
            &f.outside.display().to_string(),
        ],
    );
    assert_eq!(granted["visible"], true, "{granted}");
    assert_eq!(granted["writable"], false, "{granted}");
    assert!(
        granted["decidedBy"]
            .as_str()
            .unwrap()
            .contains("granted on the command line"),
        "{granted}"
    );

    // The answer is what a run finds.
    let f2 = &f;
    let probe = |path: &str| {
        let out = sandbox(
            f2,
            &[
                "run",
                "--agent",
                "claude",
                "--",
                "sh",
                "-c",
                &format!("test -w '{path}'"),
            ],
        );
        out.status.code() == Some(0)
    };
    assert!(!probe(&at(".claude/settings.json")));
    assert!(probe(&at(".claude/projects")));
}

/// `why` and a real run agree, path by path: whether the run reads the user's own file there,
/// and whether it may write it. The run checks each path the way a tool would (read it; make
/// its folder and open it for appending, writing nothing); the host's files carry content no
/// other file has.
#[test]
fn why_agrees_with_a_real_run_for_a_table_of_paths() {
    let f = Fixture::new();
    let cache = f.home.join(sandbox_testkit::home::CACHE_ENTRIES[1]);
    let paths = [
        f.task.join("README"),
        f.main.join("README"),
        f.outside.join("victim.txt"),
        f.common.join("config"),
        f.common.join("HEAD"),
        f.home.join(".ssh/id_ed25519"),
        f.home.join(".gitconfig"),
        cache,
        "/etc/passwd".into(),
        "/usr/bin/env".into(),
    ];
    let digest = |bytes: &[u8]| {
        use sha2::Digest;
        format!("{:x}", sha2::Sha256::digest(bytes))
    };
    let mut script = String::new();
    for p in &paths {
        let p = p.display();
        script.push_str(&format!(
            "if [ -r '{p}' ]; then sha256sum < '{p}' | cut -d' ' -f1; else echo unreadable; fi; \
             ( mkdir -p \"$(dirname '{p}')\" && : >> '{p}' ) 2>/dev/null && echo w1 || echo w0; "
        ));
    }
    let out = sandbox(&f, &["run", "--", "sh", "-c", &script]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2 * paths.len(), "{}", text(&out));
    for (i, p) in paths.iter().enumerate() {
        let answer = why(&f, &[&p.display().to_string()]);
        let host = digest(&std::fs::read(p).unwrap());
        let reads_the_users_file = lines[2 * i] == host;
        let writes = lines[2 * i + 1] == "w1";
        assert_eq!(
            (
                answer["hostFileVisible"].as_bool(),
                answer["writable"].as_bool()
            ),
            (Some(reads_the_users_file), Some(writes)),
            "{}: why says {answer}, the run read {} and {}",
            p.display(),
            lines[2 * i],
            lines[2 * i + 1]
        );
    }
}
