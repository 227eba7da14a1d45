//! `--publish` on the native backend (issue 26's inbound side): from the host, only the ports
//! a run publishes reach a server inside its network namespace. Loopback only: a Python
//! server the run starts, reached from the test on the host's 127.0.0.1. Every wait is for
//! an event (the server's `ready` line, a reply, the run's exit), never for a duration.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::common::{self, text, Env};

const PYTHON: &str = "/usr/bin/python3";

/// The server inside: an echo server (one thread per connection, one line each) on
/// 127.0.0.1:`argv[1]`, and a second listener made by `listen(2)` without `bind(2)` (the
/// kernel picks its port; no Landlock rule sees it). Prints `ready PORT` (the second's port),
/// then runs until its stdin ends.
const SERVER: &str = r#"
import socket, sys, threading
def handle(c):
    data = b''
    while not data.endswith(b'\n'):
        chunk = c.recv(100)
        if not chunk:
            return
        data += chunk
    c.sendall(b'echo ' + data)
    c.close()
def serve(s):
    while True:
        c, _ = s.accept()
        threading.Thread(target=handle, args=(c,), daemon=True).start()
published = socket.socket()
published.bind(('127.0.0.1', int(sys.argv[1])))
published.listen(16)
unbound = socket.socket()
unbound.listen(16)
for s in (published, unbound):
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print('ready', unbound.getsockname()[1], flush=True)
sys.stdin.read()
"#;

/// Why these tests cannot run here, if so: no python3, or no network namespace.
fn unavailable(env: &Env) -> Option<String> {
    if !Path::new(PYTHON).exists() {
        return Some(format!("{PYTHON} is missing"));
    }
    let out = env.cmd().args(["doctor"]).output().unwrap();
    let doctor = String::from_utf8_lossy(&out.stdout).into_owned();
    (!doctor.contains("view+landlock+seccomp"))
        .then(|| format!("no private view here, so no network namespace:\n{doctor}"))
}

