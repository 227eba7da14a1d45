//! Running one command without an async runtime: the path of `sandbox run`, where the CLI
//! starts a command, waits for it and exits. Agents run thousands of short commands, so the
//! per-command cost of the supervisor is the product's latency (BENCHMARKS.md).
//!
//! Two things make it cheaper than [`crate::spawn`]:
//! * the child is started with `clone(CLONE_VM | CLONE_VFORK)`, as `posix_spawn` does: no page
//!   tables are copied and neither side takes copy-on-write faults afterwards. `fork` of the
//!   `sandbox` process costs about a millisecond on a nested-virtualisation host, most of it
//!   page-table work, and a vfork-style child about a third of that;
//! * waiting is a `poll` on a pidfd and on a signal pipe, instead of a Tokio runtime with its
//!   event loop, signal driver and timer.
//!
//! The child keeps every guarantee of [`crate::spawn`]: the same child prelude
//! ([`crate::prelude`]: its own session and process group, `PR_SET_PDEATHSIG`, the
//! [`crate::ChildSetup`] hook, no inherited descriptor beyond stdio), the setup-failure
//! report, the whole group killed at the end and on timeout. Only inherited or null stdio is supported: a caller that
//! needs pipes uses [`crate::spawn`].

use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::error::ExecError;
use crate::prelude::{ExecImage, Handoff, Prelude};
use crate::process_group;
use crate::report::{reported_error, SetupReport};
use crate::resolve::resolve_program;
use crate::setup::{SetupFailure, SetupStep, EXEC_FAILED};
use crate::spawn::{check_cwd, classify_spawn_error, OutputMode, SpawnOptions, StdinMode};
use crate::spec::CommandSpec;
use crate::status::ExitOutcome;
use crate::sys::{self, cloexec_pipe};

/// The child's stack. Only the pages the setup touches are ever allocated; the view's setup
/// keeps a `PATH_MAX` buffer on it, nothing more than a few KiB.
#[cfg(any(target_os = "linux", target_os = "android"))]
const CHILD_STACK: usize = 1 << 20;

/// Relays SIGINT, SIGTERM and SIGHUP received by this process to the running child's group,
/// without a runtime: the handlers write the signal's number to a pipe that
/// [`DirectChild::wait_relaying`] polls. Install it before spawning; once installed these
/// signals no longer end this process, so none is lost before the wait begins.
pub struct SignalPipe {
    read: OwnedFd,
    _write: OwnedFd,
    ids: Vec<signal_hook_registry::SigId>,
}

impl SignalPipe {
    pub fn install() -> Result<Self, ExecError> {
        let (read, write) =
            cloexec_pipe(true).map_err(|e| ExecError::io("creating the signal pipe", e.into()))?;
        let fd = write.as_raw_fd();
        let mut ids = Vec::new();
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // The pipe is non-blocking and lives as long as the registration (both are
            // dropped together). A full pipe drops the byte: the same signal is already
            // waiting to be relayed.
            let id = sys::write_on_signal(signal, fd, signal as u8)
                .map_err(|e| ExecError::io("installing the signal relay", e))?;
            ids.push(id);
        }
        Ok(SignalPipe {
            read,
            _write: write,
            ids,
        })
    }

    /// The signals received since the last call.
    fn drain(&self) -> Vec<Signal> {
        let mut buf = [0u8; 64];
        let mut signals = Vec::new();
        while let Ok(n) = nix::unistd::read(self.read.as_raw_fd(), &mut buf) {
            if n == 0 {
                break;
            }
            signals.extend(
                buf[..n]
                    .iter()
                    .filter_map(|&b| Signal::try_from(i32::from(b)).ok()),
            );
        }
        signals
    }
}

impl Drop for SignalPipe {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook_registry::unregister(id);
        }
    }
}

