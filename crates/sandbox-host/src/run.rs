//! The run sequence, in one place for every caller: `sandbox run`, `sandbox shell`,
//! `sandbox exec` and the daemon's `box.create` / `box.exec` all start commands through here.
//!
//! ```text
//!  assemble ─► prepare ─► arm ─► spawn ─► (wait) ─► reap ─► finish
//!  Assembled    Run       Armed   Live      caller   Reaped   Finished ─► Outcome ─► ExitStatus
//! ```
//!
//! 1. **assemble** ([`crate::assembly::assemble`]): trusted defaults plus one request make the
//!    [`Policy`] and the private TMPDIR ([`Assembled`]).
//! 2. **prepare** ([`Run::prepare`]): the policy is checked against the trusted places and the
//!    backend of the registry ([`Backends`]) prepares what outlives one command (a compiled
//!    ruleset, a manifest, a VM). A [`Run`] is that prepared sandbox: one per `sandbox run`,
//!    one per daemon box, any number of commands in it.
//! 3. **arm** ([`Run::arm`]): one command resolved, with the one child environment
//!    ([`crate::assembly::command_env`]) and timeout, wrapped by the backend ([`Armed`]).
//! 4. **spawn** ([`Armed::spawn`], [`Armed::spawn_direct`], [`Armed::run_interactive`]):
//!    consumes the armed command and gives the child and a [`Live`] command. A command that
//!    could not start is finished on the spot ([`NotStarted`]): none of its processes exist.
//!    A VM box's command is *launched* in its guest instead ([`Armed::launch`]): channels for
//!    its output, stdin and signals, and its end as the guest reports it.
//! 5. **reap** ([`Reaper`]): once the command's process group is gone (the caller waited),
//!    every orphan that left the group is killed. Only this gives a [`Reaped`] token.
//! 6. **finish** ([`Live::finish`]): takes the token, so it cannot be called while a
//!    descendant could still rewrite a git pointer: judges the backend's failure, checks and
//!    restores the git pointers, syncs the git store, releases the command's files. A guest's
//!    command is finished with its end as the guest reported it ([`Live::finish_guest`]).
//!
//! The exit status of every runner — the CLI's exit code, the daemon's `exit` events, a VM
//! box's guest results — comes from one [`Outcome`] through one rule, [`Outcome::status`].
//!
//! # Where a new run step goes
//!
//! Each step is written once, here or in the seam the step names, and every caller gets it:
//!
//! | the step needs…                                   | add it in                          |
//! | ------------------------------------------------- | ---------------------------------- |
//! | a policy field (a private home, a limit)           | [`crate::assembly::assemble`]      |
//! | a variable every command sees                      | [`crate::assembly::command_env`]   |
//! | a per-box resource (a network namespace, a VM)     | [`Run::prepare`] / the backend's `prepare` |
//! | a per-command resource (a cgroup, a pid namespace) | [`Run::arm`] (kept in the [`Armed`] command), applied in [`Armed::spawn`]'s child setup |
//! | something to kill or collect when it ends          | [`Reaper`] (before the token exists) |
//! | a check after the run (a pointer, a report)        | [`Live::finish`], and its record in [`crate::aftercare::journal`] (done at the next start if the supervisor is killed) |
//!
//! A caller never orders these itself: it holds a [`Run`], arms, spawns, waits, reaps and
//! finishes — and the types allow no other order.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sandbox_exec::{
    CommandRequest, CommandSpec, DirectChild, ExecError, ExitOutcome, Running, SpawnOptions,
};
pub use sandbox_exec::{ExitStatus, Outcome};
use sandbox_policy::Policy;

use crate::aftercare::journal::Entry as JournalEntry;
pub use crate::aftercare::journal::Recovered;
use crate::assembly::tmpdir::PrivateTmpdir;
use crate::assembly::{self, Assembled, CommandIdentity};
use crate::error::HostError;
use crate::kind::BackendKind;
use crate::report::Enforcement;
use crate::seam::{
    BackendOptions, BackendSession, Backends, Finished, GuestExit, GuestGit, GuestProcess,
    PreparedCommand, Progress, RunEnd,
};

