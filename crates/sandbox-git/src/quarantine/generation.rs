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
//!
//! A daemon that dies mid-period (SIGKILL, a crash) cannot read its generation back. So
//! before a generation is laid out, the host writes a record of it beside the box's git
//! directories (`<root>/records/<name>.json`, never mounted in the box): the repository, the
//! worktree, every ref as the generation starts with it, `HEAD` and the index's identity. The
//! record stays locked (`flock`) by the daemon for the period; the kernel drops the lock when
//! the daemon dies, however it dies. The next daemon's [`recover`] reads back every generation
//! whose record is unlocked as [`Generation::end`] would have — objects by content, refs
//! judged against the recorded start, `HEAD` when allowed, the index only if the worktree's is
//! still the one the generation copied — reports it, and removes it and its record. A
//! generation with no record (laid out by an older version) is reported and removed unread.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use git2::Oid;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use super::error::{io, QuarantineError};
use super::report::StoreReport;
use super::{refs, StoreQuarantine};

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

    /// The host's records of the generations in use: never in the box.
    fn records_dir(&self) -> PathBuf {
        self.root.join("records")
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
    /// The generation's record, locked while this daemon lives; removed once it is read back.
    record: Held,
}

/// A generation's record file, locked (`flock`) by the process that holds this value.
#[derive(Debug)]
struct Held {
    path: PathBuf,
    _lock: Flock<std::fs::File>,
}

/// What the host needs to read a generation back without the daemon that laid it out.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    version: u32,
    /// The daemon whose period it was (for the report).
    pid: u32,
    common: PathBuf,
    worktree_gitdir: PathBuf,
    name: String,
    /// The worktree's `HEAD` at the start.
    head: String,
    /// The worktree's index as the generation copied it.
    index: Option<FileStamp>,
    /// Every ref at the start, with its direct target (`None`: a symbolic ref).
    start: BTreeMap<String, Option<String>>,
    /// Where the worktree's task record is kept and may be found.
    record_dirs: Vec<PathBuf>,
    /// The quarantine's scratch space.
    scratch: PathBuf,
}

/// A file's identity and last change: the index is taken back from a dead daemon's generation
/// only while the worktree's own is unchanged since (else a stale copy would replace it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

