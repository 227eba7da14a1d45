//! Where a credential goes: its definition's host over TLS, or another the user names on
//! the host's side — `--credential NAME=URL` (and `NAME=URL` in `credentials:`), or the
//! variable `SANDBOX_CREDENTIAL_<NAME>_HOST=HOST[:PORT]`.
//!
//! `https://HOST[:PORT]` may name any host. `http://` is taken only toward the host's own
//! loopback (`127.0.0.0/8`, `[::1]`, `localhost`), where a local gateway listens: plain HTTP
//! anywhere else would carry the secret over a network in the clear.

use std::net::{IpAddr, Ipv4Addr};

/// A credential's real host, as the proxy connects to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// A DNS name or an IP address (without brackets).
    pub host: String,
    pub port: u16,
    /// TLS verified against the web PKI (and `SANDBOX_CREDENTIAL_CA`); `false` only on
    /// loopback.
    pub tls: bool,
}

impl Upstream {
    /// `https://host:port` or `http://host:port`, for messages.
    pub fn url(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{host}:{}", self.port)
    }

    /// The address to connect to without asking a resolver: an IP literal, or `localhost`
    /// (the host's loopback). `None`: a name the proxy resolves (and checks) itself.
    pub fn literal(&self) -> Option<IpAddr> {
        if self.host.eq_ignore_ascii_case("localhost") {
            return Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        self.host.parse().ok()
    }
}

/// `NAME` or `NAME=URL`: the credential's name and the host it goes to instead of its
/// definition's, if one is named. `Err` says what is wrong with the URL.
pub fn split_spec(spec: &str) -> Result<(&str, Option<Upstream>), String> {
    match spec.split_once('=') {
        None => Ok((spec, None)),
        Some((name, url)) => Ok((name, Some(parse_url(url)?))),
    }
}

/// The credential name of a spec (`anthropic` of `anthropic=http://127.0.0.1:4000`).
pub fn spec_name(spec: &str) -> &str {
    spec.split_once('=').map_or(spec, |(name, _)| name)
}

/// `http[s]://HOST[:PORT][/]`: no user, no path, no query.
pub fn parse_url(url: &str) -> Result<Upstream, String> {
    let (tls, rest) = if let Some(rest) = strip_prefix_ci(url, "https://") {
        (true, rest)
    } else if let Some(rest) = strip_prefix_ci(url, "http://") {
        (false, rest)
    } else {
        return Err("not an http:// or https:// URL".into());
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains(['/', '?', '#', '@']) || authority.is_empty() {
        return Err("only a scheme, a host and a port: no user, path or query".into());
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or("an unclosed [")?;
        host.parse::<std::net::Ipv6Addr>()
            .map_err(|_| format!("{host} is not an IPv6 address"))?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{p:?} is not a port"))?,
        None if tls => 443,
        None => 80,
    };
    let name_like = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':'));
    if !name_like {
        return Err(format!("{host:?} is not a host name or an address"));
    }
    let upstream = Upstream {
        host: host.to_ascii_lowercase(),
        port,
        tls,
    };
    if !tls && !is_loopback(&upstream) {
        return Err(format!(
            "plain http:// only to the host's loopback (127.0.0.1, [::1], localhost), where a \
             local gateway listens: toward {host} the secret would cross the network in the \
             clear. Use https://{host}:{port}"
        ));
    }
    Ok(upstream)
}

/// Whether `upstream` is the host's own loopback.
pub fn is_loopback(upstream: &Upstream) -> bool {
    upstream.literal().is_some_and(|ip| ip.is_loopback())
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    (s.len() >= prefix.len() && s[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &s[prefix.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_only_to_loopback() {
        let up = |tls, host: &str, port| Upstream {
            host: host.into(),
            port,
            tls,
        };
        assert_eq!(
            parse_url("http://127.0.0.1:4000"),
            Ok(up(false, "127.0.0.1", 4000))
        );
        assert_eq!(
            parse_url("HTTP://localhost:4000/"),
            Ok(up(false, "localhost", 4000))
        );
        assert_eq!(parse_url("http://[::1]:8"), Ok(up(false, "::1", 8)));
        assert_eq!(
            parse_url("https://Gateway.example.com"),
            Ok(up(true, "gateway.example.com", 443))
        );
        assert_eq!(
            parse_url("https://10.0.0.5:8443"),
            Ok(up(true, "10.0.0.5", 8443))
        );
        for bad in [
            "http://gateway.example.com:4000",
            "http://10.0.0.5",
            "http://0.0.0.0:80",
        ] {
            let err = parse_url(bad).unwrap_err();
            assert!(err.contains("only to the host's loopback"), "{bad}: {err}");
        }
        for bad in [
            "ftp://a",
            "127.0.0.1:4000",
            "http://127.0.0.1:4000/v1",
            "http://u:p@127.0.0.1",
            "http://127.0.0.1:0",
            "https://",
            "https://a b",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
        assert_eq!(up(false, "::1", 8).url(), "http://[::1]:8");
        assert_eq!(spec_name("anthropic=http://x"), "anthropic");
        assert_eq!(split_spec("github"), Ok(("github", None)));
    }
}
