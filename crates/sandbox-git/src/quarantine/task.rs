//! Which branch a worktree's sandboxed runs own, decided at the start of every run from a
//! private record rather than from `HEAD` alone.
//!
//! `HEAD` lies in the worktree's git dir, which every run writes. Taking the branch it names
//! for the task branch let a run choose the next run's: leave `HEAD` on a branch that does
//! not exist yet (once the user creates it, the next run's commit moves it), or park it on
//! `main` and be SIGKILLed before the after-run check (the next run moves `main`). The record
//! — one small JSON file per worktree in the host's private directory, outside every grant —
//! says which branch the worktree's runs own and which refs earlier runs created (those they
//! may go on moving and deleting). [`decide`] is the rule, pure.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What the host remembers about one worktree's sandboxed runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The worktree's git dir (the record's key, kept to tell a hash collision apart).
    pub gitdir: PathBuf,
    /// The branch the runs own (`refs/heads/…`).
    pub branch: Option<String>,
    /// Refs earlier runs created and still exist: later runs may move and delete them.
    pub owned: BTreeSet<String>,
    /// Stash entries (commit ids) earlier runs pushed: later runs may pop and drop them.
    #[serde(default)]
    pub stash: BTreeSet<String>,
}

/// What `HEAD` holds at the start of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Head {
    Branch(String),
    Detached,
    /// Missing, a link, garbage: no branch is the task's.
    Other,
}

impl Head {
    pub fn parse(text: &str) -> Head {
        let text = text.trim_end();
        match text.strip_prefix("ref: ") {
            Some(name) if name.starts_with("refs/heads/") && super::refs::valid_ref_name(name) => {
                Head::Branch(name.to_string())
            }
            Some(_) => Head::Other,
            None if super::refs::is_object_id(text) => Head::Detached,
            None => Head::Other,
        }
    }
}

/// The task branch of a run, or why the run is refused. `record`: what earlier runs of this
/// worktree left (`None`: the first run, which takes `HEAD`'s branch); `exists` asks the
/// host; `checked_out_elsewhere` names another worktree whose `HEAD` names a branch. Pure.
///
/// - `HEAD` on the recorded branch, on a ref earlier runs created, or on a branch that does
///   not exist (a commit would create it, as the run's own): that branch.
/// - `HEAD` detached (a rebase stopped in an earlier run): the recorded branch, which the
///   rebase moves when it ends.
/// - `HEAD` on another existing branch, or on one checked out in another worktree: refused.
pub fn decide(
    record: Option<&TaskRecord>,
    head: &Head,
    exists: impl Fn(&str) -> bool,
    checked_out_elsewhere: impl Fn(&str) -> Option<PathBuf>,
) -> Result<Option<String>, String> {
    let name = match head {
        Head::Branch(name) => name,
        Head::Detached => return Ok(record.and_then(|r| r.branch.clone())),
        Head::Other => return Ok(None),
    };
    if let Some(other) = checked_out_elsewhere(name) {
        return Err(format!(
            "HEAD names {name}, which is checked out in the worktree {}: a sandboxed run here \
             would move that worktree's branch. Switch this worktree to its own branch on the \
             host (`git switch <branch>`) and run again",
            other.display()
        ));
    }
    let Some(record) = record else {
        return Ok(Some(name.clone()));
    };
    let owned = record.branch.as_deref() == Some(name) || record.owned.contains(name);
    if owned || !exists(name) {
        return Ok(Some(name.clone()));
    }
    Err(format!(
        "HEAD names {name}, but this worktree's sandboxed runs own {}: an earlier run may have \
         left HEAD there (or was killed before the check after it). On the host, `git switch \
         {}` (or `git checkout --detach`) and run again",
        record.branch.as_deref().unwrap_or("no branch"),
        record
            .branch
            .as_deref()
            .and_then(|b| b.strip_prefix("refs/heads/"))
            .unwrap_or("<branch>"),
    ))
}

/// The worktree whose `HEAD` names `branch`, among the repository's worktrees at `common`
/// other than the one with git dir `ours` (read from the files: `<common>/HEAD` for the main
/// worktree, `<common>/worktrees/*/HEAD` and `gitdir` for the linked ones).
pub fn checked_out_elsewhere(common: &Path, ours: &Path, branch: &str) -> Option<PathBuf> {
    let names = |dir: &Path| {
        std::fs::read_to_string(dir.join("HEAD"))
            .is_ok_and(|head| Head::parse(&head) == Head::Branch(branch.to_string()))
    };
    if !is_bare(common) && names(common) {
        return Some(common.parent().unwrap_or(common).to_path_buf());
    }
    let entries = std::fs::read_dir(common.join("worktrees")).ok()?;
    for entry in entries.flatten() {
        let dir = entry.path();
        if dir == ours || !names(&dir) {
            continue;
        }
        let at = std::fs::read_to_string(dir.join("gitdir"))
            .ok()
            .map(|g| PathBuf::from(g.trim_end()))
            .and_then(|g| g.parent().map(Path::to_path_buf))
            .unwrap_or(dir);
        return Some(at);
    }
    None
}