/// A command started by [`spawn_direct`]. Dropping it before it was waited for kills its
/// whole group and reaps it.
pub struct DirectChild {
    /// The process waited for: the command, or after a pid namespace split the namespace's
    /// init, which exits (once every process of the namespace is gone) after the command.
    pid: Pid,
    /// The process group every process of the run starts in: the child we started leads it
    /// (after a pid namespace split, the command leads its own).
    pgid: Pid,
    /// After a pid namespace split: the command's status, init's stack.
    namespace: std::cell::Cell<Option<Namespace>>,
    /// Readable once the child exited ([`exit_watch`]).
    exited: OwnedFd,
    program: String,
    started: Instant,
    timeout: Option<Duration>,
    kill_grace: Duration,
    outcome: Option<ExitOutcome>,
}

/// A pid namespace handed over by the child ([`crate::pidns`]): the read end of the pipe
/// where init writes the command's wait status before it exits.
#[derive(Debug)]
struct Namespace {
    // Read by crate::pidns, which only Linux has (no pid namespace elsewhere).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    status: OwnedFd,
}

impl Namespace {
    /// After init was reaped: the command's wait status, `None` when init was killed before
    /// it wrote one.
    fn status(&self) -> Option<libc::c_int> {
        #[cfg(target_os = "linux")]
        return crate::pidns::read_status(self.status.as_raw_fd());
        // Elsewhere there is no pid namespace, so nothing is ever handed over.
        #[cfg(not(target_os = "linux"))]
        None
    }
}

/// Everything the child reads, built in the parent: it may not allocate.
struct ChildContext<'a> {
    cwd: &'a CString,
    /// `/dev/null`, dup'ed onto the descriptors in `null_targets`.
    null: RawFd,
    null_targets: [bool; 3],
    prelude: &'a Prelude,
}

fn cstring(bytes: &OsStr, what: &str) -> Result<CString, ExecError> {
    CString::new(bytes.as_bytes())
        .map_err(|_| ExecError::InvalidRequest(format!("{what} contains a NUL byte")))
}

