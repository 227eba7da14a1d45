//! The daemon through the real binary: `sandbox serve` started as a user would, driven over
//! its Unix socket and over `sandbox serve --stdio`, running real commands under the native
//! backend. Process checks are by pid, from the outside.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::time::{Duration, Instant};

use common::daemon::req;
use common::{alive, text, wait_dead, Env};
use sandbox_protocol::{BlockingFrameReader, ErrorCode, Frame, Incoming};
use sandbox_service::hooks::client::{post_status, request as http};
use sandbox_service::{Client, ClientError};
use serde_json::{json, Value};

/// Generous bound for "this process must be gone": the daemon's kill grace is 2 s.
const GONE: Duration = Duration::from_secs(20);

/// The test's daemon: the shared one of `common::daemon`, plus the private environment it
/// runs in (dropped after it).
struct Daemon {
    inner: common::daemon::Daemon,
    env: Env,
}

impl std::ops::Deref for Daemon {
    type Target = common::daemon::Daemon;
    fn deref(&self) -> &Self::Target {
        &self.inner
    }
}

impl std::ops::DerefMut for Daemon {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.inner
    }
}

impl Daemon {
    fn start() -> Daemon {
        Daemon::start_in(Env::new())
    }

    fn start_in(env: Env) -> Daemon {
        Daemon::start_in_with(env, &[])
    }

    /// The daemon of `env`, started as `WRAPPER… sandbox serve`.
    fn start_in_with(env: Env, wrapper: &[&str]) -> Daemon {
        let inner = common::daemon::Daemon::start_with(&env, env.cmd_under(wrapper));
        assert_ne!(
            inner.pid as u32,
            inner.supervisor.id(),
            "the daemon runs under a supervisor"
        );
        Daemon { inner, env }
    }

    fn work(&self) -> PathBuf {
        self.env.work()
    }

    /// Stops the daemon (SIGTERM to its supervisor) and hands back its environment, with
    /// every file the test made there.
    fn shutdown_keeping_env(self) -> Env {
        let Daemon { inner, env } = self;
        drop(inner);
        env
    }

    /// `shutdown` over the protocol; the supervisor then exits 0.
    fn shutdown(mut self) {
        let reply = self.client().call(&req("shutdown", json!({}))).unwrap();
        assert_eq!(reply, json!({"ok": true}));
        let status = self.supervisor.wait().unwrap();
        assert_eq!(status.code(), Some(0), "{}", self.log.lock().unwrap());
        assert!(!self.paths().socket().exists(), "socket removed");
        assert!(!self.paths().host_token().exists(), "token removed");
    }
}

fn create(client: &mut Client, name: &str, workdir: &Path, extra: Value) -> Value {
    let mut params = json!({"name": name, "workdir": workdir});
    for (k, v) in extra.as_object().unwrap() {
        params[k] = v.clone();
    }
    let created = client.call(&req("box.create", params)).unwrap();
    client
        .call(&req("box.start", json!({"name": name})))
        .unwrap();
    created
}

fn exec(client: &mut Client, name: &str, argv: &[&str]) -> u64 {
    let reply = client
        .call(&req(
            "box.exec",
            json!({"name": name, "command": argv[0], "args": &argv[1..]}),
        ))
        .unwrap();
    reply["execId"].as_u64().unwrap()
}

#[derive(Debug, Default)]
struct Run {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit: Incoming,
    base64_events: usize,
}

/// Reads events until `exec_id`'s exit, collecting its output.
fn collect(client: &mut Client, exec_id: u64) -> Run {
    let mut run = Run::default();
    loop {
        let event = client.next_event().unwrap();
        if event.exec_id != Some(exec_id) {
            continue;
        }
        match event.kind.as_deref() {
            Some("output") => {
                if event.encoding == Some(sandbox_protocol::Encoding::Base64) {
                    run.base64_events += 1;
                }
                let bytes = event.output_bytes().unwrap();
                match event.stream.as_deref() {
                    Some("stdout") => run.stdout.extend(bytes),
                    Some("stderr") => run.stderr.extend(bytes),
                    other => panic!("stream {other:?}"),
                }
            }
            Some("exit") => {
                run.exit = event;
                return run;
            }
            other => panic!("event {other:?}"),
        }
    }
}

/// Reads events until every one of `ids` has exited, collecting each one's output.
fn collect_each(client: &mut Client, ids: &[u64]) -> std::collections::HashMap<u64, Run> {
    let mut runs: std::collections::HashMap<u64, Run> =
        ids.iter().map(|id| (*id, Run::default())).collect();
    let mut open = ids.len();
    while open > 0 {
        let event = client.next_event().unwrap();
        let Some(run) = event.exec_id.and_then(|id| runs.get_mut(&id)) else {
            continue;
        };
        match event.kind.as_deref() {
            Some("output") => {
                let bytes = event.output_bytes().unwrap();
                match event.stream.as_deref() {
                    Some("stdout") => run.stdout.extend(bytes),
                    _ => run.stderr.extend(bytes),
                }
            }
            Some("exit") => {
                run.exit = event;
                open -= 1;
            }
            _ => {}
        }
    }
    runs
}

/// Reads `n` lines of an exec's stdout (pids it printed).
fn read_lines(client: &mut Client, exec_id: u64, n: usize) -> Vec<String> {
    let mut text = String::new();
    while text.lines().count() < n || !text.ends_with('\n') {
        let event = client.next_event().unwrap();
        if event.exec_id == Some(exec_id) && event.kind.as_deref() == Some("output") {
            text.push_str(&String::from_utf8(event.output_bytes().unwrap()).unwrap());
        }
        assert_ne!(event.kind.as_deref(), Some("exit"), "exited early: {text}");
    }
    text.lines().map(str::to_string).collect()
}

fn code(result: Result<Value, ClientError>) -> ErrorCode {
    match result {
        Err(ClientError::Rpc(e)) => e.code,
        other => panic!("expected an error reply, got {other:?}"),
    }
}

