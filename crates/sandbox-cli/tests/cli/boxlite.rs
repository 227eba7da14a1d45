//! BoxLite boxes through the real daemon (`sandbox serve`) and the real BoxLite runtime: the
//! protocol calls, their `boxState` events, reuse by name, the specific errors, and reaping
//! by pid. Where the boot cannot work (docs/boxlite.md, "On this build machine": no guest boots
//! through this build machine's own KVM, only inside a TCG guest with nested KVM) the
//! start must fail with the specific error and its log paths, and the parts that need a
//! booted guest print `skipped: <reason>`.
//!
//! Needs the runtime files (`cargo xtask boxlite-runtime`); built with `--features boxlite`.
#![cfg(feature = "boxlite")]

use crate::common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::daemon::{req, Daemon};
use common::{alive, wait_dead, Env};
use sandbox_boxlite::layout;
use sandbox_protocol::{ErrorCode, Incoming};
use sandbox_service::{Client, ClientError};
use serde_json::{json, Value};

const GONE: Duration = Duration::from_secs(30);

/// `cargo xtask box-image`'s layout: a real Debian userland with the shell and coreutils the
/// booted checks run (a layout without them would pass only where no guest boots).
fn image(_env: &Env) -> PathBuf {
    layout::test_box_image().expect(
        "the box image: run `cargo xtask box-image` (target/box-image) or set \
         SANDBOX_TEST_BOX_IMAGE to an OCI layout",
    )
}

/// Whether this machine's KVM boots guests, judged before any boot.
fn bootable() -> sandbox_boxlite::host::KvmBootable {
    sandbox_boxlite::host::kvm_bootable(Path::new("/dev/kvm"))
}

fn boxlite_home(env: &Env) -> PathBuf {
    env.home().join(".local/share/sandbox/boxlite")
}

/// Shuts down the daemon a test's `sandbox exec` started (it outlives the command).
fn shut_down_daemon(env: &Env) {
    let paths = sandbox_service::RuntimePaths::new(env.path().join("run/sandbox"));
    if let Ok(mut c) = Client::connect_authenticated(&paths, "test") {
        let _ = c.call(&req("shutdown", json!({})));
    }
}

/// A repository `repo` with one commit on `main` and a linked worktree `task` on `task`.
fn repo_with_linked_task(env: &Env) -> (PathBuf, PathBuf) {
    let repo = env.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    sandbox_testkit::git(&repo, &["init", "-q", "-b", "main"]);
    sandbox_testkit::git(&repo, &["commit", "-q", "--allow-empty", "-m", "base"]);
    let task = env.path().join("task");
    sandbox_testkit::add_worktree(&repo, &task, "task");
    (repo, task)
}

fn rpc(e: &ClientError) -> (ErrorCode, String, Value) {
    match e {
        ClientError::Rpc(e) => (
            e.code,
            e.message.clone(),
            e.data.clone().unwrap_or(Value::Null),
        ),
        other => panic!("not an RPC error: {other}"),
    }
}

/// The `boxState` events, as JSON, up to the first for which `until` holds.
fn states(client: &mut Client, until: impl Fn(&Value) -> bool) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        let e: Incoming = client.next_event().unwrap();
        if e.kind.as_deref() != Some("boxState") {
            continue;
        }
        let body = json!({
            "boxId": e.box_id, "name": e.name, "state": e.state.map(|s| s.as_str()),
            "elapsedMs": e.elapsed_ms, "step": e.step, "stepState": e.step_state,
            "stepMs": e.step_ms, "stepError": e.step_error,
        });
        let done = until(&body);
        seen.push(body);
        if done {
            return seen;
        }
    }
}