/// Starts `spec` as [`crate::spawn`] does, without a runtime and without copying this
/// process's memory. Only [`StdinMode::Inherit`]/[`StdinMode::Null`] and
/// [`OutputMode::Inherit`]/[`OutputMode::Null`] are supported.
pub fn spawn_direct(spec: &CommandSpec, options: SpawnOptions) -> Result<DirectChild, ExecError> {
    let stdin_null = match options.stdin {
        StdinMode::Inherit => false,
        StdinMode::Null => true,
        StdinMode::Piped => {
            return Err(ExecError::InvalidRequest(
                "spawn_direct: piped stdin needs the async spawn".into(),
            ))
        }
    };
    let output_null = match options.output {
        OutputMode::Inherit => false,
        OutputMode::Null => true,
        OutputMode::Capture(_) => {
            return Err(ExecError::InvalidRequest(
                "spawn_direct: captured output needs the async spawn".into(),
            ))
        }
    };
    if let Some(policy) = &options.policy {
        policy.admit(spec)?;
    }
    check_cwd(&spec.cwd)?;
    let resolved = resolve_program(&spec.program, spec.env_var("PATH"), &spec.cwd)?;
    let program = spec.display_program();

    let cwd = cstring(spec.cwd.as_os_str(), "the working directory")?;
    let null = if stdin_null || output_null {
        Some(
            std::fs::File::options()
                .read(true)
                .write(true)
                .open("/dev/null")
                .map_err(|e| ExecError::io("opening /dev/null", e))?,
        )
    } else {
        None
    };

    let report = SetupReport::new()?;
    let mut prelude = Prelude::new(
        &report,
        options.die_with_parent,
        options.setup.clone(),
        ExecImage::new(spec, &resolved)?,
    );
    prelude.cgroups = options.cgroups.clone();
    prelude.process_rlimit = options.process_rlimit;
    let handoff = std::sync::Arc::new(Handoff::default());
    prelude.handoff = Some(handoff.clone());
    // Where the namespace's init writes the command's status (it has memory of its own).
    let status_pipe = if options.setup.as_ref().is_some_and(|s| s.pid_namespace()) {
        let pipe = cloexec_pipe(true).map_err(|e| ExecError::io("creating a pipe", e.into()))?;
        prelude.status_fd = pipe.1.as_raw_fd();
        Some(pipe)
    } else {
        None
    };
    let context = ChildContext {
        cwd: &cwd,
        null: null.as_ref().map_or(-1, |f| f.as_raw_fd()),
        null_targets: [stdin_null, output_null, output_null],
        prelude: &prelude,
    };
    let cloned = clone_vfork(&context);
    // Our copy of the status pipe's write end: init holds its own.
    let status_read = status_pipe.map(|(read, _write)| read);
    let reported = report.finish_raw();
    drop(null);
    let starter = cloned.map_err(|e| ExecError::Spawn {
        program: program.clone(),
        cause: format!("clone: {e}"),
    })?;
    // After a pid namespace split the child (the starter) has exited, leaving us init (our
    // child now), which reports the command's status (crate::pidns).
    let handed = match (handoff.init(), status_read) {
        (Some(_), Some(status)) => {
            let _ = nix::sys::wait::waitpid(starter, None);
            Some(Namespace { status })
        }
        _ => None,
    };
    let command = handoff.command.load(std::sync::atomic::Ordering::SeqCst);
    // The process we wait for: init after a split, else the command itself.
    let pid = handoff.init().map_or(starter, Pid::from_raw);
    // The group we signal: the command leads its own after a split (when it is already gone,
    // nothing is left to signal but the starter's, now empty, group).
    let pgid = if command > 0 {
        Pid::from_raw(command)
    } else {
        starter
    };
    if let Some(raw) = reported {
        // The child exited without exec; collect it (and end its namespace).
        if handed.is_some() {
            let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
        }
        let _ = nix::sys::wait::waitpid(pid, None);
        let (error, failure) = reported_error(Some(raw));
        return Err(classify_spawn_error(
            error,
            failure,
            &program,
            &resolved,
            options.setup.as_deref(),
        ));
    }
    let exited = exit_watch(pid).map_err(|e| {
        process_group::signal_group(pgid, Signal::SIGKILL);
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(pid, None);
        ExecError::io(EXIT_WATCH, e.into())
    })?;
    #[cfg(target_os = "linux")]
    if handed.is_some() {
        crate::pidns::protect_init(pid.as_raw());
    }
    tracing::debug!(%pid, program = %program, path = %resolved.display(), "spawned (direct)");
    Ok(DirectChild {
        pid,
        pgid,
        namespace: std::cell::Cell::new(handed),
        exited,
        program,
        started: Instant::now(),
        timeout: spec.timeout,
        kill_grace: options.kill_grace,
        outcome: None,
    })
}

/// What [`exit_watch`] calls, for its error message.
#[cfg(any(target_os = "linux", target_os = "android"))]
const EXIT_WATCH: &str = "pidfd_open (Linux 5.3 or later is required)";
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const EXIT_WATCH: &str = "kqueue (watching the command's exit)";

/// A descriptor that `poll` reports readable once `pid` exited: its pidfd (Linux), or a
/// kqueue watching its exit (macOS).
fn exit_watch(pid: Pid) -> Result<OwnedFd, Errno> {
    sys::exit_watch(pid.as_raw())
}

