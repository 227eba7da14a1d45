//! Policy → the advisory `SANDBOX_HINT_*` variables a custom launcher receives.
//!
//! The custom backend grants nothing itself: the launcher owns the boundary. What the other
//! backends would have granted is exported as hints, computed here from the policy (which the
//! host built from its own discovery and trusted configuration, never from files in the
//! worktree). A launcher is free to ignore them.
//!
//! Format (documented in `docs/backends.md`):
//! * a path list is `:`-separated, like `PATH`; inside one path, `%`, `:` and a newline are
//!   written `%25`, `%3A` and `%0A`, so every path survives exactly;
//! * a port list is `,`-separated decimal;
//! * a variable whose value would be empty is still set (to the empty string), so a launcher
//!   can tell "nothing granted" from "not told". Git variables are set only in a git worktree.

use std::path::{Path, PathBuf};

use crate::model::{NetPolicy, Policy};

/// Every hint variable starts with this.
pub const PREFIX: &str = "SANDBOX_HINT_";

/// Bumped when a variable changes meaning.
pub const VERSION: &str = "1";

/// Every variable this module can set, with its meaning (for docs, `policy show` and tests).
pub const VARIABLES: &[(&str, &str)] = &[
    (
        "SANDBOX_HINT_VERSION",
        "format version of these variables (1)",
    ),
    (
        "SANDBOX_HINT_WORKTREE",
        "the task worktree (the launcher's working directory is in it)",
    ),
    ("SANDBOX_HINT_CWD", "the directory the command starts in"),
    (
        "SANDBOX_HINT_WRITE_PATHS",
        "paths the other backends make writable: the worktree, the git data a commit writes, \
         the private TMPDIR, configured and --allow-write grants",
    ),
    (
        "SANDBOX_HINT_READ_PATHS",
        "paths granted read-only: the git common dir, configured and --allow-read grants",
    ),
    (
        "SANDBOX_HINT_SYSTEM_PATHS",
        "system directories granted read and execute (/usr, /etc, /nix/store, …)",
    ),
    (
        "SANDBOX_HINT_DEVICES",
        "device files opened read-write (/dev/null, /dev/tty, …)",
    ),
    (
        "SANDBOX_HINT_TMPDIR",
        "the private per-run temporary directory (also TMPDIR)",
    ),
    (
        "SANDBOX_HINT_GIT_COMMON_DIR",
        "the repository's common git dir",
    ),
    ("SANDBOX_HINT_GIT_DIR", "this worktree's own git dir"),
    (
        "SANDBOX_HINT_GIT_WRITE_PATHS",
        "git data a commit writes in a linked worktree: <common>/objects, refs, logs and \
         worktrees/<name> (empty in a main worktree)",
    ),
    (
        "SANDBOX_HINT_GIT_READONLY_PATHS",
        "git paths that run code and must stay read-only: <common>/hooks, config, info, \
         packed-refs, <gitdir>/config.worktree",
    ),
    (
        "SANDBOX_HINT_NETWORK",
        "`allow` (open) or `block` (only the TCP ports below)",
    ),
    (
        "SANDBOX_HINT_TCP_PORTS",
        "TCP ports that must stay reachable when the network is blocked, the hook port \
         included (empty when open)",
    ),
    (
        "SANDBOX_HINT_HOOK_PORT",
        "loopback port of the status-hook endpoint (empty when none)",
    ),
];

/// Writes one path of a list, escaping the separator.
fn escape(path: &Path) -> String {
    let text = path.to_string_lossy();
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '%' => out.push_str("%25"),
            ':' => out.push_str("%3A"),
            '\n' => out.push_str("%0A"),
            c => out.push(c),
        }
    }
    out
}

/// A `:`-separated, escaped path list.
pub fn path_list<'a>(paths: impl IntoIterator<Item = &'a Path>) -> String {
    paths.into_iter().map(escape).collect::<Vec<_>>().join(":")
}

/// Splits a path list written by [`path_list`] (for launchers written in Rust, and tests).
pub fn parse_path_list(value: &str) -> Vec<PathBuf> {
    if value.is_empty() {
        return Vec::new();
    }
    value
        .split(':')
        .map(|item| {
            let mut out = String::with_capacity(item.len());
            let mut rest = item;
            while let Some(i) = rest.find('%') {
                out.push_str(&rest[..i]);
                match &rest[i..].get(..3) {
                    Some("%25") => out.push('%'),
                    Some("%3A") => out.push(':'),
                    Some("%0A") => out.push('\n'),
                    _ => {
                        out.push('%');
                        rest = &rest[i + 1..];
                        continue;
                    }
                }
                rest = &rest[i + 3..];
            }
            out.push_str(rest);
            PathBuf::from(out)
        })
        .collect()
}