#[test]
fn socket_session_covers_the_whole_lifecycle() {
    let d = Daemon::start();
    let mut c = d.client();
    let describe = c
        .call(&req(
            "host.describe",
            json!({"protocol": "sandbox-jsonl-v1"}),
        ))
        .unwrap();
    assert_eq!(describe["protocol"], "sandbox-jsonl-v1");
    assert!(describe["capabilities"]
        .as_array()
        .unwrap()
        .contains(&json!("orderedOutput")));
    assert_eq!(
        code(c.call(&req(
            "host.describe",
            json!({"protocol": "sandbox-jsonl-v9"})
        ))),
        ErrorCode::UnsupportedProtocol
    );

    let created = create(&mut c, "lifecycle", &d.work(), json!({}));
    assert_eq!(created["created"], true);
    assert_eq!(created["backend"], "native");
    // The same name and settings: the same box. Other settings: refused, not silently mixed.
    let again = c
        .call(&req(
            "box.create",
            json!({"name": "lifecycle", "workdir": d.work()}),
        ))
        .unwrap();
    assert_eq!(again["created"], false);
    assert_eq!(again["boxId"], created["boxId"]);
    assert_eq!(
        code(c.call(&req(
            "box.create",
            json!({"name": "lifecycle", "workdir": d.work(), "blockNet": true})
        ))),
        ErrorCode::BoxExists
    );

    // Streamed output on both streams, stdin fed in two writes and closed.
    let id = exec(
        &mut c,
        "lifecycle",
        &["sh", "-c", "echo out; echo err >&2; cat; echo after"],
    );
    c.call(&req("exec.stdin", json!({"execId": id, "data": "line1\n"})))
        .unwrap();
    c.call(&req(
        "exec.stdin",
        json!({"execId": id, "data": "bGluZTIK", "encoding": "base64", "close": true}),
    ))
    .unwrap();
    let run = collect(&mut c, id);
    assert_eq!(run.stdout, b"out\nline1\nline2\nafter\n");
    assert_eq!(run.stderr, b"err\n");
    assert_eq!(run.exit.exit_code, Some(0));

    // The sandbox is real: outside the workdir nothing can be written.
    let outside = d.env.path().join("outside-file");
    let id = exec(
        &mut c,
        "lifecycle",
        &["sh", "-c", &format!("echo x > {}", outside.display())],
    );
    // (Inside, the path may be written: it lies in the box's private /tmp.) Judged on the host.
    let _ = collect(&mut c, id);
    assert!(!outside.exists(), "escaped the box");

    // Kill: the whole group, reported as a signal.
    let id = exec(&mut c, "lifecycle", &["sleep", "1000"]);
    c.call(&req("exec.kill", json!({"execId": id, "signal": "TERM"})))
        .unwrap();
    let run = collect(&mut c, id);
    assert_eq!(run.exit.signal, Some(15));
    assert_eq!(run.exit.exit_code, Some(143));
    assert_eq!(
        code(c.call(&req("exec.kill", json!({"execId": 999_999})))),
        ErrorCode::NoSuchExec
    );

    let list = c.call(&req("box.list", json!({}))).unwrap();
    assert_eq!(list[0]["name"], "lifecycle");
    assert_eq!(list[0]["backend"], "native");
    assert_eq!(list[0]["state"], "running");
    // An exec whose `exit` was queued is gone for every later request, on any connection.
    assert_eq!(list[0]["runningExecs"], 0, "{list}");
    let elsewhere = d.client().call(&req("box.list", json!({}))).unwrap();
    assert_eq!(elsewhere[0]["runningExecs"], 0, "{elsewhere}");

    // Exec in a stopped box is refused; start brings it back.
    c.call(&req("box.stop", json!({"name": "lifecycle"})))
        .unwrap();
    assert_eq!(
        code(c.call(&req(
            "box.exec",
            json!({"name": "lifecycle", "command": "true"})
        ))),
        ErrorCode::BoxState
    );
    c.call(&req("box.remove", json!({"name": "lifecycle"})))
        .unwrap();
    assert_eq!(
        c.call(&req("box.list", json!({}))).unwrap(),
        json!([]),
        "removed"
    );
    assert_eq!(
        code(c.call(&req("box.start", json!({"name": "lifecycle"})))),
        ErrorCode::NoSuchBox
    );
    d.shutdown();
}

#[test]
fn commands_that_cannot_start_fail_loudly() {
    let d = Daemon::start();
    let mut c = d.client();
    create(&mut c, "fails", &d.work(), json!({}));
    let err = c
        .call(&req(
            "box.exec",
            json!({"name": "fails", "command": "no-such-program-here"}),
        ))
        .unwrap_err();
    match err {
        ClientError::Rpc(e) => {
            assert_eq!(e.code, ErrorCode::SpawnFailed);
            assert_eq!(e.data.unwrap()["exitCode"], 127);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        code(c.call(&req(
            "box.exec",
            json!({"name": "fails", "command": "true", "workingDir": "../.."})
        ))),
        ErrorCode::Denied,
        "a working directory outside the workspace"
    );
    // An unavailable backend (or, with it built, a box without an image) creates nothing.
    assert_eq!(
        code(c.call(&req(
            "box.create",
            json!({"name": "vm", "backend": "boxlite", "workdir": d.work()})
        ))),
        if cfg!(feature = "boxlite") {
            ErrorCode::InvalidParams
        } else {
            ErrorCode::BackendUnavailable
        }
    );
    assert_eq!(c.call(&req("box.list", json!({}))).unwrap()[1], Value::Null);
}

#[test]
fn output_precedes_exit_under_a_flood() {
    let d = Daemon::start();
    let mut c = d.client();
    create(&mut c, "flood", &d.work(), json!({}));
    let id = exec(
        &mut c,
        "flood",
        &[
            "sh",
            "-c",
            "(yes ERR | head -c 1000000 >&2) & yes 0123456789 | head -c 30000000; wait",
        ],
    );
    let run = collect(&mut c, id);
    assert_eq!(run.exit.exit_code, Some(0));
    assert_eq!(run.stdout.len(), 30_000_000, "every byte before the exit");
    assert!(run
        .stdout
        .chunks(11)
        .all(|c| c == &b"0123456789\n"[..c.len()]));
    assert_eq!(run.stderr.len(), 1_000_000);
    // Nothing of that exec may follow its exit: a later reply comes after everything queued.
    let list_id = c.send(&req("box.list", json!({}))).unwrap();
    loop {
        let frame = c.next_frame().unwrap();
        if frame.is_reply() {
            assert_eq!(frame.id, Some(Some(list_id)));
            break;
        }
        assert_ne!(frame.exec_id, Some(id), "output after exit: {frame:?}");
    }
}

#[test]
fn binary_output_is_lossless_and_text_stays_text() {
    let d = Daemon::start();
    let mut c = d.client();
    create(&mut c, "bytes", &d.work(), json!({}));
    // Pseudo-random bytes: invalid UTF-8 almost everywhere.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let binary: Vec<u8> = (0..3_000_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(d.work().join("binary"), &binary).unwrap();
    let id = exec(&mut c, "bytes", &["cat", "binary"]);
    let run = collect(&mut c, id);
    assert!(run.stdout == binary, "binary output differs");
    assert!(run.base64_events > 0);

    // Two-byte characters at an odd offset: chunk boundaries split some of them, and the
    // daemon must still send text.
    let text: String = std::iter::once('a')
        .chain(std::iter::repeat_n('é', 400_000))
        .collect();
    std::fs::write(d.work().join("text"), &text).unwrap();
    let id = exec(&mut c, "bytes", &["cat", "text"]);
    let run = collect(&mut c, id);
    assert!(run.stdout == text.as_bytes(), "text output differs");
    assert_eq!(run.base64_events, 0, "valid UTF-8 was sent as base64");
}

#[test]
fn bad_frames_are_answered_and_the_connection_survives() {
    let d = Daemon::start();
    let mut c = d.client();
    let expect = |c: &mut Client, id: Option<Value>, code: &str| {
        let frame = c.next_frame().unwrap();
        let got_id = frame.id.clone().expect("a reply").map(|i| json!(i));
        assert_eq!(got_id, id, "{frame:?}");
        assert_eq!(json!(frame.error.unwrap().code), json!(code));
    };
    c.send_raw(b"not json\n").unwrap();
    expect(&mut c, None, "parseError");
    c.send_raw(b"\xff\xfe{}\n").unwrap();
    expect(&mut c, None, "parseError");
    c.send_raw(b"{\"id\":1}\n").unwrap();
    expect(&mut c, Some(json!(1)), "invalidRequest");
    c.send_raw(b"{\"id\":2,\"method\":\"box.list\",\"params\":{},\"x\":1}\n")
        .unwrap();
    expect(&mut c, Some(json!(2)), "invalidRequest");
    c.send_raw(b"{\"id\":3,\"method\":\"box.explode\"}\n")
        .unwrap();
    expect(&mut c, Some(json!(3)), "unknownMethod");
    c.send_raw(b"{\"id\":4,\"method\":\"box.create\",\"params\":{\"name\":\"a\",\"workdir\":\"/\",\"blocknet\":true}}\n")
        .unwrap();
    expect(&mut c, Some(json!(4)), "invalidParams");
    c.send_raw(b"\n  \n").unwrap(); // blank lines: skipped, no reply

    // 5 MiB request: answered under its id.
    let mut big = br#"{"id":5,"method":"exec.stdin","params":{"execId":1,"data":""#.to_vec();
    big.extend(std::iter::repeat_n(b'x', 5 << 20));
    big.extend(b"\"}}\n");
    c.send_raw(&big).unwrap();
    expect(&mut c, Some(json!(5)), "requestTooLarge");

    // A 200 MiB line: skipped as it streams, one reply, and the daemon's memory stays flat.
    {
        let mut raw = c.stream().try_clone().unwrap();
        let chunk = vec![b'y'; 1 << 20];
        for _ in 0..200 {
            raw.write_all(&chunk).unwrap();
        }
        raw.write_all(b"\n").unwrap();
    }
    expect(&mut c, None, "frameTooLarge");
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid)).unwrap();
    let hwm_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .parse()
        .unwrap();
    assert!(
        hwm_kib < 96 * 1024,
        "the daemon's peak RSS grew to {hwm_kib} KiB reading a 200 MiB line"
    );

    // Still the same connection, still authenticated.
    let describe = c.call(&req("host.describe", json!({}))).unwrap();
    assert_eq!(describe["authenticated"], true);
}

