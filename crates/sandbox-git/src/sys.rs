//! The crate's raw system calls, behind safe wrappers (as `sandbox-host`'s `sys/`): every call
//! that needs `unsafe` is made here, once, with its `SAFETY` comment, and reports failure as an
//! [`Errno`](nix::errno::Errno) (`nix::Result`). The rest of the crate calls these instead of
//! `libc`, or nix's safe functions where nix has them.
//!
//! All of it serves the git quarantine, which is Linux's (overlay layers, `openat2`): the
//! module is built on Linux only.

use std::ffi::CStr;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::NixPath;

/// openat2(2) of `path` relative to `dir`, resolved as `how` says, as
/// [`nix::fcntl::openat2`]: the new descriptor, owned.
pub(crate) fn openat2<P: ?Sized + NixPath>(
    dir: RawFd,
    path: &P,
    how: nix::fcntl::OpenHow,
) -> nix::Result<OwnedFd> {
    let fd = nix::fcntl::openat2(dir, path, how)?;
    // SAFETY: `fd` was just returned by openat2(2) and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Receives one message (one byte) on the unix socket `socket` without waiting
/// (`MSG_DONTWAIT`; EAGAIN when none is there) and with `MSG_CMSG_CLOEXEC`: the descriptors
/// it carried, up to `N`, owned.
pub(crate) fn try_recv_fds<const N: usize>(socket: RawFd) -> nix::Result<Vec<OwnedFd>> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; N]);
    let msg = recvmsg::<()>(
        socket,
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            for fd in raw {
                // SAFETY: the kernel installed this descriptor for us with the message;
                // nothing else owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    Ok(fds)
}

/// lgetxattr(2): reads the extended attribute `name` of `path` (of a link itself, never
/// followed) into `value`; how many bytes it holds (ERANGE when `value` is too small).
pub(crate) fn lgetxattr(path: &CStr, name: &CStr, value: &mut [u8]) -> nix::Result<usize> {
    // SAFETY: lgetxattr(2) of NUL-terminated strings we borrow, writing at most `value.len()`
    // bytes into the slice we borrow mutably.
    let n = unsafe {
        libc::lgetxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    Errno::result(n).map(|n| n as usize)
}

/// lsetxattr(2): the extended attribute `name` of `path` (of a link itself, never followed)
/// holds `value`.
pub(crate) fn lsetxattr(path: &CStr, name: &CStr, value: &[u8]) -> nix::Result<()> {
    // SAFETY: lsetxattr(2) of NUL-terminated strings we borrow and `value.len()` bytes read
    // from the slice we borrow.
    let rc = unsafe {
        libc::lsetxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    Errno::result(rc).map(drop)
}
