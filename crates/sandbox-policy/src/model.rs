//! The policy as plain data (docs/architecture.md: one policy, a pure compiler per mechanism). Serialisable, comparable, no I/O.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::env::EnvPolicy;

/// Everything a backend needs to know to confine one task's processes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub workspace: Workspace,
    pub fs: FsPolicy,
    pub net: NetPolicy,
    pub env: EnvPolicy,
    pub limits: Limits,
    /// Loopback port of the status-hook endpoint: reachable even when the network is blocked.
    pub hook_port: Option<u16>,
    /// Domains reachable through a filtering proxy (only backends with one: nono).
    pub allow_domains: Vec<String>,
    /// Credentials the run's proxy adds on the way to their hosts (`--credential NAME`,
    /// `credentials:`): names only, never a secret. The host reads each secret when the run
    /// starts (`sandbox_net::Credentials::for_run`); the environment holds placeholders.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<String>,
    /// Ports of the run's servers published to the host (`--publish`, `network.publish`):
    /// the supervisor listens on the host address and relays each connection to the port
    /// inside the run's network namespace (docs/security.md, "Publishing a port").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub publish: Vec<Publish>,
    /// The user accepted that git hooks/config inside the writable tree cannot be protected
    /// (`--unprotected-git`).
    pub unprotected_git: bool,
    /// The agent profile this run uses, and what it added (shown by `policy show`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentGrants>,
}

/// What an agent profile added to a policy, path by path, with what was found on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentGrants {
    pub agent: String,
    pub title: String,
    /// `--agent` or `detected from the command name`.
    pub selected_by: String,
    pub paths: Vec<AgentGrantPath>,
    /// The program names whose commands get `args`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<String>,
    /// Variables the profile sets (under `--env`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<crate::agents::ProfileEnv>,
    /// Arguments the profile puts after the agent's program name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<crate::agents::ProfileArgs>,
}

/// One path of the profile as it applies to this run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentGrantPath {
    pub path: PathBuf,
    pub access: crate::agents::AgentAccess,
    pub why: String,
    /// `granted`, `created` (a writable path made on the host), `copied` (a private copy
    /// made), or `missing` (a read-only or copied path that does not exist: nothing granted).
    pub status: String,
    /// What the host checks in this writable path after every run (`git`: the git
    /// repositories the host's agent runs git in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<crate::agents::AgentAudit>,
}

impl AgentGrants {
    /// The profile's entry for `path` or the nearest one above it.
    pub fn entry_for(&self, path: &Path) -> Option<&AgentGrantPath> {
        self.paths
            .iter()
            .filter(|p| path.starts_with(&p.path) && p.status != "missing")
            .max_by_key(|p| p.path.components().count())
    }

    /// The writable paths whose git repositories are audited after every run.
    pub fn git_audited(&self) -> Vec<PathBuf> {
        self.paths
            .iter()
            .filter(|p| {
                p.audit == Some(crate::agents::AgentAudit::Git)
                    && p.access == crate::agents::AgentAccess::Write
                    && p.status != "missing"
            })
            .map(|p| p.path.clone())
            .collect()
    }
}

/// The task's worktree and its git layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workspace {
    /// The worktree root (canonical).
    pub root: PathBuf,
    /// Where commands start (canonical; inside `root`).
    pub cwd: PathBuf,
    pub git: Option<GitLayout>,
    /// The paths in the worktree that host tools run or load ([`crate::hostfiles`]):
    /// read-only inside unless a write grant opens them, checked after every run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_files: Vec<crate::hostfiles::HostFile>,
}

