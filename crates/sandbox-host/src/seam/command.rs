//! One command armed for a backend: spawned with pipes or on a pseudo-terminal, then finished
//! once every process of it is gone.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sandbox_exec::{
    ChildSetup, CommandSpec, DirectChild, ExecError, ExitOutcome, PtyOptions, Running, SpawnOptions,
};
use sandbox_policy::GitLayout;

use super::guest::{GuestExit, GuestFuture, GuestGit, GuestLaunch, GuestProcess};
use super::BackendKind;
pub use crate::aftercare::gitguard::WorktreeConfigEnabled;
use crate::aftercare::gitguard::{self, Tampering};
use crate::aftercare::hostfiles::{self, HostFilesAtStart, HostFilesReport};
use crate::error::HostError;
use sandbox_git::quarantine::{LiveQuarantine, QuarantineError, StoreReport};

/// How a backend tells its own failure from the command's exit status.
#[derive(Debug)]
pub enum CommandJudge {
    /// The command's status is its own.
    Plain,
    /// nono's trampoline leaves this mark once the sandbox is in place: no mark after the
    /// run means nono failed before the command started.
    StartMarker(Arc<dyn StartMark>),
    /// A custom launcher: an unsuccessful exit is reported as the launcher's (a launcher is
    /// opaque: it may have refused, or run the command which failed).
    Launcher(PathBuf),
}

/// The mark a backend's trampoline leaves once its boundary is in place (nono's): without
/// it, the command's exit status is the backend's failure, not the command's.
pub trait StartMark: Send + Sync + std::fmt::Debug {
    /// Whether the mark was left.
    fn fired(&self) -> bool;
    /// The backend's failure, for a command that exited with `status` and left no mark.
    fn setup_failed(&self, status: i32) -> HostError;
}

/// A command's own network (the native backend's namespace and domain proxy), ended with
/// the command.
pub trait CommandNetwork: Send + Sync + std::fmt::Debug {
    /// Once every process of the command is gone: stops relaying, and gives the domain
    /// proxy's log of every connection it answered.
    fn finish(&self) -> Vec<sandbox_net::Connection>;
}

/// A command ready to run under a backend.
pub struct PreparedCommand {
    pub kind: BackendKind,
    /// What actually runs (the backend may have wrapped it: nono, a launcher, sandbox-exec).
    pub spec: CommandSpec,
    pub setup: Option<Arc<dyn ChildSetup>>,
    judge: CommandJudge,
    /// The git pointers to check after the run (none for the host backend, which confines
    /// nothing).
    git: Option<GitLayout>,
    /// Files that must exist until the command is gone (kept alive, removed on finish).
    keep: Vec<Arc<dyn Send + Sync>>,
    /// The git store quarantine of this command (native with the private view).
    store: Option<LiveQuarantine>,
    /// The quarantines of the push remotes (`--allow-push`).
    pushes: Vec<(PathBuf, LiveQuarantine)>,
    /// The worktree's `HEAD` when the quarantined command started.
    head: Option<gitguard::HeadAtStart>,
    /// The worktree's own git dir when the command was prepared (a linked worktree's).
    gitdir: Option<gitguard::GitDirAtStart>,
    /// The repositories inside the worktree when the command was prepared.
    nested: Option<gitguard::NestedAtStart>,
    /// The agent profile's `audit: git` paths: the git repositories the host's agent runs git
    /// in, audited in [`Self::finish`] ([`crate::run::Run::arm`] sets them, except for the
    /// host backend, which confines nothing).
    pub(crate) agent_repos: Vec<PathBuf>,
    /// The files host tools run, as they were when the command was armed.
    hostfiles: Option<HostFilesAtStart>,
    /// The supervisor's side of the command's network namespace (native), ended in
    /// [`Self::finish`] once its processes are gone.
    net: Option<Box<dyn CommandNetwork>>,
    /// The run's cgroups (the resource limits), joined by the child first
    /// ([`crate::run::Run::arm`] sets them).
    pub(crate) cgroups: Option<Arc<sandbox_exec::JoinCgroups>>,
    /// The run's process limit as `RLIMIT_NPROC` in the command's own user namespace, where
    /// no cgroup can be had ([`crate::run::Run::arm`] sets it from the limits plan).
    pub(crate) process_rlimit: Option<u64>,
    /// Where a command of a VM box is started instead of being forked here: its guest.
    guest: Option<Arc<dyn GuestLaunch>>,
}

