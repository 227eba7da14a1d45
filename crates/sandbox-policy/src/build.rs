//! Building a [`Policy`] from what the user asked for: flags plus trusted configuration,
//! resolved against the real filesystem and the discovered git layout.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::env::EnvPolicy;
use crate::error::PolicyError;
use crate::git;
use crate::model::{
    AgentGrants, FsPolicy, Grant, GrantReason, Limits, NetPolicy, Policy, PrivateCopy, Workspace,
};

/// System directories programs need, read-only. Only those that exist are granted.
pub const LINUX_SYSTEM_READ: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/nix/store",
    "/run/current-system",
    "/proc",
    "/sys",
];

/// Devices opened read-write.
pub const LINUX_DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];

/// What the user asked for, before resolution.
#[derive(Debug, Clone, Default)]
pub struct PolicyRequest {
    /// The task's worktree (or a directory inside it).
    pub workdir: PathBuf,
    /// Where commands start; defaults to `workdir`.
    pub cwd: Option<PathBuf>,
    /// Read-only grants with where they came from.
    pub allow_read: Vec<(PathBuf, GrantReason)>,
    /// Read-write grants.
    pub allow_write: Vec<(PathBuf, GrantReason)>,
    pub block_net: bool,
    pub allow_ports: Vec<u32>,
    pub hook_port: Option<u16>,
    pub allow_domains: Vec<String>,
    /// `--credential NAME` (names; checked and read by the caller).
    pub credentials: Vec<String>,
    /// `--publish [HOST_ADDR:]HOST_PORT[:INNER_PORT]`, as written ([`crate::Publish::parse`]).
    pub publish: Vec<String>,
    pub env: EnvPolicy,
    pub timeout: Option<Duration>,
    /// The resource limits (memory, pids, cpu; [`crate::compile::limits::resolve`]).
    pub resources: [Option<crate::model::Limit>; 3],
    pub unprotected_git: bool,
    /// The private temp dir for this run (created by the caller).
    pub tmpdir: Option<PathBuf>,
    /// Override of the system read list (tests, other platforms).
    pub system_read: Option<Vec<PathBuf>>,
    /// Override of the device list.
    pub devices: Option<Vec<PathBuf>>,
    /// Private copies (an agent profile's `copy` paths), made by the caller.
    pub copies: Vec<PrivateCopy>,
    /// The agent profile's record of what it added.
    pub agent: Option<AgentGrants>,
    /// `--allow-push`: local remotes (paths or remote names) a push from inside may reach
    /// through a quarantine of their own.
    pub push_remotes: Vec<String>,
    /// `--allow-nested-git`: keep the repositories the run creates in the worktree (a nested
    /// `.git`, a bare repository) instead of setting them aside after the run.
    pub allow_nested_git: bool,
}

fn canonical_grant(path: &Path, flag: &'static str) -> Result<PathBuf, PolicyError> {
    if !path.is_absolute() {
        return Err(PolicyError::Path {
            path: path.to_path_buf(),
            cause: format!("{flag} needs an absolute path"),
        });
    }
    match std::fs::canonicalize(path) {
        Ok(p) => Ok(p),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(PolicyError::MissingGrant {
            flag,
            path: path.to_path_buf(),
        }),
        Err(e) => Err(PolicyError::Path {
            path: path.to_path_buf(),
            cause: e.to_string(),
        }),
    }
}

fn existing(paths: &[&str]) -> Vec<PathBuf> {
    paths
        .iter()
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .collect()
}