/// How a worktree's git data is laid out, as discovered on the host before the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GitLayout {
    /// `.git` is a file pointing elsewhere (`git worktree add`) — the layout the kernel can
    /// protect — or a directory inside the worktree.
    pub is_linked: bool,
    /// The repository's common dir (`<main>/.git`), canonical.
    pub common_dir: PathBuf,
    /// This worktree's private git dir: `<common>/worktrees/<name>` when linked, else the
    /// common dir itself.
    pub worktree_gitdir: PathBuf,
    /// `extensions.worktreeConfig` is on: `config.worktree` in the (writable) worktree gitdir
    /// would be read by git, so hooks could be re-pointed from inside.
    pub worktree_config: bool,
    /// Pointer files an agent could rewrite to redirect host-side git to a gitdir of its own,
    /// with the exact bytes they must keep (checked and restored after every run).
    pub pointers: Vec<PointerFile>,
    /// The branch this worktree's `HEAD` names at the start (`refs/heads/<task>`): the one
    /// existing ref a quarantined run may move. `None` when `HEAD` is detached.
    #[serde(default)]
    pub task_branch: Option<String>,
    /// `core.hooksPath` as git resolves it for this worktree (`~` expanded, a relative path
    /// taken from the worktree root), when set: git on the host runs the hooks from there.
    /// Projects point it into the tree (`.husky`, `.githooks`), where a sandbox could write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks_path: Option<PathBuf>,
    /// Local repositories `git push` from inside may reach (`--allow-push`), as their git
    /// dirs (canonical): read-only like the common dir, written only through a quarantine of
    /// their own that the host reads back by the same rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub push_remotes: Vec<PathBuf>,
    /// Pointer files that were absent before the run and must stay so: in a main worktree,
    /// `commondir`, `gitdir` and `locked` in `.git`. Git reads `<gitdir>/commondir` in *any*
    /// git dir (`setup.c`'s `get_common_dir_noenv`), so one the run creates there sends the
    /// host's next git to a repository of the run's. Whatever is found at one after the run
    /// is moved aside ([`PointerFile`]s that existed are restored instead).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub absent_pointers: Vec<PathBuf>,
    /// New repositories the run creates in the worktree (a nested `.git`, a bare repository)
    /// are kept (`--allow-nested-git`) instead of set aside after the run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_nested_git: bool,
}

/// A file whose content must not change during a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PointerFile {
    pub path: PathBuf,
    pub content: String,
}

impl GitLayout {
    /// The git directories a commit writes in a linked worktree: objects, refs, logs and this
    /// worktree's own gitdir. Everything else in the common dir stays read-only.
    pub fn writable_dirs(&self) -> Vec<PathBuf> {
        if !self.is_linked {
            return Vec::new();
        }
        let mut dirs: Vec<PathBuf> = ["objects", "refs", "logs"]
            .iter()
            .map(|d| self.common_dir.join(d))
            .collect();
        dirs.push(self.worktree_gitdir.clone());
        dirs
    }

    /// Whether the git store is quarantined under the private view: a linked worktree whose
    /// common dir lies outside it, protected (not `--unprotected-git`). Its objects, refs and
    /// logs are then an overlay whose writes the host applies only where allowed.
    pub fn quarantined(&self, root: &Path, unprotected_git: bool) -> bool {
        self.is_linked && !self.common_dir.starts_with(root) && !unprotected_git
    }

    /// Whether the kernel (Landlock) can keep hooks and config read-only: only when they are
    /// outside the writable tree and no writable file can re-point them.
    pub fn landlock_protection_problem(&self, root: &Path) -> Option<String> {
        if !self.is_linked || self.common_dir.starts_with(root) {
            return Some(format!(
                "{} is a main worktree: its git directory {} is inside the writable tree, and \
                 Landlock cannot make a subdirectory of a writable directory read-only, so an \
                 agent could write .git/hooks or .git/config and run code the next time you \
                 use git. Use a linked worktree (`git -C {} worktree add ../<task> -b <branch>`) \
                 or pass --unprotected-git to accept the risk.",
                root.display(),
                self.common_dir.display(),
                root.display()
            ));
        }
        if self.worktree_config {
            return Some(format!(
                "extensions.worktreeConfig is enabled in {}: git would read \
                 {}/config.worktree, which the sandbox must be able to write, so hooks could \
                 be re-pointed from inside. Disable it (`git config --unset \
                 extensions.worktreeConfig`) or pass --unprotected-git to accept the risk.",
                self.common_dir.join("config").display(),
                self.worktree_gitdir.display()
            ));
        }
        None
    }
}

/// Filesystem grants. Everything not listed is denied.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsPolicy {
    /// Read (and execute) only.
    pub read: Vec<Grant>,
    /// Read, write, create, delete, execute.
    pub write: Vec<Grant>,
    /// System directories needed to run programs: read and execute.
    pub system_read: Vec<PathBuf>,
    /// Character devices opened read-write (`/dev/null`, `/dev/tty`, …).
    pub devices: Vec<PathBuf>,
    /// The private per-run temporary directory (also in `write`), exported as `TMPDIR`.
    pub tmpdir: Option<PathBuf>,
    /// Files the run sees as a private copy at their real path (an agent profile's `copy`):
    /// the real path is also in `read`, so a backend without a private view keeps the host's
    /// file read-only; the view binds the copy there, writable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<PrivateCopy>,
    /// The run's private home, with the user's toolchains and package caches in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<HomePolicy>,
}

