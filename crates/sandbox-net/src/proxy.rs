//! The proxy: HTTP `CONNECT` tunnels and plain-HTTP requests in absolute form, one per
//! client connection.
//!
//! For each request: the target's name is checked against the [`AllowList`] first (a refused
//! name is never resolved, so not even a DNS query leaks it); a listed name is resolved by
//! the proxy's own [`Resolver`]; answers that are not public addresses are dropped unless the
//! list names them, and the connection goes to the first remaining address that accepts —
//! the very address that was checked. Refusals are answered `403` with a text body naming
//! the rule and the `--allow-domain` that would allow it, and an `X-Sandbox-Refused: RULE`
//! header. A plain-HTTP request is forwarded in origin form with `Connection: close`, so the
//! server closes after one response and a second request on the same connection cannot
//! reach another host through it.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::allow::{AllowList, Refusal, Target};
use crate::credentials::{Credentials, Loaded};
use crate::error::NetError;
use crate::log::{Connection, Kind};
use crate::resolve::Resolver;

/// The largest request head read (request line and headers).
const MAX_HEAD: usize = 64 * 1024;
/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one connection attempt to a server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The copying relay's buffer per direction (TLS, and TCP off Linux): fewer, larger reads
/// and writes per byte than 64 KiB.
const RELAY_BUFFER: usize = 256 * 1024;

/// The proxy: an allow-list, a resolver and the connection log. Cheap to clone (shared).
#[derive(Clone)]
pub struct Proxy {
    inner: Arc<Inner>,
}

struct Inner {
    allow: AllowList,
    resolver: Resolver,
    /// The run's credentials (`/cred/NAME/...`); empty without `--credential`.
    credentials: Credentials,
    log: Mutex<Vec<Connection>>,
    /// The number of records, for [`Proxy::wait_for_log`].
    logged: watch::Sender<usize>,
}

impl Inner {
    /// The log's lock. Records are pushed in one step with nothing that can panic half-way,
    /// so a lock poisoned by a panic elsewhere still guards a consistent list.
    fn log(&self) -> MutexGuard<'_, Vec<Connection>> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, connection: Connection) {
        tracing::debug!(?connection, "proxy connection");
        let n = {
            let mut log = self.log();
            log.push(connection);
            log.len()
        };
        self.logged.send_replace(n);
    }
}

impl Proxy {
    pub fn new(allow: AllowList, resolver: Resolver) -> Proxy {
        Proxy {
            inner: Arc::new(Inner {
                allow,
                resolver,
                credentials: Credentials::default(),
                log: Mutex::new(Vec::new()),
                logged: watch::Sender::new(0),
            }),
        }
    }

    /// The same proxy, also serving these credentials at `/cred/NAME/...` (call before
    /// [`Proxy::serve`]; a clone made earlier keeps the proxy without them).
    pub fn with_credentials(self, credentials: Credentials) -> Proxy {
        let (allow, resolver, log) = match Arc::try_unwrap(self.inner) {
            Ok(inner) => (
                inner.allow,
                inner.resolver,
                inner
                    .log
                    .into_inner()
                    .unwrap_or_else(PoisonError::into_inner),
            ),
            Err(shared) => (
                shared.allow.clone(),
                shared.resolver.clone(),
                shared.log().clone(),
            ),
        };
        let n = log.len();
        Proxy {
            inner: Arc::new(Inner {
                allow,
                resolver,
                credentials,
                log: Mutex::new(log),
                logged: watch::Sender::new(n),
            }),
        }
    }

    /// Serves every connection `listener` accepts, each in a task of its own, until the
    /// listener fails.
    pub async fn serve(&self, listener: TcpListener) -> Result<(), NetError> {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(accepted) => accepted,
                // The client gave up between SYN and accept: nothing to serve.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionAborted => continue,
                Err(e) => return Err(NetError::Listen(e)),
            };
            let inner = Arc::clone(&self.inner);
            tokio::spawn(async move {
                if let Some(record) = handle(&inner, stream).await {
                    inner.record(record);
                }
            });
        }
    }

    /// Every connection so far, in the order they ended.
    pub fn log(&self) -> Vec<Connection> {
        self.inner.log().clone()
    }

    /// Waits until the log holds at least `n` records, and returns them.
    pub async fn wait_for_log(&self, n: usize) -> Vec<Connection> {
        let mut rx = self.inner.logged.subscribe();
        // The sender lives as long as `self`, so this only ends once the count is reached.
        let _ = rx.wait_for(|count| *count >= n).await;
        self.log()
    }

    /// Serves one connection the caller accepted itself, and records it: for a caller that
    /// must know when every connection of a command is in the log (it awaits these).
    pub async fn serve_connection(&self, stream: TcpStream) {
        if let Some(record) = handle(&self.inner, stream).await {
            self.inner.record(record);
        }
    }
}

