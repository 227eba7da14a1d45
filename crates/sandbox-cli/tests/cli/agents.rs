//! Agent profiles through the real binary: the real agent CLIs from npm (`.ci/run` installs
//! them under `/opt/sandbox-agents`, or `SANDBOX_AGENT_CLIS`) start inside with their
//! profiles, and what a profile keeps read-only cannot be changed from inside — from the
//! attacker's side, with `--backend host` as the control that shows the same writes land.

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::escape::Fixture;
use common::text;

/// Where the agent CLIs are installed (`npm install -g --prefix DIR`, `.ci/run`).
fn clis() -> PathBuf {
    std::env::var_os("SANDBOX_AGENT_CLIS")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/sandbox-agents"))
}

/// The installed CLI `name`, or a skip naming how to install it.
fn cli(name: &str) -> Option<PathBuf> {
    let path = clis().join("bin").join(name);
    if path.is_file() {
        Some(path)
    } else {
        common::skip(
            "agent-clis",
            format!(
                "{} is missing: install the agent CLIs as .ci/run does (npm install -g \
                 --prefix {} …)",
                path.display(),
                clis().display()
            ),
        );
        None
    }
}

/// The CLIs' `bin` first on `PATH` (their `node` too: pi needs Node 22).
fn path_with_clis() -> String {
    format!(
        "{}:/usr/local/bin:/usr/bin:/bin",
        clis().join("bin").display()
    )
}

/// `sandbox run [FLAGS] -- ARGV` in the fixture's task, with the CLIs on `PATH`.
fn run(f: &Fixture, flags: &[&str], argv: &[&str]) -> Output {
    f.env
        .cmd()
        .current_dir(&f.task)
        .env("PATH", path_with_clis())
        .arg("run")
        .args(flags)
        .arg("--")
        .args(argv)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Each agent's configuration with one MCP server named `sandbox-demo`, written where the
/// host's agent reads it: only a run that sees the read-only (or copied) file lists it.
fn seed_mcp_servers(home: &Path) {
    let write = |rel: &str, text: &str| {
        let path = home.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        ".claude.json",
        r#"{"mcpServers":{"sandbox-demo":{"type":"stdio","command":"/bin/true","args":[]}}}"#,
    );
    write(
        ".codex/config.toml",
        "[mcp_servers.sandbox-demo]\ncommand = \"/bin/true\"\n",
    );
    write(
        ".gemini/settings.json",
        r#"{"mcpServers":{"sandbox-demo":{"command":"/bin/true"}}}"#,
    );
    write(
        ".pi/agent/mcp.json",
        r#"{"mcpServers":{"sandbox-demo":{"command":"/bin/true"}}}"#,
    );
}

#[test]
fn each_agent_cli_starts_inside_with_its_profile() {
    let f = Fixture::new();
    seed_mcp_servers(&f.home);
    for (name, version) in [
        ("claude", "2.1.332"),
        ("codex", "0.171.0"),
        ("gemini", "0.61.0"),
        ("pi", "1.6.0"),
    ] {
        let Some(_) = cli(name) else { return };
        let out = run(&f, &[], &[name, "--version"]);
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains(version),
            "{name} --version: {}",
            text(&out)
        );
        // Needs no API key, and reads what the profile keeps read-only: the MCP servers.
        // Chosen by the command's name (no --agent): without the profile the view holds no
        // configuration, and no agent lists the server.
        let out = run(&f, &[], &[name, "mcp", "list"]);
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // (pi also connects to the server, which /bin/true is not: it exits 1 after listing.)
        assert!(
            (out.status.success() || name == "pi" && out.status.code() == Some(1))
                && all.contains("sandbox-demo")
                && ![
                    "EACCES",
                    "EROFS",
                    "Permission denied",
                    "Read-only file system"
                ]
                .iter()
                .any(|e| all.contains(e)),
            "{name} mcp list: {}",
            text(&out)
        );
        let out = run(&f, &["--agent", "none"], &[name, "mcp", "list"]);
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !all.contains("sandbox-demo"),
            "{name} mcp list saw the host's configuration without its profile: {}",
            text(&out)
        );
    }
    // Claude Code rewrote its state file inside: only the private copy changed.
    assert!(std::fs::read_to_string(f.home.join(".claude.json"))
        .unwrap()
        .starts_with(r#"{"mcpServers":{"sandbox-demo""#));
}

/// One profile's read-only entries, made to exist on the host (a file, or a directory with a
/// file in it), and a script that tries to change each from inside.
fn plant(f: &Fixture, agent: &str) -> (Vec<PathBuf>, String) {
    let out = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args(["policy", "show", "--json", "--agent", agent])
        .output()
        .unwrap();
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let paths = shown["policy"]["agent"]["paths"]
        .as_array()
        .unwrap_or_else(|| panic!("{agent}: no agent in policy show: {}", text(&out)))
        .clone();
    let mut planted = Vec::new();
    let mut script = String::new();
    for entry in paths {
        let path = PathBuf::from(entry["path"].as_str().unwrap());
        match entry["access"].as_str().unwrap() {
            "read" | "copy" => {
                let file = if path.extension().is_some() || entry["access"] == "copy" {
                    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                    path.clone()
                } else {
                    std::fs::create_dir_all(&path).unwrap();
                    path.join("hook.sh")
                };
                std::fs::write(&file, "original\n").unwrap();
                script.push_str(&format!(
                    "echo pwned > '{0}'; rm -f '{0}'; mv '{0}' '{0}.moved'; ",
                    file.display()
                ));
                planted.push(file);
            }
            _ => {}
        }
    }
    // What each agent's host copy runs or obeys, named here rather than read from the profile:
    // a profile that made one of these writable fails the test.
    let must_hold: &[&str] = match agent {
        "claude" => &[
            ".claude/settings.json",
            ".claude.json",
            ".claude/plugins/p.json",
        ],
        "codex" => &[".codex/config.toml", ".codex/rules/default.rules"],
        "gemini" => &[".gemini/settings.json", ".gemini/extensions/e.json"],
        "opencode" => &[".config/opencode/opencode.json"],
        "aider" => &[".aider.conf.yml"],
        "goose" => &[".config/goose/config.yaml"],
        "pi" => &[".pi/agent/settings.json", ".pi/agent/extensions/x.ts"],
        _ => &[],
    };
    for rel in must_hold {
        let file = f.home.join(rel);
        if planted.contains(&file) {
            continue;
        }
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "original\n").unwrap();
        script.push_str(&format!(
            "echo pwned > '{0}'; rm -f '{0}'; mv '{0}' '{0}.moved'; ",
            file.display()
        ));
        planted.push(file);
    }
    script.push_str("true");
    (planted, script)
}

