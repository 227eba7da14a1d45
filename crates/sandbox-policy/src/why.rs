//! `sandbox why PATH`: whether a path is visible and writable in the next run, and what
//! decides it — a grant, a toolchain, a cache layer, the private home, an agent profile —
//! answered from the compiled policy (and its private view, where the backend has one). Pure.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::agents::AgentAccess;
use crate::compile::view::{MountOp, ViewPlan};
use crate::model::Policy;

/// The answer for one path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Explanation {
    pub path: PathBuf,
    pub visible: bool,
    pub writable: bool,
    /// The rule that decides, as `policy show` names it: `rw bind /home/u/.claude/projects
    /// (the agent profile)`.
    pub decided_by: String,
    /// Where the rule comes from, in words (the profile's reason, the toolchain's name, the
    /// grant's flag), when there is more to say.
    pub because: Vec<String>,
    /// When the run sees another file at this path (the private home's, not the user's): that
    /// file, and what put it there. The user's own file is then not visible at all, whatever
    /// `visible` says of the path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shows_instead: Option<(PathBuf, String)>,
}

/// Explains `path` (absolute, canonical as far as it exists) under `policy`: through `view`
/// when the run has a private view (only what it mounts exists), else through the grants
/// alone (the kernel's path rules).
pub fn explain(policy: &Policy, view: Option<&ViewPlan>, path: &Path) -> Explanation {
    let mut because = Vec::new();
    let mut copied = None;
    if let Some(agent) = &policy.agent {
        if let Some(entry) = agent.entry_for(path) {
            because.push(format!(
                "{} profile: {} is {} ({})",
                agent.title,
                entry.path.display(),
                match entry.access {
                    AgentAccess::Read => "read-only",
                    AgentAccess::Write => "writable",
                    AgentAccess::Copy => "a private copy",
                },
                entry.why
            ));
            if entry.access == AgentAccess::Copy && entry.path == path {
                copied = Some(entry.path.clone());
            }
        }
    }
    if let Some(home) = &policy.fs.home {
        if let Some(toolchain) = home.toolchain_of(path) {
            because.push(format!(
                "the {} toolchain ({}), {}",
                toolchain.name,
                toolchain.kind,
                if toolchain.enabled {
                    "mounted read-only"
                } else {
                    "found but not mounted (--toolchain NAME mounts it)"
                }
            ));
        }
        if let Some(cache) = home.caches.iter().find(|c| path.starts_with(&c.path)) {
            because.push(format!(
                "the {} cache: your cache read-only below, the run's private layer ({}) on top",
                cache.name,
                cache.upper.display()
            ));
        }
        if let Some(masked) = home.masked.iter().find(|m| path.starts_with(&m.path)) {
            because.push(format!("a credential file left out ({})", masked.what));
        }
    }
    let (visible, mut writable, mut decided_by) = match view {
        Some(plan) => through_view(plan, path),
        None => through_grants(policy, path),
    };
    // A dry run makes no copy, so the plan shows the host's file; a run binds its copy there.
    if let (Some(at), Some(_)) = (&copied, view) {
        writable = true;
        decided_by = format!(
            "a private copy of {} bound at its place, writable; the host's file is never \
             written nor read back",
            at.display()
        );
    }
    let shows_instead = match (view, &copied) {
        (Some(plan), None) => seen_instead(plan, path),
        _ => None,
    };
    Explanation {
        path: path.to_path_buf(),
        visible,
        writable,
        decided_by,
        because,
        shows_instead,
    }
}

/// The file the run sees at `path` when a bind from elsewhere holds it (the private home's
/// own directory at the home's path), with the bind's reason.
fn seen_instead(plan: &ViewPlan, path: &Path) -> Option<(PathBuf, String)> {
    let innermost = plan
        .ops
        .iter()
        .filter(|op| path.starts_with(op.target()))
        .max_by_key(|op| op.target().components().count())?;
    match innermost {
        MountOp::Bind {
            target,
            source,
            why,
            ..
        } if source != target => {
            let rest = path.strip_prefix(target).ok()?;
            Some((source.join(rest), why.to_string()))
        }
        _ => None,
    }
}

