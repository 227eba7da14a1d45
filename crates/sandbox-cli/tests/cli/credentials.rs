//! `--credential NAME` and `credentials:` through the real binary: the definition is
//! resolved and its secret read on the host, a missing secret stops the run loudly (125,
//! naming every place looked at), and the secret never reaches the command's environment,
//! its arguments or the run's report — from the attacker's side, with the same run without
//! `--credential` as the control that shows the secret would otherwise be inside. The proxy
//! that adds the real key on the way out is tested on loopback in
//! `crates/sandbox-net/tests/proxy.rs`.

use crate::common;

use std::process::{Output, Stdio};

use common::escape::Fixture;
use common::text;

const SECRET: &str = "sk-ant-api03-the-real-secret-6a1d";

fn sandbox(f: &Fixture, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = f.env.cmd();
    cmd.current_dir(&f.task).args(args).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// What an attacker inside reads to find a key: the whole environment, every process's
/// arguments it can see, and the files under the home.
pub(crate) const LOOK: &str = "cat /proc/self/environ | tr '\\0' '\\n'; \
                    for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done; \
                    grep -rs sk-ant \"$HOME\" 2>/dev/null; true";

#[test]
fn a_missing_secret_stops_the_run_naming_every_place_looked() {
    let f = Fixture::new();
    let out = sandbox(&f, &[], &["run", "--credential", "anthropic", "--", "true"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--credential anthropic"), "{err}");
    assert!(err.contains("$ANTHROPIC_API_KEY is not set"), "{err}");
    assert!(
        err.contains(".config/sandbox/credentials/anthropic does not exist"),
        "{err}"
    );
    assert!(err.contains("sandbox:anthropic"), "{err}");

    // From the configuration, the same.
    f.env.write_config("credentials: [github]\n");
    let out = sandbox(&f, &[], &["run", "--", "true"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("$GITHUB_TOKEN is not set"), "{err}");
    assert!(err.contains("$GH_TOKEN is not set"), "{err}");
    f.env.write_config("");

    let out = sandbox(&f, &[], &["run", "--credential", "nope", "--", "true"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("anthropic, openai, google, github"),
        "{}",
        text(&out)
    );
    // An unknown name in the configuration is refused where the file is read.
    f.env.write_config("credentials: [nope]\n");
    let out = sandbox(&f, &[], &["run", "--", "true"]);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("credentials"),
        "{}",
        text(&out)
    );
}

#[test]
fn the_secret_never_enters_the_sandbox_only_its_placeholder() {
    let f = Fixture::new();
    let host_env = [("ANTHROPIC_API_KEY", SECRET)];
    // The user passes the variable in (or a pattern that matches it), as one does for an
    // agent today.
    let passing = ["--env", "ANTHROPIC_API_KEY", "--env", "ANTHROPIC_*"];

    // Control: without --credential the key is inside, and the look finds it.
    let args: Vec<&str> = ["run"]
        .into_iter()
        .chain(passing)
        .chain(["--", "sh", "-c", LOOK])
        .collect();
    let out = sandbox(&f, &host_env, &args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(SECRET),
        "the control run did not see the key: {}",
        text(&out)
    );

    let report = f.env.path().join("report.json");
    let args: Vec<&str> = ["run", "--credential", "anthropic", "--report-json"]
        .into_iter()
        .chain([report.to_str().unwrap()])
        .chain(passing)
        .chain(["--", "sh", "-c", LOOK])
        .collect();
    let out = sandbox(&f, &host_env, &args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains(SECRET), "the key is inside: {stdout}");
    assert!(!String::from_utf8_lossy(&out.stderr).contains(SECRET));
    assert!(
        stdout.contains("ANTHROPIC_API_KEY=sk-ant-sandbox-placeholder-anthropic"),
        "{stdout}"
    );
    // The base URL names the proxy inside the run's own network namespace.
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("ANTHROPIC_BASE_URL=http://127.0.0.1:")
                && l.ends_with("/cred/anthropic")),
        "{stdout}"
    );
    let report = std::fs::read_to_string(&report).unwrap();
    assert!(!report.contains(SECRET), "{report}");

    // `policy show` names the credential, never its secret.
    let out = sandbox(
        &f,
        &host_env,
        &["policy", "show", "--credential", "anthropic", "--json"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("\"credentials\""), "{shown}");
    assert!(!shown.contains(SECRET), "{shown}");
}

#[test]
fn a_secret_file_outside_every_grant_is_read_on_the_host() {
    let f = Fixture::new();
    let dir = f.home.join(".config/sandbox/credentials");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("openai"), "sk-proj-from-the-file-93b1\n").unwrap();
    let out = sandbox(
        &f,
        &[],
        &[
            "run",
            "--credential",
            "openai",
            "--",
            "sh",
            "-c",
            "echo \"key=$OPENAI_API_KEY\"; cat ~/.config/sandbox/credentials/openai; true",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("key=sk-sandbox-placeholder-openai"),
        "{stdout}"
    );
    assert!(!stdout.contains("from-the-file"), "{}", text(&out));
}

/// `SANDBOX_CREDENTIAL_<NAME>_HOST` that is not a host stops the run before anything starts,
/// naming the variable (the override itself is used in `net_user.rs`).
#[test]
fn a_malformed_credential_host_override_stops_the_run() {
    let f = Fixture::new();
    let marker = f.env.work().join("ran");
    let script = format!("echo ran > {}", marker.display());
    let out = sandbox(
        &f,
        &[
            ("ANTHROPIC_API_KEY", SECRET),
            (
                "SANDBOX_CREDENTIAL_ANTHROPIC_HOST",
                "https://gateway.test/v1",
            ),
        ],
        &[
            "run",
            "--credential",
            "anthropic",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("SANDBOX_CREDENTIAL_ANTHROPIC_HOST="),
        "{}",
        text(&out)
    );
    assert!(!marker.exists());
    assert!(!String::from_utf8_lossy(&out.stderr).contains(SECRET));
}