impl std::fmt::Debug for PreparedCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedCommand")
            .field("kind", &self.kind)
            .field("spec", &self.spec)
            .field("setup", &self.setup.as_ref().map(|s| s.name().to_string()))
            .field("judge", &self.judge)
            .field("guest", &self.guest.is_some())
            .finish()
    }
}

/// How a run ended, as far as the backend can tell.
#[derive(Debug)]
pub enum RunEnd {
    /// The command ran; the outcome is its own.
    Command,
    /// The backend failed before the command started: nothing ran (exit 125).
    SetupFailed(HostError),
    /// The custom launcher (or the command it ran — a launcher is opaque) ended unsuccessfully.
    Launcher {
        launcher: PathBuf,
        outcome: ExitOutcome,
    },
}

/// What [`PreparedCommand::finish`] found.
#[derive(Debug)]
pub struct Finished {
    pub end: RunEnd,
    /// Git pointers the command changed, each restored (or reported as not restorable).
    pub tampering: Vec<Tampering>,
    /// `extensions.worktreeConfig` was switched on in the common config during the run.
    pub worktree_config_enabled: Option<WorktreeConfigEnabled>,
    /// What the git store quarantine applied and refused (when the run had one), or why its
    /// last sync failed.
    pub git_store: Option<Result<StoreReport, QuarantineError>>,
    /// The same for each push remote (`--allow-push`).
    pub git_push: Vec<(PathBuf, Result<StoreReport, QuarantineError>)>,
    /// What the check of the worktree's own git dir set aside and noticed.
    pub git_dir: gitguard::GitDirReport,
    /// The repositories the run created in the worktree (set aside unless
    /// `--allow-nested-git`), and `.git` files it re-pointed (restored).
    pub nested_git: gitguard::NestedReport,
    /// The files host tools run that the run created (set aside), changed or removed (put
    /// back), each naming the grant that would have allowed it.
    pub host_files: HostFilesReport,
    /// What to check again once the orphans are gone: set when other commands still ran as
    /// this one ended, so its orphans could not be killed yet
    /// ([`crate::run::Reaper::reap_when_idle`]).
    pub recheck: Option<Recheck>,
    /// Every connection the run's domain proxy answered, allowed or refused (empty without
    /// one): for `--report-json` and the daemon's `exit` event.
    pub connections: Vec<sandbox_net::Connection>,
    /// The command's resource limits and what its cgroups counted (set by
    /// [`crate::run::Live::finish`]; none where no limit was enforced).
    pub limits: Option<crate::limits::LimitsReport>,
    /// For a command that ran in a guest: what the guest said about its end (its agent's
    /// message, or the timeout's); `None` for a command of this host.
    pub guest: Option<GuestNote>,
    /// The backend's own lines about the run (a box's `HEAD` or index not taken back).
    pub notes: Vec<String>,
}

/// What a guest said about a command's end ([`Finished::guest`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestNote(pub Option<String>);

/// The checks after a run that an orphan could undo, kept to run again once it is gone
/// ([`crate::run::recheck`]): the git pointers, and the audit of the worktree's own git dir.
#[derive(Debug, Clone)]
pub struct Recheck {
    pub git: GitLayout,
    gitdir: Option<gitguard::GitDirAtStart>,
    nested: Option<gitguard::NestedAtStart>,
    agent_repos: Vec<PathBuf>,
    hostfiles: Option<HostFilesAtStart>,
    /// The run's store report (which refs a stopped rebase may move).
    store: Option<StoreReport>,
}

