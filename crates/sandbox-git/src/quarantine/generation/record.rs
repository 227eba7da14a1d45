//! A generation's record: what the host needs to read it back without the daemon that laid
//! it out, locked by that daemon while it lives.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::quarantine::error::{io, QuarantineError};

/// A generation's record file, locked (`flock`) by the process that holds this value.
#[derive(Debug)]
pub(super) struct Held {
    pub(super) path: PathBuf,
    _lock: Flock<std::fs::File>,
}

/// What the host needs to read a generation back without the daemon that laid it out.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Record {
    pub(super) version: u32,
    /// The daemon whose period it was (for the report).
    pub(super) pid: u32,
    pub(super) common: PathBuf,
    pub(super) worktree_gitdir: PathBuf,
    pub(super) name: String,
    /// The worktree's `HEAD` at the start.
    pub(super) head: String,
    /// The worktree's index as the generation copied it.
    pub(super) index: Option<FileStamp>,
    /// Every ref at the start, with its direct target (`None`: a symbolic ref).
    pub(super) start: BTreeMap<String, Option<String>>,
    /// Where the worktree's task record is kept and may be found.
    pub(super) record_dirs: Vec<PathBuf>,
    /// The quarantine's scratch space.
    pub(super) scratch: PathBuf,
}

/// A file's identity and last change: the index is taken back from a dead daemon's generation
/// only while the worktree's own is unchanged since (else a stale copy would replace it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

impl FileStamp {
    pub(super) fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(path).ok()?;
        Some(FileStamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        })
    }
}

/// Writes `record` to `path` (a new file, 0600), locked before its first byte.
pub(super) fn write_record(path: &Path, record: &Record) -> Result<Held, QuarantineError> {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io("creating", dir))?;
    let bytes = serde_json::to_vec(record).map_err(|e| QuarantineError::Io {
        what: "encoding the generation's record",
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io("creating the generation's record", path))?;
    let mut lock = match Flock::lock(file, FlockArg::LockExclusive) {
        Ok(lock) => lock,
        Err((_, errno)) => {
            let _ = std::fs::remove_file(path);
            return Err(io("locking the generation's record", path)(errno.into()));
        }
    };
    if let Err(e) = lock.write_all(&bytes) {
        let _ = std::fs::remove_file(path);
        return Err(io("writing the generation's record", path)(e));
    }
    Ok(Held {
        path: path.to_path_buf(),
        _lock: lock,
    })
}
