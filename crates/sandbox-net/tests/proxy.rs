//! The proxy against real sockets on loopback: servers the tests start on 127.0.0.1, names
//! from a real UDP DNS server the test runs ([`Answerer`]), and a client that speaks to the
//! proxy as curl would (`CONNECT` for HTTPS_PROXY, absolute-form requests for HTTP_PROXY).
//! Each refusal is written from the attacker's side, with the control run (the same request
//! with the address allowed) showing that the path would otherwise reach the server.

// A panic is how a test or a benchmark reports failure; the workspace lints against
// unwrap/expect apply to shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use sandbox_net::{AllowList, Connection, Kind, Proxy, Resolver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// The DNS answerer on 127.0.0.1 (`sandbox_testkit::net::Answerer`): each name has a
/// sequence of IPv4 answers, the n-th A query gets the n-th (the last one repeats).
struct Answerer {
    addr: SocketAddr,
    inner: sandbox_testkit::net::Answerer,
}

impl Answerer {
    async fn start(zone: &[(&str, &[Ipv4Addr])]) -> Answerer {
        let inner = sandbox_testkit::net::Answerer::start_sequences(zone);
        Answerer {
            addr: inner.socket_addr(),
            inner,
        }
    }

    fn asked(&self) -> Vec<String> {
        self.inner.asked()
    }

    /// Asks for `name`'s A record as a client inside would before connecting.
    async fn query_a(&self, name: &str) -> Vec<IpAddr> {
        Resolver::Server(self.addr).lookup(name).await.unwrap()
    }
}

/// A TCP server on 127.0.0.1 that answers each connection with `reply(bytes received)`
/// once the client has half-closed, and counts the connections it accepted.
struct Server {
    port: u16,
    accepted: Arc<Mutex<usize>>,
    listener_probe: Arc<TcpListener>,
}

impl Server {
    async fn start(reply: fn(Vec<u8>) -> Vec<u8>) -> Server {
        let listener = Arc::new(TcpListener::bind((LOOPBACK, 0)).await.unwrap());
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(Mutex::new(0));
        let count = Arc::clone(&accepted);
        let l = Arc::clone(&listener);
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = l.accept().await.unwrap();
                *count.lock().unwrap() += 1;
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    stream.read_to_end(&mut got).await.unwrap();
                    stream.write_all(&reply(got)).await.unwrap();
                });
            }
        });
        Server {
            port,
            accepted,
            listener_probe: listener,
        }
    }

    fn accepted(&self) -> usize {
        // Keep the listener alive for as long as the test holds the server.
        let _ = &self.listener_probe;
        *self.accepted.lock().unwrap()
    }
}

/// An HTTP/1.1 server on 127.0.0.1: reads one request (head and a Content-Length body) and
/// answers with a body that shows the request line and headers it saw, then the body size.
/// Reads one HTTP request from `stream`: its head and its Content-Length body. Returns the
/// bytes read, the head's length and the body's.
async fn read_request<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> (Vec<u8>, usize, usize) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    let (head_len, body_len) = loop {
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before a full request");
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        if let httparse::Status::Complete(len) = req.parse(&buf).unwrap() {
            let body_len = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .map_or(0, |h| {
                    std::str::from_utf8(h.value).unwrap().parse().unwrap()
                });
            break (len, body_len);
        }
    };
    while buf.len() < head_len + body_len {
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed inside the body");
        buf.extend_from_slice(&chunk[..n]);
    }
    (buf, head_len, body_len)
}

async fn http_server() -> (u16, Arc<Mutex<usize>>) {
    let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(Mutex::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            *count.lock().unwrap() += 1;
            tokio::spawn(async move {
                let (buf, head_len, body_len) = read_request(&mut stream).await;
                let head = String::from_utf8_lossy(&buf[..head_len]).into_owned();
                // A large answer, so bytes flow both ways in volume.
                let body = format!("{head}body: {body_len} bytes\n{}", "x".repeat(200_000));
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(answer.as_bytes()).await.unwrap();
            });
        }
    });
    (port, accepted)
}

async fn start_proxy(allow: &[&str], resolver: Resolver) -> (Proxy, SocketAddr) {
    let proxy = Proxy::new(AllowList::parse(allow).unwrap(), resolver);
    let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = proxy.clone();
    tokio::spawn(async move { serving.serve(listener).await });
    (proxy, addr)
}

/// Sends `CONNECT target` and returns the stream and the proxy's answer head (and, for a
/// refusal, its body).
async fn connect(proxy: SocketAddr, target: &str) -> (TcpStream, String) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            s.read(&mut byte).await.unwrap(),
            1,
            "proxy closed: {head:?}"
        );
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    if head.starts_with("HTTP/1.1 200") {
        (s, head)
    } else {
        let mut body = String::new();
        s.read_to_string(&mut body).await.unwrap();
        (s, format!("{head}{body}"))
    }
}

/// One request through the proxy as HTTP_PROXY sends it; the whole answer.
async fn http_via(proxy: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).await.unwrap();
    String::from_utf8(answer).unwrap()
}