#[test]
fn what_a_profile_keeps_read_only_cannot_be_changed_from_inside() {
    for agent in [
        "claude", "codex", "gemini", "opencode", "aider", "goose", "pi",
    ] {
        let f = Fixture::new();
        let (planted, script) = plant(&f, agent);
        assert!(!planted.is_empty(), "{agent}");
        let out = run(&f, &["--agent", agent], &["sh", "-c", &script]);
        assert_eq!(out.status.code(), Some(0), "{agent}: {}", text(&out));
        for file in &planted {
            assert_eq!(
                std::fs::read_to_string(file).ok().as_deref(),
                Some("original\n"),
                "{agent}: {} changed from inside: {}",
                file.display(),
                text(&out)
            );
        }
        // The control: the host backend enforces nothing, and the same script changes them.
        let out = run(
            &f,
            &["--backend", "host", "--agent", agent],
            &["sh", "-c", &script],
        );
        assert_eq!(out.status.code(), Some(0), "{agent}: {}", text(&out));
        for file in &planted {
            assert!(
                std::fs::read_to_string(file).is_err(),
                "{agent}: the control did not reach {}",
                file.display()
            );
        }
    }
}

#[test]
fn sessions_reach_the_host_and_a_private_copy_never_does() {
    let f = Fixture::new();
    std::fs::write(f.home.join(".claude.json"), "{\"host\":true}\n").unwrap();
    let script = "echo '{\"inside\":true}' > ~/.claude.json && cat ~/.claude.json && \
                  echo session > ~/.claude/projects/s.jsonl";
    let out = run(&f, &["--agent", "claude"], &["sh", "-c", script]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "{\"inside\":true}\n");
    assert_eq!(
        std::fs::read_to_string(f.home.join(".claude.json")).unwrap(),
        "{\"host\":true}\n",
        "the private copy was written back"
    );
    assert_eq!(
        std::fs::read_to_string(f.home.join(".claude/projects/s.jsonl")).unwrap(),
        "session\n"
    );
    // The next run starts from the host's file again.
    let out = run(
        &f,
        &["--agent", "claude"],
        &["cat", &format!("{}/.claude.json", f.home.display())],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "{\"host\":true}\n",
        "{}",
        text(&out)
    );
    // The control: on the host the write lands.
    let out = run(
        &f,
        &["--backend", "host", "--agent", "claude"],
        &["sh", "-c", script],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(f.home.join(".claude.json")).unwrap(),
        "{\"inside\":true}\n"
    );
}

#[test]
fn policy_show_lists_what_the_profile_added_and_why() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.home.join(".claude")).unwrap();
    std::fs::write(f.home.join(".claude/settings.json"), "{}").unwrap();
    std::fs::write(f.home.join(".claude.json"), "{}").unwrap();
    let out = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args(["policy", "show", "--agent", "claude"])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", text(&out));
    for want in [
        "agent     Claude Code (profile claude), chosen by --agent",
        "read-only",
        ".claude/settings.json  (settings with hooks",
        "private copy  ",
        "[missing: a run creates it]",
    ] {
        assert!(shown.contains(want), "{want:?} not in:\n{shown}");
    }
    // A dry run creates nothing on the host.
    assert!(!f.home.join(".claude/projects").exists());
    let out = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args(["policy", "show", "--agent", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        text(&out).contains("no agent profile named \"nope\""),
        "{}",
        text(&out)
    );
}

