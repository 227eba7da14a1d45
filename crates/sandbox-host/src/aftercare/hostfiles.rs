//! After a run: the files in the worktree that host tools run ([`sandbox_policy::hostfiles`]).
//!
//! The native view keeps each one that exists read-only; a name that does not exist cannot be
//! bound, and the other backends (nono, a custom launcher, Landlock alone, a BoxLite box's
//! writable share) bind nothing. So before every command the host records each protected path
//! that no grant opened — a file's bytes and mode, a directory's entries, a link's target —
//! and after it, once every process is gone:
//!
//! * what the run created there (a new `.mcp.json`, `.envrc`, `.vscode/tasks.json`, a link
//!   where `.claude` was) is renamed to `<path with / as %>.sandbox-set-aside-<random>` in
//!   the worktree root: the host tool no longer finds it, nothing is deleted;
//! * what it changed is set aside the same way and the recorded bytes put back; a file too
//!   large to record (over [`FILE_CAP`], or past [`TOTAL_CAP`] in all) is set aside and
//!   reported as not restored;
//! * what it removed is put back when its bytes were recorded.
//!
//! Each finding is one line naming the grant that would have allowed it (`--allow-write
//! .vscode`), on stderr and in `--report-json`. Everything works relative to descriptors
//! opened `O_NOFOLLOW` from the worktree root (a link is an entry, never followed), and new
//! names come from 128 random bits, as in [`super::gitguard`].

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{readlinkat, renameat, OFlag};
use nix::sys::stat::{mkdirat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};
use sandbox_policy::{HostFile, Policy};
use serde::{Deserialize, Serialize};

use super::gitguard::{file_type, fresh_name, lstat_at, open_at};

/// The most of one file that is recorded (settings, task lists, `.envrc`: a few KiB).
pub const FILE_CAP: u64 = 1024 * 1024;
/// The most recorded in all, per command.
pub const TOTAL_CAP: u64 = 16 * 1024 * 1024;
/// How deep below a protected directory the record goes, and how many entries it keeps.
const MAX_DEPTH: usize = 16;
const MAX_ENTRIES: usize = 20_000;

/// One entry as recorded (kept in the run journal too: bytes as hex).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Node {
    /// A regular file: its mode, and its bytes when within the caps (else its size and
    /// change time, enough to tell that it changed).
    File {
        mode: u32,
        #[serde(with = "hex")]
        bytes: Option<Vec<u8>>,
        stamp: (i64, i64, i64, u64),
    },
    Dir,
    Link(PathBuf),
    Other,
}

impl Node {
    fn same(&self, other: &Node) -> bool {
        match (self, other) {
            (
                Node::File {
                    mode: m1,
                    bytes: Some(b1),
                    ..
                },
                Node::File {
                    mode: m2,
                    bytes: Some(b2),
                    ..
                },
            ) => m1 == m2 && b1 == b2,
            (Node::File { stamp: s1, .. }, Node::File { stamp: s2, .. }) => s1 == s2,
            _ => self == other,
        }
    }
}

/// A protected path's entries, by path relative to it (`""`: the path itself).
type Tree = BTreeMap<PathBuf, Node>;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Watched {
    file: HostFile,
    /// Relative to the worktree root.
    rel: PathBuf,
    before: Option<Tree>,
    /// What stood on the way when no directory did (a project's own `.claude` link to a
    /// shared directory): left alone while it stays the same.
    blocker: Option<(PathBuf, Node)>,
}

/// The protected paths of a worktree when a command started: what [`audit_host_files`]
/// compares with (kept in the run journal too).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostFilesAtStart {
    root: PathBuf,
    watched: Vec<Watched>,
    /// Write grants inside a protected directory (`--allow-write .vscode/settings.json`):
    /// what lies there is the run's to change.
    open: Vec<PathBuf>,
}

/// What the run did at a protected path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum HostFileChangeKind {
    Created,
    Changed,
    Removed,
}