fn reverse(mut got: Vec<u8>) -> Vec<u8> {
    got.reverse();
    got
}

fn one(log: &[Connection]) -> &Connection {
    assert_eq!(log.len(), 1, "{log:#?}");
    &log[0]
}

#[tokio::test]
async fn an_allowed_name_tunnels_bytes_both_ways_and_is_logged() {
    let dns = Answerer::start(&[("a.test", &[Ipv4Addr::LOCALHOST])]).await;
    let server = Server::start(reverse).await;
    // The test's servers are on loopback, so the address is allowed too.
    let (proxy, addr) = start_proxy(&["a.test", "127.0.0.1"], Resolver::Server(dns.addr)).await;

    let (mut tunnel, head) = connect(addr, &format!("a.test:{}", server.port)).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let sent: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    tunnel.write_all(&sent).await.unwrap();
    tunnel.shutdown().await.unwrap();
    let mut got = Vec::new();
    tunnel.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, reverse(sent.clone()));

    let log = proxy.wait_for_log(1).await;
    let c = one(&log);
    assert_eq!(
        (c.host.as_str(), c.port, c.kind, c.allowed, c.rule.as_str()),
        ("a.test", server.port, Kind::Connect, true, "a.test")
    );
    assert_eq!(c.address, Some(LOOPBACK));
    assert_eq!((c.bytes_up, c.bytes_down), (300_000, 300_000));
    assert_eq!(c.error, None);
    // The log is serde data, as `--report-json` will carry it.
    let json = serde_json::to_value(&log).unwrap();
    assert_eq!(json[0]["bytesUp"], 300_000);
    assert_eq!(json[0]["kind"], "connect");
    let back: Vec<Connection> = serde_json::from_value(json).unwrap();
    assert_eq!(back, log);
    assert_eq!(
        dns.asked(),
        ["a.test", "a.test"],
        "one A and one AAAA query"
    );
}

#[tokio::test]
async fn plain_http_is_forwarded_in_origin_form_without_proxy_headers() {
    let dns = Answerer::start(&[("a.test", &[Ipv4Addr::LOCALHOST])]).await;
    let (port, _) = http_server().await;
    let (proxy, addr) = start_proxy(&["a.test", "127.0.0.1"], Resolver::Server(dns.addr)).await;

    let body = "y".repeat(100_000);
    let request = format!(
        "POST http://a.test:{port}/upload?x=1 HTTP/1.1\r\nHost: b.test\r\n\
         Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic Zm9vOmJhcg==\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let answer = http_via(addr, &request).await;
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{}", &answer[..200]);
    assert!(
        answer.contains("POST /upload?x=1 HTTP/1.1\r\n"),
        "{}",
        &answer[..400]
    );
    assert!(answer.contains("body: 100000 bytes"));
    assert!(answer.contains("Connection: close\r\n"));
    // The server is asked for the checked host, not the `Host` the program sent.
    assert!(
        answer.contains(&format!("Host: a.test:{port}\r\n")),
        "{}",
        &answer[..400]
    );
    assert!(!answer.contains("b.test"), "{}", &answer[..400]);
    let lower = answer.to_ascii_lowercase();
    assert!(!lower.contains("proxy-connection"), "{}", &answer[..400]);
    assert!(!lower.contains("proxy-authorization"), "{}", &answer[..400]);

    let log = proxy.wait_for_log(1).await;
    let c = one(&log);
    assert_eq!((c.kind, c.allowed, c.port), (Kind::Http, true, port));
    assert!(c.bytes_up > 100_000, "{c:?}");
    assert_eq!(c.bytes_down, answer.len() as u64);
}

#[tokio::test]
async fn a_name_not_on_the_list_is_refused_with_a_body_and_never_resolved() {
    let dns = Answerer::start(&[
        ("a.test", &[Ipv4Addr::LOCALHOST]),
        ("b.test", &[Ipv4Addr::LOCALHOST]),
    ])
    .await;
    let server = Server::start(reverse).await;
    let (proxy, addr) = start_proxy(&["a.test", "127.0.0.1"], Resolver::Server(dns.addr)).await;

    let (_, answer) = connect(addr, &format!("b.test:{}", server.port)).await;
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden"), "{answer}");
    assert!(answer.contains("X-Sandbox-Refused: not-listed"), "{answer}");
    assert!(
        answer.contains("b.test is not on this run's network allow-list"),
        "{answer}"
    );
    assert!(answer.contains("--allow-domain b.test"), "{answer}");
    let answer = http_via(
        addr,
        &format!(
            "GET http://b.test:{}/ HTTP/1.1\r\nHost: b.test\r\n\r\n",
            server.port
        ),
    )
    .await;
    assert!(answer.contains("--allow-domain b.test"), "{answer}");

    let log = proxy.wait_for_log(2).await;
    for c in &log {
        assert_eq!(
            (c.host.as_str(), c.allowed, c.rule.as_str()),
            ("b.test", false, "not-listed")
        );
    }
    // Checked before resolving: the name never reached the DNS server, nor the server.
    assert_eq!(dns.asked(), Vec::<String>::new());
    assert_eq!(server.accepted(), 0);

    // Control: the same tunnel to a listed name reaches the server.
    let (mut tunnel, head) = connect(addr, &format!("a.test:{}", server.port)).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    tunnel.write_all(b"ab").await.unwrap();
    tunnel.shutdown().await.unwrap();
    let mut got = Vec::new();
    tunnel.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"ba");
}

