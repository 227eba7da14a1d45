//! Policy → the private filesystem view of the native backend on Linux, as data: the mounts
//! that make up a fresh root in which only the policy's paths exist. `sandbox-host` replays the
//! plan in the child, inside new user and mount namespaces, before Landlock and seccomp.
//!
//! The view is what Landlock's path rules cannot be on their own: a pathname unix socket (a
//! tmux server, the D-Bus session bus, `docker.sock`, an ssh-agent) is reachable by `connect()`
//! whatever the rules say, unless it does not exist. In the view it does not: the root is an
//! empty read-only tmpfs, `/tmp` is private, `/dev` minimal, and every other path is bound in
//! from the host at the same place — read-only unless the policy grants writing.
//!
//! Git data gets one more rule, which Landlock cannot express: read-only binds *inside* a
//! writable tree. A main worktree's `.git/hooks`, `.git/config` and `.git/info` are bound
//! read-only over themselves and `.git` is made a mount point (so it can be neither replaced
//! nor renamed); a linked worktree's pointer files (`.git`, `commondir`, `gitdir`) are bound
//! read-only, so no host-side repair is needed in the first place.
//!
//! A linked worktree's git store is quarantined ([`GitStoreLayers`]): the common dir becomes
//! an overlay whose writable layer is a private directory of the run, so new objects and ref
//! updates land there and never in the repository. The host reads that layer and applies
//! what is allowed (the task's own refs, objects whose hash it checked). Existing refs other
//! than the task branch are pinned read-only inside the overlay, so the agent gets an error
//! instead of a private fiction. `packed-refs` is the snapshot's frozen copy: a run may rewrite it
//! in its layer (git does, to delete a ref), and the host judges the refs it names.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::PolicyError;
use crate::model::{GitLayout, GrantReason, HomePolicy, Policy};

mod seal;

/// What a host path is, as the platform step finds it (the compiler itself does no I/O).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    File,
    /// A symbolic link with this target (recreated as a link in the view: `/bin -> usr/bin`).
    Symlink(PathBuf),
    Missing,
}

/// One step of building the view. Paths are absolute as the command will see them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "op")]
pub enum MountOp {
    /// A fresh tmpfs at `target` with permission `mode`.
    Tmpfs { target: PathBuf, mode: u32 },
    /// The host's `source` at `target` (the same path), with everything mounted below it.
    Bind {
        source: PathBuf,
        target: PathBuf,
        /// A directory (else a file: the mount point is an empty file).
        dir: bool,
        readonly: bool,
        why: &'static str,
    },
    /// A symbolic link at `link` pointing to `target`.
    Symlink { link: PathBuf, target: PathBuf },
    /// A private devpts instance at `target` (`newinstance`, `ptmxmode=0666`): the command
    /// can open new pseudo-terminals, and none of the host's exists in it.
    Devpts { target: PathBuf },
    /// An overlay at `target`: the host's `lower` layers (first on top), read-only, under a
    /// writable `upper` layer that only the host reads back (`work` is overlayfs's own).
    Overlay {
        target: PathBuf,
        lower: Vec<PathBuf>,
        upper: PathBuf,
        work: PathBuf,
        why: &'static str,
    },
    /// What the view already shows at `target` (inside an overlay), bound read-only over
    /// itself: it can be neither written, replaced, renamed nor removed.
    Pin {
        target: PathBuf,
        dir: bool,
        why: &'static str,
    },
    /// An empty file of the view's own, read-only, over the host's file at `target` (which
    /// a bind of its directory shows): the run sees the name and no content.
    Empty { target: PathBuf, why: &'static str },
    /// A folder the view made on a private tree only to hold the project's mounts, bound
    /// over itself with everything below it, then made read-only (that mount alone): last of
    /// all ([`seal`]).
    Seal { target: PathBuf, why: &'static str },
}

impl MountOp {
    pub fn target(&self) -> &Path {
        match self {
            MountOp::Tmpfs { target, .. }
            | MountOp::Bind { target, .. }
            | MountOp::Overlay { target, .. }
            | MountOp::Pin { target, .. }
            | MountOp::Empty { target, .. }
            | MountOp::Seal { target, .. }
            | MountOp::Devpts { target } => target,
            MountOp::Symlink { link, .. } => link,
        }
    }

    /// Among mounts at the same depth: binds first, then an overlay over what they bound,
    /// then pins inside it, then the empty files over what all of them show.
    fn rank(&self) -> u8 {
        match self {
            MountOp::Overlay { .. } => 1,
            MountOp::Pin { .. } => 2,
            MountOp::Empty { .. } => 3,
            _ => 0,
        }
    }
}

/// The run's quarantine of a linked worktree's git store, as the host laid it out: the
/// overlay's private layers and the refs to pin read-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GitStoreLayers {
    /// The overlay's writable layer (ours, outside every grant).
    pub upper: PathBuf,
    /// overlayfs's work directory, on the same filesystem as `upper`.
    pub work: PathBuf,
    /// A read-only layer above the common dir: a frozen `packed-refs`, and a loose copy of
    /// every packed-only ref that is pinned (a pin needs a file to bind).
    pub snapshot: PathBuf,
    /// Ref names (`refs/heads/main`) shown read-only: every ref that existed at the start
    /// except the task branch and `refs/stash`.
    pub pinned_refs: Vec<String>,
    /// The quarantines of the push remotes (`--allow-push`), each an overlay of the same
    /// kind on the remote's git dir.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remotes: Vec<RemoteStoreLayers>,
}

/// The quarantine of one push remote: [`GitStoreLayers`] over `gitdir` (its own `remotes`
/// unused).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RemoteStoreLayers {
    pub gitdir: PathBuf,
    pub layers: GitStoreLayers,
}

