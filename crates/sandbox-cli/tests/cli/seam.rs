//! One backend seam for `sandbox run` and the daemon: the same backends, checks and
//! judgements on both paths. Each test drives the real `sandbox` binary and a real daemon over
//! a real repository with a linked worktree.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Output, Stdio};

use common::daemon::{req, Daemon};
use common::escape::Fixture;
use common::text;
use serde_json::json;

fn write_exec(path: &Path, body: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, body).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A reviewed launcher outside everything the sandbox can write: runs the command after
/// `--`, or refuses (exit 7) when the command is `refuse-me`.
fn install_launcher(f: &Fixture) {
    let launcher = f.env.path().join("launchers/launch");
    write_exec(
        &launcher,
        "#!/bin/sh\nwhile [ \"$#\" -gt 0 ] && [ \"$1\" != -- ]; do shift; done\nshift\n\
         for a in \"$@\"; do [ \"$a\" = refuse-me ] && { echo 'launcher: refused' >&2; exit 7; }; done\n\
         exec \"$@\"\n",
    );
    let out = f
        .env
        .cmd()
        .args(["config", "set", "backends.custom.command"])
        .arg(&launcher)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
}

fn sandbox_run(f: &Fixture, backend: &str, flags: &[&str], script: &str) -> Output {
    f.env
        .cmd()
        .current_dir(&f.task)
        .args(["run", "--backend", backend])
        .args(flags)
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn backends_here() -> Vec<&'static str> {
    let mut backends = vec!["native", "host", "custom"];
    if common::nono_path().is_some() {
        backends.push("nono");
    } else {
        common::skip("nono", common::NONO_MISSING);
    }
    backends
}

#[test]
fn box_exec_runs_under_every_backend_that_runs_here() {
    for backend in backends_here() {
        let f = Fixture::new();
        install_launcher(&f);
        let daemon = Daemon::start(&f.env);
        let script =
            "echo \"backend=$SANDBOX_BACKEND box=$SANDBOX_BOX\"; echo made > made-in-box; exit 3";
        let out = daemon.run_once(&f.task, json!({"backend": backend}), &["sh", "-c", script]);
        assert_eq!(out.status.code(), Some(3), "{backend}: {}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains(&format!("backend={backend} box=once-")),
            "{backend}: {}",
            text(&out)
        );
        assert!(f.task.join("made-in-box").exists(), "{backend}");
        // The same command through `sandbox run` gives the same status.
        let out = sandbox_run(&f, backend, &[], script);
        assert_eq!(out.status.code(), Some(3), "{backend}: {}", text(&out));
    }
}

#[test]
fn a_nono_setup_failure_is_125_through_the_daemon_too() {
    if common::nono_path().is_none() {
        common::skip("nono", common::NONO_MISSING);
        return;
    }
    let f = Fixture::new();
    // nono itself refuses to grant its own state directory: a real setup failure.
    let state = f.home.join(".nono");
    std::fs::create_dir_all(&state).unwrap();
    let daemon = Daemon::start(&f.env);
    let out = daemon.run_once(
        &f.task,
        json!({"backend": "nono", "allowRead": [state]}),
        &["sh", "-c", "echo ran > ran-marker; exit 1"],
    );
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("protected nono state root"),
        "nono's own message: {err}"
    );
    assert!(err.contains("nono could not set up the sandbox"), "{err}");
    assert!(!f.task.join("ran-marker").exists());
    // `sandbox run` says the same.
    let out = sandbox_run(
        &f,
        "nono",
        &["--allow-read", state.to_str().unwrap()],
        "exit 1",
    );
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    // The command's own failure stays its own.
    let out = daemon.run_once(&f.task, json!({"backend": "nono"}), &["sh", "-c", "exit 1"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("nono could not"));
}