/// A port free on the host's loopback now.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One line through `stream` to the echo server, and its answer.
fn echo(stream: &mut TcpStream, line: &str) -> String {
    stream.write_all(format!("{line}\n").as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

/// A started run of [`SERVER`] and the port of its unbound listener.
struct Server {
    child: Child,
    unbound: u16,
}

impl Server {
    fn start(mut cmd: Command, inner: u16) -> Server {
        let mut child = cmd
            .args(["--", PYTHON, "-u", "-c", SERVER, &inner.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let Some(port) = line.trim().strip_prefix("ready ") else {
            let out = child.wait_with_output().unwrap();
            panic!("the server did not start: {line:?}\n{}", text(&out));
        };
        Server {
            child,
            unbound: port.parse().unwrap(),
        }
    }

    /// Ends the server (its stdin closes) and waits for the run.
    fn stop(mut self) -> std::process::Output {
        drop(self.child.stdin.take());
        self.child.wait_with_output().unwrap()
    }
}

/// What a client on the host sees connecting to `port` of its loopback: the echo, or how it
/// failed (refused, reset, closed without an answer).
fn reach(port: u16) -> Result<String, String> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).map_err(|e| e.to_string())?;
    stream
        .write_all(b"hi\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut answer = String::new();
    match stream.read_to_string(&mut answer) {
        Ok(_) if answer.is_empty() => Err("closed without an answer".into()),
        Ok(_) => Ok(answer),
        Err(e) => Err(e.to_string()),
    }
}

/// The scenario, for `sandbox` started by `cmd` (`run` with its flags to come): a published
/// server is reached from the host, two connections at once; a published port with nothing
/// inside resets its client and stops nothing; the listener made without `bind` is not
/// reachable from the host; the report logs every inbound connection.
fn published_scenario(cmd: impl Fn() -> Command, report: &Path) {
    let (host_port, inner, empty_host, empty_inner) =
        (free_port(), free_port(), free_port(), free_port());
    let mut run = cmd();
    run.args(["run", "--block-net", "--report-json"])
        .arg(report)
        .args(["--publish", &format!("{host_port}:{inner}")])
        .args([
            "--publish",
            &format!("127.0.0.1:{empty_host}:{empty_inner}"),
        ]);
    let server = Server::start(run, inner);

    // Two connections at once: the first stays open, unanswered, while the second is served.
    let mut first = TcpStream::connect((Ipv4Addr::LOCALHOST, host_port)).unwrap();
    let mut second = TcpStream::connect((Ipv4Addr::LOCALHOST, host_port)).unwrap();
    assert_eq!(echo(&mut second, "second"), "echo second\n");
    // A published port nobody listens on inside: the client learns at once, the run goes on.
    let refused = reach(empty_host);
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(echo(&mut first, "first"), "echo first\n");
    // The clients are done: their relays end (a relay still open at the end is cut).
    drop((first, second));
    // The listener the command made without bind(2) is in the namespace, not on the host.
    let unbound = reach(server.unbound);
    assert!(
        unbound.as_ref().is_err_and(|e| e.contains("refused")),
        "{unbound:?}"
    );

    let out = server.stop();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(report).unwrap()).unwrap();
    let inbound: Vec<(u64, bool, bool)> = report["connections"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["kind"] == "inbound")
        .map(|c| {
            (
                c["port"].as_u64().unwrap(),
                c["bytesDown"].as_u64().unwrap() > 0,
                c.get("error").is_some(),
            )
        })
        .collect();
    let mut expected = vec![
        (u64::from(inner), true, false),
        (u64::from(inner), true, false),
        (u64::from(empty_inner), false, true),
    ];
    let mut got = inbound.clone();
    got.sort();
    expected.sort();
    assert_eq!(got, expected, "{report:#}");
    let rule = format!("--publish 127.0.0.1:{empty_host}:{empty_inner}");
    assert!(
        report["connections"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["rule"] == rule.as_str()),
        "{report:#}"
    );
}

#[test]
fn a_published_server_is_reached_from_the_host_and_nothing_else_is() {
    let env = Env::new();
    if let Some(why) = unavailable(&env) {
        common::skip("net-namespace", why);
        return;
    }
    let report = env.path().join("report.json");
    published_scenario(|| env.cmd(), &report);
}

/// The same as `nobody`: the connector enters the run's namespaces with the capabilities its
/// owner has there, not root's.
#[test]
fn a_published_server_is_reached_as_an_unprivileged_user() {
    let is_root = nix::unistd::geteuid().is_root();
    if is_root && !Path::new(sandbox_testkit::nobody::SETPRIV).exists() {
        common::skip("setpriv", "as nobody: /usr/bin/setpriv is missing");
        return;
    }
    let env = Env::new();
    if let Some(why) = unavailable(&env) {
        common::skip("net-namespace", why);
        return;
    }
    let user = sandbox_testkit::nobody::UserDirs::new(env.path(), "nobody", common::BIN, true);
    let as_nobody = || {
        let mut cmd = user.command(&[user.bin_str()]);
        cmd.env("LANG", "C.UTF-8");
        cmd
    };
    published_scenario(as_nobody, &user.home.join("report.json"));
}

/// The control: the same server under `--backend host` is on the host's network, so the
/// listener made without `bind(2)` — which the native run keeps in its namespace — is
/// reachable from any process of the host.
#[test]
fn the_host_backend_leaves_every_listener_reachable() {
    let env = Env::new();
    if !Path::new(PYTHON).exists() {
        common::skip("python3", format!("{PYTHON} is missing"));
        return;
    }
    let mut run = env.cmd();
    run.args(["run", "--backend", "host"]);
    let server = Server::start(run, free_port());
    assert_eq!(reach(server.unbound), Ok("echo hi\n".into()));
    let out = server.stop();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// Where nothing can relay, `--publish` is refused before anything runs (125) with what the
/// backend does instead; with the open network only the identity is accepted (the server
/// already listens on the host's port).
#[test]
fn publish_is_refused_where_nothing_relays_it() {
    let env = Env::new();
    let marker = env.path().join("ran");
    for (flags, says) in [
        (
            vec!["--backend", "host", "--publish", "8080:3000"],
            "shares the host's network",
        ),
        (
            vec!["--backend", "lima", "--block-net", "--publish", "3000"],
            "Lima forwards",
        ),
        (vec!["--publish", "8080:3000"], "open network"),
        (vec!["--block-net", "--publish", "0"], "not a TCP port"),
    ] {
        let out = env
            .cmd()
            .arg("run")
            .args(&flags)
            .args(["--", "touch"])
            .arg(&marker)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(125), "{flags:?}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{flags:?}: {}", text(&out));
        assert!(!marker.exists(), "{flags:?} ran the command");
    }
    let show = env
        .cmd()
        .args(["policy", "show", "--block-net", "--publish", "8080:3000"])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&show.stdout);
    if unavailable(&env).is_none() {
        assert!(
            shown.contains("127.0.0.1:8080 to port 3000 inside"),
            "{}",
            text(&show)
        );
    }
}

/// `box.create` with `publish`: the daemon listens for the box; a connection reaches the
/// server its exec started, and the exec's `exit` event logs it as inbound.
#[test]
fn a_box_publishes_its_exec_and_the_exit_event_logs_it() {
    use crate::common::daemon::{req, Daemon};
    let env = Env::new();
    if let Some(why) = unavailable(&env) {
        common::skip("net-namespace", why);
        return;
    }
    let (host_port, inner) = (free_port(), free_port());
    let daemon = Daemon::start(&env);
    let mut client = daemon.client();
    daemon
        .create(
            &mut client,
            "web",
            &env.work(),
            serde_json::json!({
                "backend": "native",
                "blockNet": true,
                "publish": [format!("{host_port}:{inner}")],
            }),
        )
        .unwrap();
    let reply = client
        .call(&req(
            "box.exec",
            serde_json::json!({
                "name": "web",
                "command": PYTHON,
                "args": ["-u", "-c", SERVER, inner.to_string()],
            }),
        ))
        .unwrap();
    let id = reply["execId"].as_u64().unwrap();
    let mut stdout = Vec::new();
    let exit = loop {
        let event = client.next_event().unwrap();
        if event.exec_id != Some(id) {
            continue;
        }
        match event.kind.as_deref() {
            Some("output") if event.stream.as_deref() == Some("stdout") => {
                stdout.extend(event.output_bytes().unwrap());
                if stdout.starts_with(b"ready ") && stdout.ends_with(b"\n") {
                    assert_eq!(reach(host_port), Ok("echo hi\n".into()));
                    client
                        .call(&req(
                            "exec.stdin",
                            serde_json::json!({"execId": id, "close": true}),
                        ))
                        .unwrap();
                }
            }
            Some("exit") => break event,
            _ => {}
        }
    };
    assert_eq!(exit.exit_code, Some(0), "{exit:?}");
    let inbound: Vec<(&str, u16, bool)> = exit
        .connections
        .iter()
        .map(|c| (c.rule.as_str(), c.port, c.error.is_none()))
        .collect();
    let rule = format!("--publish 127.0.0.1:{host_port}:{inner}");
    assert_eq!(inbound, vec![(rule.as_str(), inner, true)], "{exit:?}");
}