/// The whole view, in the order the mounts must be made (a parent before what lies in it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ViewPlan {
    pub ops: Vec<MountOp>,
}

/// Links every `/dev` has, pointing into the process's own descriptors.
const DEV_LINKS: &[(&str, &str)] = &[
    ("/dev/fd", "/proc/self/fd"),
    ("/dev/stdin", "/proc/self/fd/0"),
    ("/dev/stdout", "/proc/self/fd/1"),
    ("/dev/stderr", "/proc/self/fd/2"),
];

/// The host's pseudo-terminals: never bound. Either in the policy's devices gives the view a
/// private devpts instance instead, with `/dev/ptmx` a link to its own `ptmx`.
const DEVPTS: &str = "/dev/pts";
const PTMX: &str = "/dev/ptmx";

/// The password and group hashes. Their owner is root, so a run as root reads them through the
/// system bind of `/etc` whatever its capabilities (owner bits need none); the view shows each
/// as an empty file instead, unless a grant names the file itself.
pub const SHADOW_FILES: &[&str] = &[
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/shadow-",
    "/etc/gshadow-",
];

fn depth(path: &Path) -> usize {
    path.components().count()
}

/// Compiles the view of `policy`. `classify` tells what each host path is (a symlink among
/// the system directories is recreated, a missing one skipped). Refuses git layouts even the
/// view cannot protect (`extensions.worktreeConfig`), unless the user accepted the risk.
pub fn compile(
    policy: &Policy,
    classify: &dyn Fn(&Path) -> EntryKind,
    store: Option<&GitStoreLayers>,
) -> Result<ViewPlan, PolicyError> {
    if let Some(problem) = view_git_problem(policy) {
        return Err(PolicyError::UnprotectedGit(problem));
    }
    if let Some(hooks) = writable_hooks_path(policy) {
        if classify(hooks) == EntryKind::Missing {
            return Err(PolicyError::UnprotectedGit(format!(
                "core.hooksPath is {}, inside what the sandbox may write, and it does not exist \
                 yet: the sandbox could create it and put hooks there that run on the host. \
                 Create it (`mkdir -p {}`) so the view can keep it read-only, or pass \
                 --unprotected-git to accept the risk.",
                hooks.display(),
                hooks.display()
            )));
        }
    }
    // Tmpfs and links first (they are the skeleton), then binds, parents before children, a
    // read-only bind inside a writable one (and the reverse) ordered by depth.
    let mut ops = vec![
        MountOp::Tmpfs {
            target: "/dev".into(),
            mode: 0o755,
        },
        MountOp::Tmpfs {
            target: "/tmp".into(),
            mode: 0o1777,
        },
    ];
    for (link, target) in DEV_LINKS {
        ops.push(MountOp::Symlink {
            link: link.into(),
            target: target.into(),
        });
    }
    let mut binds: Vec<MountOp> = Vec::new();
    // A link inside the private home (a toolchain's `~/.nix-profile`) is made there by the
    // host, before the run: the home is bound from the host, not built on a tmpfs.
    let in_home = |path: &Path| {
        policy
            .fs
            .home
            .as_ref()
            .is_some_and(|h| path.starts_with(&h.path))
    };
    let mut bind = |source: &Path, readonly: bool, why: &'static str| match classify(source) {
        EntryKind::Missing => {}
        EntryKind::Symlink(_) if in_home(source) => {}
        EntryKind::Symlink(target) => ops_link(&mut binds, source, target),
        kind => binds.push(MountOp::Bind {
            source: source.to_path_buf(),
            target: source.to_path_buf(),
            dir: kind == EntryKind::Dir,
            readonly,
            why,
        }),
    };
    for dir in &policy.fs.system_read {
        bind(dir, true, "system");
    }
    // Device nodes read-only: writing to a device works on a read-only mount, changing the
    // host's node (its mode, owner, times) does not.
    let is_pty = |dev: &PathBuf| dev == Path::new(DEVPTS) || dev == Path::new(PTMX);
    for dev in policy.fs.devices.iter().filter(|dev| !is_pty(dev)) {
        bind(dev, true, "device (read-only node)");
    }
    let written: BTreeSet<&Path> = policy.fs.write.iter().map(|g| g.path.as_path()).collect();
    let copied: BTreeSet<&Path> = policy.fs.copies.iter().map(|c| c.path.as_path()).collect();
    for grant in &policy.fs.read {
        if !written.contains(grant.path.as_path()) && !copied.contains(grant.path.as_path()) {
            bind(&grant.path, true, grant.reason.as_str());
        }
    }
    // Under the quarantine, the store's writable dirs are the overlay's, never the host's.
    let quarantine = policy.workspace.git.as_ref().and_then(|git| {
        let on = git.quarantined(&policy.workspace.root, policy.unprotected_git);
        store.filter(|_| on).map(|store| (git, store))
    });
    let home = policy.fs.home.as_ref();
    for grant in &policy.fs.write {
        // The private home is bound at the real home's path, below.
        if grant.reason == GrantReason::Home && home.is_some_and(|h| h.dir == grant.path) {
            continue;
        }
        if let Some((git, _)) = quarantine {
            if grant.path.starts_with(&git.common_dir) && grant.path != git.worktree_gitdir {
                continue;
            }
        }
        bind(&grant.path, false, grant.reason.as_str());
    }
    if let Some(git) = &policy.workspace.git {
        if !policy.unprotected_git {
            for (path, readonly, why) in git_binds(policy, git) {
                bind(&path, readonly, why);
            }
        }
    }
    for (path, readonly, why) in host_file_binds(policy, classify) {
        bind(&path, readonly, why);
    }
    // A private copy at the real path, writable; the host's file is never bound. One the host
    // put in the private home is there already, a plain file the run may replace. One of a
    // file the host lacks (a profile's settings alone) is only ever in the private home:
    // there is no host file to bind it over.
    for copy in &policy.fs.copies {
        if home.is_some_and(|h| copy.copy.starts_with(&h.dir)) {
            continue;
        }
        if classify(&copy.copy) == EntryKind::File && classify(&copy.path) == EntryKind::File {
            binds.push(MountOp::Bind {
                source: copy.copy.clone(),
                target: copy.path.clone(),
                dir: false,
                readonly: false,
                why: "a private copy (the host's file is untouched)",
            });
        }
    }
    if let Some((git, store)) = quarantine {
        binds.extend(store_ops(git, store, classify));
        for remote in &store.remotes {
            binds.extend(remote_store_ops(remote, classify));
        }
    }
    if let Some(home) = home {
        binds.extend(home_ops(home));
    }
    binds.extend(shadow_ops(policy, &binds, classify));
    if policy.fs.devices.iter().any(is_pty) {
        binds.push(MountOp::Devpts {
            target: DEVPTS.into(),
        });
        ops_link(&mut binds, Path::new(PTMX), "pts/ptmx".into());
    }
    // Stable: equal depths keep their order (a read grant before a write grant of the same
    // depth elsewhere does not matter; the same path is never bound twice above).
    binds.sort_by_key(|op| (depth(op.target()), op.rank()));
    ops.extend(binds);
    let seals = seal::seal_ops(policy, &ops);
    ops.extend(seals);
    Ok(ViewPlan { ops })
}

