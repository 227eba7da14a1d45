//! The network namespace's child side, on the raw socket calls of `crate::sys`: loopback up,
//! a listener and a connection on 127.0.0.1, and descriptors passed over a unix socket
//! (`SCM_RIGHTS`) — no allocation, as they run between fork and exec.

use nix::errno::Errno;
use std::os::fd::RawFd;

use crate::sys;

/// Brings up `lo` in the calling process's network namespace (`SIOCSIFFLAGS`). Async-signal
/// safe.
pub(crate) fn loopback_up() -> Result<(), Errno> {
    let fd = sys::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC)?;
    let result = sys::interface_flags(fd, c"lo").and_then(|flags| {
        let up = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        sys::set_interface_flags(fd, c"lo", flags | up)
    });
    // The socket opened above.
    let _ = sys::close(fd);
    result
}

pub(super) fn loopback(port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// A TCP listener on `127.0.0.1:port` (0: any), close-on-exec, and its port. Async-signal
/// safe.
pub(crate) fn listen_loopback(port: u16) -> Result<(RawFd, u16), Errno> {
    let fd = sys::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC)?;
    let bound = sys::bind_in(fd, &loopback(port))
        .and_then(|()| sys::listen(fd, 128))
        .and_then(|()| sys::local_addr_in(fd));
    match bound {
        Ok(addr) => Ok((fd, u16::from_be(addr.sin_port))),
        Err(errno) => {
            let _ = sys::close(fd);
            Err(errno)
        }
    }
}

/// A TCP connection to `127.0.0.1:port` (for the probe). Async-signal safe.
pub(crate) fn connect_loopback(port: u16) -> Result<RawFd, Errno> {
    let fd = sys::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC)?;
    if let Err(errno) = sys::connect_in(fd, &loopback(port)) {
        let _ = sys::close(fd);
        return Err(errno);
    }
    Ok(fd)
}