fn is_bare(common: &Path) -> bool {
    git2::Config::open(&common.join("config"))
        .and_then(|c| c.get_bool("core.bare"))
        .unwrap_or(false)
}

/// Where the record of the worktree with git dir `gitdir` lives in `dir`.
pub fn record_path(dir: &Path, gitdir: &Path) -> PathBuf {
    use sha2::Digest;
    use std::os::unix::ffi::OsStrExt;
    // Not a secret, only a file name: the record itself names its git dir.
    let hash = sha2::Sha256::digest(gitdir.as_os_str().as_bytes());
    let hex: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
    let name: String = gitdir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(40)
        .collect();
    dir.join(format!("{name}-{hex}.json"))
}

/// Where the records of the push remotes of the worktree with git dir `gitdir` live (one
/// record per remote, keyed by the remote's git dir).
pub fn push_record_dir(dir: &Path, gitdir: &Path) -> PathBuf {
    record_path(&dir.join("push"), gitdir).with_extension("")
}

impl TaskRecord {
    /// The record of `gitdir` in `dir`, if one exists and is for that git dir.
    pub fn load(dir: &Path, gitdir: &Path) -> Option<TaskRecord> {
        let text = std::fs::read(record_path(dir, gitdir)).ok()?;
        serde_json::from_slice::<TaskRecord>(&text)
            .ok()
            .filter(|r| r.gitdir == gitdir)
    }

    /// Writes the record into `dir` (created 0700), as a new file renamed into place.
    pub fn save(&self, dir: &Path) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let mut file = tempfile::NamedTempFile::new_in(dir)?;
        file.write_all(&serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?)?;
        file.persist(record_path(dir, &self.gitdir))
            .map_err(|e| e.error)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> TaskRecord {
        TaskRecord {
            gitdir: "/repo/.git/worktrees/t".into(),
            branch: Some("refs/heads/task".into()),
            owned: ["refs/heads/side".to_string()].into(),
            stash: Default::default(),
        }
    }

    fn branch(name: &str) -> Head {
        Head::Branch(format!("refs/heads/{name}"))
    }

    #[test]
    fn the_task_branch_comes_from_the_record_not_from_head_alone() {
        let exists =
            |n: &str| ["refs/heads/main", "refs/heads/task", "refs/heads/side"].contains(&n);
        let nowhere = |_: &str| None;
        let r = record();
        let decide = |head: &Head| decide(Some(&r), head, exists, nowhere);
        assert_eq!(decide(&branch("task")), Ok(Some("refs/heads/task".into())));
        assert_eq!(decide(&branch("side")), Ok(Some("refs/heads/side".into())));
        assert_eq!(
            decide(&branch("future")),
            Ok(Some("refs/heads/future".into())),
            "a commit would create it"
        );
        assert_eq!(decide(&Head::Detached), Ok(Some("refs/heads/task".into())));
        assert_eq!(decide(&Head::Other), Ok(None));
        // Parked on main (a SIGKILLed run), or on a branch that exists now.
        let refused = decide(&branch("main")).unwrap_err();
        assert!(refused.contains("git switch task"), "{refused}");
        // The first run takes HEAD's branch.
        assert_eq!(
            super::decide(None, &branch("main"), exists, nowhere),
            Ok(Some("refs/heads/main".into()))
        );
        // Checked out in another worktree: refused, record or not.
        let there = |n: &str| (n == "refs/heads/side").then(|| PathBuf::from("/other"));
        for r in [None, Some(&r)] {
            let e = super::decide(r, &branch("side"), exists, there).unwrap_err();
            assert!(e.contains("/other"), "{e}");
        }
    }

    #[test]
    fn head_parsing() {
        assert_eq!(Head::parse("ref: refs/heads/a\n"), branch("a"));
        assert_eq!(
            Head::parse(&format!("{}\n", "a".repeat(40))),
            Head::Detached
        );
        assert_eq!(Head::parse("ref: refs/tags/v1\n"), Head::Other);
        assert_eq!(Head::parse("ref: refs/heads/../x\n"), Head::Other);
    }

    #[test]
    fn the_record_round_trips_and_is_keyed_by_git_dir() {
        let dir = tempfile::tempdir().unwrap();
        let r = record();
        r.save(dir.path()).unwrap();
        assert_eq!(TaskRecord::load(dir.path(), &r.gitdir), Some(r.clone()));
        assert_eq!(TaskRecord::load(dir.path(), Path::new("/other/.git")), None);
    }
}
