//! Sockets: making one, an interface's flags, binding, listening and connecting on an IPv4
//! address, single bytes, and descriptors passed over a unix socket (`SCM_RIGHTS`).

use std::ffi::CStr;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;

/// socket(2) of `domain` and `ty` (flags such as `SOCK_CLOEXEC` included), protocol 0; the
/// new descriptor is the caller's to close.
pub(crate) fn socket(domain: libc::c_int, ty: libc::c_int) -> nix::Result<RawFd> {
    // SAFETY: socket(2) takes integers only.
    Errno::result(unsafe { libc::socket(domain, ty, 0) })
}

/// An `ifreq` naming the interface `name` (EINVAL for a name longer than `IFNAMSIZ` - 1).
fn ifreq(name: &CStr) -> nix::Result<libc::ifreq> {
    // SAFETY: a zeroed ifreq is a valid value (a name and a union of integers).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let name = name.to_bytes_with_nul();
    if name.len() > req.ifr_name.len() {
        return Err(Errno::EINVAL);
    }
    for (slot, byte) in req.ifr_name.iter_mut().zip(name) {
        *slot = *byte as libc::c_char;
    }
    Ok(req)
}

/// `SIOCGIFFLAGS`: the flags of the interface `name`, asked through the socket `fd`.
pub(crate) fn interface_flags(fd: RawFd, name: &CStr) -> nix::Result<libc::c_short> {
    let mut req = ifreq(name)?;
    // SAFETY: ioctl(SIOCGIFFLAGS) reads and writes the ifreq on our stack.
    Errno::result(unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS as _, &mut req) })?;
    // SAFETY: SIOCGIFFLAGS wrote the union's `ifru_flags` member.
    Ok(unsafe { req.ifr_ifru.ifru_flags })
}

/// `SIOCSIFFLAGS`: sets the flags of the interface `name` through the socket `fd`.
pub(crate) fn set_interface_flags(fd: RawFd, name: &CStr, flags: libc::c_short) -> nix::Result<()> {
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_flags = flags;
    // SAFETY: ioctl(SIOCSIFFLAGS) reads the ifreq on our stack (the name and the union's
    // `ifru_flags` member, set above).
    Errno::result(unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS as _, &req) }).map(drop)
}

const SOCKADDR_IN_LEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_in>() as _;

/// bind(2) of the socket `fd` to the IPv4 address `addr`.
pub(crate) fn bind_in(fd: RawFd, addr: &libc::sockaddr_in) -> nix::Result<()> {
    // SAFETY: bind(2) reads a sockaddr_in we borrow, of its exact length.
    Errno::result(unsafe { libc::bind(fd, std::ptr::from_ref(addr).cast(), SOCKADDR_IN_LEN) })
        .map(drop)
}

/// listen(2) on the socket `fd`.
pub(crate) fn listen(fd: RawFd, backlog: libc::c_int) -> nix::Result<()> {
    // SAFETY: listen(2) takes integers only.
    Errno::result(unsafe { libc::listen(fd, backlog) }).map(drop)
}

/// getsockname(2) of an IPv4 socket: the address it is bound to.
pub(crate) fn local_addr_in(fd: RawFd) -> nix::Result<libc::sockaddr_in> {
    // SAFETY: a zeroed sockaddr_in is a valid value (integers only).
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = SOCKADDR_IN_LEN;
    // SAFETY: getsockname(2) writes at most `len` bytes into the sockaddr_in on our stack,
    // and the length into `len`.
    Errno::result(unsafe { libc::getsockname(fd, std::ptr::addr_of_mut!(addr).cast(), &mut len) })
        .map(|_| addr)
}

/// connect(2) of the socket `fd` to the IPv4 address `addr`.
pub(crate) fn connect_in(fd: RawFd, addr: &libc::sockaddr_in) -> nix::Result<()> {
    // SAFETY: connect(2) reads a sockaddr_in we borrow, of its exact length.
    Errno::result(unsafe { libc::connect(fd, std::ptr::from_ref(addr).cast(), SOCKADDR_IN_LEN) })
        .map(drop)
}

/// recv(2) into `buf`: how many bytes were received (0: the peer is gone).
pub(crate) fn recv(fd: RawFd, buf: &mut [u8], flags: libc::c_int) -> nix::Result<usize> {
    // SAFETY: recv(2) writes at most `buf.len()` bytes into memory we borrow mutably.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags) };
    Errno::result(n).map(|n| n as usize)
}

/// send(2) of `bytes`: how many were sent.
pub(crate) fn send(fd: RawFd, bytes: &[u8], flags: libc::c_int) -> nix::Result<usize> {
    // SAFETY: send(2) reads at most `bytes.len()` bytes from memory we borrow.
    let n = unsafe { libc::send(fd, bytes.as_ptr().cast(), bytes.len(), flags) };
    Errno::result(n).map(|n| n as usize)
}

/// A control buffer for up to 64 descriptors (`netns::MAX_LISTENERS`), aligned as `cmsghdr`
/// needs.
#[repr(C, align(8))]
struct ControlBuffer([u8; 512]);

/// Sends `fds` in one message (one byte, one `SCM_RIGHTS`) over the unix socket `sock`
/// (`MSG_NOSIGNAL`); E2BIG for more than the control buffer holds. The descriptors stay ours:
/// the message holds its own references.
pub(crate) fn send_fds(sock: RawFd, fds: &[RawFd]) -> nix::Result<()> {
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

/// Receives one message (one byte) on the unix socket `socket` (`MSG_CMSG_CLOEXEC`, no wait
/// flag: a non-blocking socket gives EAGAIN): the descriptors it carried, up to `N`, owned.
/// For the parent (allocates).
pub(crate) fn recv_fds<const N: usize>(socket: RawFd) -> std::io::Result<Vec<OwnedFd>> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; N]);
    let msg = recvmsg::<()>(
        socket,
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(std::io::Error::from)?;
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            for fd in raw {
                // SAFETY: the kernel just installed this descriptor for us; nothing else
                // owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    Ok(fds)
}
