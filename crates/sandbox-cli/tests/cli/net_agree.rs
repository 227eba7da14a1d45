//! `sandbox why --net` and `policy show` agree with what the run does (issue 37): under
//! `--credential`, `--allow-domain`, `--block-net` and the open network, every host `why`
//! calls reachable is reached by the real run, every host it calls refused is not, and
//! `policy show --json` names the network the run got. Loopback stand-ins only: HTTP servers
//! on 127.0.0.2 (names from a DNS answerer the proxy is pointed at) and on 127.0.0.1 (a
//! plain-HTTP gateway for `--credential anthropic=http://127.0.0.1:PORT`, a port relayed by
//! `--allow-port`).

use std::net::Ipv4Addr;
use std::process::{Output, Stdio};

use sandbox_testkit::net::Answerer;

use crate::common::{self, text, Env};
use crate::net::{unavailable, Http, SERVED};

const SECRET: &str = "sk-ant-api03-the-real-secret-behind-the-gateway";

/// The host's environment of every command here: the credential's secret.
const HOST_ENV: [(&str, &str); 1] = [("ANTHROPIC_API_KEY", SECRET)];

/// `sandbox ARGS` with the test's resolver and the secret on the host's side.
fn sandbox(env: &Env, dns: &Answerer, args: &[&str], flags: &[&str]) -> Output {
    let mut cmd = env.cmd();
    cmd.args(args)
        .args(flags)
        .env("SANDBOX_DNS_SERVER", dns.addr())
        .stdin(Stdio::null());
    for (k, v) in HOST_ENV {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// One question: the host `why --net` is asked about, and the command inside that reaches
/// it (curl, failing on an HTTP error such as the proxy's 403).
struct Probe {
    host: String,
    reach: String,
}

fn probe(host: impl Into<String>, reach: impl Into<String>) -> Probe {
    Probe {
        host: host.into(),
        reach: reach.into(),
    }
}

/// Asks `why --net` about each probe under `flags`, runs every probe's command in one real
/// run with the same flags, and asserts that each answer is what the run did. Both answers
/// must occur unless `open`: a mode where everything agrees by being refused proves little.
/// Returns the run's output.
fn agree(env: &Env, dns: &Answerer, flags: &[&str], probes: &[Probe]) -> Output {
    let mut said = Vec::new();
    for p in probes {
        let out = sandbox(env, dns, &["why", "--json", "--net", &p.host], flags);
        assert!(out.status.success(), "{flags:?} {}: {}", p.host, text(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        said.push((v["allowed"].as_bool().unwrap(), v["rule"].to_string()));
    }
    let script: String = probes
        .iter()
        .enumerate()
        .map(|(i, p)| {
            format!(
                "if {} >/dev/null 2>&1; then echo 'probe {i} reached'; \
                 else echo 'probe {i} refused'; fi; ",
                p.reach
            )
        })
        .collect();
    let mut args = vec!["run", "--backend", "native"];
    args.extend(flags);
    args.extend(["--", "sh", "-c", &script]);
    let out = sandbox(env, dns, &args, &[]);
    assert_eq!(out.status.code(), Some(0), "{flags:?}: {}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for (i, (p, (allowed, rule))) in probes.iter().zip(&said).enumerate() {
        let did = if stdout.contains(&format!("probe {i} reached")) {
            true
        } else if stdout.contains(&format!("probe {i} refused")) {
            false
        } else {
            panic!("probe {i} did not run: {}", text(&out))
        };
        assert_eq!(
            *allowed,
            did,
            "{flags:?}: why --net {} says allowed={allowed} (rule {rule}), the run {}: {}",
            p.host,
            if did { "reached it" } else { "did not" },
            text(&out)
        );
    }
    let answers: Vec<bool> = said.iter().map(|(a, _)| *a).collect();
    assert!(
        answers.contains(&true) && (answers.contains(&false) || flags.is_empty()),
        "{flags:?}: {said:?}"
    );
    out
}

/// What `policy show --json` says the run's network is.
fn shown_network(env: &Env, dns: &Answerer, flags: &[&str]) -> serde_json::Value {
    let out = sandbox(env, dns, &["policy", "show", "--json"], flags);
    assert!(out.status.success(), "{flags:?}: {}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["network"].clone()
}

#[test]
fn why_and_policy_show_agree_with_the_run_in_every_network_mode() {
    let env = Env::new();
    if let Some(why) = unavailable(&env) {
        common::skip("net-namespace", why);
        return;
    }
    let served = Http::start(SERVED, "served");
    let gateway = Http::start(Ipv4Addr::LOCALHOST, "from the gateway");
    let host_port = Http::start(Ipv4Addr::LOCALHOST, "a host port");
    let dns = Answerer::start(&[("a.test", SERVED), ("b.test", SERVED)]);
    let (p, g, h) = (served.port, gateway.port, host_port.port);
    let curl = "curl -sSf --max-time 20";

    // --credential alone: the network is narrowed to the proxy, which reaches the gateway
    // (through the base URL, with the key) and nothing else.
    let credential = format!("anthropic=http://127.0.0.1:{g}");
    let flags = ["--credential", credential.as_str()];
    let out = agree(
        &env,
        &dns,
        &flags,
        &[
            probe(
                format!("127.0.0.1:{g}"),
                format!(
                    "{curl} -H \"x-api-key: $ANTHROPIC_API_KEY\" \
                     \"$ANTHROPIC_BASE_URL/v1/messages\""
                ),
            ),
            probe(format!("a.test:{p}"), format!("{curl} http://a.test:{p}/")),
            probe(
                format!("127.0.0.2:{p}"),
                format!("{curl} http://127.0.0.2:{p}/"),
            ),
            probe(
                format!("127.0.0.1:{h}"),
                format!("{curl} http://127.0.0.1:{h}/"),
            ),
        ],
    );
    // The run said so before it started, naming what stays reachable and how to widen it.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--credential anthropic narrows the network")
            && stderr.contains(&format!(
                "http://127.0.0.1:{g} (through $ANTHROPIC_BASE_URL)"
            ))
            && stderr.contains("--allow-domain HOST"),
        "{}",
        text(&out)
    );
    // The gateway got the key, over plain HTTP on the host's loopback; nobody else got
    // anything.
    let heads = gateway.heads();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(
        heads[0].contains(&format!("x-api-key: {SECRET}\r\n"))
            && heads[0].starts_with("GET /v1/messages HTTP/1.1\r\n"),
        "{heads:?}"
    );
    assert_eq!(served.requests(), 0);
    assert_eq!(host_port.requests(), 0);
    let net = shown_network(&env, &dns, &flags);
    assert_eq!(net["mode"], "proxied", "{net}");
    assert_eq!(net["narrowedByCredential"], true, "{net}");
    let human = sandbox(&env, &dns, &["policy", "show"], &flags);
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.contains("network   narrowed by --credential") && !human.contains("network   open"),
        "{human}"
    );

    // --allow-domain: the listed name through the proxy, no other.
    let flags = ["--allow-domain", "a.test", "--allow-domain", "127.0.0.2"];
    agree(
        &env,
        &dns,
        &flags,
        &[
            probe(format!("a.test:{p}"), format!("{curl} http://a.test:{p}/")),
            probe(format!("b.test:{p}"), format!("{curl} http://b.test:{p}/")),
        ],
    );
    assert_eq!(served.requests(), 1);
    let net = shown_network(&env, &dns, &flags);
    assert_eq!(
        (net["mode"].as_str(), net["narrowedByCredential"].as_bool()),
        (Some("proxied"), Some(false)),
        "{net}"
    );

    // --block-net: only the relayed port of the host's loopback.
    let allowed = h.to_string();
    let flags = ["--block-net", "--allow-port", allowed.as_str()];
    agree(
        &env,
        &dns,
        &flags,
        &[
            probe(
                format!("127.0.0.1:{h}"),
                format!("{curl} http://127.0.0.1:{h}/"),
            ),
            probe(
                format!("127.0.0.1:{g}"),
                format!("{curl} http://127.0.0.1:{g}/"),
            ),
            probe(
                format!("127.0.0.2:{p}"),
                format!("{curl} http://127.0.0.2:{p}/"),
            ),
        ],
    );
    assert_eq!(host_port.requests(), 1);
    assert_eq!(gateway.requests(), 1, "only the credential run's request");
    assert_eq!(shown_network(&env, &dns, &flags)["mode"], "blocked");

    // The open network, the control: the same address the other modes refused is reached.
    agree(
        &env,
        &dns,
        &[],
        &[probe(
            format!("127.0.0.2:{p}"),
            format!("{curl} http://127.0.0.2:{p}/"),
        )],
    );
    assert_eq!(served.requests(), 2);
    assert_eq!(shown_network(&env, &dns, &[])["mode"], "open");
}

/// A credential host that cannot be used (here: a plain-HTTP server where TLS is expected)
/// is told on the run's stderr once, however often the program retries, with the form that
/// names a plain-HTTP gateway; without it the agent only saw 502s.
#[test]
fn a_credential_host_that_fails_is_told_once_on_stderr() {
    let env = Env::new();
    if let Some(why) = unavailable(&env) {
        common::skip("net-namespace", why);
        return;
    }
    // A plain-HTTP server answers the TLS hello at once with a 400, as HTTP servers do.
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut stream in listener.incoming().flatten() {
            let mut hello = [0u8; 512];
            let _ = stream.read(&mut hello);
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let dns = Answerer::start(&[]);
    let credential = format!("anthropic=https://127.0.0.1:{port}");
    let script = "for i in 1 2 3; do \
                  curl -s --max-time 20 -o /dev/null -w '%{http_code}\\n' \
                  \"$ANTHROPIC_BASE_URL/v1/messages\"; done";
    let out = sandbox(
        &env,
        &dns,
        &[
            "run",
            "--backend",
            "native",
            "--credential",
            &credential,
            "--",
            "sh",
            "-c",
            script,
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "502\n502\n502\n",
        "{}",
        text(&out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let told: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("TLS handshake failed"))
        .collect();
    assert_eq!(told.len(), 1, "{}", text(&out));
    assert!(
        told[0].contains("--credential anthropic")
            && told[0].contains(&format!("--credential anthropic=http://127.0.0.1:{port}")),
        "{}",
        text(&out)
    );
    assert!(!stderr.contains(SECRET));
}
