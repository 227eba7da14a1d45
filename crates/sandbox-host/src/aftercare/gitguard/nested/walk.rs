//! The walk itself: every directory of the worktree visited by descriptor, never following a
//! link or entering a `.git`, each `.git` and bare-repository-like directory recorded, and a
//! directory whose record (device, inode, change time) is unchanged reused instead of read.

use super::*;
use super::{file_type, lstat_at, open_at};
use index::{Index, Listing};
use nix::dir::{Dir, Type};
use nix::fcntl::OFlag;
use nix::sys::stat::{FileStat, Mode, SFlag};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// What kind of entry `name` of `dir` is: from `getdents` when the filesystem says, else
/// from `fstatat` (no link followed).
pub(super) fn kind(dir: &File, name: &OsStr, from_listing: Option<Type>) -> Option<SFlag> {
    match from_listing {
        Some(Type::Directory) => Some(SFlag::S_IFDIR),
        Some(Type::File) => Some(SFlag::S_IFREG),
        Some(Type::Symlink) => Some(SFlag::S_IFLNK),
        Some(_) => Some(SFlag::S_IFIFO),
        None => lstat_at(dir, name).ok().flatten().map(|st| file_type(&st)),
    }
}

/// The entries of `dir`: their names, kinds and inodes.
pub(super) fn list(dir: &File) -> io::Result<Vec<(OsString, Option<SFlag>, u64)>> {
    let mut listing = Dir::from(dir.try_clone()?)?;
    let mut out = Vec::new();
    for entry in listing.iter() {
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        #[allow(clippy::unnecessary_cast)]
        out.push((name.to_os_string(), entry.file_type(), entry.ino() as u64));
    }
    Ok(out
        .into_iter()
        .map(|(name, t, ino)| {
            let k = kind(dir, &name, t);
            (name, k, ino)
        })
        .collect())
}

pub(super) fn open_subdir(dir: &File, name: &OsStr) -> io::Result<File> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW;
    open_at(dir, name, flags, Mode::empty())
}

/// The device and inode of `st` (`st_dev` is an `i32` on macOS).
#[allow(clippy::unnecessary_cast)]
pub(super) fn inode(st: &FileStat) -> (u64, u64) {
    (st.st_dev as u64, st.st_ino as u64)
}

/// What git would find at `.git` in `dir`.
pub(super) fn seen_dot_git(dir: &File, st: &FileStat) -> Seen {
    let (dev, ino) = inode(st);
    let by_inode = Seen::Entry { dev, ino };
    if file_type(st) != SFlag::S_IFREG {
        return by_inode;
    }
    let read = || -> io::Result<Vec<u8>> {
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK;
        let file = open_at(dir, OsStr::new(".git"), flags, Mode::empty())?;
        if !file.metadata()?.is_file() {
            return Err(io::Error::other("no longer a regular file"));
        }
        let mut bytes = Vec::new();
        file.take(POINTER_LIMIT + 1).read_to_end(&mut bytes)?;
        Ok(bytes)
    };
    match read() {
        Ok(bytes) if bytes.len() as u64 <= POINTER_LIMIT => match String::from_utf8(bytes) {
            Ok(content) => Seen::PointerFile { content },
            Err(_) => by_inode,
        },
        _ => by_inode,
    }
}

pub(super) fn describe(seen: &Seen, kind: Option<SFlag>) -> String {
    match (seen, kind) {
        (Seen::PointerFile { content }, _) => format!(
            "a .git file ({:?})",
            content.trim_end().chars().take(200).collect::<String>()
        ),
        (Seen::Bare { .. }, _) => "a bare repository (HEAD beside objects/ and refs/)".into(),
        (Seen::TooDeep, _) => format!("a directory deeper than {MAX_DEPTH} levels"),
        (Seen::Entry { .. }, Some(SFlag::S_IFDIR)) => "a .git directory".into(),
        (Seen::Entry { .. }, Some(SFlag::S_IFLNK)) => "a .git symbolic link".into(),
        (Seen::Entry { .. }, Some(SFlag::S_IFREG)) => "a .git file (not a short text)".into(),
        (Seen::Entry { .. }, _) => "a .git that is not a regular file".into(),
    }
}

