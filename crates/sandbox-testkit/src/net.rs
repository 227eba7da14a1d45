//! Loopback network fixtures for the network tests: a DNS answerer on 127.0.0.1 (what
//! `SANDBOX_DNS_SERVER` points the proxy at), a test CA with certificates for the tests'
//! names, and an HTTPS server of static files (enough for git's dumb HTTP protocol, a PEP 503
//! index, an npm registry and a cargo sparse registry) that records every request it saw.
//! Threads and blocking sockets: nothing here needs a runtime.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use simple_dns::rdata::{RData, A};
use simple_dns::{Packet, PacketFlag, ResourceRecord, CLASS, QTYPE, RCODE, TYPE};

/// A DNS server on 127.0.0.1 (UDP, a thread): A records from its zone, NXDOMAIN for the
/// rest, no AAAA; it records every name it was asked.
pub struct Answerer {
    pub port: u16,
    asked: Arc<Mutex<Vec<String>>>,
}

impl Answerer {
    /// Each name has one address.
    pub fn start(zone: &[(&str, Ipv4Addr)]) -> Answerer {
        let zone: Vec<(&str, Vec<Ipv4Addr>)> = zone.iter().map(|(n, ip)| (*n, vec![*ip])).collect();
        Self::start_sequences(&zone)
    }

    /// Each name has a sequence of answers: the n-th A query for it gets the n-th (the last
    /// one repeats) — a name that first answers public, then private (DNS rebinding).
    pub fn start_sequences<Z: AsRef<[Ipv4Addr]>>(zone: &[(&str, Z)]) -> Answerer {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        let zone: HashMap<String, Vec<Ipv4Addr>> = zone
            .iter()
            .map(|(n, ips)| ((*n).to_owned(), ips.as_ref().to_vec()))
            .collect();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let log = asked.clone();
        std::thread::spawn(move || {
            let mut a_queries: HashMap<String, usize> = HashMap::new();
            let mut buf = [0u8; 1500];
            while let Ok((n, from)) = socket.recv_from(&mut buf) {
                let Ok(query) = Packet::parse(&buf[..n]) else {
                    continue;
                };
                let mut reply = Packet::new_reply(query.id());
                reply.set_flags(PacketFlag::RECURSION_AVAILABLE);
                for q in &query.questions {
                    let name = q.qname.to_string();
                    log.lock().unwrap().push(name.clone());
                    reply.questions.push(q.clone());
                    let Some(answers) = zone.get(&name).filter(|a| !a.is_empty()) else {
                        *reply.rcode_mut() = RCODE::NameError;
                        continue;
                    };
                    if q.qtype == QTYPE::TYPE(TYPE::A) {
                        let i = a_queries.entry(name).or_default();
                        let ip = answers[(*i).min(answers.len() - 1)];
                        *i += 1;
                        reply.answers.push(ResourceRecord::new(
                            q.qname.clone(),
                            CLASS::IN,
                            60,
                            RData::A(A {
                                address: u32::from(ip),
                            }),
                        ));
                    }
                }
                let bytes = reply.build_bytes_vec().unwrap();
                let _ = socket.send_to(&bytes, from);
            }
        });
        Answerer { port, asked }
    }

    /// Where it listens.
    pub fn socket_addr(&self) -> std::net::SocketAddr {
        (Ipv4Addr::LOCALHOST, self.port).into()
    }

    /// `127.0.0.1:PORT`, for `SANDBOX_DNS_SERVER`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Every name asked so far, in order.
    pub fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

/// A test CA and one server certificate it signed for the given names. The CA's PEM is in
/// a file of its own (`curl --cacert`, `GIT_SSL_CAINFO`, `pip --cert`, npm's `cafile`,
/// `CARGO_HTTP_CAINFO`, the credential proxy's extra roots).
pub struct TestCa {
    pub pem_file: PathBuf,
    config: Arc<rustls::ServerConfig>,
}

impl TestCa {
    /// The server side: the certificate for the names, with its key (for a TLS acceptor of
    /// the test's own, e.g. `tokio_rustls::TlsAcceptor::from`).
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.config.clone()
    }
}

impl TestCa {
    /// The CA's PEM goes to `dir/ca.pem`.
    pub fn new(dir: &Path, names: &[&str]) -> TestCa {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "sandbox test CA");
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(
            names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>(),
        )
        .unwrap();
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            names.first().copied().unwrap_or("test"),
        );
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        std::fs::create_dir_all(dir).unwrap();
        let pem_file = dir.join("ca.pem");
        std::fs::write(&pem_file, ca.pem()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
        TestCa {
            pem_file,
            config: Arc::new(config),
        }
    }
}

/// One request a stand-in server saw (an [`HttpsFiles`], the model API of `model_api`): its
/// request line, headers and body as sent.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    /// The request's body, as text (invalid UTF-8 replaced).
    pub body: String,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// An HTTPS server on `ip` (a thread per connection) that serves the files under `root`: a
/// path names a file, or a directory whose `index.json` or `index.html` is served; anything
/// else is 404. One request per connection (`Connection: close`). Records every request.
pub struct HttpsFiles {
    pub port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl HttpsFiles {
    pub fn start(ip: Ipv4Addr, ca: &TestCa, root: &Path) -> HttpsFiles {
        let listener = TcpListener::bind((ip, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let config = ca.config.clone();
        let root = root.to_path_buf();
        std::thread::spawn(move || {
            for tcp in listener.incoming().flatten() {
                let (config, root, log) = (config.clone(), root.clone(), log.clone());
                std::thread::spawn(move || serve(tcp, config, &root, &log));
            }
        });
        HttpsFiles { port, seen }
    }

    /// Every request so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve(tcp: TcpStream, config: Arc<rustls::ServerConfig>, root: &Path, log: &Mutex<Vec<Seen>>) {
    let Ok(conn) = rustls::ServerConnection::new(config) else {
        return;
    };
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let mut reader = BufReader::new(&mut tls);
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let target = parts.next().unwrap_or_default().to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((n, v)) = h.split_once(':') {
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    let _ = reader.read_exact(&mut body);
    let path = target.split('?').next().unwrap_or("/").to_owned();
    log.lock().unwrap().push(Seen {
        method: method.clone(),
        path: path.clone(),
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    });
    let file = file_for(root, &path);
    let (status, kind, content) = match file.and_then(|f| std::fs::read(&f).ok().map(|c| (f, c))) {
        Some((f, c)) => ("200 OK", content_type(&f), c),
        None => ("404 Not Found", "text/plain", b"not found\n".to_vec()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        content.len()
    );
    let _ = tls.write_all(head.as_bytes());
    if method != "HEAD" {
        let _ = tls.write_all(&content);
    }
    let _ = tls.flush();
    tls.conn.send_close_notify();
    let _ = tls.flush();
}

/// The file a URL path names under `root`, never outside it.
fn file_for(root: &Path, path: &str) -> Option<PathBuf> {
    let mut file = root.to_path_buf();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        let part = percent_decode(part);
        if part == ".." || part == "." || part.contains('/') {
            return None;
        }
        file.push(part);
    }
    if file.is_dir() {
        ["index.json", "index.html"]
            .iter()
            .map(|i| file.join(i))
            .find(|f| f.is_file())
    } else {
        file.is_file().then_some(file)
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            if let Some(Ok(b)) = s.get(i + 1..i + 3).map(|h| u8::from_str_radix(h, 16)) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn content_type(file: &Path) -> &'static str {
    match file.extension().and_then(|e| e.to_str()) {
        Some("json") => "application/json",
        Some("html") => "text/html",
        _ => "application/octet-stream",
    }
}
