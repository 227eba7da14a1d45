//! The pid namespace split (Linux): what the child prelude does when its [`ChildSetup`] has
//! unshared `CLONE_NEWPID` ([`ChildSetup::pid_namespace`]).
//!
//! The child that did the unshare (the *starter*) is not itself in the new namespace: only
//! its children are. It starts the namespace's **init** (pid 1), ours and minimal, in an
//! address space of its own: a `fork`-like clone (no `CLONE_VM`). Init:
//!
//! 1. sets `PR_SET_PDEATHSIG` (SIGKILL), so it dies with its parent however the parent dies;
//!    when init dies the kernel kills every process of the namespace, whatever session or
//!    group it moved to; and makes itself non-dumpable (its memory is a copy of the
//!    supervisor's: its environment, a credential's secret);
//! 2. starts the **command** (pid 2) as its own child, like `vfork`: the command first joins
//!    the run's cgroups ([`crate::JoinCgroups`]: init stays out of them, so the run's memory
//!    limit never makes the OOM killer pick init), then, where the caller cannot lower
//!    init's OOM score, raises its own to the most; in a session and group of its own (for a
//!    pty, with the terminal as controlling terminal), the command runs
//!    [`ChildSetup::apply_in_namespace`] (the namespace's own `/proc`, Landlock, seccomp),
//!    marks the descriptors and executes itself ([`crate::prelude::ExecImage`]);
//! 3. closes every descriptor but two and proves that its parent still lives (a byte written
//!    to a pipe the starter reads);
//! 4. reaps every process of the namespace (orphans re-parent to it) until the command
//!    exits, writes the command's wait status to the status pipe (read by the proxy, or on
//!    the direct path by the caller), and exits — which ends every process left in the
//!    namespace.
//!
//! Why init has its own memory: sharing the supervisor's (`CLONE_VM`, as before) made the
//! two one victim for the OOM killer, which kills every process using the memory it frees
//! — a run that filled its tmpfs under `--memory` killed `sandbox`, and with it the after-run
//! checks. Why a `fork`-like clone rather than an init that executes a small program: at this
//! point the `sandbox` process has about 2 MiB of anonymous memory in some 40 mappings and one
//! thread, so copying its page tables costs a fraction of a millisecond (BENCHMARKS.md), while
//! a separate program would have to be shipped, found inside the view and loaded. The copy
//! holds the supervisor's secrets, so init is non-dumpable, and its memory belongs to the
//! host's user namespace: the command, without `CAP_SYS_PTRACE` there, reads none of it
//! (`/proc/1/mem`, `environ`), whatever capabilities init keeps.
//!
//! The command being init's child (not the starter's) matters: whatever dies first, every
//! process of the namespace is reaped inside it, so the namespace always ends. Init makes
//! only raw system calls after its start (no C library call: it is a child of a possibly
//! multi-threaded process, and the command runs in its memory until exec).
//!
//! Where it can (`CAP_SYS_RESOURCE` in the host's user namespace, which nothing inside the
//! run has: root, unless a container's bounding set drops it) the caller gives init the
//! lowest OOM score (`-1000`) once the command runs ([`protect_init`]): set any earlier, the
//! command would inherit the right to lower its own score as far. Elsewhere a process can
//! only raise its score, so the command raises its own.
//!
//! Every signal is blocked in the starter before it starts init, and stays blocked in init
//! and the proxy for good; only the command unblocks, as its last step before exec (with
//! every caught signal back to its default action first). The caller may signal the process
//! it waits for (the proxy) as soon as its spawn returns, which is before the proxy runs its
//! first line of its own: a signal that comes early then waits, pending, for the proxy to
//! take it. Unblocked, it would meet the handlers the starter inherited from the caller (the
//! daemon's SIGTERM/SIGINT/SIGHUP listeners: `fork` keeps them until exec, and the starter
//! never execs), which would take it and drop it, and the command would run on (seen under
//! load: `exec.kill TERM` right after `box.exec`, about one round in sixty). Init, blocked,
//! never runs a handler either.
//!
//! The starter then finds the command's host pid (its namespace pid means nothing outside)
//! in the host's `/proc`, opened before the view hid it, and does one of two things:
//!
//! * **proxy** (the `fork`-based paths, [`crate::spawn`] and [`crate::pty`]): it stays, as the
//!   process the caller waits for. It closes every descriptor, forwards every signal it
//!   receives (the supervisor signals its group) to the command's group, waits for init,
//!   and exits with the command's exact status: its exit code, or the same signal (core
//!   dumps off);
//! * **handoff** (the direct path, [`crate::direct`], whose child shares the caller's memory
//!   and must exit for the caller to resume): init is made a child of the caller
//!   (`CLONE_PARENT`), what the caller needs is left in a [`Handoff`], and the starter
//!   exits. The caller signals the command's group, waits for init and reads the status
//!   from the status pipe it made ([`Prelude::status_fd`]).

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;