/// An empty file over each of [`SHADOW_FILES`] that a directory bind of `binds` shows (and
/// that is a file on the host), unless a grant names it.
fn shadow_ops(
    policy: &Policy,
    binds: &[MountOp],
    classify: &dyn Fn(&Path) -> EntryKind,
) -> Vec<MountOp> {
    let named = |path: &Path| {
        policy
            .fs
            .read
            .iter()
            .chain(&policy.fs.write)
            .any(|g| g.path == path)
    };
    SHADOW_FILES
        .iter()
        .map(Path::new)
        .filter(|file| {
            binds.iter().any(|op| {
                matches!(op, MountOp::Bind { target, dir: true, .. } if file.starts_with(target))
            })
        })
        .filter(|file| !named(file) && classify(file) == EntryKind::File)
        .map(|file| MountOp::Empty {
            target: file.to_path_buf(),
            why: "password hashes: an empty file in their place",
        })
        .collect()
}

/// The private home at the real home's path (the toolchains' read-only binds stack on it:
/// they are read grants) and the package caches as overlays. Credential files inside a
/// toolchain were left out of its grants by the host (`HomePolicy::masked`): they do not exist.
fn home_ops(home: &HomePolicy) -> Vec<MountOp> {
    let mut ops = vec![MountOp::Bind {
        source: home.dir.clone(),
        target: home.path.clone(),
        dir: true,
        readonly: false,
        why: "the private home",
    }];
    for cache in &home.caches {
        ops.push(MountOp::Overlay {
            target: cache.path.clone(),
            lower: vec![cache.lower.clone()],
            upper: cache.upper.clone(),
            work: cache.work.clone(),
            why: "package cache, copy-on-write",
        });
    }
    ops
}

fn ops_link(ops: &mut Vec<MountOp>, link: &Path, target: PathBuf) {
    ops.push(MountOp::Symlink {
        link: link.to_path_buf(),
        target,
    });
}