#[test]
fn pi_acp_answers_an_acp_initialize_line_byte_exact_on_stdout() {
    let Some(pi_acp) = cli("pi-acp") else { return };
    let f = Fixture::new();
    let line = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1,\"clientCapabilities\":{}}}\n";
    let feed = |mut cmd: Command| -> Output {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // pi-acp answers, then ends at EOF.
        child.stdin.take().unwrap().write_all(line).unwrap();
        child.wait_with_output().unwrap()
    };
    let mut inside = f.env.cmd();
    inside
        .current_dir(&f.task)
        .env("PATH", path_with_clis())
        .args(["exec", "--", "pi-acp"]);
    let inside = feed(inside);
    // The same program on the host, with the same environment: the reference bytes.
    let mut direct = Command::new(&pi_acp);
    direct
        .env_clear()
        .env("PATH", path_with_clis())
        .env("HOME", &f.home)
        .current_dir(&f.task);
    let direct = feed(direct);
    assert!(direct.status.success(), "{}", text(&direct));
    assert_eq!(inside.status.code(), Some(0), "{}", text(&inside));
    assert!(
        inside
            .stdout
            .starts_with(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"protocolVersion\":1"),
        "{}",
        text(&inside)
    );
    assert_eq!(
        String::from_utf8_lossy(&inside.stdout),
        String::from_utf8_lossy(&direct.stdout)
    );
    assert_eq!(inside.stdout, direct.stdout);
}

/// Every private copy of every shipped profile, with the host's file present: an agent
/// replaces such a file by renaming a new one over it (Gemini CLI's `projects.json`), or
/// deletes and re-creates it; both work inside (a copy bound over its path refused the rename
/// with `EBUSY`), and the host's file stays as it was; a later run without the profile does
/// not find it.
#[test]
fn every_private_copy_takes_a_rename_over_it_and_a_delete_and_create() {
    use sandbox_policy::agents::{AgentAccess, Profiles, BUILTIN};
    let f = Fixture::new();
    let profiles = Profiles::load(&Default::default()).unwrap();
    let mut tried = Vec::new();
    for (agent, _) in BUILTIN {
        let profile = profiles.get(agent).unwrap();
        for entry in profile
            .paths
            .iter()
            .filter(|p| p.access == AgentAccess::Copy)
        {
            let rel = entry.path.strip_prefix("~/").unwrap();
            let host = f.home.join(rel);
            std::fs::create_dir_all(host.parent().unwrap()).unwrap();
            std::fs::write(&host, "host\n").unwrap();
            let script = format!(
                "f=\"$HOME/{rel}\"; cat \"$f\" && echo renamed > \"$f.new\" && mv \"$f.new\" \"$f\" \
                 && cat \"$f\" && rm \"$f\" && echo recreated > \"$f\" && cat \"$f\""
            );
            let out = run(&f, &["--agent", agent], &["sh", "-c", &script]);
            assert_eq!(out.status.code(), Some(0), "{agent} {rel}: {}", text(&out));
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "host\nrenamed\nrecreated\n",
                "{agent} {rel}: {}",
                text(&out)
            );
            assert_eq!(
                std::fs::read_to_string(&host).unwrap(),
                "host\n",
                "{agent} {rel}"
            );
            // A run not given the profile does not find the copy (it holds the host's data).
            let out = run(
                &f,
                &["--agent", "none"],
                &[
                    "sh",
                    "-c",
                    &format!("test -e \"$HOME/{rel}\" && echo FOUND; true"),
                ],
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "",
                "{agent} {rel}: {}",
                text(&out)
            );
            tried.push(format!("{agent} {rel}"));
        }
    }
    assert!(tried.len() >= 3, "{tried:?}");
}

/// `git` as Gemini CLI 0.61.0 runs it for a checkpoint (packages/core/src/services/
/// gitService.ts, `shadowGitRepository`: `getSafeGitEnv`'s command-line overrides, the
/// repository's own `.gitconfig` as the global config, `GIT_DIR`, `GIT_WORK_TREE`), as
/// `user` when given (the host's agent runs as the user whose home it is).
fn gemini_git(user: Option<&common::UserDirs>, repo: &Path, work: &Path, args: &[&str]) -> Output {
    let mut argv = vec!["git"];
    argv.extend_from_slice(args);
    let mut cmd = match user {
        Some(_) => common::unprivileged(&argv),
        None => {
            let mut c = Command::new("git");
            c.args(args);
            c
        }
    };
    cmd.current_dir(work)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_COUNT", "8");
    for (i, (k, v)) in [
        ("credential.helper", ""),
        ("core.fsmonitor", ""),
        ("core.hooksPath", ""),
        ("core.sshCommand", ""),
        ("core.pager", "cat"),
        ("core.editor", ""),
        ("sequence.editor", ""),
        ("diff.external", ""),
    ]
    .iter()
    .enumerate()
    {
        cmd.env(format!("GIT_CONFIG_KEY_{i}"), k)
            .env(format!("GIT_CONFIG_VALUE_{i}"), v);
    }
    cmd.env("GIT_CONFIG_GLOBAL", repo.join(".gitconfig"))
        .env("GIT_CONFIG_SYSTEM", repo.join(".gitconfig_system_empty"))
        .env("GIT_AUTHOR_NAME", "Gemini CLI")
        .env("GIT_AUTHOR_EMAIL", "gemini-cli@google.com")
        .env("GIT_COMMITTER_NAME", "Gemini CLI")
        .env("GIT_COMMITTER_EMAIL", "gemini-cli@google.com")
        .env("GIT_DIR", repo.join(".git"))
        .env("GIT_WORK_TREE", work)
        .output()
        .unwrap()
}

/// A program in the worktree that leaves `marker` when run (as a filter it passes its input).
fn evil_script(marker: &Path) -> String {
    format!(
        "printf '#!/bin/sh\\necho ran >> {0}\\ncat\\n' > \"$W/.evil\" && chmod +x \"$W/.evil\"",
        marker.display()
    )
}

