//! After a run: the git pointer files must still say what they said before.
//!
//! An agent that can write its worktree can rewrite `.git` (the "gitdir: …" pointer) to a git
//! directory of its own whose config or hooks run code the next time *the host* uses git in
//! that worktree; `commondir` and `gitdir` in the worktree's private git dir are writable for
//! the same reason. Each is compared with the bytes recorded before the run and restored.
//! In a main worktree `.git` is the writable git dir itself, and git reads `commondir` in any
//! git dir (`setup.c`'s `get_common_dir_noenv` does not ask whether it is a linked
//! worktree's): `commondir`, `gitdir` and `locked` there are recorded too, as they were or as
//! absent, and whatever the run left at an absent one is moved aside (the view cannot keep
//! the name from being created: see `docs/security.md`).
//!
//! The repair runs with the user's rights in directories the agent could write, so it trusts
//! no name there. Every step works relative to the pointer's directory, opened with
//! `O_NOFOLLOW`, and never follows a symlink or reuses a name the agent could have prepared:
//!
//! * what is at the pointer is inspected with `fstatat(AT_SYMLINK_NOFOLLOW)`, and read only
//!   when it is a regular file (`O_NOFOLLOW | O_NONBLOCK`: a FIFO cannot stall the host);
//! * a directory there is renamed aside to `<name>.sandbox-quarantine-<random>`, never deleted;
//! * the recorded bytes go into a new `.<name>.sandbox-restore-<random>`, created with
//!   `O_CREAT | O_EXCL | O_NOFOLLOW` (never an existing file or link), renamed over the
//!   pointer: rename(2) replaces a symlink there as a link, never what it points to.
//!
//! `<random>` is 128 bits from the OS: nothing can be planted at those names in advance.

mod agentrepo;
mod gitdir;
mod nested;

pub use agentrepo::audit_agent_repos;

pub use gitdir::{audit_gitdir, GitDirAtStart, GitDirReport};
pub use nested::{audit_nested, NestedAtStart, NestedReport, CACHE_DIR as NESTED_WALKS};

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{readlinkat, renameat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, FileStat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};
use sandbox_git::quarantine::refs::{head_allowed, is_object_id, ref_exists};
use sandbox_git::quarantine::StoreReport;
use sandbox_policy::GitLayout;
use serde::Serialize;

/// One pointer that was changed during the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tampering {
    pub path: PathBuf,
    /// What was there after the run: the text, or "(missing)", "(directory)", "(symlink to
    /// …)", "(not a regular file)", "(unreadable: …)".
    pub found: String,
    /// Whether the original was put back.
    pub restored: bool,
    /// Where a replaced directory was moved, so nothing is deleted — or, for a pointer that
    /// did not exist before the run ([`Self::created`]), whatever the run left there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quarantined: Option<PathBuf>,
    /// The pointer did not exist before the run (a main git dir's `commondir`): restoring it
    /// means moving what the run created aside.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub created: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl std::fmt::Display for Tampering {
    /// "the sandboxed command changed git pointer P (found "…"); restored it[; …]" — the one
    /// wording `sandbox run` and the daemon both report.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.created {
            write!(
                f,
                "the sandboxed command created git pointer {} (found {:?}), which git reads \
                 to find the repository; {}",
                self.path.display(),
                self.found.trim(),
                match &self.quarantined {
                    Some(q) if self.restored => format!("moved it aside to {}", q.display()),
                    _ => "could NOT move it aside: remove it before running git here".into(),
                }
            )?;
            if let Some(e) = &self.error {
                write!(f, ": {e}")?;
            }
            return Ok(());
        }
        write!(
            f,
            "the sandboxed command changed git pointer {} (found {:?}); {}",
            self.path.display(),
            self.found.trim(),
            if self.restored {
                "restored it"
            } else {
                "could NOT restore it"
            }
        )?;
        if let Some(q) = &self.quarantined {
            write!(f, "; the directory it left is at {}", q.display())?;
        }
        if let Some(e) = &self.error {
            write!(f, ": {e}")?;
        }
        Ok(())
    }
}