/// The quarantined store: the overlay on the common dir (mounted over its read-only bind, so
/// the bind's Landlock rule still covers it), then the pins inside it.
fn store_ops(
    git: &GitLayout,
    store: &GitStoreLayers,
    classify: &dyn Fn(&Path) -> EntryKind,
) -> Vec<MountOp> {
    let common = &git.common_dir;
    let mut ops = vec![MountOp::Overlay {
        target: common.clone(),
        lower: vec![store.snapshot.clone(), common.clone()],
        upper: store.upper.clone(),
        work: store.work.clone(),
        why: "git store quarantine",
    }];
    // The main worktree's HEAD is a ref like the others. Hooks, config and info are not
    // pinned: what the sandbox writes there stays in its layer, which no git on the host
    // reads (and `git branch -d` rewriting config would fail on a pin).
    if classify(&common.join("HEAD")) == EntryKind::File {
        ops.push(MountOp::Pin {
            target: common.join("HEAD"),
            dir: false,
            why: "the main worktree's HEAD (read-only)",
        });
    }
    // `packed-refs` is not pinned: the snapshot layer holds a frozen copy, and git before
    // 2.43 rewrites it to delete any ref (`git tag -d`), which a pin would refuse. What the
    // run writes there stays in its layer: the host reads it only to judge the refs it names,
    // as it judges loose refs, and never replaces its own.
    for name in &store.pinned_refs {
        ops.push(MountOp::Pin {
            target: common.join(name),
            dir: false,
            why: "a ref that is not the task's (read-only)",
        });
    }
    ops
}

/// A push remote's quarantine: the overlay on its git dir (mounted over the read-only bind
/// of its grant), the refs that existed pinned (`packed-refs` is judged like the store's), and what git would run
/// from — `hooks/`, `config` — pinned too: a push inside runs the remote's hooks inside,
/// and none the agent writes there ever reaches the host (the layer is never read for them).
fn remote_store_ops(
    remote: &RemoteStoreLayers,
    classify: &dyn Fn(&Path) -> EntryKind,
) -> Vec<MountOp> {
    let gitdir = &remote.gitdir;
    let store = &remote.layers;
    let mut ops = vec![MountOp::Overlay {
        target: gitdir.clone(),
        lower: vec![store.snapshot.clone(), gitdir.clone()],
        upper: store.upper.clone(),
        work: store.work.clone(),
        why: "git push remote quarantine",
    }];
    for (name, dir) in [("hooks", true), ("config", false), ("info", true)] {
        let kind = classify(&gitdir.join(name));
        if kind == if dir { EntryKind::Dir } else { EntryKind::File } {
            ops.push(MountOp::Pin {
                target: gitdir.join(name),
                dir,
                why: "the push remote's hooks, config, info (read-only)",
            });
        }
    }
    for name in &store.pinned_refs {
        ops.push(MountOp::Pin {
            target: gitdir.join(name),
            dir: false,
            why: "a ref of the push remote that is not the task's (read-only)",
        });
    }
    ops
}

/// `core.hooksPath` when it lies inside a writable grant (`.husky`, `.githooks`): git on the
/// host runs the hooks from there, so the view keeps it read-only.
fn writable_hooks_path(policy: &Policy) -> Option<&Path> {
    if policy.unprotected_git {
        return None;
    }
    let hooks = policy.workspace.git.as_ref()?.hooks_path.as_deref()?;
    policy
        .fs
        .write
        .iter()
        .any(|g| hooks.starts_with(&g.path))
        .then_some(hooks)
}

/// The extra git binds of the view: what must stay read-only inside the writable tree.
fn git_binds(policy: &Policy, git: &GitLayout) -> Vec<(PathBuf, bool, &'static str)> {
    let mut binds = Vec::new();
    if let Some(hooks) = writable_hooks_path(policy) {
        binds.push((hooks.to_path_buf(), true, "core.hooksPath (read-only)"));
    }
    if git.is_linked && !git.common_dir.starts_with(&policy.workspace.root) {
        // The pointer files: rewriting one would re-point the host's git.
        for pointer in &git.pointers {
            binds.push((pointer.path.clone(), true, "git pointer (read-only)"));
        }
    } else {
        // A main worktree: `.git` itself becomes a mount point (it cannot be renamed or
        // replaced), and what git would run from stays read-only inside it.
        binds.push((git.common_dir.clone(), false, "git dir (a mount point)"));
        for name in ["hooks", "config", "info"] {
            binds.push((
                git.common_dir.join(name),
                true,
                "git hooks, config, info (read-only)",
            ));
        }
    }
    binds
}

