//! A run's network plan: what the native backend's private network namespace holds
//! (docs/security.md, "The network namespace"). Pure data, made once per run from the policy
//! ([`NetPlan::of`]); the namespace itself is `crate::backends::native::netns`.

use std::net::SocketAddr;

use sandbox_policy::Policy;

/// The variable that points the proxy at a DNS server of its own instead of the system's
/// resolver (`HOST:PORT`, UDP): for tests that run their own answerer, and hosts whose
/// resolver the proxy should not use.
pub const DNS_SERVER_VAR: &str = "SANDBOX_DNS_SERVER";

/// The network of a run whose network is not fully open: only loopback inside its own
/// namespace, and what the supervisor relays into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetPlan {
    /// The host's loopback ports forwarded into the namespace (`--allow-port`, the hook
    /// port): a listener on `127.0.0.1:P` inside, relayed to the host's `127.0.0.1:P`.
    pub ports: Vec<u16>,
    /// The domain allow-list's proxy, when the run has one (`--allow-domain`).
    pub proxy: Option<ProxyPlan>,
    /// The variables each command gets, `(NAME, VALUE_TEMPLATE)`, with `{proxy}` replaced by
    /// `127.0.0.1:PORT` of the proxy's listener inside ([`NetPlan::env`]). Only set when the
    /// run has a proxy. More may be added here (a credential's base URL and placeholder).
    pub proxy_env: Vec<(String, String)>,
    /// git's configuration each command gets (`GIT_CONFIG_KEY_n`/`VALUE_n`, added to any it
    /// has), `{proxy}` standing for the proxy's `127.0.0.1:PORT` in keys and values: the
    /// credentials' git routes (`--credential github`: `https://github.com/` remotes to the
    /// proxy's `/cred/github-git`, whose credential helper answers with the placeholder).
    pub git_config: Vec<(String, String)>,
    /// The run's ports published to the host (`--publish`): the supervisor listens on the
    /// host address and connects each connection to `127.0.0.1:INNER_PORT` inside.
    pub publish: Vec<sandbox_policy::Publish>,
}

/// The proxy of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyPlan {
    /// The allow-list's entries as the user wrote them (names, `*.` wildcards, `@group`s,
    /// addresses), parsed by [`sandbox_net::AllowList::parse`].
    pub allow: Vec<String>,
    /// The `--credential`s it serves at `/cred/NAME` (their secrets are read when it starts).
    pub credentials: Vec<String>,
    /// Where the proxy resolves names.
    pub resolver: sandbox_net::Resolver,
    /// The port of its listener inside the namespace (chosen by the supervisor: every port of
    /// a fresh namespace is free, and the variables are then built before the fork).
    pub port: u16,
}

/// The proxy variables every program that honours them reads (curl, git, pip, npm, cargo):
/// both spellings, since tools differ in which they read.
pub fn default_proxy_env() -> Vec<(String, String)> {
    let mut env = Vec::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        env.push((name.to_string(), "http://{proxy}".to_string()));
        env.push((name.to_lowercase(), "http://{proxy}".to_string()));
    }
    for name in ["NO_PROXY", "no_proxy"] {
        env.push((name.to_string(), "localhost,127.0.0.1,::1".to_string()));
    }
    env
}

/// Whether a run of `policy` needs the supervisor's proxy: a domain list, or a credential
/// (whose base URL points at the proxy).
pub fn needs_proxy(policy: &Policy) -> bool {
    sandbox_policy::NetMode::of(policy).proxied()
}

/// git's configuration for the credentials' git routes
/// (`sandbox_net::credentials::Route::git_config`).
fn credential_git_config(names: &[String]) -> Vec<(String, String)> {
    names
        .iter()
        .filter_map(|spec| sandbox_net::credentials::find(sandbox_net::upstream::spec_name(spec)))
        .flat_map(|def| def.git_config())
        .collect()
}