impl Recheck {
    /// Checks again and restores; one line per finding.
    pub fn run(&self) -> Vec<String> {
        let mut lines: Vec<String> = gitguard::check_and_restore(&self.git)
            .iter()
            .map(ToString::to_string)
            .collect();
        if let Some(start) = &self.gitdir {
            let report = self.store.as_ref();
            let audit = gitguard::audit_gitdir(start, &|name| {
                gitguard::may_own_ref(&self.git, name, report)
            });
            lines.extend(audit.warnings());
        }
        if let Some(start) = &self.nested {
            lines.extend(gitguard::audit_nested(start).warnings());
        }
        lines.extend(gitguard::audit_agent_repos(&self.agent_repos).warnings());
        if let Some(start) = &self.hostfiles {
            lines.extend(hostfiles::audit_host_files(start).warnings());
        }
        lines
    }
}

impl Finished {
    /// The error that ended the run before the command started, if any.
    pub fn setup_error(&self) -> Option<&HostError> {
        match &self.end {
            RunEnd::SetupFailed(e) => Some(e),
            _ => None,
        }
    }

    /// Lines for the user, in one wording for every runner: the launcher's failure, each
    /// pointer repair, the worktreeConfig warning.
    pub fn warnings(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if let RunEnd::Launcher { launcher, outcome } = &self.end {
            let how = match outcome {
                ExitOutcome::Signaled(sig) => format!("was killed by signal {sig}"),
                other => format!("exited with status {}", other.code()),
            };
            lines.push(format!(
                "custom: the launcher {} {how} (a launcher exits non-zero to refuse; either way \
                 nothing ran outside it)",
                launcher.display()
            ));
        }
        lines.extend(self.tampering.iter().map(ToString::to_string));
        lines.extend(self.worktree_config_enabled.iter().map(ToString::to_string));
        match &self.git_store {
            Some(Ok(report)) => lines.extend(report.warnings()),
            Some(Err(e)) => lines.push(format!(
                "{e}; the run's commits may not have reached the repository"
            )),
            None => {}
        }
        for (remote, report) in &self.git_push {
            match report {
                Ok(report) => lines.extend(report.remote_warnings(remote)),
                Err(e) => lines.push(format!(
                    "git push to {}: {e}; what the run pushed may not have reached it",
                    remote.display()
                )),
            }
        }
        lines.extend(self.git_dir.warnings());
        lines.extend(self.nested_git.warnings());
        lines.extend(self.host_files.warnings());
        lines.extend(self.notes.iter().cloned());
        lines
    }
}

impl PreparedCommand {
    /// A command of a backend implemented outside this crate (Lima): `spec` is what runs on
    /// the host (`limactl shell …`), judged plainly; `git` is the layout whose pointers are
    /// checked afterwards.
    pub fn external(kind: BackendKind, spec: CommandSpec, git: Option<GitLayout>) -> Self {
        Self::new(kind, spec, None, CommandJudge::Plain, git)
    }

    /// A command of a VM box: `spec` is what runs in the guest (its program, arguments,
    /// working directory in the guest, its own variables and timeout), started by `guest`
    /// ([`crate::run::Armed::launch`]), judged plainly. No git pointer of the host is in
    /// the guest's reach, so none is checked after it.
    pub fn guest(kind: BackendKind, spec: CommandSpec, guest: Arc<dyn GuestLaunch>) -> Self {
        let mut command = Self::new(kind, spec, None, CommandJudge::Plain, None);
        command.guest = Some(guest);
        command
    }

    /// Whether this command runs in a guest (started with [`Self::launch`], not spawned).
    pub fn runs_in_guest(&self) -> bool {
        self.guest.is_some()
    }

