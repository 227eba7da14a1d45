//! One command armed for a backend: spawned with pipes or on a pseudo-terminal, then finished
//! once every process of it is gone.

use std::path::PathBuf;
use std::sync::Arc;

use sandbox_exec::{
    ChildSetup, CommandSpec, DirectChild, ExecError, ExitOutcome, PtyOptions, Running, SpawnOptions,
};
use sandbox_policy::GitLayout;
use serde::Serialize;

use super::BackendKind;
use crate::error::HostError;
use crate::gitguard::{self, Tampering};
use crate::nono::{self, StartMarker};
use sandbox_git::quarantine::{LiveQuarantine, QuarantineError, StoreReport};

/// How a backend tells its own failure from the command's exit status.
#[derive(Debug)]
pub enum CommandJudge {
    /// The command's status is its own.
    Plain,
    /// nono's trampoline leaves this mark once the sandbox is in place: no mark after the
    /// run means nono failed before the command started.
    StartMarker(Arc<StartMarker>),
    /// A custom launcher: an unsuccessful exit is reported as the launcher's (a launcher is
    /// opaque: it may have refused, or run the command which failed).
    Launcher(PathBuf),
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
    /// The supervisor's side of the command's network namespace (native), ended in
    /// [`Self::finish`] once its processes are gone.
    net: Option<Box<dyn crate::net::CommandNetwork>>,
}

impl std::fmt::Debug for PreparedCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedCommand")
            .field("kind", &self.kind)
            .field("spec", &self.spec)
            .field("setup", &self.setup.as_ref().map(|s| s.name().to_string()))
            .field("judge", &self.judge)
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
    /// What to check again once the orphans are gone: set when other commands still ran as
    /// this one ended, so its orphans could not be killed yet
    /// ([`crate::run::Reaper::reap_when_idle`]).
    pub recheck: Option<Recheck>,
    /// Every connection the run's domain proxy answered, allowed or refused (empty without
    /// one): for `--report-json` and the daemon's `exit` event.
    pub connections: Vec<sandbox_net::Connection>,
}

/// The checks after a run that an orphan could undo, kept to run again once it is gone
/// ([`crate::run::recheck`]): the git pointers, and the audit of the worktree's own git dir.
#[derive(Debug, Clone)]
pub struct Recheck {
    pub git: GitLayout,
    gitdir: Option<gitguard::GitDirAtStart>,
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
        lines
    }
}

/// `extensions.worktreeConfig` appeared during the run: git then reads a per-worktree config
/// file the sandbox could write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorktreeConfigEnabled {
    pub config: PathBuf,
    pub worktree_config: PathBuf,
}

impl std::fmt::Display for WorktreeConfigEnabled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "extensions.worktreeConfig was enabled in {} during the run; check {} before using \
             git here",
            self.config.display(),
            self.worktree_config.display()
        )
    }
}

impl Finished {
    /// The run's exit status: 125 when the backend failed before the command started, else
    /// the command's own (the rule is [`crate::run::Outcome::status`]).
    pub fn exit_code(&self, outcome: ExitOutcome) -> i32 {
        self.outcome(Ok(outcome)).status().code
    }

    /// The one exit outcome of this run, from what waiting for the command gave: the backend's
    /// failure first (nothing ran), then the command's own end or why it could not start.
    pub fn outcome(&self, waited: Result<ExitOutcome, &ExecError>) -> crate::run::Outcome {
        use crate::run::Outcome;
        match (&self.end, waited) {
            (RunEnd::SetupFailed(_), _) => Outcome::SetupFailed,
            (_, Ok(outcome)) => Outcome::from(outcome),
            (_, Err(e)) => Outcome::not_started(e),
        }
    }

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
            git,
            net: None,
        }
    }

    /// Gives the command its network namespace's relay, ended in [`Self::finish`].
    pub fn with_net(mut self, net: Option<Box<dyn crate::net::CommandNetwork>>) -> Self {
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

    /// What the run journal keeps of this command's after-run checks: the layout whose
    /// pointers are checked, the git dir at the start, whether it has a git store quarantine
    /// (none for `host`, which checks nothing).
    pub(crate) fn journal_parts(
        &self,
    ) -> Option<(&GitLayout, Option<&gitguard::GitDirAtStart>, bool)> {
        let git = self.git.as_ref()?;
        Some((git, self.gitdir.as_ref(), self.store.is_some()))
    }

    /// The git layout whose pointers [`Self::finish`] checks (none for `host`).
    pub fn git(&self) -> Option<&GitLayout> {
        self.git.as_ref()
    }

    /// A short name of what runs, for messages.
    pub fn display_program(&self) -> String {
        self.spec.display_program()
    }

    /// Spawns the command with pipes (or inherited stdio) as `options` say; the backend's
    /// child setup replaces any in `options`. Must be called inside a tokio runtime.
    pub(crate) fn spawn(&self, mut options: SpawnOptions) -> Result<Running, ExecError> {
        options.setup = self.setup.clone();
        sandbox_exec::spawn(&self.spec, options)
    }

    /// Spawns the command with inherited (or null) stdio and no async runtime, for a caller
    /// that only waits for it (`sandbox run`): see [`sandbox_exec::direct`].
    pub(crate) fn spawn_direct(&self, mut options: SpawnOptions) -> Result<DirectChild, ExecError> {
        options.setup = self.setup.clone();
        sandbox_exec::spawn_direct(&self.spec, options)
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
                RunEnd::SetupFailed(nono::setup_failed(status, marker))
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
                gitguard::worktree_config_enabled_since(git).then(|| WorktreeConfigEnabled {
                    config: git.common_dir.join("config"),
                    worktree_config: git.worktree_gitdir.join("config.worktree"),
                }),
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
        let git_dir = match (&self.git, &self.gitdir) {
            (Some(git), Some(start)) => {
                gitguard::audit_gitdir(start, &|name| gitguard::may_own_ref(git, name, report))
            }
            _ => gitguard::GitDirReport::default(),
        };
        drop(self.keep);
        // Every process of the command is gone: no new connection can come.
        let connections = self.net.map(|net| net.finish()).unwrap_or_default();
        let recheck = match (&self.git, complete) {
            (Some(git), false) => Some(Recheck {
                git: git.clone(),
                gitdir: self.gitdir.clone(),
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
            recheck,
            connections,
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
        std::fs::create_dir(&main).unwrap();
        sandbox_testkit::git(&main, &["init", "-q", "-b", "trunk"]);
        sandbox_testkit::git(&main, &["commit", "-q", "--allow-empty", "-m", "init"]);
        let task = dir.path().join("task");
        sandbox_testkit::git(
            &main,
            &[
                "worktree",
                "add",
                "-q",
                task.to_str().unwrap(),
                "-b",
                "task",
            ],
        );
        let policy = sandbox_policy::build(sandbox_policy::PolicyRequest {
            workdir: task.clone(),
            ..Default::default()
        })
        .unwrap();
        let git = policy.workspace.git.clone().unwrap();
        let recheck = Recheck {
            gitdir: gitguard::GitDirAtStart::read(&git),
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
