//! Mounts: mount(2), mount_setattr(2), and changing the root.

use std::ffi::CStr;

use nix::errno::Errno;

/// A `&CStr` or NULL, for the arguments of mount(2) that may be absent.
fn or_null(s: Option<&CStr>) -> *const libc::c_char {
    s.map_or(std::ptr::null(), CStr::as_ptr)
}

/// mount(2): `source` on `target` as `fstype` with `flags` and the options `data` (each
/// absent one passed as NULL: a bind, a remount, a propagation change).
pub(crate) fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> nix::Result<()> {
    // SAFETY: mount(2) with NUL-terminated strings we borrow for the call, or NULL where the
    // kernel takes none; `data` is read as a NUL-terminated option string.
    let rc = unsafe {
        libc::mount(
            or_null(source),
            target.as_ptr(),
            or_null(fstype),
            flags,
            or_null(data).cast(),
        )
    };
    Errno::result(rc).map(drop)
}

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
pub(crate) struct MountAttr {
    pub(crate) attr_set: u64,
    pub(crate) attr_clr: u64,
    pub(crate) propagation: u64,
    pub(crate) userns_fd: u64,
}

pub(crate) const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub(crate) const AT_RECURSIVE: libc::c_uint = 0x8000;

/// mount_setattr(2) of the mount at `path` (relative to the working directory) with `flags`
/// (`AT_RECURSIVE`: everything below it too). ENOSYS before Linux 5.12.
pub(crate) fn mount_setattr(path: &CStr, flags: libc::c_uint, attr: &MountAttr) -> nix::Result<()> {
    // SAFETY: mount_setattr(2) of a NUL-terminated path we borrow; it reads one `mount_attr`
    // of the size we pass from the value we borrow.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            flags,
            attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    Errno::result(rc).map(drop)
}

/// chroot(2).
pub(crate) fn chroot(path: &CStr) -> nix::Result<()> {
    // SAFETY: chroot(2) of a NUL-terminated path we borrow.
    Errno::result(unsafe { libc::chroot(path.as_ptr()) }).map(drop)
}
