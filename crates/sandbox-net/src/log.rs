//! The connection log: one record per connection the proxy answered, allowed or refused
//! (for `--report-json`, the daemon's `exit` event and `sandbox why --net`).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// How the program asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Kind {
    /// `CONNECT host:port` (a tunnel; HTTPS goes this way, encrypted end to end).
    Connect,
    /// A plain-HTTP request in absolute form (`GET http://host/path`).
    Http,
    /// A SOCKS5 `CONNECT` (`ALL_PROXY=socks5h://…`), to a name or an address.
    Socks,
    /// A request to a credential's base URL (`/cred/NAME/...`), forwarded over TLS to the
    /// credential's host with the real secret added.
    Credential,
    /// A connection from the host to a port the user published (`--publish`): `host` and
    /// `address` are the host-side client's, `port` the port inside it reached; bytes "up"
    /// went from that client to the server inside.
    Inbound,
}

/// One connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Connection {
    /// The host as the request named it (lower case), or the request line if it named none.
    pub host: String,
    pub port: u16,
    pub kind: Kind,
    pub allowed: bool,
    /// The allow-list entry that allowed it (`a.test`, `*.example.com`, `@github`), or the
    /// refusing rule (`not-listed`, `ip-literal`, `non-public-answer`, …).
    pub rule: String,
    /// The address connected to, once one was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<IpAddr>,
    /// Bytes from the program to the server (for plain HTTP: the forwarded request too).
    pub bytes_up: u64,
    /// Bytes from the server to the program.
    pub bytes_down: u64,
    /// What went wrong after the decision (the server was unreachable, the relay broke).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
