//! Starting a child: resolve, admit, fork, set up the session and the sandbox in the child,
//! exec — and own the child until its whole process group is gone.

use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::ExecError;
use crate::output::{self, OutputChunk, OutputLimits, OutputObserver, OutputReceiver, StreamKind};
use crate::policy::CommandPolicy;
use crate::prelude::{ExecImage, Prelude};
use crate::process_group;
use crate::report::{reported_error, SetupReport};
use crate::resolve::resolve_program;
use crate::spec::CommandSpec;
use crate::status::ExitOutcome;

/// The hook and its failures, where they were first defined (the crate's root re-exports them
/// too).
pub use crate::setup::{ChildSetup, SetupFailure, SetupStep};

/// Where the child's stdin comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StdinMode {
    Inherit,
    Piped,
    Null,
}

/// Where the child's stdout and stderr go.
#[derive(Debug, Clone, Copy)]
pub enum OutputMode {
    /// Straight to our own stdout/stderr: zero copies, bytes untouched.
    Inherit,
    /// Through the bounded lossless path (and the observer path).
    Capture(OutputLimits),
    Null,
}

/// How to spawn.
#[derive(Clone)]
pub struct SpawnOptions {
    pub stdin: StdinMode,
    pub output: OutputMode,
    pub setup: Option<Arc<dyn ChildSetup>>,
    /// Admission policy consulted before anything is spawned.
    pub policy: Option<Arc<dyn CommandPolicy>>,
    /// Time between SIGTERM and SIGKILL when the group is terminated.
    pub kill_grace: Duration,
    /// How long output is still drained after the child exited (a descendant may hold the
    /// pipe open forever; this bounds the wait).
    pub drain_timeout: Duration,
    /// Kill the child (SIGKILL) if the spawning *thread* dies (`PR_SET_PDEATHSIG`), so that a
    /// crashed or `kill -9`ed owner does not leave it running. Only for owners that spawn from
    /// a thread living as long as the run (the CLI's main thread), never from a pool thread.
    pub die_with_parent: bool,
    /// The run's cgroups, joined by the child before any other step (the resource limits).
    pub cgroups: Option<Arc<crate::cgroups::JoinCgroups>>,
    /// The run's process limit as `RLIMIT_NPROC` in the user namespace of the setup
    /// (where no cgroup can be had: [`crate::prelude`]).
    pub process_rlimit: Option<u64>,
}

impl Default for SpawnOptions {
    fn default() -> Self {
        SpawnOptions {
            stdin: StdinMode::Inherit,
            output: OutputMode::Inherit,
            setup: None,
            policy: None,
            kill_grace: process_group::DEFAULT_KILL_GRACE,
            drain_timeout: Duration::from_millis(500),
            die_with_parent: false,
            cgroups: None,
            process_rlimit: None,
        }
    }
}

impl std::fmt::Debug for SpawnOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpawnOptions")
            .field("stdin", &self.stdin)
            .field("output", &self.output)
            .field("setup", &self.setup.as_ref().map(|s| s.name().to_string()))
            .field("kill_grace", &self.kill_grace)
            .field("drain_timeout", &self.drain_timeout)
            .field("cgroups", &self.cgroups)
            .field("process_rlimit", &self.process_rlimit)
            .finish()
    }
}

/// Everything a finished `wait_with_output` collected.
#[derive(Debug)]
pub struct Output {
    pub outcome: ExitOutcome,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// True if a descendant still held the pipes open when the drain deadline passed.
    pub drain_cut_short: bool,
}

/// A spawned child. Dropping it terminates the whole process group.
pub struct Running {
    child: Child,
    pid: Pid,
    program: String,
    started: Instant,
    timeout: Option<Duration>,
    kill_grace: Duration,
    drain_timeout: Duration,
    stdin: Option<ChildStdin>,
    output: Option<OutputReceiver>,
    observer: OutputObserver,
    pumps: Vec<JoinHandle<()>>,
    outcome: Option<ExitOutcome>,
}