/// From inside, in the project `$PWD`: Gemini CLI's checkpoint repository `repo` set up and
/// one checkpoint made as the agent does, then a filter driver, `gpg.program` with
/// `commit.gpgSign`, a `core.fsmonitor` and a hook in its config, the project's
/// `.gitignore` made shell code, and the repository's `.gitignore` a link to `~/.bashrc`.
fn gemini_plant(repo: &Path, marker: &Path) -> String {
    let gitconfig = "[user]\\n  name = Gemini CLI\\n  email = gemini-cli@google.com\\n\
                     [commit]\\n  gpgsign = false\\n";
    format!(
        "set -e; R='{repo}'; W=\"$PWD\"; export GIT_CONFIG_NOSYSTEM=1 \
         GIT_AUTHOR_NAME=g GIT_AUTHOR_EMAIL=g@x GIT_COMMITTER_NAME=g GIT_COMMITTER_EMAIL=g@x; \
         mkdir -p \"$R\"; printf '{gitconfig}' > \"$R/.gitconfig\"; \
         : > \"$R/.gitconfig_system_empty\"; \
         (cd \"$R\" && GIT_CONFIG_GLOBAL=\"$R/.gitconfig\" git init -q --initial-branch main \
          && GIT_CONFIG_GLOBAL=\"$R/.gitconfig\" git commit -q --allow-empty -m 'Initial commit'); \
         echo inside > a.txt; \
         GIT_DIR=\"$R/.git\" GIT_WORK_TREE=\"$W\" GIT_CONFIG_GLOBAL=\"$R/.gitconfig\" git add . ; \
         GIT_DIR=\"$R/.git\" GIT_WORK_TREE=\"$W\" GIT_CONFIG_GLOBAL=\"$R/.gitconfig\" \
           git commit -q --no-verify -m inside; \
         {evil}; C=\"$R/.git/config\"; \
         git config --file \"$C\" filter.x.clean \"$W/.evil\"; \
         git config --file \"$C\" commit.gpgSign true; \
         git config --file \"$C\" gpg.program \"$W/.evil\"; \
         git config --file \"$C\" core.fsmonitor \"$W/.evil\"; \
         mkdir -p \"$R/.git/info\"; echo '* filter=x' > \"$R/.git/info/attributes\"; \
         cp \"$W/.evil\" \"$R/.git/hooks/post-commit\"; \
         printf 'touch {marker}.bashrc\\n' > \"$W/.gitignore\"; \
         rm -f \"$R/.gitignore\"; ln -s \"$HOME/.bashrc\" \"$R/.gitignore\"",
        repo = repo.display(),
        evil = evil_script(marker),
        marker = marker.display(),
    )
}

/// The user's next host step after [`gemini_plant`]: the agent's next start and checkpoint
/// — `setupShadowGitRepository` copies the project's `.gitignore` to the repository's with
/// `fs.writeFile` (which follows a link), then `git add .`, `status`, `commit --no-verify`
/// exactly as 0.61.0 runs them. Checks the outcome: under `host` (the control) the planted
/// program ran and `~/.bashrc` took the project's `.gitignore`; otherwise neither, the run
/// reported what it set aside, and the checkpoint made inside restores.
fn gemini_next_checkpoint(
    backend: &str,
    user: Option<&common::UserDirs>,
    home: &Path,
    work: &Path,
    marker: &Path,
    out: &Output,
) {
    let repo = home.join(".gemini/history/task");
    let bashrc_before = std::fs::read_to_string(home.join(".bashrc")).unwrap();
    let ignore = std::fs::read(work.join(".gitignore")).unwrap();
    std::fs::write(repo.join(".gitignore"), ignore).unwrap();
    std::fs::write(work.join("a.txt"), "host\n").unwrap();
    let add = gemini_git(user, &repo, work, &["add", "."]);
    let _ = gemini_git(user, &repo, work, &["status", "--porcelain"]);
    let commit = gemini_git(
        user,
        &repo,
        work,
        &["commit", "-q", "--no-verify", "-m", "host"],
    );
    let bashrc = std::fs::read_to_string(home.join(".bashrc")).unwrap();
    if backend == "host" {
        assert!(
            marker.exists(),
            "the control: the planted program did not run: {}{}",
            text(&add),
            text(&commit)
        );
        assert!(bashrc.contains("touch"), "the control: {bashrc:?}");
        return;
    }
    assert!(
        !marker.exists(),
        "the host's checkpoint ran the run's program: {}",
        text(out)
    );
    assert_eq!(bashrc, bashrc_before, "the link was written through");
    assert!(
        add.status.success() && commit.status.success(),
        "{}{}",
        text(&add),
        text(&commit)
    );
    assert!(
        text(out).contains("set aside"),
        "the run's report names what it set aside: {}",
        text(out)
    );
    // Legitimate work: the checkpoint made inside is there and restores (`/restore`).
    let log = gemini_git(user, &repo, work, &["log", "--format=%s"]);
    assert!(
        String::from_utf8_lossy(&log.stdout).contains("inside"),
        "{}",
        text(&log)
    );
    let restore = gemini_git(user, &repo, work, &["restore", "--source", "HEAD~1", "."]);
    assert!(restore.status.success(), "{}", text(&restore));
    assert_eq!(
        std::fs::read_to_string(work.join("a.txt")).unwrap(),
        "inside\n"
    );
    assert!(!marker.exists());
}

