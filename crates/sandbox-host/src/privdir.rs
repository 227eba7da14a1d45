//! Our private directory: where files that decide the boundary live while a run needs them
//! (nono's manifest, the private view's staging directory, probe caches). It must be a
//! directory owned by us that no one else can write, outside everything the sandbox can write.

use std::path::{Path, PathBuf};

use crate::error::HostError;

/// True if `dir` is a directory owned by us that nobody else can write.
pub fn is_private(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match std::fs::symlink_metadata(dir) {
        Ok(m) => m.is_dir() && m.uid() == nix::unistd::geteuid().as_raw() && m.mode() & 0o022 == 0,
        Err(_) => false,
    }
}

/// Creates `dir` (mode 0700) if needed and checks it is private; returns it canonical.
/// `backend` names who needs it, for the error.
pub fn ensure(backend: &'static str, dir: &Path) -> Result<PathBuf, HostError> {
    use std::os::unix::fs::DirBuilderExt;
    let fail = |cause: String| HostError::PrivateDir {
        backend,
        path: dir.to_path_buf(),
        cause,
    };
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| fail(format!("creating it: {e}")))?;
    }
    if !is_private(dir) {
        return Err(fail(
            "it is not a directory owned by you that no one else can write".into(),
        ));
    }
    std::fs::canonicalize(dir).map_err(|e| fail(format!("resolving it: {e}")))
}

#[cfg(target_os = "linux")]
fn on_tmpfs(dir: &Path) -> bool {
    nix::sys::statfs::statfs(dir)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

#[cfg(target_os = "linux")]
/// Whether `dir` takes `user.*` extended attributes (an overlay's writable layer in a user
/// namespace keeps its whiteouts and opaque markers there).
fn takes_user_xattrs(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    let name = c"user.sandbox-probe";
    // SAFETY: setxattr(2)/removexattr(2) on NUL-terminated strings and a one-byte value.
    unsafe {
        if libc::setxattr(path.as_ptr(), name.as_ptr(), b"1".as_ptr().cast(), 1, 0) != 0 {
            return false;
        }
        libc::removexattr(path.as_ptr(), name.as_ptr());
    }
    true
}

#[cfg(target_os = "linux")]
/// A private directory on a memory filesystem for what every run makes and removes (the git
/// store quarantine's layers): on a disk mounted with `discard`, each directory removed costs a
/// TRIM, several milliseconds each on the build machine. `private` itself when it is on tmpfs,
/// else `/dev/shm/sandbox-<uid>` when that is tmpfs, ours alone and takes user xattrs; `None`
/// when neither is (the caller then uses `private`). `usable` rejects a candidate (one the
/// policy grants, say).
pub fn memory_scratch(private: &Path, usable: &dyn Fn(&Path) -> bool) -> Option<PathBuf> {
    if on_tmpfs(private) && usable(private) && takes_user_xattrs(private) {
        return Some(private.to_path_buf());
    }
    let shm = Path::new("/dev/shm");
    if !on_tmpfs(shm) {
        return None;
    }
    let dir = shm.join(format!("sandbox-{}", nix::unistd::geteuid()));
    let dir = ensure("native", &dir).ok()?;
    (on_tmpfs(&dir) && usable(&dir) && takes_user_xattrs(&dir)).then_some(dir)
}
