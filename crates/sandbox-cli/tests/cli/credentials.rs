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

/// The host's GitHub token of the git tests.
const GITHUB_SECRET: &str = "ghp_theRealHostToken0123456789abcdefABCD";
/// What the sandbox holds instead (`sandbox_net::credentials`, `github`).
const GITHUB_PLACEHOLDER: &str = "ghp_sandboxplaceholdergithub";

/// A fixture, the test CA, and the stand-in git host (real `git http-backend` behind that CA)
/// that takes only the host's token.
fn fixture_with_git_host() -> (
    Fixture,
    sandbox_testkit::net::TestCa,
    sandbox_testkit::git_host::GitHost,
) {
    let f = Fixture::new();
    let ca = sandbox_testkit::net::TestCa::new(&f.env.path().join("ca"), &["127.0.0.1"]);
    let host = sandbox_testkit::git_host::GitHost::start(
        &ca,
        &f.env.path().join("githost"),
        GITHUB_SECRET,
    );
    (f, ca, host)
}

/// `--credential github` and git over HTTPS: a clone and a push of `https://github.com/o/r.git`
/// work through the run's proxy — real git inside, the real proxy, and a real TLS git host
/// (`git http-backend` behind the test CA, standing in for github.com through
/// `SANDBOX_CREDENTIAL_GITHUB_GIT_HOST`) that takes only the host's token as HTTP Basic
/// credentials. The host saw the real token; inside, the environment and git's configuration
/// hold only the placeholder, and a request body that carries the placeholder reaches the host
/// as sent (only the header is rewritten).
#[test]
fn git_push_with_credential_github_reaches_the_host_with_its_token() {
    let (f, ca, host) = fixture_with_git_host();
    let bare = host.repository("o/r.git");
    let port = host.port.to_string();
    let script = "set -e; cd \"$TMPDIR\"; \
        git clone -q https://github.com/o/r.git; cd r; \
        git -c user.name=T -c user.email=t@example.com commit -q --allow-empty \
            -m \"pushed with $GITHUB_TOKEN\"; \
        git push -q; echo pushed; \
        curl -s -o /dev/null --data-binary \"key=$GITHUB_TOKEN\" \
            \"${GITHUB_API_URL%/github}/github-git/o/r.git/git-upload-pack\"; \
        echo '--- fill'; printf 'url=%s/github-git/o/r.git\n\n' \"${GITHUB_API_URL%/github}\" \
            | git credential fill; \
        echo '--- env'; env; echo '--- git config'; git config --list --show-origin";
    let out = sandbox(
        &f,
        &[
            ("GITHUB_TOKEN", GITHUB_SECRET),
            (
                "SANDBOX_CREDENTIAL_GITHUB_GIT_HOST",
                &format!("127.0.0.1:{port}"),
            ),
            ("SANDBOX_CREDENTIAL_CA", ca.pem_file.to_str().unwrap()),
        ],
        &["run", "--credential", "github", "--", "sh", "-c", script],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("pushed"),
        "{}\nthe git host saw:\n{}",
        text(&out),
        host.summary()
    );
    // The commit is on the host's repository.
    assert_eq!(
        sandbox_testkit::git(&bare, &["log", "-1", "--format=%s", "main"]),
        format!("pushed with {GITHUB_PLACEHOLDER}")
    );
    // Every request the git host took carried the real token, and none the placeholder.
    let seen = host.seen();
    let pushes: Vec<_> = seen
        .iter()
        .filter(|s| s.path.ends_with("/git-receive-pack"))
        .collect();
    assert!(!pushes.is_empty(), "{}", host.summary());
    let real = format!(
        "Basic {}",
        base64_of(&format!("x-access-token:{GITHUB_SECRET}"))
    );
    let placeholder_basic = base64_of(&format!("x-access-token:{GITHUB_PLACEHOLDER}"));
    for s in &seen {
        assert_eq!(
            s.header("authorization"),
            Some(real.as_str()),
            "{}",
            host.summary()
        );
        // The real host's name (here the stand-in's), not the proxy's.
        assert_eq!(
            s.header("host"),
            Some(format!("127.0.0.1:{port}").as_str()),
            "{:?}",
            s.headers
        );
        let headers = format!("{:?}", s.headers);
        assert!(
            !headers.contains(GITHUB_PLACEHOLDER) && !headers.contains(&placeholder_basic),
            "{headers}"
        );
    }
    // The body is never rewritten: what the program sent is what the host got.
    assert!(
        seen.iter()
            .any(|s| s.body == format!("key={GITHUB_PLACEHOLDER}")),
        "{}",
        host.summary()
    );
    assert!(seen.iter().all(|s| !s.body.contains(GITHUB_SECRET)));
    // Inside: only the placeholder, in the environment and in git's configuration, which
    // sends github.com to the proxy's git route.
    assert!(
        !stdout.contains(GITHUB_SECRET),
        "the token is inside: {stdout}"
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains(GITHUB_SECRET));
    assert!(
        stdout.contains(&format!("GITHUB_TOKEN={GITHUB_PLACEHOLDER}")),
        "{stdout}"
    );
    // git's own question for the route gets the placeholder, from the run's helper alone.
    let fill = stdout
        .split("--- fill")
        .nth(1)
        .and_then(|s| s.split("--- env").next())
        .unwrap_or_default();
    assert!(
        fill.contains("username=x-access-token")
            && fill.contains(&format!("password={GITHUB_PLACEHOLDER}")),
        "{fill}"
    );
    let config = stdout.split("--- git config").nth(1).unwrap_or_default();
    assert!(
        config.lines().any(|l| l.contains("url.http://127.0.0.1:")
            && l.contains("/cred/github-git/.insteadof=https://github.com/")),
        "{config}"
    );
    assert!(
        config.contains(&format!("password={GITHUB_PLACEHOLDER}")),
        "{config}"
    );
}

