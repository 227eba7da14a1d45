//! The rule, pure: which changed refs the host applies, which `HEAD` a run may leave, which
//! refs a run may create.

use std::collections::{HashMap, HashSet};

use git2::Oid;

use super::store::valid_ref_name;

/// A full object id (SHA-1 or SHA-256), as a detached `HEAD` holds it.
pub fn is_object_id(text: &str) -> bool {
    matches!(text.len(), 40 | 64) && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether a run may end with its worktree's `HEAD` reading `found`. The next run takes the
/// branch `HEAD` names for its task branch, so `HEAD` may be left detached (a commit id) or
/// naming the task branch, a ref this run `created`, or a branch that does not exist
/// (`exists` asks the host) — never another existing branch. Pure.
pub fn head_allowed(
    found: &str,
    task_branch: Option<&str>,
    created: &[&str],
    exists: impl Fn(&str) -> bool,
) -> bool {
    let found = found.trim_end();
    if is_object_id(found) {
        return true;
    }
    let Some(name) = found.strip_prefix("ref: ") else {
        return false;
    };
    if !name.starts_with("refs/heads/") || !valid_ref_name(name) {
        return false;
    }
    Some(name) == task_branch || created.contains(&name) || !exists(name)
}

/// What the host does with one changed ref.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefVerdict {
    /// Already so on the host (or never existed, and still does not).
    Unchanged,
    /// Apply it if the host still has `expected` (`None`: absent).
    Apply {
        expected: Option<Oid>,
    },
    Refuse(String),
}

/// The rule, as a pure function: the task branch may move (not be deleted); refs the run
/// created may move and be deleted; a ref that did not exist at the start may be created as
/// a branch, a tag or the stash, unless it shadows a ref the host has ([`creation_refused`]);
/// nothing else changes. `start` holds every ref at the start, `applied` the last value the
/// host set for a ref during this run.
pub fn judge(
    name: &str,
    wanted: Option<Oid>,
    task_branch: Option<&str>,
    start: &HashMap<String, Option<Oid>>,
    applied: &HashMap<String, Option<Oid>>,
    created: &HashSet<String>,
) -> RefVerdict {
    let current = match applied.get(name) {
        Some(value) => *value,
        None => start.get(name).copied().flatten(),
    };
    if wanted == current {
        return RefVerdict::Unchanged;
    }
    if !valid_ref_name(name) {
        return RefVerdict::Refuse("not a valid ref name".into());
    }
    if Some(name) == task_branch {
        return match wanted {
            None => RefVerdict::Refuse(
                "the task branch is never deleted from inside the sandbox".into(),
            ),
            Some(_) => RefVerdict::Apply { expected: current },
        };
    }
    if created.contains(name) {
        return RefVerdict::Apply { expected: current };
    }
    if !start.contains_key(name) && !applied.contains_key(name) {
        if wanted.is_none() {
            return RefVerdict::Unchanged;
        }
        if let Some(reason) = creation_refused(name, |other| match applied.get(other) {
            Some(value) => value.is_some(),
            None => start.contains_key(other),
        }) {
            return RefVerdict::Refuse(reason);
        }
        return RefVerdict::Apply { expected: None };
    }
    RefVerdict::Refuse(
        "it existed before the run, and only the task branch and refs the run creates are \
         applied"
            .into(),
    )
}

/// Where a run may create refs: branches, tags and the stash. Everything else changes what
/// the host's git does with names it already has — `refs/replace/<oid>` makes every reader
/// see another object in place of one `main` holds (`git show main:a.txt`, a fresh checkout),
/// `refs/notes/*` adds text to `git log`, `refs/remotes/*` moves what `origin/main` means.
pub fn creatable_namespace(name: &str) -> bool {
    name == "refs/stash"
        || name
            .strip_prefix("refs/heads/")
            .or_else(|| name.strip_prefix("refs/tags/"))
            .is_some_and(|rest| !rest.is_empty())
}

/// git's lookup order for a short name `s` (`refs.c`, `ref_rev_parse_rules`): the first of
/// these that exists is what `git show s`, `git reset s`, `git log s` use; `git checkout s`
/// and `git switch s` try `refs/heads/s` first.
const LOOKUP_RULES: [(&str, &str); 6] = [
    ("", ""),
    ("refs/", ""),
    ("refs/tags/", ""),
    ("refs/heads/", ""),
    ("refs/remotes/", ""),
    ("refs/remotes/", "/HEAD"),
];

/// A name git keeps at the top of the store (`HEAD`, `ORIG_HEAD`, `FETCH_HEAD`, …): the first
/// lookup rule finds it whether or not it exists now.
fn is_root_ref(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
        && (name.ends_with("HEAD")
            || matches!(
                name,
                "AUTO_MERGE" | "BISECT_EXPECTED_REV" | "NOTES_MERGE_PARTIAL" | "NOTES_MERGE_REF"
            ))
}

/// Another ref the user may mean by a short name of `name` (`exists` says which refs the host
/// has): a new `refs/tags/main` beside `refs/heads/main` turns `git reset --hard main` into the
/// agent's tag, a new `refs/heads/origin/main` wins over `refs/remotes/origin/main`, and a new
/// `refs/heads/refs/heads/main` is what `git checkout refs/heads/main` switches to. Any other
/// ref reached by any short name of `name`, by any rule, counts. Pure.
pub fn shadows(name: &str, exists: impl Fn(&str) -> bool) -> Option<String> {
    for (prefix, suffix) in LOOKUP_RULES {
        let Some(short) = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix(suffix))
            .filter(|s| !s.is_empty())
        else {
            continue;
        };
        for (p, s) in LOOKUP_RULES {
            let other = format!("{p}{short}{s}");
            if other == name {
                continue;
            }
            if (p.is_empty() && is_root_ref(&other)) || exists(&other) {
                return Some(other);
            }
        }
    }
    None
}

/// Why a run may not create `name` (a valid ref name that does not exist), if so: outside
/// [`creatable_namespace`], or [`shadows`] a ref the host has.
pub fn creation_refused(name: &str, exists: impl Fn(&str) -> bool) -> Option<String> {
    if !creatable_namespace(name) {
        return Some(
            "a run creates refs only under refs/heads/, refs/tags/ and refs/stash; this one \
             would change what the repository's existing names mean (create it on the host \
             if you want it)"
                .into(),
        );
    }
    shadows(name, exists).map(|other| {
        format!(
            "its short name would also mean {other}, which the repository has: git would \
             resolve that name to the run's ref (pick another name)"
        )
    })
}
