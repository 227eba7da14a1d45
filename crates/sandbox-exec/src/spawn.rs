//! Starting a child: resolve, admit, fork, set up the session and the sandbox in the child,
//! exec — and own the child until its whole process group is gone.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;
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
use crate::resolve::resolve_program;
use crate::spec::CommandSpec;
use crate::status::ExitOutcome;

/// Work done in the forked child right before `exec`: applying Landlock, seccomp and the like.
///
/// Everything that can allocate or fail for ordinary reasons must happen when the value is
/// built, in the parent. [`ChildSetup::apply_in_child`] runs between `fork` and `exec` of a
/// possibly multi-threaded parent, where only async-signal-safe calls are sound: no allocation,
/// no locks, no `tracing`.
pub trait ChildSetup: Send + Sync {
    /// Applies the setup to the calling (child) process. Returns the step that failed and
    /// its errno; the command is then not executed and the spawn fails with
    /// [`ExecError::Setup`], naming that step.
    fn apply_in_child(&self) -> Result<(), SetupFailure>;

    /// A short name for messages ("landlock+seccomp").
    fn name(&self) -> &str;

    /// The descriptors beyond stdio that the command inherits on purpose (a start marker on
    /// fd 3), as they are numbered once [`ChildSetup::apply_in_child`] has run. Every other
    /// descriptor is closed at exec ([`crate::prelude`]). Read in the child: return a slice
    /// held by `self`, never a fresh allocation.
    fn passed_fds(&self) -> &[RawFd] {
        &[]
    }

    /// What item `detail` of `step` was (a mount and its path), for the parent's message.
    fn describe(&self, _step: SetupStep, _detail: u32) -> Option<String> {
        None
    }

    /// Whether [`ChildSetup::apply_in_child`] moves the command into a new pid namespace
    /// (it unshares `CLONE_NEWPID`; Linux). The prelude then starts the namespace's init
    /// and the command as processes of their own ([`crate::prelude`]), and runs
    /// [`ChildSetup::apply_in_namespace`] in the command's.
    fn pid_namespace(&self) -> bool {
        false
    }

    /// The rest of the setup, run in the command's own process inside the pid namespace
    /// (what needs to be a process of it: mounting its `/proc`; then Landlock and seccomp).
    /// Only called when [`ChildSetup::pid_namespace`] is true. Async-signal safe.
    fn apply_in_namespace(&self) -> Result<(), SetupFailure> {
        Ok(())
    }
}

/// A step of the work done between fork and exec, named so that a failure says which one
/// failed. Sent from the child to the parent as a number (the child cannot allocate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum SetupStep {
    /// `setsid(2)`: the child's own session and process group.
    NewSession = 1,
    /// `PR_SET_PDEATHSIG`, and the check that the parent still lives.
    ParentDeathSignal = 2,
    /// `TIOCSCTTY`: the pseudo-terminal as controlling terminal.
    ControllingTerminal = 3,
    /// Dropping every capability (as root).
    DropCapabilities = 4,
    /// `PR_SET_NO_NEW_PRIVS`.
    NoNewPrivs = 5,
    /// `landlock_restrict_self(2)`.
    LandlockRestrictSelf = 6,
    /// Loading a seccomp program.
    SeccompLoad = 7,
    /// Putting a backend's start-marker descriptor in place (nono).
    StartMarker = 8,
    /// `unshare(CLONE_NEWUSER | CLONE_NEWNS)` for the private view.
    UserNamespace = 10,
    /// Writing `/proc/self/{setgroups,uid_map,gid_map}`.
    IdMap = 11,
    /// Building the private view: a mount, a mount point, a link.
    ViewMount = 12,
    /// Entering the view's root (`chroot`).
    PivotRoot = 13,
    /// Returning to the working directory inside the view.
    WorkingDirectory = 14,
    /// `landlock_add_rule` for a path that exists only inside the view (the git store's
    /// overlay).
    LandlockAddRule = 15,
    /// Marking every descriptor not passed on purpose close-on-exec.
    CloseDescriptors = 16,
    /// Starting the pid namespace's init and the command inside it.
    PidNamespace = 17,
    /// Mounting the pid namespace's own `/proc` in the view.
    ProcMount = 18,
    /// Bringing up `lo` in the run's network namespace.
    NetLoopback = 19,
    /// Binding the network namespace's listeners on `127.0.0.1` and handing them to the
    /// supervisor (detail: the port).
    NetListeners = 20,
    /// A setup step of a caller's own.
    Other = 9,
}

