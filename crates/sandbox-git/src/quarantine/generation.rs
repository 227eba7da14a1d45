//! Commits from a box (a VM guest): per busy period a private *generation* of the common dir
//! that the guest writes, read back by the host's quarantine when the period ends.
//!
//! A guest cannot stack the native backend's overlay on the common dir, so the host lays out
//! a copy instead ([`Generation::begin`]): refs and `packed-refs` copied, the objects
//! borrowed from the repository through `objects/info/alternates` (read-only in the box),
//! `hooks` and `info` as links into the read-only common dir, `config` and `HEAD` copied, and
//! the worktree's admin dir (`worktrees/<name>`, with a copy of the index). It is renamed into
//! the box's writable directory as `gen-<random>`, and the `current` link there points at it;
//! inside the box the worktree's `.git` is a read-only file saying
//! `gitdir: <writable>/current/worktrees/<name>` ([`BoxGit::pointer`]).
//!
//! When the period ends ([`Generation::end`]) the generation is renamed out of the guest's
//! reach (and refused unless it is still a directory), held by a descriptor, and read back
//! as the native quarantine reads its layer: objects taken in by content, refs judged (the
//! task branch moves, other refs stay), `HEAD` by [`super::refs::head_allowed`], the index
//! copied back; then it is removed. Nothing else the guest wrote there — a hook, a config, a
//! link — is ever read by the host.

use std::path::{Path, PathBuf};

use super::{io, refs, QuarantineError, StoreQuarantine, StoreReport};

/// The largest index taken back from a box.
const INDEX_LIMIT: u64 = 1 << 30;

/// Where one box's git data lives on the host, under its own directory `root`.
#[derive(Debug, Clone)]
pub struct BoxGit {
    /// The repository's common dir.
    pub common: PathBuf,
    /// The linked worktree's own git dir on the host (`<common>/worktrees/<name>`).
    pub worktree_gitdir: PathBuf,
    root: PathBuf,
}

impl BoxGit {
    /// The box's git directories under `root` (created, mode 0700): `git/` is mounted
    /// writable in the box at its own path, `collect/` never is, `pointer` is the file mounted
    /// read-only over the worktree's `.git`.
    pub fn new(
        common: &Path,
        worktree_gitdir: &Path,
        root: &Path,
    ) -> Result<Self, QuarantineError> {
        use std::os::unix::fs::DirBuilderExt;
        let git = BoxGit {
            common: common.to_path_buf(),
            worktree_gitdir: worktree_gitdir.to_path_buf(),
            root: root.to_path_buf(),
        };
        for dir in [root.to_path_buf(), git.writable(), git.collect_dir()] {
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io("creating", &dir)(e)),
            }
            if !dir.symlink_metadata().is_ok_and(|m| m.is_dir()) {
                return Err(QuarantineError::Io {
                    what: "refusing a box git directory that is not a directory",
                    path: dir,
                    source: std::io::Error::other("not a directory"),
                });
            }
        }
        let pointer = git.pointer();
        std::fs::write(&pointer, git.pointer_text()).map_err(io("writing", &pointer))?;
        Ok(git)
    }

    /// Mounted writable in the box, at its own path: `current` and the generations.
    pub fn writable(&self) -> PathBuf {
        self.root.join("git")
    }

    /// Where a generation is moved to be read back: never in the box.
    fn collect_dir(&self) -> PathBuf {
        self.root.join("collect")
    }

    /// The file mounted read-only over the worktree's `.git` in the box.
    pub fn pointer(&self) -> PathBuf {
        self.root.join("pointer")
    }

    fn worktree_name(&self) -> String {
        self.worktree_gitdir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// What the box's `.git` says: the current generation's admin dir of the worktree.
    pub fn pointer_text(&self) -> String {
        format!(
            "gitdir: {}\n",
            self.writable()
                .join("current/worktrees")
                .join(self.worktree_name())
                .display()
        )
    }
}

/// One busy period's generation, laid out and linked as `current`.
#[derive(Debug)]
pub struct Generation {
    git: BoxGit,
    name: String,
    quarantine: StoreQuarantine,
    /// The worktree's `HEAD` as the generation started with it.
    head: String,
}

/// What the end of a busy period did.
#[derive(Debug)]
pub struct GenerationEnd {
    /// The quarantine's report (what it applied and refused), or why nothing was read back.
    pub store: Result<StoreReport, QuarantineError>,
    /// The worktree's `HEAD`, index and the generation itself: one line per thing refused.
    pub notes: Vec<String>,
}