/// Spawns `spec`. Must be called inside a tokio runtime.
pub fn spawn(spec: &CommandSpec, options: SpawnOptions) -> Result<Running, ExecError> {
    if let Some(policy) = &options.policy {
        policy.admit(spec)?;
    }
    check_cwd(&spec.cwd)?;
    let resolved = resolve_program(&spec.program, spec.env_var("PATH"), &spec.cwd)?;
    let program = spec.display_program();

    let mut cmd = base_command(spec, &resolved);

    cmd.stdin(match options.stdin {
        StdinMode::Inherit => std::process::Stdio::inherit(),
        StdinMode::Piped => std::process::Stdio::piped(),
        StdinMode::Null => std::process::Stdio::null(),
    });
    let (out, err) = match options.output {
        OutputMode::Inherit => (
            std::process::Stdio::inherit(),
            std::process::Stdio::inherit(),
        ),
        OutputMode::Capture(_) => (std::process::Stdio::piped(), std::process::Stdio::piped()),
        OutputMode::Null => (std::process::Stdio::null(), std::process::Stdio::null()),
    };
    cmd.stdout(out).stderr(err);

    let report = SetupReport::new()?;
    let mut prelude = Prelude::new(
        &report,
        options.die_with_parent,
        options.setup.clone(),
        ExecImage::new(spec, &resolved)?,
    );
    prelude.cgroups = options.cgroups.clone();
    prelude.process_rlimit = options.process_rlimit;
    prelude.install(&mut cmd);

    let mut tokio_cmd = tokio::process::Command::from(cmd);
    tokio_cmd.kill_on_drop(false);
    let spawned = tokio_cmd.spawn();
    let reported = report.finish_raw();
    let mut child = match (spawned, reported) {
        (Ok(child), None) => child,
        (Err(e), reported) => {
            let (_, failure) = reported_error(reported);
            return Err(classify_spawn_error(
                e,
                failure,
                &program,
                &resolved,
                options.setup.as_deref(),
            ));
        }
        // The command's process in a pid namespace failed after the split: the proxy
        // exits 127 with it (the runtime reaps it).
        (Ok(child), reported) => {
            if let Some(pid) = child.id() {
                process_group::signal_group(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
            let (error, failure) = reported_error(reported);
            return Err(classify_spawn_error(
                error,
                failure,
                &program,
                &resolved,
                options.setup.as_deref(),
            ));
        }
    };
    let pid = child_pid(&child, &program)?;
    // The child is the proxy of a pid namespace: its init gets the lowest OOM score.
    #[cfg(target_os = "linux")]
    if options.setup.as_ref().is_some_and(|s| s.pid_namespace()) {
        crate::pidns::protect_init_of_proxy(pid.as_raw());
    }
    tracing::debug!(%pid, program = %program, path = %resolved.display(), "spawned");

    let observer = OutputObserver::new(match options.output {
        OutputMode::Capture(l) => l.observer_capacity,
        _ => 1,
    });
    let mut pumps = Vec::new();
    let mut output = None;
    if let OutputMode::Capture(limits) = options.output {
        let (tx, rx) = mpsc::channel(limits.capacity.max(1));
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(ExecError::Spawn {
                program: program.clone(),
                cause: "its stdout and stderr were not piped for capture".into(),
            });
        };
        if let Ok(fd) = stdout.as_fd_owned() {
            output::enlarge_pipe(&fd, 1 << 20);
        }
        if let Ok(fd) = stderr.as_fd_owned() {
            output::enlarge_pipe(&fd, 1 << 20);
        }
        pumps.push(tokio::spawn(output::pump(
            stdout,
            StreamKind::Stdout,
            limits.chunk_size,
            tx.clone(),
            observer.clone(),
        )));
        pumps.push(tokio::spawn(output::pump(
            stderr,
            StreamKind::Stderr,
            limits.chunk_size,
            tx,
            observer.clone(),
        )));
        output = Some(rx);
    }
    let stdin = child.stdin.take();

    Ok(Running {
        child,
        pid,
        program,
        started: Instant::now(),
        timeout: spec.timeout,
        kill_grace: options.kill_grace,
        drain_timeout: options.drain_timeout,
        stdin,
        output,
        observer,
        pumps,
        outcome: None,
    })
}

/// Duplicates the pipe's fd just to resize the pipe; the dup is closed right away.
trait AsFdOwned {
    fn as_fd_owned(&self) -> std::io::Result<OwnedFd>;
}

impl<T: std::os::fd::AsFd> AsFdOwned for T {
    fn as_fd_owned(&self) -> std::io::Result<OwnedFd> {
        self.as_fd().try_clone_to_owned()
    }
}

/// The command for `spec` with its program already resolved: argv kept as given (argv[0] is
/// what the caller wrote, the kernel gets the resolved path), the exact environment, the
/// working directory. Stdio and the pre-exec steps are the caller's.
pub(crate) fn base_command(
    spec: &CommandSpec,
    resolved: &std::path::Path,
) -> std::process::Command {
    let mut cmd = std::process::Command::new(resolved);
    cmd.arg0(&spec.program)
        .args(&spec.args)
        .current_dir(&spec.cwd)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)));
    cmd
}

