//! Reading the writable layer back: what changed, the objects taken in, each ref applied.

use git2::Repository;

use super::error::{git, QuarantineError};
use super::{dropped, objects, refs, StoreQuarantine};

impl StoreQuarantine {
    /// Reads the writable layer back and applies what is allowed: objects first (a ref is
    /// applied only once the objects it names are in the store), then refs. `last`: the run
    /// is over, so what is still incomplete is reported instead of retried.
    pub fn sync(&self, last: bool) -> Result<(), QuarantineError> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bytes) = self.layer_full() {
            state.report.layer_full = Some(bytes);
        }
        let upper = self.upper();
        // A persistent layer (a VM's) lies directly on the common dir: what it hides of it
        // counts as deleted. A copy (a box's generation) has no layers at all.
        let below = self.persistent.then_some(self.common.as_path());
        let mut changed = if self.copy {
            refs::changed_in_copy(upper, &self.common, &self.start)
        } else {
            let snapshot = (!self.persistent).then_some(self.layers.snapshot.as_path());
            refs::changed(upper, &self.packed_at_start, below, snapshot)
        };
        // A ref this run created, which the host already applied, and which the run deleted
        // again (`git stash` then `git stash pop`, a branch made and removed) leaves nothing
        // in the layer — no whiteout: there was nothing below it. Gone from the layer, it is
        // deleted.
        for name in &state.created {
            let applied_live = matches!(state.applied.get(name), Some(Some(_)));
            if !applied_live
                || self.start.contains_key(name)
                || changed.iter().any(|(n, _)| n == name)
            {
                continue;
            }
            if upper.join(name).symlink_metadata().is_err() {
                changed.push((name.clone(), refs::Wanted::Value(None)));
            }
        }
        // Once, at the end: what the host will not apply is said, not dropped in silence. A
        // box's generation is a whole copy of the common dir, not a layer of changes.
        if last && !self.copy && state.report.dropped.is_empty() {
            let task = self.task_branch.as_deref();
            let (start, created, owned) = (&self.start, &state.created, &state.report.owned);
            let may_own = |name: &str| {
                Some(name) == task
                    || !start.contains_key(name)
                    || created.contains(name)
                    || owned.iter().any(|o| o == name)
            };
            state.report.dropped = dropped::dropped_writes(upper, &self.common, &may_own);
        }
        // Most commands write nothing to the store: no repository open for them.
        if changed.is_empty() && !objects::any_new(upper, &state) {
            return Ok(());
        }
        let repo = Repository::open_bare(&self.common).map_err(git("opening the repository"))?;
        let odb = repo.odb().map_err(git("opening the object store"))?;
        let scratch = self.dir.join("incoming");
        objects::import(upper, &odb, &scratch, &mut state, last)?;
        for (name, wanted) in changed {
            self.apply(&repo, &odb, &mut state, &name, wanted, last);
        }
        Ok(())
    }
}
