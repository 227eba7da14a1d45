//! What the user needs to know about a policy before it runs, in one place for every runner:
//! a grant that exposes credential files (through the one list, [`sandbox_policy::secrets`]),
//! and an `--env NAME` that passes nothing because `NAME` is unset.

use std::path::{Path, PathBuf};

use sandbox_policy::secrets;
use sandbox_policy::{GrantReason, Policy};

/// How deep a granted directory is searched for credential files that may lie anywhere
/// (`.npmrc`, a `.cargo/credentials.toml`). The home-anchored ones (`~/.ssh`, `~/.aws`) are
/// found at any depth by name.
const SEARCH_DEPTH: usize = 3;

/// One grant the user asked for that exposes credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exposure {
    pub grant: PathBuf,
    pub writable: bool,
    pub reason: GrantReason,
    /// The credential files or directories it puts within reach, with what each holds.
    pub secrets: Vec<(PathBuf, &'static str)>,
}

impl Exposure {
    /// `the grant ~ (--allow-read) makes readable inside: ~/.ssh (SSH private keys), …`.
    pub fn message(&self, home: &Path) -> String {
        let show = |p: &Path| match p.strip_prefix(home) {
            Ok(rest) if rest.as_os_str().is_empty() => "~".to_string(),
            Ok(rest) => format!("~/{}", rest.display()),
            Err(_) => p.display().to_string(),
        };
        let listed: Vec<String> = self
            .secrets
            .iter()
            .map(|(p, what)| format!("{} ({what})", show(p)))
            .collect();
        format!(
            "the {} grant {} ({}) makes {} inside: {}; grant a narrower path",
            if self.writable { "writable" } else { "read" },
            show(&self.grant),
            self.reason.as_str(),
            if self.writable {
                "these readable and writable"
            } else {
                "these readable"
            },
            listed.join(", ")
        )
    }
}