/// A host file shown to the run as a private copy at the same path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrivateCopy {
    /// The real path (the host's file, never written).
    pub path: PathBuf,
    /// The private copy (under the user's state dir, never read back by the host).
    pub copy: PathBuf,
}

/// The private, persistent home of a run (docs/security.md, "The private home"): a directory
/// the host owns under the state dir, mounted in the view at the real home's path (so `$HOME`
/// keeps its string), writable. Toolchains and caches are mounts stacked on top of it at
/// their real paths. Without a view `HOME` is the directory itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HomePolicy {
    /// The real home's path: where the view mounts the private home, and `$HOME` inside it.
    pub path: PathBuf,
    /// The host directory that holds the private home (canonical; also a write grant).
    pub dir: PathBuf,
    /// `per-project` or `per-task`: what `dir` is keyed on.
    pub scope: String,
    /// Toolchains found on this machine; the enabled ones are read grants at their real paths.
    pub toolchains: Vec<Toolchain>,
    /// Package caches layered copy-on-write over the user's own (view only).
    pub caches: Vec<CacheLayer>,
    /// Credential files or directories inside a toolchain's tree, left out of its grants
    /// (the tree is granted as its other entries): they exist under no backend.
    pub masked: Vec<Masked>,
    /// The bound of the cache layers' disk, checked at the start of a run.
    #[serde(default)]
    pub cache_cap_bytes: Option<u64>,
}

/// One toolchain: its name (`rust`, `node`, `python`) and the trees it needs, read-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Toolchain {
    pub name: String,
    /// What it was found as (`rustup`, `nvm`, `pyenv`), for messages.
    pub kind: String,
    pub paths: Vec<PathBuf>,
    /// Mounted in this run (`toolchains:` and `--toolchain`/`--no-toolchains` decide).
    pub enabled: bool,
}

/// A package cache as an overlay: the user's cache read-only below, the run's private
/// persistent layer above it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheLayer {
    /// `cargo-registry`, `npm`, `pip`, ...
    pub name: String,
    /// Where the cache is, on the host and in the view.
    pub path: PathBuf,
    /// The host's cache, read-only below the private layer.
    pub lower: PathBuf,
    /// The private layer's writable directory and overlayfs's work directory.
    pub upper: PathBuf,
    pub work: PathBuf,
}

/// A secret left out of a toolchain's grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Masked {
    pub path: PathBuf,
    pub dir: bool,
    /// What it holds ("crates.io token").
    pub what: String,
}

impl HomePolicy {
    /// The read-only trees of the enabled toolchains.
    pub fn toolchain_paths(&self) -> impl Iterator<Item = &Path> {
        self.toolchains
            .iter()
            .filter(|t| t.enabled)
            .flat_map(|t| t.paths.iter().map(PathBuf::as_path))
    }

    /// The variables that point into the home: `HOME` and the XDG base directories.
    pub fn env(&self, at: &Path) -> Vec<(&'static str, PathBuf)> {
        vec![
            ("HOME", at.to_path_buf()),
            ("XDG_CONFIG_HOME", at.join(".config")),
            ("XDG_CACHE_HOME", at.join(".cache")),
            ("XDG_DATA_HOME", at.join(".local/share")),
            ("XDG_STATE_HOME", at.join(".local/state")),
        ]
    }

    /// The toolchain (enabled or not) whose trees hold `path`.
    pub fn toolchain_of(&self, path: &Path) -> Option<&Toolchain> {
        self.toolchains
            .iter()
            .find(|t| t.paths.iter().any(|p| path.starts_with(p)))
    }
}

/// One granted path and why it is granted (shown by `policy show`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    pub path: PathBuf,
    pub reason: GrantReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GrantReason {
    Worktree,
    GitData,
    GitReadOnly,
    Tmpdir,
    User,
    Config,
    /// An agent profile (`--agent`, or detected from the command): the policy's `agent`
    /// says which path and why.
    Agent,
    /// The run's private home.
    Home,
    /// A toolchain of the user's, read-only.
    Toolchain,
}

