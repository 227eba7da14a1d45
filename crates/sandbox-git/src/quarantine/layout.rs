//! Laying out a run's layers: the writable layer's skeleton, and the snapshot layer with the
//! frozen `packed-refs` and a loose copy of each ref pinned or kept.

use std::path::Path;

use git2::Oid;

use super::error::{io, QuarantineError};
use super::{refs, HeldDir, StoreQuarantine, MAX_PINNED_REFS, UPPER_SKELETON};

impl StoreQuarantine {
    pub(super) fn make_upper_skeleton(&self) -> Result<(), QuarantineError> {
        for sub in UPPER_SKELETON {
            make_dirs_nofollow(self.upper(), sub)?;
        }
        Ok(())
    }

    pub(super) fn lay_out(mut self) -> Result<Self, QuarantineError> {
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
    crate::sys::lsetxattr(&path, c"user.overlay.opaque", b"y").map_err(std::io::Error::from)
}
