//! Signals: sets and masks, dispositions, waiting for one, and a handler that only writes a
//! byte to a pipe.

use std::os::fd::RawFd;

use nix::errno::Errno;

/// The set of every signal.
pub(crate) fn full_sigset() -> libc::sigset_t {
    // SAFETY: an all-zero sigset_t is a valid value of the plain C type; sigfillset(3)
    // initialises it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        set
    }
}

/// The empty set.
pub(crate) fn empty_sigset() -> libc::sigset_t {
    // SAFETY: as above; sigemptyset(3) initialises it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        set
    }
}

/// The set of `signal` alone.
#[cfg(target_os = "linux")]
pub(crate) fn sigset_of(signal: libc::c_int) -> libc::sigset_t {
    let mut set = empty_sigset();
    // SAFETY: sigaddset(3) on the initialised set on our stack.
    unsafe { libc::sigaddset(&mut set, signal) };
    set
}

/// sigprocmask(2): changes the calling process's signal mask (`how`: `SIG_SETMASK`,
/// `SIG_BLOCK`, `SIG_UNBLOCK`); returns the mask it had.
pub(crate) fn set_signal_mask(how: libc::c_int, set: &libc::sigset_t) -> libc::sigset_t {
    let mut old = empty_sigset();
    // SAFETY: sigprocmask(2) reads `set` and writes `old`, both valid sigset_t values.
    unsafe { libc::sigprocmask(how, set, &mut old) };
    old
}

/// pthread_sigmask(3): as [`set_signal_mask`], for the calling thread.
pub(crate) fn set_thread_signal_mask(how: libc::c_int, set: &libc::sigset_t) -> libc::sigset_t {
    let mut old = empty_sigset();
    // SAFETY: pthread_sigmask(3) reads `set` and writes `old`, both valid sigset_t values.
    unsafe { libc::pthread_sigmask(how, set, &mut old) };
    old
}

/// The handler `signal` has now (`SIG_DFL`, `SIG_IGN` or a function). Numbers the C library
/// reserves for itself are refused with EINVAL.
pub(crate) fn signal_handler(signal: libc::c_int) -> nix::Result<libc::sighandler_t> {
    // SAFETY: an all-zero sigaction is a valid value of the plain C struct; sigaction(2)
    // only queries (no new action) and writes it.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        Errno::result(libc::sigaction(signal, std::ptr::null(), &mut current))
            .map(|_| current.sa_sigaction)
    }
}

/// Puts `signal` back to its default action.
pub(crate) fn reset_signal(signal: libc::c_int) -> nix::Result<()> {
    // SAFETY: sigaction(2) sets a disposition from a struct on our stack (all zero but the
    // handler: no flags, an empty mask), and writes no old action.
    unsafe {
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        Errno::result(libc::sigaction(signal, &default, std::ptr::null_mut())).map(drop)
    }
}

/// sigwaitinfo(2): waits for one of the (blocked) signals of `set`; returns its number.
#[cfg(target_os = "linux")]
pub(crate) fn wait_signal(set: &libc::sigset_t) -> nix::Result<libc::c_int> {
    // SAFETY: an all-zero siginfo_t is a valid value of the plain C struct; sigwaitinfo(2)
    // reads `set` and writes it.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        Errno::result(libc::sigwaitinfo(set, &mut info))
    }
}

/// Handles `signal` by writing `byte` to `fd`, and nothing else, until the registration is
/// removed (`signal_hook_registry::unregister`). `fd` must stay open as long as the
/// registration lives (the caller drops them together), and be non-blocking, so that a full
/// pipe drops the byte instead of blocking the handler.
pub(crate) fn write_on_signal(
    signal: libc::c_int,
    fd: RawFd,
    byte: u8,
) -> std::io::Result<signal_hook_registry::SigId> {
    // SAFETY: the action runs in a signal handler; it only calls write(2), which is
    // async-signal safe, of one byte it owns.
    unsafe {
        signal_hook_registry::register(signal, move || {
            libc::write(fd, std::ptr::addr_of!(byte).cast(), 1);
        })
    }
}