/// Resolves a request into a policy. Reads the filesystem (canonicalisation, git discovery)
/// but changes nothing.
pub fn build(req: PolicyRequest) -> Result<Policy, PolicyError> {
    let workdir = std::fs::canonicalize(&req.workdir).map_err(|e| PolicyError::Path {
        path: req.workdir.clone(),
        cause: format!("workdir unusable: {e}"),
    })?;
    if !workdir.is_dir() {
        return Err(PolicyError::Path {
            path: workdir,
            cause: "workdir is not a directory".into(),
        });
    }
    let discovered = git::discover(&workdir)?;
    let (root, mut layout, identity) = match discovered {
        Some(d) => (d.root, Some(d.layout), d.identity),
        None => (workdir.clone(), None, None),
    };
    if let Some(layout) = layout.as_mut() {
        layout.allow_nested_git = req.allow_nested_git;
    }
    for arg in &req.push_remotes {
        let Some(layout) = layout.as_mut() else {
            return Err(PolicyError::Conflict(format!(
                "--allow-push {arg}: {} is not in a git repository",
                workdir.display()
            )));
        };
        let gitdir = git::resolve_push_remote(&root, arg)?;
        if !layout.push_remotes.contains(&gitdir) {
            layout.push_remotes.push(gitdir);
        }
    }
    if root == Path::new("/") {
        return Err(PolicyError::Path {
            path: root,
            cause: "refusing to make / the writable workspace".into(),
        });
    }
    let cwd = match &req.cwd {
        Some(c) => std::fs::canonicalize(c).map_err(|e| PolicyError::Path {
            path: c.clone(),
            cause: e.to_string(),
        })?,
        None => workdir.clone(),
    };

    // Ports.
    let mut ports = Vec::new();
    for &port in &req.allow_ports {
        if port == 0 || port > u16::MAX as u32 {
            return Err(PolicyError::Port {
                port,
                cause: "is not a TCP port (1-65535)",
            });
        }
        ports.push(port as u16);
    }
    if !req.block_net && !ports.is_empty() {
        return Err(PolicyError::Conflict(
            "--allow-port only makes sense with --block-net (the network is open by default)"
                .into(),
        ));
    }
    ports.sort_unstable();
    ports.dedup();
    for domain in &req.allow_domains {
        let valid = !domain.is_empty()
            && domain.len() <= 253
            && domain
                .split('.')
                .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
            || domain.starts_with("*.") && domain.len() > 2
            // A built-in group (`@github`; the proxy knows which exist) or an address.
            || domain.strip_prefix('@').is_some_and(|g| {
                !g.is_empty() && g.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            })
            || domain.parse::<std::net::IpAddr>().is_ok();
        if !valid {
            return Err(PolicyError::Conflict(format!(
                "--allow-domain {domain:?} is not a host name"
            )));
        }
    }

    let mut publish: Vec<crate::model::Publish> = Vec::new();
    for text in &req.publish {
        let p = crate::model::Publish::parse(text).map_err(PolicyError::Conflict)?;
        if let Some(other) = publish.iter().find(|o| o.host() == p.host() && **o != p) {
            return Err(PolicyError::Conflict(format!(
                "--publish {p} and --publish {other} both listen on {}",
                p.host()
            )));
        }
        if !publish.contains(&p) {
            publish.push(p);
        }
    }
    // An --allow-port's port inside is the supervisor's listener relaying out to the host:
    // a server cannot listen there, and a published connection would loop back out.
    if let Some(p) = publish
        .iter()
        .find(|p| ports.contains(&p.inner_port) || req.hook_port == Some(p.inner_port))
    {
        return Err(PolicyError::Conflict(format!(
            "--publish {p}: port {} inside is taken by the relay out to the host's port {} \
             (--allow-port, or the hook port); publish another inner port",
            p.inner_port, p.inner_port
        )));
    }
    // With the open network the run has no namespace of its own: its servers listen on the
    // host's own ports, so only the identity (127.0.0.1:P to P) is already true.
    let open = !req.block_net && req.allow_domains.is_empty() && req.credentials.is_empty();
    if let (true, Some(p)) = (open, publish.iter().find(|p| !p.is_identity())) {
        return Err(PolicyError::Conflict(format!(
            "--publish {p}: with the open network the run shares the host's network (its \
             servers listen on the host's own ports, no relay exists); publishing to another \
             address or port needs the run's own network namespace (--block-net or \
             --allow-domain)"
        )));
    }

    let mut fs = FsPolicy {
        system_read: req
            .system_read
            .clone()
            .unwrap_or_else(|| existing(LINUX_SYSTEM_READ)),
        devices: req
            .devices
            .clone()
            .unwrap_or_else(|| existing(LINUX_DEVICES)),
        ..FsPolicy::default()
    };
    fs.write.push(Grant {
        path: root.clone(),
        reason: GrantReason::Worktree,
    });
    if let Some(layout) = &layout {
        if layout.is_linked {
            fs.read.push(Grant {
                path: layout.common_dir.clone(),
                reason: GrantReason::GitReadOnly,
            });
            for dir in layout.writable_dirs() {
                if dir.exists() {
                    fs.write.push(Grant {
                        path: dir,
                        reason: GrantReason::GitData,
                    });
                }
            }
        }
    }
    // A push remote is read like the common dir; the quarantine's overlay takes its writes.
    for remote in layout.iter().flat_map(|l| &l.push_remotes) {
        fs.read.push(Grant {
            path: remote.clone(),
            reason: GrantReason::GitReadOnly,
        });
    }
    if let Some(tmp) = &req.tmpdir {
        let tmp = canonical_grant(tmp, "tmpdir")?;
        fs.write.push(Grant {
            path: tmp.clone(),
            reason: GrantReason::Tmpdir,
        });
        fs.tmpdir = Some(tmp);
    }
    // A grant of a protected path inside the worktree that does not exist yet (`--allow-write
    // .mcp.json` before the run makes it) opens it without being a grant of its own: the
    // worktree is writable already.
    let mut missing_host_grants: Vec<PathBuf> = Vec::new();
    for (path, reason) in &req.allow_write {
        let path = match canonical_grant(path, "--allow-write") {
            Err(PolicyError::MissingGrant { .. }) if missing_host_file(&root, path).is_some() => {
                missing_host_grants.extend(missing_host_file(&root, path));
                continue;
            }
            other => other?,
        };
        fs.write.push(Grant {
            path,
            reason: *reason,
        });
    }
    for (path, reason) in &req.allow_read {
        let path = canonical_grant(path, "--allow-read")?;
        fs.read.push(Grant {
            path,
            reason: *reason,
        });
    }
    for copy in &req.copies {
        let path = canonical_grant(&copy.path, "a private copy")?;
        let private = canonical_grant(&copy.copy, "a private copy")?;
        // Without a private view the host's file is what the run sees: read-only.
        fs.read.push(Grant {
            path: path.clone(),
            reason: GrantReason::Agent,
        });
        fs.copies.push(PrivateCopy {
            path,
            copy: private,
        });
    }
    dedup_grants(&mut fs.write);
    dedup_grants(&mut fs.read);

    let mut env = req.env.clone();
    if let Some(tmp) = &fs.tmpdir {
        env.set_var("TMPDIR", tmp.to_string_lossy());
    }
    if let Some((name, email)) = identity {
        for (var, value) in [
            ("GIT_AUTHOR_NAME", &name),
            ("GIT_COMMITTER_NAME", &name),
            ("GIT_AUTHOR_EMAIL", &email),
            ("GIT_COMMITTER_EMAIL", &email),
        ] {
            // An explicit --env, or the variable already set in the invoking environment
            // (which git itself would prefer), wins over what the repository config says.
            if !env.set.iter().any(|(n, _)| n == var)
                && !env.pass.iter().any(|n| n == var)
                && std::env::var_os(var).is_none()
            {
                env.set_var(var, value.clone());
            }
        }
    }

    let opening: Vec<&Path> = fs
        .write
        .iter()
        .filter(|g| g.reason != GrantReason::Worktree)
        .map(|g| g.path.as_path())
        .chain(missing_host_grants.iter().map(PathBuf::as_path))
        .collect();
    let host_files = crate::hostfiles::host_files(&root, &opening);
    let policy = Policy {
        workspace: Workspace {
            root,
            cwd,
            git: layout,
            host_files,
        },
        fs,
        net: if req.block_net {
            NetPolicy::Block {
                allow_tcp_ports: ports,
            }
        } else {
            NetPolicy::Allow
        },
        env,
        limits: Limits {
            timeout: req.timeout,
            memory: req.resources[0],
            pids: req.resources[1],
            cpu_millis: req.resources[2],
        },
        hook_port: req.hook_port,
        allow_domains: req.allow_domains.clone(),
        credentials: req.credentials.clone(),
        publish,
        unprotected_git: req.unprotected_git,
        agent: req.agent.clone(),
    };
    Ok(policy)
}