/// The files host tools run ([`crate::hostfiles`]) that exist and no grant opened, each
/// bound read-only over itself; a directory holding one inside the worktree (`.claude`)
/// becomes a writable mount point first, so it cannot be renamed away with them. A link is
/// not bound (its target is what the host reads; the after-run check judges the link).
fn host_file_binds(
    policy: &Policy,
    classify: &dyn Fn(&Path) -> EntryKind,
) -> Vec<(PathBuf, bool, &'static str)> {
    let root = &policy.workspace.root;
    let mut binds = Vec::new();
    let mut holders = BTreeSet::new();
    for file in policy
        .workspace
        .host_files
        .iter()
        .filter(|f| f.granted.is_none())
    {
        if !matches!(classify(&file.path), EntryKind::Dir | EntryKind::File) {
            continue;
        }
        let mut holder = file.path.parent();
        while let Some(dir) = holder.filter(|d| d.starts_with(root) && *d != root.as_path()) {
            holders.insert(dir.to_path_buf());
            holder = dir.parent();
        }
        binds.push((
            file.path.clone(),
            true,
            "a file host tools run (read-only; --allow-write opens it)",
        ));
    }
    let holders = holders
        .into_iter()
        .filter(|dir| classify(dir) == EntryKind::Dir)
        .map(|dir| (dir, false, "holds files host tools run (a mount point)"));
    holders.chain(binds).collect()
}

