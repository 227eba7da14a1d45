//! Policy → a fully resolved nono capability manifest (schema `0.1.0`, read by
//! `nono wrap -c FILE` and `nono run -c FILE` of the pinned nono 0.81), plus the way nono must
//! be invoked to enforce it.
//!
//! The mapping, field by field (`docs/backends.md` has the table):
//!
//! * `fs.system_read`, `fs.read` → `filesystem.grants` with `access: read`;
//!   `fs.write` (worktree, git data, TMPDIR, grants) → `readwrite`; `fs.devices` → `readwrite`.
//!   Each grant says whether it is a `file` or a `directory` (nono refuses the wrong one).
//! * `net: allow` → `network.mode: unrestricted`; `net: block` → `blocked` with the open TCP
//!   ports (allowed ports and the hook port) in `ports.connect` and `ports.bind`.
//! * `allow_domains` → `network.mode: proxy` with `allow_domains`: everything else is denied
//!   and the listed hosts are reachable through nono's filtering proxy. The proxy needs nono
//!   to stay as the parent, so such a run uses `nono run` instead of `nono wrap`.
//! * `process`: signals and process inspection limited to the same sandbox, abstract unix
//!   sockets scoped (`ipc_mode: shared_memory_only`), as the native backend does.
//! * `rollback.enabled: false`. Audit, prompts and the trust scan are turned off on the
//!   command line ([`NonoInvocation::flags`]), since the manifest has no field for them.
//!
//! Git protection is the native backend's: nono enforces with Landlock on Linux, which cannot
//! make a subdirectory of a writable directory read-only, and the manifest's `deny` list is not
//! enforced by nono's CLI. So a main worktree is refused here too (unless
//! `--unprotected-git`), and the linked-worktree layout is expressed with grants alone.
//!
//! nono expands `~`, `$HOME`, `$WORKDIR`, `$TMPDIR`, `$UID` and `$XDG_*` in manifest paths,
//! so a path containing `$` (or starting with `~`) is refused rather than let nono read it as
//! something else.

use std::path::Path;

use serde::Serialize;

use crate::error::PolicyError;
use crate::model::{NetPolicy, Policy};