impl SetupStep {
    pub fn as_str(self) -> &'static str {
        match self {
            SetupStep::NewSession => "setsid (a new session)",
            SetupStep::ParentDeathSignal => "PR_SET_PDEATHSIG",
            SetupStep::ControllingTerminal => "TIOCSCTTY (the pty as controlling terminal)",
            SetupStep::DropCapabilities => "dropping capabilities",
            SetupStep::NoNewPrivs => "PR_SET_NO_NEW_PRIVS",
            SetupStep::LandlockRestrictSelf => "landlock_restrict_self",
            SetupStep::SeccompLoad => "loading the seccomp filter",
            SetupStep::StartMarker => "the start-marker descriptor",
            SetupStep::UserNamespace => "unshare (user and mount namespaces)",
            SetupStep::IdMap => "writing the uid/gid maps",
            SetupStep::ViewMount => "building the private view",
            SetupStep::PivotRoot => "entering the private view's root",
            SetupStep::WorkingDirectory => "entering the working directory in the view",
            SetupStep::LandlockAddRule => "landlock_add_rule (the git store overlay)",
            SetupStep::CloseDescriptors => "closing the inherited descriptors",
            SetupStep::PidNamespace => "starting the pid namespace's init",
            SetupStep::ProcMount => "mounting the pid namespace's /proc",
            SetupStep::NetLoopback => "bringing up lo in the network namespace",
            SetupStep::NetListeners => {
                "binding the network namespace's listeners and handing them over"
            }
            SetupStep::Other => "child setup",
        }
    }

    fn from_u32(n: u32) -> SetupStep {
        [
            SetupStep::NewSession,
            SetupStep::ParentDeathSignal,
            SetupStep::ControllingTerminal,
            SetupStep::DropCapabilities,
            SetupStep::NoNewPrivs,
            SetupStep::LandlockRestrictSelf,
            SetupStep::SeccompLoad,
            SetupStep::StartMarker,
            SetupStep::UserNamespace,
            SetupStep::IdMap,
            SetupStep::ViewMount,
            SetupStep::PivotRoot,
            SetupStep::WorkingDirectory,
            SetupStep::LandlockAddRule,
            SetupStep::CloseDescriptors,
            SetupStep::PidNamespace,
            SetupStep::ProcMount,
            SetupStep::NetLoopback,
            SetupStep::NetListeners,
        ]
        .into_iter()
        .find(|s| *s as u32 == n)
        .unwrap_or(SetupStep::Other)
    }
}

impl std::fmt::Display for SetupStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which step of a [`ChildSetup`] failed, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetupFailure {
    pub step: SetupStep,
    pub errno: Errno,
    /// Which item of the step (a mount's index in the setup's own list), for
    /// [`ChildSetup::describe`]; 0 when the step has one item.
    pub detail: u32,
}

impl SetupFailure {
    /// Async-signal safe: reads `errno` only.
    pub fn last(step: SetupStep) -> Self {
        SetupFailure {
            step,
            errno: Errno::last(),
            detail: 0,
        }
    }

    /// A report as read from the pipe.
    pub(crate) fn from_raw(step: u32, errno: i32, detail: u32) -> Self {
        SetupFailure {
            step: SetupStep::from_u32(step),
            errno: Errno::from_raw(errno),
            detail,
        }
    }

    /// For `map_err`: tags an errno with its step.
    pub fn at(step: SetupStep) -> impl Fn(Errno) -> SetupFailure {
        move |errno| SetupFailure {
            step,
            errno,
            detail: 0,
        }
    }
}

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
    let prelude = Prelude::new(
        &report,
        options.die_with_parent,
        options.setup.clone(),
        ExecImage::new(spec, &resolved)?,
    );
    // SAFETY: the closure runs in the forked child before exec; the prelude only makes
    // async-signal-safe calls (see crate::prelude). `prelude` was built before fork and is
    // only read here.
    unsafe {
        cmd.pre_exec(move || prelude.run_reporting());
    }

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