pub(crate) fn check_cwd(cwd: &std::path::Path) -> Result<(), ExecError> {
    match std::fs::metadata(cwd) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(ExecError::Permission {
            path: cwd.to_path_buf(),
            cause: "working directory is not a directory".into(),
        }),
        Err(e) => Err(ExecError::Permission {
            path: cwd.to_path_buf(),
            cause: format!("working directory unusable: {e}"),
        }),
    }
}

pub(crate) fn classify_spawn_error(
    e: std::io::Error,
    setup_failure: Option<SetupFailure>,
    program: &str,
    resolved: &std::path::Path,
    setup: Option<&dyn ChildSetup>,
) -> ExecError {
    if let Some(failure) = setup_failure {
        return ExecError::Setup {
            program: program.to_string(),
            setup: setup
                .map(|s| s.name())
                .unwrap_or("the exec layer")
                .to_string(),
            step: failure.step,
            what: setup.and_then(|s| s.describe(failure.step, failure.detail)),
            errno: failure.errno as i32,
        };
    }
    match e.raw_os_error() {
        Some(libc::ENOENT) => ExecError::NotFound {
            program: program.to_string(),
            searched: None,
        },
        Some(libc::EACCES) | Some(libc::EPERM) => ExecError::NotExecutable {
            program: program.to_string(),
            cause: format!(
                "permission denied executing {} (the sandbox may not grant it)",
                resolved.display()
            ),
        },
        Some(libc::ENOEXEC) => ExecError::NotExecutable {
            program: program.to_string(),
            cause: "not a valid executable format".into(),
        },
        Some(libc::ETXTBSY) => ExecError::NotExecutable {
            program: program.to_string(),
            cause: "text file busy".into(),
        },
        _ => ExecError::Spawn {
            program: program.to_string(),
            cause: e.to_string(),
        },
    }
}

/// The pid of a child that was just spawned (tokio forgets it only once the child has been
/// reaped, which nothing has done yet).
pub(crate) fn child_pid(child: &tokio::process::Child, program: &str) -> Result<Pid, ExecError> {
    child
        .id()
        .map(|id| Pid::from_raw(id as i32))
        .ok_or_else(|| ExecError::Spawn {
            program: program.to_owned(),
            cause: "the child was reaped before its pid was read".into(),
        })
}

impl Running {
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// The process group (and session) id: equal to the pid, the child leads both.
    pub fn pgid(&self) -> Pid {
        self.pid
    }