/// The control of the test above: the same git inside, sent straight to the git host (its
/// port relayed in, its certificate not checked) without `--credential github`, cannot
/// authenticate — nothing inside holds the token — and the repository is unchanged; with
/// the host's token passed in (`--env GITHUB_TOKEN`) the same clone works, so only the
/// token was missing.
#[test]
fn without_credential_github_git_inside_cannot_authenticate() {
    let (f, _ca, host) = fixture_with_git_host();
    let bare = host.repository("o/r.git");
    let before = sandbox_testkit::git(&bare, &["rev-parse", "main"]);
    let port = host.port.to_string();
    let script = format!(
        "cd \"$TMPDIR\" && git -c url.https://127.0.0.1:{port}/.insteadOf=https://github.com/ \
         -c http.sslVerify=false \
         -c credential.helper='!f() {{ echo username=x-access-token; echo password=$GITHUB_TOKEN; }}; f' \
         clone -q https://github.com/o/r.git && echo cloned"
    );
    let host_env = [
        ("GITHUB_TOKEN", GITHUB_SECRET),
        ("GIT_TERMINAL_PROMPT", "0"),
    ];
    let base = ["run", "--block-net", "--allow-port", port.as_str()];
    let args: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--", "sh", "-c", &script])
        .collect();
    let out = sandbox(&f, &host_env, &args);
    assert!(
        !out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("cloned"),
        "{}",
        text(&out)
    );
    let refused = host.seen();
    assert!(
        !refused.is_empty(),
        "the host was not reached: {}",
        text(&out)
    );
    assert!(refused.iter().all(|s| s
        .header("authorization")
        .is_none_or(|a| !a.contains(&base64_of(&format!("x-access-token:{GITHUB_SECRET}"))))));
    assert_eq!(sandbox_testkit::git(&bare, &["rev-parse", "main"]), before);

    let args: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--env", "GITHUB_TOKEN", "--", "sh", "-c", &script])
        .collect();
    let out = sandbox(&f, &host_env, &args);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("cloned"),
        "{}\n{}",
        text(&out),
        host.summary()
    );
}

fn base64_of(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}
