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
//!
//! The type and what it holds are here; its methods are grouped by stage, one file each:
//! `prepare` (one way to make a quarantine per kind of run), `layout` (the layers laid out),
//! `bounded` (a writable layer on a tmpfs of its own), `sync` (the layer read back), `apply`
//! and `stash` (one changed ref applied or refused), `tracking` (the push remotes'
//! remote-tracking refs), `owned` (the refs the run owns: its record and its report);
//! `rundir` removes a run's directory, `error` and `report` are what callers get back.

mod apply;
mod bounded;
mod dropped;
mod error;
pub mod generation;
pub mod gitdir;
pub mod gitformats;
mod layout;
mod live;
mod objects;
mod owned;
mod prepare;
pub mod refs;
mod report;
mod rundir;
mod stash;
mod sync;
pub mod task;
pub mod trace;
mod tracking;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use git2::Oid;

use error::io;
use rundir::remove_run_dir;

pub use error::QuarantineError;
pub use live::LiveQuarantine;
pub use refs::{judge, RefVerdict};
pub use report::{AppliedRef, RefusedRef, RejectedObject, StoreReport};

/// At most this many existing refs are pinned read-only inside the sandbox (each is a bind
/// mount at start). Refs beyond it are still protected: the host refuses their updates.
pub const MAX_PINNED_REFS: usize = 1024;

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
    /// The refs of the start (every ref, with its direct target; `None` for a symbolic one).
    pub fn refs_at_start(&self) -> &HashMap<String, Option<Oid>> {
        &self.start
    }

    /// The branch this run may move (what `HEAD` named, or the recorded one).
    pub fn task_branch(&self) -> Option<&str> {
        self.task_branch.as_deref()
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
}

impl Drop for StoreQuarantine {
    fn drop(&mut self) {
        remove_run_dir(&self.dir);
    }
}