/// A prepared sandbox: the policy, the backend session every command runs in, and the
/// private TMPDIR (removed when the run is dropped or [closed](Run::close)).
///
/// [`Run::prepare`] is the only way to make one: a session prepared anywhere else (outside
/// the registry's backend, the trusted-place checks and the journal's recovery before it)
/// cannot become a run, so no command of a box is armed or finished here unless the box was
/// prepared through the seam. Neither wrapping a session nor building the struct compiles:
///
/// ```compile_fail,E0599
/// use std::sync::Arc;
/// use sandbox_host::{BackendKind, BackendSession, Run};
/// fn adopt(kind: BackendKind, policy: sandbox_policy::Policy, s: Arc<dyn BackendSession>) -> Run {
///     Run::adopt(kind, policy, s)
/// }
/// ```
///
/// ```compile_fail,E0451
/// use std::sync::Arc;
/// use sandbox_host::{BackendKind, BackendSession, Run};
/// fn build(kind: BackendKind, policy: sandbox_policy::Policy, session: Arc<dyn BackendSession>) -> Run {
///     Run { kind, policy, session, ..unimplemented!() }
/// }
/// ```
///
/// ```
/// use sandbox_host::assembly::Assembled;
/// use sandbox_host::seam::LogProgress;
/// use sandbox_host::{BackendKind, BackendOptions, Backends, HostError, Run};
/// fn prepare(
///     backends: &Backends,
///     kind: BackendKind,
///     assembled: Assembled,
///     options: &BackendOptions,
/// ) -> Result<Run, HostError> {
///     Run::prepare(backends, kind, assembled, options, &LogProgress)
/// }
/// ```
pub struct Run {
    kind: BackendKind,
    policy: Policy,
    session: Arc<dyn BackendSession>,
    tmpdir: Option<PrivateTmpdir>,
    /// The claim on the private home's cache layers, released when the run ends.
    _home: Option<crate::assembly::home::HomeGuard>,
    /// Where each command's record of its after-run checks is kept ([`crate::aftercare::journal`]).
    journal: Option<PathBuf>,
    /// The checks of killed runs of this worktree, done before this one prepared.
    recovered: Vec<Recovered>,
    /// What this machine offers for resource limits, and the run's limits on it.
    machine: sandbox_policy::compile::limits::Machine,
    limits: sandbox_policy::compile::limits::LimitsPlan,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("kind", &self.kind)
            .field("workspace", &self.policy.workspace.root)
            .finish()
    }
}

/// One command to arm in a [`Run`].
#[derive(Debug, Clone)]
pub struct Invocation<'a> {
    pub argv: Vec<OsString>,
    /// Where it starts (already checked to lie inside the workspace or a grant); the
    /// policy's working directory when `None`.
    pub cwd: Option<PathBuf>,
    /// Who runs it (`SANDBOX_TASK`, `SANDBOX_BOX`, the hook endpoint).
    pub who: &'a CommandIdentity,
    /// `NAME=VALUE` pairs of this command only (a `box.exec`'s `env`).
    pub extra_env: &'a [(String, String)],
    /// Overrides the policy's timeout.
    pub timeout: Option<Duration>,
}

impl Run {
    /// Steps 1–2: checks the assembled policy and prepares `kind` from `backends` for it
    /// (exit 125 when the boundary cannot be set up). The private TMPDIR of the assembly
    /// lives as long as the run.
    pub fn prepare(
        backends: &Backends,
        kind: BackendKind,
        assembled: Assembled,
        options: &BackendOptions,
        progress: &dyn Progress,
    ) -> Result<Run, HostError> {
        let Assembled {
            policy,
            tmpdir,
            home,
            ..
        } = assembled;
        // Before anything else: the checks a killed run of this worktree never did.
        let journal = crate::privdir::ensure("run journal", &options.private_dir())
            .ok()
            .map(|dir| dir.join(crate::aftercare::journal::DIR));
        let recovered = journal
            .as_deref()
            .map(|dir| crate::aftercare::journal::recover(dir, &policy.workspace.root))
            .unwrap_or_default();
        // The cgroups of killed runs (any worktree's: a group is no worktree's).
        if let Some(dir) = &journal {
            crate::limits::recover(dir);
        }
        if let Some(home) = &policy.fs.home {
            crate::assembly::home::check_cap(home)?;
        }
        // The resource limits fail closed before anything is prepared.
        let machine = if crate::limits::on_host_kernel(kind) {
            let machine = crate::limits::probe();
            // The groups of killed runs whose journal is gone (another project's, a deleted
            // state directory): their names say whose they were.
            crate::limits::sweep(&machine);
            crate::limits::for_run(machine, kind, options)
        } else {
            Default::default()
        };
        let limits = crate::limits::plan_for(&policy, kind, &machine);
        crate::limits::check(&limits, kind, options.allow_degraded)?;
        let session = backends.prepare(kind, &policy, options, progress)?;
        Ok(Run {
            kind,
            policy,
            session,
            tmpdir,
            _home: home,
            journal,
            recovered,
            machine,
            limits,
        })
    }