fn ports(ports: &[u16]) -> String {
    ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The hint variables for `policy`, in a fixed order.
pub fn compile(policy: &Policy) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut set = |name: &str, value: String| out.push((name.to_string(), value));
    set("SANDBOX_HINT_VERSION", VERSION.into());
    set(
        "SANDBOX_HINT_WORKTREE",
        policy.workspace.root.to_string_lossy().into_owned(),
    );
    set(
        "SANDBOX_HINT_CWD",
        policy.workspace.cwd.to_string_lossy().into_owned(),
    );
    set(
        "SANDBOX_HINT_WRITE_PATHS",
        path_list(policy.fs.write.iter().map(|g| g.path.as_path())),
    );
    set(
        "SANDBOX_HINT_READ_PATHS",
        path_list(policy.fs.read.iter().map(|g| g.path.as_path())),
    );
    set(
        "SANDBOX_HINT_SYSTEM_PATHS",
        path_list(policy.fs.system_read.iter().map(PathBuf::as_path)),
    );
    set(
        "SANDBOX_HINT_DEVICES",
        path_list(policy.fs.devices.iter().map(PathBuf::as_path)),
    );
    set(
        "SANDBOX_HINT_TMPDIR",
        policy
            .fs
            .tmpdir
            .as_ref()
            .map(|t| t.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    if let Some(git) = &policy.workspace.git {
        set(
            "SANDBOX_HINT_GIT_COMMON_DIR",
            git.common_dir.to_string_lossy().into_owned(),
        );
        set(
            "SANDBOX_HINT_GIT_DIR",
            git.worktree_gitdir.to_string_lossy().into_owned(),
        );
        let writable = git.writable_dirs();
        set(
            "SANDBOX_HINT_GIT_WRITE_PATHS",
            path_list(writable.iter().map(PathBuf::as_path)),
        );
        let readonly: Vec<PathBuf> = ["hooks", "config", "info", "packed-refs"]
            .iter()
            .map(|p| git.common_dir.join(p))
            .chain(std::iter::once(git.worktree_gitdir.join("config.worktree")))
            .collect();
        set(
            "SANDBOX_HINT_GIT_READONLY_PATHS",
            path_list(readonly.iter().map(PathBuf::as_path)),
        );
    }
    let (network, open) = match &policy.net {
        NetPolicy::Allow => ("allow", Vec::new()),
        NetPolicy::Block { .. } => (
            "block",
            policy.net.open_ports(policy.hook_port).unwrap_or_default(),
        ),
    };
    set("SANDBOX_HINT_NETWORK", network.into());
    set("SANDBOX_HINT_TCP_PORTS", ports(&open));
    set(
        "SANDBOX_HINT_HOOK_PORT",
        policy.hook_port.map(|p| p.to_string()).unwrap_or_default(),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::EnvPolicy;
    use crate::model::{FsPolicy, GitLayout, Grant, GrantReason, Limits, Workspace};

    fn policy() -> Policy {
        Policy {
            workspace: Workspace {
                root: "/w/task".into(),
                cwd: "/w/task/src".into(),
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
                        path: "/data/odd:name%".into(),
                        reason: GrantReason::User,
                    },
                ],
                system_read: vec!["/usr".into()],
                devices: vec!["/dev/null".into()],
                tmpdir: Some("/tmp/run".into()),
                copies: vec![],
                home: None,
            },
            net: NetPolicy::Block {
                allow_tcp_ports: vec![3000],
            },
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

    fn get<'a>(vars: &'a [(String, String)], name: &str) -> &'a str {
        vars.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("{name} not set"))
    }

    #[test]
    fn every_variable_is_documented_and_prefixed() {
        let vars = compile(&policy());
        for (name, _) in &vars {
            assert!(name.starts_with(PREFIX), "{name}");
            assert!(
                VARIABLES.iter().any(|(n, _)| n == name),
                "{name} undocumented"
            );
        }
        assert_eq!(vars.len(), VARIABLES.len());
    }

    #[test]
    fn values_come_from_the_policy() {
        let vars = compile(&policy());
        assert_eq!(get(&vars, "SANDBOX_HINT_WORKTREE"), "/w/task");
        assert_eq!(get(&vars, "SANDBOX_HINT_CWD"), "/w/task/src");
        assert_eq!(
            get(&vars, "SANDBOX_HINT_WRITE_PATHS"),
            "/w/task:/data/odd%3Aname%25"
        );
        assert_eq!(get(&vars, "SANDBOX_HINT_READ_PATHS"), "/w/repo/.git");
        assert_eq!(get(&vars, "SANDBOX_HINT_NETWORK"), "block");
        assert_eq!(get(&vars, "SANDBOX_HINT_TCP_PORTS"), "3000,7465");
        assert_eq!(get(&vars, "SANDBOX_HINT_HOOK_PORT"), "7465");
        assert_eq!(get(&vars, "SANDBOX_HINT_TMPDIR"), "/tmp/run");
        assert_eq!(
            get(&vars, "SANDBOX_HINT_GIT_WRITE_PATHS"),
            "/w/repo/.git/objects:/w/repo/.git/refs:/w/repo/.git/logs:/w/repo/.git/worktrees/task"
        );
        assert!(get(&vars, "SANDBOX_HINT_GIT_READONLY_PATHS").contains("/w/repo/.git/hooks"));
    }

    #[test]
    fn path_lists_round_trip_exactly() {
        let paths = [
            PathBuf::from("/a"),
            PathBuf::from("/odd:name%41"),
            PathBuf::from("/new\nline"),
        ];
        let text = path_list(paths.iter().map(PathBuf::as_path));
        assert!(!text.contains('\n'));
        assert_eq!(parse_path_list(&text), paths);
        assert!(parse_path_list("").is_empty());
    }

    #[test]
    fn open_network_and_no_git() {
        let mut p = policy();
        p.net = NetPolicy::Allow;
        p.workspace.git = None;
        p.hook_port = None;
        let vars = compile(&p);
        assert_eq!(get(&vars, "SANDBOX_HINT_NETWORK"), "allow");
        assert_eq!(get(&vars, "SANDBOX_HINT_TCP_PORTS"), "");
        assert_eq!(get(&vars, "SANDBOX_HINT_HOOK_PORT"), "");
        assert!(!vars.iter().any(|(n, _)| n.starts_with("SANDBOX_HINT_GIT")));
    }
}
