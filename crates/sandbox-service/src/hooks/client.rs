//! A minimal HTTP/1.1 client for the hook endpoint (`sandbox hook`, `sandbox ps`'s tests):
//! one request per connection over loopback TCP, no dependency on an HTTP stack.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Why a request could not be made.
#[derive(Debug, thiserror::Error)]
pub enum HookClientError {
    #[error("SANDBOX_API_URL {0:?} is not http://HOST:PORT")]
    BadUrl(String),
    #[error("{url}: {source}")]
    Io {
        url: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{url}: not an HTTP response")]
    BadResponse { url: String },
}

/// A response: status code and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookResponse {
    pub status: u16,
    pub body: String,
}

/// Sends `method path` with an optional bearer token and JSON body.
pub fn request(
    url: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&[u8]>,
) -> Result<HookResponse, HookClientError> {
    let authority = url
        .strip_prefix("http://")
        .map(|rest| rest.trim_end_matches('/'))
        .filter(|a| !a.is_empty() && !a.contains('/'))
        .ok_or_else(|| HookClientError::BadUrl(url.to_string()))?;
    let io = |source| HookClientError::Io {
        url: url.to_string(),
        source,
    };
    let mut stream = TcpStream::connect(authority).map_err(io)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(io)?;
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n");
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    let body = body.unwrap_or(b"");
    if method != "GET" {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).map_err(io)?;
    if method != "GET" {
        // The server may answer (413) and close before reading it all; that is an answer.
        let _ = stream.write_all(body);
    }
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| HookClientError::BadResponse {
            url: url.to_string(),
        })?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok(HookResponse { status, body })
}

/// `POST /hook` with `{event, message?}`.
pub fn post_status(
    url: &str,
    token: &str,
    event: &str,
    message: Option<&str>,
) -> Result<HookResponse, HookClientError> {
    let mut body = serde_json::json!({ "event": event });
    if let Some(m) = message {
        body["message"] = serde_json::Value::String(m.to_string());
    }
    request(
        url,
        "POST",
        "/hook",
        Some(token),
        Some(body.to_string().as_bytes()),
    )
}