impl FileStamp {
    fn of(path: &Path) -> Option<FileStamp> {
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
fn write_record(path: &Path, record: &Record) -> Result<Held, QuarantineError> {
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
        let head = std::fs::read_to_string(git.worktree_gitdir.join("HEAD")).unwrap_or_default();
        // Recorded before the generation exists, so that every generation a dead daemon
        // leaves has its record.
        let record = write_record(
            &git.records_dir().join(format!("{name}.json")),
            &Record {
                version: 1,
                pid: std::process::id(),
                common: git.common.clone(),
                worktree_gitdir: git.worktree_gitdir.clone(),
                name: name.clone(),
                head: head.clone(),
                index: FileStamp::of(&git.worktree_gitdir.join("index")),
                start: quarantine
                    .refs_at_start()
                    .iter()
                    .map(|(n, oid)| (n.clone(), oid.map(|o| o.to_string())))
                    .collect(),
                record_dirs: record_dirs.iter().map(|d| d.to_path_buf()).collect(),
                scratch: parent.to_path_buf(),
            },
        )?;
        let staged = git.collect_dir().join(&name);
        let placed = git.writable().join(&name);
        let laid = lay_out(git, &staged).and_then(|()| {
            std::fs::rename(&staged, &placed).map_err(io("placing the generation at", &placed))
        });
        if let Err(e) = laid.and_then(|()| point_current(git, &name)) {
            remove(&staged);
            remove(&placed);
            let _ = std::fs::remove_file(&record.path);
            return Err(e);
        }
        Ok(Generation {
            git: git.clone(),
            name,
            quarantine,
            head,
            record,
        })
    }

    /// The generation's directory in the box.
    pub fn dir(&self) -> PathBuf {
        self.git.writable().join(&self.name)
    }

    /// Ends the busy period: the generation moved out of the box's reach, read back by the
    /// quarantine, `HEAD` and the index taken when allowed, and removed.
    pub fn end(self) -> GenerationEnd {
        let Generation {
            git,
            name,
            quarantine,
            head,
            record,
        } = self;
        let end = read_back(
            &git,
            &name,
            &git.writable().join(&name),
            quarantine,
            &head,
            true,
        );
        // Read back (or refused): nothing is left for a next daemon to do.
        let _ = std::fs::remove_file(&record.path);
        end
    }
}

/// The end of a period, whoever ends it: generation `name` at `from` (in the box's reach, or
/// already in the collect dir) moved out of the box's reach, read back by `quarantine`, `HEAD`
/// and (when `take_the_index`) the index taken when allowed, and removed.
fn read_back(
    git: &BoxGit,
    name: &str,
    from: &Path,
    mut quarantine: StoreQuarantine,
    head: &str,
    take_the_index: bool,
) -> GenerationEnd {
    let mut notes = Vec::new();
    let moved = git.collect_dir().join(name);
    if from != moved {
        if let Err(e) = std::fs::rename(from, &moved) {
            return GenerationEnd {
                store: Err(io("moving the box's git generation out of its reach", from)(e)),
                notes,
            };
        }
    }
    let is_dir = moved.symlink_metadata().is_ok_and(|m| m.is_dir());
    if !is_dir {
        remove(&moved);
        return GenerationEnd {
            store: Err(QuarantineError::Io {
                what: "refusing the box's git generation: it was replaced by something that is \
                       not a directory (nothing of it is taken)",
                path: from.to_path_buf(),
                source: std::io::Error::other("not a directory"),
            }),
            notes,
        };
    }
    let store = quarantine
        .attach_copy(&moved)
        .and_then(|()| quarantine.sync(true))
        .map(|()| quarantine.report());
    // Read through the held directory from here on: a link or rename is of no use.
    let held = quarantine.upper().to_path_buf();
    let admin = held.join("worktrees").join(git.worktree_name());
    if let Ok(report) = &store {
        if let Some(line) = take_head(git, &held, &admin, head, report) {
            notes.push(line);
        }
    }
    if take_the_index {
        if let Some(line) = take_index(git, &held, &admin) {
            notes.push(line);
        }
    } else {
        notes.push(format!(
            "git: the worktree's index changed after the box's period began; it keeps its own \
             (the box's is discarded): {}",
            git.worktree_gitdir.join("index").display()
        ));
    }
    remove(&moved);
    GenerationEnd { store, notes }
}

/// A generation a dead daemon left, as the next one dealt with it.
#[derive(Debug)]
pub struct Recovered {
    /// The box's git directory (`<boxes>/<box name>`) and the generation's name.
    pub root: PathBuf,
    pub name: String,
    /// The daemon whose period it was, when its record says.
    pub pid: Option<u32>,
    /// What was read back; `Err` when nothing was taken (no record, a record that cannot be
    /// read, a repository that is gone).
    pub end: GenerationEnd,
}

impl Recovered {
    /// What to tell the user, one line each.
    pub fn lines(&self) -> Vec<String> {
        let whose = self
            .pid
            .map(|p| format!("daemon {p}"))
            .unwrap_or_else(|| "an earlier daemon".into());
        let mut lines = vec![match &self.end.store {
            Ok(report) => format!(
                "git: box generation {} in {} was left by {whose}, which died mid-period; taken \
                 in now: {} ref update(s) applied, {} refused",
                self.name,
                self.root.display(),
                report.applied.len(),
                report.refused.len()
            ),
            Err(e) => format!(
                "git: box generation {} in {} was left by {whose}, which died mid-period; \
                 nothing of it was taken ({e}); it was removed",
                self.name,
                self.root.display()
            ),
        }];
        if let Ok(report) = &self.end.store {
            lines.extend(report.applied.iter().map(|a| {
                format!(
                    "git: applied {} {} -> {}",
                    a.name,
                    a.old.as_deref().unwrap_or("(none)"),
                    a.new.as_deref().unwrap_or("(deleted)")
                )
            }));
            lines.extend(report.warnings());
        }
        lines.extend(self.end.notes.iter().cloned());
        lines
    }
}

/// Reads back every generation under `boxes` (the boxes' git directories,
/// `<boxes>/<box name>/`) whose daemon died mid-period, as [`Generation::end`] would have, and
/// removes it; a generation whose record is still locked belongs to a live daemon and is left
/// alone. Generations without a record are removed unread. Returns what was done, for the
/// log.
pub fn recover(boxes: &Path) -> Vec<Recovered> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(boxes) else {
        return out;
    };
    let mut roots: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    roots.sort();
    for root in roots {
        recover_box(&root, &mut out);
    }
    out
}

fn recover_box(root: &Path, out: &mut Vec<Recovered>) {
    let records = root.join("records");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&records)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    // The generations a live daemon holds: never touched.
    let mut live: Vec<String> = Vec::new();
    for path in names {
        let name = path
            .file_stem()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Ok(file) = std::fs::File::open(&path) else {
            continue;
        };
        let Ok(_lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
            live.push(name);
            continue;
        };
        let record: Option<Record> = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .filter(|r: &Record| r.version == 1 && r.name == name);
        let end = match &record {
            Some(record) => resume(root, record),
            None => {
                for dir in ["git", "collect"] {
                    remove(&root.join(dir).join(&name));
                }
                GenerationEnd {
                    store: Err(QuarantineError::Io {
                        what: "reading the generation's record (cut short, or not of this \
                               version)",
                        path: path.clone(),
                        source: std::io::Error::other("unreadable record"),
                    }),
                    notes: Vec::new(),
                }
            }
        };
        let _ = std::fs::remove_file(&path);
        out.push(Recovered {
            root: root.to_path_buf(),
            name,
            pid: record.map(|r| r.pid),
            end,
        });
    }
    // Generations no record names (an older version's): nothing says what they started from.
    for dir in ["git", "collect"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("gen-") || live.contains(&name) {
                continue;
            }
            remove(&entry.path());
            out.push(Recovered {
                root: root.to_path_buf(),
                name,
                pid: None,
                end: GenerationEnd {
                    store: Err(QuarantineError::Io {
                        what: "finding the generation's record (it has none: laid out by an \
                               older version)",
                        path: root.join("records"),
                        source: std::io::Error::other("no record"),
                    }),
                    notes: Vec::new(),
                },
            });
        }
    }
}