/// Gemini CLI's checkpoint repository (`~/.gemini/history/<project>`, writable so checkpoints
/// made inside reach the host's `/restore`), attacked from inside ([`gemini_plant`]), then
/// the agent's next checkpoint on the host ([`gemini_next_checkpoint`]), with `--backend
/// host` as the control.
#[test]
fn a_gemini_checkpoint_repository_carries_no_code_to_the_host() {
    for backend in ["native", "host"] {
        let f = Fixture::new();
        let repo = f.home.join(".gemini/history/task");
        let marker = f.outside.join("marker");
        let out = run(
            &f,
            &["--backend", backend, "--agent", "gemini"],
            &["sh", "-c", &gemini_plant(&repo, &marker)],
        );
        assert_eq!(out.status.code(), Some(0), "{backend}: {}", text(&out));
        gemini_next_checkpoint(backend, None, &f.home, &f.task, &marker, &out);
    }
}

/// The same as an unprivileged user (`nobody` when the tests run as root), in a lived-in
/// home: the audit runs with the user's rights only.
#[test]
fn a_gemini_checkpoint_repository_carries_no_code_to_the_host_as_a_user() {
    if nix::unistd::geteuid().is_root() && !Path::new(sandbox_testkit::nobody::SETPRIV).exists() {
        common::skip("setpriv", "setpriv is missing");
        return;
    }
    for backend in ["native", "host"] {
        let env = common::Env::new();
        let user = common::UserDirs::new(env.path(), "user", common::BIN, true);
        let init = user.command(&["git", "init", "-q"]).output().unwrap();
        assert!(init.status.success(), "{}", text(&init));
        let repo = user.home.join(".gemini/history/task");
        let marker = user.run.join("marker");
        let out = user
            .command(&[
                user.bin_str(),
                "run",
                "--backend",
                backend,
                "--agent",
                "gemini",
                "--",
                "sh",
                "-c",
                &gemini_plant(&repo, &marker),
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{backend}: {}", text(&out));
        gemini_next_checkpoint(backend, Some(&user), &user.home, &user.work, &marker, &out);
    }
}

/// opencode's snapshot repository (`~/.local/share/opencode/snapshot/<project>/<worktree>`,
/// a git dir): from inside, a snapshot as opencode's `Snapshot.track` takes it, then a
/// `core.fsmonitor` and a hook in its config. The user's next host step is opencode's next
/// snapshot: `git --git-dir … --work-tree … diff-files`, `add`, `write-tree` with its `-c`
/// options (packages/opencode/src/snapshot/index.ts). Under `--backend host` the program
/// runs; under native it does not, and the tree snapshotted inside is still there.
#[test]
fn an_opencode_snapshot_repository_carries_no_code_to_the_host() {
    for backend in ["native", "host"] {
        let f = Fixture::new();
        let gitdir = f.home.join(".local/share/opencode/snapshot/proj/0123abcd");
        let marker = f.outside.join("marker");
        let script = format!(
            "set -e; G='{gitdir}'; W=\"$PWD\"; export GIT_CONFIG_NOSYSTEM=1; \
             mkdir -p \"$G\"; GIT_DIR=\"$G\" GIT_WORK_TREE=\"$W\" git init -q; \
             for kv in core.autocrlf=false core.longpaths=true core.symlinks=true \
               core.fsmonitor=false feature.manyFiles=true index.version=4 index.threads=true \
               core.untrackedCache=true; do git --git-dir \"$G\" config \"${{kv%%=*}}\" \"${{kv#*=}}\"; done; \
             echo inside > a.txt; \
             git -c core.autocrlf=false --git-dir \"$G\" --work-tree \"$W\" add --all . ; \
             git --git-dir \"$G\" --work-tree \"$W\" write-tree > \"$W/.tree\"; \
             {evil}; git --git-dir \"$G\" config core.fsmonitor \"$W/.evil\"; \
             cp \"$W/.evil\" \"$G/hooks/reference-transaction\"",
            gitdir = gitdir.display(),
            evil = evil_script(&marker),
        );
        let out = run(
            &f,
            &["--backend", backend, "--agent", "opencode"],
            &["sh", "-c", &script],
        );
        assert_eq!(out.status.code(), Some(0), "{backend}: {}", text(&out));
        let git = |args: &[&str]| {
            Command::new("git")
                .args([
                    "-c",
                    "core.autocrlf=false",
                    "-c",
                    "core.longpaths=true",
                    "-c",
                    "core.symlinks=true",
                    "-c",
                    "core.quotepath=false",
                    "--git-dir",
                ])
                .arg(&gitdir)
                .arg("--work-tree")
                .arg(&f.task)
                .args(args)
                .current_dir(&f.task)
                .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                .output()
                .unwrap()
        };
        std::fs::write(f.task.join("a.txt"), "host\n").unwrap();
        let _ = git(&["diff-files", "--name-only", "-z", "--", "."]);
        let _ = git(&["add", "--all", "."]);
        let tree = git(&["write-tree"]);
        if backend == "host" {
            assert!(marker.exists(), "the control: {}", text(&tree));
            continue;
        }
        assert!(
            !marker.exists(),
            "the host's snapshot ran the run's program: {}",
            text(&out)
        );
        assert!(tree.status.success(), "{}", text(&tree));
        // Legitimate work: the tree snapshotted inside is there for undo.
        let inside = std::fs::read_to_string(f.task.join(".tree")).unwrap();
        let kind = git(&["cat-file", "-t", inside.trim()]);
        assert_eq!(
            String::from_utf8_lossy(&kind.stdout),
            "tree\n",
            "{}",
            text(&kind)
        );
    }
}

/// The machine's rustup: (`RUSTUP_HOME`, the dir holding the `cargo` proxy) — the toolchain
/// the agents' tool call runs, as a user's would.
fn machine_rustup() -> Option<(PathBuf, PathBuf)> {
    let home = PathBuf::from(std::env::var_os("HOME")?);
    let rustup = std::env::var_os("RUSTUP_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".rustup"));
    let bin = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".cargo"))
        .join("bin");
    (rustup.join("toolchains").is_dir() && bin.join("cargo").is_file()).then_some((rustup, bin))
}

/// How one agent is started against the stand-in at `url` (`http://127.0.0.1:PORT`): the
/// variables it gets (`--env`), files its user would have written in the home, its argv.
struct Agent {
    name: &'static str,
    env: fn(&str) -> Vec<(&'static str, String)>,
    setup: fn(&Path, &str),
    argv: fn(&str) -> Vec<String>,
}

const PROMPT: &str = "Run the toolchain and commit";

/// Claude Code with an API key and its base URL; `--dangerously-skip-permissions`, which as
/// root it accepts only with `IS_SANDBOX=1` — set by the profile, not here.
const CLAUDE: Agent = Agent {
    name: "claude",
    env: |url| {
        vec![
            ("ANTHROPIC_BASE_URL", url.to_owned()),
            ("ANTHROPIC_API_KEY", "sk-ant-standin".into()),
        ]
    },
    setup: |_, _| {},
    argv: |_| {
        ["claude", "-p", PROMPT, "--dangerously-skip-permissions"]
            .map(String::from)
            .to_vec()
    },
};

/// Codex 0.171 reads its base URL only from configuration (`openai_base_url`; it ignores
/// `OPENAI_BASE_URL`), here given with `-c`. Its own sandbox: none asked, the profile turns
/// it off (it cannot start inside).
const CODEX: Agent = Agent {
    name: "codex",
    env: |_| vec![("OPENAI_API_KEY", "sk-standin".into())],
    setup: |_, _| {},
    argv: |url| {
        vec![
            "codex".into(),
            "exec".into(),
            "--skip-git-repo-check".into(),
            "-c".into(),
            format!("openai_base_url=\"{url}/v1\""),
            PROMPT.into(),
        ]
    },
};

/// Gemini CLI with an API key, chosen in its settings as a user who uses one has it (with
/// only `GOOGLE_GEMINI_BASE_URL` it takes the gateway method, which it refuses in `-p`).
const GEMINI: Agent = Agent {
    name: "gemini",
    env: |url| {
        vec![
            ("GOOGLE_GEMINI_BASE_URL", url.to_owned()),
            ("GEMINI_API_KEY", "standin".into()),
        ]
    },
    setup: |home, _| {
        std::fs::write(
            home.join(".gemini/settings.json"),
            r#"{"security":{"auth":{"selectedType":"gemini-api-key"}}}"#,
        )
        .unwrap();
    },
    argv: |_| {
        ["gemini", "-p", PROMPT, "--yolo", "--skip-trust"]
            .map(String::from)
            .to_vec()
    },
};

/// pi with the stand-in as a compatible endpoint in `models.json` (`openai-completions`, its
/// form for any such server).
const PI: Agent = Agent {
    name: "pi",
    env: |_| vec![],
    setup: |home, url| {
        let dir = home.join(".pi/agent");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("models.json"),
            serde_json::json!({"providers": {"standin": {"baseUrl": format!("{url}/v1"),
                "api": "openai-completions", "apiKey": "standin",
                "models": [{"id": "standin-model"}]}}})
            .to_string(),
        )
        .unwrap();
    },
    argv: |_| {
        ["pi", "--print", "--model", "standin/standin-model", PROMPT]
            .map(String::from)
            .to_vec()
    },
};

/// The agent, started inside by its command's name, makes one tool call against the model
/// API stand-in: the command runs the user's toolchain and commits. Under the default
/// network and under `--block-net` with the stand-in's port relayed in. The command's output
/// reached the stand-in (in the tool result the agent sent), its commit the task branch.
fn makes_a_tool_call_inside(agent: &Agent) {
    let Some(_) = cli(agent.name) else { return };
    let Some((rustup, bin)) = machine_rustup() else {
        common::skip(
            "rustup",
            "no rustup toolchain on this machine (RUSTUP_HOME, ~/.cargo/bin)",
        );
        return;
    };
    let f = Fixture::new();
    for (mode, flags) in [("default", false), ("block-net", true)] {
        let message = format!("{} made this under {mode}", agent.name);
        let api = sandbox_testkit::model_api::ModelApi::start(&format!(
            "cargo --version && echo \"inside: $SANDBOX_BACKEND\" && \
             git commit -q --allow-empty -m '{message}' && echo committed"
        ));
        (agent.setup)(&f.home, &api.url());
        let port = api.port.to_string();
        let mut cmd = f.env.cmd();
        cmd.current_dir(&f.task)
            .env(
                "PATH",
                format!(
                    "{}:{}:/usr/local/bin:/usr/bin:/bin",
                    clis().join("bin").display(),
                    bin.display()
                ),
            )
            .env("RUSTUP_HOME", &rustup)
            .arg("run");
        if flags {
            cmd.args(["--block-net", "--allow-port", &port]);
        }
        for (name, value) in (agent.env)(&api.url()) {
            cmd.arg("--env").arg(format!("{name}={value}"));
        }
        let out = cmd
            .arg("--")
            .args((agent.argv)(&api.url()))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let results = api.tool_results();
        assert!(
            out.status.success()
                && results.iter().any(|r| {
                    r.contains("cargo 1.")
                        && r.contains("inside: native")
                        && r.contains("committed")
                }),
            "{} under {mode}: the tool call's output did not come back\n{}\nstand-in saw:\n{}",
            agent.name,
            text(&out),
            api.summary()
        );
        assert_eq!(
            sandbox_testkit::git(&f.main, &["log", "-1", "--format=%s", "feature"]),
            message,
            "{} under {mode}: {}",
            agent.name,
            text(&out)
        );
    }
}

#[test]
fn claude_code_makes_a_tool_call_inside() {
    makes_a_tool_call_inside(&CLAUDE);
}

#[test]
fn codex_makes_a_tool_call_inside() {
    makes_a_tool_call_inside(&CODEX);
}

#[test]
fn gemini_cli_makes_a_tool_call_inside() {
    makes_a_tool_call_inside(&GEMINI);
}

#[test]
fn pi_makes_a_tool_call_inside() {
    makes_a_tool_call_inside(&PI);
}

/// An agent under `--credential NAME`, started with nothing but its prompt (no key, no base
/// URL, no settings of the user's): what the run and the profile give it is enough. The
/// stand-in is the credential's upstream over TLS (`SANDBOX_CREDENTIAL_<NAME>_HOST`, the test
/// CA trusted by `SANDBOX_CREDENTIAL_CA`); the tool call runs and commits as without the
/// credential, every model request reached the stand-in with the host's key in the
/// credential's header, and inside only the placeholder was held (the tool call prints the
/// variable).
type HomeFile = (&'static str, &'static str, &'static [&'static str]);