/// One protected path the run created, changed or removed, and what was done about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HostFileChange {
    pub path: PathBuf,
    /// The protected path it is (or lies in), as listed: `.vscode`.
    pub listed: String,
    /// The tool that runs it, and what it runs.
    pub why: String,
    pub change: HostFileChangeKind,
    /// The flag that would have allowed it: `--allow-write .vscode`.
    pub grant: String,
    /// Where what the run left there was moved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moved_to: Option<PathBuf>,
    /// The recorded original was put back.
    pub restored: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl std::fmt::Display for HostFileChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verb = match self.change {
            HostFileChangeKind::Created => "created",
            HostFileChangeKind::Changed => "changed",
            HostFileChangeKind::Removed => "removed",
        };
        write!(
            f,
            "host files: the run {verb} {} ({}: {})",
            self.path.display(),
            self.listed,
            self.why
        )?;
        if let Some(to) = &self.moved_to {
            write!(f, "; set aside as {}", to.display())?;
        }
        match (self.change, self.restored, &self.error) {
            (_, _, Some(e)) => write!(
                f,
                "; could NOT undo it ({e}): look at it before opening the project"
            )?,
            (HostFileChangeKind::Created, _, None) => {}
            (_, true, None) => write!(f, "; the original is back")?,
            (_, false, None) => write!(
                f,
                "; the original was too large to keep: look at it before opening the project"
            )?,
        }
        write!(f, " ({} allows it)", self.grant)
    }
}

/// What the check found after a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HostFilesReport {
    pub changes: Vec<HostFileChange>,
}

impl HostFilesReport {
    pub fn warnings(&self) -> Vec<String> {
        self.changes.iter().map(ToString::to_string).collect()
    }
}

/// A file's recorded bytes in the journal's JSON: hex, not an array of numbers.
mod hex {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(b) => s.serialize_some(&b.iter().map(|x| format!("{x:02x}")).collect::<String>()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let Some(text) = Option::<String>::deserialize(d)? else {
            return Ok(None);
        };
        let digits = text.as_bytes();
        if digits.len() % 2 != 0 {
            return Err(serde::de::Error::custom("an odd number of hex digits"));
        }
        digits
            .chunks(2)
            .map(|pair| {
                std::str::from_utf8(pair)
                    .ok()
                    .and_then(|p| u8::from_str_radix(p, 16).ok())
                    .ok_or_else(|| serde::de::Error::custom("not hex"))
            })
            .collect::<Result<Vec<u8>, _>>()
            .map(Some)
    }
}

struct Budget {
    bytes: u64,
    entries: usize,
}

/// Where a relative path's last component lies, reached by descriptors.
enum Reach {
    /// Its directory (open) and its name there.
    At(File, OsString),
    /// A directory on the way is missing.
    Missing,
    /// An entry on the way is not a directory (relative to the root): a link or a file.
    Blocked(PathBuf),
}

fn open_dir(dir: &File, name: &OsStr) -> io::Result<File> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW;
    open_at(dir, name, flags, Mode::empty())
}

fn reach(root: &File, rel: &Path) -> io::Result<Reach> {
    reach_with(root, rel, false)
}

/// [`reach`]; with `make`, a missing directory on the way is made (to put back what was in it).
fn reach_with(root: &File, rel: &Path, make: bool) -> io::Result<Reach> {
    let parts: Vec<&OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let Some((last, dirs)) = parts.split_last() else {
        return Err(io::Error::other("an empty path"));
    };
    let mut dir = root.try_clone()?;
    let mut walked = PathBuf::new();
    for name in dirs {
        walked.push(name);
        match lstat_at(&dir, name)? {
            None if make => {
                mkdirat(
                    Some(dir.as_raw_fd()),
                    *name,
                    Mode::from_bits_truncate(0o755),
                )?;
                dir = open_dir(&dir, name)?;
            }
            None => return Ok(Reach::Missing),
            Some(st) if file_type(&st) != SFlag::S_IFDIR => return Ok(Reach::Blocked(walked)),
            Some(_) => dir = open_dir(&dir, name)?,
        }
    }
    Ok(Reach::At(dir, last.to_os_string()))
}

/// Records `name` in `dir` and, for a directory, what lies below it.
fn record(dir: &File, name: &OsStr, rel: PathBuf, depth: usize, tree: &mut Tree, b: &mut Budget) {
    if b.entries == 0 {
        return;
    }
    b.entries -= 1;
    let st = match lstat_at(dir, name) {
        Ok(Some(st)) => st,
        _ => return,
    };
    let node = match file_type(&st) {
        SFlag::S_IFREG => {
            let stamp = (st.st_size, st.st_mtime, st.st_mtime_nsec, st.st_ino);
            let mut bytes = None;
            let size = st.st_size.max(0) as u64;
            if size <= FILE_CAP && size <= b.bytes {
                let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK;
                if let Ok(file) = open_at(dir, name, flags, Mode::empty()) {
                    let mut buf = Vec::new();
                    if file.take(FILE_CAP + 1).read_to_end(&mut buf).is_ok()
                        && buf.len() as u64 <= FILE_CAP.min(b.bytes)
                    {
                        b.bytes -= buf.len() as u64;
                        bytes = Some(buf);
                    }
                }
            }
            // mode_t is u32 here and u16 on macOS.
            #[allow(clippy::useless_conversion)]
            Node::File {
                mode: u32::from(st.st_mode & 0o7777),
                bytes,
                stamp,
            }
        }
        SFlag::S_IFLNK => Node::Link(
            readlinkat(Some(dir.as_raw_fd()), name)
                .map(PathBuf::from)
                .unwrap_or_default(),
        ),
        SFlag::S_IFDIR => {
            if depth < MAX_DEPTH {
                if let Ok(sub) = open_dir(dir, name) {
                    for child in list(&sub) {
                        record(&sub, &child, rel.join(&child), depth + 1, tree, b);
                    }
                }
            }
            Node::Dir
        }
        _ => Node::Other,
    };
    tree.insert(rel, node);
}

