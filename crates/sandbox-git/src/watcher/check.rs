//! One check of one view: the fast-forward step run, and what it found turned into events
//! (each problem reported once, and written where `status` finds it).

use std::time::{Duration, Instant};

use super::worker::{Reported, ViewState, Worker};
use crate::events::{BlockReason, WatchEvent};
use crate::fastforward::{self, Step};
use crate::util::{q, write_atomic};

impl Worker {
    /// Checks one view; returns true if it is gone.
    pub(super) fn check(&mut self, ri: usize, vi: usize) -> bool {
        let exclude = self.exclusions(ri);
        let now = Instant::now();
        let opts = self.opts.clone();
        let r = &mut self.repos[ri];
        let step = fastforward::step(&r.repo, &r.views[vi].view, &exclude);
        let vs = &mut r.views[vi];
        vs.retry_at = None;
        let v = vs.view.clone();
        let mut emit: Vec<WatchEvent> = Vec::new();
        let mut is_gone = false;
        match step {
            Ok(Step::InSync { commit }) | Ok(Step::Behind { branch: commit }) => {
                if vs.clear() {
                    emit.push(WatchEvent::Resolved {
                        task: v.task.clone(),
                        branch: v.branch.clone(),
                        commit: commit.to_string(),
                    });
                }
            }
            Ok(Step::FastForwarded {
                from,
                to,
                commits,
                worktree,
            }) => {
                vs.clear();
                emit.push(WatchEvent::FastForwarded {
                    task: v.task.clone(),
                    branch: v.branch.clone(),
                    child_branch: v.child_branch.clone(),
                    from: from.to_string(),
                    to: to.to_string(),
                    commits,
                    worktree,
                });
            }
            Ok(Step::Diverged {
                branch,
                child,
                child_ahead,
                branch_ahead,
                merge_base,
            }) => {
                vs.busy_since = None;
                let wt = q(&v.task_worktree);
                let event = WatchEvent::Diverged {
                    task: v.task.clone(),
                    branch: v.branch.clone(),
                    child_branch: v.child_branch.clone(),
                    branch_commit: branch.to_string(),
                    child_commit: child.to_string(),
                    merge_base,
                    child_ahead,
                    branch_ahead,
                    resolve: vec![
                        format!("git -C {wt} merge {}", v.child_branch),
                        format!("git -C {wt} rebase {}", v.child_branch),
                    ],
                };
                vs.problem(Reported::Diverged(branch, child), event, &mut emit);
            }
            Ok(Step::Blocked {
                branch,
                child,
                worktree,
                reason,
                paths,
                message,
                resolve,
            }) => {
                let report = if reason == BlockReason::Busy {
                    let since = *vs.busy_since.get_or_insert(now);
                    // A git command holding index.lock for a moment is normal: retry soon.
                    vs.retry_at = Some(now + opts.debounce.max(Duration::from_millis(20)));
                    now.duration_since(since) >= opts.busy_grace
                } else {
                    vs.busy_since = None;
                    vs.retry_at = Some(now + opts.retry);
                    true
                };
                if report {
                    let key = Reported::Blocked(reason.clone(), branch, child, paths.clone());
                    let event = WatchEvent::Blocked {
                        task: v.task.clone(),
                        branch: v.branch.clone(),
                        child_branch: v.child_branch.clone(),
                        branch_commit: branch.to_string(),
                        child_commit: child.to_string(),
                        worktree,
                        reason,
                        paths,
                        message,
                        resolve,
                    };
                    vs.problem(key, event, &mut emit);
                }
            }
            Ok(Step::Raced) => {
                // Someone moved the branch as we looked: look again shortly.
                vs.retry_at = Some(now + opts.debounce);
            }
            Ok(Step::BranchMissing) => {
                let event = WatchEvent::Error {
                    task: v.task.clone(),
                    message: format!(
                        "branch {} does not exist; nothing to fast-forward until it does (git -C {} branch {} {})",
                        v.branch,
                        q(&v.task_worktree),
                        v.branch,
                        v.child_branch
                    ),
                };
                vs.problem(Reported::BranchMissing, event, &mut emit);
            }
            Ok(Step::Gone { reason }) => {
                vs.clear();
                vs.gone = Some(reason);
                is_gone = true;
            }
            Err(e) => {
                vs.retry_at = Some(now + opts.retry);
                let message = e.to_string();
                let event = WatchEvent::Error {
                    task: v.task.clone(),
                    message: message.clone(),
                };
                vs.problem(Reported::Error(message), event, &mut emit);
            }
        }
        for e in emit {
            (self.sink)(e);
        }
        is_gone
    }
}

impl ViewState {
    /// Reports a problem once: a new one (by `key`) is written where `status` finds it and
    /// emitted; the same one again is not.
    fn problem(&mut self, key: Reported, event: WatchEvent, emit: &mut Vec<WatchEvent>) {
        if self.reported.as_ref() != Some(&key) {
            self.reported = Some(key);
            if let Ok(text) = serde_json::to_vec(&event) {
                let _ = write_atomic(&self.report_file, &text);
            }
            emit.push(event);
        }
    }

    /// Forgets the reported problem, if any (`true`: there was one).
    fn clear(&mut self) -> bool {
        self.busy_since = None;
        if self.reported.take().is_some() {
            let _ = std::fs::remove_file(&self.report_file);
            true
        } else {
            false
        }
    }
}
