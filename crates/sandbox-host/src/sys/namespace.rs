//! Namespaces: leaving ours for new ones, entering one by descriptor, and finding one from a
//! socket or another namespace.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;

/// unshare(2) with `flags` (`CLONE_NEWUSER` needs a single-threaded caller: EINVAL else).
pub(crate) fn unshare(flags: libc::c_int) -> nix::Result<()> {
    // SAFETY: unshare(2) takes flags only and touches no memory of ours.
    Errno::result(unsafe { libc::unshare(flags) }).map(drop)
}

/// setns(2): enters the namespace of type `nstype` that `fd` refers to.
pub(crate) fn setns(fd: RawFd, nstype: libc::c_int) -> nix::Result<()> {
    // SAFETY: setns(2) takes a descriptor number and an integer.
    Errno::result(unsafe { libc::setns(fd, nstype) }).map(drop)
}

/// `SIOCGSKNS`: the network namespace the socket `socket` was made in, as a new descriptor.
pub(crate) fn socket_namespace(socket: RawFd) -> nix::Result<OwnedFd> {
    // SAFETY: ioctl(SIOCGSKNS) on a descriptor number, no argument: it returns a new
    // descriptor (or -1).
    let fd = Errno::result(unsafe { libc::ioctl(socket, libc::SIOCGSKNS as _) })?;
    // SAFETY: the kernel just installed this descriptor for us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `NS_GET_USERNS`: the user namespace that owns the namespace `ns`, as a new descriptor.
pub(crate) fn owning_user_namespace(ns: RawFd) -> nix::Result<OwnedFd> {
    // SAFETY: ioctl(NS_GET_USERNS) on a descriptor number, no argument: it returns a new
    // descriptor (or -1).
    let fd = Errno::result(unsafe { libc::ioctl(ns, libc::NS_GET_USERNS as _) })?;
    // SAFETY: the kernel just installed this descriptor for us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
