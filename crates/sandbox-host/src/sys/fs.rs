//! Descriptors and paths: open, write, close, directories and links, the working directory,
//! locks, renames that replace nothing, extended attributes, and opening a descriptor the
//! caller then owns.

#[cfg(target_os = "linux")]
use std::ffi::CStr;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use nix::NixPath;

/// open(2) of `path` (`mode` is read only with `O_CREAT`); the new descriptor is the
/// caller's to close ([`close`]).
#[cfg(target_os = "linux")]
pub(crate) fn open(path: &CStr, flags: libc::c_int, mode: libc::mode_t) -> nix::Result<RawFd> {
    // SAFETY: open(2) of a NUL-terminated path we borrow; the mode is an integer.
    Errno::result(unsafe { libc::open(path.as_ptr(), flags, mode as libc::c_uint) })
}

/// close(2) of a descriptor number the caller owns (EBADF for a free one).
#[cfg(target_os = "linux")]
pub(crate) fn close(fd: RawFd) -> nix::Result<()> {
    // SAFETY: close(2) takes an integer; the caller owns the descriptor.
    Errno::result(unsafe { libc::close(fd) }).map(drop)
}

/// write(2) of `bytes`: how many were written.
#[cfg(target_os = "linux")]
pub(crate) fn write(fd: RawFd, bytes: &[u8]) -> nix::Result<usize> {
    // SAFETY: write(2) reads at most `bytes.len()` bytes from memory we borrow.
    let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
    Errno::result(n).map(|n| n as usize)
}

/// mkdir(2).
#[cfg(target_os = "linux")]
pub(crate) fn mkdir(path: &CStr, mode: libc::mode_t) -> nix::Result<()> {
    // SAFETY: mkdir(2) of a NUL-terminated path we borrow.
    Errno::result(unsafe { libc::mkdir(path.as_ptr(), mode) }).map(drop)
}

/// symlink(2): `link` points to `target`.
#[cfg(target_os = "linux")]
pub(crate) fn symlink(target: &CStr, link: &CStr) -> nix::Result<()> {
    // SAFETY: symlink(2) of two NUL-terminated paths we borrow.
    Errno::result(unsafe { libc::symlink(target.as_ptr(), link.as_ptr()) }).map(drop)
}

/// getcwd(2) into `buf`: the working directory, borrowed from it.
#[cfg(target_os = "linux")]
pub(crate) fn getcwd(buf: &mut [u8]) -> nix::Result<&CStr> {
    // SAFETY: getcwd(2) writes at most `buf.len()` bytes into memory we borrow mutably.
    if unsafe { libc::getcwd(buf.as_mut_ptr().cast(), buf.len()) }.is_null() {
        return Err(Errno::last());
    }
    // On success the path is NUL-terminated within `buf`.
    CStr::from_bytes_until_nul(buf).map_err(|_| Errno::ERANGE)
}

/// chdir(2).
#[cfg(target_os = "linux")]
pub(crate) fn chdir(path: &CStr) -> nix::Result<()> {
    // SAFETY: chdir(2) on a NUL-terminated path we borrow.
    Errno::result(unsafe { libc::chdir(path.as_ptr()) }).map(drop)
}

/// statvfs(2) of the file system holding `path`.
#[cfg(target_os = "linux")]
pub(crate) fn statvfs(path: &CStr) -> nix::Result<libc::statvfs> {
    // SAFETY: `statvfs` is a C struct of integers, for which all-zero bytes are a valid
    // value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs(2) reads the NUL-terminated `path` and writes one `statvfs` into `st`.
    Errno::result(unsafe { libc::statvfs(path.as_ptr(), &mut st) }).map(|_| st)
}

/// flock(2) on `fd` with `how` (`LOCK_EX`, `LOCK_NB`, ...); the lock goes with the open
/// file.
pub(crate) fn flock(fd: RawFd, how: libc::c_int) -> nix::Result<()> {
    // SAFETY: flock(2) takes a descriptor number and an integer.
    Errno::result(unsafe { libc::flock(fd, how) }).map(drop)
}

