//! `sandbox why PATH`: whether a path is visible and writable in the next run, and why —
//! asked of the policy and private view a run with these options would get
//! ([`sandbox_policy::why::explain`]). Nothing is run or created.

use std::path::{Path, PathBuf};

use sandbox_host::seam::BackendKind;
use sandbox_policy::why::{explain, Explanation};
use sandbox_policy::{NetMode, NetModeKind};

use crate::cli::args::WhyArgs;
use crate::config::expand_home;
use crate::context::Context;
use crate::session::Session;

/// `path` made absolute (`~` expanded, relative to the current directory) and resolved as
/// far as it exists: grants and the view name canonical paths.
fn resolve(path: &Path) -> PathBuf {
    let path = expand_home(path);
    let path = if path.is_absolute() {
        path
    } else {
        std::env::current_dir()
            .map(|d| d.join(&path))
            .unwrap_or(path)
    };
    let mut rest = Vec::new();
    for ancestor in path.ancestors() {
        if let Ok(canonical) = std::fs::canonicalize(ancestor) {
            return rest.iter().rev().fold(canonical, |p: PathBuf, c| p.join(c));
        }
        match ancestor.file_name() {
            Some(name) => rest.push(name.to_os_string()),
            None => break,
        }
    }
    path
}

pub fn run(args: WhyArgs, ctx: &Context) -> anyhow::Result<i32> {
    let session = Session::open(&args.sandbox, ctx, false, None)?;
    if let Some(host) = &args.net {
        return net(&session, host, args.json);
    }
    let Some(path) = &args.path else {
        anyhow::bail!("sandbox why: name a PATH, or --net HOST");
    };
    let path = resolve(path);
    let (answer, note) = match session.kind {
        BackendKind::Host => (
            Explanation {
                path: path.clone(),
                visible: path.symlink_metadata().is_ok(),
                writable: path.symlink_metadata().is_ok(),
                decided_by: "the host backend: no isolation (your own permissions decide)".into(),
                because: Vec::new(),
                shows_instead: None,
            },
            None,
        ),
        BackendKind::Native => {
            let forms =
                sandbox_host::backends::native::native_forms(&session.policy, &session.options);
            match &forms.view {
                Some(Ok(view)) => (explain(&session.policy, Some(view), &path), None),
                Some(Err(e)) => (
                    explain(&session.policy, None, &path),
                    Some(format!(
                        "the private view cannot be compiled ({e}): by the grants"
                    )),
                ),
                None => (
                    explain(&session.policy, None, &path),
                    Some("no private view on this machine: the kernel's path rules decide".into()),
                ),
            }
        }
        other => (
            explain(&session.policy, None, &path),
            Some(format!("{other}: by the policy's grants")),
        ),
    };
    if args.json {
        let out = serde_json::json!({
            "backend": session.kind.as_str(),
            "path": answer.path,
            "visible": answer.visible,
            "writable": answer.writable,
            "decidedBy": answer.decided_by,
            "because": answer.because,
            "note": note,
            "hostFileVisible": answer.shows_instead.is_none() && answer.visible,
            "insteadShows": answer.shows_instead.as_ref().map(|(at, _)| at),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(0);
    }
    let state = match (answer.visible, answer.writable) {
        (false, _) => "not visible",
        (true, false) => "visible, read-only",
        (true, true) => "visible and writable",
    };
    match &answer.shows_instead {
        // The user's file first: what matters is that it is not there, not that the path is.
        Some((instead, why)) => println!(
            "{}: your file is not visible in the next run ({}); inside, that path is {} ({why}, \
             {})",
            answer.path.display(),
            session.kind,
            instead.display(),
            if answer.writable {
                "writable"
            } else {
                "read-only"
            }
        ),
        None => println!(
            "{}: {state} in the next run ({})",
            answer.path.display(),
            session.kind
        ),
    }
    println!("  decided by: {}", answer.decided_by);
    for line in &answer.because {
        println!("  because:    {line}");
    }
    if let Some(note) = note {
        println!("  note:       {note}");
    }
    Ok(0)
}

/// The answer of `sandbox why --net`.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct NetAnswer {
    host: String,
    port: Option<u16>,
    allowed: bool,
    /// The rule that decided: an allow-list entry (`a.test`, `*.example.com`, `@github`),
    /// `credential:NAME`, `--allow-port P`, `hook-port`, `open`, or the refusing rule
    /// (`not-listed`, `ip-literal`, `blocked`, `own-loopback`).
    rule: String,
    explanation: String,
}

/// `HOST`, `HOST:PORT` or `[V6]:PORT`.
fn split_host(target: &str) -> (String, Option<u16>) {
    if let Some(rest) = target.strip_prefix('[') {
        if let Some((host, port)) = rest.split_once("]:") {
            return (format!("[{host}]"), port.parse().ok());
        }
        return (target.to_string(), None);
    }
    match target.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => match port.parse() {
            Ok(port) => (host.to_string(), Some(port)),
            Err(_) => (target.to_string(), None),
        },
        _ => (target.to_string(), None),
    }
}

