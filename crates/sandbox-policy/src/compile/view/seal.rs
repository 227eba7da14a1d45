//! The folders the view makes only to hold the project's mounts, sealed read-only.
//!
//! A linked worktree at `/tmp/x/wt` whose main checkout is `/tmp/x/main` gets binds at both
//! places; on the private `/tmp` the view then has to make `/tmp/x` and `/tmp/x/main` as plain
//! directories to hold them. Left writable, a write there (`echo > /tmp/x/main/notes`)
//! succeeds inside and lands in the private `/tmp`, where the host has the user's real files
//! at that path: gone at the end, and nothing says so. The same holds in the private home
//! (`~/src/wt` beside `~/src/main`), where the write stays in the private home instead of the
//! user's checkout. So the topmost such folder is bound over itself, read-only, after every
//! other mount: the tool fails at once with `EROFS`, and `sandbox why` names the seal.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::MountOp;
use crate::model::Policy;

/// Why a seal is there (`policy show`, `sandbox why`).
pub(super) const WHY: &str = "a folder the view made only to hold your project's mounts; the \
     host's files there are not shown, so nothing may be written in it";

/// One read-only seal for each topmost folder that the view makes on a private tree (its
/// `/tmp`, the private home) only to hold a mount of the project: the worktree, its git
/// directories, the push remotes. Appended after every other operation (the seal binds the
/// folder over itself with what is mounted below it).
pub(super) fn seal_ops(policy: &Policy, ops: &[MountOp]) -> Vec<MountOp> {
    let mut project: Vec<&Path> = vec![policy.workspace.root.as_path()];
    if let Some(git) = &policy.workspace.git {
        project.push(&git.common_dir);
        project.push(&git.worktree_gitdir);
        project.extend(git.push_remotes.iter().map(PathBuf::as_path));
    }
    let tops: BTreeSet<PathBuf> = project
        .into_iter()
        .filter_map(|path| holder(ops, path))
        .collect();
    tops.into_iter()
        .map(|target| MountOp::Seal { target, why: WHY })
        .collect()
}

/// The topmost folder between `path` and the mount it lands in, when that mount is a private
/// tree of the view and `path` is not directly inside it.
fn holder(ops: &[MountOp], path: &Path) -> Option<PathBuf> {
    let (mount, op) = path.ancestors().skip(1).find_map(|at| {
        ops.iter()
            .rev()
            .find(|op| op.target() == at)
            .map(|op| (at, op))
    })?;
    if !private_tree(op) || path.parent() == Some(mount) {
        return None;
    }
    let first = path.strip_prefix(mount).ok()?.components().next()?;
    Some(mount.join(first))
}

/// A writable tree of the view's own, not the host's: a tmpfs other than the root's and
/// `/dev`'s, or a writable bind from elsewhere (the private home at the home's path).
fn private_tree(op: &MountOp) -> bool {
    match op {
        MountOp::Tmpfs { target, .. } => target != Path::new("/") && target != Path::new("/dev"),
        MountOp::Bind {
            source,
            target,
            dir: true,
            readonly: false,
            ..
        } => source != target,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{compile, EntryKind, MountOp, ViewPlan};
    use super::*;
    use crate::model::{CacheLayer, HomePolicy};
    use crate::testutil::linked_policy;

    /// The test policy's linked worktree (`/work/task`, its store `/repo/.git`) moved to
    /// `worktree` and `main`.
    fn moved(worktree: &str, main: &str) -> Policy {
        let json = serde_json::to_string(&linked_policy(false)).unwrap();
        let json = json.replace("/work/task", worktree).replace("/repo", main);
        serde_json::from_str(&json).unwrap()
    }

    fn classify(path: &Path) -> EntryKind {
        let p = path.to_str().unwrap();
        if p == "/dev/null" || p.ends_with("/HEAD") || p.ends_with("wt/.git") {
            EntryKind::File
        } else {
            EntryKind::Dir
        }
    }

    fn seals(plan: &ViewPlan) -> Vec<String> {
        plan.ops
            .iter()
            .filter_map(|op| match op {
                MountOp::Seal { target, .. } => Some(target.display().to_string()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_main_checkout_beside_a_linked_worktree_on_the_private_tmp_is_sealed_last() {
        let plan = compile(&moved("/tmp/x/wt", "/tmp/x/main"), &classify, None).unwrap();
        assert_eq!(seals(&plan), ["/tmp/x"]);
        assert!(matches!(plan.ops.last(), Some(MountOp::Seal { .. })));
        // Apart, each has its own holder.
        let plan = compile(&moved("/tmp/a/wt", "/tmp/b/c/main"), &classify, None).unwrap();
        assert_eq!(seals(&plan), ["/tmp/a", "/tmp/b"]);
    }

    #[test]
    fn a_worktree_directly_on_a_private_tree_or_on_the_hosts_needs_no_seal() {
        // The worktree's parent is /tmp itself; the main checkout's files are hidden.
        let plan = compile(&moved("/tmp/wt", "/tmp/main"), &classify, None).unwrap();
        assert_eq!(seals(&plan), ["/tmp/main"]);
        // On the host's own tree (no private tree above it), nothing to seal.
        let plan = compile(&linked_policy(false), &classify, None).unwrap();
        assert!(seals(&plan).is_empty(), "{plan:?}");
    }

    #[test]
    fn in_the_private_home_the_projects_holders_are_sealed_and_the_caches_holders_not() {
        let mut p = moved("/home/u/src/wt", "/home/u/src/main");
        p.fs.home = Some(HomePolicy {
            path: "/home/u".into(),
            dir: "/state/homes/h".into(),
            scope: "per-task".into(),
            toolchains: Vec::new(),
            caches: vec![CacheLayer {
                path: "/home/u/.cargo/registry".into(),
                lower: "/home/u/.cargo/registry".into(),
                upper: "/state/layers/u".into(),
                work: "/state/layers/w".into(),
                name: "cargo-registry".into(),
            }],
            masked: Vec::new(),
            cache_cap_bytes: None,
        });
        let plan = compile(&p, &classify, None).unwrap();
        assert_eq!(seals(&plan), ["/home/u/src"]);
    }
}