/// rename(2) of `from` to `to` (paths relative to the working directory) that never replaces
/// an existing `to` (EEXIST): `renameat2(RENAME_NOREPLACE)`.
#[cfg(target_os = "linux")]
pub(crate) fn rename_noreplace(from: &CStr, to: &CStr) -> nix::Result<()> {
    // SAFETY: renameat2(2) with two NUL-terminated paths we borrow, relative to the working
    // directory, and a constant flag.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    Errno::result(rc).map(drop)
}

/// As on Linux, with macOS's `renamex_np(RENAME_EXCL)`.
#[cfg(target_os = "macos")]
pub(crate) fn rename_noreplace(from: &std::ffi::CStr, to: &std::ffi::CStr) -> nix::Result<()> {
    // SAFETY: renamex_np(2) with two NUL-terminated paths we borrow and a constant flag.
    let rc = unsafe { libc::renamex_np(from.as_ptr(), to.as_ptr(), libc::RENAME_EXCL) };
    Errno::result(rc).map(drop)
}

/// The size of the list of extended attribute names of `path` itself (a link is not
/// followed): 0 when it has none.
#[cfg(target_os = "linux")]
pub(crate) fn xattr_list_len(path: &CStr) -> nix::Result<usize> {
    // SAFETY: llistxattr(2) of a NUL-terminated path we borrow, with a NULL buffer of size
    // 0: it only returns the size the list needs.
    let size = unsafe { libc::llistxattr(path.as_ptr(), std::ptr::null_mut(), 0) };
    Errno::result(size).map(|n| n as usize)
}

/// As on Linux, with macOS's `listxattr(XATTR_NOFOLLOW)`.
#[cfg(target_os = "macos")]
pub(crate) fn xattr_list_len(path: &std::ffi::CStr) -> nix::Result<usize> {
    // SAFETY: listxattr(2) of a NUL-terminated path we borrow (XATTR_NOFOLLOW: of a link
    // itself), with a NULL buffer of size 0: it only returns the size the list needs.
    let size =
        unsafe { libc::listxattr(path.as_ptr(), std::ptr::null_mut(), 0, libc::XATTR_NOFOLLOW) };
    Errno::result(size).map(|n| n as usize)
}

/// setxattr(2): the extended attribute `name` of `path` holds `value`.
#[cfg(target_os = "linux")]
pub(crate) fn set_xattr(path: &CStr, name: &CStr, value: &[u8]) -> nix::Result<()> {
    // SAFETY: setxattr(2) of NUL-terminated strings we borrow and `value.len()` bytes read
    // from the slice we borrow.
    let rc = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    Errno::result(rc).map(drop)
}

/// removexattr(2) of the extended attribute `name` of `path`.
#[cfg(target_os = "linux")]
pub(crate) fn remove_xattr(path: &CStr, name: &CStr) -> nix::Result<()> {
    // SAFETY: removexattr(2) of two NUL-terminated strings we borrow.
    Errno::result(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) }).map(drop)
}

/// openat(2) of `path` relative to `dir` (`None`: the working directory), as
/// [`nix::fcntl::openat`]: the new descriptor, owned. For the parent (it may allocate, for a
/// long path).
pub(crate) fn openat<P: ?Sized + NixPath>(
    dir: Option<RawFd>,
    path: &P,
    flags: OFlag,
    mode: Mode,
) -> nix::Result<OwnedFd> {
    let fd = nix::fcntl::openat(dir, path, flags, mode)?;
    // SAFETY: `fd` was just returned by openat(2) and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// openat2(2) of `path` relative to `dir`, resolved as `how` says, as
/// [`nix::fcntl::openat2`]: the new descriptor, owned. For the parent.
#[cfg(target_os = "linux")]
pub(crate) fn openat2<P: ?Sized + NixPath>(
    dir: RawFd,
    path: &P,
    how: nix::fcntl::OpenHow,
) -> nix::Result<OwnedFd> {
    let fd = nix::fcntl::openat2(dir, path, how)?;
    // SAFETY: `fd` was just returned by openat2(2) and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