/// A parsed request head and what the client sent after it.
struct Head {
    method: String,
    target: String,
    minor_version: u8,
    headers: Vec<(String, Vec<u8>)>,
    rest: Vec<u8>,
}

/// Serves one client connection; `None` if it closed before sending a request.
async fn handle(inner: &Inner, mut client: TcpStream) -> Option<Connection> {
    let _ = client.set_nodelay(true);
    // SOCKS5 (`ALL_PROXY=socks5h://`) starts with its version byte; HTTP with a method name.
    let mut first = [0u8; 1];
    match tokio::time::timeout(HEAD_TIMEOUT, client.peek(&mut first)).await {
        Ok(Ok(1)) if first[0] == SOCKS_VERSION => {
            let request = tokio::time::timeout(HEAD_TIMEOUT, socks_request(&mut client))
                .await
                .ok()
                .flatten()?;
            return Some(socks(inner, client, request).await);
        }
        Ok(Ok(_)) => {}
        _ => return None,
    }
    let head = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client)).await {
        Err(_elapsed) => return None,
        Ok(Ok(None)) => return None,
        Ok(Ok(Some(head))) => head,
        Ok(Err(refusal)) => {
            let record = refused(String::new(), 0, Kind::Http, &refusal);
            let _ = client.write_all(&refusal_response(&refusal)).await;
            return Some(record);
        }
    };
    if let Some(after) = head.target.strip_prefix("/cred/") {
        let after = after.to_owned();
        return Some(credential(inner, client, head, &after).await);
    }
    let kind = if head.method.eq_ignore_ascii_case("CONNECT") {
        Kind::Connect
    } else {
        Kind::Http
    };
    let parsed = match kind {
        Kind::Connect => split_authority(&head.target, None)
            .map(|(host, port)| (host, port, String::new()))
            .ok_or_else(|| Refusal::BadRequest {
                why: format!("CONNECT needs host:port, not {:?}", head.target),
            }),
        Kind::Http | Kind::Credential | Kind::Socks | Kind::Inbound => absolute_http(&head.target),
    };
    let (host, port, path) = match parsed {
        Ok(parsed) => parsed,
        Err(refusal) => {
            let _ = client.write_all(&refusal_response(&refusal)).await;
            return Some(refused(head.target.clone(), 0, kind, &refusal));
        }
    };
    // A credential's placeholder goes only to its own path; anywhere else it is either a
    // mistake or a program trying to learn where the key would be accepted.
    if let Some(cred) = placeholder_in(&head, &inner.credentials, None) {
        let refusal = Refusal::CredentialPlaceholder {
            credential: cred.def.name.clone(),
            credential_host: cred.def.host.clone(),
            sent_to: host.to_ascii_lowercase(),
        };
        let _ = client.write_all(&refusal_response(&refusal)).await;
        return Some(refused(host.to_ascii_lowercase(), port, kind, &refusal));
    }
    let (target, candidates) = match decide(inner, &host).await {
        Ok(decided) => decided,
        Err(refusal) => {
            let _ = client.write_all(&refusal_response(&refusal)).await;
            return Some(refused(host.to_ascii_lowercase(), port, kind, &refusal));
        }
    };
    let mut record = allowed(&target, port, kind);
    let (upstream, address) = match connect(&candidates, port).await {
        Ok(connected) => connected,
        Err(e) => {
            let why = format!(
                "sandbox: {}:{port} is allowed (rule {}) but could not be reached: {e}",
                record.host, record.rule
            );
            let _ = client
                .write_all(&response("502 Bad Gateway", None, &why))
                .await;
            record.error = Some(e.to_string());
            return Some(record);
        }
    };
    record.address = Some(address);
    let _ = upstream.set_nodelay(true);
    let mut upstream = upstream;
    let first = match kind {
        Kind::Connect => {
            if let Err(e) = client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
            {
                record.error = Some(format!("answering the client: {e}"));
                return Some(record);
            }
            head.rest
        }
        Kind::Http | Kind::Credential | Kind::Socks | Kind::Inbound => {
            let mut bytes = origin_form(&head, &host, port, 80, &path, None);
            bytes.extend_from_slice(&head.rest);
            bytes
        }
    };
    if !first.is_empty() {
        if let Err(e) = upstream.write_all(&first).await {
            record.error = Some(format!("writing to the server: {e}"));
            return Some(record);
        }
    }
    #[cfg(target_os = "linux")]
    let (up, down, error) = splice::relay(client, upstream).await;
    #[cfg(not(target_os = "linux"))]
    let (up, down, error) = relay(client, upstream).await;
    record.bytes_up = first.len() as u64 + up;
    record.bytes_down = down;
    record.error = error;
    Some(record)
}

