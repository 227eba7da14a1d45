//! The git store quarantine of one sandboxed run: the agent moves its own branch and nothing
//! else, and no object it writes can replace one the repository has.
//!
//! Inside the sandbox the repository's common dir is an overlay (built by the native
//! backend's private view): the host's store below, read-only, and a private layer of the run
//! on top, which receives every write. [`StoreQuarantine::prepare`] lays that layer out;
//! [`StoreQuarantine::sync`] reads it back and applies what is allowed, the way git's own
//! `receive-pack` quarantine does:
//!
//! - **objects** ([`objects`]): each new loose object is inflated and written into the host's
//!   store by the host, under the hash the host computes — an object whose name lies is
//!   rejected, and an object the store has is never touched. New packs are re-indexed by the
//!   host (libgit2's indexer hashes every object itself) and their new objects copied in.
//! - **refs** ([`refs`]): the task branch (what `HEAD` named at the start) and refs the run
//!   creates are applied with compare-and-swap; every other ref that changed is refused and
//!   reported. Reflogs, `packed-refs`, config and hooks written in the layer are never read.
//!
//! [`LiveQuarantine`] runs the sync on every change of the layer while the command runs (so
//! the host sees commits as they happen) and once more when every process is gone.

pub mod generation;
pub mod gitdir;
mod live;
mod objects;
pub mod refs;
pub mod task;
pub mod trace;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use git2::{Oid, Repository};
use serde::Serialize;

pub use live::LiveQuarantine;
pub use refs::{judge, RefVerdict};

/// At most this many existing refs are pinned read-only inside the sandbox (each is a bind
/// mount at start). Refs beyond it are still protected: the host refuses their updates.
pub const MAX_PINNED_REFS: usize = 1024;

/// An error laying out or reading back the quarantine.
#[derive(Debug, thiserror::Error)]
pub enum QuarantineError {
    #[error("git store quarantine: {what} {path}: {source}", path = .path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("git store quarantine: {what}: {source}")]
    Git {
        what: &'static str,
        source: git2::Error,
    },
    /// The run would take a branch it does not own for its task branch.
    #[error("git: refusing to run in {worktree}: {reason}", worktree = .worktree.display())]
    TaskBranch { worktree: PathBuf, reason: String },
}

fn io<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> QuarantineError + 'a {
    move |source| QuarantineError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

fn git(what: &'static str) -> impl FnOnce(git2::Error) -> QuarantineError {
    move |source| QuarantineError::Git { what, source }
}

/// A ref update the host applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AppliedRef {
    pub name: String,
    /// `None`: the ref was created.
    pub old: Option<String>,
    /// `None`: the ref was deleted.
    pub new: Option<String>,
}

/// A ref update the host refused: the ref is unchanged in the repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefusedRef {
    pub name: String,
    /// What the sandbox set it to (`None`: deleted).
    pub wanted: Option<String>,
    pub reason: String,
}

/// An object the host did not take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RejectedObject {
    /// Relative to the store (`objects/ab/cdef…`).
    pub path: String,
    pub reason: String,
}

/// What the quarantine did for a run (so far).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreReport {
    /// The branch this run owned (`None`: none, `HEAD` detached with no record).
    pub task_branch: Option<String>,
    /// Refs this worktree's runs created and that still exist (later runs may move them).
    pub owned: Vec<String>,
    pub objects_imported: usize,
    pub applied: Vec<AppliedRef>,
    pub refused: Vec<RefusedRef>,
    pub rejected_objects: Vec<RejectedObject>,
    /// The bound of the writable layer, in bytes, when the run filled it (its writes to the
    /// git store then failed with ENOSPC).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer_full: Option<u64>,
    /// Commands inside that failed on a ref or `packed-refs` the host pinned read-only, as
    /// git reported them ([`trace`]): one line each, saying why and what to run on the host.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pinned_failures: Vec<String>,
}

impl StoreReport {
    /// [`Self::warnings`] of a push remote's quarantine: each line names the remote, and
    /// the command to apply a refused update runs there.
    pub fn remote_warnings(&self, remote: &Path) -> Vec<String> {
        let at = remote.display().to_string();
        let quoted = if at
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+".contains(&b))
        {
            at.clone()
        } else {
            format!("'{}'", at.replace('\'', "'\\''"))
        };
        self.warnings()
            .into_iter()
            .map(|line| {
                let line = line.replace("`git update-ref", &format!("`git -C {quoted} update-ref"));
                match line.strip_prefix("git: ") {
                    Some(rest) => format!("git push to {at}: {rest}"),
                    None => line,
                }
            })
            .collect()
    }

    /// One line per refusal and rejection, for stderr.
    pub fn warnings(&self) -> Vec<String> {
        let refused = self.refused.iter().map(|r| {
            let wanted = r.wanted.as_deref().map_or("delete it".to_string(), |w| {
                format!("set it to {}", &w[..w.len().min(12)])
            });
            let yourself = match &r.wanted {
                _ if r.reason.contains("git stash store") => String::new(),
                _ if r.reason.contains("keeps them all") => String::new(),
                Some(w) => format!(
                    " (to apply it on the host: `git update-ref {} {w}`)",
                    r.name
                ),
                None => format!(" (to apply it on the host: `git update-ref -d {}`)", r.name),
            };
            format!(
                "git: refused to {wanted} for {} — {}; the repository keeps it unchanged{yourself}",
                r.name, r.reason
            )
        });
        let rejected = self.rejected_objects.iter().map(|o| {
            format!(
                "git: object {} not taken into the repository — {}",
                o.path, o.reason
            )
        });
        let full = self.layer_full.map(|bytes| {
            format!(
                "git: the git store layer was full ({} MiB): the command's writes to the \
                 repository's store failed (ENOSPC) and what they would have added is missing; \
                 raise the bound with `backends.native.git_store_size_mib` in the configuration",
                bytes >> 20
            )
        });
        refused
            .chain(rejected)
            .chain(full)
            .chain(self.pinned_failures.iter().cloned())
            .collect()
    }
}