/// More than any pointer holds; a larger file is described by its first bytes.
const READ_LIMIT: u64 = 64 * 1024;

/// The directory holding `path` (a symlink as its last component is refused, not followed)
/// and the pointer's name in it.
fn open_parent(path: &Path) -> io::Result<(File, &OsStr)> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a file path",
        ));
    };
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(parent)?;
    Ok((dir, name))
}

pub(crate) fn open_at(dir: &File, name: &OsStr, flags: OFlag, mode: Mode) -> io::Result<File> {
    let fd = crate::sys::openat(Some(dir.as_raw_fd()), name, flags | OFlag::O_CLOEXEC, mode)?;
    Ok(File::from(fd))
}

/// What is at `name` itself (a symlink is not followed); `None` if nothing is.
pub(crate) fn lstat_at(dir: &File, name: &OsStr) -> io::Result<Option<FileStat>> {
    match fstatat(Some(dir.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

pub(crate) fn file_type(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

/// What is at the pointer now: its text, or "(missing)", "(directory)", "(symlink to …)".
fn describe(dir: &File, name: &OsStr) -> String {
    let st = match lstat_at(dir, name) {
        Ok(Some(st)) => st,
        Ok(None) => return "(missing)".into(),
        Err(e) => return format!("(unreadable: {e})"),
    };
    match file_type(&st) {
        SFlag::S_IFLNK => format!(
            "(symlink to {})",
            readlinkat(Some(dir.as_raw_fd()), name)
                .map(|t| PathBuf::from(t).display().to_string())
                .unwrap_or_default()
        ),
        SFlag::S_IFDIR => "(directory)".into(),
        SFlag::S_IFREG => {
            let read = || -> io::Result<String> {
                let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK;
                let file = open_at(dir, name, flags, Mode::empty())?;
                if !file.metadata()?.is_file() {
                    return Err(io::Error::other("no longer a regular file"));
                }
                let mut bytes = Vec::new();
                file.take(READ_LIMIT).read_to_end(&mut bytes)?;
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            };
            read().unwrap_or_else(|e| format!("(unreadable: {e})"))
        }
        _ => "(not a regular file)".into(),
    }
}

/// `<prefix><name>.<what>-<32 random hex digits>`.
pub(crate) fn fresh_name(prefix: &str, name: &OsStr, what: &str) -> io::Result<OsString> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| io::Error::other(format!("no randomness for a fresh name: {e}")))?;
    let mut fresh = OsString::from(prefix);
    fresh.push(name);
    fresh.push(format!(".{what}-"));
    for b in bytes {
        fresh.push(format!("{b:02x}"));
    }
    Ok(fresh)
}

/// `result`, its error prefixed with the step it failed at.
fn context<T, E: Into<io::Error>>(what: &str, result: Result<T, E>) -> io::Result<T> {
    result.map_err(|e| {
        let e = e.into();
        io::Error::new(e.kind(), format!("{what}: {e}"))
    })
}

/// Puts `content` back at `name` in `dir` (see the module comment for why each step is so).
fn restore(dir: &File, path: &Path, name: &OsStr, content: &str, t: &mut Tampering) {
    let at = Some(dir.as_raw_fd());
    let result = (|| -> io::Result<()> {
        let st = context("inspecting it", lstat_at(dir, name))?;
        if st.is_some_and(|st| file_type(&st) == SFlag::S_IFDIR) {
            let aside = fresh_name("", name, "sandbox-quarantine")?;
            let moved = renameat(at, name, at, aside.as_os_str());
            context("moving the directory aside", moved)?;
            t.quarantined = Some(path.with_file_name(aside));
        }
        let tmp = fresh_name(".", name, "sandbox-restore")?;
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW;
        let created = open_at(dir, &tmp, flags, Mode::from_bits_truncate(0o666));
        let mut file = context("creating the new pointer", created)?;
        let written = context(
            "writing the new pointer",
            file.write_all(content.as_bytes()),
        )
        .and_then(|()| {
            let renamed = renameat(at, tmp.as_os_str(), at, name);
            context("renaming it over the pointer", renamed)
        });
        if written.is_err() {
            let _ = unlinkat(at, tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
        written
    })();
    match result {
        Ok(()) => t.restored = true,
        Err(e) => t.error = Some(e.to_string()),
    }
}

/// Compares every recorded pointer with the filesystem and restores the changed ones; moves
/// aside what the run left where a pointer was absent.
pub fn check_and_restore(layout: &GitLayout) -> Vec<Tampering> {
    let changed = layout.pointers.iter().filter_map(|pointer| {
        restore_unless(&pointer.path, &pointer.content, |now| {
            now == pointer.content
        })
    });
    let created = layout.absent_pointers.iter().filter_map(|p| keep_absent(p));
    changed.chain(created).collect()
}

/// Moves whatever is at `path` (a file, a link, a directory: not followed, never deleted)
/// to `<name>.sandbox-quarantine-<random>` beside it; nothing if `path` is still absent.
fn keep_absent(path: &Path) -> Option<Tampering> {
    let mut t = Tampering {
        path: path.to_path_buf(),
        found: String::new(),
        restored: false,
        quarantined: None,
        created: true,
        error: None,
    };
    let (dir, name) = match open_parent(path) {
        Ok(parent) => parent,
        Err(e) => {
            t.found = format!("(its directory cannot be opened: {e})");
            t.error = Some(format!("opening its directory: {e}"));
            return Some(t);
        }
    };
    match lstat_at(&dir, name) {
        Ok(None) => return None,
        Ok(Some(_)) => t.found = describe(&dir, name),
        Err(e) => t.found = format!("(unreadable: {e})"),
    }
    let moved = fresh_name("", name, "sandbox-quarantine").and_then(|aside| {
        let at = Some(dir.as_raw_fd());
        context("moving it aside", renameat(at, name, at, aside.as_os_str())).map(|()| aside)
    });
    match moved {
        Ok(aside) => {
            t.restored = true;
            t.quarantined = Some(path.with_file_name(aside));
        }
        Err(e) => t.error = Some(e.to_string()),
    }
    Some(t)
}

/// Reads what is at `path` and, unless `keep` accepts it, puts `content` back there (see the
/// module comment); the change found, if any.
fn restore_unless(path: &Path, content: &str, keep: impl Fn(&str) -> bool) -> Option<Tampering> {
    let parent = open_parent(path);
    let now = match &parent {
        Ok((dir, name)) => describe(dir, name),
        Err(e) => format!("(its directory cannot be opened: {e})"),
    };
    if keep(&now) {
        return None;
    }
    let mut t = Tampering {
        path: path.to_path_buf(),
        found: now,
        restored: false,
        quarantined: None,
        created: false,
        error: None,
    };
    match parent {
        Ok((dir, name)) => restore(&dir, path, name, content, &mut t),
        Err(e) => t.error = Some(format!("opening its directory: {e}")),
    }
    Some(t)
}

/// A linked worktree's `HEAD` when a quarantined command started.
///
/// The quarantine lets a run move the task branch — the branch `HEAD` names at the start —
/// and nothing else. `HEAD` itself lies in the worktree's own git dir, which the run writes
/// (a checkout, a rebase), so a run could leave it naming another task's branch or `main`,
/// and the *next* run would take that branch for its task branch and move it. After the run,
/// [`check_head`] puts `HEAD` back unless it names a branch this run may own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadAtStart {
    path: PathBuf,
    content: String,
}

impl HeadAtStart {
    /// Reads `HEAD` of a linked worktree (a main worktree's is pinned read-only in the view).
    pub fn read(layout: &GitLayout) -> Option<Self> {
        if !layout.is_linked {
            return None;
        }
        let path = layout.worktree_gitdir.join("HEAD");
        let (dir, name) = open_parent(&path).ok()?;
        let content = describe(&dir, name);
        content
            .starts_with("ref: ")
            .then_some(())
            .or_else(|| is_object_id(content.trim_end()).then_some(()))?;
        Some(HeadAtStart { path, content })
    }
}

/// Puts `HEAD` back as it was at `start` when the run left it naming a branch it may not move
/// (see [`HeadAtStart`]); `report`: the run's quarantine's (its task branch, and the refs the
/// worktree's runs created).
pub fn check_head(
    start: &HeadAtStart,
    layout: &GitLayout,
    report: &StoreReport,
) -> Option<Tampering> {
    restore_unless(&start.path, &start.content, |now| {
        now == start.content || {
            let name = now.trim_end().strip_prefix("ref: ").unwrap_or_default();
            is_object_id(now.trim_end()) || may_own_ref(layout, name, Some(report))
        }
    })
}

/// Whether a run may leave ref `name` to be moved by the user's git later (`HEAD`, a stopped
/// rebase's `head-name` and `update-ref` lines): the task branch, a branch the worktree's runs
/// created (`report`: the run's quarantine's), or a branch that does not exist.
pub fn may_own_ref(layout: &GitLayout, name: &str, report: Option<&StoreReport>) -> bool {
    let created: Vec<&str> = report
        .into_iter()
        .flat_map(|r| {
            r.applied
                .iter()
                .filter(|a| a.old.is_none())
                .map(|a| a.name.as_str())
                .chain(r.owned.iter().map(String::as_str))
        })
        .collect();
    let task = report.map_or(layout.task_branch.as_deref(), |r| r.task_branch.as_deref());
    head_allowed(&format!("ref: {name}"), task, &created, |n| {
        ref_exists(&layout.common_dir, n)
    })
}

/// `extensions.worktreeConfig` appeared during the run: git then reads a per-worktree config
/// file the sandbox could write.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WorktreeConfigEnabled {
    pub config: PathBuf,
    pub worktree_config: PathBuf,
}

impl std::fmt::Display for WorktreeConfigEnabled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "extensions.worktreeConfig was enabled in {} during the run; check {} before using \
             git here",
            self.config.display(),
            self.worktree_config.display()
        )
    }
}

