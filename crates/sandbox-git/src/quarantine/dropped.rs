//! What a run wrote to the git store that the host never applies: the repository's config,
//! hooks, `info/`, another worktree's files. Inside, such a write succeeds (it lands in the
//! run's layer, and git inside sees it for the rest of the run); the host applies only objects
//! and the refs its rules allow, so the write is gone afterwards. Each is named once at the
//! end of the run, with what to do on the host if the user wants it.
//!
//! Pinning these read-only inside would refuse them at write time, but git itself rewrites
//! `config` for ordinary branch work (`git branch -d` and `-m` rewrite the branch's section),
//! which a pin breaks; so the config is judged by its keys instead, and a change to the
//! sections of branches the run may own is not reported.

use std::collections::BTreeSet;
use std::path::Path;

use super::gitformats::config_entries;
use super::refs::{is_whiteout, read_untrusted};

/// What git writes to the common dir in ordinary work and the host reads back or ignores
/// on purpose: refs and objects (applied by the rules), `packed-refs` (judged), reflogs, the
/// view's own `worktrees/<this>` (bound from the host, never in the layer), and git's own
/// scratch (`gc.pid`, `gc.log`, locks).
const READ_BACK: &[&str] = &["refs", "objects", "logs", "packed-refs", "gc.pid", "gc.log"];

/// A config file in the layer is read up to this size; a larger one is named, not parsed.
const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// How many config keys one line names.
const KEYS_NAMED: usize = 6;

/// The lines for the user: one per top-level entry of `upper` the host drops. `common` is the
/// repository's common dir on the host (the config there is what the run's is compared
/// with); `may_own` says whether a branch (`refs/heads/…`) is one the run may own, whose
/// config section it may change. The run's own `worktrees/<this>` is bound from the host over
/// the overlay, so what the layer holds under `worktrees/` is other worktrees' (or a
/// `git worktree add` inside).
pub(crate) fn dropped_writes(
    upper: &Path,
    common: &Path,
    may_own: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(upper) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| !READ_BACK.contains(&name.as_str()) && !name.ends_with(".lock"))
        .collect();
    names.sort();
    let mut lines = Vec::new();
    for name in names {
        let path = upper.join(&name);
        let Ok(meta) = path.symlink_metadata() else {
            continue;
        };
        let deleted = is_whiteout(&meta);
        let line = match name.as_str() {
            "config" if !deleted => match config_change(upper, common, may_own) {
                Some(keys) if keys.is_empty() => continue,
                Some(keys) => format!(
                    "git: the run changed the repository's config ({}); the host keeps its \
                     own config unchanged (set what you want with `git config` on the host)",
                    keys
                ),
                None => "git: the run rewrote the repository's config in a form the host \
                         does not read; the host keeps its own config unchanged"
                    .to_string(),
            },
            "worktrees" => match other_worktrees(&path) {
                others if others.is_empty() => continue,
                others => format!(
                    "git: the run wrote the git dirs of other worktrees ({}); the host kept \
                     them unchanged",
                    others.join(", ")
                ),
            },
            "hooks" | "info" if !deleted => format!(
                "git: the run wrote {}/ ({}); the host never takes a repository's {name} from \
                 a run — they stay as they were",
                name,
                listing(&path)
            ),
            _ if deleted => {
                format!("git: the run deleted the repository's {name}; the host kept it")
            }
            _ => format!(
                "git: the run wrote the repository's {name}; the host applies only commits, \
                 branches and tags from a run, so it was dropped"
            ),
        };
        lines.push(line);
    }
    lines
}

