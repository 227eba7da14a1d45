//! One busy period: its generation laid out, placed in the box's reach and linked as
//! `current` ([`Generation::begin`]), and read back when it ends ([`Generation::end`]).

use std::path::{Path, PathBuf};

use super::box_git::BoxGit;
use super::files::{lay_out, point_current, random_suffix, remove};
use super::read_back::{read_back, GenerationEnd};
use super::record::{write_record, FileStamp, Held, Record};
use crate::quarantine::error::{io, QuarantineError};
use crate::quarantine::StoreQuarantine;

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
