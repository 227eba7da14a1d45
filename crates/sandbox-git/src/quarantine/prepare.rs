//! Making a quarantine, one way per kind of run: a run's own overlay layer ([`prepare`],
//! [`prepare_task`]), a persistent layer ([`attach`]), a box's generation ([`prepare_copy`],
//! [`resume_copy`]), a push remote ([`prepare_push`]).
//!
//! [`prepare`]: StoreQuarantine::prepare
//! [`prepare_task`]: StoreQuarantine::prepare_task
//! [`attach`]: StoreQuarantine::attach
//! [`prepare_copy`]: StoreQuarantine::prepare_copy
//! [`resume_copy`]: StoreQuarantine::resume_copy
//! [`prepare_push`]: StoreQuarantine::prepare_push

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use git2::Oid;

use super::error::{io, QuarantineError};
use super::rundir::remove_abandoned;
use super::{refs, task, HeldDir, Layers, State, StoreQuarantine};

impl StoreQuarantine {
    /// Lays out a new quarantine of `common` under `parent` (a private directory of ours):
    /// the empty writable layer, overlayfs's work dir, and the snapshot layer with a frozen
    /// `packed-refs` and a loose copy of each ref to pin. `task_branch` is the one existing
    /// ref the run may move.
    pub fn prepare(
        common: &Path,
        task_branch: Option<&str>,
        parent: &Path,
    ) -> Result<Self, QuarantineError> {
        let quarantine = Self::with_run_dir(common, task_branch, parent, None)?;
        // From here on, dropping `quarantine` removes the directory.
        quarantine.lay_out()
    }

    /// Attaches to a *persistent* writable layer that something else stacks (a VM view's git
    /// store layer, [`crate::View::store_layer_dir`]): `layer/upper` is read back, `layer/work`
    /// is the overlay's. The host's own scratch space is a new run directory under `parent`
    /// (private, removed on drop); the layer itself is kept. Refs already applied by an
    /// earlier run read as unchanged, since the host holds the same value now.
    pub fn attach(
        common: &Path,
        task_branch: Option<&str>,
        layer: &Path,
        parent: &Path,
    ) -> Result<Self, QuarantineError> {
        let upper = layer.join("upper");
        // The layer is writable from inside: never follow a link planted in place of it.
        for dir in [layer, upper.as_path()] {
            match dir.symlink_metadata() {
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => {
                    return Err(QuarantineError::Io {
                        what: "refusing a layer that is not a directory",
                        path: dir.to_path_buf(),
                        source: std::io::Error::other("not a directory"),
                    })
                }
                Err(e) => return Err(io("reading", dir)(e)),
            }
        }
        let mut quarantine = Self::with_run_dir(common, task_branch, parent, Some(layer))?;
        quarantine.held_upper = Some(HeldDir::open(&upper)?);
        quarantine.make_upper_skeleton()?;
        quarantine.packed_at_start = refs::read_packed(&common.join("packed-refs"))
            .map_err(io("reading", &common.join("packed-refs")))?
            .refs;
        quarantine.start = refs::list(common, &quarantine.packed_at_start);
        Ok(quarantine)
    }

