//! Policy → a Seatbelt (SBPL) profile for macOS `sandbox_init`.
//!
//! SBPL is last-match-wins, which Landlock is not: after allowing writes to the worktree and
//! the git data, the profile denies writes to hooks, config, info and the pointer files again,
//! so both main and linked worktrees are protected on macOS.

use std::fmt::Write as _;
use std::path::Path;

use crate::model::{NetPolicy, Policy};

/// System locations programs need on macOS, read-only.
pub const MACOS_SYSTEM_READ: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/System",
    "/Library",
    "/Applications/Xcode.app",
    "/Library/Developer/CommandLineTools",
    "/opt/homebrew",
    "/usr/local",
    "/nix/store",
    "/private/etc",
    "/private/var/db/timezone",
    "/private/var/select",
    "/etc",
    "/var",
    "/tmp",
];

/// Quotes a path as an SBPL string literal.
fn quote(path: &Path) -> String {
    let mut out = String::from("\"");
    for c in path.to_string_lossy().chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

pub fn compile(policy: &Policy) -> String {
    let mut p = String::new();
    p.push_str("(version 1)\n(deny default)\n\n");
    p.push_str(";; processes: run programs, signal only processes of this sandbox\n");
    p.push_str("(allow process-exec)\n(allow process-fork)\n");
    p.push_str(
        "(allow signal (target same-sandbox))\n(allow process-info* (target same-sandbox))\n",
    );
    p.push_str("(allow sysctl-read)\n(allow file-read-metadata)\n");
    p.push_str("(allow mach-lookup (global-name \"com.apple.system.opendirectoryd.libinfo\"))\n");
    p.push_str("(allow mach-lookup (global-name \"com.apple.system.notification_center\"))\n");
    p.push_str(
        "(allow ipc-posix-shm-read-data (ipc-posix-name \"apple.shm.notification_center\"))\n",
    );
    p.push_str("(allow pseudo-tty)\n\n");

    p.push_str(";; system, read-only\n(allow file-read*");
    for dir in MACOS_SYSTEM_READ {
        let _ = write!(p, "\n  (subpath {})", quote(Path::new(dir)));
    }
    p.push_str(")\n");
    // Root owns the password hashes, and owner bits need no privilege: as in the Linux view,
    // the system read list does not show them (a later grant still may).
    p.push_str(
        "(deny file-read* (literal \"/private/etc/master.passwd\") (literal \"/etc/master.passwd\"))\n",
    );
    p.push_str("(allow file-read* file-write*\n  (literal \"/dev/null\") (literal \"/dev/zero\")\n  (literal \"/dev/random\") (literal \"/dev/urandom\")\n  (literal \"/dev/tty\") (literal \"/dev/ptmx\") (regex #\"^/dev/ttys[0-9]+$\"))\n");
    p.push_str("(allow file-ioctl (literal \"/dev/tty\") (regex #\"^/dev/ttys[0-9]+$\"))\n\n");

    if !policy.fs.read.is_empty() {
        p.push_str(";; granted read-only\n(allow file-read*");
        for g in &policy.fs.read {
            let _ = write!(p, "\n  (subpath {})", quote(&g.path));
        }
        p.push_str(")\n");
    }
    p.push_str(
        ";; writable: the worktree, git data, TMPDIR, grants\n(allow file-read* file-write*",
    );
    for g in &policy.fs.write {
        let _ = write!(p, "\n  (subpath {})", quote(&g.path));
    }
    p.push_str(")\n\n");

    if let Some(git) = &policy.workspace.git {
        if !policy.unprotected_git {
            p.push_str(
                ";; last match wins: code-running git data stays read-only\n(deny file-write*",
            );
            for sub in ["hooks", "info"] {
                let _ = write!(p, "\n  (subpath {})", quote(&git.common_dir.join(sub)));
            }
            for file in ["config", "packed-refs"] {
                let _ = write!(p, "\n  (literal {})", quote(&git.common_dir.join(file)));
            }
            let _ = write!(
                p,
                "\n  (literal {})",
                quote(&git.worktree_gitdir.join("config.worktree"))
            );
            for pointer in &git.pointers {
                let _ = write!(p, "\n  (literal {})", quote(&pointer.path));
            }
            // A name that does not exist yet (a main git dir's `commondir`): SBPL matches the
            // path, so its creation is refused too.
            for absent in &git.absent_pointers {
                let _ = write!(p, "\n  (literal {})", quote(absent));
            }
            p.push_str(")\n\n");
        }
    }

    match policy.net.open_ports(policy.hook_port) {
        None => p.push_str(";; network: open\n(allow network*)\n"),
        Some(ports) => {
            p.push_str(";; network: blocked except these localhost TCP ports and unix sockets\n");
            p.push_str("(allow network-outbound (remote unix-socket))\n");
            for port in ports {
                let _ = writeln!(
                    p,
                    "(allow network-outbound (remote tcp \"localhost:{port}\"))\n(allow network-bind network-inbound (local tcp \"localhost:{port}\"))"
                );
            }
        }
    }
    if let NetPolicy::Block { .. } = policy.net {
        p.push_str("(deny network-outbound (remote udp))\n");
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::linked_policy;

    #[test]
    fn denies_by_default_and_allows_the_grants() {
        let sbpl = compile(&linked_policy(false));
        assert!(sbpl.starts_with("(version 1)\n(deny default)"));
        assert!(sbpl.contains("(allow file-read* file-write*\n  (subpath \"/work/task\")"));
        assert!(sbpl.contains("(subpath \"/repo/.git/objects\")"));
        assert!(sbpl.contains("(allow network*)"));
    }

    #[test]
    fn git_hooks_and_config_are_denied_after_the_allows() {
        let sbpl = compile(&linked_policy(false));
        let allow = sbpl.find("(subpath \"/work/task\")").unwrap();
        let deny = sbpl.find("(deny file-write*").unwrap();
        assert!(
            deny > allow,
            "last match wins: the deny must come after the allow"
        );
        let denied = &sbpl[deny..];
        for path in [
            "(subpath \"/repo/.git/hooks\")",
            "(literal \"/repo/.git/config\")",
            "(literal \"/repo/.git/packed-refs\")",
            "(literal \"/work/task/.git\")",
            "(literal \"/repo/.git/worktrees/task/config.worktree\")",
        ] {
            assert!(denied.contains(path), "{path} missing from:\n{denied}");
        }
    }

    #[test]
    fn a_main_worktree_is_protected_too() {
        let mut p = linked_policy(false);
        let git = p.workspace.git.as_mut().unwrap();
        git.is_linked = false;
        git.common_dir = "/work/task/.git".into();
        let sbpl = compile(&p);
        assert!(sbpl.contains("(subpath \"/work/task/.git/hooks\")"));
    }

    #[test]
    fn blocked_network_allows_only_localhost_ports() {
        let sbpl = compile(&linked_policy(true));
        assert!(!sbpl.contains("(allow network*)"));
        assert!(sbpl.contains("(remote tcp \"localhost:3000\")"));
        assert!(sbpl.contains("(remote tcp \"localhost:7465\")"));
        assert!(sbpl.contains("(deny network-outbound (remote udp))"));
    }

    #[test]
    fn the_password_hashes_are_denied_after_the_system_read_list() {
        let sbpl = compile(&linked_policy(false));
        let allow = sbpl.find("(subpath \"/private/etc\")").unwrap();
        let deny = sbpl
            .find("(deny file-read* (literal \"/private/etc/master.passwd\")")
            .unwrap();
        assert!(deny > allow, "last match wins:\n{sbpl}");
    }

    #[test]
    fn paths_are_quoted() {
        assert_eq!(quote(Path::new("/a \"b\"\\c")), "\"/a \\\"b\\\"\\\\c\"");
    }
}
