//! Applying one changed ref on the host, when the rule allows it, by compare-and-swap.

use git2::{Oid, Repository};

use super::report::{AppliedRef, RefusedRef};
use super::{judge, refs, RefVerdict, State, StoreQuarantine};

impl StoreQuarantine {
    pub(super) fn apply(
        &self,
        repo: &Repository,
        odb: &git2::Odb,
        state: &mut State,
        name: &str,
        wanted: refs::Wanted,
        last: bool,
    ) {
        let wanted = match wanted {
            refs::Wanted::Value(value) => value,
            // Read while the sandbox was changing it: the next pass sees the result.
            refs::Wanted::Unreadable(_) if !last => return,
            refs::Wanted::Unreadable(reason) => {
                return refuse(state, name, None, reason);
            }
        };
        if name == "refs/stash" && self.start.contains_key(name) {
            return self.apply_stash(repo, odb, state, wanted, last);
        }
        // A persistent layer lies on the live common dir: a `git pack-refs` inside (`git gc`)
        // writes every ref it sees into the layer's own `packed-refs`, the ones the host moved
        // during the run (the watcher's fast-forward of the task's branch) included. A ref
        // that already holds on the host what the sandbox wants needs nothing, and is no
        // refusal.
        if self.persistent && repo.refname_to_id(name).ok() == wanted {
            return;
        }
        let current = match state.applied.get(name) {
            Some(value) => *value,
            None => self.start.get(name).copied().flatten(),
        };
        let verdict = match self.tracked_value(name) {
            Some(_) if wanted == current => RefVerdict::Unchanged,
            Some(remote) if remote == wanted => RefVerdict::Apply { expected: current },
            // The push's own quarantine may not have applied the branch yet.
            Some(_) if !last => return,
            _ => judge(
                name,
                wanted,
                self.task_branch.as_deref(),
                &self.start,
                &state.applied,
                &state.created,
            ),
        };
        let expected = match verdict {
            RefVerdict::Unchanged => return,
            RefVerdict::Refuse(reason) => return refuse(state, name, wanted, reason),
            RefVerdict::Apply { expected } => expected,
        };
        if let Some(oid) = wanted {
            if !odb.exists(oid) {
                if last {
                    refuse(
                        state,
                        name,
                        wanted,
                        format!("its commit {oid} never reached the store"),
                    );
                }
                return;
            }
        }
        let message = refs::last_reflog_message(self.upper(), name);
        let task = Some(name) == self.task_branch.as_deref();
        match refs::compare_and_swap(repo, name, expected, wanted, task, &message) {
            Ok(replaced) => {
                state.applied.insert(name.to_string(), wanted);
                // A remote-tracking ref is never the task's: it follows the remote only.
                if replaced.is_none()
                    && !self.start.contains_key(name)
                    && !name.starts_with("refs/remotes/")
                {
                    state.created.insert(name.to_string());
                }
                state.report.applied.push(AppliedRef {
                    name: name.to_string(),
                    old: replaced.map(|o| o.to_string()),
                    new: wanted.map(|o| o.to_string()),
                });
                if name == "refs/stash" && wanted.is_some() {
                    // A new stash: its reflog (where git keeps the entries) comes with it.
                    let entries = refs::read_reflog(&self.upper().join("logs/refs/stash"), |p| {
                        refs::read_untrusted(self.upper(), p, 16 << 20)
                    });
                    if entries.last().map(|e| Some(e.new)) == Some(wanted) {
                        if let Err(e) = refs::write_reflog(repo, name, &entries) {
                            tracing::warn!(error = %e, "could not write the stash reflog");
                        }
                        state.stash_owned = entries.iter().map(|e| e.new.to_string()).collect();
                    }
                }
                if replaced.is_none() || wanted.is_none() || name == "refs/stash" {
                    self.save_record(state);
                }
            }
            Err(reason) => refuse(state, name, wanted, reason),
        }
    }
}

pub(super) fn refuse(state: &mut State, name: &str, wanted: Option<Oid>, reason: String) {
    if state.refused.insert((name.to_string(), wanted)) {
        state.report.refused.push(RefusedRef {
            name: name.to_string(),
            wanted: wanted.map(|o| o.to_string()),
            reason,
        });
    }
}