#[tokio::test]
async fn a_name_that_rebinds_from_public_to_loopback_is_refused() {
    // The attacker's DNS answers a public address first (what a client's own check sees),
    // then 127.0.0.1, where a service of the host listens.
    let public = Ipv4Addr::new(93, 184, 216, 34);
    let dns = Answerer::start(&[("rebind.test", &[public, Ipv4Addr::LOCALHOST])]).await;
    let victim = Server::start(reverse).await;
    let (proxy, addr) = start_proxy(&["rebind.test"], Resolver::Server(dns.addr)).await;

    assert_eq!(dns.query_a("rebind.test").await, [IpAddr::V4(public)]);
    let (_, answer) = connect(addr, &format!("rebind.test:{}", victim.port)).await;
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden"), "{answer}");
    assert!(
        answer.contains("X-Sandbox-Refused: non-public-answer"),
        "{answer}"
    );
    assert!(
        answer.contains("rebind.test resolved to 127.0.0.1"),
        "{answer}"
    );
    assert!(answer.contains("--allow-domain 127.0.0.1"), "{answer}");
    // The proxy answered after deciding, so a connection it had made would be accepted
    // by now.
    assert_eq!(victim.accepted(), 0);
    let log = proxy.wait_for_log(1).await;
    assert_eq!(one(&log).rule, "non-public-answer");

    // Control: with the address allowed, the same second answer reaches the service.
    let (_, addr) = start_proxy(&["rebind.test", "127.0.0.1"], Resolver::Server(dns.addr)).await;
    let (mut tunnel, head) = connect(addr, &format!("rebind.test:{}", victim.port)).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    tunnel.shutdown().await.unwrap();
    let mut got = Vec::new();
    tunnel.read_to_end(&mut got).await.unwrap();
    assert_eq!(victim.accepted(), 1);
}

#[tokio::test]
async fn ip_literals_are_refused_unless_the_address_is_listed() {
    let dns = Answerer::start(&[]).await;
    let server = Server::start(reverse).await;
    let (proxy, addr) = start_proxy(&["a.test"], Resolver::Server(dns.addr)).await;

    let (_, answer) = connect(addr, &format!("127.0.0.1:{}", server.port)).await;
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden"), "{answer}");
    assert!(answer.contains("X-Sandbox-Refused: ip-literal"), "{answer}");
    assert!(answer.contains("--allow-domain 127.0.0.1"), "{answer}");
    let answer = http_via(
        addr,
        &format!("GET http://127.0.0.1:{}/ HTTP/1.1\r\n\r\n", server.port),
    )
    .await;
    assert!(answer.contains("X-Sandbox-Refused: ip-literal"), "{answer}");
    let (_, answer) = connect(addr, &format!("[::1]:{}", server.port)).await;
    assert!(answer.contains("X-Sandbox-Refused: ip-literal"), "{answer}");
    let log = proxy.wait_for_log(3).await;
    assert!(
        log.iter().all(|c| !c.allowed && c.rule == "ip-literal"),
        "{log:#?}"
    );
    assert_eq!(server.accepted(), 0);

    // Control: listed, the literal is connected to as it is.
    let (proxy, addr) = start_proxy(&["127.0.0.1"], Resolver::Server(dns.addr)).await;
    let (mut tunnel, head) = connect(addr, &format!("127.0.0.1:{}", server.port)).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    tunnel.write_all(b"xyz").await.unwrap();
    tunnel.shutdown().await.unwrap();
    let mut got = Vec::new();
    tunnel.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"zyx");
    let log = proxy.wait_for_log(1).await;
    assert_eq!(one(&log).rule, "127.0.0.1");
    assert_eq!(
        dns.asked(),
        Vec::<String>::new(),
        "a literal is never resolved"
    );
}

#[tokio::test]
async fn the_system_resolver_resolves_localhost() {
    let server = Server::start(reverse).await;
    let (proxy, addr) = start_proxy(&["localhost", "127.0.0.1", "::1"], Resolver::System).await;
    let (mut tunnel, head) = connect(addr, &format!("localhost:{}", server.port)).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    tunnel.write_all(b"12").await.unwrap();
    tunnel.shutdown().await.unwrap();
    let mut got = Vec::new();
    tunnel.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"21");
    let log = proxy.wait_for_log(1).await;
    assert_eq!(one(&log).address, Some(LOOPBACK));
}