/// The innermost mount at or above `path` decides (the view mounts parents first).
fn through_view(plan: &ViewPlan, path: &Path) -> (bool, bool, String) {
    let innermost = plan
        .ops
        .iter()
        .filter(|op| path.starts_with(op.target()))
        .max_by_key(|op| op.target().components().count());
    match innermost {
        None => (
            false,
            false,
            "nothing in the private view holds it (only the policy's paths exist; `/` is an \
             empty read-only root)"
                .into(),
        ),
        Some(MountOp::Bind {
            target,
            readonly,
            why,
            source,
            ..
        }) => {
            let from = if source == target {
                String::new()
            } else {
                let seen = path
                    .strip_prefix(target)
                    .map(|rest| source.join(rest))
                    .unwrap_or_else(|_| source.clone());
                format!(
                    " from {} (the run sees {}, not the host's file)",
                    source.display(),
                    seen.display()
                )
            };
            (
                true,
                !readonly,
                format!(
                    "{} bind of {}{from} ({why})",
                    if *readonly { "read-only" } else { "writable" },
                    target.display()
                ),
            )
        }
        Some(MountOp::Pin { target, why, .. }) => (
            true,
            false,
            format!("pinned read-only: {} ({why})", target.display()),
        ),
        Some(MountOp::Seal { target, why }) => (
            false,
            false,
            format!("sealed read-only: {} ({why})", target.display()),
        ),
        Some(MountOp::Empty { target, why }) => (
            true,
            false,
            format!(
                "an empty read-only file of the view's own at {} ({why}); the host's file is \
                 not shown",
                target.display()
            ),
        ),
        Some(MountOp::Overlay {
            target, upper, why, ..
        }) => (
            true,
            true,
            format!(
                "overlay at {} ({why}): writes go to {}, never to the host's files",
                target.display(),
                upper.display()
            ),
        ),
        Some(MountOp::Tmpfs { target, .. }) if target == path => (
            true,
            true,
            format!(
                "a private tmpfs at {} (gone when the run ends)",
                target.display()
            ),
        ),
        // Below a private tmpfs the host's file is hidden; the run may make its own.
        Some(MountOp::Tmpfs { target, .. }) => (
            false,
            true,
            format!(
                "a private tmpfs at {}: the host's file there is hidden; what the run creates \
                 is its own, gone when it ends",
                target.display()
            ),
        ),
        Some(MountOp::Devpts { target }) => (
            true,
            true,
            format!("a private devpts at {}", target.display()),
        ),
        Some(MountOp::Symlink { link, target }) => (
            true,
            false,
            format!("a link {} -> {}", link.display(), target.display()),
        ),
    }
}