/// The names in an open directory (read through its descriptor's `/proc` link, which names
/// the directory opened, not a path the run could swap).
fn list(dir: &File) -> Vec<OsString> {
    let mut names: Vec<OsString> =
        match std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())) {
            Ok(entries) => entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name())
                .collect(),
            Err(_) => Vec::new(),
        };
    names.sort();
    names
}

/// The entry that is not a directory on the way to `rel`, and what it is.
fn blocker(root: &File, rel: &Path) -> Option<(PathBuf, Node)> {
    let Ok(Reach::Blocked(at)) = reach(root, rel) else {
        return None;
    };
    let mut b = Budget {
        bytes: FILE_CAP,
        entries: 1,
    };
    let node = snapshot(root, &at, &mut b)?.remove(Path::new(""))?;
    Some((at, node))
}

fn snapshot(root: &File, rel: &Path, b: &mut Budget) -> Option<Tree> {
    match reach(root, rel) {
        Ok(Reach::At(dir, name)) => {
            let mut tree = Tree::new();
            record(&dir, &name, PathBuf::new(), 0, &mut tree, b);
            (!tree.is_empty()).then_some(tree)
        }
        _ => None,
    }
}

fn open_root(root: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(root)
}

impl HostFilesAtStart {
    /// Records the protected paths of `policy`'s worktree that no grant opened.
    pub fn scan(policy: &Policy) -> Option<Self> {
        let root = policy.workspace.root.clone();
        let open: Vec<PathBuf> = policy
            .fs
            .write
            .iter()
            .filter(|g| g.path.starts_with(&root) && g.path != root)
            .map(|g| g.path.clone())
            .collect();
        let files: Vec<&HostFile> = policy
            .workspace
            .host_files
            .iter()
            .filter(|f| f.granted.is_none())
            .collect();
        if files.is_empty() {
            return None;
        }
        let dir = open_root(&root).ok()?;
        let mut budget = Budget {
            bytes: TOTAL_CAP,
            entries: MAX_ENTRIES,
        };
        let watched = files
            .into_iter()
            .filter_map(|file| {
                let rel = file.path.strip_prefix(&root).ok()?.to_path_buf();
                let before = snapshot(&dir, &rel, &mut budget);
                let blocker = blocker(&dir, &rel);
                Some(Watched {
                    file: file.clone(),
                    rel,
                    before,
                    blocker,
                })
            })
            .collect();
        Some(HostFilesAtStart {
            root,
            watched,
            open,
        })
    }
}

/// After the run (every process of it gone): sets aside what the run created at a protected
/// path, puts back what it changed or removed, and reports each.
pub fn audit_host_files(start: &HostFilesAtStart) -> HostFilesReport {
    let mut report = HostFilesReport::default();
    let root = match open_root(&start.root) {
        Ok(dir) => dir,
        Err(e) => {
            tracing::warn!(root = %start.root.display(), "host files not checked: {e}");
            return report;
        }
    };
    for w in &start.watched {
        audit_one(&root, start, w, &mut report);
    }
    report
}