struct WithCredential {
    cli: &'static str,
    credential: &'static str,
    /// The host's variable the secret is read from, and the one the tool call prints.
    key_var: &'static str,
    placeholder: &'static str,
    /// The header the stand-in must see, and its value around the secret (`Bearer {}`).
    header: &'static str,
    value: fn(&str) -> String,
    argv: &'static [&'static str],
    /// A file of the user's home (relative path, text) written before the run: it must be
    /// unchanged after, and the tool call prints what the agent saw at its path (without
    /// white space), which must hold each of the strings given.
    home_file: Option<HomeFile>,
}

fn with_credential_reaches_the_api_through_the_proxy(agent: &WithCredential) {
    const SECRET: &str = "sk-host-secret-for-the-agent-0123456789";
    let Some(_) = cli(agent.cli) else { return };
    let Some((rustup, bin)) = machine_rustup() else {
        common::skip(
            "rustup",
            "no rustup toolchain on this machine (RUSTUP_HOME, ~/.cargo/bin)",
        );
        return;
    };
    let f = Fixture::new();
    let ca = sandbox_testkit::net::TestCa::new(&f.env.path().join("ca"), &["127.0.0.1"]);
    let message = format!(
        "{} made this with --credential {}",
        agent.cli, agent.credential
    );
    if let Some((rel, text, _)) = agent.home_file {
        std::fs::create_dir_all(f.home.join(rel).parent().unwrap()).unwrap();
        std::fs::write(f.home.join(rel), text).unwrap();
    }
    let show = agent
        .home_file
        .map(|(rel, _, _)| format!(" && tr -d '\\n ' < ~/{rel}"))
        .unwrap_or_default();
    let api = sandbox_testkit::model_api::ModelApi::start_tls(
        &format!(
            "cargo --version && echo \"inside: $SANDBOX_BACKEND key=${}\" && \
             git commit -q --allow-empty -m '{message}' && echo committed{show}",
            agent.key_var
        ),
        &ca,
    );
    let out = f
        .env
        .cmd()
        .current_dir(&f.task)
        .env(
            "PATH",
            format!(
                "{}:{}:/usr/local/bin:/usr/bin:/bin",
                clis().join("bin").display(),
                bin.display()
            ),
        )
        .env("RUSTUP_HOME", &rustup)
        .env(agent.key_var, SECRET)
        .env(
            sandbox_net::credentials::upstream_var(agent.credential),
            format!("127.0.0.1:{}", api.port),
        )
        .env("SANDBOX_CREDENTIAL_CA", &ca.pem_file)
        .args(["run", "--credential", agent.credential, "--"])
        .args(agent.argv)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let results = api.tool_results();
    let inside = format!("inside: native key={}", agent.placeholder);
    assert!(
        out.status.success()
            && results.iter().any(|r| {
                r.contains("cargo 1.") && r.contains(&inside) && r.contains("committed")
            }),
        "the tool call's output did not come back\n{}\nstand-in saw:\n{}",
        text(&out),
        api.summary()
    );
    let posts: Vec<_> = api
        .seen()
        .into_iter()
        .filter(|s| s.method == "POST")
        .collect();
    let want = (agent.value)(SECRET);
    assert!(
        !posts.is_empty()
            && posts
                .iter()
                .all(|s| s.header(agent.header) == Some(want.as_str())),
        "{:?}",
        posts
            .iter()
            .map(|s| s.header(agent.header))
            .collect::<Vec<_>>()
    );
    assert!(!results.iter().any(|r| r.contains(SECRET)));
    assert_eq!(
        sandbox_testkit::git(&f.main, &["log", "-1", "--format=%s", "feature"]),
        message,
        "{}",
        text(&out)
    );
    if let Some((rel, written, seen)) = agent.home_file {
        assert_eq!(std::fs::read_to_string(f.home.join(rel)).unwrap(), written);
        for needle in seen {
            assert!(
                results.iter().any(|r| r.contains(needle)),
                "{needle} not in ~/{rel} inside:\n{}",
                api.summary()
            );
        }
    }
}