#[test]
fn only_host_token_holders_control_the_daemon() {
    let d = Daemon::start();
    let socket = d.paths().socket();
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&socket).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    let token_mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(d.paths().host_token())
            .unwrap()
            .permissions(),
    );
    assert_eq!(token_mode & 0o777, 0o600);

    let mut anon = Client::connect(&socket).unwrap();
    // Describing is allowed (no secrets in it); acting is not.
    let describe = anon.call(&req("host.describe", json!({}))).unwrap();
    assert_eq!(describe["authenticated"], false);
    assert_eq!(
        code(anon.call(&req(
            "box.create",
            json!({"name": "x", "backend": "host", "workdir": d.work()})
        ))),
        ErrorCode::Unauthenticated
    );
    let forged = format!("sbx-host-{}", "0".repeat(64));
    assert_eq!(
        code(anon.call(&req("host.hello", json!({"token": forged})))),
        ErrorCode::Unauthenticated
    );
    // A wrong token ends the connection.
    assert!(matches!(
        anon.call(&req("box.list", json!({}))),
        Err(ClientError::Closed) | Err(ClientError::Io(_))
    ));
    assert_eq!(
        d.client().call(&req("box.list", json!({}))).unwrap(),
        json!([])
    );
}

/// A `sandbox serve --stdio` session driven line by line.
struct Stdio_ {
    child: Child,
    stdin: Option<ChildStdin>,
    reader: BlockingFrameReader<ChildStdout>,
    next: u64,
}

impl Stdio_ {
    fn start(env: &Env) -> Stdio_ {
        Stdio_::start_args(env, &[])
    }