#[test]
fn boxes_are_created_reused_started_stopped_and_removed_through_the_daemon() {
    let kvm = bootable();
    let env = Env::new();
    let d = Daemon::start(&env);
    let mut c = d.client();
    let work = env.work();
    let extra = env.path().join("extra");
    std::fs::create_dir(&extra).unwrap();
    let rootfs = image(&env);
    let params = json!({
        "name": "agent", "backend": "boxlite", "workdir": work, "rootfs": rootfs,
        "cpus": 1, "memoryMib": 512, "diskSizeGb": 2,
        "mounts": [{"host": extra, "guest": "/extra", "readOnly": true}],
        "allowNet": ["example.org", "10.0.0.0/8"], "env": {"GREETING": "hi"},
    });
    let t = Instant::now();
    let created = c.call(&req("box.create", params.clone())).unwrap();
    let create_ms = t.elapsed().as_millis();
    assert_eq!(created["backend"], "boxlite");
    assert_eq!(created["created"], true);
    assert_eq!(created["kept"], false);
    let vm_id = created["vmId"].as_str().unwrap().to_string();
    let box_dir = boxlite_home(&env).join("boxes").join(&vm_id);
    assert!(
        created["logs"]["shimStderr"]
            .as_str()
            .unwrap()
            .starts_with(&*box_dir.to_string_lossy()),
        "{created}"
    );
    // The steps of box.create arrive before its reply, with their times.
    let events = states(&mut c, |e| e["state"] == "created");
    let steps: Vec<(&str, &str)> = events
        .iter()
        .filter_map(|e| Some((e["step"].as_str()?, e["stepState"].as_str()?)))
        .collect();
    assert_eq!(
        steps,
        [
            ("opening the BoxLite runtime", "done"),
            ("creating the box", "done")
        ],
        "{events:?}"
    );
    let last = events.last().unwrap();
    assert!(
        last["elapsedMs"].as_u64().unwrap() as u128 <= create_ms,
        "{last}"
    );
    assert!(events.iter().all(|e| e["boxId"] == created["boxId"]));

    // The same name and settings: the same box. Other settings: refused.
    let again = c.call(&req("box.create", params.clone())).unwrap();
    assert_eq!(
        (again["created"].clone(), again["boxId"].clone()),
        (json!(false), created["boxId"].clone())
    );
    let mut other = params.clone();
    other["cpus"] = json!(2);
    assert_eq!(
        rpc(&c.call(&req("box.create", other)).unwrap_err()).0,
        ErrorCode::BoxExists
    );
    let list = c.call(&req("box.list", json!({}))).unwrap();
    assert_eq!(list[0]["name"], "agent");
    assert_eq!(list[0]["backend"], "boxlite");
    assert_eq!(list[0]["state"], "created");

    // Commands need a started box.
    let refused = c
        .call(&req(
            "box.exec",
            json!({"name": "agent", "command": "true"}),
        ))
        .unwrap_err();
    assert_eq!(rpc(&refused).0, ErrorCode::BoxState);

    match c.call(&req("box.start", json!({"name": "agent"}))) {
        Ok(started) => {
            assert!(started["bootMs"].as_u64().unwrap() > 0);
            let id = c
                .call(&req(
                    "box.exec",
                    json!({"name": "agent", "command": "sh", "args": ["-c", "echo $GREETING; ls /extra; exit 7"]}),
                ))
                .unwrap()["execId"]
                .as_u64()
                .unwrap();
            let out = common::daemon::collect(&mut c, id);
            assert_eq!(out.status.code(), Some(7));
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).lines().next(),
                Some("hi")
            );
        }
        Err(e) if !kvm.bootable => {
            let (code, message, data) = rpc(&e);
            assert_eq!(code, ErrorCode::BackendUnavailable, "{message}");
            let stderr = data["logs"]["shimStderr"].as_str().unwrap();
            assert!(
                Path::new(stderr).is_file(),
                "{stderr} is named but missing: {message}"
            );
            assert!(message.contains(stderr), "{message}");
            // The boot step was announced, failed, with the same words.
            let events = states(&mut c, |e| e["step"] == "booting the VM");
            assert_eq!(events.last().unwrap()["stepState"], "failed");
            sandbox_testkit::skip(
                "guest-boot",
                format_args!(
                    "commands in a booted box through the daemon ({}): {message}",
                    kvm.detail
                ),
            );
        }
        Err(e) => panic!(
            "guests boot here ({}), but box.start failed: {}",
            kvm.detail,
            rpc(&e).1
        ),
    }

    let stopped = c.call(&req("box.stop", json!({"name": "agent"}))).unwrap();
    assert_eq!(stopped, json!({"ok": true}));
    c.call(&req("box.remove", json!({"name": "agent"})))
        .unwrap();
    assert_eq!(c.call(&req("box.list", json!({}))).unwrap(), json!([]));
    assert!(!box_dir.exists(), "box.remove deleted the VM and its disks");
}