/// The entries of one directory of the walk.
pub(super) struct Visit<'a> {
    entries: &'a [(OsString, Option<SFlag>, u64)],
}

impl Visit<'_> {
    fn has(&self, name: &str, kinds: &[SFlag]) -> bool {
        self.entries
            .iter()
            .any(|(n, k, _)| n == name && k.is_some_and(|k| kinds.contains(&k)))
    }

    /// Whether git takes this directory for a repository (`setup.c`'s `is_git_directory`:
    /// `HEAD`, and `objects/` and `refs/` or a `commondir` naming where they are).
    fn is_bare(&self) -> bool {
        let any = [SFlag::S_IFREG, SFlag::S_IFLNK, SFlag::S_IFDIR];
        let dirs = [SFlag::S_IFDIR, SFlag::S_IFLNK];
        self.has("HEAD", &any)
            && ((self.has("objects", &dirs) && self.has("refs", &dirs))
                || self.has("commondir", &any))
    }

    /// What the rest of the walk needs of these entries.
    fn listing(&self, ctime: index::Stamp) -> Listing {
        Listing {
            ctime,
            dot_git: self
                .entries
                .iter()
                .find(|(n, _, _)| n == ".git")
                .map(|(_, k, _)| *k),
            bare: self.is_bare(),
            subdirs: self
                .entries
                .iter()
                // A `.git` directory is a repository's own data, recorded as one entry:
                // what is inside it (a submodule's git dir in `modules/`) is that
                // repository's.
                .filter(|(n, k, _)| *k == Some(SFlag::S_IFDIR) && n != ".git")
                .map(|(n, _, ino)| (n.clone(), *ino))
                .collect(),
        }
    }
}

/// What [`walk`] calls with each repository it finds.
pub(super) type Found<'a> = dyn FnMut(&File, &Path, &OsStr, Seen, Option<SFlag>) + 'a;

/// How one walk went.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WalkStats {
    /// Directories whose entries were read.
    pub read: usize,
    /// Directories opened, found unchanged since the last walk, and not read.
    pub reused: usize,
    /// Directories found unchanged with one `fstatat`, not even opened (nothing below them).
    pub stat_only: usize,
}

/// A subdirectory waiting to be visited: its parent (open), the parent's device, listing and
/// path relative to the root, and which of the listing's subdirectories it is (its own path
/// is made only if it is opened: most are leaves seen unchanged with one `fstatat`).
pub(super) struct Pending {
    parent: Rc<File>,
    dev: u64,
    listing: Arc<Listing>,
    rel: Rc<PathBuf>,
    at: usize,
}

/// One walk: what it takes from the last one, and what it records for the next.
pub(super) struct Walker<'p> {
    prior: Option<&'p Index>,
    /// A directory that changed at this time or later is not recorded ([`index::RACY`]).
    settled: index::Stamp,
    index: Index,
    /// Per device: whether its filesystem's change times can be trusted.
    fine: HashMap<u64, bool>,
    stats: WalkStats,
}

impl Walker<'_> {
    /// What the last walk recorded of the directory `st` is, if it has not changed since.
    fn unchanged(&self, st: &FileStat) -> Option<Arc<Listing>> {
        let listing = self.prior?.dirs.get(&inode(st))?;
        (listing.ctime == index::ctime(st)).then(|| listing.clone())
    }

    /// The entries of `dir`, open, whose `fstat` (taken before anything is read) is `st`.
    fn listing(&mut self, dir: &File, st: &FileStat) -> Option<Arc<Listing>> {
        let key = inode(st);
        if let Some(listing) = self.unchanged(st) {
            self.stats.reused += 1;
            self.index.dirs.insert(key, listing.clone());
            return Some(listing);
        }
        let entries = list(dir).ok()?;
        self.stats.read += 1;
        let listing = Arc::new(Visit { entries: &entries }.listing(index::ctime(st)));
        if listing.ctime < self.settled
            && *self
                .fine
                .entry(key.0)
                .or_insert_with(|| index::fine_timestamps(dir))
        {
            self.index.dirs.insert(key, listing.clone());
        }
        Some(listing)
    }

    /// A subdirectory the last walk found with nothing below it to visit and no repository,
    /// still the same: recorded again, without opening it.
    fn unchanged_leaf(&mut self, parent: &File, dev: u64, name: &OsStr, hint: u64) -> bool {
        let Some(prior) = self.prior else {
            return false;
        };
        if !prior.dirs.get(&(dev, hint)).is_some_and(|l| l.is_leaf()) {
            return false;
        }
        let Ok(Some(st)) = lstat_at(parent, name) else {
            return false;
        };
        if file_type(&st) != SFlag::S_IFDIR {
            return false;
        }
        match self.unchanged(&st) {
            Some(listing) if listing.is_leaf() => {
                self.stats.stat_only += 1;
                self.index.dirs.insert(inode(&st), listing);
                true
            }
            _ => false,
        }
    }
}

