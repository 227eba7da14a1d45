//! The refs a run owns: kept in the worktree's task record as they change, and reported.

use std::collections::HashMap;

use git2::Oid;

use super::report::StoreReport;
use super::{State, StoreQuarantine};

impl StoreQuarantine {
    /// Writes the record with the refs the run owns now.
    pub(super) fn save_record(&self, state: &State) {
        let Some((dir, record)) = &self.record else {
            return;
        };
        let mut record = record.clone();
        record.owned = owned_now(state, &self.start);
        record.stash.clone_from(&state.stash_owned);
        if let Err(e) = record.save(dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "could not update the git task record");
        }
    }

    /// What was applied and refused so far.
    pub fn report(&self) -> StoreReport {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut report = state.report.clone();
        report.task_branch = self.task_branch.clone();
        report.owned = owned_now(&state, &self.start).into_iter().collect();
        report
    }
}

/// The refs the run may move now: those it (or an earlier run) created, still existing.
fn owned_now(
    state: &State,
    start: &HashMap<String, Option<Oid>>,
) -> std::collections::BTreeSet<String> {
    state
        .created
        .iter()
        .filter(|name| match state.applied.get(*name) {
            Some(value) => value.is_some(),
            None => start.contains_key(*name),
        })
        .cloned()
        .collect()
}