const SOCKS_VERSION: u8 = 5;

/// What a SOCKS5 client asked for: `Ok((host, port))` for a `CONNECT`, or `Err(reply code)`
/// for a request this proxy does not serve.
type SocksRequest = Result<(String, u16), u8>;

/// Reads a SOCKS5 greeting (answering "no authentication") and request; `None` if the client
/// went away or spoke something else. RFC 1928.
async fn socks_request(client: &mut TcpStream) -> Option<SocksRequest> {
    let mut greeting = [0u8; 2];
    client.read_exact(&mut greeting).await.ok()?;
    let mut methods = vec![0u8; usize::from(greeting[1])];
    client.read_exact(&mut methods).await.ok()?;
    if !methods.contains(&0) {
        // No method both sides know: 0xFF, and the client closes.
        let _ = client.write_all(&[SOCKS_VERSION, 0xFF]).await;
        return None;
    }
    client.write_all(&[SOCKS_VERSION, 0]).await.ok()?;
    let mut head = [0u8; 4];
    client.read_exact(&mut head).await.ok()?;
    if head[0] != SOCKS_VERSION {
        return None;
    }
    let host = match head[3] {
        1 => {
            let mut a = [0u8; 4];
            client.read_exact(&mut a).await.ok()?;
            std::net::Ipv4Addr::from(a).to_string()
        }
        3 => {
            let mut len = [0u8; 1];
            client.read_exact(&mut len).await.ok()?;
            let mut name = vec![0u8; usize::from(len[0])];
            client.read_exact(&mut name).await.ok()?;
            // Not text: `check_host` refuses it as an invalid name.
            String::from_utf8_lossy(&name).into_owned()
        }
        4 => {
            let mut a = [0u8; 16];
            client.read_exact(&mut a).await.ok()?;
            std::net::Ipv6Addr::from(a).to_string()
        }
        // Address type not supported.
        _ => return Some(Err(8)),
    };
    let mut port = [0u8; 2];
    client.read_exact(&mut port).await.ok()?;
    if head[1] != 1 {
        // Only CONNECT: no BIND (inbound), no UDP ASSOCIATE. Command not supported.
        return Some(Err(7));
    }
    Some(Ok((host, u16::from_be_bytes(port))))
}

/// A SOCKS5 reply with the unspecified bound address (clients do not use it for CONNECT).
fn socks_reply(code: u8) -> [u8; 10] {
    [SOCKS_VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0]
}

/// A SOCKS5 `CONNECT`: the same rules, decision and log as an HTTP `CONNECT`. SOCKS has no
/// room for a text answer, so a refusal is reply 2 ("not allowed by ruleset"), and the log
/// (and `sandbox why --net`) says which rule.
async fn socks(inner: &Inner, mut client: TcpStream, request: SocksRequest) -> Connection {
    let (host, port) = match request {
        Ok(target) => target,
        Err(code) => {
            let _ = client.write_all(&socks_reply(code)).await;
            let refusal = Refusal::BadRequest {
                why: "SOCKS5: only CONNECT to a name or address is served".into(),
            };
            return refused(String::new(), 0, Kind::Socks, &refusal);
        }
    };
    let (target, candidates) = match decide(inner, &host).await {
        Ok(decided) => decided,
        Err(refusal) => {
            let code = match refusal {
                Refusal::NoAnswer { .. } => 4, // host unreachable
                _ => 2,                        // not allowed by ruleset
            };
            tracing::info!(%host, port, rule = refusal.rule(), "proxy: SOCKS5 refused: {refusal}");
            let _ = client.write_all(&socks_reply(code)).await;
            return refused(host.to_ascii_lowercase(), port, Kind::Socks, &refusal);
        }
    };
    let mut record = allowed(&target, port, Kind::Socks);
    let upstream = match connect(&candidates, port).await {
        Ok((upstream, address)) => {
            record.address = Some(address);
            upstream
        }
        Err(e) => {
            let code = match e.kind() {
                std::io::ErrorKind::ConnectionRefused => 5,
                _ => 4,
            };
            let _ = client.write_all(&socks_reply(code)).await;
            record.error = Some(e.to_string());
            return record;
        }
    };
    let _ = upstream.set_nodelay(true);
    if let Err(e) = client.write_all(&socks_reply(0)).await {
        record.error = Some(format!("answering the client: {e}"));
        return record;
    }
    #[cfg(target_os = "linux")]
    let (up, down, error) = splice::relay(client, upstream).await;
    #[cfg(not(target_os = "linux"))]
    let (up, down, error) = relay(client, upstream).await;
    record.bytes_up = up;
    record.bytes_down = down;
    record.error = error;
    record
}