#[test]
fn bad_boxes_are_refused_with_the_reason_and_nothing_is_created() {
    let env = Env::new();
    let d = Daemon::start(&env);
    let mut c = d.client();
    let work = env.work();
    let empty = env.path().join("not-a-layout");
    std::fs::create_dir(&empty).unwrap();
    let cases = [
        (json!({"rootfs": empty}), "image missing"),
        (json!({}), "needs an image"),
        (
            json!({"rootfs": image(&env), "image": "debian"}),
            "not both",
        ),
        (
            json!({"rootfs": image(&env), "allowNet": ["http://x"]}),
            "allowNet",
        ),
        (json!({"rootfs": image(&env), "cpus": 0}), "cpus"),
        (
            json!({"rootfs": image(&env), "mounts": [{"host": "/nonexistent-dir"}]}),
            "mount",
        ),
        (
            json!({"rootfs": image(&env), "allowPorts": [80]}),
            "allowPorts",
        ),
    ];
    for (extra, words) in cases {
        let mut p = json!({"name": "bad", "backend": "boxlite", "workdir": work});
        for (k, v) in extra.as_object().unwrap() {
            p[k] = v.clone();
        }
        let (code, message, _) = rpc(&c.call(&req("box.create", p.clone())).unwrap_err());
        assert_eq!(code, ErrorCode::InvalidParams, "{p}: {message}");
        assert!(message.contains(words), "{p}: {message}");
    }
    // A mount that reaches the user's configuration is denied, as for every backend.
    let config = env.home().join(".config");
    let p = json!({"name": "bad", "backend": "boxlite", "workdir": work, "rootfs": image(&env),
                   "mounts": [{"host": config}]});
    let (code, message, _) = rpc(&c.call(&req("box.create", p)).unwrap_err());
    assert_eq!(code, ErrorCode::Denied, "{message}");
    // A writable mount that reaches the repository's git data: the box could write a hook
    // that runs on the host. Read-only, it is taken.
    let repo = env.path().join("repo");
    let task = env.path().join("task");
    sandbox_testkit::linked_worktree(&repo, &task);
    let p = json!({"name": "bad", "backend": "boxlite", "workdir": task, "rootfs": image(&env),
                   "mounts": [{"host": repo, "guest": "/repo"}]});
    let (code, message, _) = rpc(&c.call(&req("box.create", p)).unwrap_err());
    assert_eq!(code, ErrorCode::InvalidParams, "{message}");
    assert!(message.contains("git directory"), "{message}");
    // The VM fields mean nothing to a backend on the host's file system.
    let p = json!({"name": "bad", "backend": "native", "workdir": work, "image": "debian"});
    let (code, message, _) = rpc(&c.call(&req("box.create", p)).unwrap_err());
    assert_eq!(code, ErrorCode::InvalidParams, "{message}");
    assert!(message.contains("image"), "{message}");
    assert_eq!(c.call(&req("box.list", json!({}))).unwrap(), json!([]));
}

