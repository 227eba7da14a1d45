//! Descriptors and paths: open, write, close, directories and links, the working directory.

use std::ffi::CStr;
use std::os::fd::RawFd;

use nix::errno::Errno;

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