/// `path` (absolute, missing) spelled canonically when it is a protected path of `root` or
/// lies in one: its deepest existing ancestor canonicalised, the rest appended.
fn missing_host_file(root: &Path, path: &Path) -> Option<PathBuf> {
    let mut base = path;
    let mut rest = Vec::new();
    while !base.exists() {
        rest.push(base.file_name()?);
        base = base.parent()?;
    }
    let mut full = std::fs::canonicalize(base).ok()?;
    full.extend(rest.iter().rev());
    crate::hostfiles::is_host_file(root, &full).then_some(full)
}

fn dedup_grants(grants: &mut Vec<Grant>) {
    let mut seen = std::collections::HashSet::new();
    grants.retain(|g| seen.insert(g.path.clone()));
}

impl Policy {
    /// Why this policy's git data would be writable from inside under a backend whose
    /// filesystem rules are allow-only unions (Landlock): the layout itself, or a grant that
    /// covers hooks or config. `None` when protected or when the user accepted the risk.
    pub fn git_protection_problem(&self) -> Option<String> {
        if self.unprotected_git {
            return None;
        }
        let layout = self.workspace.git.as_ref()?;
        if let Some(problem) = layout.landlock_protection_problem(&self.workspace.root) {
            return Some(problem);
        }
        let protected: Vec<PathBuf> = [
            layout.common_dir.join("hooks"),
            layout.common_dir.join("config"),
            layout.common_dir.join("info"),
        ]
        .into_iter()
        .chain(layout.hooks_path.clone())
        .collect();
        for grant in &self.fs.write {
            if grant.reason == GrantReason::GitData {
                continue;
            }
            if protected.iter().any(|p| p.starts_with(&grant.path)) {
                return Some(format!(
                    "the writable grant {} contains the repository's git hooks or config ({}); \
                     an agent could install a hook that runs on the host. Grant a narrower \
                     path, use the native backend's private view (it keeps them read-only), \
                     or pass --unprotected-git to accept the risk.",
                    grant.path.display(),
                    match &layout.hooks_path {
                        Some(h) if h.starts_with(&grant.path) => {
                            format!("core.hooksPath {}", h.display())
                        }
                        _ => layout.common_dir.display().to_string(),
                    }
                ));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(dir: &Path) -> PolicyRequest {
        PolicyRequest {
            workdir: dir.to_path_buf(),
            system_read: Some(vec![]),
            devices: Some(vec![]),
            ..PolicyRequest::default()
        }
    }

    #[test]
    fn publish_is_parsed_deduplicated_and_needs_a_namespace_to_map() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = req(dir.path());
        r.block_net = true;
        r.publish = vec![
            "8080:3000".into(),
            "127.0.0.1:8080:3000".into(),
            "4000".into(),
        ];
        let p = build(r).unwrap();
        let shown: Vec<String> = p.publish.iter().map(ToString::to_string).collect();
        assert_eq!(shown, vec!["127.0.0.1:8080:3000", "127.0.0.1:4000:4000"]);
        // The inner port of an --allow-port is the relay out.
        let mut r = req(dir.path());
        r.block_net = true;
        r.allow_ports = vec![3000];
        r.publish = vec!["8080:3000".into()];
        assert!(build(r)
            .unwrap_err()
            .to_string()
            .contains("taken by the relay"));
        // One host address and port, two inner ports.
        let mut r = req(dir.path());
        r.block_net = true;
        r.publish = vec!["8080:3000".into(), "8080:3001".into()];
        assert!(build(r).unwrap_err().to_string().contains("both listen"));
        // The open network: only the identity.
        let mut r = req(dir.path());
        r.publish = vec!["3000".into()];
        assert_eq!(build(r).unwrap().publish.len(), 1);
        let mut r = req(dir.path());
        r.publish = vec!["8080:3000".into()];
        assert!(build(r).unwrap_err().to_string().contains("open network"));
        // A domain list has a namespace.
        let mut r = req(dir.path());
        r.allow_domains = vec!["a.test".into()];
        r.publish = vec!["8080:3000".into()];
        assert_eq!(build(r).unwrap().publish.len(), 1);
    }

    #[test]
    fn a_plain_directory_is_its_own_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let p = build(req(dir.path())).unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        assert_eq!(p.workspace.root, root);
        assert!(p.workspace.git.is_none());
        assert_eq!(p.fs.write.len(), 1);
        assert_eq!(p.net, NetPolicy::Allow);
    }

    #[test]
    fn grants_must_exist_and_be_absolute() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = req(dir.path());
        r.allow_read = vec![("/no/such/path".into(), GrantReason::User)];
        assert!(matches!(
            build(r).unwrap_err(),
            PolicyError::MissingGrant { .. }
        ));
        let mut r = req(dir.path());
        r.allow_write = vec![("relative".into(), GrantReason::User)];
        assert!(build(r).unwrap_err().to_string().contains("absolute"));
    }