#[test]
fn the_nono_manifest_lives_as_long_as_the_box() {
    if common::nono_path().is_none() {
        common::skip("nono", common::NONO_MISSING);
        return;
    }
    let f = Fixture::new();
    let daemon = Daemon::start(&f.env);
    let manifests = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&daemon.runtime)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            // The manifest directories (`nono-XXXXXX/`), not nono's version cache file.
            .filter(|p| {
                p.is_dir()
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("nono-"))
            })
            .collect()
    };
    let mut client = daemon.client();
    daemon
        .create(&mut client, "keep", &f.task, json!({"backend": "nono"}))
        .unwrap();
    let written = manifests();
    assert_eq!(written.len(), 1, "one manifest per box: {written:?}");
    // Two commands later (each started by nono reading it), it is still there...
    for _ in 0..2 {
        let reply = client
            .call(&req(
                "box.exec",
                json!({"name": "keep", "command": "true", "args": []}),
            ))
            .unwrap();
        let out = common::daemon::collect(&mut client, reply["execId"].as_u64().unwrap());
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert!(written[0].join("manifest.json").is_file());
    }
    // ...and removing the box removes it.
    client
        .call(&req("box.remove", json!({"name": "keep"})))
        .unwrap();
    assert!(manifests().is_empty(), "{:?}", manifests());
}