/// The shim of a box that is booting, found by its pid file, dies with the daemon.
#[test]
fn killing_the_daemon_kills_the_box_shims() {
    let env = Env::new();
    let d = Daemon::start(&env);
    let mut c = d.client();
    let params = json!({"name": "reaped", "backend": "boxlite", "workdir": env.work(),
                        "rootfs": image(&env)});
    let created = c.call(&req("box.create", params)).unwrap();
    let box_dir = boxlite_home(&env)
        .join("boxes")
        .join(created["vmId"].as_str().unwrap());
    // Start it without waiting for the reply: the boot takes seconds (and fails here).
    c.send(&req("box.start", json!({"name": "reaped"})))
        .unwrap();
    let pid_file = box_dir.join("shim.pid");
    let deadline = Instant::now() + Duration::from_secs(60);
    let shim = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            // "PID\nSTART-TIME\n…": the first line is the pid.
            .and_then(|s| s.lines().next()?.trim().parse::<i32>().ok())
            .filter(|&p| alive(p))
        {
            break pid;
        }
        if Instant::now() > deadline {
            let reply = loop {
                let f = c.next_frame().unwrap();
                if f.is_reply() {
                    break f;
                }
            };
            panic!("no shim started: {reply:?} {}", d.log.lock().unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // bwrap (the jailer) execs the shim in a moment: wait for the shim itself.
    let tree = loop {
        let mut tree = vec![shim];
        tree.extend(descendants(shim));
        if tree
            .iter()
            .any(|&p| comm(p).as_deref() == Some("boxlite-shim"))
        {
            break tree;
        }
        assert!(
            Instant::now() < deadline && alive(shim),
            "the shim never ran under {shim}: {tree:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    for pid in &tree {
        assert!(
            wait_dead(*pid, GONE),
            "pid {pid} ({:?}) outlived the daemon",
            comm(*pid)
        );
    }
}

/// The program's file name (not `comm`: libkrun renames its threads).
fn comm(pid: i32) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let argv0 = cmdline.split(|&b| b == 0).next()?;
    let name = String::from_utf8_lossy(argv0);
    Some(name.rsplit('/').next()?.to_string())
}

fn descendants(root: i32) -> Vec<i32> {
    let mut all = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let ppid = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<i32>().ok());
            if ppid == Some(parent) {
                all.push(pid);
                frontier.push(pid);
            }
        }
    }
    all
}

/// `sandbox exec --backend boxlite`: through the daemon (started on demand), the box created
/// and then reused by name, the boot's steps and failure on stderr, stdout untouched.
#[test]
fn exec_routes_through_the_daemon_and_keeps_stdout_clean() {
    let kvm = bootable();
    let env = Env::new();
    let rootfs = image(&env);
    let exec = |args: &[&str], stdin: &[u8]| {
        let mut child = env
            .cmd()
            .args(["exec", "--backend", "boxlite", "--box", "proxy", "--rootfs"])
            .arg(&rootfs)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        child.wait_with_output().unwrap()
    };
    let out = exec(&["--", "cat"], b"\x00\xffbytes\n");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    // The daemon this started is stopped at the end.
    let stop = || shut_down_daemon(&env);
    assert!(stderr.contains("box proxy: creating the box"), "{stderr}");
    match out.status.code() {
        Some(0) => assert_eq!(out.stdout, b"\x00\xffbytes\n", "byte for byte"),
        Some(125) if !kvm.bootable => {
            assert!(out.stdout.is_empty(), "nothing of ours on stdout");
            assert!(stderr.contains("shim.stderr"), "{stderr}");
            sandbox_testkit::skip(
                "guest-boot",
                format_args!(
                    "the byte-exact relay through a booted box ({}): {stderr}",
                    kvm.detail
                ),
            );
        }
        other => panic!("{other:?}: {stderr}"),
    }
    // Reused by name: the second exec finds the box.
    let again = exec(&["--", "true"], b"");
    let stderr = String::from_utf8_lossy(&again.stderr).into_owned();
    assert!(stderr.contains("reusing box proxy"), "{stderr}");
    stop();
}

