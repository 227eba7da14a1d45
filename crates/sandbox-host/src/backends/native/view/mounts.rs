//! The view's steps as the child runs them, between fork and exec: raw mount, tmpfs,
//! read-only remounts and the descriptor hand-over of a staged directory — no allocation.

use super::*;
use nix::errno::Errno;
use sandbox_exec::{SetupFailure, SetupStep};
use std::ffi::CStr;

use crate::sys;

pub(super) fn view_failure(errno: Errno, detail: u32) -> SetupFailure {
    SetupFailure {
        step: SetupStep::ViewMount,
        errno,
        detail,
    }
}

/// Writes `data` to a /proc file (the id maps).
pub(super) fn write_proc(path: &CStr, data: &[u8]) -> Result<(), SetupFailure> {
    write_file(path, data).map_err(SetupFailure::at(SetupStep::IdMap))
}

/// Writes all of `data` to an existing file with one `write(2)`. Async-signal safe: shared
/// by the view and the user-namespace probe, which both run it in a forked child.
pub(crate) fn write_file(path: &CStr, data: &[u8]) -> Result<(), Errno> {
    let fd = sys::open(path, libc::O_WRONLY | libc::O_CLOEXEC, 0)?;
    let result = match sys::write(fd, data) {
        Ok(written) if written == data.len() => Ok(()),
        // A short write sets no errno: whatever errno holds is reported.
        Ok(_) => Err(Errno::last()),
        Err(errno) => Err(errno),
    };
    // `fd` was opened above and is not used after this close.
    let _ = sys::close(fd);
    result
}

pub(super) fn tmpfs(target: &CStr, data: &CStr) -> Result<(), Errno> {
    sys::mount(
        Some(c"tmpfs"),
        target,
        Some(c"tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(data),
    )
}

pub(super) fn run(step: &Step) -> Result<(), Errno> {
    match step {
        Step::Mkdir(path) => match sys::mkdir(path, 0o755) {
            Err(Errno::EEXIST) => Ok(()),
            other => other,
        },
        Step::Touch(path) => {
            // A fresh empty file, never following a link; closed at once.
            let flags =
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW;
            match sys::open(path, flags, 0o644) {
                Err(Errno::EEXIST) => Ok(()),
                Err(errno) => Err(errno),
                Ok(fd) => {
                    let _ = sys::close(fd);
                    Ok(())
                }
            }
        }
        Step::Tmpfs { target, data } => target.at(|t| tmpfs(t, data)),
        Step::Bind {
            source,
            target,
            readonly,
        } => {
            // The source too: a grant inside the worktree is a path another run can swap.
            source.at(|s| {
                target.at(|t| sys::mount(Some(s), t, None, libc::MS_BIND | libc::MS_REC, None))
            })?;
            if *readonly {
                // Opened anew: the target now leads onto the new mount's root.
                target.at(|t| set_readonly(t, true))?;
            }
            Ok(())
        }
        Step::Symlink { target, link } => sys::symlink(target, link),
        Step::Overlay { target, data } => target.at(|t| {
            sys::mount(
                Some(c"overlay"),
                t,
                Some(c"overlay"),
                libc::MS_NOSUID | libc::MS_NODEV,
                Some(data.as_c_str()),
            )
        }),
        Step::LayerTmpfs { target, data } => tmpfs(target, data),
        // unlink(2) only (nix passes a `CStr` through without allocating).
        Step::Unlink(path) => nix::unistd::unlink(path.as_c_str()),
        Step::SendLayer { dir, fd } => send_dir(dir, *fd),
        Step::Devpts(target) => target.at(|t| {
            sys::mount(
                Some(c"devpts"),
                t,
                Some(c"devpts"),
                libc::MS_NOSUID | libc::MS_NOEXEC,
                Some(DEVPTS_OPTIONS),
            )
        }),
        Step::Pin(target) => {
            // The path bound over itself, then (opened anew, onto the new mount) read-only.
            target.at(|t| sys::mount(Some(t), t, None, libc::MS_BIND, None))?;
            target.at(|t| set_readonly(t, false))
        }
        Step::Seal(target) => {
            // Recursive, so the mounts below come along; read-only on the new top mount only.
            target.at(|t| sys::mount(Some(t), t, None, libc::MS_BIND | libc::MS_REC, None))?;
            target.at(|t| set_readonly(t, false))
        }
    }
}

/// Opens `dir` and sends its descriptor over the socket `socket` (one byte, one
/// `SCM_RIGHTS`). Async-signal safe: system calls on stack buffers.
pub(super) fn send_dir(dir: &CStr, socket: libc::c_int) -> Result<(), Errno> {
    let fd = sys::open(dir, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC, 0)?;
    let result = sys::send_fds(socket, &[fd]);
    // The message holds its own reference.
    let _ = sys::close(fd);
    result
}

/// Makes the mount at `path` (and, if `recursive`, everything below it) read-only.
pub(super) fn set_readonly(path: &CStr, recursive: bool) -> Result<(), Errno> {
    let attr = sys::MountAttr {
        attr_set: sys::MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive { sys::AT_RECURSIVE } else { 0 };
    match sys::mount_setattr(path, flags, &attr) {
        Err(Errno::ENOSYS) => {}
        other => return other,
    }
    // Before Linux 5.12: a remount, keeping the flags a user namespace may not clear.
    let st = sys::statvfs(path)?;
    let keep = st.f_flag
        & (libc::ST_NOSUID
            | libc::ST_NODEV
            | libc::ST_NOEXEC
            | libc::ST_NOATIME
            | libc::ST_NODIRATIME
            | libc::ST_RELATIME);
    // A remount of an existing mount point, with flags only.
    sys::mount(
        None,
        path,
        None,
        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | keep,
        None,
    )
}

/// Makes `staging` the root. `chroot`, not `pivot_root`: detaching the old root
/// (`umount2(MNT_DETACH)`) waits for an RCU grace period, which cost more than the whole rest
/// of the view on the build machine. The host's tree then stays in the command's private
/// mount namespace, under the new root, and nothing can get back to it: a path cannot climb
/// above the root, no descriptor from outside is inherited, and leaving a chroot needs
/// `CAP_SYS_CHROOT` and the `chroot` call — the capabilities are gone after exec (dropped as
/// root, never held otherwise), seccomp denies `chroot`, `pivot_root` and every mount call,
/// and Landlock forbids mount changes on top.
pub(super) fn enter(staging: &CStr) -> Result<(), SetupFailure> {
    let fail = SetupFailure::at(SetupStep::PivotRoot);
    sys::chdir(staging).map_err(&fail)?;
    sys::chroot(c".").map_err(&fail)?;
    sys::chdir(c"/").map_err(&fail)
}