/// The allow-list's decision and, if allowed, the addresses that may be connected to.
async fn decide(inner: &Inner, host: &str) -> Result<(Target, Vec<IpAddr>), Refusal> {
    let target = inner.allow.check_host(host)?;
    let name = match &target {
        Target::Address { ip, .. } => {
            let ip = *ip;
            return Ok((target, vec![ip]));
        }
        Target::Name { name, .. } => name.clone(),
    };
    let usable = resolve_checked(inner, &name).await?;
    Ok((target, usable))
}

/// A listed (or credential's) name's addresses, without the answers that are not public
/// and not listed.
async fn resolve_checked(inner: &Inner, name: &str) -> Result<Vec<IpAddr>, Refusal> {
    let name = name.to_owned();
    let answers = inner
        .resolver
        .lookup(&name)
        .await
        .map_err(|e| Refusal::NoAnswer {
            host: name.clone(),
            error: e.to_string(),
        })?;
    if answers.is_empty() {
        return Err(Refusal::NoAnswer {
            host: name,
            error: "no address".into(),
        });
    }
    let (usable, refused): (Vec<IpAddr>, Vec<IpAddr>) = answers
        .into_iter()
        .partition(|ip| inner.allow.answer_allowed(*ip));
    if usable.is_empty() {
        return Err(Refusal::NonPublicAnswer {
            host: name,
            addresses: refused,
        });
    }
    if !refused.is_empty() {
        tracing::info!(host = %name, ?refused, "proxy: dropped non-public answers");
    }
    Ok(usable)
}

/// The first credential (other than `except`) whose placeholder the request's target or a
/// header carries.
fn placeholder_in<'c>(
    head: &Head,
    credentials: &'c Credentials,
    except: Option<&str>,
) -> Option<&'c Loaded> {
    if credentials.is_empty() {
        return None;
    }
    credentials
        .placeholder_in(head.target.as_bytes(), except)
        .or_else(|| {
            head.headers.iter().find_map(|(_, value)| {
                credentials.placeholder_in(value, except).or_else(|| {
                    // Inside HTTP Basic credentials too (`curl -u x:$GITHUB_TOKEN`).
                    let decoded = crate::credentials::decode_basic(value)?;
                    credentials.placeholder_in(&decoded, except)
                })
            })
        })
}