/// Codex: the profile points it at the run's proxy by what it reads (`-c
/// openai_base_url=…`: it ignores `OPENAI_BASE_URL`), the proxy puts the host's key in.
#[test]
fn codex_with_credential_openai_reaches_the_api_through_the_proxy() {
    with_credential_reaches_the_api_through_the_proxy(&WithCredential {
        cli: "codex",
        credential: "openai",
        key_var: "OPENAI_API_KEY",
        placeholder: "sk-sandbox-placeholder-openai",
        header: "authorization",
        value: |secret| format!("Bearer {secret}"),
        argv: &["codex", "exec", "--skip-git-repo-check", PROMPT],
        home_file: None,
    });
}

const GEMINI_WITH_CREDENTIAL: WithCredential = WithCredential {
    cli: "gemini",
    credential: "google",
    key_var: "GEMINI_API_KEY",
    placeholder: "sandbox-placeholder-google",
    header: "x-goog-api-key",
    value: |secret| secret.to_owned(),
    argv: &["gemini", "-p", PROMPT, "--yolo", "--skip-trust"],
    home_file: None,
};

/// Gemini CLI with no settings of the user's: `GOOGLE_GEMINI_BASE_URL` alone would make it
/// take the gateway method, which `-p` refuses; the profile chooses the API key for it.
#[test]
fn gemini_cli_with_credential_google_reaches_the_api_through_the_proxy() {
    with_credential_reaches_the_api_through_the_proxy(&GEMINI_WITH_CREDENTIAL);
}

