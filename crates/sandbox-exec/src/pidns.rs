//! The pid namespace split (Linux): what the child prelude does when its [`ChildSetup`] has
//! unshared `CLONE_NEWPID` ([`ChildSetup::pid_namespace`]).
//!
//! The child that did the unshare (the *starter*) is not itself in the new namespace: only
//! its children are. So it starts two processes there, both sharing its memory
//! (`CLONE_VM`: no page tables are copied):
//!
//! * the namespace's **init** (pid 1), ours and minimal: it closes every descriptor, sets
//!   `PR_SET_PDEATHSIG` (SIGKILL) and then proves that its parent still lives (a byte
//!   written to a pipe the starter reads; the starter checks its own parent after that), so
//!   it dies with the supervisor however the supervisor dies. When init dies the kernel
//!   kills every process of the namespace, whatever session or group it moved to. Its
//!   `SIGCHLD` is ignored, so the kernel reaps every orphan re-parented to it. It runs
//!   only raw system calls (no C library call: it shares the starter's thread-local
//!   `errno`, and on the direct path the supervisor's);
//! * the **command** (pid 2), started like `vfork`, in a session and process group of its
//!   own (and, for a pty, with the terminal as its controlling terminal): it runs
//!   [`ChildSetup::apply_in_namespace`] (the namespace's own `/proc`, Landlock, seccomp),
//!   marks the descriptors, and executes the command itself ([`crate::prelude::ExecImage`]).
//!
//! Then one of two things, chosen by the spawn path:
//!
//! * **proxy** (the `fork`-based paths, [`crate::spawn`] and [`crate::pty`]): the starter
//!   stays, as the process the caller waits for. It closes every descriptor, waits for the
//!   command, forwards every signal it receives (the supervisor signals its group) to the
//!   command's group, and when the command exits kills init —
//!   which ends the namespace — and exits with the command's exact status: its exit code,
//!   or the same signal (core dumps off);
//! * **handoff** (the direct path, [`crate::direct`], whose child shares the caller's memory
//!   and must exit for the caller to resume): init and the command are made children of
//!   the caller (`CLONE_PARENT`), their pids are left in a [`Handoff`], and the starter
//!   exits. The caller waits for the command itself, signals the command's group, and kills
//!   init after it.

use std::os::fd::RawFd;
use std::sync::atomic::Ordering;

use nix::errno::Errno;

use crate::prelude::Prelude;

use crate::spawn::{ChildSetup, SetupFailure, SetupReport, SetupStep, EXEC_FAILED};

/// Whether this build can split a pid namespace (the raw system calls init makes are written
/// for these architectures).
pub const SUPPORTED: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

/// Init's stack: it makes a handful of system calls, nothing more.
pub const INIT_STACK: usize = 64 << 10;
/// The command's stack until exec: the setup's last steps (Landlock rules, seccomp).
const COMMAND_STACK: usize = 512 << 10;

/// The raw system calls init makes: no C library wrapper, so no `errno` is written (init
/// shares the starter's thread pointer and memory).
mod raw {
    #[cfg(target_arch = "x86_64")]
    pub unsafe fn syscall(n: libc::c_long, a: usize, b: usize, c: usize, d: usize) -> isize {
        let ret: isize;
        // SAFETY (of the caller): the syscall instruction with the Linux x86_64 convention;
        // rcx and r11 are clobbered by the kernel.
        unsafe {
            core::arch::asm!(
                "syscall",
                inlateout("rax") n as isize => ret,
                in("rdi") a,
                in("rsi") b,
                in("rdx") c,
                in("r10") d,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack)
            );
        }
        ret
    }

    #[cfg(target_arch = "aarch64")]
    pub unsafe fn syscall(n: libc::c_long, a: usize, b: usize, c: usize, d: usize) -> isize {
        let ret: isize;
        // SAFETY (of the caller): svc 0 with the Linux aarch64 convention.
        unsafe {
            core::arch::asm!(
                "svc 0",
                in("x8") n,
                inlateout("x0") a as isize => ret,
                in("x1") b,
                in("x2") c,
                in("x3") d,
                options(nostack)
            );
        }
        ret
    }

    /// Elsewhere the split is refused before init exists ([`super::SUPPORTED`]).
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub unsafe fn syscall(_n: libc::c_long, _a: usize, _b: usize, _c: usize, _d: usize) -> isize {
        -(libc::ENOSYS as isize)
    }
}

struct InitArgs {
    /// The write end of the starter's pipe: one byte once the parent-death signal is set.
    ack: RawFd,
}

