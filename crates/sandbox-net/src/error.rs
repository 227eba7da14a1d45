use std::net::SocketAddr;

use thiserror::Error;

/// What can go wrong configuring or running the proxy (refusals of a connection are
/// [`crate::Refusal`]s, answered to the program, not errors).
#[derive(Debug, Error)]
pub enum NetError {
    #[error("network allow-list entry {entry:?}: {why}")]
    InvalidEntry { entry: String, why: &'static str },

    #[error("network allow-list: no group @{name}; the groups are {known}")]
    UnknownGroup { name: String, known: String },

    #[error("resolving {name} with {resolver}: {source}")]
    Resolve {
        name: String,
        resolver: String,
        #[source]
        source: std::io::Error,
    },

    #[error("resolving {name} with the DNS server {server}: {why}")]
    Dns {
        name: String,
        server: SocketAddr,
        why: String,
    },

    #[error("the proxy's listener: {0}")]
    Listen(#[source] std::io::Error),
}