/// The keys of the run's config that differ from the host's, named (at most [`KEYS_NAMED`]),
/// leaving out the sections of branches the run may own; `None` when git cannot read it.
fn config_change(upper: &Path, common: &Path, may_own: &dyn Fn(&str) -> bool) -> Option<String> {
    let theirs = read_untrusted(upper, &upper.join("config"), MAX_CONFIG_BYTES).ok()?;
    let theirs: BTreeSet<(String, String)> = config_entries(&theirs).ok()?.into_iter().collect();
    let ours: BTreeSet<(String, String)> = std::fs::read(common.join("config"))
        .ok()
        .and_then(|bytes| config_entries(&bytes).ok())
        .unwrap_or_default()
        .into_iter()
        .collect();
    let owned_branch = |key: &str| {
        key.strip_prefix("branch.")
            .and_then(|rest| rest.rsplit_once('.'))
            .is_some_and(|(branch, _)| may_own(&format!("refs/heads/{branch}")))
    };
    let keys: BTreeSet<&str> = theirs
        .symmetric_difference(&ours)
        .map(|(key, _)| key.as_str())
        .filter(|key| !owned_branch(key))
        .collect();
    let mut named: Vec<&str> = keys.iter().copied().take(KEYS_NAMED).collect();
    if keys.len() > KEYS_NAMED {
        named.push("…");
    }
    Some(named.join(", "))
}

/// The entries of `worktrees/` in the layer that hold something (an empty directory is only
/// the overlay's copy-up of a parent).
fn other_worktrees(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut others: Vec<String> = entries
        .flatten()
        .filter(|e| {
            let meta = e.path().symlink_metadata();
            !meta.is_ok_and(|m| m.is_dir())
                || std::fs::read_dir(e.path()).is_ok_and(|mut d| d.next().is_some())
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    others.sort();
    others
}

/// A short listing of a directory of the layer: up to four names (a deleted one marked).
fn listing(dir: &Path) -> String {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return "replaced".into();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            match e.path().symlink_metadata() {
                Ok(meta) if is_whiteout(&meta) => format!("{name} deleted"),
                _ => name,
            }
        })
        .collect();
    names.sort();
    let more = names.len().saturating_sub(4);
    names.truncate(4);
    if more > 0 {
        names.push(format!("{more} more"));
    }
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }

    /// A repository's common dir and a layer holding what a run wrote over it.
    fn repo_and_layer() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let common = dir.path().join("repo.git");
        std::fs::create_dir(&common).unwrap();
        git(&common, &["init", "-q", "--bare"]);
        let upper = dir.path().join("upper");
        std::fs::create_dir(&upper).unwrap();
        std::fs::copy(common.join("config"), upper.join("config")).unwrap();
        (dir, common, upper)
    }

    #[test]
    fn a_remote_added_and_a_hook_written_are_named_and_branch_work_is_not() {
        let (_dir, common, upper) = repo_and_layer();
        let config = upper.join("config");
        let set = |key: &str, value: &str| {
            git(&upper, &["config", "--file", "config", key, value]);
        };
        // The task branch's own section (git branch --set-upstream-to inside): not named.
        set("branch.task.remote", "origin");
        let owned = |r: &str| r == "refs/heads/task";
        let none = dropped_writes(&upper, &common, &owned);
        assert!(none.is_empty(), "{none:?}");
        set("remote.origin.url", "https://example.invalid/x.git");
        set("core.fsmonitor", "touch /tmp/x");
        std::fs::create_dir(upper.join("hooks")).unwrap();
        std::fs::write(upper.join("hooks/pre-commit"), "#!/bin/sh\n").unwrap();
        std::fs::create_dir_all(upper.join("worktrees/task")).unwrap();
        std::fs::create_dir_all(upper.join("worktrees/other")).unwrap();
        std::fs::write(upper.join("worktrees/other/HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(upper.join("description"), "x").unwrap();
        std::fs::write(upper.join("packed-refs"), "").unwrap();
        let lines = dropped_writes(&upper, &common, &owned);
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert!(
            lines[0].contains("config (core.fsmonitor, remote.origin.url)"),
            "{lines:?}"
        );
        assert!(lines[1].contains("description"), "{lines:?}");
        assert!(lines[2].contains("hooks/ (pre-commit)"), "{lines:?}");
        assert!(
            lines[3].contains("other worktrees (other)") && !lines[3].contains("task"),
            "{lines:?}"
        );
        assert!(config.exists());
    }

    #[test]
    fn a_config_git_cannot_read_is_named_as_such() {
        let (_dir, common, upper) = repo_and_layer();
        std::fs::write(upper.join("config"), "[core\n\tbroken").unwrap();
        let lines = dropped_writes(&upper, &common, &|_| false);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("does not read"), "{lines:?}");
    }
}