/// Why the view cannot keep this worktree's git from being re-pointed: only
/// `extensions.worktreeConfig`, which makes git read a `config.worktree` the sandbox could
/// create in a writable git dir. Main worktrees and grants covering the common dir are fine
/// here (the read-only binds sit on top of any grant).
pub fn view_git_problem(policy: &Policy) -> Option<String> {
    if policy.unprotected_git {
        return None;
    }
    let git = policy.workspace.git.as_ref()?;
    git.worktree_config.then(|| {
        format!(
            "extensions.worktreeConfig is enabled in {}: git would read {}/config.worktree, \
             which the sandbox must be able to write, so hooks could be re-pointed from \
             inside. Disable it (`git config --unset extensions.worktreeConfig`) or pass \
             --unprotected-git to accept the risk.",
            git.common_dir.join("config").display(),
            git.worktree_gitdir.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CacheLayer, Grant, Masked, Toolchain};
    use crate::testutil::linked_policy;

    fn classify(path: &Path) -> EntryKind {
        match path.to_str().unwrap() {
            "/bin" => EntryKind::Symlink("usr/bin".into()),
            "/nowhere" => EntryKind::Missing,
            "/dev/null" | "/work/task/.git" | "/repo/.git/HEAD" => EntryKind::File,
            p if p.ends_with("/config") => EntryKind::File,
            _ => EntryKind::Dir,
        }
    }

    fn binds(plan: &ViewPlan) -> Vec<(String, bool)> {
        plan.ops
            .iter()
            .filter_map(|op| match op {
                MountOp::Bind {
                    target, readonly, ..
                } => Some((target.display().to_string(), *readonly)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_private_copy_is_bound_writable_at_the_real_path_and_the_hosts_file_never() {
        let mut p = linked_policy(false);
        let real = PathBuf::from("/home/u/.claude.json");
        let copy = PathBuf::from("/state/agents/p/claude/.claude.json");
        p.fs.read.push(Grant {
            path: real.clone(),
            reason: GrantReason::Agent,
        });
        p.fs.copies.push(crate::model::PrivateCopy {
            path: real.clone(),
            copy: copy.clone(),
        });
        let classify = |path: &Path| match path.to_str().unwrap() {
            "/home/u/.claude.json" | "/state/agents/p/claude/.claude.json" => EntryKind::File,
            other => classify(Path::new(other)),
        };
        let plan = compile(&p, &classify, None).unwrap();
        let at_real: Vec<&MountOp> = plan.ops.iter().filter(|op| op.target() == real).collect();
        assert_eq!(
            at_real,
            [&MountOp::Bind {
                source: copy.clone(),
                target: real.clone(),
                dir: false,
                readonly: false,
                why: "a private copy (the host's file is untouched)",
            }]
        );
        // Landlock: under the view the copy's own file is writable; without a view only the
        // host's file is granted, read-only.
        let under = crate::compile::landlock::compile_under_view(&p).unwrap();
        let access = |plan: &crate::compile::landlock::LandlockPlan, path: &Path| {
            plan.paths
                .iter()
                .filter(|r| r.path == path)
                .map(|r| r.access)
                .collect::<Vec<_>>()
        };
        use crate::compile::landlock::Access;
        assert_eq!(access(&under, &copy), [Access::ReadWrite]);
        let bare = crate::compile::landlock::compile(&p).unwrap();
        assert!(access(&bare, &copy).is_empty());
        assert_eq!(access(&bare, &real), [Access::ReadExec]);
    }

    #[test]
    fn the_password_hashes_are_empty_files_unless_a_grant_names_them() {
        let classify = |path: &Path| match path.to_str().unwrap() {
            "/etc/shadow" | "/etc/gshadow" | "/etc/shadow-" => EntryKind::File,
            "/etc/gshadow-" => EntryKind::Missing,
            other => classify(Path::new(other)),
        };
        let empty = |plan: &ViewPlan| -> Vec<String> {
            plan.ops
                .iter()
                .filter_map(|op| match op {
                    MountOp::Empty { target, .. } => Some(target.display().to_string()),
                    _ => None,
                })
                .collect()
        };
        let mut p = linked_policy(false);
        let plan = compile(&p, &classify, None).unwrap();
        assert_eq!(
            empty(&plan),
            ["/etc/shadow", "/etc/gshadow", "/etc/shadow-"]
        );
        // After the bind of /etc that shows them (parents first).
        let at = |target: &str| {
            plan.ops
                .iter()
                .position(|op| op.target() == Path::new(target))
        };
        assert!(at("/etc").unwrap() < at("/etc/shadow").unwrap());
        // A grant of the file itself is the user's word.
        p.fs.read.push(Grant {
            path: "/etc/shadow".into(),
            reason: GrantReason::User,
        });
        let plan = compile(&p, &classify, None).unwrap();
        assert_eq!(empty(&plan), ["/etc/gshadow", "/etc/shadow-"]);
        // Nothing to hide where /etc is not in the view.
        p.fs.system_read.retain(|d| d != Path::new("/etc"));
        let plan = compile(&p, &classify, None).unwrap();
        assert!(empty(&plan).is_empty(), "{:?}", plan.ops);
    }

    #[test]
    fn only_the_policys_paths_are_bound_at_their_own_places() {
        let mut p = linked_policy(false);
        p.fs.system_read.extend(["/bin".into(), "/nowhere".into()]);
        let plan = compile(&p, &classify, None).unwrap();
        let b = binds(&plan);
        assert_eq!(
            b,
            vec![
                ("/usr".into(), true),
                ("/etc".into(), true),
                ("/dev/null".into(), true),
                ("/repo/.git".into(), true),
                ("/work/task".into(), false),
                ("/repo/.git/objects".into(), false),
                ("/work/task/.git".into(), true),
                ("/repo/.git/worktrees/task".into(), false),
            ]
        );
        // A symlinked system dir is a link, a missing one is absent, and /tmp and /dev are
        // fresh.
        assert!(plan.ops.contains(&MountOp::Symlink {
            link: "/bin".into(),
            target: "usr/bin".into()
        }));
        assert!(!plan
            .ops
            .iter()
            .any(|op| op.target() == Path::new("/nowhere")));
        assert!(plan.ops.contains(&MountOp::Tmpfs {
            target: "/tmp".into(),
            mode: 0o1777
        }));
    }

    #[test]
    fn ptys_come_from_a_private_devpts_and_no_host_pty_is_bound() {
        let mut p = linked_policy(false);
        p.fs.devices = vec!["/dev/null".into(), "/dev/ptmx".into(), "/dev/pts".into()];
        let plan = compile(&p, &classify, None).unwrap();
        // Neither the host's /dev/pts nor its /dev/ptmx is bound; the device node is, read-only.
        let b = binds(&plan);
        assert!(!b.iter().any(|(t, _)| t.starts_with("/dev/pt")), "{b:?}");
        assert!(b.contains(&("/dev/null".into(), true)), "{b:?}");
        assert!(plan.ops.contains(&MountOp::Devpts {
            target: "/dev/pts".into()
        }));
        assert!(plan.ops.contains(&MountOp::Symlink {
            link: "/dev/ptmx".into(),
            target: "pts/ptmx".into()
        }));
        // On the view's /dev, which is mounted first.
        let at = |t: &str| {
            plan.ops
                .iter()
                .position(|op| op.target() == Path::new(t))
                .unwrap()
        };
        assert!(at("/dev") < at("/dev/pts") && at("/dev") < at("/dev/ptmx"));
        // Without either in the policy, no devpts at all.
        p.fs.devices = vec!["/dev/null".into()];
        let plan = compile(&p, &classify, None).unwrap();
        assert!(!plan
            .ops
            .iter()
            .any(|op| matches!(op, MountOp::Devpts { .. })));
    }

    #[test]
    fn parents_are_mounted_before_what_lies_in_them() {
        let plan = compile(&linked_policy(false), &classify, None).unwrap();
        let order: Vec<&Path> = plan.ops.iter().map(MountOp::target).collect();
        for (i, a) in order.iter().enumerate() {
            for b in &order[i + 1..] {
                assert!(
                    !a.starts_with(b) || a == b,
                    "{} is mounted before its parent {}",
                    a.display(),
                    b.display()
                );
            }
        }
    }

    #[test]
    fn a_main_worktree_gets_read_only_hooks_config_and_info_inside_it() {
        let mut p = linked_policy(false);
        let git = p.workspace.git.as_mut().unwrap();
        git.is_linked = false;
        git.common_dir = "/work/task/.git".into();
        git.worktree_gitdir = "/work/task/.git".into();
        git.pointers.clear();
        p.fs.read.clear();
        p.fs.write.truncate(1);
        let b = binds(&compile(&p, &classify, None).unwrap());
        assert!(b.contains(&("/work/task".into(), false)));
        assert!(b.contains(&("/work/task/.git".into(), false)), "{b:?}");
        for ro in ["hooks", "config", "info"] {
            assert!(
                b.contains(&(format!("/work/task/.git/{ro}"), true)),
                "{b:?}"
            );
        }
        // With the risk accepted, nothing extra.
        p.unprotected_git = true;
        let b = binds(&compile(&p, &classify, None).unwrap());
        assert_eq!(
            b,
            vec![
                ("/usr".into(), true),
                ("/etc".into(), true),
                ("/dev/null".into(), true),
                ("/work/task".into(), false)
            ]
        );
    }

    #[test]
    fn a_path_granted_both_ways_is_bound_once_writable() {
        let mut p = linked_policy(false);
        p.fs.read.push(Grant {
            path: "/work/task".into(),
            reason: GrantReason::User,
        });
        let b = binds(&compile(&p, &classify, None).unwrap());
        assert_eq!(
            b.iter()
                .filter(|(t, _)| t == "/work/task")
                .collect::<Vec<_>>(),
            vec![&("/work/task".to_string(), false)]
        );
    }

    fn layers() -> GitStoreLayers {
        GitStoreLayers {
            upper: "/private/git/1/upper".into(),
            work: "/private/git/1/work".into(),
            snapshot: "/private/git/1/snapshot".into(),
            pinned_refs: vec!["refs/heads/main".into(), "refs/tags/v1".into()],
            remotes: Vec::new(),
        }
    }

    #[test]
    fn a_quarantined_store_is_an_overlay_with_pins_and_no_host_writable_dirs() {
        let mut p = linked_policy(false);
        p.fs.write.push(Grant {
            path: "/repo/.git/refs".into(),
            reason: GrantReason::GitData,
        });
        let plan = compile(&p, &classify, Some(&layers())).unwrap();
        let b = binds(&plan);
        // The host's objects and refs are never bound writable; the worktree's own gitdir is.
        assert!(!b.iter().any(|(t, _)| t == "/repo/.git/objects"), "{b:?}");
        assert!(!b.iter().any(|(t, _)| t == "/repo/.git/refs"), "{b:?}");
        assert!(b.contains(&("/repo/.git/worktrees/task".into(), false)));
        assert!(b.contains(&("/repo/.git".into(), true)));
        let at = |target: &str| {
            plan.ops
                .iter()
                .position(|op| {
                    op.target() == Path::new(target) && !matches!(op, MountOp::Bind { .. })
                })
                .unwrap_or_else(|| panic!("nothing but a bind at {target}: {:?}", plan.ops))
        };
        let overlay = at("/repo/.git");
        assert!(matches!(
            &plan.ops[overlay],
            MountOp::Overlay { lower, upper, .. }
                if lower == &[PathBuf::from("/private/git/1/snapshot"), "/repo/.git".into()]
                    && upper == Path::new("/private/git/1/upper")
        ));
        // Mounted over the read-only bind of the common dir, pins and the gitdir after it.
        let common_bind = plan
            .ops
            .iter()
            .position(|op| matches!(op, MountOp::Bind { target, .. } if target == Path::new("/repo/.git")))
            .unwrap();
        assert!(common_bind < overlay);
        for pinned in ["/repo/.git/refs/heads/main", "/repo/.git/refs/tags/v1"] {
            assert!(at(pinned) > overlay, "{pinned}");
        }
        // Without the layers (or with --unprotected-git) nothing of this.
        p.unprotected_git = true;
        let plan = compile(&p, &classify, Some(&layers())).unwrap();
        assert!(!plan
            .ops
            .iter()
            .any(|op| matches!(op, MountOp::Overlay { .. } | MountOp::Pin { .. })));
    }

    #[test]
    fn a_hooks_path_inside_the_worktree_is_bound_read_only_and_a_missing_one_refused() {
        let mut p = linked_policy(false);
        p.workspace.git.as_mut().unwrap().hooks_path = Some("/work/task/.husky".into());
        let b = binds(&compile(&p, &classify, None).unwrap());
        assert!(b.contains(&("/work/task/.husky".into(), true)), "{b:?}");
        let at = |path: &str| b.iter().position(|(p, _)| p == path).unwrap();
        assert!(at("/work/task") < at("/work/task/.husky"), "{b:?}");
        // Outside every writable grant (a hooks dir in $HOME): not in the view at all.
        p.workspace.git.as_mut().unwrap().hooks_path = Some("/home/u/.githooks".into());
        let b = binds(&compile(&p, &classify, None).unwrap());
        assert!(!b.iter().any(|(p, _)| p.contains("githooks")), "{b:?}");
        // Not there yet: the sandbox could create it, so the run is refused.
        p.workspace.git.as_mut().unwrap().hooks_path = Some("/work/task/nowhere".into());
        let missing = |path: &Path| {
            if path == Path::new("/work/task/nowhere") {
                EntryKind::Missing
            } else {
                classify(path)
            }
        };
        match compile(&p, &missing, None) {
            Err(PolicyError::UnprotectedGit(why)) => assert!(why.contains("mkdir -p"), "{why}"),
            other => panic!("{other:?}"),
        }
        p.unprotected_git = true;
        assert!(compile(&p, &missing, None).is_ok());
    }

    #[test]
    fn host_files_that_exist_are_bound_read_only_and_a_granted_one_is_not() {
        let mut p = linked_policy(false);
        p.workspace.host_files =
            crate::hostfiles::host_files(Path::new("/work/task"), &[Path::new("/work/task/.idea")]);
        let classify = |path: &Path| match path.to_str().unwrap() {
            "/work/task/.vscode" | "/work/task/.claude" | "/work/task/.idea" => EntryKind::Dir,
            "/work/task/.claude/settings.json" | "/work/task/.gitattributes" => EntryKind::File,
            "/work/task/.envrc" => EntryKind::Symlink("elsewhere".into()),
            other if other.starts_with("/work/task/.") && other != "/work/task/.git" => {
                EntryKind::Missing
            }
            other => classify(Path::new(other)),
        };
        let plan = compile(&p, &classify, None).unwrap();
        let b = binds(&plan);
        for ro in [
            "/work/task/.vscode",
            "/work/task/.claude/settings.json",
            "/work/task/.gitattributes",
        ] {
            assert!(b.contains(&(ro.to_string(), true)), "{ro} in {b:?}");
        }
        assert!(
            b.contains(&("/work/task/.claude".to_string(), false)),
            "{b:?}"
        );
        assert!(
            !b.iter().any(|(t, _)| t == "/work/task/.idea"),
            "granted: {b:?}"
        );
        assert!(!b
            .iter()
            .any(|(t, _)| t.contains(".mcp.json") || t.contains(".envrc")));
        let at = |t: &str| plan.ops.iter().position(|op| op.target() == Path::new(t));
        assert!(at("/work/task") < at("/work/task/.claude"));
        assert!(at("/work/task/.claude") < at("/work/task/.claude/settings.json"));
    }

    #[test]
    fn worktree_config_is_refused_even_with_the_view() {
        let mut p = linked_policy(false);
        p.workspace.git.as_mut().unwrap().worktree_config = true;
        assert!(matches!(
            compile(&p, &classify, None),
            Err(PolicyError::UnprotectedGit(_))
        ));
        p.unprotected_git = true;
        assert!(compile(&p, &classify, None).is_ok());
    }

    #[test]
    fn the_private_home_is_bound_at_the_real_homes_path_with_toolchains_caches_and_masks_on_it() {
        let mut p = linked_policy(false);
        p.fs.write.push(Grant {
            path: "/state/homes/p1".into(),
            reason: GrantReason::Home,
        });
        p.fs.read.push(Grant {
            path: "/home/u/.cargo/bin".into(),
            reason: GrantReason::Toolchain,
        });
        p.fs.home = Some(HomePolicy {
            path: "/home/u".into(),
            dir: "/state/homes/p1".into(),
            scope: "per-project".into(),
            toolchains: vec![Toolchain {
                name: "rust".into(),
                kind: "rustup".into(),
                paths: vec!["/home/u/.cargo/bin".into()],
                enabled: true,
            }],
            caches: vec![CacheLayer {
                name: "cargo-registry".into(),
                path: "/home/u/.cargo/registry".into(),
                lower: "/home/u/.cargo/registry".into(),
                upper: "/state/caches/p1/cargo-registry/upper".into(),
                work: "/state/caches/p1/cargo-registry/work".into(),
            }],
            masked: vec![Masked {
                path: "/home/u/.cargo/bin/credentials.toml".into(),
                dir: false,
                what: "crates.io token".into(),
            }],
            cache_cap_bytes: None,
        });
        let plan = compile(&p, &classify, None).unwrap();
        let b = binds(&plan);
        // The home at the real path, writable; never at its own path on the host.
        assert!(b.contains(&("/home/u".into(), false)), "{b:?}");
        assert!(!b.iter().any(|(t, _)| t.starts_with("/state")), "{b:?}");
        assert!(b.contains(&("/home/u/.cargo/bin".into(), true)), "{b:?}");
        let at = |t: &str| {
            plan.ops
                .iter()
                .position(|op| op.target() == Path::new(t))
                .unwrap()
        };
        assert!(at("/home/u") < at("/home/u/.cargo/bin"));
        assert!(at("/home/u") < at("/home/u/.cargo/registry"));
        assert!(matches!(
            &plan.ops[at("/home/u/.cargo/registry")],
            MountOp::Overlay { lower, upper, .. }
                if lower == &[PathBuf::from("/home/u/.cargo/registry")]
                    && upper.starts_with("/state/caches")
        ));
        assert!(!plan
            .ops
            .iter()
            .any(|op| op.target().ends_with("credentials.toml")));
    }
}