use nix::errno::Errno;

use crate::prelude::{Handoff, Prelude};
use crate::report::SetupReport;
use crate::setup::{SetupFailure, SetupStep, EXEC_FAILED};
use crate::sys::{self, raw};

/// Whether this build can split a pid namespace (the raw system calls init makes,
/// [`crate::sys::raw`], are written for these architectures).
pub const SUPPORTED: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

/// Init's stack: it makes a handful of system calls, nothing more.
pub const INIT_STACK: usize = 64 << 10;
/// The command's stack until exec: the setup's last steps (Landlock rules, seccomp).
const COMMAND_STACK: usize = 512 << 10;

/// What init reads: in its own copy of the starter's memory.
struct InitArgs<'a> {
    /// The write end of the starter's pipe: one byte once the command has started.
    ack: RawFd,
    prelude: &'a Prelude,
    /// The write end of the status pipe: the command's wait status goes there.
    status: RawFd,
    /// The signal mask the starter had before it blocked every signal: the command's.
    mask: libc::sigset_t,
    /// The host's `/proc` (the command raises its OOM score there).
    host_proc: RawFd,
}

/// What the command's process reads (it runs on init's memory, init suspended meanwhile).
struct CommandArgs<'a> {
    prelude: &'a Prelude,
    mask: &'a libc::sigset_t,
    host_proc: RawFd,
}

