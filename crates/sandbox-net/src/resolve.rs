//! The proxy's own name resolution: a name is resolved on the host, by the proxy, once per
//! connection, and the connection goes to exactly the address that was checked — so no
//! answer the sandbox saw (or a second lookup could see) decides where bytes go.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use simple_dns::rdata::RData;
use simple_dns::{Name, Packet, PacketFlag, Question, CLASS, QCLASS, QTYPE, RCODE, TYPE};
use tokio::net::UdpSocket;

use crate::error::NetError;

/// How long one DNS query waits for its answer; a lost datagram is asked again once.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
const ATTEMPTS: usize = 2;

/// Where the proxy asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolver {
    /// The host's resolver (`getaddrinfo`: `/etc/hosts`, then the system's DNS).
    System,
    /// This DNS server, over UDP (A and AAAA queries, recursion desired).
    Server(SocketAddr),
}

impl std::fmt::Display for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Resolver::System => f.write_str("the system resolver"),
            Resolver::Server(addr) => write!(f, "the DNS server {addr}"),
        }
    }
}

impl Resolver {
    /// Every address of `name`, IPv4 first; empty if it has none.
    pub async fn lookup(&self, name: &str) -> Result<Vec<IpAddr>, NetError> {
        match self {
            Resolver::System => {
                let addrs = tokio::net::lookup_host((name, 0)).await.map_err(|source| {
                    NetError::Resolve {
                        name: name.to_owned(),
                        resolver: self.to_string(),
                        source,
                    }
                })?;
                let mut out: Vec<IpAddr> = Vec::new();
                for a in addrs {
                    if !out.contains(&a.ip()) {
                        out.push(a.ip());
                    }
                }
                out.sort_by_key(|ip| ip.is_ipv6());
                Ok(out)
            }
            Resolver::Server(server) => {
                let (v4, v6) = tokio::join!(
                    query(*server, name, TYPE::A),
                    query(*server, name, TYPE::AAAA)
                );
                let mut out = v4?;
                out.extend(v6?);
                Ok(out)
            }
        }
    }
}

/// One question to `server`, asked on a socket connected to it (so only its datagrams are
/// read), matched by a random id.
async fn query(server: SocketAddr, name: &str, qtype: TYPE) -> Result<Vec<IpAddr>, NetError> {
    let fail = |why: String| NetError::Dns {
        name: name.to_owned(),
        server,
        why,
    };
    let local: SocketAddr = match server {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local)
        .await
        .map_err(|e| fail(format!("binding a UDP socket: {e}")))?;
    socket
        .connect(server)
        .await
        .map_err(|e| fail(format!("connecting: {e}")))?;
    let id = random_id();
    let qname = Name::new(name).map_err(|e| fail(format!("not a DNS name: {e}")))?;
    let mut packet = Packet::new_query(id);
    packet.set_flags(PacketFlag::RECURSION_DESIRED);
    packet.questions.push(Question::new(
        qname,
        QTYPE::TYPE(qtype),
        QCLASS::CLASS(CLASS::IN),
        false,
    ));
    let bytes = packet
        .build_bytes_vec()
        .map_err(|e| fail(format!("building the query: {e}")))?;
    let mut buf = vec![0u8; 4096];
    for _ in 0..ATTEMPTS {
        socket
            .send(&bytes)
            .await
            .map_err(|e| fail(format!("sending the query: {e}")))?;
        let deadline = tokio::time::Instant::now() + QUERY_TIMEOUT;
        loop {
            let n = match tokio::time::timeout_at(deadline, socket.recv(&mut buf)).await {
                Err(_elapsed) => break,
                Ok(Err(e)) => return Err(fail(format!("reading the answer: {e}"))),
                Ok(Ok(n)) => n,
            };
            let Ok(reply) = Packet::parse(&buf[..n]) else {
                continue;
            };
            if reply.id() != id || !reply.has_flags(PacketFlag::RESPONSE) {
                continue;
            }
            return match reply.rcode() {
                RCODE::NoError => Ok(reply
                    .answers
                    .iter()
                    .filter_map(|rr| match &rr.rdata {
                        RData::A(a) => Some(IpAddr::V4(Ipv4Addr::from(a.address))),
                        RData::AAAA(a) => Some(IpAddr::V6(Ipv6Addr::from(a.address))),
                        _ => None,
                    })
                    .collect()),
                RCODE::NameError => Ok(Vec::new()),
                other => Err(fail(format!("the server answered {other:?}"))),
            };
        }
    }
    Err(fail(format!(
        "no answer after {ATTEMPTS} tries of {} s",
        QUERY_TIMEOUT.as_secs()
    )))
}

/// A query id nobody off the path can guess: the standard library's per-process random
/// hash keys, fresh for each `RandomState`.
fn random_id() -> u16 {
    let mut h = RandomState::new().build_hasher();
    h.write_u8(0);
    h.finish() as u16
}
