//! The allow-list: which hosts a run may reach, decided from the name alone before anything
//! is resolved, and which answers a resolved name may use.
//!
//! Entries, as `--allow-domain` and `network.allow_domains` take them:
//! * `example.com`: that name only (not its subdomains);
//! * `*.example.com`: every name below `example.com`, not `example.com` itself;
//! * `@github`, `@npm`, `@agents`, …: a built-in [group](crate::groups);
//! * `10.1.2.3`, `::1`: that address, both as a literal target (`CONNECT 10.1.2.3:443`) and as
//!   an answer for a listed name. Without such an entry, IP literals are refused, and so are
//!   answers that are not public addresses ([`crate::is_public`]), so that a listed name
//!   whose DNS later points at `127.0.0.1` or `169.254.169.254` reaches nothing (DNS
//!   rebinding).
//!
//! Names are compared in lower case, without a trailing dot.

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::error::NetError;
use crate::groups;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    Exact(String),
    /// The suffix with its leading dot: `.example.com`.
    Below(String),
    Address(IpAddr),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    pattern: Pattern,
    /// The entry as the user wrote it (`@github` for each of the group's hosts), which
    /// refusals and the connection log name.
    rule: String,
}

/// The parsed allow-list. Empty means nothing is reachable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<Entry>,
}

/// What a request may connect to, and the rule that allowed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A listed name, to be resolved by the proxy.
    Name { name: String, rule: String },
    /// A listed IP address, connected to as it is.
    Address { ip: IpAddr, rule: String },
}

impl Target {
    pub fn rule(&self) -> &str {
        match self {
            Target::Name { rule, .. } | Target::Address { rule, .. } => rule,
        }
    }
}

/// Why a connection was refused. Its [`fmt::Display`] is the body the program inside gets:
/// what was refused, by which rule, and how the user allows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
// Tagged by the same short name as [`Refusal::rule`] (a test keeps them equal).
#[serde(rename_all = "kebab-case", tag = "rule")]
pub enum Refusal {
    /// The name matches no entry.
    NotListed { host: String },
    /// Not a host name (empty label, a character DNS names do not have, too long).
    InvalidName { host: String },
    /// An IP address given as the target, not named on the list.
    IpLiteral { ip: IpAddr },
    /// The name is listed, but every address it resolved to is not public and not listed.
    NonPublicAnswer {
        host: String,
        addresses: Vec<IpAddr>,
    },
    /// The name is listed, but did not resolve.
    NoAnswer { host: String, error: String },
    /// Not a request this proxy serves.
    BadRequest { why: String },
    /// A request carries a credential's placeholder toward somewhere other than that
    /// credential's own path (`--credential`): a plain-HTTP request to another host, or
    /// another credential's path.
    CredentialPlaceholder {
        credential: String,
        credential_host: String,
        sent_to: String,
    },
    /// `/cred/NAME` names no credential of this run.
    UnknownCredential { name: String, known: Vec<String> },
}

