//! The child prelude: what every spawn path ([`crate::spawn`], [`crate::direct`],
//! [`crate::pty`]) does in the child between fork and exec, in one place and one order.
//!
//! 0. when the run has cgroups ([`crate::JoinCgroups`]), the child writes itself into them,
//!    before anything else — after a pid namespace split, the command's process does, first
//!    of its steps, so that the namespace's init stays out of the run's limits
//!    ([`crate::pidns`]); the descriptors were opened by the caller, and since Linux 5.16 the
//!    kernel checks the opener's credentials (before, the writer's: the same user's), so a
//!    user namespace entered in between changes nothing;
//! 1. `setsid(2)`: the child leads its own session and process group (no controlling terminal
//!    of ours, so TIOCSTI on the user's terminal is refused; `killpg` reaches every
//!    descendant);
//! 2. when asked, `PR_SET_PDEATHSIG` (SIGKILL), then the check that the parent still lives:
//!    it may have died between fork and prctl, and then no signal would ever come;
//! 3. for a pty run, the pty (already on stdin) becomes the controlling terminal;
//! 4. the caller's [`ChildSetup`] hook (Landlock, seccomp, the private view…); when the run's
//!    process limit is an rlimit ([`Prelude::process_rlimit`]), `RLIMIT_NPROC` right after
//!    it, which must have moved the child into a user namespace of its own
//!    ([`ChildSetup::user_namespace`]: the kernel counts the limit per user namespace, so
//!    it bounds only the run);
//!    when the hook moved the child into a new pid namespace ([`ChildSetup::pid_namespace`],
//!    Linux), the namespace's init and the command are started as processes of it
//!    ([`crate::pidns`]): the command runs the hook's [`ChildSetup::apply_in_namespace`]
//!    and the step below, then executes itself ([`ExecImage`]);
//! 5. last, every descriptor beyond stdio that is not passed on purpose
//!    ([`ChildSetup::passed_fds`]) is marked close-on-exec, so the command inherits none of
//!    the descriptors its caller happened to hold (a directory, a socket). Marked, not closed:
//!    the spawn's own reporting pipes must still work until exec closes them.
//!
//! A failing step is reported to the parent through the [`SetupReport`] pipe as a
//! [`SetupFailure`], and the command is not executed.
//!
//! Everything here runs in a child of a possibly multi-threaded parent (and, on the direct
//! path, sharing its memory): only async-signal-safe system calls, no allocation, no locks.

use std::ffi::{CString, OsStr};
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use crate::error::ExecError;
use crate::report::SetupReport;
use crate::setup::{ChildSetup, SetupFailure, SetupStep};
use crate::spec::CommandSpec;
use crate::sys;

/// Where the direct path's starter (which shares the caller's memory) leaves what the
/// caller takes over after a pid namespace split ([`crate::pidns`]): init's pid (the
/// caller's child now) and the command's host pid (it leads the group the caller signals; 0
/// when it was already gone). The command's wait status comes through the status pipe
/// ([`Prelude::status_fd`]): init has memory of its own.
#[derive(Debug, Default)]
pub struct Handoff {
    pub init: AtomicI32,
    pub command: AtomicI32,
}

impl Handoff {
    /// Init's pid, once the starter handed over.
    pub fn init(&self) -> Option<libc::pid_t> {
        let init = self.init.load(Ordering::SeqCst);
        (init > 0).then_some(init)
    }
}

/// What the command's process executes: the resolved path, argv and environment as C
/// strings, built in the parent (the child may not allocate).
pub(crate) struct ExecImage {
    path: CString,
    argv: sys::CStrArray,
    envp: sys::CStrArray,
}

fn cstring(bytes: &OsStr, what: &str) -> Result<CString, ExecError> {
    CString::new(bytes.as_bytes())
        .map_err(|_| ExecError::InvalidRequest(format!("{what} contains a NUL byte")))
}

