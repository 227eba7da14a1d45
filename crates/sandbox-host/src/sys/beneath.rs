//! Resolving a path beneath a directory without following any link, for the child between
//! fork and exec (async-signal safe: system calls on the caller's strings and stack buffers).
//! The view mounts onto what this opens (`/proc/self/fd/N`), never onto a path a run of the
//! same project could swap for a link in the meantime (`DESIGN.md` §2).

use std::ffi::CStr;
use std::os::fd::RawFd;

use nix::errno::Errno;

use super::fs::{close, open};

/// `struct open_how` of openat2(2) (libc's cannot be built outside libc).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Opens `rel` (relative, no `..`) beneath the directory `root` as an `O_PATH` descriptor,
/// refusing a link in any component of `rel` (`ELOOP`): `openat2(2)` with
/// `RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS`, or before Linux 5.6 one component at a time with
/// `O_NOFOLLOW`. Mounts below `root` are crossed. The descriptor is the caller's to close.
pub(crate) fn open_beneath(root: &CStr, rel: &CStr) -> nix::Result<RawFd> {
    let dir = open(root, libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC, 0)?;
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: openat2(2) of a NUL-terminated path we borrow, relative to a descriptor we own;
    // it reads one `open_how` of the size we pass from the value we borrow.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir,
            rel.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    let result = match Errno::result(rc) {
        Ok(fd) => Ok(fd as RawFd),
        Err(Errno::ENOSYS) => walk(dir, rel.to_bytes()),
        Err(e) => Err(e),
    };
    // `dir` was opened above and is not used after this close.
    let _ = close(dir);
    result
}

/// [`open_beneath`] without openat2: each component opened `O_PATH|O_NOFOLLOW` from the one
/// before, a link (which `O_NOFOLLOW` opens as itself) refused, `..` refused.
fn walk(dir: RawFd, rel: &[u8]) -> nix::Result<RawFd> {
    // SAFETY: dup(2) of a descriptor the caller owns; the copy is ours.
    let mut at = Errno::result(unsafe { libc::fcntl(dir, libc::F_DUPFD_CLOEXEC, 0) })?;
    let mut name = [0u8; libc::NAME_MAX as usize + 1];
    for part in rel.split(|b| *b == b'/') {
        if part.is_empty() || part == b"." {
            continue;
        }
        if part == b".." || part.len() > libc::NAME_MAX as usize {
            let _ = close(at);
            return Err(Errno::EXDEV);
        }
        name[..part.len()].copy_from_slice(part);
        name[part.len()] = 0;
        // SAFETY: openat(2) of the NUL-terminated name just written to our stack buffer,
        // relative to a descriptor we own.
        let next = unsafe {
            libc::openat(
                at,
                name.as_ptr().cast(),
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        let _ = close(at);
        at = Errno::result(next)?;
        // SAFETY: fstat(2) of a descriptor we own into a zeroed struct on our stack.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if let Err(e) = Errno::result(unsafe { libc::fstat(at, &mut st) }) {
            let _ = close(at);
            return Err(e);
        }
        if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
            let _ = close(at);
            return Err(Errno::ELOOP);
        }
    }
    Ok(at)
}

/// `/proc/self/fd/<fd>` in `buf`: the path mount(2) resolves to exactly what `fd` is open on.
pub(crate) fn fd_path(fd: RawFd, buf: &mut [u8; 32]) -> &CStr {
    const PREFIX: &[u8] = b"/proc/self/fd/";
    buf[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut digits = [0u8; 10];
    let mut start = digits.len();
    let mut n = fd.max(0) as u32;
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let digits = &digits[start..];
    buf[PREFIX.len()..PREFIX.len() + digits.len()].copy_from_slice(digits);
    buf[PREFIX.len() + digits.len()] = 0;
    // The prefix and the digits hold no NUL; the one written last ends the string.
    CStr::from_bytes_until_nul(&buf[..]).unwrap_or(c"/proc/self/fd/")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    fn cstr(p: &std::path::Path) -> std::ffi::CString {
        std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap()
    }

    #[test]
    fn a_link_in_any_component_is_refused_by_both_ways() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("home/a/b")).unwrap();
        std::fs::create_dir_all(t.path().join("outside/b")).unwrap();
        std::os::unix::fs::symlink(t.path().join("outside"), t.path().join("home/l")).unwrap();
        let root = cstr(&t.path().join("home"));
        let fd = open_beneath(&root, c"a/b").unwrap();
        let mut buf = [0u8; 32];
        let shown = std::fs::read_link(std::ffi::OsStr::from_bytes(
            fd_path(fd, &mut buf).to_bytes(),
        ))
        .unwrap();
        assert_eq!(shown, t.path().join("home/a/b"));
        close(fd).unwrap();
        assert_eq!(open_beneath(&root, c"l/b"), Err(Errno::ELOOP));
        assert_eq!(open_beneath(&root, c"l"), Err(Errno::ELOOP));
        assert_eq!(open_beneath(&root, c"../outside"), Err(Errno::EXDEV));
        let dir = open(&root, libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC, 0).unwrap();
        assert_eq!(walk(dir, b"l/b"), Err(Errno::ELOOP));
        assert_eq!(walk(dir, b"l"), Err(Errno::ELOOP));
        assert_eq!(walk(dir, b"../outside"), Err(Errno::EXDEV));
        let fd = walk(dir, b"a/./b").unwrap();
        close(fd).unwrap();
        close(dir).unwrap();
    }
}
