//! Processes: forking one, ending it, the prctl switches the children set, waiting (by pid
//! and by pidfd), and closing inherited descriptors.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::unistd::ForkResult;

/// fork(2), as [`nix::unistd::fork`].
///
/// # Safety
/// The child of a possibly multi-threaded process must make only async-signal-safe calls
/// (no allocation, no lock: the wrappers of this module) until it exits with [`exit`] or
/// execs, and never return into frames of the parent's.
pub(crate) unsafe fn fork() -> nix::Result<ForkResult> {
    // SAFETY: the caller's contract (this function is unsafe).
    unsafe { nix::unistd::fork() }
}

/// _exit(2): ends the process at once, without running atexit handlers or destructors (in a
/// forked child, they are the parent's).
pub(crate) fn exit(code: libc::c_int) -> ! {
    // SAFETY: _exit(2) takes an integer and does not return.
    unsafe { libc::_exit(code) }
}

/// getppid(2).
pub(crate) fn getppid() -> libc::pid_t {
    // SAFETY: getppid(2) takes no arguments and cannot fail.
    unsafe { libc::getppid() }
}

/// `PR_SET_PDEATHSIG`: `signal` reaches the caller when the thread that started it dies.
pub(crate) fn set_parent_death_signal(signal: libc::c_int) -> nix::Result<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes integers only.
    Errno::result(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, signal) }).map(drop)
}

/// `PR_SET_DUMPABLE`: whether the caller can be dumped, and so ptraced or read through
/// /proc by processes without `CAP_SYS_PTRACE`.
pub(crate) fn set_dumpable(dumpable: bool) -> nix::Result<()> {
    // SAFETY: prctl(PR_SET_DUMPABLE) takes integers only.
    Errno::result(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, libc::c_int::from(dumpable)) })
        .map(drop)
}

/// `PR_GET_DUMPABLE`: whether the caller is dumpable. Async-signal safe.
pub(crate) fn dumpable() -> bool {
    // SAFETY: prctl(PR_GET_DUMPABLE) takes no pointer; it returns the flag.
    unsafe { libc::prctl(libc::PR_GET_DUMPABLE) == 1 }
}

/// Makes the supervisor non-dumpable before it reads a credential's secret: its memory,
/// environment and descriptors are then closed through `/proc` and ptrace to every process
/// without `CAP_SYS_PTRACE` in the host's user namespace — a command of a run without the
/// view, the same user, included. For good: the secret's copies are not all known.
pub(crate) fn hold_secrets() {
    if let Err(e) = set_dumpable(false) {
        tracing::warn!(error = %e, "PR_SET_DUMPABLE 0 failed: the supervisor stays dumpable");
    }
}

/// `PR_SET_NO_NEW_PRIVS`: no exec from here on grants privileges (setuid bits, file
/// capabilities); required by Landlock and seccomp for an unprivileged caller.
pub(crate) fn set_no_new_privs() -> nix::Result<()> {
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) takes integers only.
    Errno::result(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }).map(drop)
}

/// waitpid(2) for `pid` with `options`: the pid that changed state and its raw wait status
/// (read it with `libc::WIFEXITED` and the like).
pub(crate) fn waitpid(
    pid: libc::pid_t,
    options: libc::c_int,
) -> nix::Result<(libc::pid_t, libc::c_int)> {
    let mut status = 0;
    // SAFETY: waitpid(2) writes the status into our stack value.
    let rc = unsafe { libc::waitpid(pid, &mut status, options) };
    Errno::result(rc).map(|pid| (pid, status))
}

/// pidfd_open(2): a descriptor of the process `pid` (our child: its pid cannot be reused
/// until we reap it).
pub(crate) fn pidfd_open(pid: libc::pid_t) -> nix::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags.
    let fd = Errno::result(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: on success the kernel just installed a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// waitid(2) on the pidfd `pidfd` (`P_PIDFD`, `WEXITED`): waits for that child to exit and
/// reaps it.
pub(crate) fn wait_pidfd(pidfd: RawFd) -> nix::Result<()> {
    // SAFETY: an all-zero siginfo_t is a valid value of the plain C struct.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid(2) writes one siginfo_t into our stack value.
    let rc = unsafe { libc::waitid(libc::P_PIDFD, pidfd as libc::id_t, &mut info, libc::WEXITED) };
    Errno::result(rc).map(drop)
}

/// close_range(2) from `first` to `last` with `flags` (0: close them). ENOSYS before Linux
/// 5.9.
pub(crate) fn close_range(
    first: libc::c_uint,
    last: libc::c_uint,
    flags: libc::c_uint,
) -> nix::Result<()> {
    // SAFETY: close_range(2) with integer arguments; it touches only our descriptor table.
    Errno::result(unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) }).map(drop)
}