impl ExecImage {
    /// `spec` as the kernel gets it: argv[0] is what the caller wrote, the path the resolved
    /// program, the environment exactly the spec's.
    pub(crate) fn new(spec: &CommandSpec, resolved: &std::path::Path) -> Result<Self, ExecError> {
        let path = cstring(resolved.as_os_str(), "the program's path")?;
        let argv: Vec<CString> = std::iter::once(spec.program.as_os_str())
            .chain(spec.args.iter().map(|a| a.as_os_str()))
            .map(|a| cstring(a, "an argument"))
            .collect::<Result<_, _>>()?;
        let envp: Vec<CString> = spec
            .env
            .iter()
            .map(|(k, v)| {
                let mut entry = k.as_bytes().to_vec();
                entry.push(b'=');
                entry.extend_from_slice(v.as_bytes());
                CString::new(entry).map_err(|_| {
                    ExecError::InvalidRequest("an environment variable contains a NUL byte".into())
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(ExecImage {
            path,
            argv: sys::CStrArray::new(argv),
            envp: sys::CStrArray::new(envp),
        })
    }

    /// execve(2); returns only when it failed, with its errno. Async-signal safe.
    pub(crate) fn execve(&self) -> nix::errno::Errno {
        sys::execve(&self.path, &self.argv, &self.envp)
    }
}

/// The child's steps, built in the parent before fork.
pub(crate) struct Prelude {
    /// The write end of the failure report pipe.
    pub report_fd: RawFd,
    /// `PR_SET_PDEATHSIG` (Linux): the child dies with the thread that spawned it.
    pub die_with_parent: bool,
    /// Our pid, to check after `PR_SET_PDEATHSIG` that the parent still lives.
    pub parent_pid: libc::pid_t,
    /// Make stdin (a pty slave) the controlling terminal (`TIOCSCTTY`).
    pub controlling_terminal: bool,
    pub setup: Option<Arc<dyn ChildSetup>>,
    /// What the command's process executes when the prelude runs it itself (after a pid
    /// namespace split).
    pub exec: ExecImage,
    /// Set by the direct path: after a pid namespace split, init and the command become the
    /// caller's children and their pids are left here ([`crate::pidns`]).
    pub handoff: Option<Arc<Handoff>>,
    /// The run's cgroups, joined first (after a pid namespace split, by the command's
    /// process only: init stays out, [`crate::pidns`]).
    pub cgroups: Option<Arc<crate::cgroups::JoinCgroups>>,
    /// The direct path's status pipe (write end) for a pid namespace split: init writes the
    /// command's wait status there, the caller reads it. -1: none (the proxy makes its own).
    pub status_fd: RawFd,
    /// After a pid namespace split, the command raises its own OOM score, because the caller
    /// cannot lower init's (no `CAP_SYS_RESOURCE`: [`crate::pidns`], Linux only).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub raise_oom_score: bool,
    /// The run's process limit as `RLIMIT_NPROC`, set after the setup hook, inside the user
    /// namespace it made (where no cgroup can be had: docs/limits.md).
    pub process_rlimit: Option<u64>,
}

impl Prelude {
    /// A prelude reporting through `report`, for a child of this process.
    pub(crate) fn new(
        report: &SetupReport,
        die_with_parent: bool,
        setup: Option<Arc<dyn ChildSetup>>,
        exec: ExecImage,
    ) -> Prelude {
        let splits = setup.as_ref().is_some_and(|s| s.pid_namespace());
        Prelude {
            report_fd: report.write_fd(),
            die_with_parent,
            parent_pid: std::process::id() as libc::pid_t,
            controlling_terminal: false,
            setup,
            exec,
            handoff: None,
            cgroups: None,
            status_fd: -1,
            raise_oom_score: splits && !can_lower_oom_score(),
            process_rlimit: None,
        }
    }

    /// Child side: runs every step. Async-signal safe.
    pub(crate) fn run(&self) -> Result<(), SetupFailure> {
        let splits = self.setup.as_ref().is_some_and(|s| s.pid_namespace());
        // After a pid namespace split the command's process joins (crate::pidns).
        if let Some(cgroups) = self.cgroups.as_ref().filter(|_| !splits) {
            cgroups.join()?;
        }
        sys::setsid().map_err(SetupFailure::at(SetupStep::NewSession))?;
        if self.die_with_parent {
            parent_death_signal(self.parent_pid)?;
        }
        // After a pid namespace split the command takes the terminal in a session of its
        // own inside the namespace (crate::pidns), so its shell sees its foreground group.
        if self.controlling_terminal && !splits {
            controlling_terminal()?;
        }
        // The host's /proc, opened before the view hides it: where the starter finds the
        // command's host pid after the split.
        let host_proc = if splits { open_host_proc() } else { -1 };
        let mut passed: &[RawFd] = &[];
        if self.process_rlimit.is_some() {
            // Outside a user namespace of the run's own the limit would count every process
            // of the user, in and outside the run: fail rather than set it there.
            if !self.setup.as_ref().is_some_and(|s| s.user_namespace()) {
                return Err(SetupFailure {
                    step: SetupStep::ProcessRlimit,
                    errno: nix::errno::Errno::EINVAL,
                    detail: 0,
                });
            }
        }
        if let Some(setup) = &self.setup {
            setup.apply_in_child()?;
            if let Some(limit) = self.process_rlimit {
                process_rlimit(limit)?;
            }
            if splits {
                return Err(split(self, host_proc));
            }
            passed = setup.passed_fds();
        }
        close_unpassed(passed)
    }

    /// Child side, for `pre_exec`: [`Self::run`], sending a failure to the parent.
    fn run_reporting(&self) -> std::io::Result<()> {
        self.run()
            .map_err(|failure| SetupReport::fail(self.report_fd, failure))
    }

    /// Makes `cmd` (a fork-based path: [`crate::spawn`], [`crate::pty`]) run this prelude in
    /// its child between fork and exec.
    pub(crate) fn install(self, cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure runs in the forked child before exec; the prelude only makes
        // async-signal-safe calls (see the module doc). `self` was built before fork and is
        // only read there.
        unsafe {
            cmd.pre_exec(move || self.run_reporting());
        }
    }
}

/// Whether this process may lower another's OOM score (Linux: `CAP_SYS_RESOURCE`).
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) fn can_lower_oom_score() -> bool {
    sys::has_sys_resource()
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(crate) fn can_lower_oom_score() -> bool {
    false
}

/// `RLIMIT_NPROC` (Linux; a setup never has a user namespace elsewhere). Async-signal safe.
#[cfg(target_os = "linux")]
fn process_rlimit(limit: u64) -> Result<(), SetupFailure> {
    sys::set_process_rlimit(limit).map_err(SetupFailure::at(SetupStep::ProcessRlimit))
}

#[cfg(not(target_os = "linux"))]
fn process_rlimit(_limit: u64) -> Result<(), SetupFailure> {
    Err(SetupFailure {
        step: SetupStep::ProcessRlimit,
        errno: nix::errno::Errno::ENOSYS,
        detail: 0,
    })
}

/// Makes stdin (the pty slave) the controlling terminal of this session leader.
pub(crate) fn controlling_terminal() -> Result<(), SetupFailure> {
    // fd 0 is the pty slave, and setsid made us a session leader without a terminal.
    sys::set_controlling_terminal(0).map_err(SetupFailure::at(SetupStep::ControllingTerminal))
}

/// `/proc`, as a directory descriptor (-1 when it cannot be opened). Async-signal safe.
fn open_host_proc() -> RawFd {
    sys::open(
        c"/proc",
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
    )
    .unwrap_or(-1)
}

/// Starts the pid namespace's init and the command; returns only a failure (crate::pidns).
#[cfg(target_os = "linux")]
fn split(prelude: &Prelude, host_proc: RawFd) -> SetupFailure {
    crate::pidns::split(prelude, host_proc)
}

/// No pid namespaces elsewhere: a setup never asks for one there.
#[cfg(not(target_os = "linux"))]
fn split(_prelude: &Prelude, _host_proc: RawFd) -> SetupFailure {
    SetupFailure {
        step: SetupStep::PidNamespace,
        errno: nix::errno::Errno::ENOSYS,
        detail: 0,
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn parent_death_signal(parent_pid: libc::pid_t) -> Result<(), SetupFailure> {
    sys::set_parent_death_signal(libc::SIGKILL)
        .map_err(SetupFailure::at(SetupStep::ParentDeathSignal))?;
    // The parent may have died before prctl; then we were re-parented and the signal will
    // never come.
    if sys::getppid() != parent_pid {
        return Err(SetupFailure {
            step: SetupStep::ParentDeathSignal,
            errno: nix::errno::Errno::ESRCH,
            detail: 0,
        });
    }
    Ok(())
}

/// Elsewhere (macOS) the kernel has no parent-death signal: the child is not tied to us
/// beyond its process group, which the owner kills at the end of the run.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn parent_death_signal(_parent_pid: libc::pid_t) -> Result<(), SetupFailure> {
    Ok(())
}

/// Marks every descriptor from 3 up close-on-exec, then clears the flag on `passed`.
pub(crate) fn close_unpassed(passed: &[RawFd]) -> Result<(), SetupFailure> {
    mark_cloexec_from(3)?;
    for &fd in passed {
        if fd > 2 {
            sys::set_fd_flags(fd, 0).map_err(SetupFailure::at(SetupStep::CloseDescriptors))?;
        }
    }
    Ok(())
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn mark_cloexec_from(first: RawFd) -> Result<(), SetupFailure> {
    // CLOSE_RANGE_CLOEXEC (Linux 5.11): one call, whatever the descriptor limit.
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    use nix::errno::Errno;
    match sys::close_range(
        first as libc::c_uint,
        libc::c_uint::MAX,
        CLOSE_RANGE_CLOEXEC,
    ) {
        Ok(()) => Ok(()),
        // An older kernel (no close_range, or no CLOEXEC flag), or a filter refusing it.
        Err(Errno::ENOSYS | Errno::EINVAL | Errno::EPERM) => mark_cloexec_each(first),
        Err(errno) => Err(SetupFailure {
            step: SetupStep::CloseDescriptors,
            errno,
            detail: 0,
        }),
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn mark_cloexec_from(first: RawFd) -> Result<(), SetupFailure> {
    mark_cloexec_each(first)
}

/// The fallback: every descriptor number below the hard open-files limit, one by one.
fn mark_cloexec_each(first: RawFd) -> Result<(), SetupFailure> {
    let limit = sys::open_files_limit().map_err(SetupFailure::at(SetupStep::CloseDescriptors))?;
    // The hard limit bounds every descriptor the process could have opened (a lower soft
    // limit set later does not close those above it). Capped: an "unlimited" limit would be
    // a loop of billions of calls; no descriptor table gets that large in practice.
    let end = limit.rlim_max.min(1 << 20) as RawFd;
    for fd in first..end {
        // EBADF for a free one.
        if let Ok(flags) = sys::fd_flags(fd) {
            if flags & libc::FD_CLOEXEC == 0 {
                let _ = sys::set_fd_flags(fd, flags | libc::FD_CLOEXEC);
            }
        }
    }
    Ok(())
}
