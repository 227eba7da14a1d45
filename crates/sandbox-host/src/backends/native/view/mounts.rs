//! The view's steps as the child runs them, between fork and exec: raw mount, tmpfs,
//! read-only remounts and the descriptor hand-over of a staged directory — no allocation.

use super::*;
use nix::errno::Errno;
use sandbox_exec::{SetupFailure, SetupStep};
use std::ffi::CString;

pub(super) fn view_failure(errno: Errno, detail: u32) -> SetupFailure {
    SetupFailure {
        step: SetupStep::ViewMount,
        errno,
        detail,
    }
}

/// Writes `data` to a /proc file (the id maps).
pub(super) fn write_proc(path: &std::ffi::CStr, data: &[u8]) -> Result<(), SetupFailure> {
    write_file(path, data).map_err(SetupFailure::at(SetupStep::IdMap))
}

/// Writes all of `data` to an existing file with one `write(2)`. Async-signal safe: shared
/// by the view and the user-namespace probe, which both run it in a forked child.
pub(crate) fn write_file(path: &std::ffi::CStr, data: &[u8]) -> Result<(), Errno> {
    // SAFETY: open(2) of a NUL-terminated path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: write(2) of our buffer to the fd just opened; close(2) of that fd.
    let written = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
    let result = if written == data.len() as isize {
        Ok(())
    } else {
        Err(Errno::last())
    };
    // SAFETY: `fd` was opened above and is not used after this close.
    unsafe { libc::close(fd) };
    result
}

pub(super) fn check(rc: libc::c_int) -> Result<(), Errno> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

pub(super) fn tmpfs(target: &CString, data: &std::ffi::CStr) -> Result<(), Errno> {
    // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
    check(unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    })
}

pub(super) fn run(step: &Step) -> Result<(), Errno> {
    match step {
        Step::Mkdir(path) => {
            // SAFETY: mkdir(2) of a NUL-terminated path.
            match check(unsafe { libc::mkdir(path.as_ptr(), 0o755) }) {
                Err(Errno::EEXIST) => Ok(()),
                other => other,
            }
        }
        Step::Touch(path) => {
            // SAFETY: open(2) creating a fresh empty file (never following a link), then
            // close(2) of the fd it returned.
            let fd = unsafe {
                libc::open(
                    path.as_ptr(),
                    libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_WRONLY
                        | libc::O_CLOEXEC
                        | libc::O_NOFOLLOW,
                    0o644,
                )
            };
            if fd < 0 {
                return match Errno::last() {
                    Errno::EEXIST => Ok(()),
                    errno => Err(errno),
                };
            }
            // SAFETY: `fd` was just returned by open(2) and is not used again.
            unsafe { libc::close(fd) };
            Ok(())
        }
        Step::Tmpfs { target, data } => tmpfs(target, data),
        Step::Bind {
            source,
            target,
            readonly,
        } => {
            // SAFETY: mount(2) with NUL-terminated paths and no data.
            check(unsafe {
                libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                )
            })?;
            if *readonly {
                set_readonly(target, true)?;
            }
            Ok(())
        }
        Step::Symlink { target, link } => {
            // SAFETY: symlink(2) of two NUL-terminated paths.
            check(unsafe { libc::symlink(target.as_ptr(), link.as_ptr()) })
        }
        Step::Overlay { target, data } => {
            // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
            check(unsafe {
                libc::mount(
                    c"overlay".as_ptr(),
                    target.as_ptr(),
                    c"overlay".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    data.as_ptr().cast(),
                )
            })
        }
        Step::LayerTmpfs { target, data } => tmpfs(target, data),
        // unlink(2) only (nix passes a `CStr` through without allocating).
        Step::Unlink(path) => nix::unistd::unlink(path.as_c_str()),
        Step::SendLayer { dir, fd } => send_dir(dir, *fd),
        Step::Devpts(target) => {
            // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
            check(unsafe {
                libc::mount(
                    c"devpts".as_ptr(),
                    target.as_ptr(),
                    c"devpts".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NOEXEC,
                    DEVPTS_OPTIONS.as_ptr().cast(),
                )
            })
        }
        Step::Pin(path) => {
            // SAFETY: mount(2) binding a NUL-terminated path over itself, no data.
            check(unsafe {
                libc::mount(
                    path.as_ptr(),
                    path.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                )
            })?;
            set_readonly(path, false)
        }
    }
}