/// The base-URL variables of the credentials (`ANTHROPIC_BASE_URL=http://{proxy}/cred/…`):
/// the templates that name the proxy. Their placeholders are already in the policy's
/// environment (`assembly::apply_credentials`).
fn credential_base_urls(names: &[String]) -> Vec<(String, String)> {
    names
        .iter()
        .filter_map(|spec| sandbox_net::credentials::find(sandbox_net::upstream::spec_name(spec)))
        .flat_map(|def| def.env)
        .filter(|(_, value)| value.contains("{proxy}") && !value.contains("{placeholder}"))
        .collect()
}

impl NetPlan {
    /// The plan of `policy`, or `None` when its network is fully open (no `--block-net`, no
    /// `--allow-domain`): then the run has no namespace of its own. `proxy_port` is where
    /// the proxy listens inside, `resolver` where it resolves.
    pub fn of(
        policy: &Policy,
        proxy_port: u16,
        resolver: sandbox_net::Resolver,
    ) -> Option<NetPlan> {
        // The one computation `why --net` and `policy show` describe too.
        let mode = sandbox_policy::NetMode::of(policy);
        if !mode.namespace {
            return None;
        }
        let proxied = mode.proxied();
        let ports = mode.ports;
        let proxy = proxied.then_some(ProxyPlan {
            allow: mode.domains,
            credentials: mode.credentials,
            resolver,
            port: proxy_port,
        });
        let mut proxy_env = Vec::new();
        let mut git_config = Vec::new();
        if proxy.is_some() {
            proxy_env = default_proxy_env();
            proxy_env.extend(credential_base_urls(&policy.credentials));
            git_config = credential_git_config(&policy.credentials);
        }
        Some(NetPlan {
            ports,
            proxy,
            proxy_env,
            git_config,
            publish: policy.publish.clone(),
        })
    }

    /// Every port the child binds inside, the proxy's first.
    pub fn listeners(&self) -> Vec<u16> {
        self.proxy
            .as_ref()
            .map(|p| p.port)
            .into_iter()
            .chain(self.ports.iter().copied())
            .collect()
    }

    /// [`NetPlan::proxy_env`] with `{proxy}` replaced (empty without a proxy).
    pub fn env(&self) -> Vec<(String, String)> {
        let Some(proxy) = &self.proxy else {
            return Vec::new();
        };
        let at = format!("127.0.0.1:{}", proxy.port);
        self.proxy_env
            .iter()
            .map(|(name, value)| (name.clone(), value.replace("{proxy}", &at)))
            .collect()
    }

    /// [`NetPlan::git_config`] with `{proxy}` replaced (empty without a proxy).
    pub fn git_settings(&self) -> Vec<(String, String)> {
        let Some(proxy) = &self.proxy else {
            return Vec::new();
        };
        let at = format!("127.0.0.1:{}", proxy.port);
        self.git_config
            .iter()
            .map(|(key, value)| (key.replace("{proxy}", &at), value.replace("{proxy}", &at)))
            .collect()
    }