    /// The backend's own session, when it is a `T`: the daemon boots, stops and removes a
    /// BoxLite box through its `sandbox_boxlite::session::BoxSession`. `None` for a session
    /// of another type.
    pub fn session<T: BackendSession>(&self) -> Option<Arc<T>> {
        let session: Arc<dyn std::any::Any + Send + Sync> = self.session.clone();
        session.downcast::<T>().ok()
    }

    /// The run's resource limits, each with the mechanism that enforces it on this machine
    /// (or why none can).
    pub fn limits(&self) -> &sandbox_policy::compile::limits::LimitsPlan {
        &self.limits
    }

    /// The after-run checks of killed runs of this worktree, done when this run prepared
    /// (report them: [`Recovered::lines`]).
    pub fn recovered(&self) -> &[Recovered] {
        &self.recovered
    }

    pub fn kind(&self) -> BackendKind {
        self.kind
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// What this run enforces (gaps only when degraded runs were allowed).
    pub fn enforcement(&self) -> &Enforcement {
        self.session.enforcement()
    }

    /// Whether its commands run in a guest (a VM box): armed here, then launched there
    /// ([`Armed::launch`]).
    pub fn runs_in_guest(&self) -> bool {
        self.session.runs_in_guest()
    }

    /// Step 3: `command` resolved, with the child's environment and timeout, armed by the
    /// backend. Fails with [`HostError::Command`] (126/127) when the program cannot run,
    /// [`HostError::Env`] for a malformed variable.
    pub fn arm(&self, command: Invocation<'_>) -> Result<Armed, HostError> {
        let cwd = command
            .cwd
            .unwrap_or_else(|| self.policy.workspace.cwd.clone());
        let mut spec = CommandSpec::new(CommandRequest::Argv(command.argv), &cwd)?;
        if let Some(agent) = &self.policy.agent {
            crate::assembly::agent::insert_args(
                agent,
                &self.policy.credentials,
                self.session.proxy_address().as_deref(),
                &mut spec,
            );
        }
        spec.env = if self.session.runs_in_guest() {
            assembly::guest_env(command.extra_env)
        } else {
            assembly::command_env(
                &self.policy,
                self.kind,
                command.who,
                command.extra_env,
                std::env::vars_os(),
            )?
        };
        spec.timeout = command.timeout.or(self.policy.limits.timeout);
        let mut command = self.session.command(spec)?;
        // The repositories in the worktree before the command: beside the journal, the last
        // command's walk, so only what changed since is read again.
        let walks = self
            .journal
            .as_deref()
            .and_then(Path::parent)
            .map(|dir| dir.join(crate::aftercare::gitguard::NESTED_WALKS));
        command.scan_nested(walks.as_deref());
        // The git repositories the agent profile keeps writable and the host's agent runs git
        // in, and the files host tools run: audited after the command (not under `host`,
        // which confines nothing).
        if self.kind != BackendKind::Host {
            command.agent_repos = self
                .policy
                .agent
                .as_ref()
                .map(|a| a.git_audited())
                .unwrap_or_default();
            command.scan_host_files(&self.policy);
        }
        // The command's cgroups, named in the journal before they exist; its child joins
        // them before anything else.
        let groups =
            crate::limits::Groups::create(&self.limits, &self.machine, self.journal.as_deref())?;
        command.cgroups = groups.as_ref().and_then(|g| g.join());
        // Where no cgroup can be had: RLIMIT_NPROC in the command's own user namespace.
        command.process_rlimit = self.limits.process_rlimit();
        // The record exists before any process of the command does.
        let journal = match (&self.journal, command.journal_parts()) {
            (Some(dir), Some(checks)) => Some(
                crate::aftercare::journal::begin(dir, &self.policy.workspace.root, checks)
                    .map_err(|e| HostError::PrivateDir {
                        backend: "run journal",
                        path: dir.clone(),
                        cause: format!("writing the record of the command's after-run checks: {e}"),
                    })?,
            ),
            _ => None,
        };
        Ok(Armed {
            command,
            journal,
            groups,
        })
    }

    /// Removes the private TMPDIR now (dropping the run does too, silently).
    pub fn close(mut self) -> std::io::Result<()> {
        match self.tmpdir.take() {
            Some(tmp) => tmp.close(),
            None => Ok(()),
        }
    }
}

/// A command armed for its backend, not started yet.
#[derive(Debug)]
pub struct Armed {
    command: PreparedCommand,
    /// Removed once the command finished (or never started).
    journal: Option<JournalEntry>,
    /// The command's cgroups, removed once it finished (or never started).
    groups: Option<crate::limits::Groups>,
}

/// Why [`Armed::spawn`] started nothing, and the command already finished (none of its
/// processes exists, so nothing needs reaping).
#[derive(Debug)]
pub struct NotStarted {
    pub error: ExecError,
    pub finished: Box<Finished>,
}

impl Armed {
    /// What actually runs (the backend may have wrapped it), for `--guard-args` and logs.
    pub fn spec(&self) -> &CommandSpec {
        &self.command.spec
    }

