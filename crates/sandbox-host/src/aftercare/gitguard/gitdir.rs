//! After a run: the worktree's own git dir (`<common>/worktrees/<wt>/`) holds only what the
//! host understands, and the index no gitlink into a repository the run planted.
//!
//! The run writes that directory, and the user's next git reads it: a link there is followed
//! (`COMMIT_EDITMSG -> ~/.bashrc`), a `config.worktree` is read as config, a stopped rebase
//! runs its `exec` lines on `--continue`. The rules are `sandbox_git::quarantine::gitdir`'s;
//! this walks the directory relative to descriptors opened `O_NOFOLLOW` (never following a
//! link, never blocking on a FIFO) and moves aside — renamed to
//! `<name>.sandbox-set-aside-<random>` at the top of the git dir, a name no git reads, never
//! deleted — everything the rules do not keep, and reports each.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{renameat, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use sandbox_git::quarantine::gitdir::{
    classify, may_hold_gitlinks, sequencer_problem, IndexSummary, Kept,
};
use sandbox_git::quarantine::gitformats::{self, MAX_STATE_FILE};
use sandbox_policy::GitLayout;
use serde::Serialize;

use super::{file_type, fresh_name, lstat_at, open_at};

mod hidden;

mod pointer;
use pointer::pointer_leads_into;

/// The worktree's git dir as the run found it: what the check compares with (kept in the run
/// journal too, for a run whose supervisor was killed: [`crate::aftercare::journal`]).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct GitDirAtStart {
    gitdir: PathBuf,
    common: PathBuf,
    /// The worktree (where gitlinks are checked out), if its `.git` pointer is known.
    worktree: Option<PathBuf>,
    config_worktree: Option<Vec<u8>>,
    /// Not kept in the journal (an index can be megabytes, written on every run): a killed
    /// run's audit, done at the next start, then reports every skip-worktree, assume-unchanged
    /// and gitlink entry as the run's, and still sets planted gitlinks aside.
    #[serde(skip)]
    index: Option<Vec<u8>>,
    /// A main worktree: its git dir is the common dir, where only the names git keeps per
    /// worktree are judged (the rest — objects, refs, packed-refs, modules, what other tools
    /// keep there — is the repository's, left alone).
    main: bool,
}

/// One thing the check moved out of git's sight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SetAside {
    pub path: PathBuf,
    /// "(symlink to …)", "(directory)", "(regular file)", …
    pub found: String,
    pub why: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moved_to: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl std::fmt::Display for SetAside {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "git: the run left {} {} — {}; ",
            self.path.display(),
            self.found,
            self.why
        )?;
        match (&self.moved_to, &self.error) {
            (Some(to), _) => write!(f, "set aside as {} (no git reads it)", to.display()),
            (None, e) => write!(
                f,
                "could NOT set it aside ({}): remove it before running git here",
                e.as_deref().unwrap_or("unknown error")
            ),
        }
    }
}

/// What the check did after a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GitDirReport {
    pub set_aside: Vec<SetAside>,
    /// Index bits and gitlinks the run added (kept, but the user should know).
    pub notes: Vec<String>,
}

impl GitDirReport {
    pub fn warnings(&self) -> Vec<String> {
        self.set_aside
            .iter()
            .map(ToString::to_string)
            .chain(self.notes.iter().cloned())
            .collect()
    }
}

pub(super) fn open_dir(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)
}

pub(super) fn open_subdir(dir: &File, name: &OsStr) -> io::Result<File> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW;
    open_at(dir, name, flags, Mode::empty())
}

/// Reads the whole regular file at `name` (no link followed, no FIFO waited on); a file
/// longer than `limit` is an error, never read in part.
pub(super) fn read_at(dir: &File, name: &OsStr, limit: u64) -> io::Result<Vec<u8>> {
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK;
    let file = open_at(dir, name, flags, Mode::empty())?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::other(format!(
            "longer than the {limit} bytes the check reads whole (set aside, not read in part)"
        )));
    }
    Ok(bytes)
}