/// Without a view: the kernel's path rules are unions, so any grant at or above the path
/// gives its access, writing winning.
fn through_grants(policy: &Policy, path: &Path) -> (bool, bool, String) {
    fn deepest<'a>(
        path: &Path,
        grants: impl Iterator<Item = (&'a Path, String)>,
    ) -> Option<(&'a Path, String)> {
        grants
            .filter(|(g, _)| path.starts_with(g))
            .max_by_key(|(g, _)| g.components().count())
    }
    let write = policy
        .fs
        .write
        .iter()
        .map(|g| (g.path.as_path(), g.reason.as_str().to_string()));
    if let Some((g, why)) = deepest(path, write) {
        return (
            true,
            true,
            format!("the writable grant {} ({why})", g.display()),
        );
    }
    let read = policy
        .fs
        .read
        .iter()
        .map(|g| (g.path.as_path(), g.reason.as_str().to_string()))
        .chain(
            policy
                .fs
                .system_read
                .iter()
                .map(|d| (d.as_path(), "system".to_string())),
        );
    if let Some((g, why)) = deepest(path, read) {
        return (
            true,
            false,
            format!("the read-only grant {} ({why})", g.display()),
        );
    }
    (
        false,
        false,
        "no grant covers it (everything not granted is denied)".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::view::{compile, EntryKind};
    use crate::model::{AgentGrantPath, AgentGrants, Grant, GrantReason};
    use crate::testutil::linked_policy;

    fn classify(path: &Path) -> EntryKind {
        match path.to_str().unwrap() {
            "/work/task/.git" | "/home/u/.claude/settings.json" => EntryKind::File,
            _ => EntryKind::Dir,
        }
    }

    fn with_profile() -> Policy {
        let mut p = linked_policy(false);
        p.fs.read.push(Grant {
            path: "/home/u/.claude/settings.json".into(),
            reason: GrantReason::Agent,
        });
        p.fs.write.push(Grant {
            path: "/home/u/.claude/projects".into(),
            reason: GrantReason::Agent,
        });
        let entry = |path: &str, access, why: &str| AgentGrantPath {
            path: path.into(),
            access,
            why: why.into(),
            status: "granted".into(),
            audit: None,
        };
        p.agent = Some(AgentGrants {
            agent: "claude".into(),
            title: "Claude Code".into(),
            selected_by: "--agent".into(),
            paths: vec![
                entry(
                    "/home/u/.claude/settings.json",
                    AgentAccess::Read,
                    "settings with hooks",
                ),
                entry("/home/u/.claude/projects", AgentAccess::Write, "sessions"),
            ],
            commands: vec![],
            env: vec![],
            args: vec![],
        });
        p
    }

    #[test]
    fn the_view_decides_and_the_profile_says_why() {
        let p = with_profile();
        let plan = compile(&p, &classify, None).unwrap();
        let settings = explain(&p, Some(&plan), Path::new("/home/u/.claude/settings.json"));
        assert!(settings.visible && !settings.writable, "{settings:?}");
        assert!(
            settings.decided_by.contains("read-only bind"),
            "{settings:?}"
        );
        assert!(
            settings.because[0].contains("settings with hooks"),
            "{settings:?}"
        );
        let session = explain(
            &p,
            Some(&plan),
            Path::new("/home/u/.claude/projects/a.jsonl"),
        );
        assert!(session.visible && session.writable, "{session:?}");
        assert!(
            session.because[0].contains("writable (sessions)"),
            "{session:?}"
        );
        let hooks = explain(&p, Some(&plan), Path::new("/repo/.git/hooks/pre-commit"));
        assert!(hooks.visible && !hooks.writable, "{hooks:?}");
        let ssh = explain(&p, Some(&plan), Path::new("/home/u/.ssh/id_ed25519"));
        assert!(!ssh.visible && !ssh.writable, "{ssh:?}");
        assert!(ssh.because.is_empty());
        let tmp = explain(&p, Some(&plan), Path::new("/tmp/x"));
        assert!(!tmp.visible && tmp.writable && tmp.decided_by.contains("hidden"));
        let tmp = explain(&p, Some(&plan), Path::new("/tmp"));
        assert!(tmp.visible && tmp.writable && tmp.decided_by.contains("tmpfs"));
    }

    #[test]
    fn without_a_view_the_grants_decide_writing_winning() {
        let p = with_profile();
        let task = explain(&p, None, Path::new("/work/task/src/main.rs"));
        assert!(task.visible && task.writable && task.decided_by.contains("the task worktree"));
        let usr = explain(&p, None, Path::new("/usr/bin/env"));
        assert!(usr.visible && !usr.writable && usr.decided_by.contains("system"));
        let ssh = explain(&p, None, Path::new("/home/u/.ssh/id_ed25519"));
        assert!(!ssh.visible, "{ssh:?}");
    }
}
