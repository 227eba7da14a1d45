//! A stand-in git host over HTTPS, as GitHub is to git: real `git http-backend` (git's smart
//! HTTP server, run as CGI) over the bare repositories under a root, behind TLS with a
//! [`TestCa`] certificate, taking only HTTP Basic credentials whose password is one token
//! (`Basic base64(x-access-token:TOKEN)`, the form GitHub takes a token in). Anything else
//! gets `401` with `WWW-Authenticate: Basic`, as GitHub answers a push without credentials.
//! One request per connection (`Connection: close`), a thread each; every request is kept
//! ([`Seen`]), with its body.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;

use crate::net::{Seen, TestCa};

/// The user name the host expects with the token.
pub const USER: &str = "x-access-token";

/// The stand-in: where it listens, what it serves and what it saw.
pub struct GitHost {
    pub port: u16,
    /// `GIT_PROJECT_ROOT`: `https://127.0.0.1:PORT/o/r.git` is `ROOT/o/r.git`.
    pub root: PathBuf,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl GitHost {
    /// Serves the bare repositories under `root` on 127.0.0.1 (a free port), to requests that
    /// carry `token`.
    pub fn start(ca: &TestCa, root: &Path, token: &str) -> GitHost {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let config = ca.server_config();
        let want = format!("Basic {}", BASE64.encode(format!("{USER}:{token}")));
        let project_root = root.to_path_buf();
        std::thread::spawn(move || {
            for tcp in listener.incoming().flatten() {
                let (config, log, want, root) = (
                    Arc::clone(&config),
                    Arc::clone(&log),
                    want.clone(),
                    project_root.clone(),
                );
                std::thread::spawn(move || serve(tcp, config, &root, &want, &log));
            }
        });
        GitHost {
            port,
            root: root.to_path_buf(),
            seen,
        }
    }

    /// A bare repository at `ROOT/NAME` (`o/r.git`) with one commit on `main`.
    pub fn repository(&self, name: &str) -> PathBuf {
        let bare = self.root.join(name);
        std::fs::create_dir_all(&bare).unwrap();
        crate::git(&bare, &["init", "-q", "--bare", "-b", "main"]);
        let seed = tempdir_in(&self.root);
        crate::git(&seed, &["init", "-q", "-b", "main"]);
        crate::git(&seed, &["commit", "-q", "--allow-empty", "-m", "first"]);
        crate::git(&seed, &["push", "-q", bare.to_str().unwrap(), "main"]);
        std::fs::remove_dir_all(&seed).unwrap();
        bare
    }

    /// Every request so far, in order (`path` without the query).
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The requests and their `Authorization`, for a failing assertion's message.
    pub fn summary(&self) -> String {
        self.seen()
            .iter()
            .map(|s| {
                format!(
                    "{} {} auth={:?} body={}B\n",
                    s.method,
                    s.path,
                    s.header("authorization"),
                    s.body.len()
                )
            })
            .collect()
    }
}

/// A fresh directory under `dir` for a seed clone.
fn tempdir_in(dir: &Path) -> PathBuf {
    for i in 0.. {
        let path = dir.join(format!(".seed-{}-{i}", std::process::id()));
        if std::fs::create_dir(&path).is_ok() {
            return path;
        }
    }
    unreachable!()
}

fn serve(
    tcp: TcpStream,
    config: Arc<rustls::ServerConfig>,
    root: &Path,
    want: &str,
    log: &Mutex<Vec<Seen>>,
) {
    let Ok(conn) = rustls::ServerConnection::new(config) else {
        return;
    };
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let Some((method, target, headers, body)) = read_request(&mut tls) else {
        return;
    };
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    log.lock().unwrap().push(Seen {
        method: method.clone(),
        path: path.to_owned(),
        headers: headers.clone(),
        body: String::from_utf8_lossy(&body).into_owned(),
    });
    let answer = if header("authorization") != Some(want) {
        b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"git\"\r\n\
          Content-Length: 0\r\nConnection: close\r\n\r\n"
            .to_vec()
    } else {
        backend(root, &method, path, query, &headers, &body)
    };
    let _ = tls.write_all(&answer);
    let _ = tls.flush();
    tls.conn.send_close_notify();
    let _ = tls.flush();
}

/// A request as read: method, target, headers (names in lower case) and body.
type Request = (String, String, Vec<(String, String)>, Vec<u8>);

/// Reads one request, its body by `Content-Length` or chunked.
fn read_request<S: Read + Write>(stream: &mut S) -> Option<Request> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let target = parts.next()?.to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((n, v)) = h.split_once(':') {
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    let has = |name: &str, value: &str| {
        headers
            .iter()
            .any(|(n, v)| n == name && v.eq_ignore_ascii_case(value))
    };
    if has("expect", "100-continue") {
        reader
            .get_mut()
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .ok()?;
    }
    let mut body = Vec::new();
    if has("transfer-encoding", "chunked") {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).ok()?;
            let size = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
            let mut chunk = vec![0u8; size + 2];
            reader.read_exact(&mut chunk).ok()?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else {
        let length: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        body.resize(length, 0);
        reader.read_exact(&mut body).ok()?;
    }
    Some((method, target, headers, body))
}

/// The response of `git http-backend` (CGI) to the request, as HTTP.
fn backend(
    root: &Path,
    method: &str,
    path: &str,
    query: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Vec<u8> {
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let mut child = Command::new("git")
        .arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", root)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("PATH_INFO", path)
        .env("QUERY_STRING", query)
        .env("REQUEST_METHOD", method)
        .env("CONTENT_TYPE", header("content-type"))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("HTTP_CONTENT_ENCODING", header("content-encoding"))
        .env("GIT_PROTOCOL", header("git-protocol"))
        // http-backend serves receive-pack (a push) only to an authenticated user.
        .env("REMOTE_USER", USER)
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = body.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    let _ = writer.join();
    // CGI: header lines (`Status: 200 OK` among them), a blank line, the body.
    let stdout = out.stdout;
    let split = stdout
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, i + 4))
        .or_else(|| {
            stdout
                .windows(2)
                .position(|w| w == b"\n\n")
                .map(|i| (i, i + 2))
        });
    let Some((head_end, body_start)) = split else {
        return b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\
                 Connection: close\r\n\r\n"
            .to_vec();
    };
    let head = String::from_utf8_lossy(&stdout[..head_end]);
    let mut status = "200 OK".to_owned();
    let mut response_headers = String::new();
    for line in head.lines().map(str::trim_end).filter(|l| !l.is_empty()) {
        match line.split_once(':') {
            Some((name, value)) if name.eq_ignore_ascii_case("status") => {
                status = value.trim().to_owned();
            }
            _ => {
                response_headers.push_str(line);
                response_headers.push_str("\r\n");
            }
        }
    }
    let content = &stdout[body_start..];
    let mut answer = format!(
        "HTTP/1.1 {status}\r\n{response_headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
        content.len()
    )
    .into_bytes();
    answer.extend_from_slice(content);
    answer
}
