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

mod live;
mod objects;
pub mod refs;

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
    pub objects_imported: usize,
    pub applied: Vec<AppliedRef>,
    pub refused: Vec<RefusedRef>,
    pub rejected_objects: Vec<RejectedObject>,
}

impl StoreReport {
    /// One line per refusal and rejection, for stderr.
    pub fn warnings(&self) -> Vec<String> {
        let refused = self.refused.iter().map(|r| {
            let wanted = r.wanted.as_deref().map_or("delete it".to_string(), |w| {
                format!("set it to {}", &w[..w.len().min(12)])
            });
            format!(
                "git: refused to {wanted} for {} — {}; the repository keeps it unchanged",
                r.name, r.reason
            )
        });
        let rejected = self.rejected_objects.iter().map(|o| {
            format!(
                "git: object {} not taken into the repository — {}",
                o.path, o.reason
            )
        });
        refused.chain(rejected).collect()
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
    state: Mutex<State>,
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
        use std::os::fd::{AsRawFd, OwnedFd};
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(dir)
            .map_err(io(
                "opening the writable layer (a directory, not a link)",
                dir,
            ))?;
        let fd = OwnedFd::from(file);
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
        let base = layer.unwrap_or(&dir);
        Ok(StoreQuarantine {
            common: common.to_path_buf(),
            layers: Layers {
                upper: base.join("upper"),
                work: base.join("work"),
                snapshot: dir.join("snapshot"),
                pinned_refs: Vec::new(),
            },
            dir,
            task_branch: task_branch.map(str::to_string),
            start: HashMap::new(),
            packed_at_start: HashMap::new(),
            held_upper: None,
            state: Mutex::new(State::default()),
        })
    }

    fn make_upper_skeleton(&self) -> Result<(), QuarantineError> {
        for sub in UPPER_SKELETON {
            make_dirs_nofollow(self.upper(), sub)?;
        }
        Ok(())
    }

    fn lay_out(mut self) -> Result<Self, QuarantineError> {
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
                Some(name.as_str()) != self.task_branch.as_deref() && *name != "refs/stash"
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

    /// The writable layer, as every read of it goes: through the held directory.
    pub(crate) fn upper(&self) -> &Path {
        self.held_upper
            .as_ref()
            .map_or(&self.layers.upper, |held| &held.path)
    }

    /// Reads the writable layer back and applies what is allowed: objects first (a ref is
    /// applied only once the objects it names are in the store), then refs. `last`: the run
    /// is over, so what is still incomplete is reported instead of retried.
    pub fn sync(&self, last: bool) -> Result<(), QuarantineError> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let upper = self.upper();
        let changed = refs::changed(upper, &self.packed_at_start);
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
        let verdict = judge(
            name,
            wanted,
            self.task_branch.as_deref(),
            &self.start,
            &state.applied,
            &state.created,
        );
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
                if replaced.is_none() && !self.start.contains_key(name) {
                    state.created.insert(name.to_string());
                }
                state.report.applied.push(AppliedRef {
                    name: name.to_string(),
                    old: replaced.map(|o| o.to_string()),
                    new: wanted.map(|o| o.to_string()),
                });
            }
            Err(reason) => refuse(state, name, wanted, reason),
        }
    }

    /// What was applied and refused so far.
    pub fn report(&self) -> StoreReport {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .report
            .clone()
    }
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
