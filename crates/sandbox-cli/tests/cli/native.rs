//! The native backend's commands through the real binary: the default backend, `use`,
//! `policy show`, `doctor`, refusals of bad input and of unprotectable git layouts.

use crate::common;

use std::process::Stdio;

use common::escape::{git, Fixture};
use common::text;

fn sandbox(f: &Fixture, args: &[&str]) -> std::process::Output {
    f.env
        .cmd()
        .current_dir(&f.task)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn native_is_the_default_and_processes_know_their_boundary() {
    let f = Fixture::new();
    let out = sandbox(
        &f,
        &[
            "run",
            "--",
            "sh",
            "-c",
            "echo $SANDBOX_BACKEND $SANDBOX_TASK",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(stdout(&out).trim(), "native task");
}

#[test]
fn use_remembers_the_backend_outside_the_worktree() {
    let f = Fixture::new();
    let before = git_status(&f);
    let out = sandbox(&f, &["use", "host"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let run = sandbox(&f, &["run", "--", "sh", "-c", "echo $SANDBOX_BACKEND"]);
    assert_eq!(stdout(&run).trim(), "host");
    // From a subdirectory too: the choice belongs to the worktree.
    std::fs::create_dir_all(f.task.join("sub")).unwrap();
    let run = f
        .env
        .cmd()
        .current_dir(f.task.join("sub"))
        .args(["run", "--", "sh", "-c", "echo $SANDBOX_BACKEND"])
        .output()
        .unwrap();
    assert_eq!(stdout(&run).trim(), "host");
    // --backend still wins for one run.
    let run = sandbox(
        &f,
        &[
            "run",
            "--backend",
            "native",
            "--",
            "sh",
            "-c",
            "echo $SANDBOX_BACKEND",
        ],
    );
    assert_eq!(stdout(&run).trim(), "native");
    // Stored in the state directory, nothing in the worktree.
    let state = f.env.home().join(".local/state/sandbox/backends.json");
    assert!(std::fs::read_to_string(&state).unwrap().contains("host"));
    assert_eq!(
        git_status(&f),
        before,
        "sandbox use wrote into the worktree"
    );
    let show = sandbox(&f, &["use", "--json"]);
    assert!(stdout(&show).contains("\"host\""), "{}", text(&show));
    sandbox(&f, &["use", "--clear"]);
    let run = sandbox(&f, &["run", "--", "sh", "-c", "echo $SANDBOX_BACKEND"]);
    assert_eq!(stdout(&run).trim(), "native");
    let bad = sandbox(&f, &["use", "vmware"]);
    assert_ne!(bad.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown backend"));
}

fn git_status(f: &Fixture) -> String {
    let out = std::process::Command::new("git")
        .args(["status", "--porcelain", "--ignored"])
        .current_dir(&f.task)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn policy_show_is_the_dry_run() {
    let f = Fixture::new();
    let marker = f.task.join("ran");
    let out = sandbox(
        &f,
        &[
            "policy",
            "show",
            "--json",
            "--block-net",
            "--allow-port",
            "3000",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!marker.exists());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["backend"], "native");
    let rules = v["compiled"]["landlock"]["paths"].as_array().unwrap();
    let mode_of = |p: &std::path::Path| {
        rules
            .iter()
            .filter(|r| r["path"] == p.to_str().unwrap())
            .map(|r| r["access"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(mode_of(&f.task), vec!["read-write"]);
    assert_eq!(mode_of(&f.common), vec!["read-exec"]);
    assert_eq!(mode_of(&f.common.join("objects")), vec!["read-write"]);
    assert_eq!(
        mode_of(&f.common.join("worktrees/task")),
        vec!["read-write"]
    );
    assert!(mode_of(&f.common.join("hooks")).is_empty());
    assert!(mode_of(&f.home).is_empty(), "HOME must not be granted");
    // The run's own network namespace holds --block-net where it can be had (only the
    // allowed port is relayed in); Landlock's port rules only where it cannot.
    let namespace = v["enforcement"]["enforced"]
        .as_array()
        .unwrap()
        .iter()
        .any(|l| l.as_str().unwrap().starts_with("network namespace"));
    let tcp = &v["compiled"]["landlock"]["tcp"];
    if namespace {
        assert!(tcp.is_null(), "{v:#}");
    } else {
        assert_eq!(tcp["connect"], serde_json::json!([3000]), "{v:#}");
    }
    let seccomp: Vec<&str> = v["compiled"]["seccomp"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["syscall"].as_str().unwrap())
        .collect();
    assert!(seccomp.contains(&"socket") && seccomp.contains(&"io_uring_setup"));
    let sbpl = v["compiled"]["seatbelt"].as_str().unwrap();
    assert!(sbpl.contains(&format!(
        "(subpath \"{}\")",
        f.common.join("hooks").display()
    )));
    assert!(sbpl.contains("(deny file-write*"));
    let env_names = v["env_names"].as_array().unwrap();
    assert!(
        env_names.contains(&"SANDBOX_BACKEND".into()),
        "{env_names:?}"
    );
    // Human form names the grants and what this kernel enforces.
    let human = sandbox(&f, &["policy", "show"]);
    let h = stdout(&human);
    assert!(
        h.contains("linked worktree") && h.contains("Landlock ABI"),
        "{h}"
    );
}

/// `policy show` says which `/proc` a run gets, as a run here does get it: with a pid
/// namespace (the command is pid 2) the namespace's own, not a bind of the host's; without
/// one (no user namespaces: no view) the host's, in the system paths.
#[test]
fn policy_show_names_the_proc_a_run_gets() {
    let f = Fixture::new();
    for wrapped in [false, true] {
        let cmd = |args: &[&str]| {
            let mut c = if wrapped {
                f.env.cmd_under(&common::escape::NOUSERNS_WRAPPER)
            } else {
                f.env.cmd()
            };
            c.current_dir(&f.task).args(args).output().unwrap()
        };
        let run = cmd(&["run", "--", "sh", "-c", "echo $$"]);
        assert_eq!(run.status.code(), Some(0), "{}", text(&run));
        let own = stdout(&run).trim() == "2";
        let shown = cmd(&["policy", "show"]);
        let h = stdout(&shown);
        let system = h.lines().find(|l| l.starts_with("system ")).unwrap();
        let host_proc_listed = system.split_whitespace().any(|w| w == "/proc");
        let json: serde_json::Value =
            serde_json::from_slice(&cmd(&["policy", "show", "--json"]).stdout).unwrap();
        if own {
            assert!(
                h.contains("proc   /proc  (the pid namespace's own"),
                "the view lists the namespace's proc: {h}"
            );
            assert!(
                !h.contains("ro     /proc"),
                "no bind of the host's proc: {h}"
            );
            assert!(!host_proc_listed, "{system}");
            assert_eq!(json["compiled"]["own_proc"], "/proc", "{json}");
        } else {
            assert!(!h.contains("the pid namespace's own"), "{h}");
            assert!(host_proc_listed, "{system}");
            assert!(json["compiled"]["own_proc"].is_null(), "{json}");
        }
        common::report(format_args!(
            "policy show /proc (wrapped without user namespaces: {wrapped}): own={own}"
        ));
    }
}

#[test]
fn doctor_reports_what_is_enforced_and_the_tools() {
    let f = Fixture::new();
    let out = sandbox(&f, &["doctor", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let native = v["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "native")
        .unwrap();
    let abi = std::fs::read_to_string("/sys/kernel/security/landlock/abi_version").ok();
    assert!(
        native["enforcement"]["landlock_abi"].as_i64().is_some(),
        "{native}"
    );
    if let Some(abi) = abi {
        assert_eq!(
            native["enforcement"]["landlock_abi"].as_i64(),
            abi.trim().parse().ok()
        );
    }
    assert!(v["tools"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t["source"].is_string()));
    assert_eq!(v["worktree"]["git"], "linked");
    assert_eq!(v["worktree"]["protected"], true);
    // --block-net: a network namespace of the run's own, or (without one) Landlock's port
    // rules, which name ports, not addresses.
    let human = sandbox(&f, &["doctor"]);
    assert!(
        stdout(&human).contains("network namespace: only loopback inside")
            || stdout(&human).contains("ports, not addresses"),
        "{}",
        text(&human)
    );
}

/// What an agent in a main worktree tries against `.git`, each step printing a marker when
/// it was refused; a commit must still work.
const MAIN_WORKTREE_ATTACKS: &str = "echo change >> README && git add README && \
     git commit -qm inside && echo COMMITTED; \
     (echo 'touch pwned' > .git/hooks/pre-commit) 2>/dev/null || echo HOOKS-RO; \
     (printf '[core]\\n\\thooksPath = /tmp\\n' >> .git/config) 2>/dev/null || echo CONFIG-RO; \
     (echo '*' > .git/info/exclude) 2>/dev/null || echo INFO-RO; \
     (mv .git .git-moved) 2>/dev/null || echo GITDIR-PINNED";

#[test]
fn a_main_worktree_runs_in_the_view_with_what_git_runs_read_only() {
    let f = Fixture::new();
    let config_before = std::fs::read_to_string(f.common.join("config")).unwrap();
    let out = f
        .env
        .cmd()
        .current_dir(&f.main)
        .args(["run", "--", "sh", "-c", MAIN_WORKTREE_ATTACKS])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for marker in [
        "COMMITTED",
        "HOOKS-RO",
        "CONFIG-RO",
        "INFO-RO",
        "GITDIR-PINNED",
    ] {
        assert!(stdout(&out).contains(marker), "{marker}: {}", text(&out));
    }
    // Judged from outside: the commit landed, nothing git runs changed, `.git` is in place.
    let log = std::process::Command::new("git")
        .args(["log", "-1", "--format=%s"])
        .current_dir(&f.main)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&log.stdout).trim(), "inside");
    assert!(!f.common.join("hooks/pre-commit").exists());
    assert_eq!(
        std::fs::read_to_string(f.common.join("config")).unwrap(),
        config_before
    );
    assert!(f.common.is_dir() && !f.main.join(".git-moved").exists());
    let doctor = f
        .env
        .cmd()
        .current_dir(&f.main)
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
    assert_eq!(report["private_view"]["available"], true, "{report}");
    assert_eq!(report["worktree"]["protected"], true, "{report}");

    // The control: without a boundary every one of those steps works.
    let control = Fixture::new();
    let out = control
        .env
        .cmd()
        .current_dir(&control.main)
        .args([
            "run",
            "--backend",
            "host",
            "--",
            "sh",
            "-c",
            MAIN_WORKTREE_ATTACKS,
        ])
        .output()
        .unwrap();
    for marker in ["HOOKS-RO", "CONFIG-RO", "INFO-RO", "GITDIR-PINNED"] {
        assert!(!stdout(&out).contains(marker), "{marker}: {}", text(&out));
    }
    assert!(control.main.join(".git-moved/hooks/pre-commit").exists());
}

#[test]
fn without_the_view_a_main_worktree_is_refused_unless_the_user_accepts_the_risk() {
    if let Some(why) = common::escape::nouserns_unavailable() {
        common::skip("nouserns-harness", why);
        return;
    }
    let f = Fixture::new();
    let marker = f.main.join("ran");
    let run = |extra: &[&str]| {
        f.env
            .cmd_under(&common::escape::NOUSERNS_WRAPPER)
            .current_dir(&f.main)
            .arg("run")
            .args(extra)
            .args(["--", "touch", marker.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("main worktree") && err.contains("worktree add"),
        "{err}"
    );
    assert!(!marker.exists());
    let doctor = f
        .env
        .cmd_under(&common::escape::NOUSERNS_WRAPPER)
        .current_dir(&f.main)
        .args(["doctor"])
        .output()
        .unwrap();
    assert!(
        stdout(&doctor).contains("NOT protectable")
            && stdout(&doctor).contains("private view: NOT available"),
        "{}",
        text(&doctor)
    );
    let out = run(&["--unprotected-git"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(marker.exists());
    // The run said which layer is missing.
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no private view"),
        "{}",
        text(&out)
    );
}

#[test]
fn worktree_config_extension_is_refused() {
    let f = Fixture::new();
    git(&f.main, &["config", "extensions.worktreeConfig", "true"]);
    let out = sandbox(&f, &["run", "--", "true"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("worktreeConfig"));
}

#[test]
fn bad_input_is_refused_before_anything_runs() {
    let f = Fixture::new();
    let marker = f.task.join("ran");
    let touch = marker.to_str().unwrap().to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--allow-read", "/no/such/dir"], "does not exist"),
        (vec!["--allow-write", "relative/dir"], "does not exist"),
        (vec!["--block-net", "--allow-port", "0"], "not a TCP port"),
        (
            vec!["--block-net", "--allow-port", "65536"],
            "not a TCP port",
        ),
        (vec!["--allow-port", "3000"], "--block-net"),
        (
            vec!["--backend", "host", "--block-net"],
            "cannot block the network",
        ),
        (vec!["--backend", "seatbelt"], "not this platform"),
        (vec!["--allow-write", "/"], "Grant a narrower path"),
        (vec!["--timeout", "soon"], "not a duration"),
        (vec!["--timeout", "0s"], "zero"),
        (vec!["--no-such-flag"], "unexpected argument"),
    ];
    for (flags, needle) in cases {
        let mut args = vec!["run"];
        args.extend(flags.iter().copied());
        args.extend(["--", "touch", touch.as_str()]);
        let out = sandbox(&f, &args);
        assert_eq!(out.status.code(), Some(125), "{flags:?}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(needle),
            "{flags:?}: expected {needle:?} in {err}"
        );
        assert!(!marker.exists(), "{flags:?}: the command ran");
    }
}

#[test]
fn grants_widen_exactly_what_they_name() {
    let f = Fixture::new();
    let shared = f.env.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::write(f.outside.join("readme.txt"), "readable\n").unwrap();
    let out = sandbox(
        &f,
        &[
            "run",
            "--allow-write",
            shared.to_str().unwrap(),
            "--allow-read",
            f.outside.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &format!(
                "echo ok > '{}/w.txt' && cat '{}/readme.txt' && echo no > '{}/x.txt'",
                shared.display(),
                f.outside.display(),
                f.outside.display()
            ),
        ],
    );
    assert!(shared.join("w.txt").exists(), "{}", text(&out));
    assert!(stdout(&out).contains("readable"));
    assert!(
        !f.outside.join("x.txt").exists(),
        "read grant allowed a write"
    );
    assert_ne!(out.status.code(), Some(0));

    // The same grants from the trusted configuration.
    f.env.write_config(&format!(
        "additional_folders: ['{}']\nread_folders: ['{}']\n",
        shared.display(),
        f.outside.display()
    ));
    let out = sandbox(
        &f,
        &[
            "run",
            "--",
            "sh",
            "-c",
            &format!(
                "echo c > '{}/c.txt' && cat '{}/readme.txt'",
                shared.display(),
                f.outside.display()
            ),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(shared.join("c.txt").exists());
}

#[test]
fn grants_that_would_let_the_agent_loosen_its_own_boundary_are_refused() {
    let f = Fixture::new();
    f.env.write_config("backend: native\n");
    std::fs::create_dir_all(f.env.path().join("run/sandbox")).unwrap();
    let marker = f.task.join("ran");
    let touch = marker.to_str().unwrap().to_string();
    let home = f.env.home();
    let config_dir = home.join(".config");
    let runtime = f.env.path().join("run");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--allow-write".into(), home.display().to_string()],
            "configuration",
        ),
        (
            vec!["--allow-write".into(), config_dir.display().to_string()],
            "configuration",
        ),
        (
            vec!["--allow-read".into(), runtime.display().to_string()],
            "host token",
        ),
    ];
    for (flags, needle) in cases {
        let mut args: Vec<String> = vec!["run".into()];
        args.extend(flags.iter().cloned());
        args.extend(["--".into(), "touch".into(), touch.clone()]);
        let out = f
            .env
            .cmd()
            .current_dir(&f.task)
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(125), "{flags:?}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{flags:?}: {err}");
        assert!(!marker.exists());
    }
    // Reading the configuration is harmless and allowed.
    let out = sandbox(
        &f,
        &[
            "run",
            "--allow-read",
            config_dir.to_str().unwrap(),
            "--",
            "cat",
            f.env.config_file().to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn a_nested_run_works_and_stays_confined() {
    // An agent's hook may itself call `sandbox run`: it must work inside the outer sandbox
    // (no capabilities left to drop, $HOME/.gitconfig unreadable) and can only narrow it.
    let f = Fixture::new();
    std::fs::write(f.home.join(".gitconfig"), "[user]\n\tname = Home Config\n").unwrap();
    let bin = std::fs::canonicalize(common::BIN).unwrap();
    let outside = f.outside.join("nested.txt");
    let script = format!(
        "'{bin}' run -- sh -c 'echo inner=$SANDBOX_BACKEND; git log -1 --format=%s; echo x > {out}'; echo nested=$?",
        bin = bin.display(),
        out = outside.display()
    );
    let out = sandbox(
        &f,
        &[
            "run",
            "--allow-read",
            bin.parent().unwrap().to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    let so = stdout(&out);
    assert!(so.contains("inner=native"), "{}", text(&out));
    assert!(
        so.contains("init"),
        "git works in the nested sandbox: {}",
        text(&out)
    );
    assert!(
        so.contains("nested=") && !so.contains("nested=0"),
        "the write outside must fail: {}",
        text(&out)
    );
    assert!(!outside.exists());
}

#[test]
fn without_the_view_unix_sockets_are_denied_unless_allowed_and_every_run_says_so() {
    if let Some(why) = common::escape::nouserns_unavailable() {
        common::skip("nouserns-harness", why);
        return;
    }
    let f = Fixture::new();
    let probe = "python3 -c 'import socket; socket.socket(socket.AF_UNIX); print(\"CREATED\")'";
    let run = |extra: &[&str]| {
        f.env
            .cmd_under(&common::escape::NOUSERNS_WRAPPER)
            .current_dir(&f.task)
            .arg("run")
            .args(extra)
            .args(["--", "sh", "-c", probe])
            .output()
            .unwrap()
    };
    let denied = run(&[]);
    assert!(!stdout(&denied).contains("CREATED"), "{}", text(&denied));
    assert!(
        String::from_utf8_lossy(&denied.stderr).contains("creating unix sockets is denied"),
        "{}",
        text(&denied)
    );
    let allowed = run(&["--allow-unix-sockets"]);
    assert!(stdout(&allowed).contains("CREATED"), "{}", text(&allowed));
    assert!(
        String::from_utf8_lossy(&allowed.stderr).contains("unix sockets are allowed"),
        "{}",
        text(&allowed)
    );
    // The configuration key does the same, and `policy show` names the missing layer.
    f.env
        .write_config("backends:\n  native:\n    allow_unix_sockets: true\n");
    assert!(stdout(&run(&[])).contains("CREATED"));
    let shown = f
        .env
        .cmd_under(&common::escape::NOUSERNS_WRAPPER)
        .current_dir(&f.task)
        .args(["policy", "show"])
        .output()
        .unwrap();
    assert!(
        stdout(&shown).contains("layer missing on this machine: no private view"),
        "{}",
        text(&shown)
    );
    // With the view (this machine's default) no such notice appears.
    let with_view = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args(["run", "--", "sh", "-c", probe])
        .output()
        .unwrap();
    assert!(
        stdout(&with_view).contains("CREATED"),
        "{}",
        text(&with_view)
    );
    assert!(
        !String::from_utf8_lossy(&with_view.stderr).contains("no private view"),
        "{}",
        text(&with_view)
    );
}

/// The private view for an unprivileged user, not only for root: as `nobody` (dropped with
/// setpriv when the suite runs as root), a pathname socket outside the grants is reachable
/// without the sandbox (the control) and absent inside it.
#[test]
fn the_view_hides_outside_sockets_from_an_unprivileged_user_too() {
    let python = "/usr/bin/python3";
    let is_root = nix::unistd::geteuid().is_root();
    if !std::path::Path::new(python).exists()
        || (is_root && !std::path::Path::new("/usr/bin/setpriv").exists())
    {
        common::skip("python3", "python3 or setpriv is missing");
        return;
    }
    let env = common::Env::new();
    let user = common::UserDirs::new(env.path(), "nobody", common::BIN, true);
    let world = |p: &std::path::Path, mode: u32| {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap()
    };
    // A "tmux server" outside every grant, reachable by anyone outside the sandbox.
    let socket = env.path().join("tmux-like.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    world(&socket, 0o777);
    let connect = format!(
        "import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect({:?})\n    \
         print('REACHED')\nexcept OSError as e:\n    print('absent', e.errno)\n",
        socket.display().to_string()
    );
    let as_nobody =
        |args: &[&str]| -> std::process::Output { user.command(args).output().unwrap() };
    let control = as_nobody(&[python, "-c", &connect]);
    assert!(stdout(&control).contains("REACHED"), "{}", text(&control));
    let _ = listener.accept();
    let bin = user.bin_str();
    let doctor = as_nobody(&[bin, "doctor", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
    if report["private_view"]["available"] != serde_json::json!(true) {
        common::skip(
            "unprivileged-private-view",
            format_args!(
                "no private view for an unprivileged user here: {}",
                report["private_view"]["reason"]
            ),
        );
        return;
    }
    let inside = as_nobody(&[bin, "run", "--", python, "-c", &connect]);
    assert_eq!(inside.status.code(), Some(0), "{}", text(&inside));
    assert!(stdout(&inside).contains("absent 2"), "{}", text(&inside));
}

/// Terminals, devices and modes, from the attacker's side, as root and as `nobody`: another
/// terminal of the same user (a pty the test opens and, as root, gives to `nobody`) can be
/// read and written without the sandbox (the control) and not from inside; `script` opens a
/// new pseudo-terminal inside; a setuid file cannot be made; the host's `/dev/null` cannot
/// be chmod-ed (as root, its owner; the control changes it to the mode it has).
#[test]
fn other_terminals_devices_and_setuid_bits_are_out_of_reach_for_root_and_nobody() {
    let is_root = nix::unistd::geteuid().is_root();
    let mut users = vec![false];
    if is_root {
        if std::path::Path::new("/usr/bin/setpriv").exists() {
            users.push(true);
        } else {
            common::skip("setpriv", "as nobody: /usr/bin/setpriv is missing");
        }
    }
    for as_nobody in users {
        let who = if as_nobody { "nobody" } else { "the test user" };
        let env = common::Env::new();
        let user = common::UserDirs::new(env.path(), "u", common::BIN, as_nobody);
        let pty = nix::pty::openpty(None, None).unwrap();
        let tty = std::fs::read_link(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&pty.slave)
        ))
        .unwrap();
        if as_nobody {
            // nobody's own other terminal.
            let id = sandbox_testkit::nobody::NOBODY;
            nix::unistd::chown(
                &tty,
                Some(nix::unistd::Uid::from_raw(id)),
                Some(nix::unistd::Gid::from_raw(id)),
            )
            .unwrap();
        }
        let bin = user.bin_str();
        let cmd = |args: &[&str]| -> std::process::Output {
            user.command(args).stdin(Stdio::null()).output().unwrap()
        };
        let doctor = cmd(&[bin, "doctor", "--json"]);
        let report: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
        if report["private_view"]["available"] != serde_json::json!(true) {
            common::skip(
                "private-view",
                format_args!(
                    "{who}: no private view here: {}",
                    report["private_view"]["reason"]
                ),
            );
            continue;
        }
        let attack = format!(
            "IFS= read -r line < {0} && echo \"got=$line\"; echo pwned-tty > {0}; \
             script -qc 'echo in-a-pty' /dev/null; \
             cp /bin/sh suid; chmod 4755 suid; chmod \"$(stat -c %a /dev/null)\" /dev/null; true",
            tty.display()
        );
        let null_ctime = || {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata("/dev/null").unwrap();
            (m.ctime(), m.ctime_nsec())
        };
        let setuid = || {
            std::fs::metadata(user.work.join("suid")).is_ok_and(|m| {
                std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o6000 != 0
            })
        };
        let master = pty.master.try_clone().unwrap();
        let type_line = || nix::unistd::write(&master, b"typed-secret\n").unwrap();
        let drain = || {
            nix::fcntl::fcntl(
                std::os::fd::AsRawFd::as_raw_fd(&master),
                nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
            )
            .unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) =
                nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(&master), &mut buf)
            {
                seen.extend_from_slice(&buf[..n]);
            }
            String::from_utf8_lossy(&seen).into_owned()
        };

        // The control: the same script with no sandbox.
        type_line();
        let before = null_ctime();
        let control = cmd(&["/bin/sh", "-c", &attack]);
        assert!(
            stdout(&control).contains("got=typed-secret"),
            "{who}: control: {}",
            text(&control)
        );
        assert!(
            drain().contains("pwned-tty"),
            "{who}: control wrote nothing"
        );
        assert!(setuid(), "{who}: control made no setuid file");
        assert_eq!(
            null_ctime() != before,
            !as_nobody,
            "{who}: control's chmod of /dev/null"
        );
        std::fs::remove_file(user.work.join("suid")).unwrap();
        // Whatever the control left unread.
        let _ = drain();

        type_line();
        let before = null_ctime();
        let inside = cmd(&[bin, "run", "--", "/bin/sh", "-c", &attack]);
        assert_eq!(inside.status.code(), Some(0), "{who}: {}", text(&inside));
        let shown = stdout(&inside);
        assert!(
            !shown.contains("got="),
            "{who}: read another terminal: {shown}"
        );
        assert!(
            !drain().contains("pwned-tty"),
            "{who}: wrote to another terminal"
        );
        assert!(
            shown.contains("in-a-pty"),
            "{who}: script found no pty: {}",
            text(&inside)
        );
        assert!(!setuid(), "{who}: a setuid file was left in the worktree");
        assert_eq!(null_ctime(), before, "{who}: /dev/null was chmod-ed");
    }
}

/// With the view every command runs in a pid namespace of its own: it is pid 2 (our init is
/// 1), its `/proc` is the namespace's (no host process in it, this test's own included), and
/// its exit status reaches the caller exactly: its code, or 128+N for the signal N that
/// killed it. Skipped where the probe finds no pid namespace (then runs say so).
#[test]
fn a_command_is_pid_2_of_its_own_namespace_and_its_status_is_exact() {
    let f = Fixture::new();
    let doctor = stdout(&sandbox(&f, &["doctor"]));
    if !doctor.contains("pid namespace: the command is pid 2") {
        common::skip(
            "no-pid-namespace",
            format_args!("no pid namespace on this machine: {doctor}"),
        );
        return;
    }
    let me = std::process::id();
    let out = sandbox(
        &f,
        &[
            "run",
            "--",
            "sh",
            "-c",
            "echo $$; ls /proc | grep -E '^[0-9]+$'",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let mut lines = stdout(&out).lines().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(lines.remove(0), "2", "{}", text(&out));
    let pids: Vec<u32> = lines.iter().map(|l| l.parse().unwrap()).collect();
    assert!(pids.contains(&1) && pids.contains(&2), "{pids:?}");
    assert!(
        !pids.contains(&me),
        "the host's pid {me} is visible: {pids:?}"
    );
    for (script, code) in [
        ("exit 7", 7),
        ("kill -TERM $$", 143),
        ("kill -SEGV $$", 139),
        ("kill -KILL $$", 137),
    ] {
        let out = sandbox(&f, &["run", "--", "sh", "-c", script]);
        assert_eq!(out.status.code(), Some(code), "{script}: {}", text(&out));
    }
}
