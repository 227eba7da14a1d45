//! `--allow-domain` on the native backend, from both sides: the run's network namespace
//! holds only loopback, its one way out is the supervisor's proxy, and the proxy decides by
//! name. Loopback only: HTTP servers the test starts on 127.0.0.x and a DNS answerer on
//! 127.0.0.1 the proxy is pointed at (`SANDBOX_DNS_SERVER`). The host backend is the control
//! that shows each refused path reaches its server when nothing stands in the way.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sandbox_testkit::net::Answerer;

use crate::common::{self, text, Env};

/// An HTTP server on `ip` (a thread) that answers every request with `body`, and counts them
/// (and keeps their heads).
pub(crate) struct Http {
    pub(crate) port: u16,
    requests: Arc<AtomicUsize>,
    heads: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Http {
    pub(crate) fn start(ip: Ipv4Addr, body: &'static str) -> Http {
        let listener = TcpListener::bind((ip, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(AtomicUsize::new(0));
        let count = requests.clone();
        let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = heads.clone();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                kept.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&head).into_owned());
                count.fetch_add(1, Ordering::SeqCst);
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Http {
            port,
            requests,
            heads,
        }
    }

    pub(crate) fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// The request heads received so far.
    pub(crate) fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

/// Where the tests' names point: a loopback address that is not 127.0.0.1 (so `NO_PROXY`
/// does not send curl around the proxy), listed as an address the proxy may connect to.
pub(crate) const SERVED: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// An address no name points at, for the IP literal.
const LITERAL: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);

/// Why the network tests cannot run here, if so: no curl, or no network namespace for the
/// native backend (no user namespaces).
pub(crate) fn unavailable(env: &Env) -> Option<String> {
    if !Path::new("/usr/bin/curl").exists() {
        return Some("curl is missing".into());
    }
    let out = env.cmd().args(["doctor"]).output().unwrap();
    let doctor = String::from_utf8_lossy(&out.stdout).into_owned();
    (!doctor.contains("view+landlock+seccomp"))
        .then(|| format!("no private view here, so no network namespace:\n{doctor}"))
}

pub(crate) fn run(env: &Env, backend: &str, flags: &[&str], dns: u16, script: &str) -> Output {
    env.cmd()
        .args(["run", "--backend", backend])
        .args(flags)
        .args(["--", "sh", "-c", script])
        .env("SANDBOX_DNS_SERVER", format!("127.0.0.1:{dns}"))
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn a_listed_name_is_reached_through_the_proxy_and_nothing_else_is() {
    let env = Env::new();
    if let Some(why) = unavailable(&env) {
        common::skip("net-namespace", why);
        return;
    }
    let served = Http::start(SERVED, "hello from a.test");
    let literal = Http::start(LITERAL, "hello from the literal");
    let dns = Answerer::start(&[("a.test", SERVED), ("b.test", SERVED)]);
    // The address the name answers with, from the configuration; the name from the flag.
    env.write_config(&format!("network:\n  allow_domains: ['{SERVED}']\n"));
    let report = env.path().join("report.json");
    let (p, l) = (served.port, literal.port);
    let script = format!(
        "echo a: $(curl -sS http://a.test:{p}/ 2>&1); \
         echo b: $(curl -sS http://b.test:{p}/ 2>&1); \
         echo literal: $(curl -sS http://{LITERAL}:{l}/ 2>&1); \
         echo tunnel: $(curl -sS -p http://a.test:{p}/ 2>&1)"
    );
    let out = run(
        &env,
        "native",
        &[
            "--allow-domain",
            "a.test",
            "--report-json",
            report.to_str().unwrap(),
        ],
        dns.port,
        &script,
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        stdout.contains("a: hello from a.test"),
        "the listed name is reached: {}",
        text(&out)
    );
    assert!(
        stdout.contains("tunnel: hello from a.test"),
        "through a CONNECT tunnel too: {}",
        text(&out)
    );
    // The refusals are bodies the program shows: the rule and how to allow it.
    assert!(
        stdout.contains("b: sandbox: refused: b.test")
            && stdout.contains("rule not-listed")
            && stdout.contains("--allow-domain b.test"),
        "{}",
        text(&out)
    );
    assert!(
        stdout.contains("literal: sandbox: refused") && stdout.contains("ip-literal"),
        "{}",
        text(&out)
    );
    assert_eq!(served.requests(), 2, "a.test only: {}", text(&out));
    assert_eq!(literal.requests(), 0, "{}", text(&out));
    // A refused name is never resolved.
    assert!(
        !dns.asked().iter().any(|n| n == "b.test"),
        "{:?}",
        dns.asked()
    );
    // The log, in the report.
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let log = report["connections"].as_array().unwrap();
    let find = |host: &str| {
        log.iter()
            .find(|c| c["host"] == host)
            .unwrap_or_else(|| panic!("{host} not in {log:?}"))
    };
    assert_eq!(find("a.test")["allowed"], true, "{log:?}");
    assert_eq!(find("a.test")["rule"], "a.test", "{log:?}");
    assert_eq!(find("b.test")["rule"], "not-listed", "{log:?}");
    assert_eq!(find(&LITERAL.to_string())["rule"], "ip-literal", "{log:?}");
    assert_eq!(log.len(), 4, "{log:?}");

    // The control: without a boundary both refused paths reach their servers (an
    // environment without the configuration's list, which the host backend refuses).
    let out = run(
        &Env::new(),
        "host",
        &[],
        dns.port,
        &format!(
            "curl -sS --resolve b.test:{p}:{SERVED} http://b.test:{p}/ && \
             curl -sS http://{LITERAL}:{l}/"
        ),
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(served.requests(), 3, "{}", text(&out));
    assert_eq!(literal.requests(), 1, "{}", text(&out));
}

#[test]
fn a_program_that_ignores_the_proxy_variables_reaches_nothing() {
    let env = Env::new();
    if let Some(why) = unavailable(&env) {
        common::skip("net-namespace", why);
        return;
    }
    let served = Http::start(SERVED, "hello");
    let dns = Answerer::start(&[("a.test", SERVED)]);
    let p = served.port;
    // Straight to the address, and to the name resolved by the program itself.
    let script = format!(
        "env -u HTTP_PROXY -u http_proxy -u ALL_PROXY -u all_proxy \
         curl -sS --noproxy '*' http://{SERVED}:{p}/ && echo REACHED; \
         curl -sS --noproxy '*' --resolve a.test:{p}:{SERVED} http://a.test:{p}/ && echo REACHED; \
         curl -sS --noproxy '*' http://a.test:{p}/ && echo REACHED; true"
    );
    let flags = ["--allow-domain", "a.test", "--allow-domain", "127.0.0.2"];
    let out = run(&env, "native", &flags, dns.port, &script);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("REACHED"),
        "{}",
        text(&out)
    );
    assert_eq!(served.requests(), 0, "{}", text(&out));
    // The control: the same commands reach the server.
    let out = run(&env, "host", &[], dns.port, &script);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("REACHED"),
        "{}",
        text(&out)
    );
    assert!(served.requests() >= 2, "{}", text(&out));
}

#[test]
fn why_net_names_the_rule_that_decides() {
    let env = Env::new();
    let why = |args: &[&str]| -> serde_json::Value {
        let out = env
            .cmd()
            .args(["why", "--json"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let v = why(&["--net", "api.github.com", "--allow-domain", "@github"]);
    assert_eq!(
        (v["allowed"].clone(), v["rule"].clone()),
        (true.into(), "@github".into())
    );
    let v = why(&["--net", "b.test", "--allow-domain", "a.test"]);
    assert_eq!(
        (v["allowed"].clone(), v["rule"].clone()),
        (false.into(), "not-listed".into())
    );
    let v = why(&[
        "--net",
        "127.0.0.1:3000",
        "--block-net",
        "--allow-port",
        "3000",
    ]);
    assert_eq!(v["rule"], "--allow-port 3000");
    let v = why(&[
        "--net",
        "example.com:443",
        "--block-net",
        "--allow-port",
        "443",
    ]);
    assert_eq!(
        (v["allowed"].clone(), v["rule"].clone()),
        (false.into(), "blocked".into())
    );
    let v = why(&["--net", "example.com"]);
    assert_eq!(v["rule"], "open");
    // The configuration's list counts.
    env.write_config("network:\n  allow_domains: ['*.example.org']\n");
    let v = why(&["--net", "www.example.org"]);
    assert_eq!(
        (v["allowed"].clone(), v["rule"].clone()),
        (true.into(), "*.example.org".into())
    );
}

/// Without user namespaces there is no network namespace for the proxy to be the only way
/// out of: a domain list is refused before anything runs, degraded runs allowed or not.
#[test]
fn a_domain_list_is_refused_where_no_network_namespace_holds_it() {
    use crate::common::escape;
    if let Some(why) = escape::nouserns_unavailable() {
        common::skip("nouserns-harness", why);
        return;
    }
    let env = Env::new();
    let marker = env.work().join("ran");
    for extra in [&[][..], &["--allow-degraded"][..]] {
        let out = env
            .cmd_under(&escape::NOUSERNS_WRAPPER)
            .args(["run", "--backend", "native", "--allow-domain", "a.test"])
            .args(extra)
            .args([
                "--",
                "sh",
                "-c",
                &format!("echo ran > {}", marker.display()),
            ])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(125), "{extra:?}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--allow-domain needs the run's own network namespace")
                && stderr.contains("--backend nono"),
            "{}",
            text(&out)
        );
        assert!(!marker.exists(), "{extra:?}");
    }
}

/// The daemon's `box.exec` goes through the same run sequence: its command gets the
/// namespace and the proxy, and its `exit` event carries the connection log.
#[test]
fn a_box_exec_gets_the_proxy_and_its_exit_event_the_log() {
    use crate::common::daemon::{req, Daemon};
    let env = Env::new();
    if let Some(why) = unavailable(&env) {
        common::skip("net-namespace", why);
        return;
    }
    let served = Http::start(SERVED, "hello from a.test");
    let dns = Answerer::start(&[("a.test", SERVED)]);
    let mut cmd = env.cmd();
    cmd.env("SANDBOX_DNS_SERVER", format!("127.0.0.1:{}", dns.port));
    let daemon = Daemon::start_with(&env, cmd);
    let mut client = daemon.client();
    daemon
        .create(
            &mut client,
            "net",
            &env.work(),
            serde_json::json!({
                "backend": "native",
                "allowDomains": ["a.test", SERVED.to_string()],
            }),
        )
        .unwrap();
    let p = served.port;
    let reply = client
        .call(&req(
            "box.exec",
            serde_json::json!({
                "name": "net",
                "command": "sh",
                "args": ["-c", format!("curl -sS http://a.test:{p}/; curl -sS http://b.test:{p}/")],
            }),
        ))
        .unwrap();
    let id = reply["execId"].as_u64().unwrap();
    let exit = loop {
        let event = client.next_event().unwrap();
        if event.exec_id == Some(id) && event.kind.as_deref() == Some("exit") {
            break event;
        }
    };
    assert_eq!(exit.exit_code, Some(0), "{exit:?}");
    assert_eq!(served.requests(), 1, "{exit:?}");
    let rules: Vec<(&str, bool, &str)> = exit
        .connections
        .iter()
        .map(|c| (c.host.as_str(), c.allowed, c.rule.as_str()))
        .collect();
    assert_eq!(
        rules,
        vec![("a.test", true, "a.test"), ("b.test", false, "not-listed")],
        "{exit:?}"
    );
}

/// A test suite that starts a server on the run's own loopback (any port, `bind` to port 0)
/// and talks to it works under `--block-net` as under `--allow-domain`: in its own network
/// namespace the run's loopback is its own, and only the way out differs. A listener of the
/// host on a port not allowed stays out of reach.
#[test]
fn the_runs_own_servers_answer_on_its_loopback_in_every_network_mode() {
    let env = Env::new();
    if let Some(why) = unavailable(&env) {
        common::skip("no-netns", why);
        return;
    }
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let host_port = host.local_addr().unwrap().port();
    let script = format!(
        "python3 -c '
import socket, threading
s = socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen(1)
port = s.getsockname()[1]
def serve():
    c, _ = s.accept(); c.sendall(c.recv(5).upper()); c.close()
threading.Thread(target=serve).start()
c = socket.create_connection((\"127.0.0.1\", port)); c.sendall(b\"hello\")
print(c.recv(5).decode())
try:
    socket.create_connection((\"127.0.0.1\", {host_port}), timeout=5); print(\"host reached\")
except OSError:
    print(\"host refused\")
'"
    );
    for flags in [&["--block-net"][..], &["--allow-domain", "example.com"][..]] {
        let out = run(&env, "native", flags, 9, &script);
        assert_eq!(out.status.code(), Some(0), "{flags:?}: {}", text(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "HELLO\nhost refused\n",
            "{flags:?}: {}",
            text(&out)
        );
    }
}

/// Under `--block-net` the hook port is relayed in only where a hook server listens (the
/// daemon's, whose token the run holds): with `service.hook_port` configured and no daemon,
/// a listener of the host's loopback on that port (anyone's) is reachable without a boundary
/// (the host backend, the control) and with `--allow-port` (the relay the run would have
/// had), and not from a run that blocks the network. With the daemon the hook still works:
/// `service::sandbox_run_gets_a_task_token_only_while_a_daemon_runs` posts through it.
#[test]
fn the_hook_port_is_not_relayed_when_no_hook_server_listens() {
    let env = Env::new();
    if let Some(why) = unavailable(&env) {
        common::skip("net-namespace", why);
        return;
    }
    let listener = Http::start(Ipv4Addr::LOCALHOST, "a host listener");
    let p = listener.port;
    env.write_config(&format!("service:\n  hook_port: {p}\n"));
    let script = format!("curl -sS --max-time 20 http://127.0.0.1:{p}/ 2>&1; echo; true");
    let reached = |out: &Output| String::from_utf8_lossy(&out.stdout).contains("a host listener");

    // The host backend refuses `--block-net`: without it, nothing stands in the way.
    let control = run(&env, "host", &[], 9, &script);
    assert!(reached(&control), "no boundary: {}", text(&control));
    assert_eq!(listener.requests(), 1);
    let relayed = run(
        &env,
        "native",
        &["--block-net", "--allow-port", &p.to_string()],
        9,
        &script,
    );
    assert!(reached(&relayed), "a relayed port: {}", text(&relayed));
    assert_eq!(listener.requests(), 2);

    let out = run(&env, "native", &["--block-net"], 9, &script);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!reached(&out), "the hook port was relayed: {}", text(&out));
    assert_eq!(listener.requests(), 2, "{}", text(&out));
}