/// `/cred/NAME/rest`: the request goes to route NAME's host over TLS (a credential's own,
/// or another of its hosts: `github-git`), in origin form `/rest`, with the route's header
/// set to the real secret (whatever the program sent in it).
async fn credential(inner: &Inner, mut client: TcpStream, head: Head, after: &str) -> Connection {
    let split = after.find(['/', '?']).unwrap_or(after.len());
    let (name, path) = after.split_at(split);
    let path = match path.chars().next() {
        None => "/".to_owned(),
        Some('?') => format!("/{path}"),
        Some(_) => path.to_owned(),
    };
    let Some((cred, route)) = inner.credentials.route(name) else {
        let refusal = Refusal::UnknownCredential {
            name: name.to_owned(),
            known: inner.credentials.route_names(),
        };
        let _ = client.write_all(&refusal_response(&refusal)).await;
        return refused(format!("/cred/{name}"), 0, Kind::Credential, &refusal);
    };
    let (host, port) = (route.host.clone(), route.port);
    // How messages name it: `github`, or `github (route github-git)` for another host of it.
    let label = if name == cred.def.name {
        name.to_owned()
    } else {
        format!("{} (route {name})", cred.def.name)
    };
    // The route's own credential's placeholder is expected here; another's is not.
    if let Some(other) = placeholder_in(&head, &inner.credentials, Some(&cred.def.name)) {
        let refusal = Refusal::CredentialPlaceholder {
            credential: other.def.name.clone(),
            credential_host: other.def.host.clone(),
            sent_to: format!("the path of credential {name} ({host})"),
        };
        let _ = client.write_all(&refusal_response(&refusal)).await;
        return refused(host, port, Kind::Credential, &refusal);
    }
    let mut record = Connection {
        host: host.clone(),
        port,
        kind: Kind::Credential,
        allowed: true,
        rule: format!("credential:{}", cred.def.name),
        address: None,
        bytes_up: 0,
        bytes_down: 0,
        error: None,
    };
    let fail = |record: &mut Connection, why: String| {
        record.error = Some(why.clone());
        response(
            "502 Bad Gateway",
            None,
            &format!("sandbox: credential {label}: {host}:{port}: {why}"),
        )
    };
    // A host named by address (a gateway on the host's loopback, `--credential
    // NAME=http://127.0.0.1:PORT`) was chosen on the host's side: connected to as it is.
    // A name is resolved and checked like any other.
    let upstream = crate::upstream::Upstream {
        host: host.clone(),
        port,
        tls: route.tls,
    };
    let candidates = match upstream.literal() {
        Some(ip) => vec![ip],
        None => match resolve_checked(inner, &host).await {
            Ok(candidates) => candidates,
            Err(refusal) => {
                inner.credentials.report_once(
                    name,
                    &format!(
                        "sandbox: --credential {label}: {}: {refusal}; every request through \
                         it fails until this is fixed (said once; each is in --report-json)",
                        upstream.url()
                    ),
                );
                let _ = client.write_all(&refusal_response(&refusal)).await;
                return refused(host, port, Kind::Credential, &refusal);
            }
        },
    };
    let report = |why: &str| {
        inner.credentials.report_once(
            name,
            &format!(
                "sandbox: --credential {label}: {}: {why}; every request through it fails \
                 (502) until this is fixed (said once; each is in --report-json)",
                upstream.url()
            ),
        );
    };
    let (tcp, address) = match connect(&candidates, port).await {
        Ok(connected) => connected,
        Err(e) => {
            let why = format!("could not be reached: {e}");
            report(&why);
            let answer = fail(&mut record, why);
            let _ = client.write_all(&answer).await;
            return record;
        }
    };
    record.address = Some(address);
    let _ = tcp.set_nodelay(true);
    let first = |value: &[u8]| {
        let mut first = origin_form(
            &head,
            &upstream.host,
            port,
            if upstream.tls { 443 } else { 80 },
            &path,
            Some((&route.header, value)),
        );
        first.extend_from_slice(&head.rest);
        first
    };
    let mut value = auth_value(&head, cred, &route);
    if !upstream.tls {
        // Plain HTTP, which `upstream::parse_url` takes only toward the host's loopback.
        let mut bytes = first(value.as_bytes());
        zeroize::Zeroize::zeroize(&mut value);
        let (result, sent) = send(tcp, bytes.as_slice(), client).await;
        zeroize::Zeroize::zeroize(&mut bytes);
        return finish(record, result, sent);
    }
    let tls = match &inner.credentials.tls {
        Ok(config) => Arc::clone(config),
        Err(why) => {
            let why = format!("TLS cannot be set up: {why}");
            report(&why);
            let answer = fail(&mut record, why);
            let _ = client.write_all(&answer).await;
            return record;
        }
    };
    let server_name = match rustls_pki_types::ServerName::try_from(host.clone()) {
        Ok(name) => name,
        Err(e) => {
            let answer = fail(&mut record, format!("not a TLS server name: {e}"));
            let _ = client.write_all(&answer).await;
            return record;
        }
    };
    // Bounded: a server that never answers the hello (a plain-HTTP one waiting for a
    // request line) would otherwise hold the program's request for as long as it waits.
    let handshake = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio_rustls::TlsConnector::from(tls).connect(server_name, tcp),
    )
    .await
    .unwrap_or_else(|_elapsed| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "no TLS answer in {} s (a plain-HTTP server?)",
                CONNECT_TIMEOUT.as_secs()
            ),
        ))
    });
    let upstream_tls = match handshake {
        Ok(stream) => stream,
        Err(e) => {
            // `NAME=http://…` names the definition's own host only.
            let hint = if name == cred.def.name {
                plain_http_hint(&e, name, port)
            } else {
                String::new()
            };
            let why = format!("TLS handshake failed: {e}{hint}");
            report(&why);
            let answer = fail(&mut record, why);
            let _ = client.write_all(&answer).await;
            return record;
        }
    };
    let mut bytes = first(value.as_bytes());
    zeroize::Zeroize::zeroize(&mut value);
    let (result, sent) = send(upstream_tls, bytes.as_slice(), client).await;
    // The only copy of the secret outside the credential itself.
    zeroize::Zeroize::zeroize(&mut bytes);
    finish(record, result, sent)
}

/// The value of the route's header toward its host: the program's HTTP Basic credentials
/// with the placeholder replaced inside (git over HTTPS sends `Basic base64(user:TOKEN)`),
/// else the route's value with the secret. Only this one header is ever rewritten; the rest
/// of the head and the whole body go as the program sent them, so an endpoint that echoes a
/// request hands back the placeholder, never the key.
fn auth_value(head: &Head, cred: &Loaded, route: &crate::credentials::Route) -> String {
    head.headers
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case(&route.header))
        .find_map(|(_, value)| cred.basic_value(value))
        .unwrap_or_else(|| cred.value_for(route))
}