/// The layers the private view stacks on the common dir: the view's own description of
/// them, so what is laid out here is what gets mounted.
pub use sandbox_policy::compile::view::GitStoreLayers as Layers;

/// What the sync remembers between passes.
#[derive(Debug, Default)]
struct State {
    /// The last value the host applied to a ref (`None`: deleted).
    applied: HashMap<String, Option<Oid>>,
    /// Refs this run created on the host (it may move and delete them).
    created: HashSet<String>,
    /// Loose objects and packs already handled.
    seen_objects: HashSet<String>,
    seen_packs: HashSet<String>,
    /// Refusals already reported, so a ref is reported once per value.
    refused: HashSet<(String, Option<Oid>)>,
    /// Stash entries this worktree's runs pushed (they may pop and drop them).
    stash_owned: std::collections::BTreeSet<String>,
    report: StoreReport,
}

/// One run's quarantine of a repository's store.
#[derive(Debug)]
pub struct StoreQuarantine {
    common: PathBuf,
    dir: PathBuf,
    layers: Layers,
    task_branch: Option<String>,
    /// Every ref at the start with its direct target (`None` for a symbolic ref).
    start: HashMap<String, Option<Oid>>,
    /// Packed refs at the start (the frozen `packed-refs` the sandbox keeps seeing).
    packed_at_start: HashMap<String, Oid>,
    /// The writable layer as read back: held open since it was checked (see [`HeldDir`]).
    held_upper: Option<HeldDir>,
    /// A writable layer on a tmpfs of its own, mounted in the command's namespace (see
    /// [`StoreQuarantine::bound_layer`]).
    bounded: Option<BoundedLayer>,
    /// Where this worktree's [`task::TaskRecord`] is kept, and the record as of the start.
    record: Option<(PathBuf, task::TaskRecord)>,
    /// The push remotes of the run (`--allow-push`) by the names this repository gives
    /// them: `refs/remotes/<name>/<branch>` follows what the push made of the remote.
    tracking: Vec<(String, PathBuf)>,
    /// The writable place is a full copy of the common dir (a box's generation), not an
    /// overlay's upper layer: refs are read back as [`refs::changed_in_copy`] reads them.
    copy: bool,
    /// The layer is a persistent one stacked directly on the common dir ([`Self::attach`]),
    /// with no snapshot layer between them.
    persistent: bool,
    state: Mutex<State>,
}

/// The writable layer on a size-limited tmpfs that the command's child mounts in its own
/// mount namespace (a user may mount there, not on the host): the child sends a descriptor of
/// the tmpfs back over `socket`, and the host holds it — the layer outlives the namespace
/// for as long as the host needs to read it.
#[derive(Debug)]
struct BoundedLayer {
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    socket: std::os::fd::OwnedFd,
    bytes: u64,
    received: std::sync::OnceLock<HeldDir>,
}

/// What the command's child needs to put the writable layer on a tmpfs of its own: mount a
/// tmpfs of `bytes` at `dir`, make `subdirs` (relative, parents first) in it, and send a
/// descriptor of `dir` over `socket` (one `SCM_RIGHTS` message) before it mounts the overlay.
#[derive(Debug)]
pub struct LayerMount {
    pub dir: PathBuf,
    pub bytes: u64,
    pub subdirs: Vec<PathBuf>,
    pub socket: std::os::fd::OwnedFd,
}

/// A directory held by a descriptor and reached through `/proc/self/fd/<n>`, a name that
/// resolves to that very directory whatever happens to its path. A persistent layer lies in a
/// directory the guest writes: after the host checked `upper`, the guest could rename it and
/// plant a link to another repository's `.git` under its name, and a sync reading paths would
/// then import that repository's objects and refs into this one — where the guest can read
/// them. Every read of the layer goes through the held name instead.
#[derive(Debug)]
struct HeldDir {
    _fd: std::os::fd::OwnedFd,
    path: PathBuf,
}

impl HeldDir {
    /// Opens `dir`, refusing a link in its place (`O_NOFOLLOW`).
    fn open(dir: &Path) -> Result<Self, QuarantineError> {
        use std::os::fd::OwnedFd;
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(dir)
            .map_err(io(
                "opening the writable layer (a directory, not a link)",
                dir,
            ))?;
        Self::from_fd(OwnedFd::from(file))
    }

    fn from_fd(fd: std::os::fd::OwnedFd) -> Result<Self, QuarantineError> {
        use std::os::fd::AsRawFd;
        let path = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        if !path.is_dir() {
            return Err(QuarantineError::Io {
                what: "reaching the writable layer through /proc/self/fd (is /proc mounted?)",
                path,
                source: std::io::Error::other("not a directory"),
            });
        }
        Ok(HeldDir { _fd: fd, path })
    }
}

/// Dirs made in the writable layer up front, so the watcher sees the first ref update there
/// (a dir the overlay creates on the fly might be watched only after the write in it).
const UPPER_SKELETON: &[&str] = &[
    "refs/heads",
    "refs/tags",
    "logs/refs/heads",
    "objects/pack",
    "objects/info",
];

