//! What the quarantine did for a run, as the caller reports it.

use std::path::Path;

use serde::Serialize;

/// A ref update the host applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AppliedRef {
    pub name: String,
    /// `None`: the ref was created.
    pub old: Option<String>,
    /// `None`: the ref was deleted.
    pub new: Option<String>,
}

/// A ref update the host refused: the ref is unchanged in the repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefusedRef {
    pub name: String,
    /// What the sandbox set it to (`None`: deleted).
    pub wanted: Option<String>,
    pub reason: String,
}

/// An object the host did not take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RejectedObject {
    /// Relative to the store (`objects/ab/cdef…`).
    pub path: String,
    pub reason: String,
}

/// What the quarantine did for a run (so far).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreReport {
    /// The branch this run owned (`None`: none, `HEAD` detached with no record).
    pub task_branch: Option<String>,
    /// Refs this worktree's runs created and that still exist (later runs may move them).
    pub owned: Vec<String>,
    pub objects_imported: usize,
    pub applied: Vec<AppliedRef>,
    pub refused: Vec<RefusedRef>,
    pub rejected_objects: Vec<RejectedObject>,
    /// The bound of the writable layer, in bytes, when the run filled it (its writes to the
    /// git store then failed with ENOSPC).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer_full: Option<u64>,
    /// Commands inside that failed on a ref or `packed-refs` the host pinned read-only, as
    /// git reported them ([`trace`](super::trace)): one line each, saying why and what to run
    /// on the host.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pinned_failures: Vec<String>,
    /// What the run wrote to the store that the host never applies (the repository's config,
    /// hooks, `info/`, other worktrees' git dirs), one line each: such a write succeeded
    /// inside and is gone afterwards, so it is said, not dropped in silence.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<String>,
}

impl StoreReport {
    /// [`Self::warnings`] of a push remote's quarantine: each line names the remote, and
    /// the command to apply a refused update runs there.
    pub fn remote_warnings(&self, remote: &Path) -> Vec<String> {
        let at = remote.display().to_string();
        let quoted = if at
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+".contains(&b))
        {
            at.clone()
        } else {
            format!("'{}'", at.replace('\'', "'\\''"))
        };
        self.warnings()
            .into_iter()
            .map(|line| {
                let line = line.replace("`git update-ref", &format!("`git -C {quoted} update-ref"));
                match line.strip_prefix("git: ") {
                    Some(rest) => format!("git push to {at}: {rest}"),
                    None => line,
                }
            })
            .collect()
    }

    /// One line per refusal and rejection, for stderr.
    pub fn warnings(&self) -> Vec<String> {
        let refused = self.refused.iter().map(|r| {
            let wanted = r.wanted.as_deref().map_or("delete it".to_string(), |w| {
                format!("set it to {}", &w[..w.len().min(12)])
            });
            let yourself = match &r.wanted {
                _ if r.reason.contains("git stash store") => String::new(),
                _ if r.reason.contains("keeps them all") => String::new(),
                Some(w) => format!(
                    " (to apply it on the host: `git update-ref {} {w}`)",
                    r.name
                ),
                None => format!(" (to apply it on the host: `git update-ref -d {}`)", r.name),
            };
            format!(
                "git: refused to {wanted} for {} — {}; the repository keeps it unchanged{yourself}",
                r.name, r.reason
            )
        });
        let rejected = self.rejected_objects.iter().map(|o| {
            format!(
                "git: object {} not taken into the repository — {}",
                o.path, o.reason
            )
        });
        let full = self.layer_full.map(|bytes| {
            format!(
                "git: the git store layer was full ({} MiB): the command's writes to the \
                 repository's store failed (ENOSPC) and what they would have added is missing; \
                 raise the bound with `backends.native.git_store_size_mib` in the configuration",
                bytes >> 20
            )
        });
        refused
            .chain(rejected)
            .chain(full)
            .chain(self.pinned_failures.iter().cloned())
            .chain(self.dropped.iter().cloned())
            .collect()
    }
}
