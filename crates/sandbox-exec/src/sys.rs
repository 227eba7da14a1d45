//! The raw system calls of the crate, behind safe wrappers.

#[cfg(not(any(target_os = "linux", target_os = "android")))]
use std::os::fd::AsRawFd;
use std::os::fd::OwnedFd;

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