/// Starts the child with `fork(2)` (macOS has no `clone`): it gets a copy of our memory, in
/// which `context` stays valid, and runs [`child_main`]. The caller's read of the report
/// pipe waits until it has exec'ed or exited.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn clone_vfork(context: &ChildContext<'_>) -> Result<Pid, Errno> {
    // Every signal is blocked across the fork, as on Linux: the child resets the handlers,
    // then unblocks.
    let saved = sys::set_thread_signal_mask(libc::SIG_SETMASK, &sys::full_sigset());
    // SAFETY: the child only runs `child_main`, which makes async-signal-safe calls and ends
    // in execve or _exit, never returning into our frames.
    let pid = unsafe { sys::fork() };
    if pid == 0 {
        child_main(std::ptr::from_ref(context).cast_mut().cast());
    }
    let fork_errno = Errno::last();
    sys::set_thread_signal_mask(libc::SIG_SETMASK, &saved);
    if pid < 0 {
        return Err(fork_errno);
    }
    Ok(Pid::from_raw(pid))
}

/// Starts the child on its own stack, sharing our memory, and returns once it has called
/// `execve` or exited (`CLONE_VFORK` suspends us until then).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn clone_vfork(context: &ChildContext<'_>) -> Result<Pid, Errno> {
    // Unmapped below once the child no longer uses it (after exec or exit, when clone
    // returns); its guard page keeps an overflow from writing into our heap.
    let stack = sys::map_stack(CHILD_STACK)?;

    // Every signal is blocked across the clone: a handler of ours must never run in the
    // child, which shares our memory. The child resets the handlers, then unblocks.
    let saved = sys::set_thread_signal_mask(libc::SIG_SETMASK, &sys::full_sigset());
    // SAFETY: the child runs on the mapping made above. `context` lives on our stack frame,
    // which stays valid because CLONE_VFORK suspends this thread until the child has
    // exec'ed or exited. The child runs `child_main`, which only makes async-signal-safe
    // calls and never returns into our frames.
    let pid = unsafe {
        sys::clone(
            child_main,
            stack,
            CHILD_STACK,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::from_ref(context).cast_mut().cast(),
        )
    };
    let clone_errno = Errno::last();
    sys::set_thread_signal_mask(libc::SIG_SETMASK, &saved);
    // SAFETY: the child no longer uses its stack (it has exec'ed into a new address space or
    // exited).
    unsafe { sys::unmap_stack(stack, CHILD_STACK) };
    if pid < 0 {
        return Err(clone_errno);
    }
    Ok(Pid::from_raw(pid))
}

/// The child: reset signals, stdio, working directory, session, the setup, exec. Reports a
/// failure through the pipe and exits 127; never returns.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildContext` the parent passed to clone; the parent is
    // suspended until we exec or exit, so it outlives every use here.
    let context = unsafe { &*arg.cast::<ChildContext<'_>>() };
    let (step, failure) = match child_steps(context) {
        Err(failure) => (failure.step as u32, failure),
        // execve returned: it failed.
        Ok(()) => (
            EXEC_FAILED,
            SetupFailure {
                step: SetupStep::Other,
                errno: Errno::last(),
                detail: 0,
            },
        ),
    };
    SetupReport::send(
        context.prelude.report_fd,
        step,
        failure.errno as i32,
        failure.detail,
    );
    // Without running our atexit handlers or destructors, which belong to the parent whose
    // memory we share.
    sys::exit(127)
}

/// The steps of the child up to `execve`; returns `Ok` only when `execve` failed.
fn child_steps(context: &ChildContext<'_>) -> Result<(), SetupFailure> {
    reset_signals();
    for (target, wanted) in context.null_targets.iter().enumerate() {
        // The /dev/null descriptor opened by the parent.
        if *wanted {
            sys::dup2(context.null, target as RawFd).map_err(SetupFailure::at(SetupStep::Other))?;
        }
    }
    // A path built by the parent.
    sys::chdir(context.cwd).map_err(SetupFailure::at(SetupStep::WorkingDirectory))?;
    // The session, the parent-death signal, the setup, the descriptors (crate::prelude).
    context.prelude.run()?;
    // The image was built by the parent and stays alive while it is suspended.
    let _ = context.prelude.exec.execve();
    Ok(())
}