    /// A quarantine with a fresh run directory under `parent` (removed on drop); its layers
    /// are the run directory's own, or `upper/` and `work/` of a persistent `layer`.
    fn with_run_dir(
        common: &Path,
        task_branch: Option<&str>,
        parent: &Path,
        layer: Option<&Path>,
    ) -> Result<Self, QuarantineError> {
        remove_abandoned(parent);
        std::fs::create_dir_all(parent).map_err(io("creating", parent))?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("{}-", std::process::id()))
            .tempdir_in(parent)
            .map_err(io("creating a run directory in", parent))?
            .keep();
        // A run's own layers lie in `layer/`, which the child may cover with a tmpfs.
        let own = dir.join("layer");
        let base = layer.unwrap_or(&own);
        Ok(StoreQuarantine {
            common: common.to_path_buf(),
            layers: Layers {
                upper: base.join("upper"),
                work: base.join("work"),
                snapshot: dir.join("snapshot"),
                pinned_refs: Vec::new(),
                remotes: Vec::new(),
            },
            dir,
            task_branch: task_branch.map(str::to_string),
            start: HashMap::new(),
            packed_at_start: HashMap::new(),
            held_upper: None,
            bounded: None,
            record: None,
            tracking: Vec::new(),
            copy: false,
            persistent: layer.is_some(),
            state: Mutex::new(State::default()),
        })
    }

    /// [`Self::prepare`] for the linked worktree with git dir `gitdir`, its task branch
    /// decided from the private record in `record_dir` ([`task::decide`]) — refused with
    /// [`QuarantineError::TaskBranch`] when `HEAD` names a branch the worktree's runs do not
    /// own. Refs earlier runs created may be moved and deleted; the record is updated as the
    /// run creates and deletes refs (so a run killed outright still leaves it right).
    ///
    /// `push_remotes`: the run's push remotes (`--allow-push`), whose remote-tracking refs
    /// follow the remote ([`Self::track_push_remotes`]) and are not pinned.
    ///
    /// `record_dirs`: where the record is written (the first) and where it may be found (in
    /// order: an earlier version kept it in another place).
    pub fn prepare_task(
        common: &Path,
        gitdir: &Path,
        record_dirs: &[&Path],
        parent: &Path,
        push_remotes: &[PathBuf],
    ) -> Result<Self, QuarantineError> {
        let mut quarantine = Self::for_task(common, gitdir, record_dirs, parent)?;
        quarantine.track_push_remotes(push_remotes);
        quarantine.lay_out()
    }

    /// The quarantine of a box's generation of the common dir (a copy the guest writes, laid
    /// out by [`generation`]): the task branch decided as [`Self::prepare_task`] decides it,
    /// the refs of the start read now; the copy itself is attached once it is out of the
    /// guest's reach ([`Self::attach_copy`]).
    ///
    /// [`generation`]: super::generation
    pub fn prepare_copy(
        common: &Path,
        gitdir: &Path,
        record_dirs: &[&Path],
        parent: &Path,
    ) -> Result<Self, QuarantineError> {
        let mut quarantine = Self::for_task(common, gitdir, record_dirs, parent)?;
        let packed = refs::read_packed(&common.join("packed-refs"))
            .map_err(io("reading", &common.join("packed-refs")))?;
        quarantine.start = refs::list(common, &packed.refs);
        quarantine.packed_at_start = packed.refs;
        quarantine.copy = true;
        Ok(quarantine)
    }

    /// [`Self::prepare_copy`] for a generation whose busy period ended with its daemon (read
    /// back by the next one, [`generation::recover`]): the refs of the start as they were
    /// recorded when the generation was laid out, so what the box changed is judged against
    /// what it started from — a ref the host moved since is a compare-and-swap that fails and
    /// is reported, never an undo of the host's move.
    ///
    /// [`generation::recover`]: super::generation::recover
    pub fn resume_copy(
        common: &Path,
        gitdir: &Path,
        record_dirs: &[&Path],
        parent: &Path,
        start: HashMap<String, Option<Oid>>,
    ) -> Result<Self, QuarantineError> {
        let mut quarantine = Self::prepare_copy(common, gitdir, record_dirs, parent)?;
        quarantine.start = start;
        Ok(quarantine)
    }

    /// Reads the copy `dir` back from here on: held open by a descriptor (a link in its
    /// place is refused), so a rename or a link planted after this check changes nothing.
    pub fn attach_copy(&mut self, dir: &Path) -> Result<(), QuarantineError> {
        self.held_upper = Some(HeldDir::open(dir)?);
        self.layers.upper = dir.to_path_buf();
        Ok(())
    }

    /// [`Self::prepare_task`] up to laying out the layers: the task branch decided, the
    /// record kept.
    fn for_task(
        common: &Path,
        gitdir: &Path,
        record_dirs: &[&Path],
        parent: &Path,
    ) -> Result<Self, QuarantineError> {
        let record_dir = record_dirs.first().copied().unwrap_or(parent);
        let found = record_dirs
            .iter()
            .enumerate()
            .find_map(|(i, dir)| task::TaskRecord::load(dir, gitdir).map(|r| (i, r)));
        let moved = found.as_ref().is_some_and(|(i, _)| *i > 0);
        let record = found.map(|(_, r)| r);
        let head = std::fs::read_to_string(gitdir.join("HEAD")).unwrap_or_default();
        let packed = refs::read_packed(&common.join("packed-refs"))
            .map_err(io("reading", &common.join("packed-refs")))?;
        let start = refs::list(common, &packed.refs);
        let branch = task::decide(
            record.as_ref(),
            &task::Head::parse(&head),
            |name| start.contains_key(name),
            |name| task::checked_out_elsewhere(common, gitdir, name),
        )
        .map_err(|reason| QuarantineError::TaskBranch {
            worktree: gitdir.to_path_buf(),
            reason,
        })?;
        let loaded = record.clone();
        let mut record = record.unwrap_or_else(|| task::TaskRecord {
            gitdir: gitdir.to_path_buf(),
            ..Default::default()
        });
        // Refs created by earlier runs that someone deleted since are no longer the task's.
        record.owned.retain(|name| start.contains_key(name));
        if branch.is_some() && record.branch.is_none() {
            record.branch = branch.clone();
        }
        // Written only when it changed (or is found in the old place): most runs find it as
        // the last one left it.
        if moved || loaded.as_ref() != Some(&record) {
            record
                .save(record_dir)
                .map_err(io("writing the task record in", record_dir))?;
        }
        let mut quarantine = Self::with_run_dir(common, branch.as_deref(), parent, None)?;
        quarantine
            .state
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .created
            .extend(record.owned.iter().cloned());
        quarantine
            .state
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .stash_owned
            .clone_from(&record.stash);
        quarantine.record = Some((record_dir.to_path_buf(), record));
        Ok(quarantine)
    }

    /// The quarantine of a push remote (`--allow-push`): its git dir `remote` behind an
    /// overlay of the same kind, with no task branch — a push may create branches and tags
    /// (by the same allow-list), and move and delete those that earlier pushes of this
    /// worktree's runs created (the record in `record_dir`, keyed by the remote); every ref
    /// the remote had otherwise stays as it is. Objects are taken in by content, as ever.
    pub fn prepare_push(
        remote: &Path,
        record_dir: &Path,
        parent: &Path,
    ) -> Result<Self, QuarantineError> {
        let record =
            task::TaskRecord::load(record_dir, remote).unwrap_or_else(|| task::TaskRecord {
                gitdir: remote.to_path_buf(),
                ..Default::default()
            });
        let mut quarantine = Self::with_run_dir(remote, None, parent, None)?;
        let state = quarantine
            .state
            .get_mut()
            .unwrap_or_else(|e| e.into_inner());
        state.created.extend(record.owned.iter().cloned());
        quarantine.record = Some((record_dir.to_path_buf(), record));
        quarantine.lay_out()
    }
}