#[tokio::test]
async fn malformed_requests_get_a_readable_400() {
    let (proxy, addr) = start_proxy(&["a.test"], Resolver::System).await;
    let answer = http_via(addr, "GET /relative HTTP/1.1\r\nHost: a.test\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 400 Bad Request"), "{answer}");
    assert!(answer.contains("HTTP_PROXY"), "{answer}");
    let answer = http_via(addr, "CONNECT a.test HTTP/1.1\r\n\r\n").await;
    assert!(answer.contains("CONNECT needs host:port"), "{answer}");
    let log = proxy.wait_for_log(2).await;
    assert!(log.iter().all(|c| c.rule == "bad-request"), "{log:#?}");
}

// ---- Credentials (`--credential`): a loopback TLS server with a test CA stands for the API.

mod credentials {
    use super::*;

    use std::path::PathBuf;

    use sandbox_net::{Credentials, Definition, Secret};
    use tokio_rustls::TlsAcceptor;

    const SECRET: &str = "sk-real-secret-4f9c2e";
    const OTHER_SECRET: &str = "sk-other-secret-77aa01";

    /// The test CA (`sandbox_testkit::net::TestCa`: its PEM in a file of its own, what
    /// `Credentials::with_extra_roots` takes), and an acceptor with its certificate.
    struct TestCa {
        pem_file: PathBuf,
        acceptor: TlsAcceptor,
        /// Holds `pem_file`; removed with the CA.
        _dir: tempfile::TempDir,
    }

    impl TestCa {
        fn new(names: &[&str]) -> TestCa {
            let dir = tempfile::Builder::new()
                .prefix("sandbox-net-ca-")
                .tempdir()
                .unwrap();
            let ca = sandbox_testkit::net::TestCa::new(dir.path(), names);
            TestCa {
                pem_file: ca.pem_file.clone(),
                acceptor: TlsAcceptor::from(ca.server_config()),
                _dir: dir,
            }
        }
    }