    pub(crate) fn new(
        kind: BackendKind,
        spec: CommandSpec,
        setup: Option<Arc<dyn ChildSetup>>,
        judge: CommandJudge,
        git: Option<GitLayout>,
    ) -> Self {
        PreparedCommand {
            kind,
            spec,
            setup,
            judge,
            keep: Vec::new(),
            store: None,
            pushes: Vec::new(),
            head: None,
            gitdir: git.as_ref().and_then(gitguard::GitDirAtStart::read),
            // Scanned once the run arms it ([`Self::scan_nested`]), with its cache.
            nested: None,
            agent_repos: Vec::new(),
            hostfiles: None,
            git,
            net: None,
            cgroups: None,
            process_rlimit: None,
            guest: None,
        }
    }

    /// Gives the command its network namespace's relay, ended in [`Self::finish`].
    pub fn with_net(mut self, net: Option<Box<dyn CommandNetwork>>) -> Self {
        self.net = net;
        self
    }

    /// Gives the command its git store quarantine, finished in [`Self::finish`].
    pub fn with_store(mut self, store: Option<LiveQuarantine>) -> Self {
        self.head = store
            .as_ref()
            .and(self.git.as_ref())
            .and_then(gitguard::HeadAtStart::read);
        self.store = store;
        self
    }

    /// Gives the command the quarantines of its push remotes, finished in [`Self::finish`].
    pub fn with_pushes(mut self, pushes: Vec<(PathBuf, LiveQuarantine)>) -> Self {
        self.pushes = pushes;
        self
    }

    /// Keeps `value` (a private file, a session's manifest) alive until [`Self::finish`].
    pub fn keeping(mut self, value: Arc<dyn Send + Sync>) -> Self {
        self.keep.push(value);
        self
    }

    /// Records the repositories inside the worktree before the command starts (what
    /// [`Self::finish`] compares with), reading only what changed since the last command's
    /// audit kept in `cache` (a directory of [`crate::privdir`]). [`crate::run::Run::arm`]
    /// calls it for every command, before the journal's record.
    pub(crate) fn scan_nested(&mut self, cache: Option<&Path>) {
        self.nested = self
            .git
            .as_ref()
            .and_then(|git| gitguard::NestedAtStart::scan(git, cache));
    }

    /// Records the files host tools run in `policy`'s worktree before the command starts
    /// (what [`Self::finish`] compares with). [`crate::run::Run::arm`] calls it for every
    /// backend but `host`, which confines nothing.
    pub(crate) fn scan_host_files(&mut self, policy: &sandbox_policy::Policy) {
        self.hostfiles = HostFilesAtStart::scan(policy);
    }