/// The grants from the command line or the configuration that put credential files within
/// the sandbox's reach (`--allow-read ~`, a directory holding `.ssh` or `.aws`, a
/// `credentials.toml`), each with what it exposes. Profiles' and toolchains' own grants are
/// not judged here: a profile grants its agent's login on purpose, a toolchain's secrets are
/// masked.
pub fn exposed_secrets(policy: &Policy, home: &Path) -> Vec<Exposure> {
    let grants = policy
        .fs
        .write
        .iter()
        .map(|g| (g, true))
        .chain(policy.fs.read.iter().map(|g| (g, false)))
        .filter(|(g, _)| matches!(g.reason, GrantReason::User | GrantReason::Config));
    let mut out = Vec::new();
    for (grant, writable) in grants {
        let mut found: Vec<(PathBuf, &'static str)> = Vec::new();
        // Home-anchored secrets at or below the grant, by name.
        if let Ok(rel) = grant.path.strip_prefix(home) {
            for (secret, kind) in secrets::home_secrets_under(rel) {
                let path = home.join(&secret);
                if path.symlink_metadata().is_ok() {
                    found.push((path, kind.what));
                }
            }
        }
        // The grant itself, or what lies in it a few levels down (`.npmrc`, `.netrc`).
        for hit in crate::assembly::home::scan_secrets(home, &grant.path, SEARCH_DEPTH) {
            if !found.iter().any(|(p, _)| hit.path.starts_with(p)) {
                found.push((hit.path, hit.kind.what));
            }
        }
        if !found.is_empty() {
            found.sort();
            found.dedup();
            out.push(Exposure {
                grant: grant.path.clone(),
                writable,
                reason: grant.reason,
                secrets: found,
            });
        }
    }
    out
}

/// The notice of a run whose open network `--credential` narrows (`sandbox_policy::NetMode`,
/// the rule the run enforces): which hosts stay reachable, and how to widen it. `None` when
/// the network was not open or a domain list already narrowed it.
pub fn credential_narrowing(policy: &Policy) -> Option<String> {
    let mode = sandbox_policy::NetMode::of(policy);
    if !mode.narrowed_by_credential {
        return None;
    }
    let hosts: Vec<String> = mode
        .credentials
        .iter()
        .flat_map(
            |spec| match sandbox_net::credentials::definition_for_run(spec) {
                Ok(def) => std::iter::once(format!(
                    "{} (through ${})",
                    def.upstream_url(),
                    def.base_url_var().unwrap_or("its base URL")
                ))
                .chain(
                    def.routes
                        .iter()
                        .map(|r| format!("{} (through {})", r.upstream_url(), r.reached_by())),
                )
                .collect::<Vec<_>>(),
                Err(_) => vec![spec.clone()],
            },
        )
        .collect();
    let names: Vec<&str> = mode
        .credentials
        .iter()
        .map(|s| sandbox_net::upstream::spec_name(s))
        .collect();
    Some(format!(
        "--credential {} narrows the network: the run gets a network namespace of its own \
         whose only way out is the credential proxy, which reaches {} and no other host (a \
         request elsewhere gets 403, rule not-listed). To reach more, add --allow-domain HOST \
         (or a group: @github, @npm, @pypi…); `sandbox why --net HOST --credential {}` says \
         what a host gets",
        names.join(" --credential "),
        hosts.join(", "),
        names.join(" --credential ")
    ))
}

/// `--env NAME` (pass, no value) for each `NAME` unset in `from`: the command will not see it.
pub fn unset_passed_vars(args: &[String], is_set: impl Fn(&str) -> bool) -> Vec<String> {
    args.iter()
        .filter(|a| !a.contains('='))
        .filter(|name| !is_set(name))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_policy::PolicyRequest;

    fn policy(work: &Path, read: &[&Path], write: &[&Path]) -> Policy {
        sandbox_policy::build(PolicyRequest {
            workdir: work.to_path_buf(),
            allow_read: read
                .iter()
                .map(|p| (p.to_path_buf(), GrantReason::User))
                .collect(),
            allow_write: write
                .iter()
                .map(|p| (p.to_path_buf(), GrantReason::Config))
                .collect(),
            system_read: Some(vec![]),
            devices: Some(vec![]),
            ..PolicyRequest::default()
        })
        .unwrap()
    }

    #[test]
    fn a_credential_that_narrows_an_open_network_says_so_and_how_to_widen_it() {
        let work = tempfile::tempdir().unwrap();
        let mut p = policy(work.path(), &[], &[]);
        assert_eq!(credential_narrowing(&p), None);
        p.credentials = vec!["anthropic".into(), "google=http://127.0.0.1:4000".into()];
        let notice = credential_narrowing(&p).unwrap();
        for want in [
            "--credential anthropic --credential google narrows the network",
            "https://api.anthropic.com:443 (through $ANTHROPIC_BASE_URL)",
            "http://127.0.0.1:4000 (through $GOOGLE_GEMINI_BASE_URL)",
            "--allow-domain HOST",
        ] {
            assert!(notice.contains(want), "{want}: {notice}");
        }
        // A domain list, or a blocked network: the user already chose a narrow one.
        p.allow_domains = vec!["a.test".into()];
        assert_eq!(credential_narrowing(&p), None);
        p.allow_domains.clear();
        p.net = sandbox_policy::NetPolicy::Block {
            allow_tcp_ports: vec![],
        };
        assert_eq!(credential_narrowing(&p), None);
    }

    #[test]
    fn a_grant_that_holds_credentials_names_them() {
        let dir = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(dir.path()).unwrap();
        let work = home.join("work");
        for d in [".ssh", ".aws", "work", "src/app", ".cargo/registry"] {
            std::fs::create_dir_all(home.join(d)).unwrap();
        }
        std::fs::write(home.join(".ssh/id_ed25519"), "key").unwrap();
        std::fs::write(home.join(".cargo/credentials.toml"), "token").unwrap();
        std::fs::write(home.join("src/app/.npmrc"), "//registry/:_authToken=x").unwrap();

        // `--allow-read ~`: every one of them, named.
        let p = policy(&work, &[&home], &[]);
        let found = exposed_secrets(&p, &home);
        assert_eq!(found.len(), 1, "{found:?}");
        let names: Vec<&Path> = found[0].secrets.iter().map(|(p, _)| p.as_path()).collect();
        for want in [".ssh", ".aws", ".cargo/credentials.toml", "src/app/.npmrc"] {
            assert!(
                names.contains(&home.join(want).as_path()),
                "{want}: {names:?}"
            );
        }
        let message = found[0].message(&home);
        assert!(
            message.contains("read grant ~ (granted on the command line)")
                && message.contains("~/.ssh (")
                && message.contains("narrower"),
            "{message}"
        );
        // A writable grant of ~/.cargo (the README's old example): the credentials file.
        let p = policy(&work, &[], &[&home.join(".cargo")]);
        let found = exposed_secrets(&p, &home);
        assert_eq!(
            found[0]
                .secrets
                .iter()
                .map(|(p, _)| p.clone())
                .collect::<Vec<_>>(),
            [home.join(".cargo/credentials.toml")]
        );
        assert!(found[0].writable && found[0].message(&home).contains("writable"));
        // A grant that holds none: silent; the worktree itself is never judged.
        let p = policy(&work, &[&home.join(".cargo/registry")], &[]);
        assert!(exposed_secrets(&p, &home).is_empty());
        let p = policy(&home.join("src"), &[], &[]);
        assert!(exposed_secrets(&p, &home).is_empty());
    }

    #[test]
    fn only_passed_names_that_are_unset_are_reported() {
        let args = vec![
            "SET".to_string(),
            "UNSET".to_string(),
            "GIVEN=value".to_string(),
        ];
        assert_eq!(unset_passed_vars(&args, |n| n == "SET"), ["UNSET"]);
    }
}
