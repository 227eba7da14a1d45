//! What a walk of the worktree learned of each directory, so that the next walk reads again
//! only the directories that changed since.
//!
//! A directory's entries change only by creating, removing or renaming an entry in it (or
//! changing an entry's type, which is removing it and creating another), and each of those
//! sets the directory's change time (`st_ctime`) to the present. Nothing else in it does: a
//! file's content, or anything deeper down, changes that file's or that subdirectory's times,
//! never the parent's. So a directory whose device, inode and change time are those recorded
//! has the entries recorded: the same `.git` entry (whose content is read again, it is a
//! file), the same answer to "is it a bare repository" (which looks only at its own entries
//! and their types), the same subdirectories — which the walk still visits, each checked the
//! same way. The change time, not the modification time: `touch -d` (`utimensat`) sets the
//! modification time to anything, and sets the change time to the present; no process sets
//! the change time (short of the system clock).
//!
//! Two limits of the clock, and what keeps them out:
//!
//! * The kernel stamps with a coarse clock (a tick, 1–10 ms; a second on some filesystems):
//!   a directory changed in the same tick as it was read could keep the stamp it was read
//!   with. A directory whose change time is less than [`RACY`] before the walk started is
//!   not recorded (the next walk reads it again), as git treats its "racily clean" entries.
//!   A walk whose clock stands before the recorded walk's start trusts none of it.
//! * A filesystem whose times come from elsewhere (a network server's clock, a FUSE
//!   process's answer) or that keeps no change time of its own: only local filesystems known
//!   to stamp change times themselves are recorded ([`fine_timestamps`]); any other is read
//!   whole every walk.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{self, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use nix::sys::stat::{FileStat, SFlag};

/// How long before a walk's start a directory must have last changed for the walk to record
/// it: above the coarsest timestamp granularity it accepts (one second) plus a clock tick.
pub(super) const RACY: Duration = Duration::from_secs(2);

/// A time as seconds and nanoseconds since the epoch (as `st_ctime`, `st_ctime_nsec`).
pub(super) type Stamp = (i64, i64);

/// One directory as a walk read it: what the rest of the walk needs of its entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Listing {
    /// Its change time, taken before its entries were read.
    pub ctime: Stamp,
    /// Its `.git` entry, when it has one, and that entry's type (when known).
    pub dot_git: Option<Option<SFlag>>,
    /// Whether git takes it for a bare repository.
    pub bare: bool,
    /// Its subdirectories (`.git` left out) in the listing's order, each with the inode its
    /// entry named (a hint: the walk still asks the subdirectory itself).
    pub subdirs: Vec<(OsString, u64)>,
}

impl Listing {
    /// Nothing in it but entries the walk does not look at: it needs no descriptor.
    pub fn is_leaf(&self) -> bool {
        self.subdirs.is_empty() && self.dot_git.is_none() && !self.bare
    }
}

/// The directories of one walk, by device and inode.
#[derive(Debug, Default, Clone)]
pub(crate) struct Index {
    /// When the walk started.
    pub(super) started: Stamp,
    pub(super) dirs: Dirs,
}

/// Directories by device and inode.
pub(super) type Dirs = HashMap<(u64, u64), Arc<Listing>, BuildHasherDefault<InodeHasher>>;

/// A hash of device and inode numbers, which the filesystem hands out (nothing a run can
/// choose to collide): one multiply per word, where the default hasher's SipHash costs a
/// good part of a walk that only stats.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct InodeHasher(u64);

impl Hasher for InodeHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7C_C1_B7_27_22_0A_95);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

pub(super) fn now() -> Stamp {
    let d = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs() as i64, i64::from(d.subsec_nanos()))
}

/// `at` less `by`.
pub(super) fn before(at: Stamp, by: Duration) -> Stamp {
    let ns = at.0 as i128 * 1_000_000_000 + at.1 as i128 - by.as_nanos() as i128;
    (
        ns.div_euclid(1_000_000_000) as i64,
        ns.rem_euclid(1_000_000_000) as i64,
    )
}

/// The change time of `st` (both fields are `i64` on Linux, `time_t`/`long` elsewhere).
#[allow(clippy::unnecessary_cast)]
pub(super) fn ctime(st: &FileStat) -> Stamp {
    (st.st_ctime as i64, st.st_ctime_nsec as i64)
}

/// Whether the filesystem of `dir` stamps change times itself, locally, finer than [`RACY`].
#[cfg(target_os = "linux")]
pub(super) fn fine_timestamps(dir: &File) -> bool {
    const LOCAL: [i64; 8] = [
        0xEF53,      // ext2/3/4
        0x5846_5342, // xfs
        0x9123_683E, // btrfs
        0x0102_1994, // tmpfs
        0x794C_7630, // overlayfs (its upper directory's times)
        0xF2F5_2010, // f2fs
        0xCA45_1A4E, // bcachefs
        0x2FC1_2FC1, // zfs
    ];
    #[allow(clippy::unnecessary_cast)]
    nix::sys::statfs::fstatfs(dir).is_ok_and(|s| LOCAL.contains(&(s.filesystem_type().0 as i64)))
}