/// One dead daemon's generation, read back from its record.
fn resume(root: &Path, record: &Record) -> GenerationEnd {
    let git = BoxGit {
        common: record.common.clone(),
        worktree_gitdir: record.worktree_gitdir.clone(),
        root: root.to_path_buf(),
    };
    let placed = git.writable().join(&record.name);
    let staged = git.collect_dir().join(&record.name);
    let from = if placed.symlink_metadata().is_ok() {
        placed
    } else {
        staged
    };
    let failed = |store| GenerationEnd {
        store: Err(store),
        notes: Vec::new(),
    };
    if from.symlink_metadata().is_err() {
        // Its daemon died before laying it out, or after reading it back.
        return failed(QuarantineError::Io {
            what: "finding the generation (nothing to take)",
            path: from,
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        });
    }
    let mut start = HashMap::new();
    for (name, oid) in &record.start {
        let oid = match oid.as_deref().map(Oid::from_str).transpose() {
            Ok(oid) => oid,
            Err(source) => {
                remove(&from);
                return failed(QuarantineError::Git {
                    what: "reading the generation's record",
                    source,
                });
            }
        };
        start.insert(name.clone(), oid);
    }
    let record_dirs: Vec<&Path> = record.record_dirs.iter().map(PathBuf::as_path).collect();
    let quarantine = match StoreQuarantine::resume_copy(
        &record.common,
        &record.worktree_gitdir,
        &record_dirs,
        &record.scratch,
        start,
    ) {
        Ok(q) => q,
        Err(e) => {
            remove(&from);
            return failed(e);
        }
    };
    let index_unchanged = FileStamp::of(&record.worktree_gitdir.join("index")) == record.index;
    read_back(
        &git,
        &record.name,
        &from,
        quarantine,
        &record.head,
        index_unchanged,
    )
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

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_testkit::git;

    /// A generation whose record is locked — its daemon lives — is never touched by
    /// [`recover`]; once the lock is gone (the daemon died: here the value is dropped without
    /// its end, which closes the locked descriptor as the kernel does for a dead process) it
    /// is read back against the start it recorded: the task branch moves, a stale index is not
    /// taken over a worktree index changed since, and the generation and its record go.
    #[test]
    fn only_a_dead_daemons_generation_is_recovered() {
        let t = tempfile::tempdir().unwrap();
        let main = t.path().join("main");
        let task = t.path().join("task");
        sandbox_testkit::linked_worktree(&main, &task);
        let common = main.join(".git").canonicalize().unwrap();
        let boxes = t.path().join("boxes");
        std::fs::create_dir(&boxes).unwrap();
        let box_git =
            BoxGit::new(&common, &common.join("worktrees/task"), &boxes.join("b")).unwrap();
        let records = t.path().join("records");
        let generation =
            Generation::begin(&box_git, &[&records], &t.path().join("scratch")).unwrap();
        let gitdir = generation.dir().join("worktrees/task");
        let out = sandbox_testkit::git_command(&task)
            .env("GIT_DIR", &gitdir)
            .env("GIT_WORK_TREE", &task)
            .args(["commit", "-q", "--allow-empty", "-m", "in the box"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let before = git(&main, &["rev-parse", "task"]);

        assert!(recover(&boxes).is_empty(), "a live daemon's generation");
        assert!(generation.dir().is_dir());

        let dir = generation.dir();
        drop(generation);
        // The worktree's index changes after the period began: the box's copy is stale.
        std::fs::write(common.join("worktrees/task/index"), b"not the box's").unwrap();
        let recovered = recover(&boxes);
        assert_eq!(recovered.len(), 1, "{recovered:?}");
        let report = recovered[0].end.store.as_ref().unwrap();
        assert_eq!(report.applied.len(), 1, "{report:?}");
        assert_ne!(git(&main, &["rev-parse", "task"]), before);
        assert_eq!(
            std::fs::read(common.join("worktrees/task/index")).unwrap(),
            b"not the box's"
        );
        let lines = recovered[0].lines().join("\n");
        assert!(
            lines.contains("died mid-period") && lines.contains("index changed"),
            "{lines}"
        );
        assert!(!dir.exists());
        assert!(std::fs::read_dir(box_git.records_dir())
            .unwrap()
            .next()
            .is_none());
        assert!(recover(&boxes).is_empty(), "nothing is read back twice");
    }
}