impl Generation {
    /// Lays out a new generation of `git`'s common dir privately, renames it into the box's
    /// writable dir and points `current` at it. The task branch is decided as a native run's
    /// is (the worktree's record in `record_dirs`); scratch space lies under `parent`.
    pub fn begin(
        git: &BoxGit,
        record_dirs: &[&Path],
        parent: &Path,
    ) -> Result<Generation, QuarantineError> {
        let quarantine =
            StoreQuarantine::prepare_copy(&git.common, &git.worktree_gitdir, record_dirs, parent)?;
        let name = format!("gen-{}", random_suffix());
        let staged = git.collect_dir().join(&name);
        lay_out(git, &staged)?;
        let placed = git.writable().join(&name);
        std::fs::rename(&staged, &placed).map_err(io("placing the generation at", &placed))?;
        point_current(git, &name)?;
        let head = std::fs::read_to_string(git.worktree_gitdir.join("HEAD")).unwrap_or_default();
        Ok(Generation {
            git: git.clone(),
            name,
            quarantine,
            head,
        })
    }

    /// The generation's directory in the box.
    pub fn dir(&self) -> PathBuf {
        self.git.writable().join(&self.name)
    }

    /// Ends the busy period: the generation moved out of the box's reach, read back by the
    /// quarantine, `HEAD` and the index taken when allowed, and removed.
    pub fn end(mut self) -> GenerationEnd {
        let mut notes = Vec::new();
        let moved = self.git.collect_dir().join(&self.name);
        if let Err(e) = std::fs::rename(self.dir(), &moved) {
            return GenerationEnd {
                store: Err(io(
                    "moving the box's git generation out of its reach",
                    &self.dir(),
                )(e)),
                notes,
            };
        }
        let is_dir = moved.symlink_metadata().is_ok_and(|m| m.is_dir());
        if !is_dir {
            remove(&moved);
            return GenerationEnd {
                store: Err(QuarantineError::Io {
                    what: "refusing the box's git generation: it was replaced by something \
                           that is not a directory (nothing of it is taken)",
                    path: self.dir(),
                    source: std::io::Error::other("not a directory"),
                }),
                notes,
            };
        }
        let store = self
            .quarantine
            .attach_copy(&moved)
            .and_then(|()| self.quarantine.sync(true))
            .map(|()| self.quarantine.report());
        // Read through the held directory from here on: a link or rename is of no use.
        let held = self.quarantine.upper().to_path_buf();
        let admin = held.join("worktrees").join(self.git.worktree_name());
        if let Ok(report) = &store {
            if let Some(line) = take_head(&self.git, &held, &admin, &self.head, report) {
                notes.push(line);
            }
        }
        if let Some(line) = take_index(&self.git, &held, &admin) {
            notes.push(line);
        }
        remove(&moved);
        GenerationEnd { store, notes }
    }
}

/// `HEAD` as the box left it, taken when [`refs::head_allowed`] allows it; a line when not.
fn take_head(
    git: &BoxGit,
    held: &Path,
    admin: &Path,
    at_start: &str,
    report: &StoreReport,
) -> Option<String> {
    let found = match refs::read_untrusted(held, &admin.join("HEAD"), 256) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => {
            return Some(format!(
                "git: the box's HEAD could not be read ({e}); the worktree keeps its own"
            ))
        }
    };
    if found.trim_end() == at_start.trim_end() {
        return None;
    }
    let created: Vec<&str> = report.owned.iter().map(String::as_str).collect();
    let allowed = refs::head_allowed(&found, report.task_branch.as_deref(), &created, |name| {
        refs::ref_exists(&git.common, name)
    });
    if !allowed {
        return Some(format!(
            "git: the box set HEAD to {:?}, a branch this task does not own; the worktree \
             keeps HEAD {:?}",
            found.trim_end(),
            at_start.trim_end()
        ));
    }
    let head = git.worktree_gitdir.join("HEAD");
    match replace(&head, format!("{}\n", found.trim_end()).as_bytes()) {
        Ok(()) => None,
        Err(e) => Some(format!("git: writing HEAD {}: {e}", head.display())),
    }
}

