//! After a run: the repositories the run created inside the worktree.
//!
//! A run can `git init sub/x` (or clone, or make a bare repository, or write a `.git` file
//! pointing anywhere) and give that repository a hook or `core.fsmonitor`. Git run later
//! *in that folder* — by the user, an editor that scans the project for repositories, a
//! shell prompt that shows the branch — uses it and runs the command on the host. Nothing in
//! the kernel refuses a name (Landlock grants by hierarchy; a mount needs the name to exist),
//! so the refusal is made after the run, once every process of it is gone:
//!
//! * before the command starts, one walk of the worktree records every repository already
//!   there ([`NestedAtStart::scan`]): each `.git` entry (a file's bytes, a directory's or
//!   link's inode) and each directory git would take for a bare repository (`HEAD` beside
//!   `objects/` and `refs/`, or beside `commondir`);
//! * after it, the same walk ([`audit_nested`]) finds what is new. Without the grant
//!   (`--allow-nested-git`, [`GitLayout::allow_nested_git`]) a new `.git` is renamed to
//!   `.git.sandbox-set-aside-<random>` and a new bare repository's `HEAD` to
//!   `HEAD.sandbox-set-aside-<random>` — git no longer finds a repository there, nothing is
//!   deleted — and reported. A `.git` file that was there before and now says something
//!   else is put back ([`super::restore`]). With the grant each new one is only reported.
//!
//! What was there before the run is never touched: submodules' `.git` files, vendored
//! repositories, fixtures. The walk does not enter `.git` directories: the worktree's own
//! belongs to the git dir audit and the pointer checks, a nested one is recorded whole (a
//! new one is set aside whole; what a run writes inside one that was there is a known limit,
//! `docs/security.md`). It goes everywhere else, ignored trees (`target/`,
//! `node_modules/`) included — an editor opens files there and runs git in their folder —
//! relative to descriptors opened `O_NOFOLLOW` (a link is an entry, never followed), reading
//! directory entries only (their types from `getdents`, no `stat` per file). Deeper than
//! [`MAX_DEPTH`] it stops, and a new directory there is reported as not searched.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use nix::dir::{Dir, Type};
use nix::fcntl::{renameat, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use sandbox_policy::GitLayout;
use serde::{Deserialize, Serialize};

use super::{file_type, fresh_name, lstat_at, open_at, restore, Tampering};

/// How deep the walk goes below the worktree root (each level holds one descriptor).
pub const MAX_DEPTH: usize = 256;

/// The most of a `.git` file that is recorded (a gitlink pointer is one short line).
const POINTER_LIMIT: u64 = 64 * 1024;

/// A repository (or a place the walk could not search) as the walk found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Seen {
    /// A `.git` regular file: git reads its bytes (`gitdir: …`).
    PointerFile { content: String },
    /// A `.git` directory or link, or a `.git` file too large or not text, by inode.
    Entry { dev: u64, ino: u64 },
    /// A directory git takes for a bare repository, by the directory's inode.
    Bare { dev: u64, ino: u64 },
    /// A directory deeper than [`MAX_DEPTH`].
    TooDeep,
}

/// The repositories inside the worktree when the command started: what [`audit_nested`]
/// compares with (kept in the run journal too).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NestedAtStart {
    root: PathBuf,
    allowed: bool,
    /// By path relative to the root: a `.git` entry's own path, a bare repository's directory.
    seen: BTreeMap<PathBuf, Seen>,
}

/// What the run did that the check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum NestedChange {
    /// A repository that was not there before the run.
    Created,
    /// A `.git` file that was there, now saying something else (or replaced).
    Repointed,
    /// A new directory deeper than the walk goes: not searched.
    Unsearched,
}

/// One repository the run created (or a `.git` it re-pointed), and what was done with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NestedRepo {
    /// The `.git` entry, or the bare repository's directory.
    pub path: PathBuf,
    pub change: NestedChange,
    /// "a .git directory", "a .git file (gitdir: …)", "a .git symbolic link", "a bare
    /// repository", "a directory deeper than 256 levels".
    pub found: String,
    /// Kept because the run had the grant (`--allow-nested-git`).
    pub kept: bool,
    /// A `.git` file that existed before the run, put back as it was.
    pub restored: bool,
    /// Where the `.git` (or the bare repository's `HEAD`) was moved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moved_to: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl std::fmt::Display for NestedRepo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = self.path.display();
        if self.change == NestedChange::Unsearched {
            return write!(
                f,
                "git: the run left {at}, {}: it was not searched for repositories; look \
                 before running git below it",
                self.found
            );
        }
        if self.change == NestedChange::Repointed {
            return match &self.error {
                None => write!(
                    f,
                    "git: the run re-pointed {at} ({}); restored it",
                    self.found
                ),
                Some(e) => write!(
                    f,
                    "git: the run re-pointed {at} ({}); could NOT restore it ({e}): fix it \
                     before running git there",
                    self.found
                ),
            };
        }
        write!(f, "git: the run created a repository: {at}, {}", self.found)?;
        match (&self.moved_to, &self.error) {
            _ if self.kept => write!(
                f,
                "; kept (--allow-nested-git): git there runs its hooks and core.fsmonitor, \
                 so look at its config and hooks before using git in that folder"
            ),
            (Some(to), _) => write!(
                f,
                "; set aside as {} (git there would have run its hooks and core.fsmonitor on \
                 this host; --allow-nested-git keeps such repositories)",
                to.display()
            ),
            (None, e) => write!(
                f,
                "; could NOT set it aside ({}): remove it before running git there",
                e.as_deref().unwrap_or("unknown error")
            ),
        }
    }
}

