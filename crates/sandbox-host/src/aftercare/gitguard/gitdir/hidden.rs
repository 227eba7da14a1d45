//! Index bits that hide an edit from the user: a skip-worktree or assume-unchanged bit the run
//! set on a file that is in the worktree makes the user's `git status` and `git diff` silent
//! about that file's changes. Reporting it is not enough (the report goes to stderr, which the
//! agent reads and the user may not), so the host clears such a bit after the run — with its
//! own `git update-index`, in a clean environment — unless sparse-checkout is on (where the
//! bit is git's own bookkeeping). A killed run's audit (no index recorded at its start) cannot
//! tell the run's bits from the user's, and only reports them.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use sandbox_git::quarantine::gitdir::IndexSummary;

use super::GitDirAtStart;

/// Clears the bits `now` has that `before` did not, on files present in the worktree; the
/// lines for the user (what was cleared, what is only reported, new gitlinks).
pub(super) fn clear_new_bits(
    start: &GitDirAtStart,
    now: &IndexSummary,
    before: &IndexSummary,
) -> Vec<String> {
    let mut lines = Vec::new();
    let mut left = IndexSummary {
        skip_worktree: now.skip_worktree.clone(),
        assume_unchanged: now.assume_unchanged.clone(),
        gitlinks: now.gitlinks.clone(),
    };
    let clearable = start.index.is_some() && start.worktree.is_some();
    if let (true, Some(worktree)) = (clearable, start.worktree.as_deref()) {
        if !sparse_checkout(&start.gitdir, worktree) {
            for (bit, new, kept) in [
                (
                    "skip-worktree",
                    &now.skip_worktree - &before.skip_worktree,
                    &mut left.skip_worktree,
                ),
                (
                    "assume-unchanged",
                    &now.assume_unchanged - &before.assume_unchanged,
                    &mut left.assume_unchanged,
                ),
            ] {
                let present: BTreeSet<String> = new
                    .into_iter()
                    .filter(|p| worktree.join(p).symlink_metadata().is_ok())
                    .collect();
                if present.is_empty() {
                    continue;
                }
                match update_index(&start.gitdir, worktree, &format!("--no-{bit}"), &present) {
                    Ok(()) => {
                        for path in &present {
                            kept.remove(path);
                            lines.push(format!(
                                "git: the run marked {path} {bit} in the index, which hides its \
                                 changes from git status and git diff; the bit is cleared"
                            ));
                        }
                    }
                    Err(e) => lines.push(format!(
                        "git: could NOT clear the {bit} bits the run set ({e}); run `git \
                         update-index --no-{bit}` on them before trusting git status"
                    )),
                }
            }
        }
    }
    lines.extend(left.new_since(before));
    lines
}

/// A clean environment for the host's own git: no system or global config, no hooks, no
/// fsmonitor, the repository named explicitly.
fn host_git(gitdir: &Path, worktree: &Path) -> Command {
    let mut git = Command::new("git");
    git.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("HOME", "/nonexistent")
        .current_dir("/")
        .args([
            "-c",
            "core.fsmonitor=false",
            "-c",
            "core.hooksPath=/dev/null",
        ])
        .arg("--git-dir")
        .arg(gitdir)
        .arg("--work-tree")
        .arg(worktree)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    git
}

/// Whether the worktree uses sparse-checkout (`core.sparseCheckout`, as git reads it).
fn sparse_checkout(gitdir: &Path, worktree: &Path) -> bool {
    let mut git = host_git(gitdir, worktree);
    git.args(["config", "--type=bool", "--get", "core.sparseCheckout"])
        .stdout(Stdio::piped());
    git.output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "true")
}

/// `git update-index <flag> -z --stdin` with `paths`.
fn update_index(
    gitdir: &Path,
    worktree: &Path,
    flag: &str,
    paths: &BTreeSet<String>,
) -> Result<(), String> {
    let mut git = host_git(gitdir, worktree);
    git.args(["update-index", flag, "-z", "--stdin"])
        .stdin(Stdio::piped());
    let mut child = git.spawn().map_err(|e| format!("git: {e}"))?;
    let mut input = Vec::new();
    for path in paths {
        input.extend_from_slice(path.as_bytes());
        input.push(0);
    }
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(&input).map_err(|e| format!("git: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("git: {e}"))?;
    out.status
        .success()
        .then_some(())
        .ok_or_else(|| String::from_utf8_lossy(&out.stderr).trim().to_string())
}
