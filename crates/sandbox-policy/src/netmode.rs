//! The network a run of a policy gets, computed once: the native backend builds its network
//! namespace from it (`NetPlan::of` in sandbox-host), and `sandbox why --net`, `policy show`
//! and their `--json` describe it, so the run and its descriptions cannot disagree.
//!
//! The rules (docs/security.md, "The network namespace"):
//! * no `--block-net`, no `--allow-domain`, no `--credential`: the host's network, open;
//! * `--block-net`: a namespace with only loopback, the `--allow-port`s and the hook port of
//!   the host's loopback relayed in;
//! * `--allow-domain` or `--credential`: a namespace whose way out is the supervisor's proxy
//!   (plus, under `--block-net`, the relayed ports). A credential alone narrows an open
//!   network: its proxy on the host's loopback would lend the key to every local process, so
//!   the proxy is the only way out, and it lets through only the listed domains (none) and
//!   the credentials' own hosts at `/cred/NAME`.

use serde::Serialize;

use crate::model::{NetPolicy, Policy};

/// How a run reaches the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NetModeKind {
    /// The host's network, unfiltered.
    Open,
    /// Its own namespace, no proxy: only the relayed loopback ports.
    Blocked,
    /// Its own namespace, the proxy the way out (the domain list, the credentials' hosts).
    Proxied,
}

/// The network of a run of one policy, as the native backend enforces it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetMode {
    pub mode: NetModeKind,
    /// Whether the run has a network namespace of its own.
    pub namespace: bool,
    /// The host's loopback ports relayed into the namespace (`--allow-port`, the hook port).
    pub ports: Vec<u16>,
    /// The proxy's domain allow-list (`--allow-domain`), as written.
    pub domains: Vec<String>,
    /// The credentials the proxy serves at `/cred/NAME` (`--credential`), as written.
    pub credentials: Vec<String>,
    /// `--credential` turned a network that was open into the proxy's narrow one: nothing
    /// but the credentials' hosts (the run-start notice, `why --net`).
    pub narrowed_by_credential: bool,
}

impl NetMode {
    /// The network of a run of `policy`.
    pub fn of(policy: &Policy) -> NetMode {
        let proxied = !policy.allow_domains.is_empty() || !policy.credentials.is_empty();
        let (mode, ports) = match (&policy.net, proxied) {
            (NetPolicy::Block { .. }, _) => (
                if proxied {
                    NetModeKind::Proxied
                } else {
                    NetModeKind::Blocked
                },
                policy.net.open_ports(policy.hook_port).unwrap_or_default(),
            ),
            // Open network but a domain list or a credential: only the proxy (and the hook).
            (NetPolicy::Allow, true) => {
                (NetModeKind::Proxied, policy.hook_port.into_iter().collect())
            }
            (NetPolicy::Allow, false) => (NetModeKind::Open, Vec::new()),
        };
        NetMode {
            mode,
            namespace: mode != NetModeKind::Open,
            ports,
            domains: policy.allow_domains.clone(),
            credentials: policy.credentials.clone(),
            narrowed_by_credential: matches!(policy.net, NetPolicy::Allow)
                && policy.allow_domains.is_empty()
                && !policy.credentials.is_empty(),
        }
    }

    /// Whether the run has the supervisor's proxy.
    pub fn proxied(&self) -> bool {
        self.mode == NetModeKind::Proxied
    }

    /// One line for `policy show`'s `network` row.
    pub fn summary(&self) -> String {
        let ports = if self.ports.is_empty() {
            "none".to_string()
        } else {
            self.ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self.mode {
            NetModeKind::Open => "open".into(),
            NetModeKind::Blocked => format!(
                "blocked: a network namespace of its own, only the host's loopback ports \
                 relayed in ({ports})"
            ),
            NetModeKind::Proxied => {
                let mut out = vec![];
                if self.narrowed_by_credential {
                    out.push(format!(
                        "narrowed by --credential {}: not open",
                        self.credentials.join(" --credential ")
                    ));
                }
                let mut through = Vec::new();
                if !self.domains.is_empty() {
                    through.push(format!("the allow-list ({})", self.domains.join(", ")));
                } else {
                    through.push("no domain (no --allow-domain)".into());
                }
                if !self.credentials.is_empty() {
                    through.push(format!(
                        "the credentials' hosts at /cred/NAME ({})",
                        self.credentials.join(", ")
                    ));
                }
                out.push(format!(
                    "a network namespace of its own whose only way out is the proxy: {}; the \
                     host's loopback ports relayed in: {ports}",
                    through.join(", and ")
                ));
                out.join("; ")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(net: NetPolicy, domains: &[&str], creds: &[&str], hook: Option<u16>) -> Policy {
        let mut p = crate::build(crate::PolicyRequest {
            workdir: std::env::temp_dir(),
            ..Default::default()
        })
        .unwrap();
        p.net = net;
        p.allow_domains = domains.iter().map(|d| d.to_string()).collect();
        p.credentials = creds.iter().map(|d| d.to_string()).collect();
        p.hook_port = hook;
        p
    }

    #[test]
    fn a_credential_alone_narrows_an_open_network_to_the_proxy() {
        let open = NetMode::of(&policy(NetPolicy::Allow, &[], &[], Some(7)));
        assert_eq!(open.mode, NetModeKind::Open);
        assert!(!open.namespace && open.ports.is_empty());
        assert_eq!(open.summary(), "open");

        let cred = NetMode::of(&policy(NetPolicy::Allow, &[], &["anthropic"], Some(7)));
        assert_eq!(cred.mode, NetModeKind::Proxied);
        assert!(cred.namespace && cred.narrowed_by_credential);
        assert_eq!(cred.ports, vec![7]);
        assert!(cred
            .summary()
            .contains("narrowed by --credential anthropic"));
        assert!(cred.summary().contains("no domain"), "{}", cred.summary());

        // With a domain list the user asked for a narrow network: not "narrowed".
        let both = NetMode::of(&policy(NetPolicy::Allow, &["a.test"], &["anthropic"], None));
        assert!(both.proxied() && !both.narrowed_by_credential);
        assert!(both.summary().contains("(a.test)"), "{}", both.summary());
    }

    #[test]
    fn a_block_keeps_its_ports_with_or_without_a_proxy() {
        let block = NetPolicy::Block {
            allow_tcp_ports: vec![3000],
        };
        let blocked = NetMode::of(&policy(block.clone(), &[], &[], Some(7)));
        assert_eq!(blocked.mode, NetModeKind::Blocked);
        assert_eq!(blocked.ports, vec![7, 3000]);
        let proxied = NetMode::of(&policy(block, &[], &["github"], Some(7)));
        assert_eq!(proxied.mode, NetModeKind::Proxied);
        assert_eq!(proxied.ports, vec![7, 3000]);
        assert!(!proxied.narrowed_by_credential);
        let json = serde_json::to_value(&proxied).unwrap();
        assert_eq!(json["mode"], "proxied");
        assert_eq!(json["narrowedByCredential"], false);
    }
}