impl StoreQuarantine {
    /// Lays out a new quarantine of `common` under `parent` (a private directory of ours):
    /// the empty writable layer, overlayfs's work dir, and the snapshot layer with a frozen
    /// `packed-refs` and a loose copy of each ref to pin. `task_branch` is the one existing
    /// ref the run may move.
    pub fn prepare(
        common: &Path,
        task_branch: Option<&str>,
        parent: &Path,
    ) -> Result<Self, QuarantineError> {
        let quarantine = Self::with_run_dir(common, task_branch, parent, None)?;
        // From here on, dropping `quarantine` removes the directory.
        quarantine.lay_out()
    }

    /// Attaches to a *persistent* writable layer that something else stacks (a VM view's git
    /// store layer, [`crate::View::store_layer_dir`]): `layer/upper` is read back, `layer/work`
    /// is the overlay's. The host's own scratch space is a new run directory under `parent`
    /// (private, removed on drop); the layer itself is kept. Refs already applied by an
    /// earlier run read as unchanged, since the host holds the same value now.
    pub fn attach(
        common: &Path,
        task_branch: Option<&str>,
        layer: &Path,
        parent: &Path,
    ) -> Result<Self, QuarantineError> {
        let upper = layer.join("upper");
        // The layer is writable from inside: never follow a link planted in place of it.
        for dir in [layer, upper.as_path()] {
            match dir.symlink_metadata() {
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => {
                    return Err(QuarantineError::Io {
                        what: "refusing a layer that is not a directory",
                        path: dir.to_path_buf(),
                        source: std::io::Error::other("not a directory"),
                    })
                }
                Err(e) => return Err(io("reading", dir)(e)),
            }
        }
        let mut quarantine = Self::with_run_dir(common, task_branch, parent, Some(layer))?;
        quarantine.held_upper = Some(HeldDir::open(&upper)?);
        quarantine.make_upper_skeleton()?;
        quarantine.packed_at_start = refs::read_packed(&common.join("packed-refs"))
            .map_err(io("reading", &common.join("packed-refs")))?
            .refs;
        quarantine.start = refs::list(common, &quarantine.packed_at_start);
        Ok(quarantine)
    }

