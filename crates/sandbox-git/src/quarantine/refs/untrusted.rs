//! Reading a file the sandbox wrote: beneath its layer, with no link followed, never blocking.

use std::path::Path;

/// Opens `path`, a regular file the sandbox wrote in its layer `root`: resolved beneath
/// `root` with no symbolic link in any component (`openat2`), and without blocking on a FIFO.
/// A link the sandbox planted can thus never make the host read one of its own files (whose
/// last line would land in a reflog the sandbox can read).
#[cfg(not(target_os = "linux"))]
pub(crate) fn open_untrusted(_root: &Path, _path: &Path) -> std::io::Result<std::fs::File> {
    // No openat2: nothing here could read the layer as safely. The quarantine needs Linux's
    // private view anyway.
    Err(std::io::ErrorKind::Unsupported.into())
}

/// [`open_untrusted`] on Linux.
#[cfg(target_os = "linux")]
pub(crate) fn open_untrusted(root: &Path, path: &Path) -> std::io::Result<std::fs::File> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
    let rel = path
        .strip_prefix(root)
        .map_err(|_| std::io::Error::other("outside the layer"))?;
    let dir = std::fs::File::open(root)?;
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
    let fd = crate::sys::openat2(std::os::fd::AsRawFd::as_raw_fd(&dir), rel, how)?;
    let file = std::fs::File::from(fd);
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(file)
}

/// Reads at most `limit` bytes of `path`, a file the sandbox wrote in its layer `root`,
/// opened as [`open_untrusted`] opens it.
pub(crate) fn read_untrusted(root: &Path, path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    open_untrusted(root, path)?
        .take(limit)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}