/// What to tell the user when `extensions.worktreeConfig` came on during the run.
pub fn worktree_config_enabled(layout: &GitLayout) -> Option<WorktreeConfigEnabled> {
    worktree_config_enabled_since(layout).then(|| WorktreeConfigEnabled {
        config: layout.common_dir.join("config"),
        worktree_config: layout.worktree_gitdir.join("config.worktree"),
    })
}

/// True if `extensions.worktreeConfig` is on now but was off before the run.
pub fn worktree_config_enabled_since(layout: &GitLayout) -> bool {
    if layout.worktree_config {
        return false;
    }
    git_config_bool(
        &layout.common_dir.join("config"),
        "extensions.worktreeConfig",
    )
}

/// Reads one boolean from a git config file without running git (and so without honouring
/// anything the file might say about hooks or includes).
fn git_config_bool(path: &Path, key: &str) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    let (section, name) = key.split_once('.').unwrap_or(("", key));
    let mut in_section = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_section = line
                .trim_matches(|c| c == '[' || c == ']')
                .trim()
                .eq_ignore_ascii_case(section);
            continue;
        }
        if in_section {
            if let Some((k, v)) = line.split_once('=') {
                if k.trim().eq_ignore_ascii_case(name) {
                    return matches!(
                        v.trim().to_ascii_lowercase().as_str(),
                        "true" | "yes" | "on" | "1"
                    );
                }
            } else if line.eq_ignore_ascii_case(name) {
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests;