    /// A quarantine with a fresh run directory under `parent` (removed on drop); its layers
    /// are the run directory's own, or `upper/` and `work/` of a persistent `layer`.
    fn with_run_dir(
        common: &Path,
        task_branch: Option<&str>,
        parent: &Path,
        layer: Option<&Path>,
    ) -> Result<Self, QuarantineError> {
        remove_abandoned(parent);
        std::fs::create_dir_all(parent).map_err(io("creating", parent))?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("{}-", std::process::id()))
            .tempdir_in(parent)
            .map_err(io("creating a run directory in", parent))?
            .keep();
        // A run's own layers lie in `layer/`, which the child may cover with a tmpfs.
        let own = dir.join("layer");
        let base = layer.unwrap_or(&own);
        Ok(StoreQuarantine {
            common: common.to_path_buf(),
            layers: Layers {
                upper: base.join("upper"),
                work: base.join("work"),
                snapshot: dir.join("snapshot"),
                pinned_refs: Vec::new(),
                remotes: Vec::new(),
            },
            dir,
            task_branch: task_branch.map(str::to_string),
            start: HashMap::new(),
            packed_at_start: HashMap::new(),
            held_upper: None,
            bounded: None,
            record: None,
            tracking: Vec::new(),
            copy: false,
            persistent: layer.is_some(),
            state: Mutex::new(State::default()),
        })
    }

    /// [`Self::prepare`] for the linked worktree with git dir `gitdir`, its task branch
    /// decided from the private record in `record_dir` ([`task::decide`]) — refused with
    /// [`QuarantineError::TaskBranch`] when `HEAD` names a branch the worktree's runs do not
    /// own. Refs earlier runs created may be moved and deleted; the record is updated as the
    /// run creates and deletes refs (so a run killed outright still leaves it right).
    ///
    /// `push_remotes`: the run's push remotes (`--allow-push`), whose remote-tracking refs
    /// follow the remote ([`Self::track_push_remotes`]) and are not pinned.
    ///
    /// `record_dirs`: where the record is written (the first) and where it may be found (in
    /// order: an earlier version kept it in another place).
    pub fn prepare_task(
        common: &Path,
        gitdir: &Path,
        record_dirs: &[&Path],
        parent: &Path,
        push_remotes: &[PathBuf],
    ) -> Result<Self, QuarantineError> {
        let mut quarantine = Self::for_task(common, gitdir, record_dirs, parent)?;
        quarantine.track_push_remotes(push_remotes);
        quarantine.lay_out()
    }

    /// The quarantine of a box's generation of the common dir (a copy the guest writes, laid
    /// out by [`generation`]): the task branch decided as [`Self::prepare_task`] decides it,
    /// the refs of the start read now; the copy itself is attached once it is out of the
    /// guest's reach ([`Self::attach_copy`]).
    pub fn prepare_copy(
        common: &Path,
        gitdir: &Path,
        record_dirs: &[&Path],
        parent: &Path,
    ) -> Result<Self, QuarantineError> {
        let mut quarantine = Self::for_task(common, gitdir, record_dirs, parent)?;
        let packed = refs::read_packed(&common.join("packed-refs"))
            .map_err(io("reading", &common.join("packed-refs")))?;
        quarantine.start = refs::list(common, &packed.refs);
        quarantine.packed_at_start = packed.refs;
        quarantine.copy = true;
        Ok(quarantine)
    }

    /// [`Self::prepare_copy`] for a generation whose busy period ended with its daemon (read
    /// back by the next one, [`generation::recover`]): the refs of the start as they were
    /// recorded when the generation was laid out, so what the box changed is judged against
    /// what it started from — a ref the host moved since is a compare-and-swap that fails and
    /// is reported, never an undo of the host's move.
    pub fn resume_copy(
        common: &Path,
        gitdir: &Path,
        record_dirs: &[&Path],
        parent: &Path,
        start: HashMap<String, Option<Oid>>,
    ) -> Result<Self, QuarantineError> {
        let mut quarantine = Self::prepare_copy(common, gitdir, record_dirs, parent)?;
        quarantine.start = start;
        Ok(quarantine)
    }

    /// Reads the copy `dir` back from here on: held open by a descriptor (a link in its
    /// place is refused), so a rename or a link planted after this check changes nothing.
    pub fn attach_copy(&mut self, dir: &Path) -> Result<(), QuarantineError> {
        self.held_upper = Some(HeldDir::open(dir)?);
        self.layers.upper = dir.to_path_buf();
        Ok(())
    }

    /// The refs of the start (every ref, with its direct target; `None` for a symbolic one).
    pub fn refs_at_start(&self) -> &HashMap<String, Option<Oid>> {
        &self.start
    }

    /// [`Self::prepare_task`] up to laying out the layers: the task branch decided, the
    /// record kept.
    fn for_task(
        common: &Path,
        gitdir: &Path,
        record_dirs: &[&Path],
        parent: &Path,
    ) -> Result<Self, QuarantineError> {
        let record_dir = record_dirs.first().copied().unwrap_or(parent);
        let found = record_dirs
            .iter()
            .enumerate()
            .find_map(|(i, dir)| task::TaskRecord::load(dir, gitdir).map(|r| (i, r)));
        let moved = found.as_ref().is_some_and(|(i, _)| *i > 0);
        let record = found.map(|(_, r)| r);
        let head = std::fs::read_to_string(gitdir.join("HEAD")).unwrap_or_default();
        let packed = refs::read_packed(&common.join("packed-refs"))
            .map_err(io("reading", &common.join("packed-refs")))?;
        let start = refs::list(common, &packed.refs);
        let branch = task::decide(
            record.as_ref(),
            &task::Head::parse(&head),
            |name| start.contains_key(name),
            |name| task::checked_out_elsewhere(common, gitdir, name),
        )
        .map_err(|reason| QuarantineError::TaskBranch {
            worktree: gitdir.to_path_buf(),
            reason,
        })?;
        let loaded = record.clone();
        let mut record = record.unwrap_or_else(|| task::TaskRecord {
            gitdir: gitdir.to_path_buf(),
            ..Default::default()
        });
        // Refs created by earlier runs that someone deleted since are no longer the task's.
        record.owned.retain(|name| start.contains_key(name));
        if branch.is_some() && record.branch.is_none() {
            record.branch = branch.clone();
        }
        // Written only when it changed (or is found in the old place): most runs find it as
        // the last one left it.
        if moved || loaded.as_ref() != Some(&record) {
            record
                .save(record_dir)
                .map_err(io("writing the task record in", record_dir))?;
        }
        let mut quarantine = Self::with_run_dir(common, branch.as_deref(), parent, None)?;
        quarantine
            .state
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .created
            .extend(record.owned.iter().cloned());
        quarantine
            .state
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .stash_owned
            .clone_from(&record.stash);
        quarantine.record = Some((record_dir.to_path_buf(), record));
        Ok(quarantine)
    }

    /// The quarantine of a push remote (`--allow-push`): its git dir `remote` behind an
    /// overlay of the same kind, with no task branch — a push may create branches and tags
    /// (by the same allow-list), and move and delete those that earlier pushes of this
    /// worktree's runs created (the record in `record_dir`, keyed by the remote); every ref
    /// the remote had otherwise stays as it is. Objects are taken in by content, as ever.
    pub fn prepare_push(
        remote: &Path,
        record_dir: &Path,
        parent: &Path,
    ) -> Result<Self, QuarantineError> {
        let record =
            task::TaskRecord::load(record_dir, remote).unwrap_or_else(|| task::TaskRecord {
                gitdir: remote.to_path_buf(),
                ..Default::default()
            });
        let mut quarantine = Self::with_run_dir(remote, None, parent, None)?;
        let state = quarantine
            .state
            .get_mut()
            .unwrap_or_else(|e| e.into_inner());
        state.created.extend(record.owned.iter().cloned());
        quarantine.record = Some((record_dir.to_path_buf(), record));
        quarantine.lay_out()
    }

    /// Lets the run's `git push` to the push remotes `remotes` (git dirs) update this
    /// repository's remote-tracking refs for them: `refs/remotes/<name>/<branch>` is applied
    /// when it names what the remote's `refs/heads/<branch>` holds on the host (after the
    /// push's own quarantine applied it), never anything else.
    fn track_push_remotes(&mut self, remotes: &[PathBuf]) {
        if remotes.is_empty() {
            return;
        }
        let Ok(repo) = Repository::open_bare(&self.common) else {
            return;
        };
        let Ok(names) = repo.remotes() else { return };
        for name in names.iter().flatten() {
            let Ok(remote) = repo.find_remote(name) else {
                continue;
            };
            let url = remote.pushurl().or(remote.url()).unwrap_or_default();
            let path = url.strip_prefix("file://").unwrap_or(url);
            if let Some(gitdir) = trace::local_repository(Path::new(path)) {
                if remotes.contains(&gitdir) {
                    self.tracking.push((name.to_string(), gitdir));
                }
            }
        }
    }

    /// The push remote's git dir and branch of a remote-tracking ref of a push remote.
    fn tracking_of<'a>(&'a self, name: &'a str) -> Option<(&'a Path, &'a str)> {
        let rest = name.strip_prefix("refs/remotes/")?;
        self.tracking.iter().find_map(|(remote, gitdir)| {
            let branch = rest.strip_prefix(remote.as_str())?.strip_prefix('/')?;
            (branch != "HEAD" && !branch.is_empty()).then_some((gitdir.as_path(), branch))
        })
    }

    fn is_tracking(&self, name: &str) -> bool {
        self.tracking_of(name).is_some()
    }

    /// For a remote-tracking ref of a push remote: the value its branch has on the host.
    fn tracked_value(&self, name: &str) -> Option<Option<Oid>> {
        let (gitdir, branch) = self.tracking_of(name)?;
        let repo = Repository::open_bare(gitdir).ok()?;
        Some(repo.refname_to_id(&format!("refs/heads/{branch}")).ok())
    }

    /// The branch this run may move (what `HEAD` named, or the recorded one).
    pub fn task_branch(&self) -> Option<&str> {
        self.task_branch.as_deref()
    }

    /// Writes the record with the refs the run owns now.
    fn save_record(&self, state: &State) {
        let Some((dir, record)) = &self.record else {
            return;
        };
        let mut record = record.clone();
        record.owned = owned_now(state, &self.start);
        record.stash.clone_from(&state.stash_owned);
        if let Err(e) = record.save(dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "could not update the git task record");
        }
    }

    fn make_upper_skeleton(&self) -> Result<(), QuarantineError> {
        for sub in UPPER_SKELETON {
            make_dirs_nofollow(self.upper(), sub)?;
        }
        Ok(())
    }

    fn lay_out(mut self) -> Result<Self, QuarantineError> {
        let layer = self.dir.join("layer");
        std::fs::create_dir(&layer).map_err(io("creating", &layer))?;
        let owned = self
            .state
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .created
            .clone();
        for dir in [&self.layers.upper, &self.layers.work, &self.layers.snapshot] {
            std::fs::create_dir(dir).map_err(io("creating", dir))?;
        }
        self.held_upper = Some(HeldDir::open(&self.layers.upper)?);
        self.make_upper_skeleton()?;
        let packed = refs::read_packed(&self.common.join("packed-refs"))
            .map_err(io("reading", &self.common.join("packed-refs")))?;
        let frozen = self.layers.snapshot.join("packed-refs");
        std::fs::write(&frozen, &packed.bytes).map_err(io("writing", &frozen))?;
        self.start = refs::list(&self.common, &packed.refs);
        self.packed_at_start = packed.refs;
        let mut pinnable: Vec<(&String, &Option<Oid>)> = self
            .start
            .iter()
            .filter(|(name, _)| {
                Some(name.as_str()) != self.task_branch.as_deref()
                    && *name != "refs/stash"
                    && !owned.contains(*name)
                    && !self.is_tracking(name)
            })
            .collect();
        // Branches first, then tags, then the rest: the most harmful moves are pinned first.
        pinnable.sort_by_key(|(name, _)| {
            let rank = if name.starts_with("refs/heads/") {
                0
            } else if name.starts_with("refs/tags/") {
                1
            } else {
                2
            };
            (rank, name.to_string())
        });
        let mut pinned = Vec::new();
        for (name, target) in pinnable.iter().take(MAX_PINNED_REFS) {
            if self.copy_ref(name, target)? {
                pinned.push(name.to_string());
            }
        }
        self.layers.pinned_refs = pinned;
        self.freeze_refs()?;
        Ok(self)
    }

    /// Makes `refs/` inside the refs of the start: every loose ref is copied into the snapshot
    /// layer (the pinned ones already are) and the snapshot's `refs` is made opaque, so the
    /// repository's own `refs/` never shows through the overlay. What the host does to its refs
    /// during the run stays out of sight — above all the `<ref>.lock` it holds while it applies
    /// this run's commits: overlayfs keeps a lower-layer file it once saw, so a lock seen
    /// inside would stay "held" there after the host released it, and git inside would fail
    /// with "cannot lock ref … File exists" until the run ends.
    fn freeze_refs(&self) -> Result<(), QuarantineError> {
        let refs_dir = self.layers.snapshot.join("refs");
        for sub in ["heads", "tags"] {
            let dir = refs_dir.join(sub);
            std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
        }
        for (name, target) in &self.start {
            // Packed-only refs are in the frozen packed-refs; copies exist for the pinned.
            let loose =
                std::fs::symlink_metadata(self.common.join(name)).is_ok_and(|m| m.is_file());
            if loose && !self.layers.snapshot.join(name).exists() {
                self.copy_ref(name, target)?;
            }
        }
        set_opaque(&refs_dir).map_err(io("marking opaque", &refs_dir))
    }

    /// Writes ref `name` with its value at the start into the snapshot layer; `false` for a
    /// symbolic ref whose target cannot be read (nothing written).
    fn copy_ref(&self, name: &str, target: &Option<Oid>) -> Result<bool, QuarantineError> {
        let content = match target {
            Some(oid) => format!("{oid}\n"),
            None => match refs::symbolic_target(&self.common, name) {
                Some(to) => format!("ref: {to}\n"),
                None => return Ok(false),
            },
        };
        let file = self.layers.snapshot.join(name);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent).map_err(io("creating", parent))?;
        }
        std::fs::write(&file, content).map_err(io("writing", &file))?;
        Ok(true)
    }

    pub fn layers(&self) -> &Layers {
        &self.layers
    }

    /// The repository's common dir.
    pub fn common(&self) -> &Path {
        &self.common
    }

    /// The writable layer, as every read of it goes: through the held directory (the
    /// bounded tmpfs once the child sent it).
    pub(crate) fn upper(&self) -> &Path {
        if let Some(held) = self.bounded.as_ref().and_then(|b| b.received.get()) {
            return &held.path;
        }
        self.held_upper
            .as_ref()
            .map_or(&self.layers.upper, |held| &held.path)
    }

    /// Puts this run's writable layer on a tmpfs of `bytes` that the command's child mounts
    /// over `<run>/layer` in its own mount namespace: writes to the git store beyond the bound
    /// fail with ENOSPC inside, and the host's memory is never the limit. Returns what the
    /// child needs; the host end of the socket stays here.
    #[cfg(not(target_os = "linux"))]
    pub fn bound_layer(&mut self, _bytes: u64) -> Result<LayerMount, QuarantineError> {
        // The child's tmpfs and the descriptor it sends back are Linux's private view.
        Err(QuarantineError::Io {
            what: "bounding the writable layer (Linux only) of",
            path: self.dir.clone(),
            source: std::io::ErrorKind::Unsupported.into(),
        })
    }

    /// [`Self::bound_layer`] on Linux.
    #[cfg(target_os = "linux")]
    pub fn bound_layer(&mut self, bytes: u64) -> Result<LayerMount, QuarantineError> {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        let dir = self.dir.join("layer");
        if self.layers.upper != dir.join("upper") {
            return Err(QuarantineError::Io {
                what: "bounding a writable layer that is not the run's own",
                path: self.layers.upper.clone(),
                source: std::io::Error::other("a persistent layer"),
            });
        }
        let (host, child) = socketpair(
            AddressFamily::Unix,
            SockType::Datagram,
            None,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        )
        .map_err(|e| io("creating the layer's socket for", &dir)(e.into()))?;
        let mut subdirs = vec![PathBuf::from("upper"), PathBuf::from("work")];
        for sub in UPPER_SKELETON {
            let mut at = PathBuf::from("upper");
            for part in Path::new(sub).components() {
                at.push(part);
                if !subdirs.contains(&at) {
                    subdirs.push(at.clone());
                }
            }
        }
        self.bounded = Some(BoundedLayer {
            socket: host,
            bytes,
            received: std::sync::OnceLock::new(),
        });
        Ok(LayerMount {
            dir,
            bytes,
            subdirs,
            socket: child,
        })
    }

    /// The host end of the bounded layer's socket, to wait on (`None`: not bounded).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn layer_socket(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.bounded
            .as_ref()
            .filter(|b| b.received.get().is_none())
            .map(|b| b.socket.as_fd())
    }

    /// Takes the bounded layer's descriptor if the child sent it (never blocks).
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn receive_layer(&self) {}

    /// [`Self::receive_layer`] on Linux.
    #[cfg(target_os = "linux")]
    pub(crate) fn receive_layer(&self) {
        use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let Some(bounded) = &self.bounded else {
            return;
        };
        if bounded.received.get().is_some() {
            return;
        }
        let mut byte = [0u8; 1];
        let mut iov = [std::io::IoSliceMut::new(&mut byte)];
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
        let Ok(msg) = recvmsg::<()>(
            bounded.socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
        ) else {
            return;
        };
        let Ok(cmsgs) = msg.cmsgs() else { return };
        for cmsg in cmsgs {
            if let ControlMessageOwned::ScmRights(fds) = cmsg {
                for fd in fds {
                    // SAFETY: the kernel installed this descriptor for us with the message.
                    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                    if bounded.received.get().is_some() {
                        continue;
                    }
                    // The layer's `upper`, held by a descriptor of its own (the tmpfs root's
                    // descriptor closes at the end of this block).
                    let upper = PathBuf::from(format!("/proc/self/fd/{}/upper", fd.as_raw_fd()));
                    match HeldDir::open(&upper) {
                        Ok(held) => {
                            let _ = bounded.received.set(held);
                        }
                        Err(e) => tracing::warn!(error = %e, "git quarantine: the bounded layer"),
                    }
                }
            }
        }
    }

    /// Whether the bounded layer is (nearly) full now: less free than one page per MiB of
    /// the bound, or none at all.
    fn layer_full(&self) -> Option<u64> {
        let bounded = self.bounded.as_ref()?;
        let held = bounded.received.get()?;
        let st = nix::sys::statvfs::fstatvfs(&held._fd).ok()?;
        let free = st.blocks_available() as u64 * st.fragment_size() as u64;
        (free < (bounded.bytes >> 8).max(64 << 10)).then_some(bounded.bytes)
    }

    /// Reads the writable layer back and applies what is allowed: objects first (a ref is
    /// applied only once the objects it names are in the store), then refs. `last`: the run
    /// is over, so what is still incomplete is reported instead of retried.
    pub fn sync(&self, last: bool) -> Result<(), QuarantineError> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bytes) = self.layer_full() {
            state.report.layer_full = Some(bytes);
        }
        let upper = self.upper();
        // A persistent layer (a VM's) lies directly on the common dir: what it hides of it
        // counts as deleted. A copy (a box's generation) has no layers at all.
        let below = self.persistent.then_some(self.common.as_path());
        let mut changed = if self.copy {
            refs::changed_in_copy(upper, &self.common, &self.start)
        } else {
            let snapshot = (!self.persistent).then_some(self.layers.snapshot.as_path());
            refs::changed(upper, &self.packed_at_start, below, snapshot)
        };
        // A ref this run created, which the host already applied, and which the run deleted
        // again (`git stash` then `git stash pop`, a branch made and removed) leaves nothing
        // in the layer — no whiteout: there was nothing below it. Gone from the layer, it is
        // deleted.
        for name in &state.created {
            let applied_live = matches!(state.applied.get(name), Some(Some(_)));
            if !applied_live
                || self.start.contains_key(name)
                || changed.iter().any(|(n, _)| n == name)
            {
                continue;
            }
            if upper.join(name).symlink_metadata().is_err() {
                changed.push((name.clone(), refs::Wanted::Value(None)));
            }
        }
        // Most commands write nothing to the store: no repository open for them.
        if changed.is_empty() && !objects::any_new(upper, &state) {
            return Ok(());
        }
        let repo = Repository::open_bare(&self.common).map_err(git("opening the repository"))?;
        let odb = repo.odb().map_err(git("opening the object store"))?;
        let scratch = self.dir.join("incoming");
        objects::import(upper, &odb, &scratch, &mut state, last)?;
        for (name, wanted) in changed {
            self.apply(&repo, &odb, &mut state, &name, wanted, last);
        }
        Ok(())
    }

    fn apply(
        &self,
        repo: &Repository,
        odb: &git2::Odb,
        state: &mut State,
        name: &str,
        wanted: refs::Wanted,
        last: bool,
    ) {
        let wanted = match wanted {
            refs::Wanted::Value(value) => value,
            // Read while the sandbox was changing it: the next pass sees the result.
            refs::Wanted::Unreadable(_) if !last => return,
            refs::Wanted::Unreadable(reason) => {
                return refuse(state, name, None, reason);
            }
        };
        if name == "refs/stash" && self.start.contains_key(name) {
            return self.apply_stash(repo, odb, state, wanted, last);
        }
        // A persistent layer lies on the live common dir: a `git pack-refs` inside (`git gc`)
        // writes every ref it sees into the layer's own `packed-refs`, the ones the host moved
        // during the run (the watcher's fast-forward of the task's branch) included. A ref
        // that already holds on the host what the sandbox wants needs nothing, and is no
        // refusal.
        if self.persistent && repo.refname_to_id(name).ok() == wanted {
            return;
        }
        let current = match state.applied.get(name) {
            Some(value) => *value,
            None => self.start.get(name).copied().flatten(),
        };
        let verdict = match self.tracked_value(name) {
            Some(_) if wanted == current => RefVerdict::Unchanged,
            Some(remote) if remote == wanted => RefVerdict::Apply { expected: current },
            // The push's own quarantine may not have applied the branch yet.
            Some(_) if !last => return,
            _ => judge(
                name,
                wanted,
                self.task_branch.as_deref(),
                &self.start,
                &state.applied,
                &state.created,
            ),
        };
        let expected = match verdict {
            RefVerdict::Unchanged => return,
            RefVerdict::Refuse(reason) => return refuse(state, name, wanted, reason),
            RefVerdict::Apply { expected } => expected,
        };
        if let Some(oid) = wanted {
            if !odb.exists(oid) {
                if last {
                    refuse(
                        state,
                        name,
                        wanted,
                        format!("its commit {oid} never reached the store"),
                    );
                }
                return;
            }
        }
        let message = refs::last_reflog_message(self.upper(), name);
        let task = Some(name) == self.task_branch.as_deref();
        match refs::compare_and_swap(repo, name, expected, wanted, task, &message) {
            Ok(replaced) => {
                state.applied.insert(name.to_string(), wanted);
                // A remote-tracking ref is never the task's: it follows the remote only.
                if replaced.is_none()
                    && !self.start.contains_key(name)
                    && !name.starts_with("refs/remotes/")
                {
                    state.created.insert(name.to_string());
                }
                state.report.applied.push(AppliedRef {
                    name: name.to_string(),
                    old: replaced.map(|o| o.to_string()),
                    new: wanted.map(|o| o.to_string()),
                });
                if name == "refs/stash" && wanted.is_some() {
                    // A new stash: its reflog (where git keeps the entries) comes with it.
                    let entries = refs::read_reflog(&self.upper().join("logs/refs/stash"), |p| {
                        refs::read_untrusted(self.upper(), p, 16 << 20)
                    });
                    if entries.last().map(|e| Some(e.new)) == Some(wanted) {
                        if let Err(e) = refs::write_reflog(repo, name, &entries) {
                            tracing::warn!(error = %e, "could not write the stash reflog");
                        }
                        state.stash_owned = entries.iter().map(|e| e.new.to_string()).collect();
                    }
                }
                if replaced.is_none() || wanted.is_none() || name == "refs/stash" {
                    self.save_record(state);
                }
            }
            Err(reason) => refuse(state, name, wanted, reason),
        }
    }

    /// The stash, when one existed at the start: git keeps its entries in the reflog, so a
    /// push (or a pop of the run's own entry) is applied when the stash reflog the run wrote
    /// still holds every entry the host had at the start, in order — the host then takes that
    /// reflog for its own. Anything else would lose the user's entries and is refused, naming
    /// the run's stash commit (whose objects are in the repository) so nothing is lost.
    fn apply_stash(
        &self,
        repo: &Repository,
        odb: &git2::Odb,
        state: &mut State,
        wanted: Option<Oid>,
        last: bool,
    ) {
        let name = "refs/stash";
        let current = match state.applied.get(name) {
            Some(value) => *value,
            None => self.start.get(name).copied().flatten(),
        };
        let entries = refs::read_reflog(&self.upper().join("logs/refs/stash"), |p| {
            refs::read_untrusted(self.upper(), p, 16 << 20)
        });
        let host = refs::read_reflog(&self.common.join("logs/refs/stash"), |p| std::fs::read(p));
        // Every entry the host has stays, unless a run of this worktree pushed it.
        let keeps_every_entry = {
            let mut theirs = entries.iter().map(|e| e.new);
            host.iter()
                .filter(|h| !state.stash_owned.contains(&h.new.to_string()))
                .all(|h| theirs.any(|t| t == h.new))
        };
        if wanted == current {
            // The top is as the host has it, but the run may have dropped an entry below it
            // (`git stash drop stash@{1}` after a push the host already took): the host keeps
            // its reflog, and says so once the run is over — the same word whenever the
            // sync happened to run.
            if last && !keeps_every_entry && !host.is_empty() {
                refuse(
                    state,
                    name,
                    wanted,
                    "the run's stash reflog does not keep every entry the repository had; the \
                     repository keeps them all"
                        .into(),
                );
            }
            return;
        }
        let keep = |oid: Option<Oid>| {
            oid.map_or(String::new(), |o| {
                format!(
                    " (the run's stash is commit {o}: `git stash store -m sandbox {o}` on the \
                     host keeps it)"
                )
            })
        };
        let Some(oid) = wanted else {
            return refuse(
                state,
                name,
                None,
                "the run dropped the stash entries the repository had".into(),
            );
        };
        if entries.last().map(|e| e.new) != Some(oid) || !keeps_every_entry {
            return refuse(
                state,
                name,
                wanted,
                format!(
                    "the run's stash reflog does not keep every entry the repository had{}",
                    keep(wanted)
                ),
            );
        }
        if !entries.iter().all(|e| odb.exists(e.new)) {
            if last {
                refuse(
                    state,
                    name,
                    wanted,
                    format!("its commits never reached the store{}", keep(wanted)),
                );
            }
            return;
        }
        let message = refs::last_reflog_message(self.upper(), name);
        let swapped = refs::compare_and_swap(repo, name, current, wanted, false, &message)
            .and_then(|replaced| {
                refs::write_reflog(repo, name, &entries)
                    .map_err(|e| format!("writing its reflog: {}", e.message()))?;
                Ok(replaced)
            });
        match swapped {
            Ok(replaced) => {
                state.applied.insert(name.to_string(), wanted);
                state.report.applied.push(AppliedRef {
                    name: name.to_string(),
                    old: replaced.map(|o| o.to_string()),
                    new: Some(oid.to_string()),
                });
                let ours: std::collections::BTreeSet<String> = entries
                    .iter()
                    .filter(|e| {
                        state.stash_owned.contains(&e.new.to_string())
                            || !host.iter().any(|h| h.new == e.new)
                    })
                    .map(|e| e.new.to_string())
                    .collect();
                state.stash_owned = ours;
                self.save_record(state);
            }
            Err(reason) => refuse(state, name, wanted, format!("{reason}{}", keep(wanted))),
        }
    }

    /// What was applied and refused so far.
    pub fn report(&self) -> StoreReport {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut report = state.report.clone();
        report.task_branch = self.task_branch.clone();
        report.owned = owned_now(&state, &self.start).into_iter().collect();
        report
    }
}