    /// `sandbox serve --stdio ARGS…`.
    fn start_args(env: &Env, args: &[&str]) -> Stdio_ {
        let mut child = env
            .cmd()
            .args(["serve", "--stdio"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let reader = BlockingFrameReader::new(child.stdout.take().unwrap(), 16 << 20);
        Stdio_ {
            child,
            stdin,
            reader,
            next: 1,
        }
    }

    fn frame(&mut self) -> Incoming {
        match self.reader.next().unwrap() {
            Some(Frame::Line(l)) => serde_json::from_slice(&l).unwrap(),
            other => panic!("{other:?}"),
        }
    }

    /// Sends a request and returns (its reply, the events before it).
    fn call(&mut self, method: &str, params: Value) -> (Incoming, Vec<Incoming>) {
        let id = self.next;
        self.next += 1;
        let line = json!({"id": id, "method": method, "params": params});
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        let mut events = Vec::new();
        loop {
            let f = self.frame();
            if f.is_reply() {
                assert_eq!(f.id, Some(Some(sandbox_protocol::Id::Num(id))));
                return (f, events);
            }
            events.push(f);
        }
    }
}

#[test]
fn stdio_bridge_starts_the_daemon_and_two_sessions_share_it() {
    let env = Env::new();
    // Two sessions at once, and no daemon yet: both race to start one, one wins, both work.
    let mut a = Stdio_::start(&env);
    let mut b = Stdio_::start(&env);
    let (da, _) = a.call("host.describe", json!({}));
    let (db, _) = b.call("host.describe", json!({}));
    let pid = da.result.as_ref().unwrap()["pid"].clone();
    assert_eq!(pid, db.result.unwrap()["pid"], "one daemon for both");
    assert_eq!(da.result.unwrap()["authenticated"], true);

    let (created, events) = a.call(
        "box.create",
        json!({"name": "shared", "workdir": env.work()}),
    );
    assert!(created.error.is_none(), "{created:?}");
    // The backend's named step as it is prepared, then `created`.
    let states: Vec<_> = events
        .iter()
        .map(|e| (e.state, e.step.as_deref(), e.step_state.as_deref()))
        .collect();
    use sandbox_protocol::BoxState::{Created, Creating};
    assert_eq!(
        states,
        vec![
            (
                Some(Creating),
                Some("compile the native sandbox"),
                Some("started")
            ),
            (
                Some(Creating),
                Some("compile the native sandbox"),
                Some("done")
            ),
            (Some(Created), None, None),
        ]
    );
    a.call("box.start", json!({"name": "shared"}));
    // B sees A's box and runs in it; the output goes to B, who started it.
    let (list, _) = b.call("box.list", json!({}));
    assert_eq!(list.result.unwrap()[0]["name"], "shared");
    let (started, _) = b.call(
        "box.exec",
        json!({"name": "shared", "command": "sh", "args": ["-c", "cat; echo bye"]}),
    );
    let exec_id = started.result.unwrap()["execId"].as_u64().unwrap();
    // `cat` may echo the input before the write's reply goes out: the events that arrive
    // while waiting for the reply are part of the output too.
    let (wrote, early) = b.call(
        "exec.stdin",
        json!({"execId": exec_id, "data": "hi\n", "close": true}),
    );
    assert!(wrote.error.is_none(), "{wrote:?}");
    let mut out = Vec::new();
    let mut early = early.into_iter();
    loop {
        let f = early.next().unwrap_or_else(|| b.frame());
        if f.exec_id != Some(exec_id) {
            continue;
        }
        if f.kind.as_deref() == Some("exit") {
            assert_eq!(f.exit_code, Some(0));
            break;
        }
        out.extend(f.output_bytes().unwrap());
    }
    assert_eq!(out, b"hi\nbye\n");

    // A leaves; the box stays (boxes belong to the daemon).
    drop(a.stdin.take());
    assert_eq!(a.child.wait().unwrap().code(), Some(0));
    let (list, _) = b.call("box.list", json!({}));
    assert_eq!(list.result.unwrap()[0]["name"], "shared");
    let (removed, _) = b.call("box.remove", json!({"name": "shared"}));
    assert!(removed.error.is_none());
    let (bye, _) = b.call("shutdown", json!({}));
    assert_eq!(bye.result.unwrap(), json!({"ok": true}));
    drop(b.stdin.take());
    assert_eq!(b.child.wait().unwrap().code(), Some(0));
    let daemon_pid = pid.as_i64().unwrap() as i32;
    assert!(wait_dead(daemon_pid, GONE), "the daemon exited");
}

/// A `--stdio` session (`args` on its command line) starts the daemon, makes and removes a box
/// and leaves; the daemon, idle from then on, exits after `idle` — not when the last client
/// leaves — saying why in its log.
fn idle_daemon_exits(env: &Env, args: &[&str], idle: Duration) {
    let mut a = Stdio_::start_args(env, args);
    let (described, _) = a.call("host.describe", json!({}));
    let pid = described.result.unwrap()["pid"].as_i64().unwrap() as i32;
    let (created, _) = a.call("box.create", json!({"name": "b", "workdir": env.work()}));
    assert!(created.error.is_none(), "{created:?}");
    let (removed, _) = a.call("box.remove", json!({"name": "b"}));
    assert!(removed.error.is_none(), "{removed:?}");
    drop(a.stdin.take());
    assert_eq!(a.child.wait().unwrap().code(), Some(0));
    let left = Instant::now();
    let log = || std::fs::read_to_string(env.path().join("run/sandbox/daemon.log")).unwrap();
    assert!(
        common::escape::exits_within(pid, idle + GONE),
        "the idle daemon {pid} did not exit: {}",
        log()
    );
    let after = left.elapsed();
    // The client's exit follows the daemon's close of its connection by a little.
    assert!(
        after >= idle / 2,
        "it exited {after:?} after its last client left, before its idle time {idle:?}"
    );
    assert!(
        log().contains("no box, no command and no client for 2 s: exiting"),
        "{}",
        log()
    );
}

/// `service.idle_exit` in the configuration.
#[test]
fn an_idle_daemon_exits_after_the_configured_idle_time() {
    let env = Env::new();
    env.write_config("service:\n  idle_exit: 2s\n");
    idle_daemon_exits(&env, &[], Duration::from_secs(2));
}

/// `--idle-exit` over a configuration that says never.
#[test]
fn an_idle_daemon_exits_after_the_flags_idle_time() {
    let env = Env::new();
    env.write_config("service:\n  idle_exit: 0s\n");
    idle_daemon_exits(&env, &["--idle-exit", "2s"], Duration::from_secs(2));
}

/// Removing the runtime directory (socket, token, lock) under a daemon with a box and a
/// running command: no client can reach it again, so it stops the command and exits at once
/// (its idle time is the default 5 minutes), saying why; the supervisor exits with it.
#[test]
fn a_daemon_whose_runtime_directory_is_removed_exits_at_once() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let (_, pids) = start_tree(&mut c, &d, "victim");
    std::fs::remove_dir_all(&d.runtime).unwrap();
    let supervisor = d.supervisor.id() as i32;
    assert!(
        common::escape::exits_within(supervisor, GONE),
        "the daemon lives on without its runtime directory: {}",
        d.log.lock().unwrap()
    );
    assert_eq!(d.supervisor.wait().unwrap().code(), Some(0));
    for pid in pids {
        assert!(wait_dead(pid, GONE), "its command {pid} survived");
    }
    let log = d.log_to_the_end();
    assert!(
        log.contains("/sandbox.sock is gone") && log.contains("stopping every command"),
        "{log}"
    );
}

/// The variables that make [`box_generation_holder`] play its role.
const HOLDER_ROOT: &str = "SANDBOX_TEST_GENERATION_ROOT";
const HOLDER_COMMON: &str = "SANDBOX_TEST_GENERATION_COMMON";
const HOLDER_RECORDS: &str = "SANDBOX_TEST_GENERATION_RECORDS";
const HOLDER_SCRATCH: &str = "SANDBOX_TEST_GENERATION_SCRATCH";

/// A role, played by a process that
/// [`a_dead_daemons_box_generation_is_taken_in_by_the_next_daemon`] starts (this test binary,
/// run for this test alone): the daemon of a box whose busy period began — a generation of
/// the common dir laid out in the box's git directory, as the daemon's BoxLite boxes lay it
/// out — and which is SIGKILLed before the period ends. It prints the git dir the box
/// commits through, then waits.
#[test]
#[ignore = "a role: started by a_dead_daemons_box_generation_is_taken_in_by_the_next_daemon"]
fn box_generation_holder() {
    use sandbox_git::quarantine::generation::{BoxGit, Generation};
    let var = |name| PathBuf::from(std::env::var_os(name).expect(name));
    let common = var(HOLDER_COMMON);
    // As box.create makes it: the boxes' git directory, then this box's.
    std::fs::create_dir_all(var(HOLDER_ROOT).parent().unwrap()).unwrap();
    let git = BoxGit::new(&common, &common.join("worktrees/task"), &var(HOLDER_ROOT)).unwrap();
    let generation =
        Generation::begin(&git, &[&var(HOLDER_RECORDS)], &var(HOLDER_SCRATCH)).unwrap();
    // Straight to the descriptor, flushed: libtest's capture takes only `print!`.
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "box-gitdir {}",
        generation.dir().join("worktrees/task").display()
    )
    .and_then(|()| out.flush())
    .unwrap();
    drop(out);
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    unreachable!("the holder is killed before its period ends");
}

/// A daemon SIGKILLed in a box's busy period leaves the box's generation of the common dir
/// and its record; the next daemon takes it in at its start, as the period's end would have:
/// the box's commit on the task branch is applied, its move of `main` refused, and the
/// generation and its record removed — reported in its log.
#[test]
fn a_dead_daemons_box_generation_is_taken_in_by_the_next_daemon() {
    let env = Env::new();
    let main = env.path().join("main");
    let task = env.path().join("task");
    sandbox_testkit::linked_worktree(&main, &task);
    let common = main.join(".git").canonicalize().unwrap();
    // Where the daemon keeps them (BackendOptions' state and private directories).
    let state = env.home().join(".local/state/sandbox");
    let root = state.join("boxlite-git/box");
    // The daemon's runtime directory, private as the daemon makes it: the quarantine's
    // scratch space lies in it.
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
        .create(env.path().join("run/sandbox"))
        .unwrap();
    let mut holder = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "service::box_generation_holder",
            "--ignored",
            "--nocapture",
        ])
        .env(HOLDER_ROOT, &root)
        .env(HOLDER_COMMON, &common)
        .env(HOLDER_RECORDS, state.join("git-tasks"))
        .env(HOLDER_SCRATCH, env.path().join("run/sandbox/boxlite-git"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let gitdir = BufReader::new(holder.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("box-gitdir ").map(PathBuf::from))
        .expect("the holder laid out its generation");
    // "The box" commits on its task branch and moves `main` too.
    let before = sandbox_testkit::git(&main, &["rev-parse", "task", "main"]);
    let in_box = |args: &[&str]| {
        let out = sandbox_testkit::git_command(&task)
            .env("GIT_DIR", &gitdir)
            .env("GIT_WORK_TREE", &task)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    in_box(&["commit", "-q", "--allow-empty", "-m", "in the box"]);
    let commit = in_box(&["rev-parse", "HEAD"]);
    in_box(&["update-ref", "refs/heads/main", &commit]);
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(
        sandbox_testkit::git(&main, &["rev-parse", "task", "main"]),
        before,
        "nothing is taken while no daemon reads the generation back"
    );
    let generations = |dir: &str| -> Vec<PathBuf> {
        std::fs::read_dir(root.join(dir))
            .map(|e| e.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    assert_eq!(generations("records").len(), 1, "the dead daemon's record");

    let d = Daemon::start_in(env);
    let log = d.log.lock().unwrap().clone();
    let (task_now, main_now) = {
        let both = sandbox_testkit::git(&main, &["rev-parse", "task", "main"]);
        let mut lines = both.lines().map(str::to_string);
        (lines.next().unwrap(), lines.next().unwrap())
    };
    assert_eq!(
        task_now, commit,
        "the box's commit reached its task branch: {log}"
    );
    assert_eq!(
        main_now,
        before.lines().nth(1).unwrap(),
        "the box's move of main was refused: {log}"
    );
    assert!(
        log.contains("was left by daemon")
            && log.contains("1 ref update(s) applied, 1 refused")
            && log.contains("refs/heads/main"),
        "{log}"
    );
    let git_dir_entries: Vec<PathBuf> = generations("git")
        .into_iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("gen-"))
        })
        .collect();
    assert!(git_dir_entries.is_empty(), "{git_dir_entries:?}");
    assert!(generations("collect").is_empty());
    assert!(generations("records").is_empty());
    d.shutdown();
}

#[test]
fn a_second_daemon_refuses_to_start() {
    let d = Daemon::start();
    let out = d
        .env
        .cmd()
        .arg("serve")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already runs"),
        "{}",
        text(&out)
    );
    // And the first is untouched.
    d.client().call(&req("box.list", json!({}))).unwrap();
}

