//! Descriptors: pipes, reads and writes, descriptor flags, closing, the terminal's ioctls,
//! waiting on several.

use std::ffi::CStr;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
use std::os::fd::AsRawFd;
use std::os::fd::{OwnedFd, RawFd};

use nix::errno::Errno;

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

/// read(2) into `buf`.
#[cfg(target_os = "linux")]
pub(crate) fn read(fd: RawFd, buf: &mut [u8]) -> nix::Result<usize> {
    // SAFETY: read(2) writes at most `buf.len()` bytes into memory we borrow mutably.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    Errno::result(n).map(|n| n as usize)
}

/// write(2) of `bytes`.
pub(crate) fn write(fd: RawFd, bytes: &[u8]) -> nix::Result<usize> {
    // SAFETY: write(2) reads at most `bytes.len()` bytes from memory we borrow.
    let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
    Errno::result(n).map(|n| n as usize)
}

/// close(2) of a descriptor number the caller owns (EBADF for a free one).
#[cfg(target_os = "linux")]
pub(crate) fn close(fd: RawFd) -> nix::Result<()> {
    // SAFETY: close(2) takes an integer; the caller owns the descriptor.
    Errno::result(unsafe { libc::close(fd) }).map(drop)
}

/// close_range(2) from `first` to `last` with `flags` (0: close them; `CLOSE_RANGE_CLOEXEC`:
/// only mark them close-on-exec).
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) fn close_range(
    first: libc::c_uint,
    last: libc::c_uint,
    flags: libc::c_uint,
) -> nix::Result<()> {
    // SAFETY: close_range(2) with integer arguments; it touches only our descriptor table.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) };
    Errno::result(rc).map(drop)
}

/// dup2(2): `new` becomes a copy of `old`.
pub(crate) fn dup2(old: RawFd, new: RawFd) -> nix::Result<()> {
    // SAFETY: dup2(2) takes two descriptor numbers.
    Errno::result(unsafe { libc::dup2(old, new) }).map(drop)
}

/// The descriptor flags of `fd` (`F_GETFD`): `FD_CLOEXEC` or not; EBADF for a free one.
pub(crate) fn fd_flags(fd: RawFd) -> nix::Result<libc::c_int> {
    // SAFETY: fcntl(F_GETFD) on a descriptor number.
    Errno::result(unsafe { libc::fcntl(fd, libc::F_GETFD) })
}

/// Sets the descriptor flags of `fd` (`F_SETFD`).
pub(crate) fn set_fd_flags(fd: RawFd, flags: libc::c_int) -> nix::Result<()> {
    // SAFETY: fcntl(F_SETFD) with an integer flag on a descriptor number.
    Errno::result(unsafe { libc::fcntl(fd, libc::F_SETFD, flags) }).map(drop)
}

/// open(2) of `path`; the new descriptor is the caller's.
pub(crate) fn open(path: &CStr, flags: libc::c_int) -> nix::Result<RawFd> {
    // SAFETY: open(2) of a NUL-terminated path we borrow.
    Errno::result(unsafe { libc::open(path.as_ptr(), flags) })
}

/// openat(2) of `path` relative to the directory `dir`; the new descriptor is the caller's.
#[cfg(target_os = "linux")]
pub(crate) fn openat(dir: RawFd, path: &CStr, flags: libc::c_int) -> nix::Result<RawFd> {
    // SAFETY: openat(2) of a NUL-terminated path we borrow, relative to a descriptor number.
    Errno::result(unsafe { libc::openat(dir, path.as_ptr(), flags) })
}

/// Resizes a pipe's kernel buffer (`F_SETPIPE_SZ`).
#[cfg(target_os = "linux")]
pub(crate) fn set_pipe_size(fd: RawFd, bytes: libc::c_int) -> nix::Result<libc::c_int> {
    // SAFETY: fcntl(F_SETPIPE_SZ) with an integer on a descriptor number; failure leaves the
    // pipe as it was.
    Errno::result(unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, bytes) })
}

/// poll(2) on `fds`, for up to `timeout_ms` (-1: no limit); how many are ready.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout_ms: libc::c_int) -> nix::Result<libc::c_int> {
    // SAFETY: poll(2) reads and writes `fds.len()` pollfd structs we borrow mutably.
    Errno::result(unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) })
}

/// `TIOCSCTTY`: the terminal on `fd` becomes the controlling terminal of this session leader.
pub(crate) fn set_controlling_terminal(fd: RawFd) -> nix::Result<()> {
    // SAFETY: ioctl(TIOCSCTTY) on a descriptor number with an integer argument.
    Errno::result(unsafe { libc::ioctl(fd, libc::TIOCSCTTY as _, 0) }).map(drop)
}

/// `TIOCGWINSZ`: the window size of the terminal on `fd`.
pub(crate) fn window_size(fd: RawFd) -> nix::Result<libc::winsize> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the pointed-to stack value.
    Errno::result(unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) }).map(|_| ws)
}

/// `TIOCSWINSZ`: sets the window size of the terminal on `fd`.
pub(crate) fn set_window_size(fd: RawFd, ws: &libc::winsize) -> nix::Result<()> {
    // SAFETY: TIOCSWINSZ reads one `winsize` from the value we borrow.
    Errno::result(unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, ws) }).map(drop)
}