    /// One line for `policy show` and `doctor`.
    pub fn describe(&self) -> String {
        let ports = if self.ports.is_empty() {
            "no host port".to_string()
        } else {
            format!(
                "the host's 127.0.0.1 ports {}",
                self.ports
                    .iter()
                    .map(u16::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let proxy = match &self.proxy {
            Some(p) => {
                let domains = if p.allow.is_empty() {
                    "no domain".to_string()
                } else {
                    format!("the domain allow-list ({})", p.allow.join(", "))
                };
                let credentials = if p.credentials.is_empty() {
                    String::new()
                } else {
                    format!(
                        " and the credentials' hosts at /cred/NAME only ({})",
                        p.credentials.join(", ")
                    )
                };
                format!(
                    "; {domains}{credentials} through the supervisor's proxy at 127.0.0.1:{} \
                     inside (HTTP_PROXY/HTTPS_PROXY/ALL_PROXY set; names resolved by {}; \
                     private answers and IP literals refused unless listed); a program that \
                     ignores the proxy variables reaches nothing",
                    p.port, p.resolver
                )
            }
            None => String::new(),
        };
        let inbound = if self.publish.is_empty() {
            "no inbound connection from the host reaches the run".to_string()
        } else {
            format!(
                "from the host only the published ports reach the run: {}",
                self.publish
                    .iter()
                    .map(|p| format!("{} to port {} inside", p.host(), p.inner_port))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        format!(
            "network namespace: only loopback inside, no route out; {ports} relayed in{proxy}; \
             {inbound}; UDP, raw sockets and abstract unix sockets of the host do not exist \
             inside"
        )
    }
}

/// Where the proxy resolves: [`DNS_SERVER_VAR`] when set (`HOST:PORT`), else the system's
/// resolver. A malformed value is an error naming the variable.
pub fn resolver_from_env() -> Result<sandbox_net::Resolver, String> {
    match std::env::var(DNS_SERVER_VAR) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<SocketAddr>()
            .map(sandbox_net::Resolver::Server)
            .map_err(|e| format!("{DNS_SERVER_VAR}={v}: not an address:port ({e})")),
        _ => Ok(sandbox_net::Resolver::System),
    }
}

/// A port for the proxy's listener inside: above the default ephemeral range (so no
/// connection's own port takes it) and none of `taken`.
pub fn pick_proxy_port(taken: &[u16]) -> u16 {
    let mut bytes = [0u8; 2];
    let _ = getrandom::fill(&mut bytes);
    let mut port = 61000 + u16::from_ne_bytes(bytes) % 4000;
    while taken.contains(&port) {
        port = if port >= 64999 { 61000 } else { port + 1 };
    }
    port
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_policy::NetPolicy;

    fn policy(net: NetPolicy, domains: &[&str], hook: Option<u16>) -> Policy {
        let dir = std::env::temp_dir();
        let mut p = sandbox_policy::build(sandbox_policy::PolicyRequest {
            workdir: dir,
            ..Default::default()
        })
        .unwrap();
        p.net = net;
        p.allow_domains = domains.iter().map(|d| d.to_string()).collect();
        p.hook_port = hook;
        p
    }

    #[test]
    fn an_open_network_has_no_namespace() {
        let r = sandbox_net::Resolver::System;
        assert_eq!(
            NetPlan::of(&policy(NetPolicy::Allow, &[], Some(7)), 1, r),
            None
        );
    }

    #[test]
    fn a_block_forwards_its_ports_and_the_hook_port() {
        let p = policy(
            NetPolicy::Block {
                allow_tcp_ports: vec![3000],
            },
            &[],
            Some(7465),
        );
        let plan = NetPlan::of(&p, 61001, sandbox_net::Resolver::System).unwrap();
        assert_eq!(plan.ports, vec![3000, 7465]);
        assert_eq!(plan.proxy, None);
        assert!(plan.env().is_empty());
        assert_eq!(plan.listeners(), vec![3000, 7465]);
    }

    #[test]
    fn domains_get_the_proxy_and_its_variables_from_the_template() {
        let p = policy(NetPolicy::Allow, &["a.test"], None);
        let mut plan = NetPlan::of(&p, 61002, sandbox_net::Resolver::System).unwrap();
        assert!(plan.ports.is_empty());
        assert_eq!(plan.listeners(), vec![61002]);
        plan.proxy_env
            .push(("EXAMPLE_BASE_URL".into(), "http://{proxy}/example".into()));
        let env = plan.env();
        let get = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        assert_eq!(get("HTTPS_PROXY"), Some("http://127.0.0.1:61002"));
        assert_eq!(get("all_proxy"), Some("http://127.0.0.1:61002"));
        assert_eq!(get("NO_PROXY"), Some("localhost,127.0.0.1,::1"));
        assert_eq!(
            get("EXAMPLE_BASE_URL"),
            Some("http://127.0.0.1:61002/example")
        );
    }

    #[test]
    fn the_proxy_port_avoids_the_forwarded_ones() {
        let taken: Vec<u16> = (61000..65000).collect();
        let mut some = taken.clone();
        some.retain(|p| *p != 64000);
        assert_eq!(pick_proxy_port(&some), 64000);
    }
}