/// What the check found after a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NestedReport {
    pub repos: Vec<NestedRepo>,
}

impl NestedReport {
    pub fn warnings(&self) -> Vec<String> {
        self.repos.iter().map(ToString::to_string).collect()
    }
}

/// The worktree whose repositories are checked: a linked worktree's (where its `.git`
/// pointer lies), or a main worktree's (its `.git` directory's parent).
fn worktree_root(layout: &GitLayout) -> Option<PathBuf> {
    if layout.is_linked {
        layout
            .pointers
            .iter()
            .find(|p| p.path.file_name() == Some(OsStr::new(".git")))
            .and_then(|p| p.path.parent())
            .map(Path::to_path_buf)
    } else {
        (layout.common_dir.file_name() == Some(OsStr::new(".git")))
            .then(|| layout.common_dir.parent().map(Path::to_path_buf))
            .flatten()
    }
}

/// What kind of entry `name` of `dir` is: from `getdents` when the filesystem says, else
/// from `fstatat` (no link followed).
fn kind(dir: &File, name: &OsStr, from_listing: Option<Type>) -> Option<SFlag> {
    match from_listing {
        Some(Type::Directory) => Some(SFlag::S_IFDIR),
        Some(Type::File) => Some(SFlag::S_IFREG),
        Some(Type::Symlink) => Some(SFlag::S_IFLNK),
        Some(_) => Some(SFlag::S_IFIFO),
        None => lstat_at(dir, name).ok().flatten().map(|st| file_type(&st)),
    }
}

/// The entries of `dir` and their kinds.
fn list(dir: &File) -> io::Result<Vec<(OsString, Option<SFlag>)>> {
    let mut listing = Dir::from(dir.try_clone()?)?;
    let mut out = Vec::new();
    for entry in listing.iter() {
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        out.push((name.to_os_string(), entry.file_type()));
    }
    Ok(out
        .into_iter()
        .map(|(name, t)| {
            let k = kind(dir, &name, t);
            (name, k)
        })
        .collect())
}

fn open_subdir(dir: &File, name: &OsStr) -> io::Result<File> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW;
    open_at(dir, name, flags, Mode::empty())
}

/// The device and inode of `st` (`st_dev` is an `i32` on macOS).
#[allow(clippy::unnecessary_cast)]
fn inode(st: &FileStat) -> (u64, u64) {
    (st.st_dev as u64, st.st_ino as u64)
}