/// What the next run's policy says of `target`, by the rules the native backend enforces:
/// its network is [`NetMode::of`] the policy, the very value the run builds its namespace
/// and proxy from (nono's proxy takes the same list).
fn explain_net(policy: &sandbox_policy::Policy, kind: BackendKind, target: &str) -> NetAnswer {
    let (host, port) = split_host(target);
    let answer = |allowed: bool, rule: String, explanation: String| NetAnswer {
        host: host.clone(),
        port,
        allowed,
        rule,
        explanation,
    };
    if kind == BackendKind::Host {
        return answer(
            true,
            "host".into(),
            "the host backend confines nothing: every host is reachable".into(),
        );
    }
    let mode = NetMode::of(policy);
    let narrowed = if mode.narrowed_by_credential {
        format!(
            "--credential {} narrows the network: the run's only way out is the credential \
             proxy. ",
            mode.credentials
                .iter()
                .map(|s| sandbox_net::upstream::spec_name(s))
                .collect::<Vec<_>>()
                .join(" --credential ")
        )
    } else {
        String::new()
    };
    // A credential's host first: the proxy reaches it whatever it is (a loopback gateway too).
    if mode.proxied() {
        if let Some(found) = credential_route(&mode, &host, port, &narrowed, &answer) {
            return found;
        }
    }
    let loopback = matches!(host.as_str(), "localhost" | "127.0.0.1" | "[::1]" | "::1");
    if loopback && mode.namespace {
        if let Some(port) = port.filter(|p| mode.ports.contains(p)) {
            let rule = if policy.hook_port == Some(port) {
                "hook-port".to_string()
            } else {
                format!("--allow-port {port}")
            };
            return answer(
                true,
                rule,
                format!(
                    "port {port} of the host's loopback is relayed into the run's network \
                     namespace"
                ),
            );
        }
        return answer(
            false,
            "own-loopback".into(),
            format!(
                "{narrowed}{host} inside is the run's own loopback (its own servers answer \
                 there), not the host's; the host's ports relayed in: {}. To reach a host \
                 port P, run with --block-net --allow-port P",
                list(&mode.ports)
            ),
        );
    }
    match mode.mode {
        NetModeKind::Open => answer(
            true,
            "open".into(),
            "the network is open (no --block-net, no --allow-domain, no --credential): every \
             host is reachable"
                .into(),
        ),
        NetModeKind::Blocked => answer(
            false,
            "blocked".into(),
            format!(
                "--block-net: the run has no route out; only the host's loopback ports \
                 relayed in are reachable ({}). To reach {host}, run with --allow-domain \
                 {host}",
                list(&mode.ports)
            ),
        ),
        NetModeKind::Proxied => through_proxy(&mode, &host, &narrowed, answer),
    }
}

