//! `sandbox exec` through the real binary, with the native backend in a real linked worktree:
//! stdout carries the command's bytes and nothing else, stdin reaches it byte for byte up to
//! EOF, exit codes pass through, and the probe / provision / probe sequence runs in order,
//! with every line of it on stderr.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::escape::{nouserns_unavailable, Fixture, NOUSERNS_WRAPPER};
use common::text;

/// Long enough for a debug build on 2 busy cores; only reached when something hangs.
const PATIENCE: Duration = Duration::from_secs(120);

/// `sandbox exec ARGS` in the fixture's worktree (native: the default backend).
fn exec(f: &Fixture, args: &[&str]) -> Command {
    exec_under(f, &[], args)
}

fn exec_under(f: &Fixture, wrapper: &[&str], args: &[&str]) -> Command {
    let mut cmd = f.env.cmd_under(wrapper);
    cmd.current_dir(&f.task)
        .arg("exec")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Spawns `cmd`, writes `input` to its stdin from another thread (the command may be
/// writing as much back: neither side may wait for the other), closes stdin, and collects
/// everything — or panics after [`PATIENCE`] instead of hanging the suite.
fn feed(mut cmd: Command, input: Vec<u8>) -> Output {
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        // A command that exits without reading everything closes the pipe: not our failure.
        let _ = stdin.write_all(&input);
    });
    let out = wait_within(child);
    writer.join().unwrap();
    out
}

/// `wait_with_output`, bounded by [`PATIENCE`] (event-driven: the waiting thread reports back).
fn wait_within(child: Child) -> Output {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(PATIENCE) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("sandbox exec (pid {pid}) did not finish within {PATIENCE:?}");
        }
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Random bytes with NULs, invalid UTF-8 and lone CR/LF up front, so that neither a text
/// conversion nor a line discipline could pass.
fn binary(len: usize) -> Vec<u8> {
    let mut data = b"\0\0\xff\xfe\xc3\x28\r\n\x1b[31m\x04\x00\x80".to_vec();
    let mut random = vec![0u8; len];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut random)
        .unwrap();
    data.extend_from_slice(&random);
    data
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn binary_data_round_trips_exactly_through_cat() {
    let f = Fixture::new();
    let input = binary(8 << 20);
    let out = feed(exec(&f, &["--", "cat"]), input.clone());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // `cat` ends only at EOF, so this also proves the command saw our stdin close.
    assert_eq!(out.stdout.len(), input.len(), "{}", stderr(&out));
    assert!(out.stdout == input, "the bytes differ");
}

#[test]
fn the_sessions_notices_go_to_stderr_never_stdout() {
    // Without user namespaces the native backend announces its missing layer on every run:
    // a real notice, which must not land in the protocol stream.
    if let Some(reason) = nouserns_unavailable() {
        common::skip("nouserns-harness", reason);
        return;
    }
    let f = Fixture::new();
    let input = binary(64 << 10);
    let out = feed(
        exec_under(&f, &NOUSERNS_WRAPPER, &["--", "cat"]),
        input.clone(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("sandbox: notice: native: no private view"),
        "the control: this run must have had a notice to print\n{}",
        stderr(&out)
    );
    assert!(out.stdout == input, "stdout is not exactly the input");
}

/// An ACP agent as a caller sees it: one JSON-RPC line per message on stdio. This one answers
/// `initialize` with the request's id, then waits for EOF and says whether it saw anything
/// else.
const ECHO_AGENT: &str = r#"import json, sys
request = json.loads(sys.stdin.buffer.readline())
reply = {"jsonrpc": "2.0", "id": request["id"],
         "result": {"protocolVersion": request["params"]["protocolVersion"],
                    "agentInfo": {"name": "echo-agent"}}}
sys.stdout.write(json.dumps(reply) + "\n")
sys.stdout.flush()
sys.exit(0 if sys.stdin.buffer.read() == b"" else 3)
"#;

#[test]
fn an_acp_initialize_reaches_the_agent_and_only_its_answer_comes_back() {
    let f = Fixture::new();
    std::fs::write(f.task.join("echo-agent.src"), ECHO_AGENT).unwrap();
    // Installed by --provision on first use, which is chatty on both of its streams.
    let mut child = exec(
        &f,
        &[
            "--box",
            "acp",
            "--probe",
            "test -f .tools/echo-agent.py",
            "--provision",
            "echo installing echo-agent; mkdir -p .tools && cp echo-agent.src .tools/echo-agent.py \
             && echo done >&2",
            "--",
            "python3",
            ".tools/echo-agent.py",
        ],
    )
    .spawn()
    .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let request = r#"{"jsonrpc":"2.0","id":"init-7","method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}"#;
    writeln!(stdin, "{request}").unwrap();
    stdin.flush().unwrap();
    // The first line on stdout is the agent's answer: nothing of ours came before it.
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let reply: serde_json::Value = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("stdout's first line is not JSON ({e}): {line:?}"));
    assert_eq!(reply["id"], "init-7", "{line}");
    assert_eq!(reply["result"]["protocolVersion"], 1, "{line}");
    assert_eq!(reply["result"]["agentInfo"]["name"], "echo-agent", "{line}");
    // Closing our end is the agent's EOF: it exits 0 only if it saw exactly that.
    drop(stdin);
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = wait_within(child);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        rest.is_empty(),
        "more on stdout: {:?}",
        String::from_utf8_lossy(&rest)
    );
    let err = stderr(&out);
    assert!(
        err.contains("installing echo-agent") && err.contains("done"),
        "{err}"
    );
}