/// The manifest schema version nono 0.81 accepts (`"const": "0.1.0"` in its schema).
pub const MANIFEST_VERSION: &str = "0.1.0";

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Manifest {
    pub version: &'static str,
    pub filesystem: Filesystem,
    pub network: Network,
    pub process: Process,
    pub rollback: Rollback,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Filesystem {
    pub grants: Vec<FsGrant>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FsGrant {
    pub path: String,
    pub access: Access,
    #[serde(rename = "type")]
    pub kind: EntryKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    Read,
    Readwrite,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    File,
    Directory,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Network {
    pub mode: NetworkMode,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow_domains: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ports: Option<Ports>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    Unrestricted,
    Blocked,
    Proxy,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ports {
    pub connect: Vec<u16>,
    pub bind: Vec<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Process {
    pub signal_mode: &'static str,
    pub process_info_mode: &'static str,
    pub ipc_mode: &'static str,
    pub exec_strategy: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rollback {
    pub enabled: bool,
}

/// Which nono subcommand runs the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NonoInvocation {
    /// `nono wrap`: apply the sandbox and exec the command; nono disappears.
    Wrap,
    /// `nono run`: nono stays as the supervising parent (needed for the domain proxy).
    Run,
}

impl NonoInvocation {
    /// nono's arguments before `-c FILE -- COMMAND…`: its subcommand and every switch that
    /// turns off what the manifest cannot (banner and status output, interactive prompts,
    /// rollback snapshots, the audit trail, the instruction-file trust scan of the working
    /// directory, the diagnostic footer).
    pub fn flags(self) -> &'static [&'static str] {
        match self {
            // wrap execs directly: no prompts, snapshots, audit or trust scan to turn off.
            NonoInvocation::Wrap => &["wrap", "--silent", "--no-diagnostics"],
            NonoInvocation::Run => &[
                "run",
                "--silent",
                "--no-diagnostics",
                "--no-rollback",
                "--no-rollback-prompt",
                "--no-audit",
                "--trust-override",
            ],
        }
    }
}

/// The compiled form: the manifest and how to run it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NonoPlan {
    pub invocation: NonoInvocation,
    pub manifest: Manifest,
}

impl NonoPlan {
    /// The manifest as nono reads it. Serialising cannot fail: the manifest is derived plain
    /// data with string keys; a failure would be a bug in its types.
    #[allow(clippy::expect_used)] // see the doc
    pub fn manifest_json(&self) -> String {
        serde_json::to_string_pretty(&self.manifest).expect("the manifest is plain data")
    }
}

fn path_string(path: &Path) -> Result<String, PolicyError> {
    let Some(text) = path.to_str() else {
        return Err(PolicyError::Unsupported {
            backend: "nono",
            what: format!("the path {}", path.display()),
            why: "it is not valid UTF-8, and nono's manifest is JSON text".into(),
        });
    };
    if text.contains('$') || text.starts_with('~') || !path.is_absolute() {
        return Err(PolicyError::Unsupported {
            backend: "nono",
            what: format!("the path {text}"),
            why: "nono expands `~` and `$VARIABLES` in manifest paths, so it would grant a \
                  different path; rename it or use --backend native"
                .into(),
        });
    }
    Ok(text.to_string())
}

/// Compiles `policy`. `is_dir` says whether a granted path is a directory (the one question
/// the manifest needs answered from the filesystem; the caller asks it, tests fake it).
pub fn compile(policy: &Policy, is_dir: &dyn Fn(&Path) -> bool) -> Result<NonoPlan, PolicyError> {
    if let Some(problem) = policy.git_protection_problem() {
        return Err(PolicyError::UnprotectedGit(problem));
    }
    let mut grants: Vec<FsGrant> = Vec::new();
    let mut push = |path: &Path, access: Access| -> Result<(), PolicyError> {
        let text = path_string(path)?;
        let kind = if is_dir(path) {
            EntryKind::Directory
        } else {
            EntryKind::File
        };
        // A path granted twice keeps its widest access.
        if let Some(existing) = grants.iter_mut().find(|g| g.path == text) {
            if access == Access::Readwrite {
                existing.access = Access::Readwrite;
            }
            return Ok(());
        }
        grants.push(FsGrant {
            path: text,
            access,
            kind,
        });
        Ok(())
    };
    for dir in &policy.fs.system_read {
        push(dir, Access::Read)?;
    }
    for grant in &policy.fs.read {
        push(&grant.path, Access::Read)?;
    }
    for grant in &policy.fs.write {
        push(&grant.path, Access::Readwrite)?;
    }
    for dev in &policy.fs.devices {
        push(dev, Access::Readwrite)?;
    }

    let proxied = !policy.allow_domains.is_empty();
    let network = match (&policy.net, proxied) {
        (NetPolicy::Allow, false) => Network {
            mode: NetworkMode::Unrestricted,
            allow_domains: Vec::new(),
            ports: None,
        },
        (net, _) => {
            // Under a block every open port is listed; under a domain allow-list on an
            // otherwise open network, only the hook port stays directly reachable.
            let ports = match net {
                NetPolicy::Block { .. } => net.open_ports(policy.hook_port).unwrap_or_default(),
                NetPolicy::Allow => policy.hook_port.into_iter().collect(),
            };
            Network {
                mode: if proxied {
                    NetworkMode::Proxy
                } else {
                    NetworkMode::Blocked
                },
                allow_domains: policy.allow_domains.clone(),
                ports: (!ports.is_empty()).then(|| Ports {
                    connect: ports.clone(),
                    bind: ports,
                }),
            }
        }
    };
    let invocation = if proxied {
        NonoInvocation::Run
    } else {
        NonoInvocation::Wrap
    };
    Ok(NonoPlan {
        invocation,
        manifest: Manifest {
            version: MANIFEST_VERSION,
            filesystem: Filesystem { grants },
            network,
            process: Process {
                signal_mode: "allow_same_sandbox",
                process_info_mode: "allow_same_sandbox",
                ipc_mode: "shared_memory_only",
                exec_strategy: match invocation {
                    NonoInvocation::Wrap => "direct",
                    NonoInvocation::Run => "supervised",
                },
            },
            rollback: Rollback { enabled: false },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::EnvPolicy;
    use crate::model::{FsPolicy, GitLayout, Grant, GrantReason, Limits, Workspace};
    use std::path::PathBuf;

    fn policy() -> Policy {
        Policy {
            workspace: Workspace {
                root: "/w/task".into(),
                cwd: "/w/task".into(),
                git: Some(GitLayout {
                    is_linked: true,
                    common_dir: "/w/repo/.git".into(),
                    worktree_gitdir: "/w/repo/.git/worktrees/task".into(),
                    worktree_config: false,
                    pointers: vec![],
                    task_branch: None,
                    hooks_path: None,
                    push_remotes: Vec::new(),
                    absent_pointers: Vec::new(),
                    allow_nested_git: false,
                }),
                host_files: Vec::new(),
            },
            fs: FsPolicy {
                read: vec![Grant {
                    path: "/w/repo/.git".into(),
                    reason: GrantReason::GitReadOnly,
                }],
                write: vec![
                    Grant {
                        path: "/w/task".into(),
                        reason: GrantReason::Worktree,
                    },
                    Grant {
                        path: "/w/repo/.git/objects".into(),
                        reason: GrantReason::GitData,
                    },
                    Grant {
                        path: "/tmp/run".into(),
                        reason: GrantReason::Tmpdir,
                    },
                ],
                system_read: vec!["/usr".into(), "/etc".into()],
                devices: vec!["/dev/null".into(), "/dev/pts".into()],
                tmpdir: Some("/tmp/run".into()),
                copies: vec![],
                home: None,
            },
            net: NetPolicy::Allow,
            env: EnvPolicy::default(),
            limits: Limits::default(),
            hook_port: Some(7465),
            allow_domains: vec![],
            credentials: vec![],
            publish: vec![],
            unprotected_git: false,
            agent: None,
        }
    }

    fn dirs_except_devices(p: &Path) -> bool {
        !p.starts_with("/dev") || p == Path::new("/dev/pts")
    }

    #[test]
    fn grants_follow_the_policy_with_entry_types() {
        let plan = compile(&policy(), &dirs_except_devices).unwrap();
        let g: Vec<(&str, Access, EntryKind)> = plan
            .manifest
            .filesystem
            .grants
            .iter()
            .map(|g| (g.path.as_str(), g.access, g.kind))
            .collect();
        use Access::*;
        use EntryKind::*;
        assert_eq!(
            g,
            vec![
                ("/usr", Read, Directory),
                ("/etc", Read, Directory),
                ("/w/repo/.git", Read, Directory),
                ("/w/task", Readwrite, Directory),
                ("/w/repo/.git/objects", Readwrite, Directory),
                ("/tmp/run", Readwrite, Directory),
                ("/dev/null", Readwrite, File),
                ("/dev/pts", Readwrite, Directory),
            ]
        );
        // Hooks and config are never granted writable: only objects etc. under the common dir.
        assert!(!plan
            .manifest
            .filesystem
            .grants
            .iter()
            .any(|g| g.access == Readwrite && g.path.starts_with("/w/repo/.git/hooks")));
        assert_eq!(plan.invocation, NonoInvocation::Wrap);
        assert_eq!(plan.manifest.process.exec_strategy, "direct");
        assert!(!plan.manifest.rollback.enabled);
    }

    #[test]
    fn json_has_the_manifest_schema_shape() {
        let plan = compile(&policy(), &dirs_except_devices).unwrap();
        let v: serde_json::Value = serde_json::from_str(&plan.manifest_json()).unwrap();
        assert_eq!(v["version"], "0.1.0");
        assert_eq!(v["filesystem"]["grants"][0]["access"], "read");
        assert_eq!(v["filesystem"]["grants"][0]["type"], "directory");
        assert_eq!(v["network"]["mode"], "unrestricted");
        assert!(v["network"].get("ports").is_none());
        assert_eq!(v["process"]["signal_mode"], "allow_same_sandbox");
        assert_eq!(v["process"]["ipc_mode"], "shared_memory_only");
        assert_eq!(v["rollback"]["enabled"], false);
    }

    #[test]
    fn blocked_network_keeps_allowed_ports_and_the_hook_port() {
        let mut p = policy();
        p.net = NetPolicy::Block {
            allow_tcp_ports: vec![3000],
        };
        let plan = compile(&p, &dirs_except_devices).unwrap();
        assert_eq!(plan.manifest.network.mode, NetworkMode::Blocked);
        let ports = plan.manifest.network.ports.unwrap();
        assert_eq!(ports.connect, vec![3000, 7465]);
        assert_eq!(ports.bind, vec![3000, 7465]);
        assert_eq!(plan.invocation, NonoInvocation::Wrap);
    }

    #[test]
    fn domains_use_the_proxy_and_nono_run() {
        let mut p = policy();
        p.allow_domains = vec!["crates.io".into(), "*.github.com".into()];
        let plan = compile(&p, &dirs_except_devices).unwrap();
        assert_eq!(plan.manifest.network.mode, NetworkMode::Proxy);
        assert_eq!(
            plan.manifest.network.allow_domains,
            vec!["crates.io", "*.github.com"]
        );
        // The hook port stays reachable directly.
        assert_eq!(
            plan.manifest.network.ports.as_ref().unwrap().connect,
            vec![7465]
        );
        assert_eq!(plan.invocation, NonoInvocation::Run);
        assert_eq!(plan.manifest.process.exec_strategy, "supervised");
        let flags = plan.invocation.flags();
        for f in [
            "--no-rollback",
            "--no-audit",
            "--trust-override",
            "--silent",
        ] {
            assert!(flags.contains(&f), "{f} missing from {flags:?}");
        }
    }

    #[test]
    fn main_worktrees_are_refused_like_native() {
        let mut p = policy();
        let git = p.workspace.git.as_mut().unwrap();
        git.is_linked = false;
        git.common_dir = "/w/task/.git".into();
        assert!(matches!(
            compile(&p, &dirs_except_devices),
            Err(PolicyError::UnprotectedGit(_))
        ));
        p.unprotected_git = true;
        assert!(compile(&p, &dirs_except_devices).is_ok());
    }

    #[test]
    fn paths_nono_would_expand_are_refused() {
        for bad in ["/w/$HOME/x", "/w/$WORKDIR"] {
            let mut p = policy();
            p.fs.write.push(Grant {
                path: PathBuf::from(bad),
                reason: GrantReason::User,
            });
            let err = compile(&p, &dirs_except_devices).unwrap_err().to_string();
            assert!(err.contains("expands"), "{err}");
        }
    }

    #[test]
    fn a_path_granted_twice_keeps_the_wider_access() {
        let mut p = policy();
        p.fs.read.push(Grant {
            path: "/data".into(),
            reason: GrantReason::User,
        });
        p.fs.write.push(Grant {
            path: "/data".into(),
            reason: GrantReason::User,
        });
        let plan = compile(&p, &dirs_except_devices).unwrap();
        let data: Vec<_> = plan
            .manifest
            .filesystem
            .grants
            .iter()
            .filter(|g| g.path == "/data")
            .collect();
        assert_eq!(data.len(), 1);
        assert_eq!(data[0].access, Access::Readwrite);
    }
}