/// `host` when it is one of the credentials' hosts: reached through its base URL; directly
/// only if the allow-list says so.
fn credential_route(
    mode: &NetMode,
    host: &str,
    port: Option<u16>,
    narrowed: &str,
    answer: &impl Fn(bool, String, String) -> NetAnswer,
) -> Option<NetAnswer> {
    let bare = host.trim_matches(['[', ']']);
    let matches = |h: &str, p: u16| h.eq_ignore_ascii_case(bare) && port.is_none_or(|q| q == p);
    // The definition's own host, or another of its routes (GitHub's git host).
    let (def, route) = mode.credentials.iter().find_map(|spec| {
        let def = sandbox_net::credentials::definition_for_run(spec).ok()?;
        if matches(&def.host, def.port) {
            return Some((def, None));
        }
        let route = def
            .routes
            .iter()
            .find(|r| matches(&r.host, r.port))?
            .clone();
        Some((def, Some(route)))
    })?;
    let direct = match sandbox_net::AllowList::parse(&mode.domains).map(|l| l.check_host(host)) {
        Ok(Ok(target)) => format!(
            "a direct connection is allowed too (allow-list entry {})",
            target.rule()
        ),
        Ok(Err(refusal)) => format!(
            "a direct connection to it (HTTPS_PROXY, CONNECT) is refused (rule {}): the key \
             is only added on the base URL's path",
            refusal.rule()
        ),
        Err(e) => format!("the allow-list: {e}"),
    };
    let (url, through, tls) = match &route {
        None => (
            def.upstream_url(),
            format!(
                "${} (the proxy's /cred/{})",
                def.base_url_var().unwrap_or("its base URL"),
                def.name
            ),
            def.tls,
        ),
        Some(r) => (r.upstream_url(), r.reached_by(), r.tls),
    };
    Some(answer(
        true,
        format!("credential:{}", def.name),
        format!(
            "{narrowed}{url} is reached through {through}, which adds the host's key on the \
             way ({}); {direct}",
            if tls {
                "over TLS"
            } else {
                "plain HTTP on the host's loopback"
            }
        ),
    ))
}

/// `host` under the proxy: the allow-list's decision for a connection through it
/// (`CONNECT`, plain HTTP, SOCKS).
fn through_proxy(
    mode: &NetMode,
    host: &str,
    narrowed: &str,
    answer: impl Fn(bool, String, String) -> NetAnswer,
) -> NetAnswer {
    let list = match sandbox_net::AllowList::parse(&mode.domains) {
        Ok(list) => list,
        Err(e) => return answer(false, "bad-list".into(), format!("the allow-list: {e}")),
    };
    match list.check_host(host) {
        Ok(target) => answer(
            true,
            target.rule().to_string(),
            format!(
                "allowed by the domain allow-list entry {}, through the run's proxy \
                 (HTTP_PROXY/HTTPS_PROXY); the proxy resolves the name itself and refuses an \
                 answer that is not a public address unless the list names it",
                target.rule()
            ),
        ),
        Err(refusal) => answer(
            false,
            refusal.rule().to_string(),
            format!("{narrowed}{refusal}"),
        ),
    }
}

fn list(ports: &[u16]) -> String {
    if ports.is_empty() {
        "none".to_string()
    } else {
        ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn net(session: &Session, target: &str, json: bool) -> anyhow::Result<i32> {
    let answer = explain_net(&session.policy, session.kind, target);
    if json {
        let mut out = serde_json::to_value(&answer)?;
        out["backend"] = serde_json::Value::from(session.kind.as_str());
        // The network the run would get, as `policy show --json` gives it.
        if session.kind != BackendKind::Host {
            out["network"] = serde_json::to_value(NetMode::of(&session.policy))?;
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(0);
    }
    println!(
        "{target}: {} in the next run ({})",
        if answer.allowed {
            "reachable"
        } else {
            "not reachable"
        },
        session.kind
    );
    println!("  rule:       {}", answer.rule);
    println!("  because:    {}", answer.explanation);
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_split_from_their_ports() {
        assert_eq!(split_host("a.test"), ("a.test".into(), None));
        assert_eq!(split_host("a.test:443"), ("a.test".into(), Some(443)));
        assert_eq!(split_host("[::1]:80"), ("[::1]".into(), Some(80)));
        assert_eq!(split_host("::1"), ("::1".into(), None));
    }
}