/// Why a TLS handshake with a server that answers in plain HTTP failed, and the form that
/// names a plain-HTTP gateway on loopback.
fn plain_http_hint(e: &std::io::Error, name: &str, port: u16) -> String {
    let plain = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|e| {
            matches!(
                e,
                rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType)
            )
        });
    if plain {
        format!(
            " (the server does not speak TLS: a plain-HTTP gateway on this host's loopback is \
             named with --credential {name}=http://127.0.0.1:{port})"
        )
    } else {
        String::new()
    }
}

/// Writes the request head (`first`) to the credential's host, then relays both ways.
/// Returns the relay's outcome and the bytes of `first` sent.
async fn send<U>(
    mut upstream: U,
    first: &[u8],
    client: TcpStream,
) -> (Result<(u64, u64, Option<String>), String>, u64)
where
    U: AsyncRead + AsyncWrite + Unpin,
{
    if let Err(e) = upstream.write_all(first).await {
        return (Err(format!("writing to the server: {e}")), 0);
    }
    (Ok(relay(client, upstream).await), first.len() as u64)
}

fn finish(
    mut record: Connection,
    result: Result<(u64, u64, Option<String>), String>,
    sent: u64,
) -> Connection {
    match result {
        Ok((up, down, error)) => {
            record.bytes_up = sent + up;
            record.bytes_down = down;
            record.error = error;
        }
        Err(e) => record.error = Some(e),
    }
    record
}

async fn connect(candidates: &[IpAddr], port: u16) -> std::io::Result<(TcpStream, IpAddr)> {
    let mut last = std::io::Error::other("no address to connect to");
    for ip in candidates {
        let addr = SocketAddr::new(*ip, port);
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok((stream, *ip)),
            Ok(Err(e)) => last = e,
            Err(_elapsed) => {
                last = std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("{addr}: no answer in {} s", CONNECT_TIMEOUT.as_secs()),
                )
            }
        }
    }
    Err(last)
}

/// Reads until a complete request head. `Ok(None)`: the client closed first.
async fn read_head(client: &mut TcpStream) -> Result<Option<Head>, Refusal> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let n = client.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(Refusal::BadRequest {
                    why: "the connection closed inside the request head".into(),
                })
            };
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 100];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let head = Head {
                    method: req.method.unwrap_or_default().to_owned(),
                    target: req.path.unwrap_or_default().to_owned(),
                    minor_version: req.version.unwrap_or(1),
                    headers: req
                        .headers
                        .iter()
                        .map(|h| (h.name.to_owned(), h.value.to_vec()))
                        .collect(),
                    rest: buf[len..].to_vec(),
                };
                return Ok(Some(head));
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => {}
            Ok(httparse::Status::Partial) => {
                return Err(Refusal::BadRequest {
                    why: format!("the request head is longer than {MAX_HEAD} bytes"),
                })
            }
            Err(e) => {
                return Err(Refusal::BadRequest {
                    why: format!("not an HTTP request ({e})"),
                })
            }
        }
    }
}

/// `http://host[:port]/path?query` → host, port, origin-form path.
fn absolute_http(target: &str) -> Result<(String, u16, String), Refusal> {
    let bad = |why: String| Refusal::BadRequest { why };
    let scheme_end = target.find("://").ok_or_else(|| {
        bad(format!(
            "a proxy request names its URL in full (`GET http://host/path`), not {target:?}"
        ))
    })?;
    let scheme = &target[..scheme_end];
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(bad(format!(
            "{scheme}:// goes through CONNECT (HTTPS_PROXY), not as a plain request"
        )));
    }
    let rest = &target[scheme_end + 3..];
    let split = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    if authority.contains('@') {
        return Err(bad("credentials in the URL are not forwarded".into()));
    }
    let path = match path.chars().next() {
        None | Some('#') => "/".to_owned(),
        Some('?') => format!("/{path}"),
        Some(_) => path.to_owned(),
    };
    let (host, port) = split_authority(authority, Some(80))
        .ok_or_else(|| bad(format!("no host in {target:?}")))?;
    Ok((host, port, path))
}

/// `host:port`, `[v6]:port`, or (with a default port) `host`. The host comes back without
/// brackets.
fn split_authority(authority: &str, default_port: Option<u16>) -> Option<(String, u16)> {
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return None,
        };
        (host, port)
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => default_port?,
    };
    (!host.is_empty() && port != 0).then(|| (host.to_owned(), port))
}