impl Refusal {
    /// The refusing rule's short name (the log's `rule`, the `X-Sandbox-Refused` header).
    pub fn rule(&self) -> &'static str {
        match self {
            Refusal::NotListed { .. } => "not-listed",
            Refusal::InvalidName { .. } => "invalid-name",
            Refusal::IpLiteral { .. } => "ip-literal",
            Refusal::NonPublicAnswer { .. } => "non-public-answer",
            Refusal::NoAnswer { .. } => "no-answer",
            Refusal::BadRequest { .. } => "bad-request",
            Refusal::CredentialPlaceholder { .. } => "credential-placeholder",
            Refusal::UnknownCredential { .. } => "unknown-credential",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NotListed { host } => write!(
                f,
                "sandbox: refused: {host} is not on this run's network allow-list (rule \
                 not-listed). To allow it, run with --allow-domain {host} (or add it to \
                 network.allow_domains in the configuration)."
            ),
            Refusal::InvalidName { host } => write!(
                f,
                "sandbox: refused: {host:?} is not a valid host name (rule invalid-name)."
            ),
            Refusal::IpLiteral { ip } => write!(
                f,
                "sandbox: refused: {ip} is an IP address, and only names on the allow-list are \
                 reachable (rule ip-literal). Use the host's name, or allow this address with \
                 --allow-domain {ip}."
            ),
            Refusal::NonPublicAnswer { host, addresses } => {
                let list = addresses
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ");
                let first = addresses
                    .first()
                    .map_or_else(|| "ADDRESS".to_owned(), ToString::to_string);
                write!(
                    f,
                    "sandbox: refused: {host} resolved to {list}, which is not a public address \
                     (rule non-public-answer: a listed name may not lead into a private \
                     network, which is how DNS rebinding works). If that host really is on \
                     your network, allow the address with --allow-domain {first}."
                )
            }
            Refusal::NoAnswer { host, error } => write!(
                f,
                "sandbox: {host} did not resolve: {error} (rule no-answer; the proxy resolves \
                 names on the host, with the host's DNS)."
            ),
            Refusal::BadRequest { why } => write!(
                f,
                "sandbox: bad proxy request: {why} (rule bad-request). This is the sandbox's \
                 HTTP proxy: programs reach the network through HTTP_PROXY/HTTPS_PROXY."
            ),
            Refusal::CredentialPlaceholder {
                credential,
                credential_host,
                sent_to,
            } => write!(
                f,
                "sandbox: refused: this request carries the placeholder of credential \
                 {credential}, which the sandbox exchanges for the real key only on the way to \
                 {credential_host}, through its own base URL (http://PROXY/cred/{credential}); \
                 it was sent to {sent_to} (rule credential-placeholder). Send {credential}'s \
                 requests to its base URL, and no other requests with its key."
            ),
            Refusal::UnknownCredential { name, known } => {
                let known = if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                };
                write!(
                    f,
                    "sandbox: refused: this run has no credential {name:?} (rule \
                     unknown-credential; its credentials: {known}). To give it one, run with \
                     --credential {name} (or add it to credentials: in the configuration)."
                )
            }
        }
    }
}

impl AllowList {
    /// Parses the entries; a malformed one or an unknown `@group` is an error naming it.
    pub fn parse<I, S>(entries: I) -> Result<Self, NetError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut list = AllowList::default();
        for entry in entries {
            let entry = entry.as_ref().trim();
            if let Some(name) = entry.strip_prefix('@') {
                let group = groups::find(name).ok_or_else(|| NetError::UnknownGroup {
                    name: name.to_owned(),
                    known: groups::GROUPS
                        .iter()
                        .map(|g| format!("@{}", g.name))
                        .collect::<Vec<_>>()
                        .join(", "),
                })?;
                for host in groups::hosts(group) {
                    list.push(pattern(host)?, entry);
                }
            } else {
                list.push(pattern(entry)?, entry);
            }
        }
        Ok(list)
    }

    fn push(&mut self, pattern: Pattern, rule: &str) {
        self.entries.push(Entry {
            pattern,
            rule: rule.to_owned(),
        });
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Decides from the target as the request names it (a host name or an IP literal,
    /// IPv6 with or without brackets) — before anything is resolved.
    pub fn check_host(&self, host: &str) -> Result<Target, Refusal> {
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return match self.address_rule(ip) {
                Some(rule) => Ok(Target::Address {
                    ip,
                    rule: rule.to_owned(),
                }),
                None => Err(Refusal::IpLiteral { ip }),
            };
        }
        let Some(name) = normalise(host) else {
            return Err(Refusal::InvalidName {
                host: host.to_owned(),
            });
        };
        let rule = self.entries.iter().find_map(|e| match &e.pattern {
            Pattern::Exact(n) if *n == name => Some(&e.rule),
            Pattern::Below(suffix) if name.ends_with(suffix.as_str()) => Some(&e.rule),
            _ => None,
        });
        match rule {
            Some(rule) => Ok(Target::Name {
                name,
                rule: rule.clone(),
            }),
            None => Err(Refusal::NotListed { host: name }),
        }
    }

    /// Whether a resolved address may be connected to: a public address, or one the list
    /// names.
    pub fn answer_allowed(&self, ip: IpAddr) -> bool {
        crate::is_public(ip) || self.address_rule(ip).is_some()
    }

    fn address_rule(&self, ip: IpAddr) -> Option<&str> {
        let ip = canonical(ip);
        self.entries.iter().find_map(|e| match e.pattern {
            Pattern::Address(a) if a == ip => Some(e.rule.as_str()),
            _ => None,
        })
    }
}

