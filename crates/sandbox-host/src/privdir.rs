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