/// Opens `dir` and sends its descriptor over the socket `socket` (one byte, one
/// `SCM_RIGHTS`). Async-signal safe: system calls on stack buffers.
pub(super) fn send_dir(dir: &CString, socket: libc::c_int) -> Result<(), Errno> {
    // SAFETY: open(2) of a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            dir.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(Errno::last());
    }
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one cmsghdr and one int, aligned for cmsghdr.
    let mut control = [0u64; 4];
    // SAFETY: a msghdr over our stack buffers; CMSG_* compute offsets within `control`,
    // which is large enough for CMSG_SPACE(sizeof(int)) (24 bytes on 64-bit Linux).
    let rc = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>(), fd);
        libc::sendmsg(socket, &msg, libc::MSG_NOSIGNAL)
    };
    let result = if rc == 1 { Ok(()) } else { Err(Errno::last()) };
    // SAFETY: close(2) of the fd opened above (the message holds its own reference).
    unsafe { libc::close(fd) };
    result
}

/// Makes the mount at `path` (and, if `recursive`, everything below it) read-only.
pub(super) fn set_readonly(path: &std::ffi::CStr, recursive: bool) -> Result<(), Errno> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: mount_setattr(2) reads one `mount_attr` of the size we pass from our stack.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            if recursive { AT_RECURSIVE } else { 0 },
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc == 0 {
        return Ok(());
    }
    if Errno::last() != Errno::ENOSYS {
        return Err(Errno::last());
    }
    // Before Linux 5.12: a remount, keeping the flags a user namespace may not clear.
    // SAFETY: `statvfs` is a C struct of integers, for which all-zero bytes are a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs(2) reads the NUL-terminated `path` and writes one `statvfs` into `st`.
    check(unsafe { libc::statvfs(path.as_ptr(), &mut st) })?;
    let keep = st.f_flag
        & (libc::ST_NOSUID
            | libc::ST_NODEV
            | libc::ST_NOEXEC
            | libc::ST_NOATIME
            | libc::ST_NODIRATIME
            | libc::ST_RELATIME);
    // SAFETY: mount(2) remounting an existing mount point with flags only.
    check(unsafe {
        libc::mount(
            std::ptr::null(),
            path.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | keep,
            std::ptr::null(),
        )
    })
}

/// Makes `staging` the root. `chroot`, not `pivot_root`: detaching the old root
/// (`umount2(MNT_DETACH)`) waits for an RCU grace period, which cost more than the whole rest
/// of the view on the build machine. The host's tree then stays in the command's private
/// mount namespace, under the new root, and nothing can get back to it: a path cannot climb
/// above the root, no descriptor from outside is inherited, and leaving a chroot needs
/// `CAP_SYS_CHROOT` and the `chroot` call — the capabilities are gone after exec (dropped as
/// root, never held otherwise), seccomp denies `chroot`, `pivot_root` and every mount call,
/// and Landlock forbids mount changes on top.
pub(super) fn enter(staging: &CString) -> Result<(), SetupFailure> {
    let fail = || SetupFailure::last(SetupStep::PivotRoot);
    // SAFETY: chdir(2) and chroot(2) on NUL-terminated paths.
    unsafe {
        if libc::chdir(staging.as_ptr()) != 0 {
            return Err(fail());
        }
        if libc::chroot(c".".as_ptr()) != 0 {
            return Err(fail());
        }
        if libc::chdir(c"/".as_ptr()) != 0 {
            return Err(fail());
        }
    }
    Ok(())
}
