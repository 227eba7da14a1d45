//! The end of a period, whoever ends it: the generation moved out of the box's reach, read
//! back by the quarantine, `HEAD` and the index taken when allowed, and removed.

use std::path::Path;

use super::box_git::BoxGit;
use super::files::remove;
use crate::quarantine::error::{io, QuarantineError};
use crate::quarantine::report::StoreReport;
use crate::quarantine::{refs, StoreQuarantine};

/// The largest index taken back from a box.
const INDEX_LIMIT: u64 = 1 << 30;

/// What the end of a busy period did.
#[derive(Debug)]
pub struct GenerationEnd {
    /// The quarantine's report (what it applied and refused), or why nothing was read back.
    pub store: Result<StoreReport, QuarantineError>,
    /// The worktree's `HEAD`, index and the generation itself: one line per thing refused.
    pub notes: Vec<String>,
}

/// The end of a period, whoever ends it: generation `name` at `from` (in the box's reach, or
/// already in the collect dir) moved out of the box's reach, read back by `quarantine`, `HEAD`
/// and (when `take_the_index`) the index taken when allowed, and removed.
pub(super) fn read_back(
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