/// The names in `dir` (without `.` and `..`), listed through its descriptor's name.
pub(super) fn names(dir: &File) -> Vec<OsString> {
    std::fs::read_dir(fd_path(dir))
        .map(|listing| listing.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default()
}

pub(super) fn describe(st: &FileStat) -> String {
    match file_type(st) {
        SFlag::S_IFLNK => "(a symbolic link)".into(),
        SFlag::S_IFDIR => "(a directory)".into(),
        SFlag::S_IFREG if st.st_nlink > 1 => "(a regular file with another hard link)".into(),
        SFlag::S_IFREG => "(a regular file)".into(),
        _ => "(not a regular file)".into(),
    }
}

/// A regular file with no other name: what git may read and write in place.
pub(super) fn plain_file(st: &FileStat) -> bool {
    file_type(st) == SFlag::S_IFREG && st.st_nlink == 1
}

impl GitDirAtStart {
    /// What the worktree's own git dir holds before the run: a linked worktree's, or a main
    /// worktree's per-worktree files in the common dir.
    pub fn read(layout: &GitLayout) -> Option<Self> {
        let dir = open_dir(&layout.worktree_gitdir).ok()?;
        let read = |name: &str| read_at(&dir, OsStr::new(name), u64::MAX).ok();
        let worktree = if layout.is_linked {
            layout
                .pointers
                .iter()
                .find(|p| p.path.file_name() == Some(OsStr::new(".git")))
                .and_then(|p| p.path.parent())
                .map(Path::to_path_buf)
        } else {
            // `<worktree>/.git`, unless the repository is bare (no worktree, no gitlinks).
            (layout.common_dir.file_name() == Some(OsStr::new(".git")))
                .then(|| layout.common_dir.parent().map(Path::to_path_buf))
                .flatten()
        };
        Some(GitDirAtStart {
            gitdir: layout.worktree_gitdir.clone(),
            common: layout.common_dir.clone(),
            worktree,
            config_worktree: read("config.worktree"),
            index: read("index"),
            main: !layout.is_linked,
        })
    }
}

struct Audit<'a> {
    start: &'a GitDirAtStart,
    top: File,
    report: GitDirReport,
}