/// The same with settings of the user's that choose no method (comments, an MCP server):
/// the run's private copy keeps them and adds the API key; the host's file is unchanged.
#[test]
fn gemini_cli_with_credential_google_keeps_the_users_settings() {
    with_credential_reaches_the_api_through_the_proxy(&WithCredential {
        home_file: Some((
            ".gemini/settings.json",
            "{\n  // mine\n  \"mcpServers\": {\"sandbox-demo\": {\"command\": \"true\"}},\n  \
             \"general\": {\"vimMode\": true}\n}\n",
            // As the tool result carries them: inside a JSON string.
            &[
                r#"\"sandbox-demo\":{\"command\":\"true\"}"#,
                r#"\"vimMode\":true"#,
                r#"\"selectedType\":\"gemini-api-key\""#,
            ],
        )),
        ..GEMINI_WITH_CREDENTIAL
    });
}

/// Claude Code reads `ANTHROPIC_BASE_URL` and `ANTHROPIC_API_KEY` itself: nothing added.
#[test]
fn claude_code_with_credential_anthropic_reaches_the_api_through_the_proxy() {
    with_credential_reaches_the_api_through_the_proxy(&WithCredential {
        cli: "claude",
        credential: "anthropic",
        key_var: "ANTHROPIC_API_KEY",
        placeholder: "sk-ant-sandbox-placeholder-anthropic",
        header: "x-api-key",
        value: |secret| secret.to_owned(),
        argv: &["claude", "-p", PROMPT, "--dangerously-skip-permissions"],
        home_file: None,
    });
}

/// A profile's variables reach the run (Claude Code's `IS_SANDBOX=1`), under `--env`: a
/// value the user sets wins; a run without the profile does not get them.
#[test]
fn a_profiles_variables_are_set_and_env_overrides_them() {
    let f = Fixture::new();
    let show = |flags: &[&str]| {
        let out = run(&f, flags, &["sh", "-c", "echo \"[${IS_SANDBOX-unset}]\""]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(show(&["--agent", "claude"]), "[1]");
    assert_eq!(show(&["--agent", "claude", "--env", "IS_SANDBOX=0"]), "[0]");
    assert_eq!(show(&["--agent", "codex"]), "[unset]");
    assert_eq!(show(&[]), "[unset]");
}

/// Codex asked for its own sandbox inside ours: one line before it starts says why that
/// cannot work and what the profile sets instead; the profile's full-access mode (or none
/// asked) says nothing.
#[test]
fn codex_asked_for_its_own_sandbox_is_told_why_in_one_line() {
    let Some(_) = cli("codex") else { return };
    let f = Fixture::new();
    let warned = |argv: &[&str]| {
        let out = run(&f, &[], argv);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| l.starts_with("sandbox: warning: --sandbox cannot work inside"))
            .count()
    };
    assert_eq!(
        warned(&["codex", "--sandbox", "workspace-write", "--version"]),
        1
    );
    assert_eq!(
        warned(&["codex", "--sandbox", "danger-full-access", "--version"]),
        0
    );
    assert_eq!(warned(&["codex", "--version"]), 0);
}