    #[test]
    fn ports_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        for bad in [0, 65536, 100000] {
            let mut r = req(dir.path());
            r.block_net = true;
            r.allow_ports = vec![bad];
            assert!(
                matches!(build(r).unwrap_err(), PolicyError::Port { .. }),
                "{bad}"
            );
        }
        let mut r = req(dir.path());
        r.allow_ports = vec![80];
        assert!(matches!(build(r).unwrap_err(), PolicyError::Conflict(_)));
        let mut r = req(dir.path());
        r.block_net = true;
        r.allow_ports = vec![443, 80, 443];
        assert_eq!(
            build(r).unwrap().net,
            NetPolicy::Block {
                allow_tcp_ports: vec![80, 443]
            }
        );
    }

    #[test]
    fn tmpdir_is_writable_and_exported() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let mut r = req(dir.path());
        r.tmpdir = Some(tmp.path().to_path_buf());
        let p = build(r).unwrap();
        let tmp = std::fs::canonicalize(tmp.path()).unwrap();
        assert!(p.is_writable(&tmp.join("x")));
        assert!(p
            .env
            .set
            .iter()
            .any(|(k, v)| k == "TMPDIR" && v == tmp.to_str().unwrap()));
    }

    #[test]
    fn the_filesystem_root_is_never_the_workspace() {
        let err = build(req(Path::new("/"))).unwrap_err();
        assert!(err.to_string().contains("refusing"), "{err}");
    }

    #[test]
    fn bad_domains_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["", "exa mple.com", "a..b", "http://x.com"] {
            let mut r = req(dir.path());
            r.allow_domains = vec![bad.into()];
            assert!(build(r).is_err(), "{bad:?}");
        }
        let mut r = req(dir.path());
        r.allow_domains = vec![
            "api.example.com".into(),
            "*.npmjs.org".into(),
            "@github".into(),
            "10.0.0.5".into(),
        ];
        assert!(build(r).is_ok());
    }
}