    pub fn program(&self) -> &str {
        &self.program
    }

    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.stdin.take()
    }

    /// The lossless output channel (only with [`OutputMode::Capture`]).
    pub fn take_output(&mut self) -> Option<OutputReceiver> {
        self.output.take()
    }

    /// The lossy live view.
    pub fn observer(&self) -> OutputObserver {
        self.observer.clone()
    }

    /// Sends `signal` to the child's whole process group.
    pub fn signal(&self, signal: Signal) {
        if self.outcome.is_none() {
            process_group::signal_group(self.pid, signal);
        }
    }

    fn deadline(&self) -> Option<Instant> {
        self.timeout.map(|t| self.started + t)
    }

    /// Waits for the child to exit (or the deadline), then makes sure its group is gone.
    pub async fn wait(&mut self) -> Result<ExitOutcome, ExecError> {
        if let Some(outcome) = self.outcome {
            return Ok(outcome);
        }
        let outcome = match self.deadline() {
            Some(deadline) => {
                tokio::select! {
                    status = self.child.wait() => ExitOutcome::from_status(
                        status.map_err(|e| ExecError::io(format!("waiting for {}", self.program), e))?),
                    _ = tokio::time::sleep_until(deadline) => {
                        self.kill_after_timeout().await?
                    }
                }
            }
            None => ExitOutcome::from_status(
                self.child
                    .wait()
                    .await
                    .map_err(|e| ExecError::io(format!("waiting for {}", self.program), e))?,
            ),
        };
        self.finish(outcome).await;
        Ok(outcome)
    }

    /// Like [`Running::wait`], relaying SIGINT, SIGTERM and SIGHUP received by this process to
    /// the child's group while waiting. The relay must be installed *before* spawning, or a
    /// signal arriving in between would hit this process's default action instead.
    pub async fn wait_relaying(
        &mut self,
        relay: &mut crate::signals::SignalRelay,
    ) -> Result<ExitOutcome, ExecError> {
        let pid = self.pid;
        let wait = self.wait();
        tokio::pin!(wait);
        loop {
            tokio::select! {
                outcome = &mut wait => return outcome,
                signal = relay.next() => process_group::signal_group(pid, signal),
            }
        }
    }

    async fn kill_after_timeout(&mut self) -> Result<ExitOutcome, ExecError> {
        let after = self.timeout.unwrap_or_default();
        tracing::debug!(pid = %self.pid, ?after, "timeout; terminating group");
        process_group::terminate_group(self.pid, self.kill_grace).await;
        // The leader is dead or SIGKILLed now; collect it so it is not left a zombie.
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        Ok(ExitOutcome::TimedOut(after))
    }

    async fn finish(&mut self, outcome: ExitOutcome) {
        self.outcome = Some(outcome);
        // Descendants left in the group (`sleep 100 &`) do not outlive the run.
        process_group::terminate_group(self.pid, self.kill_grace).await;
    }

    /// Waits for exit while collecting all output. Returns at most `drain_timeout` after the
    /// child exited even if a descendant keeps the pipes open, and never later than the
    /// deadline, whether or not output already ended.
    pub async fn wait_with_output(mut self) -> Result<Output, ExecError> {
        let mut rx = self.output.take().ok_or_else(|| {
            ExecError::InvalidRequest("wait_with_output needs OutputMode::Capture".into())
        })?;
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        let mut exited: Option<ExitOutcome> = None;
        let mut output_open = true;
        let mut drain_cut_short = false;
        let far = Instant::now() + Duration::from_secs(86400 * 365);
        let deadline = self.deadline().unwrap_or(far);
        let mut drain_deadline = far;

        while exited.is_none() || output_open {
            tokio::select! {
                chunk = rx.recv(), if output_open => match chunk {
                    Some(c) => keep(c, &mut stdout, &mut stderr),
                    None => output_open = false,
                },
                status = self.child.wait(), if exited.is_none() => {
                    let status = status
                        .map_err(|e| ExecError::io(format!("waiting for {}", self.program), e))?;
                    exited = Some(ExitOutcome::from_status(status));
                    drain_deadline = Instant::now() + self.drain_timeout;
                }
                _ = tokio::time::sleep_until(deadline), if exited.is_none() => {
                    exited = Some(self.kill_after_timeout().await?);
                    drain_deadline = Instant::now() + self.drain_timeout;
                }
                _ = tokio::time::sleep_until(drain_deadline), if exited.is_some() => {
                    drain_cut_short = true;
                    // Keep what the pumps already forwarded; only the still-open pipe is cut.
                    while let Ok(c) = rx.try_recv() {
                        keep(c, &mut stdout, &mut stderr);
                    }
                    break;
                }
            }
        }
        // The loop ends only once the child exited.
        let Some(outcome) = exited else {
            return Err(ExecError::Spawn {
                program: self.program.clone(),
                cause: "its output ended before its exit was seen".into(),
            });
        };
        self.finish(outcome).await;
        for pump in self.pumps.drain(..) {
            pump.abort();
        }
        Ok(Output {
            outcome,
            stdout,
            stderr,
            drain_cut_short,
        })
    }
}

/// Appends a captured chunk to the buffer of its stream.
fn keep(chunk: OutputChunk, stdout: &mut Vec<u8>, stderr: &mut Vec<u8>) {
    match chunk.stream {
        StreamKind::Stdout => stdout.extend_from_slice(&chunk.data),
        StreamKind::Stderr => stderr.extend_from_slice(&chunk.data),
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for pump in self.pumps.drain(..) {
            pump.abort();
        }
        if self.outcome.is_some() {
            return;
        }
        // Dropped while running: SIGTERM now, SIGKILL after the grace period, off-thread so
        // drop does not block. The runtime reaps the leader (tokio's orphan queue).
        let pgid = self.pid;
        let grace = self.kill_grace;
        process_group::signal_group(pgid, Signal::SIGTERM);
        let _ = std::thread::Builder::new()
            .name("sandbox-exec-reaper".into())
            .spawn(move || process_group::terminate_group_blocking(pgid, grace));
    }
}