fn audit_one(root: &File, start: &HostFilesAtStart, w: &Watched, report: &mut HostFilesReport) {
    let change = |rel: &Path, change| HostFileChange {
        path: start.root.join(rel),
        listed: w.file.name.clone(),
        why: w.file.why.clone(),
        change,
        grant: w.file.grant_flag(),
        moved_to: None,
        restored: false,
        error: None,
    };
    // A link or file put where a directory on the way was (`.claude` → elsewhere): the host
    // tool would follow it.
    if let Some(now) = blocker(root, &w.rel).filter(|now| w.blocker.as_ref() != Some(now)) {
        let mut c = change(&now.0, HostFileChangeKind::Created);
        set_aside(root, &start.root, &now.0, &mut c);
        report.changes.push(c);
    }
    let mut budget = Budget {
        bytes: TOTAL_CAP,
        entries: MAX_ENTRIES,
    };
    let now = snapshot(root, &w.rel, &mut budget).unwrap_or_default();
    let before = w.before.clone().unwrap_or_default();
    let is_open = |rel: &Path| {
        let abs = start.root.join(rel);
        start.open.iter().any(|g| abs.starts_with(g))
    };
    let mut aside: Vec<PathBuf> = Vec::new();
    for (sub, node) in &now {
        let rel = w.rel.join(sub);
        if is_open(&rel) || aside.iter().any(|a| sub.starts_with(a)) {
            continue;
        }
        let kind = match before.get(sub) {
            None => HostFileChangeKind::Created,
            Some(old) if old.same(node) => continue,
            Some(_) => HostFileChangeKind::Changed,
        };
        let mut c = change(&rel, kind);
        set_aside(root, &start.root, &rel, &mut c);
        aside.push(sub.clone());
        if c.error.is_none() && kind == HostFileChangeKind::Changed {
            put_back(root, &rel, &before[sub], &mut c);
        }
        report.changes.push(c);
    }
    // What is gone (or was just set aside as changed and put back already): parents first.
    for (sub, old) in &before {
        let rel = w.rel.join(sub);
        if now.contains_key(sub) || is_open(&rel) {
            continue;
        }
        if before
            .keys()
            .any(|p| p != sub && sub.starts_with(p) && !now.contains_key(p))
            && !matches!(old, Node::Dir | Node::File { bytes: Some(_), .. })
        {
            continue;
        }
        let mut c = change(&rel, HostFileChangeKind::Removed);
        put_back(root, &rel, old, &mut c);
        report.changes.push(c);
    }
}

/// Moves what is at `rel` to the worktree root as `<rel with / as %>.sandbox-set-aside-<random>`:
/// out of every protected directory (a skill directory set aside inside `.claude/skills`
/// would still be loaded), and out of the next check's sight.
fn set_aside(root: &File, root_path: &Path, rel: &Path, c: &mut HostFileChange) {
    let result = (|| -> io::Result<PathBuf> {
        let Reach::At(dir, name) = reach(root, rel)? else {
            return Err(io::Error::other("its directory is gone"));
        };
        let flat: Vec<&str> = rel.iter().filter_map(OsStr::to_str).collect();
        let flat = OsString::from(flat.join("%"));
        let aside = fresh_name("", &flat, "sandbox-set-aside")?;
        renameat(
            Some(dir.as_raw_fd()),
            name.as_os_str(),
            Some(root.as_raw_fd()),
            aside.as_os_str(),
        )
        .map_err(io::Error::from)?;
        Ok(root_path.join(aside))
    })();
    match result {
        Ok(to) => c.moved_to = Some(to),
        Err(e) => c.error = Some(format!("moving it aside: {e}")),
    }
}

/// Puts `old` back at `rel`: a directory made again, a file's recorded bytes and mode written
/// to a fresh name and renamed there, a link made again.
fn put_back(root: &File, rel: &Path, old: &Node, c: &mut HostFileChange) {
    let result = (|| -> io::Result<bool> {
        let Reach::At(dir, name) = reach_with(root, rel, true)? else {
            return Err(io::Error::other("its directory is gone"));
        };
        let at = Some(dir.as_raw_fd());
        match old {
            Node::Dir => {
                mkdirat(at, name.as_os_str(), Mode::from_bits_truncate(0o755))?;
                Ok(true)
            }
            Node::Link(target) => {
                nix::unistd::symlinkat(target.as_os_str(), at, name.as_os_str())?;
                Ok(true)
            }
            Node::File {
                mode,
                bytes: Some(bytes),
                ..
            } => {
                let tmp = fresh_name(".", &name, "sandbox-restore")?;
                let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW;
                let mut file = open_at(&dir, &tmp, flags, Mode::from_bits_truncate(0o600))?;
                let written = file
                    .write_all(bytes)
                    .and_then(|()| file.set_permissions(std::fs::Permissions::from_mode(*mode)))
                    .and_then(|()| {
                        renameat(at, tmp.as_os_str(), at, name.as_os_str()).map_err(io::Error::from)
                    });
                if written.is_err() {
                    let _ = unlinkat(at, tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
                }
                written.map(|()| true)
            }
            // Too large to have been kept, or not a file: nothing to put back.
            _ => Ok(false),
        }
    })();
    match result {
        Ok(restored) => c.restored = restored,
        Err(e) if e.raw_os_error() == Some(Errno::EEXIST as i32) => c.restored = true,
        Err(e) => c.error = Some(format!("putting the original back: {e}")),
    }
}

#[cfg(test)]
#[path = "hostfiles/tests.rs"]
mod tests;