impl Audit<'_> {
    /// Moves `name` of `dir` (at `rel` under the git dir) to the top of the git dir under a
    /// fresh name, and reports it.
    fn set_aside(&mut self, dir: &File, name: &OsStr, rel: &Path, found: String, why: String) {
        let flat = rel.to_string_lossy().replace('/', "_");
        let mut entry = SetAside {
            path: self.start.gitdir.join(rel),
            found,
            why,
            moved_to: None,
            error: None,
        };
        let moved = fresh_name("", OsStr::new(&flat), "sandbox-set-aside").and_then(|aside| {
            renameat(
                Some(dir.as_raw_fd()),
                name,
                Some(self.top.as_raw_fd()),
                aside.as_os_str(),
            )
            .map_err(io::Error::from)
            .map(|()| aside)
        });
        match moved {
            Ok(aside) => entry.moved_to = Some(self.start.gitdir.join(aside)),
            Err(e) => entry.error = Some(e.to_string()),
        }
        self.report.set_aside.push(entry);
    }

    /// The first thing in the tree `dir` (at `rel`) that is neither a directory nor a plain
    /// file, or that `content` objects to.
    fn tree_problem(
        &self,
        dir: &File,
        rel: &Path,
        content: &dyn Fn(&Path, &[u8]) -> Option<String>,
    ) -> Option<String> {
        for name in names(dir) {
            let path = rel.join(&name);
            let Ok(Some(st)) = lstat_at(dir, &name) else {
                continue;
            };
            if file_type(&st) == SFlag::S_IFDIR {
                let problem = match open_subdir(dir, &name) {
                    Ok(sub) => self.tree_problem(&sub, &path, content),
                    Err(e) => Some(format!("{} cannot be opened: {e}", path.display())),
                };
                if problem.is_some() {
                    return problem;
                }
            } else if !plain_file(&st) {
                return Some(format!(
                    "{} is {}, which git would follow or block on",
                    path.display(),
                    describe(&st)
                ));
            } else {
                let bytes = match read_at(dir, &name, MAX_STATE_FILE) {
                    Ok(bytes) => bytes,
                    Err(e) => return Some(format!("{} cannot be read: {e}", path.display())),
                };
                if let Some(problem) = content(&path, &bytes) {
                    return Some(problem);
                }
            }
        }
        None
    }

    /// `refs/`, `logs/`, `info/`: each entry that is not a directory or a plain file is set
    /// aside on its own (git reads the rest as reflogs and patterns: data); under `refs/` (the
    /// per-worktree refs: `refs/bisect/`, `refs/worktree/`, `refs/rewritten/`) each file must
    /// be an object id as git writes it — a `ref: …` there is followed by the next update.
    fn sweep_tree(&mut self, dir: &File, rel: &Path) {
        let refs = rel.starts_with("refs");
        for name in names(dir) {
            let path = rel.join(&name);
            let Ok(Some(st)) = lstat_at(dir, &name) else {
                continue;
            };
            if file_type(&st) == SFlag::S_IFDIR {
                if let Ok(sub) = open_subdir(dir, &name) {
                    self.sweep_tree(&sub, &path);
                }
            } else if !plain_file(&st) {
                let why = "git would follow it, or block on it".to_string();
                self.set_aside(dir, &name, &path, describe(&st), why);
            } else if refs {
                let ok =
                    read_at(dir, &name, 4096).is_ok_and(|bytes| gitformats::object_id_file(&bytes));
                if !ok {
                    let why = "a per-worktree ref that is not an object id as git writes it \
                               (git follows a `ref: …` there when it next updates it)"
                        .to_string();
                    self.set_aside(dir, &name, &path, describe(&st), why);
                }
            }
        }
    }

    fn top_entry(&mut self, name: &OsStr, may_own: &dyn Fn(&str) -> bool) {
        let rel = PathBuf::from(name);
        let Ok(Some(st)) = lstat_at(&self.top, name) else {
            return;
        };
        let top = match self.top.try_clone() {
            Ok(top) => top,
            Err(_) => return,
        };
        let kind = name.to_str().map_or(Kept::Unknown, classify);
        // In a main worktree's git dir (the common dir) only what git keeps per worktree.
        if self.start.main && matches!(kind, Kept::Unknown | Kept::Tree | Kept::SetAside) {
            return;
        }
        // `gitdir`, `commondir` and `locked` in a main git dir are pointers (git reads
        // `commondir` in any git dir): recorded before the run and restored, or moved aside,
        // by `check_and_restore` (`GitLayout::absent_pointers`), not judged here.
        if self.start.main && matches!(name.to_str(), Some("gitdir" | "commondir" | "locked")) {
            return;
        }
        let is_dir = file_type(&st) == SFlag::S_IFDIR;
        let problem = match kind {
            Kept::SetAside => None,
            Kept::Data | Kept::Index if !plain_file(&st) => {
                Some("git would follow it (or block on it) on the host".to_string())
            }
            Kept::Data => name.to_str().and_then(|n| {
                let bytes = read_at(&self.top, name, MAX_STATE_FILE);
                let ok = match &bytes {
                    Ok(bytes) => gitformats::pseudoref(n, bytes)?,
                    Err(_) => false,
                };
                (!ok).then(|| match bytes {
                    Err(e) => format!("it cannot be read whole: {e}"),
                    Ok(_) => "not object ids as git writes this ref; git's next reset, merge \
                              or pull would follow a `ref: …` there and move that branch"
                        .to_string(),
                })
            }),
            Kept::Index => None,
            Kept::ConfigWorktree => {
                let same = plain_file(&st)
                    && read_at(&self.top, name, u64::MAX).ok() == self.start.config_worktree;
                (!same).then(|| {
                    if self.start.config_worktree.is_some() {
                        "config.worktree changed during the run; git reads its settings \
                         (core.fsmonitor, core.hooksPath) once extensions.worktreeConfig is on"
                    } else {
                        "config.worktree was not there before the run; git reads its settings \
                         (core.fsmonitor, core.hooksPath) once extensions.worktreeConfig is on \
                         (`git sparse-checkout` turns it on)"
                    }
                    .to_string()
                })
            }
            Kept::Tree if is_dir => {
                if let Ok(sub) = open_subdir(&top, name) {
                    self.sweep_tree(&sub, &rel);
                }
                None
            }
            Kept::Sequencer if is_dir => match open_subdir(&top, name) {
                Ok(sub) => {
                    let state = name.to_string_lossy().into_owned();
                    self.tree_problem(&sub, &rel, &|path, bytes| {
                        let file = path.file_name()?.to_str()?;
                        let in_top = path.parent() == Some(Path::new(&state));
                        in_top
                            .then(|| sequencer_problem(&state, file, bytes, may_own))
                            .flatten()
                    })
                }
                Err(e) => Some(format!("it cannot be opened: {e}")),
            },
            Kept::Tree | Kept::Sequencer => {
                Some("git expects a directory there and would follow it".into())
            }
            Kept::Unknown => {
                Some("nothing git keeps here that the host can trust (only HEAD, index, refs, logs and git's own state files are taken back)".into())
            }
        };
        if let Some(why) = problem {
            self.set_aside(&top, name, &rel, describe(&st), why);
        }
    }

    /// The index: new skip-worktree and assume-unchanged bits and new gitlinks are reported;
    /// a gitlink whose `.git` is not a pointer into `<common>/modules` is set aside.
    fn index(&mut self) {
        let Ok(file) = open_at(
            &self.top,
            OsStr::new("index"),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK,
            Mode::empty(),
        ) else {
            return;
        };
        let mut bytes = Vec::new();
        if !file.metadata().is_ok_and(|m| m.is_file()) || (&file).read_to_end(&mut bytes).is_err() {
            return;
        }
        let changed = self.start.index.as_deref() != Some(&bytes[..]);
        if !changed && !may_hold_gitlinks(&bytes) {
            return;
        }
        let now = match IndexSummary::read(&fd_path(&file)) {
            Ok(summary) => summary,
            Err(e) => {
                self.report.notes.push(format!(
                    "git: the index {} cannot be read ({}); check `git status` before trusting it",
                    self.start.gitdir.join("index").display(),
                    e.message()
                ));
                return;
            }
        };
        if changed {
            let before = self
                .start
                .index
                .as_deref()
                .and_then(|bytes| summary_of(bytes).ok())
                .unwrap_or_default();
            let lines = hidden::clear_new_bits(self.start, &now, &before);
            self.report.notes.extend(lines);
        }
        for path in &now.gitlinks {
            self.gitlink(path);
        }
    }

    fn gitlink(&mut self, path: &str) {
        let Some(worktree) = self.start.worktree.clone() else {
            return;
        };
        let dir = match open_beneath(&worktree, path) {
            Ok(dir) => dir,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return,
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => return,
            Err(e) => {
                self.report.notes.push(format!(
                    "git: the submodule {path} cannot be checked ({e}: a symbolic link in its \
                     path?); look at {} before running git in this worktree",
                    worktree.join(path).display()
                ));
                return;
            }
        };
        let git = OsStr::new(".git");
        let Ok(Some(st)) = lstat_at(&dir, git) else {
            return;
        };
        let why = if plain_file(&st) {
            let bytes = read_at(&dir, git, 4096).unwrap_or_default();
            if pointer_leads_into(&dir, &bytes, &self.start.common.join("modules")) {
                return;
            }
            format!(
                "its .git reads {:?}, which is not git's relative pointer resolving, with no \
                 link, to a directory beneath {}: a repository there could run its \
                 core.fsmonitor or hooks on the host's git status",
                String::from_utf8_lossy(&bytes),
                self.start.common.join("modules").display()
            )
        } else {
            "a submodule's .git that is not a pointer into the repository's modules/: the \
             host's git status would run its core.fsmonitor or hooks"
                .into()
        };
        let mut entry = SetAside {
            path: worktree.join(path).join(".git"),
            found: describe(&st),
            why,
            moved_to: None,
            error: None,
        };
        let moved = fresh_name("", git, "sandbox-set-aside").and_then(|aside| {
            renameat(
                Some(dir.as_raw_fd()),
                git,
                Some(dir.as_raw_fd()),
                aside.as_os_str(),
            )
            .map_err(io::Error::from)
            .map(|()| aside)
        });
        match moved {
            Ok(aside) => entry.moved_to = Some(worktree.join(path).join(aside)),
            Err(e) => entry.error = Some(e.to_string()),
        }
        self.report.set_aside.push(entry);
    }
}

