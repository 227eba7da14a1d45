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
//!
//! Reading every directory twice per command cost more than the rest of a run in a Rust
//! project with its `target/` (`BENCHMARKS.md`). So each walk records each directory it read
//! (its device, inode and change time, whether it holds a `.git` or is a bare repository,
//! its subdirectories: [`index`]), and the next walk reads again only the directories whose
//! change time or inode differ — a directory with nothing to visit below it costs one
//! `fstatat`, one with subdirectories an `open` and `fstat`; every directory is still
//! checked, and each `.git` found is inspected again. The audit walks after the scan's
//! record; the scan of the next command after the audit's, kept in the private directory
//! ([`CACHE_DIR`], mode 0600) when the run has one. A record from the journal has none:
//! that audit reads everything.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::AsRawFd;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::fcntl::renameat;
use sandbox_policy::GitLayout;
use serde::{Deserialize, Serialize};

use super::{file_type, fresh_name, lstat_at, open_at, restore, Tampering};

mod index;
use index::Index;

mod walk;
use walk::{describe, walk, WalkStats};

/// The directory of the private directory where each worktree's last walk is kept.
pub const CACHE_DIR: &str = "nested-walk";

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
    /// The scan's record of each directory, which the audit reads again only where it
    /// changed. Not in the journal: an audit from there reads every directory.
    #[serde(skip)]
    index: Option<Arc<Index>>,
    /// Where the audit leaves its walk for the next command's scan.
    #[serde(skip)]
    cache: Option<PathBuf>,
    /// How long ago a directory must have changed for a walk to record it.
    #[serde(skip, default = "racy")]
    racy: Duration,
    /// How the scan's walk went (the tests read it; a run logs it).
    #[cfg(test)]
    #[serde(skip)]
    stats: WalkStats,
}

fn racy() -> Duration {
    index::RACY
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

/// The file where the walk of the worktree at `root` is kept between commands, in `dir`.
fn cache_file(dir: &Path, root: &Path) -> PathBuf {
    // FNV-1a of the path, as the journal names a worktree's records.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in root.as_os_str().as_encoded_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    dir.join(format!("{hash:016x}.walk"))
}

impl NestedAtStart {
    /// Records the repositories inside the worktree of `layout` before a command starts.
    /// With `cache` (a directory of [`crate::privdir`]), the walk reads only the directories
    /// that changed since the last command's audit there, and the audit leaves its own walk
    /// there for the next command.
    pub fn scan(layout: &GitLayout, cache: Option<&Path>) -> Option<Self> {
        Self::scan_with(layout, cache, index::RACY)
    }

    fn scan_with(layout: &GitLayout, cache: Option<&Path>, racy: Duration) -> Option<Self> {
        let root = worktree_root(layout)?;
        let cache = cache.map(|dir| cache_file(dir, &root));
        let prior = cache.as_deref().and_then(Index::load);
        let mut seen = BTreeMap::new();
        let (index, stats) = walk(&root, prior.as_ref(), racy, &mut |_, rel, _, what, _| {
            seen.insert(rel.to_path_buf(), what);
        })
        .ok()?;
        tracing::debug!(?stats, root = %root.display(), "nested repositories: the scan's walk");
        Some(NestedAtStart {
            root,
            allowed: layout.allow_nested_git,
            seen,
            index: Some(Arc::new(index)),
            cache,
            racy,
            #[cfg(test)]
            stats,
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
    audit(start).0
}

/// [`audit_nested`], and how its walk went.
fn audit(start: &NestedAtStart) -> (NestedReport, Option<WalkStats>) {
    let mut report = NestedReport::default();
    let prior = start.index.as_deref();
    let walked = walk(
        &start.root,
        prior,
        start.racy,
        &mut |dir, rel, name, now, kind| {
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
        },
    );
    match walked {
        Ok((index, stats)) => {
            tracing::debug!(?stats, root = %start.root.display(), "nested repositories: the audit's walk");
            // A directory where something was set aside changed after it was read: its change
            // time differs from the one recorded, so the next walk reads it again.
            if let Some(cache) = &start.cache {
                if let Err(e) = index.store(cache) {
                    tracing::debug!(cache = %cache.display(), "the walk not kept: {e}");
                }
            }
            (report, Some(stats))
        }
        Err(e) => {
            report.repos.push(NestedRepo {
                path: start.root.clone(),
                change: NestedChange::Unsearched,
                found: format!("a worktree that cannot be opened after the run ({e})"),
                kept: false,
                restored: false,
                moved_to: None,
                error: Some(e.to_string()),
            });
            (report, None)
        }
    }
}

#[cfg(test)]
#[path = "nested/tests.rs"]
mod tests;