/// The request as the server gets it: origin form, no proxy or hop-by-hop headers,
/// `Connection: close`, and a `Host` that is the checked host — whatever `Host` the program
/// sent, so a server that hosts many names (a CDN) cannot be asked for one not on the list.
///
/// With `set`, that header is dropped from what the program sent and sent with the given
/// value instead (a credential's real secret).
fn origin_form(
    head: &Head,
    host: &str,
    port: u16,
    default_port: u16,
    path: &str,
    set: Option<(&str, &[u8])>,
) -> Vec<u8> {
    const DROPPED: [&str; 6] = [
        "host",
        "proxy-connection",
        "proxy-authorization",
        "connection",
        "keep-alive",
        "upgrade",
    ];
    let mut out = format!("{} {path} HTTP/1.{}\r\n", head.method, head.minor_version).into_bytes();
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    let host = if port == default_port {
        host
    } else {
        format!("{host}:{port}")
    };
    out.extend_from_slice(format!("Host: {host}\r\n").as_bytes());
    if let Some((name, value)) = set {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    for (name, value) in &head.headers {
        if DROPPED.iter().any(|d| name.eq_ignore_ascii_case(d))
            || set.is_some_and(|(set, _)| name.eq_ignore_ascii_case(set))
        {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

/// The record of an allowed connection to `target`, before it is made.
fn allowed(target: &Target, port: u16, kind: Kind) -> Connection {
    Connection {
        host: match target {
            Target::Name { name, .. } => name.clone(),
            Target::Address { ip, .. } => ip.to_string(),
        },
        port,
        kind,
        allowed: true,
        rule: target.rule().to_owned(),
        address: None,
        bytes_up: 0,
        bytes_down: 0,
        error: None,
    }
}

fn refused(host: String, port: u16, kind: Kind, refusal: &Refusal) -> Connection {
    Connection {
        host,
        port,
        kind,
        allowed: false,
        rule: refusal.rule().to_owned(),
        address: None,
        bytes_up: 0,
        bytes_down: 0,
        error: None,
    }
}

fn refusal_response(refusal: &Refusal) -> Vec<u8> {
    let status = match refusal {
        Refusal::BadRequest { .. } | Refusal::InvalidName { .. } => "400 Bad Request",
        Refusal::NoAnswer { .. } => "502 Bad Gateway",
        Refusal::UnknownCredential { .. } => "404 Not Found",
        _ => "403 Forbidden",
    };
    response(status, Some(refusal.rule()), &refusal.to_string())
}

fn response(status: &str, rule: Option<&str>, body: &str) -> Vec<u8> {
    let body = format!("{body}\n");
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(rule) = rule {
        out.push_str(&format!("X-Sandbox-Refused: {rule}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(&body);
    out.into_bytes()
}

/// Relays two TCP connections both ways until both sides are done, or either breaks: the
/// relay the proxy's tunnels use (`splice(2)` on Linux), for the native backend's relayed
/// and published ports too. Returns the bytes each way (up: `client` → `upstream`) and the
/// first error.
pub async fn relay_tcp(client: TcpStream, upstream: TcpStream) -> (u64, u64, Option<String>) {
    #[cfg(target_os = "linux")]
    return splice::relay(client, upstream).await;
    #[cfg(not(target_os = "linux"))]
    return relay(client, upstream).await;
}

/// Relays both ways until both sides are done, or either breaks. Returns the bytes each way
/// (up: client → server) and the first error.
async fn relay<U>(client: TcpStream, upstream: U) -> (u64, u64, Option<String>)
where
    U: AsyncRead + AsyncWrite + Unpin,
{
    let (client_read, client_write) = client.into_split();
    let (upstream_read, upstream_write) = tokio::io::split(upstream);
    let up_bytes = AtomicU64::new(0);
    let down_bytes = AtomicU64::new(0);
    let error = both_ways(
        pump(client_read, upstream_write, &up_bytes),
        pump(upstream_read, client_write, &down_bytes),
    )
    .await;
    (
        up_bytes.load(Ordering::Relaxed),
        down_bytes.load(Ordering::Relaxed),
        error,
    )
}

/// Drives a relay's two directions (up: program → server) until both are done, or either
/// breaks; returns the first error, named by its direction.
async fn both_ways(
    up: impl std::future::Future<Output = std::io::Result<()>>,
    down: impl std::future::Future<Output = std::io::Result<()>>,
) -> Option<String> {
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (false, false);
    while !(up_done && down_done) {
        tokio::select! {
            result = &mut up, if !up_done => {
                up_done = true;
                if let Err(e) = result {
                    return Some(format!("program → server: {e}"));
                }
            }
            result = &mut down, if !down_done => {
                down_done = true;
                if let Err(e) = result {
                    return Some(format!("server → program: {e}"));
                }
            }
        }
    }
    None
}

/// The relay between two TCP sockets through `splice(2)`: socket → pipe → socket, the bytes
/// never copied into the proxy's memory. The copying relay cost the proxy's thread 500–900 µs
/// of CPU per MiB on loopback, this one 370–470 (BENCHMARKS.md): with it, the proxy's
/// thread stops being much busier than the download's own client.
#[cfg(target_os = "linux")]
mod splice {
    use std::io;
    use std::os::fd::{AsFd, AsRawFd, OwnedFd};
    use std::sync::atomic::{AtomicU64, Ordering};

    use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags};
    use tokio::io::Interest;
    use tokio::net::TcpStream;

    /// The pipe's size: how much one `splice` moves at most.
    const PIPE_SIZE: usize = 1 << 20;

    pub(super) async fn relay(
        client: TcpStream,
        upstream: TcpStream,
    ) -> (u64, u64, Option<String>) {
        let up_bytes = AtomicU64::new(0);
        let down_bytes = AtomicU64::new(0);
        let error = super::both_ways(
            pump(&client, &upstream, &up_bytes),
            pump(&upstream, &client, &down_bytes),
        )
        .await;
        (
            up_bytes.load(Ordering::Relaxed),
            down_bytes.load(Ordering::Relaxed),
            error,
        )
    }

    fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        // A larger pipe moves more per call; the default (64 KiB) still works.
        let _ = nix::fcntl::fcntl(w.as_raw_fd(), FcntlArg::F_SETPIPE_SZ(PIPE_SIZE as i32));
        Ok((r, w))
    }

    async fn pump(from: &TcpStream, to: &TcpStream, count: &AtomicU64) -> io::Result<()> {
        let (pipe_r, pipe_w) = pipe()?;
        let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
        loop {
            let n = loop {
                from.readable().await?;
                match from.try_io(Interest::READABLE, || {
                    nix::fcntl::splice(from.as_fd(), None, pipe_w.as_fd(), None, PIPE_SIZE, flags)
                        .map_err(io::Error::from)
                }) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            };
            if n == 0 {
                break;
            }
            let mut left = n;
            while left > 0 {
                to.writable().await?;
                match to.try_io(Interest::WRITABLE, || {
                    nix::fcntl::splice(pipe_r.as_fd(), None, to.as_fd(), None, left, flags)
                        .map_err(io::Error::from)
                }) {
                    Ok(m) => left -= m,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            }
            count.fetch_add(n as u64, Ordering::Relaxed);
        }
        // The half-close reaches the other side; it may already be gone.
        let _ = nix::sys::socket::shutdown(to.as_raw_fd(), nix::sys::socket::Shutdown::Write);
        Ok(())
    }
}

/// Copies until end of stream, then shuts the writer down (a half-close reaches the other
/// side); counts as it goes, so a broken relay still reports what it moved.
async fn pump<R, W>(mut from: R, mut to: W, count: &AtomicU64) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; RELAY_BUFFER];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        to.write_all(&buf[..n]).await?;
        count.fetch_add(n as u64, Ordering::Relaxed);
    }
    // The peer may already have closed its side; the relay in this direction is done.
    let _ = to.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_split_with_and_without_ports() {
        assert_eq!(
            split_authority("a.test:443", None),
            Some(("a.test".into(), 443))
        );
        assert_eq!(split_authority("a.test", None), None);
        assert_eq!(
            split_authority("a.test", Some(80)),
            Some(("a.test".into(), 80))
        );
        assert_eq!(
            split_authority("[::1]:8080", None),
            Some(("::1".into(), 8080))
        );
        assert_eq!(split_authority("[::1]", Some(80)), Some(("::1".into(), 80)));
        assert_eq!(split_authority("[::1]x", Some(80)), None);
        assert_eq!(split_authority(":443", None), None);
        assert_eq!(split_authority("a.test:0", None), None);
        assert_eq!(split_authority("a.test:http", None), None);
    }

    #[test]
    fn absolute_urls_become_origin_form() {
        assert_eq!(
            absolute_http("http://a.test:8080/x/y?z=1").unwrap(),
            ("a.test".into(), 8080, "/x/y?z=1".into())
        );
        assert_eq!(
            absolute_http("HTTP://a.test").unwrap(),
            ("a.test".into(), 80, "/".into())
        );
        assert_eq!(
            absolute_http("http://a.test?q").unwrap(),
            ("a.test".into(), 80, "/?q".into())
        );
        assert!(absolute_http("/relative").is_err());
        assert!(absolute_http("https://a.test/").is_err());
        assert!(absolute_http("http://user:pw@a.test/").is_err());
    }
}