/// What git would find at `.git` in `dir`.
fn seen_dot_git(dir: &File, st: &FileStat) -> Seen {
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

fn describe(seen: &Seen, kind: Option<SFlag>) -> String {
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
struct Visit<'a> {
    entries: &'a [(OsString, Option<SFlag>)],
}

impl Visit<'_> {
    fn has(&self, name: &str, kinds: &[SFlag]) -> bool {
        self.entries
            .iter()
            .any(|(n, k)| n == name && k.is_some_and(|k| kinds.contains(&k)))
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
}

/// What [`walk`] calls with each repository it finds.
type Found<'a> = dyn FnMut(&File, &Path, &OsStr, Seen, Option<SFlag>) + 'a;

/// Walks the worktree under `root` (its own `.git` left out), calling `found` with each
/// repository: the directory it is in (open), its path relative to the root, the name of its
/// entry there (`.git`, or the bare repository's `HEAD`), what it is, and its kind.
fn walk(root: &Path, found: &mut Found<'_>) -> io::Result<()> {
    let top = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(root)?;
    // Depth first; a directory's descriptor lives while a child of it waits, so no more
    // are open at once than the walk is deep.
    let mut pending: Vec<(Rc<File>, OsString, PathBuf)> = Vec::new();
    let mut visit = |dir: Rc<File>, rel: PathBuf, pending: &mut Vec<_>| {
        let Ok(entries) = list(&dir) else {
            return;
        };
        let here = Visit { entries: &entries };
        let top_level = rel.as_os_str().is_empty();
        if !top_level {
            if let Some((_, k)) = entries.iter().find(|(n, _)| n == ".git") {
                if let Ok(Some(st)) = lstat_at(&dir, OsStr::new(".git")) {
                    let seen = seen_dot_git(&dir, &st);
                    found(&dir, &rel.join(".git"), OsStr::new(".git"), seen, *k);
                }
            }
        }
        if here.is_bare() {
            if let Ok(st) = nix::sys::stat::fstat(dir.as_raw_fd()) {
                let (dev, ino) = inode(&st);
                let seen = Seen::Bare { dev, ino };
                found(&dir, &rel, OsStr::new("HEAD"), seen, Some(SFlag::S_IFDIR));
            }
        }
        let depth = rel.components().count();
        for (name, k) in entries.iter().rev() {
            // A `.git` directory is a repository's own data, recorded above as one entry:
            // what is inside it (a submodule's git dir in `modules/`) is that repository's.
            if *k != Some(SFlag::S_IFDIR) || name == ".git" {
                continue;
            }
            let child = rel.join(name);
            if depth + 1 > MAX_DEPTH {
                found(&dir, &child, name, Seen::TooDeep, *k);
                continue;
            }
            pending.push((dir.clone(), name.clone(), child));
        }
    };
    visit(Rc::new(top), PathBuf::new(), &mut pending);
    while let Some((parent, name, rel)) = pending.pop() {
        if let Ok(dir) = open_subdir(&parent, &name) {
            drop(parent);
            visit(Rc::new(dir), rel, &mut pending);
        }
    }
    Ok(())
}

impl NestedAtStart {
    /// Records the repositories inside the worktree of `layout` before a command starts.
    pub fn scan(layout: &GitLayout) -> Option<Self> {
        let root = worktree_root(layout)?;
        let mut seen = BTreeMap::new();
        walk(&root, &mut |_, rel, _, what, _| {
            seen.insert(rel.to_path_buf(), what);
        })
        .ok()?;
        Some(NestedAtStart {
            root,
            allowed: layout.allow_nested_git,
            seen,
        })
    }

    /// How many repositories (and unsearched directories) the worktree held at the start.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.seen.len()
    }
}

/// After the run (every process of it gone): reports each repository that was not in the
/// worktree at `start`, and sets it aside unless the run had the grant; puts back a `.git`
/// file that existed and was rewritten.
pub fn audit_nested(start: &NestedAtStart) -> NestedReport {
    let mut report = NestedReport::default();
    let walked = walk(&start.root, &mut |dir, rel, name, now, kind| {
        let before = start.seen.get(rel);
        if before == Some(&now) {
            return;
        }
        let path = start.root.join(rel);
        let mut repo = NestedRepo {
            path: path.clone(),
            change: match (&now, before) {
                (Seen::TooDeep, _) => NestedChange::Unsearched,
                (_, Some(Seen::PointerFile { .. })) => NestedChange::Repointed,
                _ => NestedChange::Created,
            },
            found: describe(&now, kind),
            kept: false,
            restored: false,
            moved_to: None,
            error: None,
        };
        if let (Some(Seen::PointerFile { content }), NestedChange::Repointed) =
            (before, repo.change)
        {
            // A submodule's `.git` (or any `.git` file) that was there: its bytes go back.
            let mut t = Tampering {
                path: path.clone(),
                found: String::new(),
                restored: false,
                quarantined: None,
                created: false,
                error: None,
            };
            restore(dir, &path, name, content, &mut t);
            repo.restored = t.restored;
            repo.moved_to = t.quarantined;
            repo.error = t.error;
            report.repos.push(repo);
            return;
        }
        if repo.change == NestedChange::Unsearched || start.allowed {
            repo.kept = start.allowed && repo.change == NestedChange::Created;
            report.repos.push(repo);
            return;
        }
        let moved = fresh_name("", name, "sandbox-set-aside").and_then(|aside| {
            let at = Some(dir.as_raw_fd());
            renameat(at, name, at, aside.as_os_str())
                .map_err(io::Error::from)
                .map(|()| aside)
        });
        match moved {
            Ok(aside) => {
                let holder = if name == ".git" {
                    path.with_file_name(&aside)
                } else {
                    path.join(&aside)
                };
                repo.moved_to = Some(holder);
            }
            Err(e) => repo.error = Some(e.to_string()),
        }
        report.repos.push(repo);
    });
    if let Err(e) = walked {
        report.repos.push(NestedRepo {
            path: start.root.clone(),
            change: NestedChange::Unsearched,
            found: format!("a worktree that cannot be opened after the run ({e})"),
            kept: false,
            restored: false,
            moved_to: None,
            error: Some(e.to_string()),
        });
    }
    report
}

#[cfg(test)]
#[path = "nested/tests.rs"]
mod tests;