/// Starts a tree in a box and returns the pids: a background child in the group, one that
/// escaped the group with setsid, and the leader.
fn start_tree(c: &mut Client, d: &Daemon, name: &str) -> (u64, Vec<i32>) {
    create(c, name, &d.work(), json!({}));
    // The command runs in a pid namespace of its own: its `$!` and `$$` are not the host's
    // pids, so its processes are found on the host by their unique command lines, once the
    // shell has seen both sleeps exec.
    let n = format!("{}{}", std::process::id(), common::escape::unique());
    let (kept, left) = (format!("1000.{n}1"), format!("1000.{n}2"));
    let script = format!(
        "{}; sleep {kept} & a=$!; setsid sleep {left} & b=$!; \
         execed sleep $a; execed sleep $b; echo ready; wait",
        common::EXECED_FN
    );
    let id = exec(c, name, &["sh", "-c", &script]);
    read_lines(c, id, 1);
    let mut pids = common::pids_running(&["sleep", &kept]);
    pids.extend(common::pids_running(&["sleep", &left]));
    pids.extend(common::pids_running(&["sh", "-c", &script]));
    assert_eq!(pids.len(), 3, "the tree's host pids: {pids:?}");
    for &pid in &pids {
        assert!(alive(pid), "{pid} should run");
    }
    (id, pids)
}

/// What `sh -c SCRIPT` prints in box `name`, once it has finished.
fn box_stdout(c: &mut Client, name: &str, script: &str) -> String {
    let id = exec(c, name, &["sh", "-c", script]);
    String::from_utf8(collect(c, id).stdout).unwrap()
}

#[test]
fn daemon_killed_with_sigkill_mid_exec_leaves_no_process() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let (_, pids) = start_tree(&mut c, &d, "victim");
    let tmpdir =
        PathBuf::from(box_stdout(&mut c, "victim", "echo $TMPDIR; echo left > $TMPDIR/f").trim());
    assert!(tmpdir.join("f").exists(), "{}", tmpdir.display());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    for pid in pids {
        assert!(
            wait_dead(pid, GONE),
            "pid {pid} survived the daemon's SIGKILL"
        );
    }
    // The supervisor reaped everything, removed the boxes' TMPDIRs, then exited.
    let status = d.supervisor.wait().unwrap();
    assert_ne!(status.code(), Some(0));
    assert!(
        !tmpdir.exists(),
        "the killed daemon's box TMPDIR {} was left behind",
        tmpdir.display()
    );
}

#[test]
fn supervisor_killed_with_sigkill_mid_exec_leaves_no_process() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let (_, pids) = start_tree(&mut c, &d, "victim");
    let tmpdir = PathBuf::from(box_stdout(&mut c, "victim", "echo $TMPDIR").trim());
    d.supervisor.kill().unwrap();
    d.supervisor.wait().unwrap();
    assert!(wait_dead(d.pid, GONE), "the daemon follows its supervisor");
    for pid in pids {
        assert!(
            wait_dead(pid, GONE),
            "pid {pid} survived the supervisor's SIGKILL"
        );
    }
    // The daemon stopped in order and removed the directory its dead supervisor owned.
    let root = tmpdir.parent().unwrap();
    assert!(!root.exists(), "{} was left behind", root.display());
}