    /// An HTTPS server on 127.0.0.1: reads one request (head and Content-Length body) and
    /// answers with a body that is the head it saw, then the body. Keeps every request.
    async fn https_server(ca: &TestCa) -> (u16, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let acceptor = ca.acceptor.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let acceptor = acceptor.clone();
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    // A client that does not trust the CA aborts the handshake.
                    let Ok(mut stream) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let (buf, _, _) = read_request(&mut stream).await;
                    let request = String::from_utf8_lossy(&buf).into_owned();
                    log.lock().unwrap().push(request.clone());
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{request}",
                        request.len()
                    );
                    stream.write_all(answer.as_bytes()).await.unwrap();
                    stream.shutdown().await.unwrap();
                });
            }
        });
        (port, seen)
    }

    fn definition(name: &str, host: &str, port: u16) -> Definition {
        Definition {
            name: name.into(),
            about: "a test API".into(),
            host: host.into(),
            port,
            tls: true,
            header: "x-api-key".into(),
            value: "{secret}".into(),
            sources: vec![],
            env: vec![
                (
                    format!("{}_BASE_URL", name.to_uppercase()),
                    format!("http://{{proxy}}/cred/{name}"),
                ),
                (
                    format!("{}_API_KEY", name.to_uppercase()),
                    "{placeholder}".into(),
                ),
            ],
            placeholder_prefix: "sk-placeholder-".into(),
            routes: vec![],
        }
    }

    fn placeholder(creds: &Credentials, name: &str) -> String {
        let var = format!("{}_API_KEY", name.to_uppercase());
        creds
            .env_templates()
            .into_iter()
            .find(|(k, _)| *k == var)
            .unwrap()
            .1
    }

    struct Setup {
        proxy: Proxy,
        addr: SocketAddr,
        creds: Credentials,
        api: Arc<Mutex<Vec<String>>>,
        other_api: Arc<Mutex<Vec<String>>>,
        _dns: Answerer,
    }

    /// Two credentials: `testapi` at `api.a.test` and `other` at `other.a.test`, both
    /// served by loopback HTTPS servers with certificates of one test CA the proxy trusts.
    async fn setup(trust_the_ca: bool) -> Setup {
        let dns = Answerer::start(&[
            ("api.a.test", &[Ipv4Addr::LOCALHOST]),
            ("other.a.test", &[Ipv4Addr::LOCALHOST]),
            ("b.test", &[Ipv4Addr::LOCALHOST]),
        ])
        .await;
        let ca = TestCa::new(&["api.a.test", "other.a.test"]);
        let (port, api) = https_server(&ca).await;
        let (other_port, other_api) = https_server(&ca).await;
        let mut creds = Credentials::default()
            .with_secret(
                definition("testapi", "api.a.test", port),
                Secret::new(SECRET),
            )
            .with_secret(
                definition("other", "other.a.test", other_port),
                Secret::new(OTHER_SECRET),
            );
        if trust_the_ca {
            creds = creds.with_extra_roots(&ca.pem_file).unwrap();
        }
        // The servers are on loopback, so the address is allowed (as for the other tests);
        // b.test is a second, listed host the program may reach over plain HTTP.
        let proxy = Proxy::new(
            AllowList::parse(["127.0.0.1", "b.test"]).unwrap(),
            Resolver::Server(dns.addr),
        )
        .with_credentials(creds.clone());
        let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let serving = proxy.clone();
        tokio::spawn(async move { serving.serve(listener).await });
        Setup {
            proxy,
            addr,
            creds,
            api,
            other_api,
            _dns: dns,
        }
    }

    #[tokio::test]
    async fn the_real_host_gets_the_real_key_and_the_program_only_the_placeholder() {
        let s = setup(true).await;
        let env = s.creds.env_for(&s.addr.to_string());
        assert!(env.contains(&(
            "TESTAPI_BASE_URL".into(),
            format!("http://{}/cred/testapi", s.addr)
        )));
        let key = placeholder(&s.creds, "testapi");
        assert!(!format!("{env:?}").contains(SECRET));

        // As an SDK sends it: the base URL's path, the placeholder in the key header.
        let request = format!(
            "POST /cred/testapi/v1/messages?beta=true HTTP/1.1\r\nHost: {}\r\n\
             x-api-key: {key}\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\nhello",
            s.addr
        );
        let answer = http_via(s.addr, &request).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        let seen = s.api.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{seen:?}");
        let got = &seen[0];
        assert!(
            got.starts_with("POST /v1/messages?beta=true HTTP/1.1\r\n"),
            "{got}"
        );
        assert!(got.contains(&format!("x-api-key: {SECRET}\r\n")), "{got}");
        assert!(!got.contains(&key), "the placeholder went on: {got}");
        assert!(got.contains("Host: api.a.test:"), "{got}");
        assert!(got.ends_with("\r\n\r\nhello"), "{got}");
        // The program sees the answer, never the key it was sent with... except that this
        // test server echoes the request: the echo is the server's, not the proxy's doing.
        let log = s.proxy.wait_for_log(1).await;
        let c = one(&log);
        assert_eq!(
            (c.host.as_str(), c.kind, c.allowed, c.rule.as_str()),
            ("api.a.test", Kind::Credential, true, "credential:testapi")
        );
        assert_eq!(c.address, Some(LOOPBACK));
        assert!(c.bytes_up > 0 && c.bytes_down > 0, "{c:?}");
        let json = serde_json::to_string(&log).unwrap();
        assert!(!json.contains(SECRET), "{json}");
        assert!(json.contains("\"kind\":\"credential\""), "{json}");
    }

    #[tokio::test]
    async fn another_host_sees_neither_the_placeholder_nor_the_key() {
        let s = setup(true).await;
        let (port, accepted) = http_server().await;
        let key = placeholder(&s.creds, "testapi");

        // The attacker's aim: learn where the key is accepted, or have the proxy add it on
        // the way to a host of its choosing.
        for header in ["x-api-key", "Authorization"] {
            let answer = http_via(
                s.addr,
                &format!(
                    "GET http://b.test:{port}/steal HTTP/1.1\r\nHost: b.test\r\n\
                     {header}: Bearer {key}\r\n\r\n"
                ),
            )
            .await;
            assert!(answer.starts_with("HTTP/1.1 403 Forbidden"), "{answer}");
            assert!(
                answer.contains("X-Sandbox-Refused: credential-placeholder"),
                "{answer}"
            );
            assert!(answer.contains("rule credential-placeholder"), "{answer}");
            assert!(answer.contains("credential testapi"), "{answer}");
            assert!(!answer.contains(SECRET), "{answer}");
        }
        // In the URL too.
        let answer = http_via(
            s.addr,
            &format!("GET http://b.test:{port}/?key={key} HTTP/1.1\r\nHost: b.test\r\n\r\n"),
        )
        .await;
        assert!(
            answer.contains("X-Sandbox-Refused: credential-placeholder"),
            "{answer}"
        );
        assert_eq!(*accepted.lock().unwrap(), 0, "b.test was reached");

        // On another credential's path: refused before anything reaches that host.
        let answer = http_via(
            s.addr,
            &format!(
                "GET /cred/other/x HTTP/1.1\r\nHost: {}\r\nx-api-key: {key}\r\n\r\n",
                s.addr
            ),
        )
        .await;
        assert!(
            answer.contains("X-Sandbox-Refused: credential-placeholder"),
            "{answer}"
        );
        assert!(answer.contains("credential testapi"), "{answer}");
        assert!(s.other_api.lock().unwrap().is_empty());

        // Control: without the placeholder, b.test is reached, and sees no key at all.
        let answer = http_via(
            s.addr,
            &format!("GET http://b.test:{port}/ HTTP/1.1\r\nHost: b.test\r\n\r\n"),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{}", &answer[..200]);
        assert!(!answer.contains(SECRET) && !answer.contains(&key));
        assert_eq!(*accepted.lock().unwrap(), 1);

        let log = s.proxy.wait_for_log(5).await;
        let refusals: Vec<_> = log.iter().filter(|c| !c.allowed).collect();
        assert_eq!(refusals.len(), 4, "{log:#?}");
        assert!(refusals.iter().all(|c| c.rule == "credential-placeholder"));
        assert!(!serde_json::to_string(&log).unwrap().contains(SECRET));
    }

    #[tokio::test]
    async fn an_unknown_credential_is_a_404_naming_the_rule() {
        let s = setup(true).await;
        let answer = http_via(
            s.addr,
            &format!("GET /cred/nope/v1 HTTP/1.1\r\nHost: {}\r\n\r\n", s.addr),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 404 Not Found"), "{answer}");
        assert!(
            answer.contains("X-Sandbox-Refused: unknown-credential"),
            "{answer}"
        );
        assert!(answer.contains("--credential nope"), "{answer}");
        assert!(answer.contains("testapi, other"), "{answer}");
    }

    /// The part of an echoed request after its head: the body the server received.
    fn echoed_body(answer: &str) -> &str {
        let (_, echoed) = answer.split_once("\r\n\r\n").unwrap();
        echoed.split_once("\r\n\r\n").unwrap().1
    }

    #[tokio::test]
    async fn the_body_is_never_rewritten_so_an_echo_hands_back_only_the_placeholder() {
        let s = setup(true).await;
        let key = placeholder(&s.creds, "testapi");
        // A prompt that quotes the placeholder (an agent's environment dump), to an endpoint
        // that echoes what it got: were the body rewritten, the echo would carry the key.
        let body = format!("{{\"prompt\":\"my key is {key}\"}}");
        let request = format!(
            "POST /cred/testapi/v1/echo HTTP/1.1\r\nHost: {}\r\nx-api-key: {key}\r\n\
             x-note: {key}\r\nContent-Length: {}\r\n\r\n{body}",
            s.addr,
            body.len()
        );
        let answer = http_via(s.addr, &request).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        let echoed = echoed_body(&answer);
        assert_eq!(echoed, body, "{answer}");
        assert!(!echoed.contains(SECRET), "{answer}");
        let seen = s.api.lock().unwrap().clone();
        let got = &seen[0];
        // Only the credential's header carries the key; another header keeps the
        // placeholder as sent.
        assert!(got.contains(&format!("x-api-key: {SECRET}\r\n")), "{got}");
        assert!(got.contains(&format!("x-note: {key}\r\n")), "{got}");
        assert_eq!(got.matches(SECRET).count(), 1, "{got}");
    }

    #[tokio::test]
    async fn http_basic_credentials_get_the_key_inside_their_base64() {
        use base64::engine::general_purpose::STANDARD;
        use base64::Engine as _;
        let s = setup(true).await;
        let key = placeholder(&s.creds, "testapi");
        // As git sends a token over HTTPS: `Authorization: Basic base64(user:token)`.
        let basic = STANDARD.encode(format!("x-access-token:{key}"));
        let answer = http_via(
            s.addr,
            &format!(
                "GET /cred/testapi/o/r.git/info/refs?service=git-upload-pack HTTP/1.1\r\n\
                 Host: {}\r\nx-api-key: Basic {basic}\r\n\r\n",
                s.addr
            ),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        let seen = s.api.lock().unwrap().clone();
        let want = STANDARD.encode(format!("x-access-token:{SECRET}"));
        assert!(
            seen[0].contains(&format!("x-api-key: Basic {want}\r\n")),
            "{seen:?}"
        );
        assert!(!seen[0].contains(&basic), "{seen:?}");

        // The same credentials toward another host: the placeholder is found inside the
        // base64 and refused; the host sees nothing.
        let (port, accepted) = http_server().await;
        let answer = http_via(
            s.addr,
            &format!(
                "GET http://b.test:{port}/ HTTP/1.1\r\nHost: b.test\r\n\
                 Authorization: Basic {basic}\r\n\r\n"
            ),
        )
        .await;
        assert!(
            answer.contains("X-Sandbox-Refused: credential-placeholder"),
            "{answer}"
        );
        assert_eq!(*accepted.lock().unwrap(), 0);
    }

    /// An HTTPS server that takes only HTTP Basic credentials, as a git host does: `401`
    /// with `WWW-Authenticate: Basic` to a request without them (or with a bearer token),
    /// then `403` (the test needs only what git sent). Keeps every `Authorization` it saw.
    async fn basic_auth_server(ca: &TestCa) -> (u16, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let acceptor = ca.acceptor.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let (acceptor, log) = (acceptor.clone(), Arc::clone(&log));
                tokio::spawn(async move {
                    let Ok(mut stream) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let (buf, _, _) = read_request(&mut stream).await;
                    let head = String::from_utf8_lossy(&buf).into_owned();
                    let auth = head
                        .lines()
                        .find_map(|l| l.strip_prefix("Authorization: "))
                        .or_else(|| head.lines().find_map(|l| l.strip_prefix("authorization: ")));
                    if let Some(auth) = auth {
                        log.lock().unwrap().push(auth.to_owned());
                    }
                    let answer = match auth.filter(|a| a.starts_with("Basic ")) {
                        None => "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic \
                                 realm=\"git\"\r\nContent-Length: 0\r\n\r\n"
                            .to_string(),
                        Some(_) => {
                            "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n".to_string()
                        }
                    };
                    let _ = stream.write_all(answer.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        (port, seen)
    }

    #[tokio::test]
    async fn git_over_http_sends_basic_credentials_that_reach_the_host_with_the_key() {
        use base64::engine::general_purpose::STANDARD;
        use base64::Engine as _;
        if std::process::Command::new("git")
            .arg("--version")
            .output()
            .is_err()
        {
            sandbox_testkit::skip("git", "no git on this machine");
            return;
        }
        let dns = Answerer::start(&[("git.a.test", &[Ipv4Addr::LOCALHOST])]).await;
        let ca = TestCa::new(&["git.a.test"]);
        let (port, seen) = basic_auth_server(&ca).await;
        let mut def = definition("githost", "git.a.test", port);
        def.header = "authorization".into();
        def.value = "Bearer {secret}".into();
        let creds = Credentials::default()
            .with_secret(def, Secret::new(SECRET))
            .with_extra_roots(&ca.pem_file)
            .unwrap();
        let key = placeholder(&creds, "githost");
        let proxy = Proxy::new(
            AllowList::parse(["127.0.0.1"]).unwrap(),
            Resolver::Server(dns.addr),
        )
        .with_credentials(creds);
        let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { proxy.serve(listener).await });
        // Real git, with the token in the URL as a credential helper would hand it over: git
        // asks without credentials, gets 401, and sends them as HTTP Basic.
        let home = tempfile::tempdir().unwrap();
        let url = format!("http://x-access-token:{key}@{addr}/cred/githost/o/r.git");
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new("git")
                .args(["ls-remote", &url])
                .env("HOME", home.path())
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .env("GIT_TERMINAL_PROMPT", "0")
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        assert!(!out.status.success(), "the stand-in refuses after the auth");
        let seen = seen.lock().unwrap().clone();
        let want = format!(
            "Basic {}",
            STANDARD.encode(format!("x-access-token:{SECRET}"))
        );
        // The proxy's bearer value on git's first request, then git's own Basic credentials
        // with the key inside: the placeholder never reached the host.
        assert_eq!(
            seen.last(),
            Some(&want),
            "{seen:?}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let plain_key = STANDARD.encode(format!("x-access-token:{key}"));
        assert!(
            seen.iter()
                .all(|a| !a.contains(&key) && !a.contains(&plain_key)),
            "{seen:?}"
        );
        assert!(!String::from_utf8_lossy(&out.stderr).contains(SECRET));
    }

    #[tokio::test]
    async fn a_plain_http_gateway_on_loopback_gets_the_key_without_tls() {
        let (port, accepted) = http_server().await;
        let mut def = definition("gateway", "127.0.0.1", port);
        def.tls = false;
        let creds = Credentials::default().with_secret(def, Secret::new(SECRET));
        let key = placeholder(&creds, "gateway");
        // No allow-list entry for loopback: the address was named on the host's side.
        let proxy = Proxy::new(AllowList::parse::<_, &str>([]).unwrap(), Resolver::System)
            .with_credentials(creds);
        let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let serving = proxy.clone();
        tokio::spawn(async move { serving.serve(listener).await });
        let answer = http_via(
            addr,
            &format!(
                "GET /cred/gateway/v1/models HTTP/1.1\r\nHost: {addr}\r\nx-api-key: {key}\r\n\r\n"
            ),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{}", &answer[..300]);
        assert!(
            answer.contains("GET /v1/models HTTP/1.1\r\n"),
            "{}",
            &answer[..300]
        );
        assert!(answer.contains(&format!("x-api-key: {SECRET}\r\n")));
        assert!(answer.contains(&format!("Host: 127.0.0.1:{port}\r\n")));
        assert_eq!(*accepted.lock().unwrap(), 1);
        let log = proxy.wait_for_log(1).await;
        assert_eq!(one(&log).rule, "credential:gateway");
    }

    #[tokio::test]
    async fn an_upstream_that_fails_is_told_once_with_what_to_do() {
        // A plain-HTTP server where the definition expects TLS (a local gateway named
        // without `=http://`): it answers the TLS hello with a 400, as HTTP servers do.
        // Every request fails; the user is told once.
        let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut hello = [0u8; 512];
                    let _ = stream.read(&mut hello).await;
                    let _ = stream
                        .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                        .await;
                });
            }
        });
        let told = Arc::new(Mutex::new(Vec::<String>::new()));
        let sink = Arc::clone(&told);
        let creds = Credentials::default()
            .with_secret(
                definition("gateway", "127.0.0.1", port),
                Secret::new(SECRET),
            )
            .report_to(move |m| sink.lock().unwrap().push(m.to_owned()));
        let key = placeholder(&creds, "gateway");
        // Two proxies of one run (two commands) share the credentials.
        let mut addrs = Vec::new();
        for _ in 0..2 {
            let proxy = Proxy::new(AllowList::parse::<_, &str>([]).unwrap(), Resolver::System)
                .with_credentials(creds.clone());
            let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
            addrs.push(listener.local_addr().unwrap());
            tokio::spawn(async move { proxy.serve(listener).await });
        }
        for addr in [addrs[0], addrs[1], addrs[0]] {
            let answer = http_via(
                addr,
                &format!(
                    "GET /cred/gateway/v1 HTTP/1.1\r\nHost: {addr}\r\nx-api-key: {key}\r\n\r\n"
                ),
            )
            .await;
            assert!(answer.starts_with("HTTP/1.1 502 Bad Gateway"), "{answer}");
            assert!(answer.contains("does not speak TLS"), "{answer}");
        }
        let told = told.lock().unwrap().clone();
        assert_eq!(told.len(), 1, "{told:?}");
        assert!(told[0].contains("--credential gateway"), "{told:?}");
        assert!(
            told[0].contains(&format!("--credential gateway=http://127.0.0.1:{port}")),
            "{told:?}"
        );
        assert!(!told[0].contains(SECRET));
    }

    #[tokio::test]
    async fn the_real_host_is_verified_so_an_untrusted_certificate_gets_no_key() {
        // The same servers, but the proxy trusts only the web PKI: the test CA's
        // certificate is refused, and the key is never sent.
        let s = setup(false).await;
        let key = placeholder(&s.creds, "testapi");
        let answer = http_via(
            s.addr,
            &format!(
                "GET /cred/testapi/ HTTP/1.1\r\nHost: {}\r\nx-api-key: {key}\r\n\r\n",
                s.addr
            ),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 502 Bad Gateway"), "{answer}");
        assert!(answer.contains("TLS handshake failed"), "{answer}");
        assert!(s.api.lock().unwrap().is_empty());
        let log = s.proxy.wait_for_log(1).await;
        assert!(one(&log).error.as_deref().unwrap().contains("TLS"));
    }
}

// ---- SOCKS5 (`ALL_PROXY=socks5h://`): the same rules and log as CONNECT.

/// A SOCKS5 client: no-auth greeting, then `CONNECT` to a domain name (ATYP 3) or an IPv4
/// address (ATYP 1). Returns the stream and the reply code.
async fn socks_connect(proxy: SocketAddr, host: &str, port: u16) -> (TcpStream, u8) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(&[5, 1, 0]).await.unwrap();
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).await.unwrap();
    assert_eq!(choice, [5, 0]);
    let mut request = vec![5, 1, 0];
    match host.parse::<Ipv4Addr>() {
        Ok(ip) => {
            request.push(1);
            request.extend_from_slice(&ip.octets());
        }
        Err(_) => {
            request.push(3);
            request.push(host.len() as u8);
            request.extend_from_slice(host.as_bytes());
        }
    }
    request.extend_from_slice(&port.to_be_bytes());
    s.write_all(&request).await.unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).await.unwrap();
    assert_eq!(reply[0], 5);
    (s, reply[1])
}