impl GrantReason {
    pub fn as_str(self) -> &'static str {
        match self {
            GrantReason::Worktree => "the task worktree",
            GrantReason::GitData => "git data a commit writes",
            GrantReason::GitReadOnly => "git common dir (hooks, config: read-only)",
            GrantReason::Tmpdir => "private TMPDIR",
            GrantReason::User => "granted on the command line",
            GrantReason::Config => "granted in the configuration",
            GrantReason::Agent => "the agent profile",
            GrantReason::Home => "the private home",
            GrantReason::Toolchain => "a toolchain (read-only)",
        }
    }
}

/// Outbound network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "mode")]
pub enum NetPolicy {
    Allow,
    /// Deny TCP connect/bind except these ports; deny UDP, raw and packet sockets, io_uring.
    Block {
        allow_tcp_ports: Vec<u16>,
    },
}

impl NetPolicy {
    /// The TCP ports reachable under a block, the hook port included.
    pub fn open_ports(&self, hook_port: Option<u16>) -> Option<Vec<u16>> {
        match self {
            NetPolicy::Allow => None,
            NetPolicy::Block { allow_tcp_ports } => {
                let mut ports: Vec<u16> =
                    allow_tcp_ports.iter().copied().chain(hook_port).collect();
                ports.sort_unstable();
                ports.dedup();
                Some(ports)
            }
        }
    }
}

/// One published port: `[HOST_ADDR:]HOST_PORT[:INNER_PORT]` (`3000`, `8080:3000`,
/// `127.0.0.1:8080:3000`, `[::1]:8080:3000`). The host address defaults to `127.0.0.1` and
/// the inner port to the host port; a wildcard address (`0.0.0.0`, `::`) is taken only when
/// written out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Publish {
    /// Where the supervisor listens on the host.
    pub host_addr: std::net::IpAddr,
    pub host_port: u16,
    /// The port on the run's own loopback (`127.0.0.1:INNER_PORT` inside) it connects to.
    pub inner_port: u16,
}

impl Publish {
    /// Parses the `--publish` form; the error says what is wrong with `text`.
    pub fn parse(text: &str) -> Result<Publish, String> {
        let bad = |why: &str| {
            format!("--publish {text:?}: {why} (the form is [HOST_ADDR:]HOST_PORT[:INNER_PORT], e.g. 3000, 8080:3000, 127.0.0.1:8080:3000)")
        };
        let port = |s: &str| -> Result<u16, String> {
            match s.parse::<u16>() {
                Ok(0) | Err(_) => Err(bad(&format!("{s:?} is not a TCP port (1-65535)"))),
                Ok(p) => Ok(p),
            }
        };
        let text = text.trim();
        // `[v6]:PORT[:INNER]`
        let (addr, rest): (Option<std::net::IpAddr>, &str) =
            if let Some(after) = text.strip_prefix('[') {
                let (inside, rest) = after
                    .split_once(']')
                    .ok_or_else(|| bad("an unclosed `[`"))?;
                let addr = inside
                    .parse::<std::net::Ipv6Addr>()
                    .map_err(|_| bad(&format!("{inside:?} is not an IPv6 address")))?;
                let rest = rest
                    .strip_prefix(':')
                    .ok_or_else(|| bad("no port after the address"))?;
                (Some(addr.into()), rest)
            } else {
                let parts: Vec<&str> = text.split(':').collect();
                match parts.as_slice() {
                    [_] => (None, text),
                    // Two parts: ADDR:PORT when the first is an address, else PORT:INNER.
                    [first, rest] if first.parse::<std::net::Ipv4Addr>().is_ok() => (
                        first.parse::<std::net::Ipv4Addr>().ok().map(Into::into),
                        *rest,
                    ),
                    [_, _] => (None, text),
                    [first, ..] if parts.len() == 3 => {
                        let addr = first.parse::<std::net::Ipv4Addr>().map_err(|_| {
                            bad(&format!(
                                "{first:?} is not an IPv4 address (an IPv6 one goes in [ ])"
                            ))
                        })?;
                        (
                            Some(addr.into()),
                            text.split_once(':').map_or("", |(_, r)| r),
                        )
                    }
                    _ => return Err(bad("too many `:`")),
                }
            };
        let (host_port, inner_port) = match rest.split_once(':') {
            Some((h, i)) => (port(h)?, port(i)?),
            None => {
                let p = port(rest)?;
                (p, p)
            }
        };
        Ok(Publish {
            host_addr: addr.unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)),
            host_port,
            inner_port,
        })
    }

    /// The host's side as a socket address.
    pub fn host(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::new(self.host_addr, self.host_port)
    }

    /// Whether it asks for nothing a run on the host's own network does not already have:
    /// the host's loopback, the same port.
    pub fn is_identity(&self) -> bool {
        self.host_addr == std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
            && self.host_port == self.inner_port
    }
}