/// Walks the worktree under `root` (its own `.git` left out), calling `found` with each
/// repository: the directory it is in (open), its path relative to the root, the name of its
/// entry there (`.git`, or the bare repository's `HEAD`), what it is, and its kind. Reads only
/// the directories that changed since the walk `prior` recorded ([`index`]); returns its own
/// record.
pub(super) fn walk(
    root: &Path,
    prior: Option<&Index>,
    racy: Duration,
    found: &mut Found<'_>,
) -> io::Result<(Index, WalkStats)> {
    let started = index::now();
    let mut walker = Walker {
        // A clock set back since: no change time can be trusted to differ.
        prior: prior.filter(|p| p.started <= started),
        settled: index::before(started, racy),
        index: Index {
            started,
            dirs: index::Dirs::default(),
        },
        fine: HashMap::new(),
        stats: WalkStats::default(),
    };
    let top = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(root)?;
    // Depth first; a directory's descriptor lives while a child of it waits, so no more
    // are open at once than the walk is deep.
    let mut pending: Vec<Pending> = Vec::new();
    let mut visit =
        |walker: &mut Walker<'_>, dir: Rc<File>, rel: PathBuf, pending: &mut Vec<Pending>| {
            // The directory's times before its entries: a change after this one shows.
            let Ok(st) = nix::sys::stat::fstat(dir.as_raw_fd()) else {
                return;
            };
            let Some(listing) = walker.listing(&dir, &st) else {
                return;
            };
            let top_level = rel.as_os_str().is_empty();
            if !top_level {
                if let Some(k) = listing.dot_git {
                    if let Ok(Some(st)) = lstat_at(&dir, OsStr::new(".git")) {
                        let seen = seen_dot_git(&dir, &st);
                        found(&dir, &rel.join(".git"), OsStr::new(".git"), seen, k);
                    }
                }
            }
            let (dev, ino) = inode(&st);
            if listing.bare {
                let seen = Seen::Bare { dev, ino };
                found(&dir, &rel, OsStr::new("HEAD"), seen, Some(SFlag::S_IFDIR));
            }
            let depth = rel.components().count();
            let rel = Rc::new(rel);
            for (at, (name, _)) in listing.subdirs.iter().enumerate().rev() {
                if depth + 1 > MAX_DEPTH {
                    found(
                        &dir,
                        &rel.join(name),
                        name,
                        Seen::TooDeep,
                        Some(SFlag::S_IFDIR),
                    );
                    continue;
                }
                pending.push(Pending {
                    parent: dir.clone(),
                    dev,
                    listing: listing.clone(),
                    rel: rel.clone(),
                    at,
                });
            }
        };
    visit(&mut walker, Rc::new(top), PathBuf::new(), &mut pending);
    while let Some(next) = pending.pop() {
        let (name, hint) = &next.listing.subdirs[next.at];
        if walker.unchanged_leaf(&next.parent, next.dev, name, *hint) {
            continue;
        }
        if let Ok(dir) = open_subdir(&next.parent, name) {
            let rel = next.rel.join(name);
            drop(next);
            visit(&mut walker, Rc::new(dir), rel, &mut pending);
        }
    }
    Ok((walker.index, walker.stats))
}