#[test]
fn a_closed_connection_stops_its_commands_but_not_the_boxes() {
    let d = Daemon::start();
    let mut c = d.client();
    let (_, pids) = start_tree(&mut c, &d, "keep");
    drop(c);
    for pid in pids {
        assert!(wait_dead(pid, GONE), "pid {pid} outlived its connection");
    }
    // Polled, because no ordering covers it: nobody gets an `exit` for a closed connection's
    // commands, and a process looks dead from outside (even as a zombie) before the daemon
    // has reaped it and can strike it off its books. Striking it off first would report "no
    // commands" while one still runs, so the count follows the deaths, a moment later.
    let deadline = Instant::now() + GONE;
    loop {
        let list = d.client().call(&req("box.list", json!({}))).unwrap();
        assert_eq!(
            list[0]["name"], "keep",
            "the box must survive its connection"
        );
        if list[0]["runningExecs"] == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the closed connection's exec is still counted: {list}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn box_stop_reports_exits_before_its_reply() {
    let d = Daemon::start();
    let mut c = d.client();
    let (id, pids) = start_tree(&mut c, &d, "stopme");
    let stop = c.send(&req("box.stop", json!({"name": "stopme"}))).unwrap();
    let mut saw_exit = false;
    loop {
        let f = c.next_frame().unwrap();
        if f.is_reply() {
            assert_eq!(f.id, Some(Some(stop.clone())));
            break;
        }
        if f.kind.as_deref() == Some("exit") && f.exec_id == Some(id) {
            saw_exit = true;
        }
    }
    assert!(saw_exit, "box.stop replied before the exit event");
    for pid in pids {
        assert!(!alive(pid), "pid {pid} still runs after box.stop replied");
    }
    let list = d.client().call(&req("box.list", json!({}))).unwrap();
    assert_eq!(list[0]["runningExecs"], 0, "stopped, yet counted: {list}");
    c.call(&req("box.remove", json!({"name": "stopme"})))
        .unwrap();
}

/// The race CI once hit (`boxBusy` from a `box.remove` sent after the `exit` was read), made
/// likely: several clients at once, each reading an exit and asking another connection about
/// the box right away. Before the daemon queued `exit` and forgot the exec in one step, this
/// found the exec still counted within a few dozen rounds.
#[test]
fn an_exec_whose_exit_was_read_is_gone_for_every_connection() {
    let d = Daemon::start();
    let clients: Vec<_> = (0..4)
        .map(|t| {
            let (work, paths) = (d.work(), d.paths());
            std::thread::spawn(move || {
                let mut c = Client::connect_authenticated(&paths, "runner").unwrap();
                let mut other = Client::connect_authenticated(&paths, "watcher").unwrap();
                let name = format!("race-{t}");
                create(&mut c, &name, &work, json!({}));
                for round in 0..150 {
                    let id = exec(&mut c, &name, &["true"]);
                    collect(&mut c, id);
                    let list = other.call(&req("box.list", json!({}))).unwrap();
                    let mine = list
                        .as_array()
                        .unwrap()
                        .iter()
                        .find(|b| b["name"] == name.as_str())
                        .unwrap();
                    assert_eq!(mine["runningExecs"], 0, "round {round}: {mine}");
                }
                c.call(&req("box.remove", json!({"name": name}))).unwrap();
            })
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
}

// --- status hooks and tokens ---------------------------------------------------------------

fn hook_url(d: &Daemon) -> String {
    d.client().call(&req("host.describe", json!({}))).unwrap()["hookUrl"]
        .as_str()
        .unwrap()
        .to_string()
}

fn box_env(c: &mut Client, name: &str) -> (String, String) {
    let text = box_stdout(c, name, "echo $SANDBOX_API_URL; echo $SANDBOX_API_TOKEN");
    let mut lines = text.lines();
    (
        lines.next().unwrap().to_string(),
        lines.next().unwrap().to_string(),
    )
}

#[test]
fn hook_tokens_are_scoped() {
    let d = Daemon::start();
    let mut c = d.client();
    let host = d.paths().read_host_token().unwrap();
    let url = hook_url(&d);
    create(&mut c, "a", &d.work(), json!({}));
    create(&mut c, "b", &d.work(), json!({}));
    let (url_a, token_a) = box_env(&mut c, "a");
    let (_, token_b) = box_env(&mut c, "b");
    assert_eq!(url_a, url);
    assert!(token_a.starts_with("sbx-sandbox-"), "{token_a}");
    assert_ne!(token_a, token_b);
    assert_ne!(token_a, host, "the host token never enters a sandbox");

    let post = |token: Option<&str>, body: Value| {
        http(
            &url,
            "POST",
            "/hook",
            token,
            Some(body.to_string().as_bytes()),
        )
        .unwrap()
        .status
    };
    let get = |token: Option<&str>, path: &str| http(&url, "GET", path, token, None).unwrap();

    // Box A's token: its own box only.
    assert_eq!(
        post_status(&url, &token_a, "working", Some("step 1"))
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        post(Some(&token_a), json!({"event": "idle", "box": "a"})),
        200
    );
    assert_eq!(
        post(Some(&token_a), json!({"event": "done", "box": "b"})),
        403
    );
    assert_eq!(
        post(Some(&token_a), json!({"event": "done", "task": "a"})),
        403
    );
    assert_eq!(get(Some(&token_a), "/api/v1/status").status, 403);
    assert_eq!(get(Some(&token_a), "/api/v1/anything").status, 403);
    // No token, a forged token.
    let forged = format!("sbx-sandbox-{}", "f".repeat(64));
    assert_eq!(post(None, json!({"event": "x"})), 401);
    assert_eq!(post(Some(&forged), json!({"event": "x"})), 401);
    assert_eq!(get(None, "/api/v1/status").status, 401);
    assert_eq!(get(Some(&forged), "/api/v1/status").status, 401);
    // Malformed and oversized bodies.
    assert_eq!(post(Some(&token_a), json!({"event": "x", "extra": 1})), 400);
    assert_eq!(post(Some(&token_a), json!({"event": "bad event"})), 400);
    let huge = json!({"event": "x", "message": "m".repeat(64 * 1024)});
    assert_eq!(post(Some(&token_a), huge), 413);
    // The host token: every box, and the API.
    assert_eq!(
        post(Some(&host), json!({"event": "blocked", "box": "b"})),
        200
    );
    assert_eq!(
        post(Some(&host), json!({"event": "x"})),
        400,
        "must name a box"
    );
    assert_eq!(post(Some(&host), json!({"event": "x", "box": "nope"})), 404);
    assert_eq!(get(Some(&host), "/api/v1/nope").status, 404);
    let status = get(Some(&host), "/api/v1/status");
    assert_eq!(status.status, 200);
    let status: Value = serde_json::from_str(&status.body).unwrap();
    let by_name = |n: &str| {
        status["boxes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == n)
            .unwrap()["lastStatus"]
            .clone()
    };
    assert_eq!(by_name("a")["event"], "idle");
    assert_eq!(by_name("b")["event"], "blocked");
    assert!(
        !status.to_string().contains(&token_a),
        "tokens are not listed"
    );

    // Removing a box revokes its token.
    c.call(&req("box.remove", json!({"name": "a"}))).unwrap();
    assert_eq!(post(Some(&token_a), json!({"event": "x"})), 401);
}

/// Whether the native backend builds its private view on this machine, as `sandbox doctor`
/// reports it (a real probe).
fn view_available(env: &Env) -> bool {
    let out = env.cmd().args(["doctor", "--json"]).output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    report["private_view"]["available"] == json!(true)
}

fn bin_dir() -> PathBuf {
    Path::new(common::BIN).parent().unwrap().to_path_buf()
}

#[test]
fn a_sandboxed_agent_cannot_take_over_the_daemon() {
    let d = Daemon::start();
    let mut c = d.client();
    let run_dir = d.paths().dir;
    // A listener outside the allowed ports: the control that --block-net is in force.
    let outside = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let outside_port = outside.local_addr().unwrap().port();
    create(
        &mut c,
        "agent",
        &d.work(),
        json!({"blockNet": true, "allowRead": [bin_dir()]}),
    );
    let token_path = d.paths().host_token();
    let attack = format!(
        r#"
import json, socket, sys
def ask(lines):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect({socket:?})
    except FileNotFoundError:
        return "absent"
    f = s.makefile("rwb")
    out = []
    for line in lines:
        try:
            f.write((json.dumps(line) + "\n").encode()); f.flush()
            reply = f.readline()
        except (BrokenPipeError, ConnectionResetError):
            reply = b""
        out.append(json.loads(reply)["error"]["code"] if reply else "closed")
        if not reply:
            break
    return out
print("nohello", ask([{{"id": 1, "method": "box.create", "params": {{"name": "pwn", "backend": "host", "workdir": "/"}}}}]))
print("forged", ask([{{"id": 1, "method": "host.hello", "params": {{"token": "sbx-host-" + "0" * 64}}}},
                     {{"id": 2, "method": "box.list"}}]))
try:
    open({token:?}).read(); print("token READ")
except OSError as e:
    print("token denied", e.errno)
t = socket.socket()
try:
    t.connect(("127.0.0.1", {outside_port})); print("outside CONNECTED")
except OSError as e:
    print("outside denied", e.errno)
"#,
        socket = d.paths().socket().display().to_string(),
        token = token_path.display().to_string(),
    );
    std::fs::write(d.work().join("attack.py"), attack).unwrap();
    let id = exec(&mut c, "agent", &["/usr/bin/python3", "attack.py"]);
    let run = collect(&mut c, id);
    let out = String::from_utf8_lossy(&run.stdout).into_owned();
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.exit.exit_code, Some(0), "{out}\n{err}");
    if view_available(&d.env) {
        // In the private view the daemon's socket does not exist at all.
        assert!(out.contains("nohello absent"), "{out}\n{err}");
        assert!(out.contains("forged absent"), "{out}\n{err}");
    } else {
        // Landlock does not stop the connect() (ABI < 9); the host token requirement does.
        assert!(out.contains("nohello ['unauthenticated']"), "{out}\n{err}");
        assert!(
            out.contains("forged ['unauthenticated', 'closed']"),
            "{out}\n{err}"
        );
    }
    assert!(out.contains("token denied"), "{out}\n{err}");
    assert!(out.contains("outside denied"), "{out}\n{err}");
    assert!(
        !c.call(&req("box.list", json!({})))
            .unwrap()
            .to_string()
            .contains("pwn"),
        "no box was created"
    );
    assert!(!run_dir.join("pwned").exists());

    // Under --block-net the hook port stays reachable: `sandbox hook` from inside works.
    let id = exec(
        &mut c,
        "agent",
        &[common::BIN, "hook", "needs-input", "approve?"],
    );
    let run = collect(&mut c, id);
    assert_eq!(
        run.exit.exit_code,
        Some(0),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let list = c.call(&req("box.list", json!({}))).unwrap();
    assert_eq!(list[0]["lastStatus"]["event"], "needs-input");
    assert_eq!(list[0]["lastStatus"]["message"], "approve?");
}

#[test]
fn sandbox_run_gets_a_task_token_only_while_a_daemon_runs() {
    let env = Env::new();
    let allow = format!("--allow-read={}", bin_dir().display());
    let script = format!(
        "echo ${{SANDBOX_API_TOKEN:-none}}; {} hook done finished",
        common::BIN
    );
    // No daemon: nothing set, nothing fails except the hook itself.
    let out = env
        .cmd()
        .args(["run", &allow, "--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("none"),
        "{}",
        text(&out)
    );
    assert_ne!(out.status.code(), Some(0), "the hook has nowhere to go");

    let d = Daemon::start_in(env);
    let out = d
        .env
        .cmd()
        .args(["run", "--block-net", &allow, "--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(token.starts_with("sbx-sandbox-"), "{token}");
    let host = d.paths().read_host_token().unwrap();
    let status = http(&hook_url(&d), "GET", "/api/v1/status", Some(&host), None).unwrap();
    let status: Value = serde_json::from_str(&status.body).unwrap();
    assert_eq!(status["tasks"]["work"]["event"], "done", "{status}");
    // The token was a lease for that run: it ended with the run.
    let late = post_status(&hook_url(&d), &token, "working", None).unwrap();
    assert_eq!(late.status, 401, "a finished run's token still works");

    // While a run lasts, its token is for its task only.
    let mut long = d
        .env
        .cmd()
        .args([
            "run",
            "--",
            "sh",
            "-c",
            "echo $SANDBOX_API_TOKEN; read line",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(long.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let live = line.trim().to_string();
    assert!(live.starts_with("sbx-sandbox-"), "{live}");
    assert_eq!(
        http(&hook_url(&d), "GET", "/api/v1/status", Some(&live), None)
            .unwrap()
            .status,
        403
    );
    assert_eq!(
        post_status(&hook_url(&d), &live, "working", None)
            .unwrap()
            .status,
        200
    );
    // Killing the run outright (no cleanup code runs) still ends the lease, at once: the
    // kernel has closed the run's end of its connection by the time the run is reaped.
    long.kill().unwrap();
    long.wait().unwrap();
    assert_eq!(
        post_status(&hook_url(&d), &live, "working", None)
            .unwrap()
            .status,
        401,
        "a killed run's token still works"
    );
}

#[test]
fn ps_lists_boxes_with_their_status() {
    let env = Env::new();
    let out = env.cmd().args(["ps", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");

    let d = Daemon::start_in(env);
    let mut c = d.client();
    create(&mut c, "listed", &d.work(), json!({}));
    let (url, token) = box_env(&mut c, "listed");
    post_status(&url, &token, "working", Some("on it")).unwrap();
    let out = d.env.cmd().args(["ps"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("listed"))
        .expect(&table);
    for want in ["native", "running", "working: on it"] {
        assert!(row.contains(want), "{want}: {table}");
    }
    let out = d.env.cmd().args(["ps", "--json"]).output().unwrap();
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json[0]["lastStatus"]["message"], "on it");
}

#[test]
fn ps_without_host_token_access_fails_closed() {
    // A process that can reach the socket but not the token (a sandboxed one) gets nothing.
    let d = Daemon::start();
    let mut raw = UnixStream::connect(d.paths().socket()).unwrap();
    raw.write_all(b"{\"id\":1,\"method\":\"box.list\"}\n")
        .unwrap();
    let mut line = String::new();
    BufReader::new(&raw).read_line(&mut line).unwrap();
    assert!(line.contains("unauthenticated"), "{line}");
}

#[test]
fn box_execs_get_their_git_pointers_checked_and_restored() {
    let d = Daemon::start();
    let mut c = d.client();
    let repo = d.env.path().join("repo");
    let task = d.env.path().join("task");
    sandbox_testkit::linked_worktree_on(&repo, &task, "trunk", "task");
    let pointer = task.join(".git");
    let before = std::fs::read_to_string(&pointer).unwrap();
    let rewrite = [
        "sh",
        "-c",
        "printf 'gitdir: /tmp/evil\\n' > .git && echo rewrote || echo refused",
    ];
    if view_available(&d.env) {
        // In the private view the pointer is bound read-only: the write fails, and there is
        // nothing to repair.
        create(&mut c, "viewbox", &task, json!({}));
        let id = exec(&mut c, "viewbox", &rewrite);
        let run = collect(&mut c, id);
        assert_eq!(String::from_utf8_lossy(&run.stdout).trim(), "refused");
        assert_eq!(run.exit.error_message, None, "{:?}", run.exit);
        assert_eq!(std::fs::read_to_string(&pointer).unwrap(), before);
    } else {
        common::skip(
            "private-view",
            "the private view is not available here: only the repair is tested",
        );
    }
    // Without the view (a daemon in a user namespace that may create no user namespaces, as
    // on hosts that disable them) the write lands, and the daemon restores the pointer after
    // the command and says so in its exit event.
    if let Some(why) = common::escape::nouserns_unavailable() {
        common::skip("nouserns-harness", why);
        return;
    }
    drop(c);
    let d = {
        let env = d.shutdown_keeping_env();
        Daemon::start_in_with(env, &common::escape::NOUSERNS_WRAPPER)
    };
    let mut c = d.client();
    create(&mut c, "gitbox", &task, json!({}));
    let id = exec(&mut c, "gitbox", &rewrite);
    let run = collect(&mut c, id);
    assert_eq!(String::from_utf8_lossy(&run.stdout).trim(), "rewrote");
    assert_eq!(run.exit.exit_code, Some(0));
    let note = run.exit.error_message.clone().unwrap_or_default();
    assert!(note.contains("restored"), "exit event: {:?}", run.exit);
    assert_eq!(std::fs::read_to_string(&pointer).unwrap(), before);
    // A command that leaves the pointers alone reports nothing.
    let id = exec(&mut c, "gitbox", &["true"]);
    let run = collect(&mut c, id);
    assert_eq!(run.exit.error_message, None);
}

#[test]
fn a_command_of_the_daemon_inherits_no_stray_descriptor() {
    // The daemon itself was started holding the strays (as under a careless service
    // manager); the commands of its boxes must not get them.
    let env = Env::new();
    let strays = common::StrayFds::new();
    let mut cmd = env.cmd();
    strays.give_to(&mut cmd);
    let daemon = common::daemon::Daemon::start_with(&env, cmd);
    for backend in ["host", "native"] {
        let out = daemon.run_once(
            &env.work(),
            json!({"backend": backend}),
            &["sh", "-c", common::LIST_FDS],
        );
        assert_eq!(out.status.code(), Some(0), "{backend}: {}", text(&out));
        common::assert_no_strays(
            &format!("box.exec ({backend})"),
            &String::from_utf8_lossy(&out.stdout),
        );
    }
}

/// A named box reused across an agent's turns, with a home that has package caches (the test
/// kit's): every `box.exec` mounts the caches' layers again, and each finds what the last one
/// left there. Two commands at once: the second gets layers of its own over the user's caches
/// (one overlay per layer at a time), thrown away when it ends; the box's own layers are
/// intact after.
#[test]
fn ten_commands_in_one_box_each_find_the_caches_as_the_last_left_them() {
    let d = Daemon::start();
    let mut c = d.client();
    create(&mut c, "turns", &d.work(), json!({}));
    for turn in 1..=10 {
        let id = exec(
            &mut c,
            "turns",
            &["sh", "-c", "echo x >> ~/.npm/turns; wc -l < ~/.npm/turns"],
        );
        let run = collect(&mut c, id);
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.exit.exit_code, Some(0), "turn {turn}: {err}");
        assert_eq!(
            run.stdout,
            format!("{turn}\n").as_bytes(),
            "turn {turn}: {err}"
        );
    }

    // One command holds the layers (it waits on a FIFO it made); a second one runs meanwhile.
    let hold = exec(
        &mut c,
        "turns",
        &[
            "sh",
            "-c",
            "touch ~/.npm/first; mkfifo $TMPDIR/go; echo ready; read x < $TMPDIR/go",
        ],
    );
    assert_eq!(read_lines(&mut c, hold, 1), ["ready"]);
    let beside = exec(
        &mut c,
        "turns",
        &[
            "sh",
            "-c",
            "touch ~/.npm/second; ls ~/.npm; echo go > $TMPDIR/go",
        ],
    );
    // The two end in either order: their events are read together.
    let mut runs = collect_each(&mut c, &[beside, hold]);
    let run = runs.remove(&beside).unwrap();
    let listed = String::from_utf8_lossy(&run.stdout).into_owned();
    assert_eq!(
        run.exit.exit_code,
        Some(0),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    // Its own layer over the user's cache: not the one the first command has mounted.
    assert!(
        listed.contains("second") && listed.contains("_cacache"),
        "{listed}"
    );
    assert!(
        !listed.contains("first"),
        "one layer mounted twice: {listed}"
    );
    assert_eq!(runs[&hold].exit.exit_code, Some(0));
    let last = exec(&mut c, "turns", &["sh", "-c", "ls ~/.npm"]);
    let listed = String::from_utf8_lossy(&collect(&mut c, last).stdout).into_owned();
    assert!(
        listed.contains("first") && listed.contains("turns"),
        "{listed}"
    );
    assert!(
        !listed.contains("second"),
        "the throwaway layer was kept: {listed}"
    );

    c.call(&req("box.remove", json!({"name": "turns"})))
        .unwrap();
    let env = d.shutdown_keeping_env();
    // The user's cache was never written; the layers hold no overlay work directory, no
    // throwaway layer, and the private home no mount point of the runs.
    let home = env.home();
    assert!(!home.join(".npm/turns").exists() && !home.join(".npm/first").exists());
    let state = home.join(".local/state/sandbox");
    let left = common::leftovers(&state);
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// The daemon's kill grace (`sandbox serve`'s default): a signal that was delivered ends a
/// `sleep` well within it; one that was lost would leave it running until the deadline.
const KILL_GRACE: Duration = sandbox_exec::process_group::DEFAULT_KILL_GRACE;

/// The next `exit` event of `exec_id`, or a loud failure once the socket's read timeout
/// (set by the caller) passed without one.
fn exit_of(client: &mut Client, exec_id: u64, what: &str) -> Incoming {
    loop {
        let event = client.next_event().unwrap_or_else(|e| {
            panic!("{what}: no `exit` event within {GONE:?} (the command was never ended): {e}")
        });
        if event.exec_id == Some(exec_id) && event.kind.as_deref() == Some("exit") {
            return event;
        }
    }
}

/// `exec.kill` the moment `box.exec` answered, round after round beside a CPU hog: the
/// signal always reaches the command, which ends with it (128+N) within the kill grace. The
/// daemon answers `box.exec` once the spawn returned, which is before the proxy of the pid
/// namespace ran a line of its own; a TERM that came that early met the daemon's signal
/// handlers, inherited across fork, and was dropped: the command ran on, no `exit` came
/// (about one round in sixty beside two hogs). A command's `timeoutMs` ends it too.
#[test]
fn a_command_signalled_the_moment_box_exec_answered_always_ends_with_its_signal() {
    let _hog = common::CpuHog::start();
    let d = Daemon::start();
    let mut c = d.client();
    // Every wait below is for an event; this only turns a lost signal into a failure.
    c.stream().set_read_timeout(Some(GONE)).unwrap();
    create(&mut c, "signals", &d.work(), json!({}));
    let signals = [
        ("TERM", libc::SIGTERM),
        ("INT", libc::SIGINT),
        ("KILL", libc::SIGKILL),
    ];
    for round in 0..90 {
        let (name, number) = signals[round % signals.len()];
        let reply = c
            .call(&req(
                "box.exec",
                json!({"name": "signals", "command": "sleep", "args": ["1000"]}),
            ))
            .unwrap();
        let id = reply["execId"].as_u64().unwrap();
        let pid = reply["pid"].as_i64().unwrap() as i32;
        let sent = Instant::now();
        assert_eq!(
            c.call(&req("exec.kill", json!({"execId": id, "signal": name})))
                .unwrap(),
            json!({"ok": true})
        );
        let what = format!("round {round}, SIG{name} to exec {id} (pid {pid})");
        let exit = exit_of(&mut c, id, &what);
        let took = sent.elapsed();
        assert_eq!(
            (exit.exit_code, exit.signal, exit.timed_out),
            (Some(128 + number), Some(number), None),
            "{what}: {exit:?}"
        );
        assert!(
            took <= KILL_GRACE,
            "{what}: ended {took:?} after the signal"
        );
        assert!(wait_dead(pid, GONE), "{what}: its process is still there");
    }
    // A timeout that expires as the command starts: the same window, the daemon's own signal.
    for round in 0..20 {
        let reply = c
            .call(&req(
                "box.exec",
                json!({"name": "signals", "command": "sleep", "args": ["1000"], "timeoutMs": 1}),
            ))
            .unwrap();
        let id = reply["execId"].as_u64().unwrap();
        let what = format!("timeout round {round}, exec {id}");
        let exit = exit_of(&mut c, id, &what);
        assert_eq!(
            (exit.exit_code, exit.signal, exit.timed_out),
            (Some(124), None, Some(true)),
            "{what}: {exit:?}"
        );
    }
}
