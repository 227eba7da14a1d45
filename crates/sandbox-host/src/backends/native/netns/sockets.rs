//! The raw socket calls of the network namespace's child side: loopback up, a listener and a
//! connection on 127.0.0.1, and descriptors passed over a unix socket (`SCM_RIGHTS`) — no
//! allocation, as they run between fork and exec.

use nix::errno::Errno;
use std::os::fd::RawFd;

/// Brings up `lo` in the calling process's network namespace (`SIOCSIFFLAGS`). Async-signal
/// safe.
pub(crate) fn loopback_up() -> Result<(), Errno> {
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: a zeroed ifreq is a valid value (a name and a union of integers).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *slot = *byte as libc::c_char;
    }
    // SAFETY: ioctl(SIOCGIFFLAGS/SIOCSIFFLAGS) reads and writes the ifreq on our stack; the
    // flags are the union's `ifru_flags` member, which both calls use.
    let result = unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS as _, &mut req) != 0 {
            Err(Errno::last())
        } else {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            if libc::ioctl(fd, libc::SIOCSIFFLAGS as _, &req) != 0 {
                Err(Errno::last())
            } else {
                Ok(())
            }
        }
    };
    // SAFETY: close(2) of the socket opened above.
    unsafe { libc::close(fd) };
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
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Errno::last());
    }
    let mut addr = loopback(port);
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: bind/listen/getsockname on the socket above with a sockaddr_in on our stack
    // and its exact length.
    let ok = unsafe {
        libc::bind(fd, std::ptr::addr_of!(addr).cast(), len) == 0
            && libc::listen(fd, 128) == 0
            && libc::getsockname(fd, std::ptr::addr_of_mut!(addr).cast(), &mut len) == 0
    };
    if !ok {
        let errno = Errno::last();
        // SAFETY: close(2) of the socket opened above.
        unsafe { libc::close(fd) };
        return Err(errno);
    }
    Ok((fd, u16::from_be(addr.sin_port)))
}

/// A TCP connection to `127.0.0.1:port` (for the probe). Async-signal safe.
pub(crate) fn connect_loopback(port: u16) -> Result<RawFd, Errno> {
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Errno::last());
    }
    let addr = loopback(port);
    // SAFETY: connect(2) with a sockaddr_in on our stack and its length.
    if unsafe {
        libc::connect(
            fd,
            std::ptr::addr_of!(addr).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    } != 0
    {
        let errno = Errno::last();
        // SAFETY: close(2) of the socket opened above.
        unsafe { libc::close(fd) };
        return Err(errno);
    }
    Ok(fd)
}

/// A control buffer for [`MAX_LISTENERS`] descriptors, aligned as `cmsghdr` needs.
#[repr(C, align(8))]
pub(super) struct ControlBuffer([u8; 512]);

/// Sends `fds` in one message over the unix socket `sock`. Async-signal safe.
pub(crate) fn send_fds(sock: RawFd, fds: &[RawFd]) -> Result<(), Errno> {
    let mut control = ControlBuffer([0; 512]);
    let payload = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE/CMSG_LEN compute sizes only.
    let (space, len) = unsafe {
        (
            libc::CMSG_SPACE(payload as u32) as usize,
            libc::CMSG_LEN(payload as u32) as usize,
        )
    };
    if space > control.0.len() {
        return Err(Errno::E2BIG);
    }
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: a zeroed msghdr is valid (null pointers, zero lengths).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: CMSG_FIRSTHDR of a msghdr whose control buffer (on our stack) holds `space`
    // bytes, enough for one header and `payload` bytes of data; the copy writes `payload`
    // bytes into CMSG_DATA of that header; sendmsg(2) reads the message and buffers above.
    unsafe {
        let header = libc::CMSG_FIRSTHDR(&msg);
        if header.is_null() {
            return Err(Errno::EINVAL);
        }
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = len as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(header), payload);
        if libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) != 1 {
            return Err(Errno::last());
        }
    }
    Ok(())
}