#[test]
fn exit_codes_pass_through() {
    let f = Fixture::new();
    let cases: &[(&[&str], i32)] = &[
        (&["--", "sh", "-c", "exit 7"], 7),
        (&["--", "true"], 0),
        (&["--probe", "true", "--", "sh", "-c", "exit 42"], 42),
        (&["--", "sh", "-c", "kill -9 $$"], 137),
        (&["--", "no-such-command-here"], 127),
    ];
    for (args, want) in cases {
        let out = feed(exec(&f, args), Vec::new());
        assert_eq!(out.status.code(), Some(*want), "{args:?}\n{}", text(&out));
        assert!(out.stdout.is_empty(), "{args:?}\n{}", text(&out));
    }
}

#[test]
fn probe_then_provision_then_probe_then_the_command() {
    let f = Fixture::new();
    let log = f.task.join("order.log");
    let args = [
        "--probe",
        "echo probe >> order.log; test -f ready",
        // Provisioning tries to read stdin (it must get none: those bytes are the command's)
        // and writes to both of its streams (both must land on stderr).
        "--provision",
        "echo provision >> order.log; cat > provision-stdin; echo PROVISION-OUT; \
         echo PROVISION-ERR >&2; touch ready",
        "--",
        "sh",
        "-c",
        "echo command >> order.log; cat",
    ];
    let out = feed(exec(&f, &args), b"for the command\n".to_vec());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(read(&log), "probe\nprovision\nprobe\ncommand\n");
    assert_eq!(out.stdout, b"for the command\n", "{}", text(&out));
    let err = stderr(&out);
    assert!(
        err.contains("PROVISION-OUT") && err.contains("PROVISION-ERR"),
        "{err}"
    );
    assert_eq!(read(&f.task.join("provision-stdin")), "");

    // Ready now: the probe passes and provisioning does not run again.
    std::fs::remove_file(&log).unwrap();
    let out = feed(exec(&f, &args), b"again\n".to_vec());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(read(&log), "probe\ncommand\n");
    assert_eq!(out.stdout, b"again\n");
    assert!(!stderr(&out).contains("PROVISION"), "{}", text(&out));
}

#[test]
fn a_box_that_does_not_become_ready_runs_nothing() {
    let f = Fixture::new();
    let log = f.task.join("order.log");
    let command = ["--", "sh", "-c", "echo command >> order.log; echo RAN"];
    let cases: &[(&[&str], &str, &str)] = &[
        // Provisioning "succeeds" but the probe still fails.
        (
            &[
                "--probe",
                "echo probe >> order.log; false",
                "--provision",
                "echo provision >> order.log",
            ],
            "probe\nprovision\nprobe\n",
            "still exited with status 1 after provisioning",
        ),
        // Provisioning fails: the probe is not asked again.
        (
            &[
                "--probe",
                "echo probe >> order.log; false",
                "--provision",
                "echo provision >> order.log; exit 4",
            ],
            "probe\nprovision\n",
            "provisioning \"echo provision >> order.log; exit 4\" exited with status 4",
        ),
        // No provisioning to try.
        (
            &["--probe", "echo probe >> order.log; exit 2"],
            "probe\n",
            "exited with status 2, and no --provision was given",
        ),
    ];
    for (flags, order, message) in cases {
        let _ = std::fs::remove_file(&log);
        let args: Vec<&str> = flags.iter().chain(command.iter()).copied().collect();
        let out = feed(exec(&f, &args), Vec::new());
        assert_eq!(out.status.code(), Some(125), "{flags:?}\n{}", text(&out));
        assert_eq!(read(&log), *order, "{flags:?}");
        assert!(out.stdout.is_empty(), "{flags:?}\n{}", text(&out));
        let err = stderr(&out);
        assert!(
            err.contains("the box is not ready") && err.contains(message),
            "{flags:?}\n{err}"
        );
    }
}