/// `sandbox exec` in git worktrees, in a booted box: the worktree is writable, the
/// repository's git directory (and a linked worktree's `.git` pointer) read-only inside (the
/// guest honours the nested read-only mounts), git reads history: a linked worktree without
/// the network, a main one with it. (A linked one with the network, its view composed on
/// the host: the next test.)
#[test]
fn exec_in_worktrees_keeps_git_read_only_and_fits_the_network() {
    let kvm = bootable();
    if !kvm.bootable {
        sandbox_testkit::skip(
            "guest-boot",
            format_args!("git worktrees in a booted box: {}", kvm.detail),
        );
        return;
    }
    let env = Env::new();
    let rootfs = image(&env);
    let (repo, task) = repo_with_linked_task(&env);
    let common = std::fs::canonicalize(repo.join(".git")).unwrap();
    let config_before = std::fs::read(common.join("config")).unwrap();
    let pointer_before = std::fs::read(task.join(".git")).unwrap();
    let script = format!(
        r#"echo x > made-in-box && echo worktree-writable
(echo '[core] hooksPath = /x' >> '{common}/config') 2>/dev/null && echo COMMON-WRITTEN
[ -f .git ] && {{ (echo 'gitdir: /tmp' > .git) 2>/dev/null && echo POINTER-WRITTEN; }}
git -c safe.directory='*' log -1 --format=%s && echo git-reads
true"#,
        common = common.display()
    );
    let stop = || shut_down_daemon(&env);
    let exec = |dir: &Path, name: &str, net: &[&str]| {
        env.cmd()
            .current_dir(dir)
            .args(["exec", "--backend", "boxlite", "--box", name, "--rootfs"])
            .arg(&rootfs)
            .args(net)
            .args(["--", "sh", "-c", &script])
            .output()
            .unwrap()
    };
    for (dir, name, net) in [
        (&task, "linked-offline", &["--block-net"][..]),
        (&repo, "main-online", &[][..]),
    ] {
        let out = exec(dir, name, net);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if out.status.code() != Some(0) {
            stop();
            panic!("{name}: {:?}\n{stdout}\n{stderr}", out.status);
        }
        assert!(stdout.contains("worktree-writable"), "{name}: {stdout}");
        assert!(stdout.contains("base\ngit-reads"), "{name}: {stdout}");
        assert!(!stdout.contains("COMMON-WRITTEN"), "{name}: {stdout}");
        assert!(!stdout.contains("POINTER-WRITTEN"), "{name}: {stdout}");
        assert!(dir.join("made-in-box").is_file(), "{name}");
        std::fs::remove_file(dir.join("made-in-box")).unwrap();
        assert_eq!(std::fs::read(common.join("config")).unwrap(), config_before);
        assert_eq!(std::fs::read(task.join(".git")).unwrap(), pointer_before);
    }
    stop();
}