/// The refs the run may move now: those it (or an earlier run) created, still existing.
fn owned_now(
    state: &State,
    start: &HashMap<String, Option<Oid>>,
) -> std::collections::BTreeSet<String> {
    state
        .created
        .iter()
        .filter(|name| match state.applied.get(*name) {
            Some(value) => value.is_some(),
            None => start.contains_key(*name),
        })
        .cloned()
        .collect()
}

fn refuse(state: &mut State, name: &str, wanted: Option<Oid>, reason: String) {
    if state.refused.insert((name.to_string(), wanted)) {
        state.report.refused.push(RefusedRef {
            name: name.to_string(),
            wanted: wanted.map(|o| o.to_string()),
            reason,
        });
    }
}

impl Drop for StoreQuarantine {
    fn drop(&mut self) {
        remove_run_dir(&self.dir);
    }
}

/// Creates `base/rel` one level at a time, refusing anything in the way that is not a
/// directory: a layer a guest writes may hold a link planted to lead a host `mkdir` out.
fn make_dirs_nofollow(base: &Path, rel: &str) -> Result<(), QuarantineError> {
    let mut dir = base.to_path_buf();
    for part in rel.split('/') {
        dir.push(part);
        match dir.symlink_metadata() {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(QuarantineError::Io {
                    what: "refusing a layer entry that is not a directory",
                    path: dir,
                    source: std::io::Error::other("not a directory"),
                })
            }
            Err(_) => match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io("creating", &dir)(e)),
            },
        }
    }
    Ok(())
}