/// Every caught signal back to its default action, SIGPIPE too (this process ignores it, the
/// command must not inherit that), then an empty mask — as `std::process::Command` leaves a
/// child. Ignored signals stay ignored, as exec keeps them.
fn reset_signals() {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let last = libc::SIGRTMAX();
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    // The BSDs' NSIG: signals 1 to 31.
    let last = 32;
    for signal in 1..last {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // Numbers the C library reserves for itself are refused with EINVAL, which is
        // harmless here.
        let Ok(current) = sys::signal_handler(signal) else {
            continue;
        };
        let caught = current != libc::SIG_DFL && current != libc::SIG_IGN;
        if caught || signal == libc::SIGPIPE {
            let _ = sys::reset_signal(signal);
        }
    }
    sys::set_signal_mask(libc::SIG_SETMASK, &sys::empty_sigset());
}

impl DirectChild {
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// Waits for the command to exit or its timeout, relaying the signals `relay` receives
    /// to its group; then kills what is left of the group.
    pub fn wait_relaying(&mut self, relay: &SignalPipe) -> Result<ExitOutcome, ExecError> {
        if let Some(outcome) = self.outcome {
            return Ok(outcome);
        }
        let deadline = self.timeout.map(|t| self.started + t);
        let outcome = loop {
            let wait_ms = match deadline {
                None => -1,
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break self.kill_after_timeout();
                    }
                    // Rounded up: waking before the deadline would only loop once more.
                    left.as_millis().saturating_add(1).min(i32::MAX as u128) as i32
                }
            };
            let mut fds = [
                libc::pollfd {
                    fd: self.exited.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: relay.read.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            match sys::poll(&mut fds, wait_ms) {
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(errno) => {
                    return Err(ExecError::io(
                        format!("waiting for {}", self.program),
                        errno.into(),
                    ))
                }
            }
            for signal in relay.drain() {
                process_group::signal_group(self.pgid, signal);
            }
            if fds[0].revents != 0 {
                break self.reap()?;
            }
        };
        self.outcome = Some(outcome);
        // Descendants left in the group (`sleep 100 &`) do not outlive the run (after a
        // timeout, `kill_after_timeout` has already ended the whole group).
        if !matches!(outcome, ExitOutcome::TimedOut(_)) {
            process_group::terminate_group_blocking(self.pgid, self.kill_grace);
        }
        Ok(outcome)
    }

    fn reap(&self) -> Result<ExitOutcome, ExecError> {
        loop {
            // Our own child.
            let mut status = match sys::waitpid(self.pid.as_raw(), 0) {
                Ok((_, status)) => status,
                Err(Errno::EINTR) => continue,
                Err(errno) => {
                    return Err(ExecError::io(
                        format!("waiting for {}", self.program),
                        errno.into(),
                    ))
                }
            };
            if let Some(ns) = self.namespace.take() {
                // Init wrote the command's status before exiting; killed before that, the
                // namespace went with it (as by SIGKILL).
                status = ns.status().unwrap_or(libc::SIGKILL);
            }
            return Ok(ExitOutcome::from_status(
                std::process::ExitStatus::from_raw(status),
            ));
        }
    }

    fn kill_after_timeout(&self) -> ExitOutcome {
        let after = self.timeout.unwrap_or_default();
        tracing::debug!(pid = %self.pid, ?after, "timeout; terminating group");
        process_group::terminate_group_blocking(self.pgid, self.kill_grace);
        // The leader is dead or SIGKILLed now; collect it so it is not left a zombie.
        let _ = nix::sys::signal::kill(self.pid, Signal::SIGKILL);
        let _ = self.reap();
        ExitOutcome::TimedOut(after)
    }
}

impl Drop for DirectChild {
    fn drop(&mut self) {
        if self.outcome.is_none() {
            process_group::signal_group(self.pgid, Signal::SIGKILL);
            let _ = nix::sys::signal::kill(self.pid, Signal::SIGKILL);
            let _ = self.reap();
        }
    }
}