#[test]
fn flags_the_backend_cannot_honour_are_refused_not_ignored() {
    let f = Fixture::new();
    let outside = f.outside.to_str().unwrap().to_string();
    let same = format!("{outside}:{outside}");
    let elsewhere = format!("{outside}:/workspace");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--image", "node:20-slim"],
            "the native backend takes no --image",
        ),
        (
            vec!["--rootfs", &outside],
            "the native backend takes no --rootfs",
        ),
        (vec!["--mount", &elsewhere], "use --mount"),
        // (--allow-net is --allow-domain, which the native backend enforces: tests/cli/net.rs.)
        (
            vec!["--box", "../escape"],
            "--box \"../escape\" is not valid",
        ),
    ];
    for (flags, message) in cases {
        let mut args = flags.clone();
        args.extend(["--", "sh", "-c", "touch ran; echo RAN"]);
        let out = feed(exec(&f, &args), Vec::new());
        assert_eq!(out.status.code(), Some(125), "{flags:?}\n{}", text(&out));
        assert!(stderr(&out).contains(message), "{flags:?}\n{}", text(&out));
        assert!(out.stdout.is_empty(), "{flags:?}\n{}", text(&out));
        assert!(!f.task.join("ran").exists(), "{flags:?} ran the command");
    }

    // The same-path mount is a read-write grant: without it the write is denied (the control),
    // with it the write lands.
    let write = format!("echo from-the-box > {outside}/mounted.txt");
    let denied = feed(exec(&f, &["--", "sh", "-c", &write]), Vec::new());
    assert_ne!(denied.status.code(), Some(0), "{}", text(&denied));
    assert!(!f.outside.join("mounted.txt").exists());
    let out = feed(
        exec(&f, &["--mount", &same, "--", "sh", "-c", &write]),
        Vec::new(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(read(&f.outside.join("mounted.txt")), "from-the-box\n");
}

#[test]
fn the_box_name_is_the_commands_label() {
    let f = Fixture::new();
    let out = feed(
        exec(
            &f,
            &[
                "--box",
                "debugger",
                "--",
                "sh",
                "-c",
                "printf %s \"$SANDBOX_BOX\"",
            ],
        ),
        Vec::new(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(out.stdout, b"debugger");
}

#[test]
fn the_private_tmpdir_lasts_from_the_probe_to_the_command() {
    let f = Fixture::new();
    let out = feed(
        exec(
            &f,
            &[
                "--probe",
                "test -f \"$TMPDIR/kept\"",
                "--provision",
                "echo from-provisioning > \"$TMPDIR/kept\"",
                "--",
                "sh",
                "-c",
                "cat \"$TMPDIR/kept\"; printf %s \"$TMPDIR\" > tmpdir-path",
            ],
        ),
        Vec::new(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(out.stdout, b"from-provisioning\n", "{}", text(&out));
    // ... and is removed with the box's session.
    let tmpdir = read(&f.task.join("tmpdir-path"));
    assert!(!tmpdir.is_empty());
    assert!(!Path::new(&tmpdir).exists(), "{tmpdir} is left behind");
}

#[test]
fn the_nono_backend_keeps_the_same_contract() {
    if common::nono_path().is_none() {
        common::skip(
            "nono",
            format_args!("exec under nono: {}", common::NONO_MISSING),
        );
        return;
    }
    let f = Fixture::new();
    let input = binary(1 << 20);
    let out = feed(
        exec(
            &f,
            &[
                "--backend",
                "nono",
                "--probe",
                "test -f ready",
                "--provision",
                "echo PROVISION-OUT; touch ready",
                "--",
                "sh",
                "-c",
                "printf %s \"$SANDBOX_BACKEND\" > backend; cat",
            ],
        ),
        input.clone(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(read(&f.task.join("backend")), "nono");
    assert!(stderr(&out).contains("PROVISION-OUT"), "{}", stderr(&out));
    assert!(out.stdout == input, "stdout is not exactly the input");
}

#[test]
fn a_command_of_sandbox_exec_inherits_no_stray_descriptor() {
    let f = Fixture::new();
    let strays = common::StrayFds::new();
    let mut cmd = exec(&f, &["--", "sh", "-c", common::LIST_FDS]);
    strays.give_to(&mut cmd);
    let out = feed(cmd, Vec::new());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    common::assert_no_strays("sandbox exec", &String::from_utf8_lossy(&out.stdout));
}

/// The three steps (probe failing, provision, probe, command) under every in-place backend,
/// in one `sandbox exec` process, with a home that has package caches (the test kit's): the
/// second and later steps of a session mount the caches' layers again (they failed with 125
/// "building the private view: Invalid argument" while the first step's volatile overlay
/// marker was still there). Stdout is the command's bytes exactly.
#[test]
fn every_step_runs_under_every_in_place_backend() {
    let f = Fixture::new();
    let bwrap = Path::new("/usr/bin/bwrap");
    let mut backends = vec!["native", "host"];
    match common::nono_path() {
        Some(_) => backends.push("nono"),
        None => common::skip(
            "nono",
            format_args!("exec's steps: {}", common::NONO_MISSING),
        ),
    }
    if bwrap.exists() {
        let task = f.task.display();
        let out = f
            .env
            .cmd()
            .args(["config", "set", "backends.custom.command"])
            .arg(format!(
                "{} --ro-bind / / --bind {task} {task} --dev /dev --proc /proc --die-with-parent",
                bwrap.display()
            ))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        backends.push("custom");
    } else {
        common::skip(
            "bwrap",
            "the custom backend's launcher: apt-get install bubblewrap",
        );
    }
    let log = f.task.join("order.log");
    let input = binary(64 << 10);
    for backend in backends {
        for ready in [false, true] {
            let _ = std::fs::remove_file(&log);
            if !ready {
                let _ = std::fs::remove_file(f.task.join("ready"));
            }
            // Under native every step also writes to the npm cache's layer: each mounts it.
            let native = backend == "native";
            let step = |name: &str, then: &str| {
                let cache = if native {
                    format!("echo {name} >> ~/.npm/steps;")
                } else {
                    String::new()
                };
                format!("echo {name} >> order.log; {cache} {then}")
            };
            let args = [
                "--backend",
                backend,
                "--probe",
                &step("probe", "test -f ready"),
                "--provision",
                &step("provision", "touch ready"),
                "--",
                "sh",
                "-c",
                &step("command", "cat"),
            ];
            let out = feed(exec(&f, &args), input.clone());
            let ctx = format!("{backend}, ready {ready}: {}", stderr(&out));
            assert_eq!(out.status.code(), Some(0), "{ctx}");
            let want = if ready {
                "probe\ncommand\n"
            } else {
                "probe\nprovision\nprobe\ncommand\n"
            };
            assert_eq!(read(&log), want, "{ctx}");
            assert!(
                out.stdout == input,
                "{ctx}: stdout is not exactly the input"
            );
        }
    }
    // The steps' cache writes went to the project's layer, never to the user's cache.
    assert!(!f.env.home().join(".npm/steps").exists());
}

/// The same steps as an unprivileged user (`nobody` when the tests run as root) whose home
/// has package caches: overlayfs leaves its work directory without permissions, which only
/// root could clear, so every later mount of the layer failed until `home reset --caches`.
#[test]
fn every_step_runs_for_an_unprivileged_user_with_package_caches() {
    if nix::unistd::geteuid().is_root() && !Path::new(sandbox_testkit::nobody::SETPRIV).exists() {
        common::skip("setpriv", "setpriv is missing");
        return;
    }
    let env = common::Env::new();
    let user = common::UserDirs::new(env.path(), "user", common::BIN, true);
    for round in 1..=3 {
        let out = user
            .command(&[
                user.bin_str(),
                "exec",
                "--probe",
                "test -f ~/.npm/provisioned",
                "--provision",
                "touch ~/.npm/provisioned",
                "--",
                "sh",
                "-c",
                "echo x >> ~/.npm/rounds; wc -l < ~/.npm/rounds",
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "round {round}: {}", text(&out));
        assert_eq!(
            out.stdout,
            format!("{round}\n").as_bytes(),
            "{}",
            text(&out)
        );
    }
    assert!(
        !user.home.join(".npm/rounds").exists(),
        "the user's cache was written"
    );
    // The writes went through the overlay into the project's layer (else the test proved
    // nothing about the layer's work directory).
    let layers = user.home.join(".state/sandbox/caches");
    let found = std::process::Command::new("find")
        .arg(&layers)
        .args(["-path", "*/npm/upper/rounds"])
        .output()
        .unwrap();
    assert!(
        !found.stdout.is_empty(),
        "no layer holds the rounds: {}",
        text(&found)
    );
}