/// IPv4-mapped IPv6 as its IPv4 address, so one entry covers both spellings.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn pattern(entry: &str) -> Result<Pattern, NetError> {
    let invalid = |why: &'static str| NetError::InvalidEntry {
        entry: entry.to_owned(),
        why,
    };
    let bare = entry
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(entry);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(Pattern::Address(canonical(ip)));
    }
    if let Some(suffix) = entry.strip_prefix("*.") {
        let suffix = normalise(suffix).ok_or_else(|| invalid("not a host name after `*.`"))?;
        if !suffix.contains('.') {
            return Err(invalid(
                "a wildcard needs at least two labels (`*.example.com`, not `*.com`)",
            ));
        }
        return Ok(Pattern::Below(format!(".{suffix}")));
    }
    if entry.contains('*') {
        return Err(invalid(
            "a wildcard is only `*.` at the start (`*.example.com`)",
        ));
    }
    if entry.contains(':') || entry.contains('/') {
        return Err(invalid(
            "a host name only: no scheme, port or path (`example.com`)",
        ));
    }
    normalise(entry)
        .map(Pattern::Exact)
        .ok_or_else(|| invalid("not a host name"))
}

/// A host name in lower case without a trailing dot, or `None` if it is not one: labels of
/// letters, digits, `-` and `_`, 1–63 bytes each, 253 in all.
fn normalise(host: &str) -> Option<String> {
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let valid = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    valid.then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::parse(entries).unwrap()
    }

    fn rule(l: &AllowList, host: &str) -> Result<String, &'static str> {
        l.check_host(host)
            .map(|t| t.rule().to_owned())
            .map_err(|r| r.rule())
    }

    #[test]
    fn exact_names_match_only_themselves() {
        let l = list(&["a.test"]);
        assert_eq!(rule(&l, "a.test"), Ok("a.test".into()));
        assert_eq!(rule(&l, "A.Test."), Ok("a.test".into()));
        assert_eq!(rule(&l, "b.test"), Err("not-listed"));
        assert_eq!(rule(&l, "x.a.test"), Err("not-listed"));
        assert_eq!(rule(&l, "a.test.evil.example"), Err("not-listed"));
        assert_eq!(rule(&l, "aa.test"), Err("not-listed"));
    }

    #[test]
    fn wildcards_match_names_below_not_the_apex_or_lookalikes() {
        let l = list(&["*.example.com"]);
        assert_eq!(rule(&l, "api.example.com"), Ok("*.example.com".into()));
        assert_eq!(rule(&l, "a.b.example.com"), Ok("*.example.com".into()));
        assert_eq!(rule(&l, "example.com"), Err("not-listed"));
        assert_eq!(rule(&l, "evilexample.com"), Err("not-listed"));
        assert_eq!(rule(&l, "example.com.evil.test"), Err("not-listed"));
    }

    #[test]
    fn groups_expand_and_name_themselves_as_the_rule() {
        let l = list(&["@github", "@npm"]);
        assert_eq!(rule(&l, "api.github.com"), Ok("@github".into()));
        assert_eq!(rule(&l, "registry.npmjs.org"), Ok("@npm".into()));
        assert_eq!(rule(&l, "gist.github.com"), Err("not-listed"));
        assert!(matches!(
            AllowList::parse(["@nope"]),
            Err(NetError::UnknownGroup { .. })
        ));
    }

    #[test]
    fn ip_literals_are_refused_unless_listed() {
        let l = list(&["a.test"]);
        assert_eq!(rule(&l, "127.0.0.1"), Err("ip-literal"));
        assert_eq!(rule(&l, "[::1]"), Err("ip-literal"));
        assert_eq!(rule(&l, "93.184.216.34"), Err("ip-literal"));
        let l = list(&["127.0.0.1", "[::1]"]);
        assert_eq!(rule(&l, "127.0.0.1"), Ok("127.0.0.1".into()));
        assert_eq!(rule(&l, "::1"), Ok("[::1]".into()));
        assert_eq!(rule(&l, "[::ffff:127.0.0.1]"), Ok("127.0.0.1".into()));
    }

    #[test]
    fn answers_must_be_public_unless_listed() {
        let l = list(&["a.test"]);
        assert!(l.answer_allowed("93.184.216.34".parse().unwrap()));
        assert!(!l.answer_allowed("127.0.0.1".parse().unwrap()));
        assert!(!l.answer_allowed("10.0.0.1".parse().unwrap()));
        assert!(!l.answer_allowed("169.254.169.254".parse().unwrap()));
        assert!(!l.answer_allowed("::ffff:10.0.0.1".parse().unwrap()));
        let l = list(&["a.test", "10.0.0.1"]);
        assert!(l.answer_allowed("10.0.0.1".parse().unwrap()));
        assert!(l.answer_allowed("::ffff:10.0.0.1".parse().unwrap()));
        assert!(!l.answer_allowed("10.0.0.2".parse().unwrap()));
    }

    #[test]
    fn malformed_entries_and_names_are_refused() {
        for bad in [
            "",
            "*",
            "*.com",
            "a*.test",
            "http://a.test",
            "a.test:443",
            "a.test/x",
            "a..test",
            "a test",
        ] {
            assert!(AllowList::parse([bad]).is_err(), "{bad:?} parsed");
        }
        let l = list(&["a.test"]);
        for bad in ["", "a..test", "a test", "a.test\0", "é.test"] {
            assert_eq!(rule(&l, bad), Err("invalid-name"), "{bad:?}");
        }
    }

    #[test]
    fn refusals_serialise_tagged_by_their_rule() {
        for refusal in [
            Refusal::NotListed {
                host: "b.test".into(),
            },
            Refusal::InvalidName {
                host: "a..b".into(),
            },
            Refusal::IpLiteral {
                ip: "10.0.0.1".parse().unwrap(),
            },
            Refusal::NonPublicAnswer {
                host: "a.test".into(),
                addresses: vec!["10.0.0.1".parse().unwrap()],
            },
            Refusal::NoAnswer {
                host: "a.test".into(),
                error: "no address".into(),
            },
            Refusal::BadRequest { why: "x".into() },
            Refusal::CredentialPlaceholder {
                credential: "anthropic".into(),
                credential_host: "api.anthropic.com".into(),
                sent_to: "b.test".into(),
            },
            Refusal::UnknownCredential {
                name: "x".into(),
                known: vec!["openai".into()],
            },
        ] {
            let json = serde_json::to_value(&refusal).unwrap();
            assert_eq!(json["rule"], refusal.rule(), "{json}");
            assert_eq!(serde_json::from_value::<Refusal>(json).unwrap(), refusal);
        }
    }

    #[test]
    fn refusals_say_which_rule_and_how_to_allow() {
        let l = list(&["a.test"]);
        let body = l.check_host("b.test").unwrap_err().to_string();
        assert!(body.contains("b.test"), "{body}");
        assert!(body.contains("not-listed"), "{body}");
        assert!(body.contains("--allow-domain b.test"), "{body}");
        let body = Refusal::NonPublicAnswer {
            host: "a.test".into(),
            addresses: vec!["10.0.0.1".parse().unwrap()],
        }
        .to_string();
        assert!(body.contains("--allow-domain 10.0.0.1"), "{body}");
    }
}