    pub fn kind(&self) -> BackendKind {
        self.command.kind
    }

    /// A short name of what runs, for messages.
    pub fn display_program(&self) -> String {
        self.command.display_program()
    }

    fn live(self) -> Live {
        Live {
            command: self.command,
            journal: self.journal,
            groups: self.groups,
        }
    }

    fn not_started(self, error: ExecError) -> NotStarted {
        NotStarted {
            error,
            finished: Box::new(self.command.finish(None, true)),
        }
    }

    /// Step 4, with pipes (or inherited stdio) as `options` say, inside a tokio runtime; the
    /// backend's child setup replaces any in `options`.
    pub fn spawn(self, options: SpawnOptions) -> Result<(Running, Live), NotStarted> {
        match self.command.spawn(options) {
            Ok(running) => Ok((running, self.live())),
            Err(e) => Err(self.not_started(e)),
        }
    }

    /// Step 4 with inherited (or null) stdio and no async runtime, for a caller that only
    /// waits (`sandbox run`, `sandbox exec`): see [`sandbox_exec::direct`].
    pub fn spawn_direct(self, options: SpawnOptions) -> Result<(DirectChild, Live), NotStarted> {
        match self.command.spawn_direct(options) {
            Ok(child) => Ok((child, self.live())),
            Err(e) => Err(self.not_started(e)),
        }
    }

    /// Steps 4–6 for a caller that runs one command at a time and only waits for it
    /// (`sandbox run`, `sandbox exec`): spawned as [`Armed::spawn_direct`], waited for with
    /// `wait`, its orphans reaped by `reaper`, finished.
    pub fn run_direct(
        self,
        options: SpawnOptions,
        reaper: &Reaper,
        wait: impl FnOnce(&mut DirectChild) -> Result<ExitOutcome, ExecError>,
    ) -> (Result<ExitOutcome, ExecError>, Finished) {
        match self.spawn_direct(options) {
            Ok((mut child, live)) => {
                let waited = wait(&mut child);
                drop(child);
                let finished = live.finish(waited.as_ref().ok().copied(), reaper.reap());
                (waited, finished)
            }
            Err(NotStarted { error, finished }) => (Err(error), *finished),
        }
    }

    /// Step 4 for a command of a VM box ([`PreparedCommand::runs_in_guest`]): started in its
    /// guest by the backend, with a stdin to write to when `stdin`. Its end comes from the
    /// guest ([`GuestProcess::exit`]) and is finished with [`Live::finish_guest`].
    pub async fn launch(self, stdin: bool) -> Result<(GuestProcess, Live), HostError> {
        let launched = self.command.launch(stdin).await;
        launched.map(|process| (process, self.live()))
    }

    /// Whether this command runs in a guest ([`Armed::launch`]) rather than on this host.
    pub fn runs_in_guest(&self) -> bool {
        self.command.runs_in_guest()
    }

    /// Step 4 and the wait: the command on a fresh pseudo-terminal relayed to ours, until it
    /// exits (`sandbox shell`).
    pub async fn run_interactive(
        self,
        kill_grace: Option<Duration>,
    ) -> (Result<ExitOutcome, ExecError>, Live) {
        let waited = self.command.run_interactive(kill_grace).await;
        (waited, self.live())
    }
}

/// A command that was started. The only way on is [`Live::finish`], with the [`Reaped`]
/// token that reaping its orphans gives.
#[derive(Debug)]
#[must_use = "a started command is finished with `Live::finish` once its orphans are reaped"]
pub struct Live {
    command: PreparedCommand,
    journal: Option<JournalEntry>,
    groups: Option<crate::limits::Groups>,
}

impl Live {
    /// Step 6: judges the run, checks and restores the git pointers, syncs the git store and
    /// releases the command's files. When other commands still ran while this one's orphans
    /// were reaped ([`Reaper::reap_when_idle`]), [`Finished::recheck`] names the git layout to
    /// check again once they are gone ([`recheck`]).
    pub fn finish(self, outcome: Option<ExitOutcome>, reaped: Reaped) -> Finished {
        // The counters first, while the groups exist (every process of the command is gone).
        let limits = self.groups.as_ref().map(|g| g.report());
        let mut finished = self.command.finish(outcome, reaped.complete);
        finished.limits = limits;
        // Removed with any process still in them (an orphan the daemon could not reap yet).
        drop(self.groups);
        // The checks are done: the record goes.
        drop(self.journal);
        finished
    }

