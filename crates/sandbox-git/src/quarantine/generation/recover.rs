//! Generations a dead daemon left: read back by the next one from their records ([`recover`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use git2::Oid;
use nix::fcntl::{Flock, FlockArg};

use super::box_git::BoxGit;
use super::files::remove;
use super::read_back::{read_back, GenerationEnd};
use super::record::{FileStamp, Record};
use crate::quarantine::error::QuarantineError;
use crate::quarantine::StoreQuarantine;

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
///
/// [`Generation::end`]: super::Generation::end
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