    /// What the run journal keeps of this command's after-run checks: the layout whose
    /// pointers are checked, the git dir at the start, whether it has a git store quarantine
    /// (none for `host`, which checks nothing).
    pub(crate) fn journal_parts(&self) -> Option<crate::aftercare::journal::Checks<'_>> {
        let git = self.git.as_ref()?;
        Some(crate::aftercare::journal::Checks {
            layout: git,
            gitdir: self.gitdir.as_ref(),
            nested: self.nested.as_ref(),
            agent_repos: &self.agent_repos,
            hostfiles: self.hostfiles.as_ref(),
            quarantined: self.store.is_some(),
        })
    }

    /// The git layout whose pointers [`Self::finish`] checks (none for `host`).
    pub fn git(&self) -> Option<&GitLayout> {
        self.git.as_ref()
    }

    /// A short name of what runs, for messages.
    pub fn display_program(&self) -> String {
        self.spec.display_program()
    }

    /// A guest's command is not a child of this process: refused by the host spawns.
    fn on_host(&self) -> Result<(), ExecError> {
        match self.guest {
            None => Ok(()),
            Some(_) => Err(ExecError::InvalidRequest(
                HostError::RunsInGuest { backend: self.kind }.to_string(),
            )),
        }
    }

    /// Spawns the command with pipes (or inherited stdio) as `options` say; the backend's
    /// child setup replaces any in `options`. Must be called inside a tokio runtime.
    pub(crate) fn spawn(&self, mut options: SpawnOptions) -> Result<Running, ExecError> {
        self.on_host()?;
        options.setup = self.setup.clone();
        options.cgroups = self.cgroups.clone();
        options.process_rlimit = self.process_rlimit;
        sandbox_exec::spawn(&self.spec, options)
    }

    /// Spawns the command with inherited (or null) stdio and no async runtime, for a caller
    /// that only waits for it (`sandbox run`): see [`sandbox_exec::direct`].
    pub(crate) fn spawn_direct(&self, mut options: SpawnOptions) -> Result<DirectChild, ExecError> {
        self.on_host()?;
        options.setup = self.setup.clone();
        options.cgroups = self.cgroups.clone();
        options.process_rlimit = self.process_rlimit;
        sandbox_exec::spawn_direct(&self.spec, options)
    }

    /// Starts a guest's command through its backend ([`GuestLaunch`]). The future borrows
    /// nothing of the command.
    pub(crate) fn launch(&self, stdin: bool) -> GuestFuture<Result<GuestProcess, HostError>> {
        match &self.guest {
            Some(guest) => guest.launch(self.spec.clone(), stdin),
            None => {
                let refused = HostError::Command(ExecError::InvalidRequest(format!(
                    "{}: this command runs on this host; spawn it",
                    self.kind
                )));
                Box::pin(std::future::ready(Err(refused)))
            }
        }
    }

    /// Judges a guest's command by how it ended there: lost means the box failed (125).
    /// `git`: what the host took back of the box's git writes, when this command ended a
    /// busy period.
    pub(crate) fn finish_guest(self, exit: &GuestExit, git: Option<GuestGit>) -> Finished {
        let (outcome, note, lost) = match exit {
            GuestExit::Ended { outcome, note } => (Some(*outcome), note.clone(), None),
            GuestExit::Lost(cause) => (None, None, Some(cause.clone())),
        };
        let kind = self.kind;
        let mut finished = self.finish(outcome, true);
        if let Some(cause) = lost {
            finished.end = RunEnd::SetupFailed(HostError::GuestLost {
                backend: kind,
                cause,
            });
        }
        finished.guest = Some(GuestNote(note));
        if let Some(git) = git {
            finished.git_store = Some(git.store);
            finished.notes = git.notes;
        }
        finished
    }

    /// Runs the command on a fresh pseudo-terminal relayed to ours, until it exits. The shell
    /// dies with the spawning thread (`PR_SET_PDEATHSIG`): drive this future on a thread
    /// that lives as long as the session (the CLI's main thread, a current-thread runtime).
    pub(crate) async fn run_interactive(
        &self,
        kill_grace: Option<std::time::Duration>,
    ) -> Result<ExitOutcome, ExecError> {
        sandbox_exec::run_interactive(
            &self.spec,
            PtyOptions {
                setup: self.setup.clone(),
                kill_grace,
                die_with_parent: true,
                cgroups: self.cgroups.clone(),
                process_rlimit: self.process_rlimit,
            },
        )
        .await
    }

    /// Judges the run and cleans up. Called only by [`crate::run::Live::finish`], which takes
    /// the token that proves every process of the command is gone (its process group and any
    /// orphan that left it): a descendant still running could rewrite a pointer after the
    /// check.
    ///
    /// `complete`: every orphan is known gone; if not, [`Finished::recheck`] keeps what to
    /// check again once it is.
    pub(crate) fn finish(self, outcome: Option<ExitOutcome>, complete: bool) -> Finished {
        let end = match (&self.judge, outcome) {
            (CommandJudge::StartMarker(marker), Some(ExitOutcome::Exited(status)))
                if !marker.fired() =>
            {
                RunEnd::SetupFailed(marker.setup_failed(status))
            }
            (CommandJudge::Launcher(launcher), Some(outcome))
                if matches!(outcome, ExitOutcome::Exited(c) if c != 0)
                    || matches!(outcome, ExitOutcome::Signaled(_)) =>
            {
                RunEnd::Launcher {
                    launcher: launcher.clone(),
                    outcome,
                }
            }
            _ => RunEnd::Command,
        };
        let (mut tampering, worktree_config_enabled) = match &self.git {
            Some(git) => (
                gitguard::check_and_restore(git),
                gitguard::worktree_config_enabled(git),
            ),
            None => (Vec::new(), None),
        };
        // After every process is gone, nothing writes the layer any more: this sync is final.
        // The push remotes first: the store's remote-tracking refs follow what they applied.
        let git_push = self
            .pushes
            .into_iter()
            .map(|(remote, store)| (remote, store.finish()))
            .collect();
        let git_store = self.store.map(|store| store.finish());
        // With the store synced, `HEAD` may name a branch the run created.
        let report = git_store.as_ref().and_then(|r| r.as_ref().ok());
        if let (Some(git), Some(head), Some(report)) = (&self.git, &self.head, report) {
            tampering.extend(gitguard::check_head(head, git, report));
        }
        let mut git_dir = match (&self.git, &self.gitdir) {
            (Some(git), Some(start)) => {
                gitguard::audit_gitdir(start, &|name| gitguard::may_own_ref(git, name, report))
            }
            _ => gitguard::GitDirReport::default(),
        };
        // The agent's own repositories (its checkpoints, its snapshots), under the same report.
        let agent = gitguard::audit_agent_repos(&self.agent_repos);
        git_dir.set_aside.extend(agent.set_aside);
        git_dir.notes.extend(agent.notes);
        // After the git dir's own checks: a gitlink they set aside is not found again here.
        let nested_git = self
            .nested
            .as_ref()
            .map(gitguard::audit_nested)
            .unwrap_or_default();
        let host_files = self
            .hostfiles
            .as_ref()
            .map(hostfiles::audit_host_files)
            .unwrap_or_default();
        drop(self.keep);
        // Every process of the command is gone: no new connection can come.
        let connections = self.net.map(|net| net.finish()).unwrap_or_default();
        let recheck = match (&self.git, complete) {
            (Some(git), false) => Some(Recheck {
                git: git.clone(),
                gitdir: self.gitdir.clone(),
                nested: self.nested.clone(),
                agent_repos: self.agent_repos.clone(),
                hostfiles: self.hostfiles.clone(),
                store: report.cloned(),
            }),
            _ => None,
        };
        Finished {
            end,
            tampering,
            worktree_config_enabled,
            git_store,
            git_push,
            git_dir,
            nested_git,
            host_files,
            recheck,
            connections,
            limits: None,
            guest: None,
            notes: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link an orphan plants in the worktree's git dir after its command's check (the
    /// daemon could not kill it yet: other commands ran) is set aside by the recheck, as
    /// the check itself would have.
    #[test]
    fn the_recheck_audits_the_git_dir_again() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("main");
        let task = dir.path().join("task");
        sandbox_testkit::linked_worktree_on(&main, &task, "trunk", "task");
        let policy = sandbox_policy::build(sandbox_policy::PolicyRequest {
            workdir: task.clone(),
            ..Default::default()
        })
        .unwrap();
        let git = policy.workspace.git.clone().unwrap();
        let recheck = Recheck {
            gitdir: gitguard::GitDirAtStart::read(&git),
            nested: None,
            agent_repos: Vec::new(),
            hostfiles: None,
            git: git.clone(),
            store: None,
        };
        assert_eq!(recheck.run(), Vec::<String>::new(), "nothing to find yet");
        let victim = dir.path().join("bashrc");
        std::fs::write(&victim, "# mine\n").unwrap();
        let planted = git.worktree_gitdir.join("COMMIT_EDITMSG");
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let lines = recheck.run();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("COMMIT_EDITMSG"), "{lines:?}");
        assert!(planted.symlink_metadata().is_err(), "the link is set aside");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "# mine\n");
    }
}