/// Init: descriptors closed, parent-death signal, proof of life, then asleep for good.
extern "C" fn init_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` points to the starter's `InitArgs`, which stays on its stack until the
    // starter has read our byte (or seen us die); it is read once, here.
    let ack = unsafe { (*arg.cast::<InitArgs>()).ack } as usize;
    // SAFETY: raw system calls on integers and a one-byte stack buffer; none touches memory
    // the starter or the caller uses.
    unsafe {
        if ack > 0 {
            raw::syscall(libc::SYS_close_range, 0, ack - 1, 0, 0);
        }
        if raw::syscall(libc::SYS_close_range, ack + 1, u32::MAX as usize, 0, 0) < 0 {
            // Before Linux 5.9: one by one, up to a bound no descriptor table reaches here.
            for fd in (ack + 1)..4096 {
                raw::syscall(libc::SYS_close, fd, 0, 0, 0);
            }
        }
        raw::syscall(
            libc::SYS_prctl,
            libc::PR_SET_PDEATHSIG as usize,
            libc::SIGKILL as usize,
            0,
            0,
        );
        let byte = 1u8;
        // The pipe's other end is the starter's: if it died before our prctl, this fails
        // (EPIPE; SIGPIPE does not reach an init) and we leave.
        if raw::syscall(libc::SYS_write, ack, std::ptr::addr_of!(byte) as usize, 1, 0) != 1 {
            raw::syscall(libc::SYS_exit_group, 1, 0, 0, 0);
        }
        raw::syscall(libc::SYS_close, ack, 0, 0, 0);
        loop {
            // ppoll with no descriptors and no timeout: asleep until killed. Signals sent to
            // an init without handlers are discarded by the kernel; SIGKILL from outside
            // (the starter, the supervisor, the parent-death signal) ends the namespace.
            raw::syscall(libc::SYS_ppoll, 0, 0, 0, 0);
        }
    }
}

/// The command's process inside the namespace: the rest of the setup, then exec. Never
/// returns: a failure is reported to the spawner and the process exits 127.
extern "C" fn command_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the prelude the starter passed to clone; the starter is suspended
    // (CLONE_VFORK) until we exec or exit, so it outlives every use here.
    let prelude = unsafe { &*arg.cast::<Prelude>() };
    let steps = || -> Result<(), SetupFailure> {
        // A session and group of its own inside the namespace: its shell's job control
        // sees its own group (the starter's is not visible here), and `kill 0` reaches
        // nothing outside.
        // SAFETY: setsid(2) takes no arguments.
        if unsafe { libc::setsid() } < 0 {
            return Err(SetupFailure::last(SetupStep::NewSession));
        }
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
            let errno = prelude.exec.execve();
            SetupReport::send(prelude.report_fd, EXEC_FAILED, errno as i32, 0);
        }
        Err(failure) => {
            SetupReport::fail(prelude.report_fd, failure);
        }
    }
    // SAFETY: _exit(2) ends this process without running destructors of memory it shares.
    unsafe { libc::_exit(127) }
}

fn fail(errno: Errno) -> SetupFailure {
    SetupFailure {
        step: SetupStep::PidNamespace,
        errno,
        detail: 0,
    }
}

fn map_stack(size: usize) -> Result<*mut libc::c_void, SetupFailure> {
    // SAFETY: an anonymous private mapping; its only user is the process started on it.
    let stack = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if stack == libc::MAP_FAILED {
        return Err(fail(Errno::last()));
    }
    // A guard page: an overflow faults instead of writing below the stack.
    // SAFETY: mprotect(2) of the first page of the mapping made above.
    unsafe { libc::mprotect(stack, 4096, libc::PROT_NONE) };
    Ok(stack)
}

/// The starter's side: init, then the command, then proxy or handoff. Returns only the
/// failure of a step before the command exists; otherwise it never returns.
pub(crate) fn split(prelude: &Prelude, _setup: &dyn ChildSetup) -> SetupFailure {
    match start(prelude) {
        Ok(never) => match never {},
        Err(failure) => failure,
    }
}

fn start(prelude: &Prelude) -> Result<std::convert::Infallible, SetupFailure> {
    if !SUPPORTED {
        return Err(fail(Errno::ENOSYS));
    }
    let handoff = prelude.handoff.as_deref();
    let parent_flag = if handoff.is_some() {
        libc::CLONE_PARENT
    } else {
        0
    };
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2(2) writes two descriptors into our array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(fail(Errno::last()));
    }
    let (ack_read, ack_write) = (fds[0], fds[1]);
    let init_stack = map_stack(INIT_STACK)?;
    let args = InitArgs { ack: ack_write };
    // Init's copy of the dispositions ignores SIGCHLD: the kernel reaps its children.
    // SAFETY: sigaction(2) with structs on our stack; restored right after the clone.
    let mut saved: libc::sigaction = unsafe { std::mem::zeroed() };
    unsafe {
        let mut ignore: libc::sigaction = std::mem::zeroed();
        ignore.sa_sigaction = libc::SIG_IGN;
        libc::sigaction(libc::SIGCHLD, &ignore, &mut saved);
    }
    // SAFETY: init runs `init_main` on its own stack (top of the mapping, page-aligned), in
    // our memory; it reads `args` once before writing the byte we wait for below.
    let init = unsafe {
        libc::clone(
            init_main,
            init_stack.cast::<u8>().add(INIT_STACK).cast(),
            libc::CLONE_VM | parent_flag | libc::SIGCHLD,
            std::ptr::addr_of!(args).cast_mut().cast(),
        )
    };
    let clone_errno = Errno::last();
    // SAFETY: restores the disposition saved above; closes our copy of the write end.
    unsafe {
        libc::sigaction(libc::SIGCHLD, &saved, std::ptr::null_mut());
        libc::close(ack_write);
    }
    if init < 0 {
        // SAFETY: no process uses the mapping or the read end.
        unsafe {
            libc::munmap(init_stack, INIT_STACK);
            libc::close(ack_read);
        }
        return Err(fail(clone_errno));
    }
    let mut byte = 0u8;
    let n = loop {
        // SAFETY: read(2) of one byte into our stack.
        let n = unsafe { libc::read(ack_read, std::ptr::addr_of_mut!(byte).cast(), 1) };
        if n >= 0 || Errno::last() != Errno::EINTR {
            break n;
        }
    };
    // SAFETY: close(2) of our read end.
    unsafe { libc::close(ack_read) };
    // Init's parent-death signal is set now; if the supervisor died before that (on the
    // handoff path it is init's parent), we were re-parented and nothing would kill init.
    // SAFETY: getppid(2) takes no arguments.
    let orphaned = handoff.is_some() && unsafe { libc::getppid() } != prelude.parent_pid;
    if n != 1 || orphaned {
        // SAFETY: kill(2) of the process we just started.
        unsafe { libc::kill(init, libc::SIGKILL) };
        return Err(fail(if n != 1 { Errno::ECHILD } else { Errno::ESRCH }));
    }
    let command_stack = map_stack(COMMAND_STACK)?;
    // SAFETY: the command runs `command_main` on its own stack, sharing our memory; we are
    // suspended (CLONE_VFORK) until it has exec'ed or exited, so `prelude` stays valid.
    let command = unsafe {
        libc::clone(
            command_main,
            command_stack.cast::<u8>().add(COMMAND_STACK).cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | parent_flag | libc::SIGCHLD,
            std::ptr::from_ref(prelude).cast_mut().cast(),
        )
    };
    let clone_errno = Errno::last();
    // SAFETY: the command no longer runs on this stack (it exec'ed or exited).
    unsafe { libc::munmap(command_stack, COMMAND_STACK) };
    if command < 0 {
        // SAFETY: kill(2) of init, which ends the (empty) namespace.
        unsafe { libc::kill(init, libc::SIGKILL) };
        return Err(fail(clone_errno));
    }
    close_every_descriptor();
    match handoff {
        Some(slot) => {
            slot.init_stack
                .store(init_stack as usize, Ordering::SeqCst);
            slot.init.store(init, Ordering::SeqCst);
            slot.command.store(command, Ordering::SeqCst);
            // SAFETY: _exit(2): the caller resumes and takes over init and the command.
            unsafe { libc::_exit(0) }
        }
        None => proxy(command, init),
    }
}

/// Closes every descriptor of this process: the proxy holds none, so a pipe or terminal the
/// command holds ends when the command's holders do.
fn close_every_descriptor() {
    // SAFETY: close_range(2) with integer arguments.
    if unsafe { libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) } != 0 {
        for fd in 0..4096 {
            // SAFETY: close(2) of a descriptor number; EBADF for a free one.
            unsafe { libc::close(fd) };
        }
    }
}

/// The proxy: waits for the command, forwards the signals meant for it, ends the namespace
/// and exits as the command did.
fn proxy(command: libc::pid_t, init: libc::pid_t) -> ! {
    // SAFETY: signal-mask and wait calls on stack values; kill(2) of our own children.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
        let status = loop {
            let mut status = 0;
            let rc = libc::waitpid(command, &mut status, libc::WNOHANG);
            if rc == command {
                break status;
            }
            if rc < 0 && Errno::last() != Errno::EINTR {
                // Not our child any more: nothing to report but a failure.
                break 127 << 8;
            }
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let signal = libc::sigwaitinfo(&all, &mut info);
            // The command leads a group of its own: what reaches us (the supervisor's
            // group signals, a user's kill) is passed on to that group, once.
            if signal > 0 && signal != libc::SIGCHLD {
                libc::kill(-command, signal);
            }
        };
        libc::kill(init, libc::SIGKILL);
        let mut ignored = 0;
        while libc::waitpid(init, &mut ignored, 0) < 0 && Errno::last() == Errno::EINTR {}
        if libc::WIFSIGNALED(status) {
            let signal = libc::WTERMSIG(status);
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            libc::signal(signal, libc::SIG_DFL);
            let mut one: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut one);
            libc::sigaddset(&mut one, signal);
            libc::kill(libc::getpid(), signal);
            libc::sigprocmask(libc::SIG_UNBLOCK, &one, std::ptr::null_mut());
            libc::_exit(128 + signal)
        }
        libc::_exit(libc::WEXITSTATUS(status))
    }
}