/// Whether the filesystem of `dir` stamps change times itself, locally, finer than [`RACY`].
#[cfg(not(target_os = "linux"))]
pub(super) fn fine_timestamps(dir: &File) -> bool {
    nix::sys::statfs::fstatfs(dir).is_ok_and(|s| matches!(s.filesystem_type_name(), "apfs" | "hfs"))
}

/// The first bytes of a cache file (and its format's version).
const MAGIC: &[u8; 8] = b"SBXNW\x001\n";

/// The largest cache file read (a bound on what a damaged one can make us allocate).
const CACHE_LIMIT: u64 = 256 << 20;

/// A type as mode bits (`mode_t` is a `u16` on macOS).
#[allow(clippy::useless_conversion)]
fn kind_bits(kind: Option<SFlag>) -> u32 {
    kind.map_or(0, |k| u32::from(k.bits()))
}

fn kind_of(bits: u32) -> Option<SFlag> {
    #[allow(clippy::useless_conversion)]
    let mode = bits.try_into().ok()?;
    (bits != 0).then(|| SFlag::from_bits_truncate(mode))
}

impl Index {
    /// The cache file's bytes: a short binary format (a JSON of a large tree costs more to
    /// parse than the walk it saves).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.dirs.len() * 64);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.started.0.to_le_bytes());
        out.extend_from_slice(&self.started.1.to_le_bytes());
        out.extend_from_slice(&(self.dirs.len() as u64).to_le_bytes());
        for (&(dev, ino), l) in &self.dirs {
            out.extend_from_slice(&dev.to_le_bytes());
            out.extend_from_slice(&ino.to_le_bytes());
            out.extend_from_slice(&l.ctime.0.to_le_bytes());
            out.extend_from_slice(&l.ctime.1.to_le_bytes());
            out.push(u8::from(l.dot_git.is_some()) | (u8::from(l.bare) << 1));
            out.extend_from_slice(&kind_bits(l.dot_git.flatten()).to_le_bytes());
            out.extend_from_slice(&(l.subdirs.len() as u32).to_le_bytes());
            for (name, ino) in &l.subdirs {
                let name = name.as_bytes();
                out.extend_from_slice(&(name.len() as u32).to_le_bytes());
                out.extend_from_slice(name);
                out.extend_from_slice(&ino.to_le_bytes());
            }
        }
        out
    }

    /// The index in `bytes`, or `None` when they are not a whole one of this format.
    pub fn decode(bytes: &[u8]) -> Option<Index> {
        let mut r = Reader(bytes);
        if r.take(MAGIC.len())? != MAGIC {
            return None;
        }
        let started = (r.i64()?, r.i64()?);
        let count = r.u64()?;
        let mut dirs =
            Dirs::with_capacity_and_hasher(count.min(1 << 20) as usize, Default::default());
        for _ in 0..count {
            let key = (r.u64()?, r.u64()?);
            let ctime = (r.i64()?, r.i64()?);
            let flags = r.take(1)?[0];
            let kind = kind_of(r.u32()?);
            let n = r.u32()?;
            let mut subdirs = Vec::with_capacity(n.min(1 << 16) as usize);
            for _ in 0..n {
                let len = r.u32()? as usize;
                let name = OsString::from_vec(r.take(len)?.to_vec());
                if name.is_empty() || name.as_bytes().contains(&b'/') {
                    return None;
                }
                subdirs.push((name, r.u64()?));
            }
            let listing = Listing {
                ctime,
                dot_git: (flags & 1 != 0).then_some(kind),
                bare: flags & 2 != 0,
                subdirs,
            };
            dirs.insert(key, Arc::new(listing));
        }
        r.0.is_empty().then_some(Index { started, dirs })
    }

    /// The index cached at `path`, when it is a file of ours no one else can read or write
    /// (the private directory's, [`crate::privdir`]) and whole.
    pub fn load(path: &Path) -> Option<Index> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .ok()?;
        let meta = file.metadata().ok()?;
        if !meta.is_file()
            || meta.uid() != nix::unistd::geteuid().as_raw()
            || meta.mode() & 0o077 != 0
        {
            return None;
        }
        let mut bytes = Vec::new();
        file.take(CACHE_LIMIT + 1).read_to_end(&mut bytes).ok()?;
        if bytes.len() as u64 > CACHE_LIMIT {
            return None;
        }
        Index::decode(&bytes)
    }

    /// Writes the index to `path` (mode 0600, its directory made 0700): a new file renamed
    /// over the old, so a reader sees one whole index or the other.
    pub fn store(&self, path: &Path) -> io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = path
            .parent()
            .ok_or_else(|| io::Error::other("no directory"))?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let mut name = path.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".{}.tmp", std::process::id()));
        let tmp = dir.join(name);
        let _ = std::fs::remove_file(&tmp);
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&self.encode()))
            .and_then(|()| std::fs::rename(&tmp, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}