/// Removes a run directory. overlayfs leaves directories without permissions in its work
/// dir (`work/work`, `incompat/volatile`): ours, so made removable first — root removes them
/// anyway, anyone else would fail.
fn remove_run_dir(dir: &Path) {
    make_removable(dir);
    if let Err(e) = std::fs::remove_dir_all(dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "could not remove a git quarantine");
    }
}

fn make_removable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            make_removable(&entry.path());
        }
    }
}

/// Removes run directories whose process is gone (a run that was killed outright).
fn remove_abandoned(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.split('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            == Err(nix::errno::Errno::ESRCH);
        if gone {
            remove_run_dir(&entry.path());
        }
    }
}

/// Marks `dir` of a layer opaque for an overlay mounted with `userxattr`: nothing of the
/// layers below shows through it.
#[cfg(not(target_os = "linux"))]
fn set_opaque(_dir: &Path) -> std::io::Result<()> {
    // Overlay layers are Linux's; so is the quarantine.
    Err(std::io::ErrorKind::Unsupported.into())
}

/// [`set_opaque`] on Linux.
#[cfg(target_os = "linux")]
fn set_opaque(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: lsetxattr(2) with NUL-terminated strings and a one-byte value of ours.
    let rc = unsafe {
        libc::lsetxattr(
            path.as_ptr(),
            c"user.overlay.opaque".as_ptr(),
            b"y".as_ptr().cast(),
            1,
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