/// A name for an open file that resolves to it whatever happens to its path.
fn fd_path(file: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// The summary of index bytes (through an unnamed temporary file: libgit2 reads a path).
fn summary_of(bytes: &[u8]) -> io::Result<IndexSummary> {
    use std::io::Write;
    let mut file = tempfile::tempfile()?;
    file.write_all(bytes)?;
    IndexSummary::read(&fd_path(&file)).map_err(|e| io::Error::other(e.message().to_string()))
}

/// Opens directory `rel` beneath `root` with no symbolic link in any component.
#[cfg(not(target_os = "linux"))]
fn open_beneath(root: &Path, rel: &str) -> io::Result<File> {
    // No openat2 here: one component at a time, each opened without following a link.
    let mut dir = open_dir(root)?;
    for part in Path::new(rel).components() {
        match part {
            std::path::Component::Normal(name) => dir = open_subdir(&dir, name)?,
            std::path::Component::CurDir => {}
            _ => return Err(io::Error::other("a path that leaves the worktree")),
        }
    }
    Ok(dir)
}

/// [`open_beneath`] on Linux, in one call.
#[cfg(target_os = "linux")]
fn open_beneath(root: &Path, rel: &str) -> io::Result<File> {
    use nix::fcntl::{OpenHow, ResolveFlag};
    let root = open_dir(root)?;
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
    Ok(File::from(crate::sys::openat2(root.as_raw_fd(), rel, how)?))
}

/// Checks the worktree's git dir after the run (once every process of it is gone) and sets
/// aside what the host cannot trust. `may_own(ref)`: whether a stopped rebase may move that
/// ref when the user continues it.
pub fn audit_gitdir(start: &GitDirAtStart, may_own: &dyn Fn(&str) -> bool) -> GitDirReport {
    let top = match open_dir(&start.gitdir) {
        Ok(top) => top,
        Err(e) => {
            return GitDirReport {
                set_aside: Vec::new(),
                notes: vec![format!(
                    "git: the worktree's git dir {} cannot be opened after the run ({e}); do \
                     not run git in this worktree before looking at it",
                    start.gitdir.display()
                )],
            }
        }
    };
    let mut audit = Audit {
        start,
        top,
        report: GitDirReport::default(),
    };
    let mut entries = names(&audit.top);
    entries.sort();
    for name in entries {
        audit.top_entry(&name, may_own);
    }
    audit.index();
    audit.report
}

#[cfg(test)]
mod tests;