/// The box's index, copied back as bytes (never through a link the box planted).
fn take_index(git: &BoxGit, held: &Path, admin: &Path) -> Option<String> {
    let from = admin.join("index");
    match from.symlink_metadata() {
        Err(_) => return None,
        Ok(meta) if !meta.is_file() => {
            return Some(
                "git: the box's index is not a regular file; the worktree keeps its own".into(),
            )
        }
        Ok(_) => {}
    }
    let bytes = match refs::read_untrusted(held, &from, INDEX_LIMIT) {
        Ok(bytes) => bytes,
        Err(e) => {
            return Some(format!(
                "git: the box's index could not be read ({e}); the worktree keeps its own"
            ))
        }
    };
    let to = git.worktree_gitdir.join("index");
    replace(&to, &bytes)
        .err()
        .map(|e| format!("git: writing the index {}: {e}", to.display()))
}

/// Writes `path` anew (a temporary file renamed over it).
fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

fn remove(path: &Path) {
    let gone = match path.symlink_metadata() {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(_) => Ok(()),
    };
    if let Err(e) = gone {
        tracing::warn!(path = %path.display(), error = %e, "could not remove a box's git generation");
    }
}

fn random_suffix() -> String {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        // Unique enough within one process: the time and the pid.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        return format!("{:x}-{now:x}", std::process::id());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The copy of the common dir a box writes, laid out at `dir` (a private place).
fn lay_out(git: &BoxGit, dir: &Path) -> Result<(), QuarantineError> {
    let common = &git.common;
    let mk = |p: &Path| std::fs::create_dir_all(p).map_err(io("creating", p));
    mk(dir)?;
    for file in ["HEAD", "config", "packed-refs", "shallow"] {
        copy_file(&common.join(file), &dir.join(file))?;
    }
    copy_refs(&common.join("refs"), &dir.join("refs"))?;
    mk(&dir.join("objects/pack"))?;
    mk(&dir.join("logs"))?;
    let alternates = dir.join("objects/info/alternates");
    mk(&dir.join("objects/info"))?;
    std::fs::write(
        &alternates,
        format!("{}\n", common.join("objects").display()),
    )
    .map_err(io("writing", &alternates))?;
    for link in ["hooks", "info"] {
        let at = dir.join(link);
        std::os::unix::fs::symlink(common.join(link), &at).map_err(io("linking", &at))?;
    }
    let admin = dir.join("worktrees").join(git.worktree_name());
    mk(&admin)?;
    for file in ["HEAD", "gitdir", "index", "ORIG_HEAD"] {
        copy_file(&git.worktree_gitdir.join(file), &admin.join(file))?;
    }
    let commondir = admin.join("commondir");
    std::fs::write(
        &commondir,
        format!("{}\n", git.writable().join("current").display()),
    )
    .map_err(io("writing", &commondir))?;
    Ok(())
}

/// Copies a regular file (nothing when it is missing).
fn copy_file(from: &Path, to: &Path) -> Result<(), QuarantineError> {
    match from.symlink_metadata() {
        Ok(meta) if meta.is_file() => {
            std::fs::copy(from, to).map_err(io("copying", from))?;
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Copies the loose refs under `from` (regular files only; no locks, no links).
fn copy_refs(from: &Path, to: &Path) -> Result<(), QuarantineError> {
    std::fs::create_dir_all(to).map_err(io("creating", to))?;
    let Ok(entries) = std::fs::read_dir(from) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let Ok(meta) = src.symlink_metadata() else {
            continue;
        };
        if meta.is_dir() {
            copy_refs(&src, &dst)?;
        } else if meta.is_file() && !src.to_string_lossy().ends_with(".lock") {
            std::fs::copy(&src, &dst).map_err(io("copying", &src))?;
        }
    }
    Ok(())
}

/// Points the box's `current` link at generation `name` (a new link renamed over it; whatever
/// the box left there instead is removed).
fn point_current(git: &BoxGit, name: &str) -> Result<(), QuarantineError> {
    let current = git.writable().join("current");
    let staged = git.writable().join(format!(".current-{}", random_suffix()));
    std::os::unix::fs::symlink(name, &staged).map_err(io("linking", &staged))?;
    if std::fs::rename(&staged, &current).is_err() {
        // A directory the box made in its place.
        remove(&current);
        std::fs::rename(&staged, &current).map_err(io("linking", &current))?;
    }
    Ok(())
}