#[test]
fn a_custom_launcher_is_judged_and_placed_the_same_through_the_daemon() {
    let f = Fixture::new();
    install_launcher(&f);
    let daemon = Daemon::start(&f.env);
    // A refusal: the launcher's status, and the daemon says it was the launcher.
    let out = daemon.run_once(&f.task, json!({"backend": "custom"}), &["refuse-me"]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("launcher: refused"), "{err}");
    assert!(err.contains("custom: the launcher"), "{err}");
    assert!(err.contains("exited with status 7"), "{err}");
    let out = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args(["run", "--backend", "custom", "--", "refuse-me"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("exited with status 7"));

    // A launcher the sandbox could replace is refused when the box is created, as by
    // `sandbox run`, before anything runs.
    let inside = f.task.join("launch");
    write_exec(&inside, "#!/bin/sh\nexec \"$@\"\n");
    let out = f
        .env
        .cmd()
        .args(["config", "set", "backends.custom.command"])
        .arg(&inside)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    // The daemon read its configuration at start: a new one sees the new launcher.
    drop(daemon);
    let daemon = Daemon::start(&f.env);
    let out = daemon.run_once(&f.task, json!({"backend": "custom"}), &["true"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("refusing the launcher"),
        "{}",
        text(&out)
    );
    let out = sandbox_run(&f, "custom", &[], "true");
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
}

/// An orphan that left the command's process group rewrites the worktree's `.git` pointer
/// in a loop. Once the exit is reported, the pointer must hold its old bytes and the
/// rewriter must be gone: the seam finishes a command only after every process of it is
/// gone, so no rewrite can land after the check.
///
/// Where the private view exists the pointer is bound read-only and cannot be rewritten at
/// all, so this runs the native backend as on a host without user namespaces (Landlock and
/// seccomp only), where the pointer is writable and only the check after the run restores it.
#[test]
fn a_pointer_rewritten_by_an_orphan_after_its_command_is_repaired() {
    if let Some(why) = common::escape::nouserns_unavailable() {
        common::skip("nouserns-harness", why);
        return;
    }
    let f = Fixture::new();
    let wrapper = common::escape::NOUSERNS_WRAPPER;
    let pointer = f.task.join(".git");
    let before = std::fs::read_to_string(&pointer).unwrap();
    let script = "setsid sh -c 'echo $$ > orphan.pid; while :; do echo \"gitdir: /tmp/evil\" > .git; done' & \
                  until grep -q evil .git 2>/dev/null; do :; done; echo leader-done";
    let daemon = Daemon::start_with(&f.env, f.env.cmd_under(&wrapper));
    for path in ["daemon", "sandbox run"] {
        // The timeouts only turn a regression (a pointer that cannot be rewritten) into a
        // failure instead of a hang; the run itself ends on its own at once.
        let out = match path {
            "daemon" => daemon.run_once(
                &f.task,
                json!({"backend": "native", "timeoutMs": 120_000}),
                &["sh", "-c", script],
            ),
            _ => f
                .env
                .cmd_under(&wrapper)
                .current_dir(&f.task)
                .args(["run", "--backend", "native", "--timeout", "120s", "--"])
                .args(["sh", "-c", script])
                .stdin(Stdio::null())
                .output()
                .unwrap(),
        };
        assert_eq!(out.status.code(), Some(0), "{path}: {}", text(&out));
        assert!(String::from_utf8_lossy(&out.stdout).contains("leader-done"));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("restored it"),
            "{path}: the repair is reported: {}",
            text(&out)
        );
        let orphan: i32 = std::fs::read_to_string(f.task.join("orphan.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(
            !common::alive(orphan),
            "{path}: the rewriter {orphan} still runs"
        );
        assert_eq!(
            std::fs::read_to_string(&pointer).unwrap(),
            before,
            "{path}: the pointer holds its old bytes"
        );
        std::fs::remove_file(f.task.join("orphan.pid")).unwrap();
    }
}

#[test]
fn a_grant_inside_a_trusted_place_is_refused_by_run_and_box_create() {
    let f = Fixture::new();
    let daemon = Daemon::start(&f.env);
    let token = daemon.paths().host_token();
    assert!(token.is_file());
    let config = f.env.config_file();
    f.env.write_config("timeout: 10m\n");
    for (flag, path, says) in [
        ("--allow-read", &token, "control every sandbox"),
        ("--allow-write", &config, "change its own boundary"),
    ] {
        let out = sandbox_run(&f, "native", &[flag, path.to_str().unwrap()], "true");
        assert_eq!(out.status.code(), Some(125), "{flag}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("lies inside") && err.contains(says), "{err}");
    }
    // The daemon runs the same check at box.create.
    let mut client = daemon.client();
    let refused = daemon
        .create(
            &mut client,
            "greedy",
            &f.task,
            json!({"backend": "native", "allowRead": [token]}),
        )
        .unwrap_err()
        .to_string();
    assert!(refused.contains("lies inside"), "{refused}");
    assert!(refused.contains("control every sandbox"), "{refused}");
    // Reading the configuration stays allowed.
    let out = sandbox_run(
        &f,
        "native",
        &["--allow-read", config.to_str().unwrap()],
        "cat \"$0\" >/dev/null; true",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn backends_this_build_lacks_are_refused_not_remembered() {
    let f = Fixture::new();
    // With the `boxlite` feature every backend is built (tests/cli/boxlite.rs covers BoxLite).
    if !cfg!(feature = "boxlite") {
        let backend = "boxlite";
        let out = f
            .env
            .cmd()
            .current_dir(&f.task)
            .args(["use", backend])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{backend}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("does not include"),
            "{}",
            text(&out)
        );
        let out = sandbox_run(&f, backend, &[], "true");
        assert_eq!(out.status.code(), Some(125), "{backend}: {}", text(&out));
    }
    // Nothing was remembered: the worktree still uses the default.
    let out = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args(["use", "--json"])
        .output()
        .unwrap();
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["backend"], "native", "{}", text(&out));
    // Through the daemon, too.
    let daemon = Daemon::start(&f.env);
    let mut client = daemon.client();
    let refused = daemon
        .create(&mut client, "vm", &f.task, json!({"backend": "boxlite"}))
        .unwrap_err()
        .to_string();
    if cfg!(feature = "boxlite") {
        assert!(refused.contains("needs an image"), "{refused}");
    } else {
        assert!(refused.contains("does not include"), "{refused}");
        assert!(refused.contains("--features boxlite"), "{refused}");
    }
    // Lima is built: without a limactl, box.create fails closed and says what is missing.
    let refused = daemon
        .create(&mut client, "vm", &f.task, json!({"backend": "lima"}))
        .unwrap_err()
        .to_string();
    assert!(refused.contains("limactl not found"), "{refused}");
}

#[test]
fn doctor_and_host_describe_agree_on_what_is_available() {
    let f = Fixture::new();
    install_launcher(&f);
    let out = f.env.cmd().args(["doctor", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let doctor: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let daemon = Daemon::start(&f.env);
    let describe = daemon
        .client()
        .call(&req("host.describe", json!({})))
        .unwrap();
    let by_name = |list: &serde_json::Value| -> Vec<(String, bool)> {
        list.as_array()
            .unwrap()
            .iter()
            .map(|b| {
                (
                    b["name"].as_str().unwrap().to_string(),
                    b["available"].as_bool().unwrap(),
                )
            })
            .collect()
    };
    let from_doctor = by_name(&doctor["backends"]);
    assert_eq!(from_doctor, by_name(&describe["backends"]));
    // On this machine native, host and the configured launcher run; the VMs are not built.
    for (name, available) in &from_doctor {
        let expected = match name.as_str() {
            "native" | "host" | "custom" => true,
            "nono" => common::nono_path().is_some(),
            _ => false,
        };
        assert_eq!(*available, expected, "{name}: {doctor}");
    }
}