    /// Step 6 for a command that ran in a guest ([`Armed::launch`]), once the guest reported
    /// its end (`exit`): none of its processes is this host's, so there is nothing here to
    /// reap; a command the guest lost is the box's failure (125). `git` is what the host took
    /// back of the box's git writes when this command ended its busy period.
    pub fn finish_guest(self, exit: &GuestExit, git: Option<GuestGit>) -> Finished {
        let finished = self.command.finish_guest(exit, git);
        drop(self.journal);
        finished
    }
}

/// Proof that every process of a command is gone: its group (the caller waited for it) and
/// every orphan that left it — or, where other commands still run, as many as could be told
/// apart (see [`Reaper::reap_when_idle`]). Only a [`Reaper`] makes one: finishing a command
/// before reaping does not compile.
///
/// ```compile_fail
/// fn finish_early(live: sandbox_host::Live) -> sandbox_host::Finished {
///     live.finish(None, sandbox_host::Reaped { complete: true })
/// }
/// ```
///
/// ```
/// fn finish_after_reaping(
///     live: sandbox_host::Live,
///     reaper: &sandbox_host::Reaper,
/// ) -> sandbox_host::Finished {
///     live.finish(None, reaper.reap())
/// }
/// ```
#[derive(Debug)]
#[must_use = "pass it to `Live::finish`"]
pub struct Reaped {
    complete: bool,
}

/// Step 5: kills what is left of commands once they ended. Orphans (double fork + `setsid`)
/// re-parent to this process because it is a child subreaper.
#[derive(Debug)]
pub struct Reaper(());

impl Reaper {
    /// Makes this process a child subreaper, so orphaned descendants of its commands can be
    /// found and killed. A failure is logged: orphans then re-parent to init, out of reach.
    pub fn install() -> Reaper {
        if let Err(e) = sandbox_exec::process_group::become_subreaper() {
            tracing::debug!(error = %e, "could not become a child subreaper");
        }
        Reaper(())
    }

    /// For a process that runs one command at a time (the CLI), once the command's group is
    /// gone: kills and reaps every child left.
    pub fn reap(&self) -> Reaped {
        sandbox_exec::process_group::kill_orphans(&[]);
        Reaped { complete: true }
    }

    /// For a process that runs many commands (the daemon): orphans are killed only when no
    /// other command runs (`idle`), since an orphan of one cannot be told from another's
    /// children. When not idle, the finished command names its git layout to check again
    /// ([`Finished::recheck`]) after the next idle sweep.
    pub fn reap_when_idle(&self, idle: bool) -> Reaped {
        if idle {
            sandbox_exec::process_group::kill_orphans(&[]);
        }
        Reaped { complete: idle }
    }
}

/// Checks the git pointers and the worktree's own git dir again (restoring and setting
/// aside what an orphan changed) after an idle sweep killed the orphans of commands that
/// ended while others ran; one line per finding.
pub fn recheck(recheck: &crate::seam::Recheck) -> Vec<String> {
    recheck.run()
}

impl HostError {
    /// The exit status a runner reports for this error: the command's own 126/127 when it
    /// cannot run at all ([`HostError::Command`]), otherwise 125 (the boundary could not be set
    /// up; nothing ran). Decided from the type, never from the text.
    pub fn exit_code(&self) -> i32 {
        match self {
            HostError::Command(e) => Outcome::not_started(e).status().code,
            _ => Outcome::SetupFailed.status().code,
        }
    }
}

impl Finished {
    /// The one exit outcome of this run, from what waiting for the command gave: the backend's
    /// failure first (nothing ran), then the command's own end or why it could not start.
    pub fn outcome(&self, waited: Result<ExitOutcome, &ExecError>) -> Outcome {
        match (&self.end, waited) {
            (RunEnd::SetupFailed(_), _) => Outcome::SetupFailed,
            (_, Ok(outcome)) => Outcome::from(outcome),
            (_, Err(e)) => Outcome::not_started(e),
        }
    }
}