impl std::fmt::Display for Publish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.host_addr {
            std::net::IpAddr::V6(a) => write!(f, "[{a}]:{}:{}", self.host_port, self.inner_port),
            a => write!(f, "{a}:{}:{}", self.host_port, self.inner_port),
        }
    }
}

/// Resource limits: the timeout, and the kernel's limits of a run's processes together
/// (enforced by `sandbox-host` through cgroups, compiled by [`crate::compile::limits`]; VM
/// backends size the VM from the same fields).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(with = "opt_duration_ms", default)]
    pub timeout: Option<Duration>,
    /// Memory of all the run's processes together, in bytes (`--memory`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Limit>,
    /// Processes and threads of the run alive at once (`--pids`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<Limit>,
    /// CPU time per wall-clock time, in thousandths of a CPU (`--cpus 0.5` is 500).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<Limit>,
}

/// One resource limit and who set it: a limit the user asked for (a flag, the
/// configuration) fails closed where it cannot be enforced; the built-in default is enforced
/// where the machine can, and said to be missing where it cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limit {
    pub value: u64,
    pub source: LimitSource,
}

/// Where a [`Limit`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LimitSource {
    Flag,
    Config,
    Default,
}

impl LimitSource {
    pub fn as_str(self) -> &'static str {
        match self {
            LimitSource::Flag => "flag",
            LimitSource::Config => "config",
            LimitSource::Default => "default",
        }
    }

    /// Asked for by the user: refused (125) where it cannot be enforced.
    pub fn requested(self) -> bool {
        self != LimitSource::Default
    }
}

mod opt_duration_ms {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        d.map(|d| d.as_millis() as u64).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

impl Policy {
    /// Every path the sandboxed process may write, in order.
    pub fn writable_paths(&self) -> impl Iterator<Item = &Path> {
        self.fs.write.iter().map(|g| g.path.as_path())
    }

    /// Every path the sandboxed process may read (including writable ones).
    pub fn readable_paths(&self) -> impl Iterator<Item = &Path> {
        self.fs
            .read
            .iter()
            .chain(self.fs.write.iter())
            .map(|g| g.path.as_path())
            .chain(self.fs.system_read.iter().map(PathBuf::as_path))
    }

    /// True if `path` (canonical) is inside something the sandbox may write.
    pub fn is_writable(&self, path: &Path) -> bool {
        self.writable_paths().any(|w| path.starts_with(w))
    }
}

#[cfg(test)]
mod publish_tests {
    use super::Publish;

    #[test]
    fn the_forms_of_publish() {
        let p = |s: &str| Publish::parse(s).map(|p| p.to_string());
        assert_eq!(p("3000").unwrap(), "127.0.0.1:3000:3000");
        assert_eq!(p("8080:3000").unwrap(), "127.0.0.1:8080:3000");
        assert_eq!(p("127.0.0.2:8080").unwrap(), "127.0.0.2:8080:8080");
        assert_eq!(p("0.0.0.0:8080:3000").unwrap(), "0.0.0.0:8080:3000");
        assert_eq!(p("[::1]:8080:3000").unwrap(), "[::1]:8080:3000");
        assert_eq!(p("[::1]:8080").unwrap(), "[::1]:8080:8080");
        assert!(Publish::parse("3000").unwrap().is_identity());
        assert!(!Publish::parse("8080:3000").unwrap().is_identity());
        for bad in [
            "", "0", "70000", "x", "a:1:2", "1:2:3:4", "[::1", "[x]:1", "1:",
        ] {
            let e = Publish::parse(bad).unwrap_err();
            assert!(e.contains("--publish"), "{bad}: {e}");
        }
    }
}