/// A linked worktree's box with the network on and the commit mounts (four mounts, more
/// than libkrun has interrupts for as a device each) boots, composed on the host; the box
/// cannot write the read-only common dir, neither at its path nor through the share; a
/// commit in the box reaches the task branch on the host; and every byte value passes
/// through `sandbox exec` unchanged.
#[test]
fn a_linked_worktrees_box_online_commits_to_its_branch_and_passes_every_byte() {
    let kvm = bootable();
    if !kvm.bootable {
        sandbox_testkit::skip(
            "guest-boot",
            format_args!("commits from a booted box: {}", kvm.detail),
        );
        return;
    }
    let env = Env::new();
    let rootfs = image(&env);
    let (repo, task) = repo_with_linked_task(&env);
    let common = std::fs::canonicalize(repo.join(".git")).unwrap();
    let config_before = std::fs::read(common.join("config")).unwrap();
    let main_before = sandbox_testkit::git(&repo, &["rev-parse", "main"]);
    let stop = || shut_down_daemon(&env);
    let exec = |args: &[&str], stdin: &[u8]| {
        let mut child = env
            .cmd()
            .current_dir(&task)
            .args([
                "exec",
                "--backend",
                "boxlite",
                "--box",
                "commits",
                "--rootfs",
            ])
            .arg(&rootfs)
            .args(["--"])
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        child.wait_with_output().unwrap()
    };
    // The common dir at its own path and through the share (as the image's user: `sandbox
    // exec` runs no command as root; the host's bind refuses root too, `EROFS` before any
    // permission, see `sandbox_boxlite::share`'s test). The shell's words say why each write
    // failed. (`test -w` is no judge here: virtio-fs answers `access` without the bind.)
    let script = format!(
        r#"(echo '[core] hooksPath = /x' >> '{common}/config') 2>&1 && echo COMMON-WRITTEN
for f in /run/sandbox-share/*/config; do (echo x >> "$f") 2>&1 && echo "SHARE-WRITTEN $f"; done
echo root-tried"#,
        common = common.display()
    );
    let root = exec(&["sh", "-c", &script], b"");
    let root_out = String::from_utf8_lossy(&root.stdout).into_owned();
    let root_err = String::from_utf8_lossy(&root.stderr).into_owned();
    if root.status.code() != Some(0) {
        stop();
        panic!("{:?}\n{root_out}\n{root_err}", root.status);
    }
    let commit = exec(
        &[
            "sh",
            "-c",
            "git -c safe.directory='*' -c user.name=box -c user.email=box@sandbox \
             commit -q --allow-empty -m in-the-box && echo committed",
        ],
        b"",
    );
    let all: Vec<u8> = (0u8..=255).chain((0u8..=255).rev()).collect();
    let bytes = exec(&["cat"], &all);
    stop();
    assert!(root_out.contains("root-tried"), "{root_out}\n{root_err}");
    assert!(!root_out.contains("COMMON-WRITTEN"), "{root_out}");
    assert!(!root_out.contains("SHARE-WRITTEN"), "{root_out}");
    // Refused as read-only (the host's bind), at its path and through the share, not merely
    // for want of permission.
    assert_eq!(
        root_out.matches("Read-only file system").count(),
        2,
        "{root_out}"
    );
    assert_eq!(std::fs::read(common.join("config")).unwrap(), config_before);
    let said = String::from_utf8_lossy(&commit.stderr).into_owned();
    assert_eq!(commit.status.code(), Some(0), "{said}");
    assert!(
        String::from_utf8_lossy(&commit.stdout).contains("committed"),
        "{said}"
    );
    assert_eq!(
        sandbox_testkit::git(&repo, &["log", "-1", "--format=%s", "task"]),
        "in-the-box",
        "the commit reached the task branch: {said}"
    );
    assert_eq!(
        sandbox_testkit::git(&repo, &["rev-parse", "main"]),
        main_before
    );
    assert_eq!(
        bytes.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&bytes.stderr)
    );
    assert_eq!(bytes.stdout, all, "every byte value, unchanged");
}

/// `sandbox exec`'s three steps in a booted box: the probe fails, the provisioning runs, the
/// probe passes, then the command runs; the next exec in the same box (its disk kept) finds
/// the probe passing and provisions nothing.
#[test]
fn exec_probes_provisions_and_runs_the_command_in_a_box() {
    let kvm = bootable();
    if !kvm.bootable {
        sandbox_testkit::skip(
            "guest-boot",
            format_args!(
                "probe, provision and command in a booted box: {}",
                kvm.detail
            ),
        );
        return;
    }
    let env = Env::new();
    let rootfs = image(&env);
    let work = env.path().join("steps");
    std::fs::create_dir(&work).unwrap();
    let exec = || {
        env.cmd()
            .current_dir(&work)
            .args(["exec", "--backend", "boxlite", "--box", "steps", "--rootfs"])
            .arg(&rootfs)
            .args([
                "--block-net",
                "--probe",
                "test -f /var/tmp/provisioned",
                "--provision",
                "touch /var/tmp/provisioned",
                "--",
                "sh",
                "-c",
                "echo command-ran",
            ])
            .output()
            .unwrap()
    };
    let first = exec();
    let second = exec();
    shut_down_daemon(&env);
    for (out, provisioned) in [(&first, true), (&second, false)] {
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "command-ran\n",
            "{stderr}"
        );
        assert_eq!(stderr.contains("provisioning"), provisioned, "{stderr}");
    }
}