#[tokio::test]
async fn socks5_connects_to_listed_names_and_refuses_the_rest_by_the_same_rules() {
    let dns = Answerer::start(&[
        ("a.test", &[Ipv4Addr::LOCALHOST]),
        ("b.test", &[Ipv4Addr::LOCALHOST]),
    ])
    .await;
    let server = Server::start(reverse).await;
    let (proxy, addr) = start_proxy(&["a.test", "127.0.0.1"], Resolver::Server(dns.addr)).await;

    let (mut tunnel, code) = socks_connect(addr, "a.test", server.port).await;
    assert_eq!(code, 0);
    tunnel.write_all(b"socks").await.unwrap();
    tunnel.shutdown().await.unwrap();
    let mut got = Vec::new();
    tunnel.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"skcos");

    // Not listed: "not allowed by ruleset", never resolved, never reached.
    let (_, code) = socks_connect(addr, "b.test", server.port).await;
    assert_eq!(code, 2);
    let log = proxy.wait_for_log(2).await;
    assert_eq!(
        (log[0].kind, log[0].allowed, log[0].rule.as_str()),
        (Kind::Socks, true, "a.test")
    );
    assert_eq!((log[0].bytes_up, log[0].bytes_down), (5, 5));
    assert_eq!(
        (log[1].host.as_str(), log[1].allowed, log[1].rule.as_str()),
        ("b.test", false, "not-listed")
    );
    assert_eq!(dns.asked(), ["a.test", "a.test"]);
    assert_eq!(server.accepted(), 1);

    // An IP literal (what `socks5://`, resolving on the client, sends) is refused unless
    // listed; the control proxy lists it.
    let (_, strict) = start_proxy(&["a.test"], Resolver::Server(dns.addr)).await;
    let (_, code) = socks_connect(strict, "127.0.0.1", server.port).await;
    assert_eq!(code, 2);
    assert_eq!(server.accepted(), 1);
    let (mut tunnel, code) = socks_connect(addr, "127.0.0.1", server.port).await;
    assert_eq!(code, 0);
    tunnel.shutdown().await.unwrap();
    let mut rest = Vec::new();
    tunnel.read_to_end(&mut rest).await.unwrap();
    assert_eq!(server.accepted(), 2);
}