/// A pipe whose two ends are close-on-exec (and non-blocking when asked). Linux creates it
/// so atomically (`pipe2`); elsewhere (macOS) the flags are set right after `pipe`, so a fork
/// on another thread in between could inherit the ends until its exec.
pub(crate) fn cloexec_pipe(nonblocking: bool) -> Result<(OwnedFd, OwnedFd), Errno> {
    use nix::fcntl::OFlag;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        let flags = if nonblocking {
            OFlag::O_CLOEXEC | OFlag::O_NONBLOCK
        } else {
            OFlag::O_CLOEXEC
        };
        nix::unistd::pipe2(flags)
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        use nix::fcntl::{fcntl, FcntlArg, FdFlag};
        let (read, write) = nix::unistd::pipe()?;
        for fd in [&read, &write] {
            fcntl(fd.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
            if nonblocking {
                fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
            }
        }
        Ok((read, write))
    }
}

/// The step number sent through the report pipe when `execve` itself failed: the errno is
/// then the exec's, classified as the command's own (126/127), not the sandbox's.
pub(crate) const EXEC_FAILED: u32 = u32::MAX;

/// A raw report as the error it stands for, and the setup failure when it was one (not
/// the exec's own).
pub(crate) fn reported_error(
    reported: Option<(u32, i32, u32)>,
) -> (std::io::Error, Option<SetupFailure>) {
    match reported {
        None => (std::io::Error::other("the child exited before exec"), None),
        Some((EXEC_FAILED, errno, _)) => (std::io::Error::from_raw_os_error(errno), None),
        Some((step, errno, detail)) => (
            std::io::Error::from_raw_os_error(errno),
            Some(SetupFailure::from_raw(step, errno, detail)),
        ),
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

/// A CLOEXEC pipe through which the child says "my setup failed", so that a Landlock failure
/// (exit 125) is never mistaken for "command not found" (127) with the same errno.
pub(crate) struct SetupReport {
    read: OwnedFd,
    write: OwnedFd,
}

impl SetupReport {
    pub(crate) fn new() -> Result<Self, ExecError> {
        let (read, write) = cloexec_pipe(false)
            .map_err(|e| ExecError::io("creating the setup report pipe", e.into()))?;
        Ok(SetupReport { read, write })
    }

    pub(crate) fn write_fd(&self) -> RawFd {
        self.write.as_raw_fd()
    }

    /// Child side: reports `failure` to the parent and returns the error that makes the
    /// spawn fail. Async-signal safe.
    pub(crate) fn fail(fd: RawFd, failure: SetupFailure) -> std::io::Error {
        Self::send(
            fd,
            failure.step as u32,
            failure.errno as i32,
            failure.detail,
        );
        std::io::Error::from_raw_os_error(failure.errno as i32)
    }

    /// Child side: writes one report (a step number, an errno, the step's item). Async-signal
    /// safe.
    pub(crate) fn send(fd: RawFd, step: u32, errno: i32, detail: u32) {
        let mut bytes = [0u8; 12];
        bytes[..4].copy_from_slice(&step.to_ne_bytes());
        bytes[4..8].copy_from_slice(&errno.to_ne_bytes());
        bytes[8..].copy_from_slice(&detail.to_ne_bytes());
        // SAFETY: write(2) of a 12-byte stack buffer to an fd that is open in the child (it
        // was inherited across fork and is closed by exec only). 12 bytes are below PIPE_BUF,
        // so the write is atomic.
        unsafe {
            libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        }
    }

    /// Parent side, after spawn returned: closes our write end, reads what the child sent,
    /// with the step as sent (a child may send [`EXEC_FAILED`]).
    pub(crate) fn finish_raw(self) -> Option<(u32, i32, u32)> {
        let SetupReport { read, write } = self;
        drop(write);
        let mut bytes = [0u8; 12];
        // The write end is closed in the parent and closed by exec (or exit) in the child, so
        // this read returns 0 or 12 bytes without blocking once spawn has returned.
        let n = nix::unistd::read(read.as_raw_fd(), &mut bytes).unwrap_or(0);
        let word = |i: usize| -> [u8; 4] { [bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]] };
        (n == 12).then(|| {
            (
                u32::from_ne_bytes(word(0)),
                i32::from_ne_bytes(word(4)),
                u32::from_ne_bytes(word(8)),
            )
        })
    }
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
