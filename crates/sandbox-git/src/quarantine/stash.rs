//! The stash: applied only when the run's stash reflog keeps every entry the host had.

use git2::{Oid, Repository};

use super::apply::refuse;
use super::report::AppliedRef;
use super::{refs, State, StoreQuarantine};

impl StoreQuarantine {
    /// The stash, when one existed at the start: git keeps its entries in the reflog, so a
    /// push (or a pop of the run's own entry) is applied when the stash reflog the run wrote
    /// still holds every entry the host had at the start, in order — the host then takes that
    /// reflog for its own. Anything else would lose the user's entries and is refused, naming
    /// the run's stash commit (whose objects are in the repository) so nothing is lost.
    pub(super) fn apply_stash(
        &self,
        repo: &Repository,
        odb: &git2::Odb,
        state: &mut State,
        wanted: Option<Oid>,
        last: bool,
    ) {
        let name = "refs/stash";
        let current = match state.applied.get(name) {
            Some(value) => *value,
            None => self.start.get(name).copied().flatten(),
        };
        let entries = refs::read_reflog(&self.upper().join("logs/refs/stash"), |p| {
            refs::read_untrusted(self.upper(), p, 16 << 20)
        });
        let host = refs::read_reflog(&self.common.join("logs/refs/stash"), |p| std::fs::read(p));
        // Every entry the host has stays, unless a run of this worktree pushed it.
        let keeps_every_entry = {
            let mut theirs = entries.iter().map(|e| e.new);
            host.iter()
                .filter(|h| !state.stash_owned.contains(&h.new.to_string()))
                .all(|h| theirs.any(|t| t == h.new))
        };
        if wanted == current {
            // The top is as the host has it, but the run may have dropped an entry below it
            // (`git stash drop stash@{1}` after a push the host already took): the host keeps
            // its reflog, and says so once the run is over — the same word whenever the
            // sync happened to run.
            if last && !keeps_every_entry && !host.is_empty() {
                refuse(
                    state,
                    name,
                    wanted,
                    "the run's stash reflog does not keep every entry the repository had; the \
                     repository keeps them all"
                        .into(),
                );
            }
            return;
        }
        let keep = |oid: Option<Oid>| {
            oid.map_or(String::new(), |o| {
                format!(
                    " (the run's stash is commit {o}: `git stash store -m sandbox {o}` on the \
                     host keeps it)"
                )
            })
        };
        let Some(oid) = wanted else {
            return refuse(
                state,
                name,
                None,
                "the run dropped the stash entries the repository had".into(),
            );
        };
        if entries.last().map(|e| e.new) != Some(oid) || !keeps_every_entry {
            return refuse(
                state,
                name,
                wanted,
                format!(
                    "the run's stash reflog does not keep every entry the repository had{}",
                    keep(wanted)
                ),
            );
        }
        if !entries.iter().all(|e| odb.exists(e.new)) {
            if last {
                refuse(
                    state,
                    name,
                    wanted,
                    format!("its commits never reached the store{}", keep(wanted)),
                );
            }
            return;
        }
        let message = refs::last_reflog_message(self.upper(), name);
        let swapped = refs::compare_and_swap(repo, name, current, wanted, false, &message)
            .and_then(|replaced| {
                refs::write_reflog(repo, name, &entries)
                    .map_err(|e| format!("writing its reflog: {}", e.message()))?;
                Ok(replaced)
            });
        match swapped {
            Ok(replaced) => {
                state.applied.insert(name.to_string(), wanted);
                state.report.applied.push(AppliedRef {
                    name: name.to_string(),
                    old: replaced.map(|o| o.to_string()),
                    new: Some(oid.to_string()),
                });
                let ours: std::collections::BTreeSet<String> = entries
                    .iter()
                    .filter(|e| {
                        state.stash_owned.contains(&e.new.to_string())
                            || !host.iter().any(|h| h.new == e.new)
                    })
                    .map(|e| e.new.to_string())
                    .collect();
                state.stash_owned = ours;
                self.save_record(state);
            }
            Err(reason) => refuse(state, name, wanted, format!("{reason}{}", keep(wanted))),
        }
    }
}