/// Init: see the module comment.
extern "C" fn init_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` points to the starter's `InitArgs`, in init's copy of the starter's
    // memory, which nothing else changes: it lives as long as init.
    let args = unsafe { &*arg.cast::<InitArgs<'_>>() };
    let (ack, status) = (args.ack as usize, args.status as usize);
    raw::set_parent_death_signal(libc::SIGKILL);
    // Before the command exists: our memory is a copy of the supervisor's.
    raw::set_dumpable(false);
    let Ok(stack) = sys::map_stack(COMMAND_STACK) else {
        raw::exit_group(1)
    };
    let command_args = CommandArgs {
        prelude: args.prelude,
        mask: &args.mask,
        host_proc: args.host_proc,
    };
    // The command inherits our copy of the starter's descriptors (its stdio). We are
    // suspended (CLONE_VFORK) until it has exec'ed or exited.
    // SAFETY: the command runs `command_main` on its own stack, sharing our memory; it reads
    // `command_args` (on our stack, and we are suspended) and what it points to, which
    // outlives it (our own memory). libc::clone touches errno only on failure, and its -1
    // is read here without errno.
    let command = unsafe {
        sys::clone(
            command_main,
            stack,
            COMMAND_STACK,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::addr_of!(command_args).cast_mut().cast(),
        )
    };
    // SAFETY: the mapping made above; the command no longer runs on it.
    unsafe { raw::munmap(stack, COMMAND_STACK) };
    if command <= 0 {
        raw::exit_group(1);
    }
    // Every descriptor but the two pipes' write ends.
    let (low, high) = (ack.min(status), ack.max(status));
    if low > 0 {
        raw::close_range(0, low - 1);
    }
    if high > low + 1 {
        raw::close_range(low + 1, high - 1);
    }
    if raw::close_range(high + 1, u32::MAX as usize) < 0 {
        // Before Linux 5.9: one by one, up to a bound no descriptor table reaches here.
        for fd in (0..4096).filter(|fd| *fd != ack && *fd != status) {
            raw::close(fd);
        }
    }
    // The pipe's other end is the starter's: if it died before our prctl, this fails
    // (EPIPE; SIGPIPE does not reach an init) and we leave, ending the namespace.
    if raw::write_byte(ack, 1) != 1 {
        raw::exit_group(1);
    }
    raw::close(ack);
    loop {
        let mut wait_status: libc::c_int = 0;
        let pid = raw::wait_any(&mut wait_status);
        if pid == command as isize {
            // Into an empty pipe: never blocks, never partial. If the reader is gone, so is
            // whoever would read it.
            raw::write(status, &wait_status.to_ne_bytes());
            raw::exit_group(0);
        }
        if pid < 0 && pid != -(libc::EINTR as isize) {
            raw::exit_group(1);
        }
    }
}

/// The command's process inside the namespace: its session, the rest of the setup, then
/// exec. Never returns: a failure is reported to the spawner and the process exits 127.
extern "C" fn command_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `CommandArgs` init passed to clone, on init's stack; init is
    // suspended (CLONE_VFORK) until we exec or exit, and the prelude is in init's memory.
    let args = unsafe { &*arg.cast::<CommandArgs<'_>>() };
    let prelude = args.prelude;
    let steps = || -> Result<(), SetupFailure> {
        // Into the run's cgroups first, before anything of ours can fork: the command and
        // all it starts are counted; init, which stays out, is never the limit's victim.
        if let Some(cgroups) = &prelude.cgroups {
            cgroups.join()?;
        }
        if prelude.raise_oom_score {
            raise_oom_score(args.host_proc);
        }
        // A session and group of its own inside the namespace: its shell's job control
        // sees its own group (the starter's is not visible here), and `kill 0` reaches
        // nothing outside.
        sys::setsid().map_err(SetupFailure::at(SetupStep::NewSession))?;
        if prelude.controlling_terminal {
            crate::prelude::controlling_terminal()?;
        }
        if let Some(setup) = &prelude.setup {
            setup.apply_in_namespace()?;
            crate::prelude::close_unpassed(setup.passed_fds())?;
        }
        Ok(())
    };
    match steps() {
        Ok(()) => {
            // Last, the signals the starter blocked: nothing can have signalled us yet (our
            // pid is published once we exec'ed), and exec keeps the mask, so the command
            // starts with the one its caller meant.
            unblock_signals(args.mask);
            let errno = prelude.exec.execve();
            SetupReport::send(prelude.report_fd, EXEC_FAILED, errno as i32, 0);
        }
        Err(failure) => {
            SetupReport::fail(prelude.report_fd, failure);
        }
    }
    // Without running destructors of memory it shares.
    sys::exit(127)
}

/// The command's OOM score to the most (1000), so that the kernel's OOM killer takes the
/// command (and what it starts, which inherits the score) before init, whose score the
/// caller cannot lower (a user, or root without `CAP_SYS_RESOURCE`). Where it can, init
/// gets the lowest instead ([`protect_init`]) and the command keeps its caller's score.
/// Best effort: the command may lower its score again to what it inherited, which only
/// makes it an equal choice. Async-signal safe.
fn raise_oom_score(host_proc: RawFd) {
    if host_proc < 0 {
        return;
    }
    // Our memory is init's until exec, and init made it non-dumpable, which makes our /proc
    // files root's, closed to a user. Only our own code runs in the namespace now (init
    // waits for our exec), so dumpable for these calls shows nothing to anyone of the run.
    raw::set_dumpable(true);
    // "self" in the host's /proc: our host pid.
    if let Ok(fd) = sys::openat(
        host_proc,
        c"self/oom_score_adj",
        libc::O_WRONLY | libc::O_CLOEXEC,
    ) {
        let _ = sys::write(fd, b"1000");
        let _ = sys::close(fd);
    }
    raw::set_dumpable(false);
}

/// The lowest OOM score (`-1000`, never killed) for the pid namespace's init of a command
/// that runs: called by the caller, in the host's user namespace, once the command has
/// started, so that the command does not inherit the right to lower its own score as far.
/// Init's memory is small and its own: nothing is lost by keeping it. It takes
/// `CAP_SYS_RESOURCE` (without it the command's score is raised instead: `raise_oom_score`).
pub(crate) fn protect_init(init: libc::pid_t) {
    if init > 0 && crate::prelude::can_lower_oom_score() {
        let path = format!("/proc/{init}/oom_score_adj");
        if let Err(e) = std::fs::write(&path, b"-1000") {
            tracing::debug!(%init, error = %e, "init's OOM score stays as inherited");
        }
    }
}

/// [`protect_init`] for the init of a proxy's namespace (the fork-based paths): the proxy's
/// only child, once the spawn returned (the command has started by then).
pub(crate) fn protect_init_of_proxy(proxy: libc::pid_t) {
    if !crate::prelude::can_lower_oom_score() {
        return;
    }
    let path = format!("/proc/{proxy}/task/{proxy}/children");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return;
    };
    if let Some(Ok(init)) = text.split_whitespace().next().map(str::parse) {
        protect_init(init);
    }
}

/// Every caught signal back to its default action (a handler the starter inherited from its
/// caller must never run here, in memory shared with init), then `mask`. Async-signal safe.
fn unblock_signals(mask: &libc::sigset_t) {
    // Ignored signals stay ignored, as exec keeps them.
    for signal in 1..libc::SIGRTMAX() {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // Numbers the C library reserves for itself are refused with EINVAL, which is
        // harmless here.
        let Ok(current) = sys::signal_handler(signal) else {
            continue;
        };
        if current != libc::SIG_DFL && current != libc::SIG_IGN {
            let _ = sys::reset_signal(signal);
        }
    }
    sys::set_signal_mask(libc::SIG_SETMASK, mask);
}

/// Blocks every signal in the calling process; returns the mask it had.
fn block_every_signal() -> libc::sigset_t {
    sys::set_signal_mask(libc::SIG_SETMASK, &sys::full_sigset())
}

fn fail(errno: Errno) -> SetupFailure {
    SetupFailure {
        step: SetupStep::PidNamespace,
        errno,
        detail: 0,
    }
}

/// The starter's side: init (which starts the command), then proxy or handoff. Returns only
/// the failure of a step before the command exists; otherwise it never returns.
pub(crate) fn split(prelude: &Prelude, host_proc: RawFd) -> SetupFailure {
    match start(prelude, host_proc) {
        Ok(never) => match never {},
        Err(failure) => failure,
    }
}

fn start(prelude: &Prelude, host_proc: RawFd) -> Result<std::convert::Infallible, SetupFailure> {
    if !SUPPORTED {
        return Err(fail(Errno::ENOSYS));
    }
    // Before anything can publish our pid (the proxy's) or the command's: see the module
    // comment. Init and the proxy keep every signal blocked; the command restores `mask`.
    let mask = block_every_signal();
    let handoff = prelude.handoff.as_deref();
    let parent_flag = if handoff.is_some() {
        libc::CLONE_PARENT
    } else {
        0
    };
    // Where init writes the command's status: on the direct path a pipe the caller made and
    // reads; on the proxy path our own.
    let own_status = if handoff.is_none() {
        Some(sys::cloexec_pipe(true).map_err(fail)?)
    } else {
        None
    };
    let status_write = match &own_status {
        Some((_, write)) => write.as_raw_fd(),
        None => prelude.status_fd,
    };
    if status_write < 0 {
        return Err(fail(Errno::EBADF));
    }
    let (ack_read, ack_write) = sys::cloexec_pipe(false).map_err(fail)?;
    let init_stack = sys::map_stack(INIT_STACK).map_err(fail)?;
    let args = InitArgs {
        ack: ack_write.as_raw_fd(),
        prelude,
        status: status_write,
        mask,
        host_proc,
    };
    // SAFETY: init runs `init_main` on its own stack (its copy of the mapping made above), in
    // its own copy of our memory (no CLONE_VM), where `args` and what it points to stay
    // valid as long as init runs.
    let init = unsafe {
        sys::clone(
            init_main,
            init_stack,
            INIT_STACK,
            parent_flag | libc::SIGCHLD,
            std::ptr::addr_of!(args).cast_mut().cast(),
        )
    };
    let clone_errno = Errno::last();
    // SAFETY: init runs on its own copy of the mapping; ours is unused.
    unsafe { sys::unmap_stack(init_stack, INIT_STACK) };
    // Our copies of the write ends: init holds its own.
    drop(ack_write);
    let status_read = own_status.map(|(read, write)| {
        drop(write);
        read
    });
    if init < 0 {
        drop(ack_read);
        return Err(fail(clone_errno));
    }
    let mut byte = [0u8];
    let n = loop {
        match sys::read(ack_read.as_raw_fd(), &mut byte) {
            Err(Errno::EINTR) => continue,
            n => break n,
        }
    };
    drop(ack_read);
    let acked = n == Ok(1);
    // Init's parent-death signal is set now; if the supervisor died before that (on the
    // handoff path it is init's parent), we were re-parented and nothing would kill init.
    let orphaned = handoff.is_some() && sys::getppid() != prelude.parent_pid;
    if !acked || orphaned {
        // The process we just started.
        let _ = sys::kill(init, libc::SIGKILL);
        if !acked && handoff.is_none() {
            // The command could not be started (its failure is reported already).
            let _ = sys::waitpid(init, 0);
        }
        return Err(fail(if !acked { Errno::ECHILD } else { Errno::ESRCH }));
    }
    let command = command_pid(host_proc, init);
    match (handoff, status_read) {
        (Some(slot), _) => {
            close_every_descriptor(-1);
            hand_over(slot, init, command)
        }
        (None, Some(status)) => {
            close_every_descriptor(status.as_raw_fd());
            proxy(init, command, status.as_raw_fd())
        }
        // Made above whenever there is no handoff.
        (None, None) => sys::exit(1),
    }
}

/// The direct path: the caller resumes and takes over init, our sibling (CLONE_PARENT).
fn hand_over(slot: &Handoff, init: libc::pid_t, command: libc::pid_t) -> ! {
    slot.command.store(command, Ordering::SeqCst);
    slot.init.store(init, Ordering::SeqCst);
    sys::exit(0)
}

/// The command's host pid: init's only child, read from the host's `/proc` (`host_proc`,
/// opened before the view) — 0 when it is already gone.
fn command_pid(host_proc: RawFd, init: libc::pid_t) -> libc::pid_t {
    // "<init>/task/<init>/children", built without allocating.
    let mut path = [0u8; 64];
    let mut len = 0;
    let mut push = |bytes: &[u8]| {
        for &b in bytes {
            if len < path.len() - 1 {
                path[len] = b;
                len += 1;
            }
        }
    };
    let mut digits = [0u8; 12];
    let number = |mut n: u32, digits: &mut [u8; 12]| -> usize {
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return i;
            }
        }
    };
    let start = number(init as u32, &mut digits);
    push(&digits[start..]);
    push(b"/task/");
    push(&digits[start..]);
    push(b"/children");
    // NUL-terminated: `push` leaves the buffer's last byte 0.
    let Ok(path) = std::ffi::CStr::from_bytes_until_nul(&path) else {
        return 0;
    };
    // Relative to the host's /proc.
    let Ok(fd) = sys::openat(host_proc, path, libc::O_RDONLY | libc::O_CLOEXEC) else {
        return 0;
    };
    let mut text = [0u8; 32];
    let n = sys::read(fd, &mut text).unwrap_or(0);
    let _ = sys::close(fd);
    let mut pid: libc::pid_t = 0;
    for &b in text.iter().take(n) {
        if !b.is_ascii_digit() {
            break;
        }
        pid = pid * 10 + i32::from(b - b'0');
    }
    pid
}

/// Closes every descriptor of this process but `keep` (none when negative): the proxy holds
/// only the status pipe's read end, so a pipe or terminal the command holds ends when the
/// command's holders do.
fn close_every_descriptor(keep: RawFd) {
    let closed = if keep < 0 {
        sys::close_range(0, u32::MAX, 0).is_ok()
    } else {
        (keep == 0 || sys::close_range(0, (keep - 1) as u32, 0).is_ok())
            && sys::close_range(keep as u32 + 1, u32::MAX, 0).is_ok()
    };
    if !closed {
        for fd in (0..4096).filter(|fd| *fd != keep) {
            // EBADF for a free one.
            let _ = sys::close(fd);
        }
    }
}

/// The proxy: forwards the signals it receives to the command's group, waits for init (which
/// exits once the command has, ending the namespace) and exits as the command did. Every
/// signal has been blocked since before the caller could know our pid ([`start`]), so one
/// sent the moment the spawn returned is pending here, and forwarded.
fn proxy(init: libc::pid_t, command: libc::pid_t, status: RawFd) -> ! {
    let all = sys::full_sigset();
    let init_status = loop {
        match sys::waitpid(init, libc::WNOHANG) {
            Ok((pid, init_status)) if pid == init => break init_status,
            Err(errno) if errno != Errno::EINTR => break libc::SIGKILL,
            _ => {}
        }
        // The command leads a group of its own: what reaches us (the supervisor's group
        // signals, a user's kill) is passed on to that group, once.
        if let Ok(signal) = sys::wait_signal(&all) {
            if signal > 0 && signal != libc::SIGCHLD && command > 0 {
                let _ = sys::kill(-command, signal);
            }
        }
    };
    // Init wrote the command's status before exiting; killed before that, the namespace
    // went with it (as by SIGKILL).
    let status = match read_status(status) {
        None => {
            if libc::WIFSIGNALED(init_status) {
                libc::WTERMSIG(init_status)
            } else {
                libc::SIGKILL
            }
        }
        Some(status) => status,
    };
    exit_as(status)
}

/// The command's wait status from the status pipe's read end (non-blocking), once init has
/// exited: `None` when init died before writing it.
pub(crate) fn read_status(fd: RawFd) -> Option<libc::c_int> {
    let mut bytes = [0u8; 4];
    match sys::read(fd, &mut bytes) {
        Ok(4) => Some(libc::c_int::from_ne_bytes(bytes)),
        _ => None,
    }
}

/// Ends this process as a process with wait status `status` ended.
fn exit_as(status: libc::c_int) -> ! {
    if libc::WIFSIGNALED(status) {
        let signal = libc::WTERMSIG(status);
        let _ = sys::disable_core_dumps();
        let _ = sys::reset_signal(signal);
        let _ = sys::kill(sys::getpid(), signal);
        sys::set_signal_mask(libc::SIG_UNBLOCK, &sys::sigset_of(signal));
        // Only if the signal did not end us: the code the one exit rule gives it.
        sys::exit(crate::Outcome::Signaled(signal).status().code)
    }
    sys::exit(libc::WEXITSTATUS(status))
}
