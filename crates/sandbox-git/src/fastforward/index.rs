//! The worktree's index during an update: git's own lock on it, and our scratch copy.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

use crate::error::ViewError;

/// The worktree's `index.lock`, taken exactly as git takes it (exclusive create).
pub(super) struct IndexLock {
    lock: PathBuf,
    index: PathBuf,
    held: bool,
}

impl IndexLock {
    /// `Ok(None)`: someone else holds it.
    pub(super) fn acquire(gitdir: &Path) -> Result<Option<IndexLock>, ViewError> {
        let lock = gitdir.join("index.lock");
        match OpenOptions::new().write(true).create_new(true).open(&lock) {
            Ok(_) => Ok(Some(IndexLock {
                lock,
                index: gitdir.join("index"),
                held: true,
            })),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(ViewError::io("cannot create", &lock)(e)),
        }
    }

    /// Installs `new_index` as the index; the rename onto `index` releases the lock.
    pub(super) fn commit(mut self, new_index: &Path) -> std::io::Result<()> {
        std::fs::rename(new_index, &self.lock)?;
        std::fs::rename(&self.lock, &self.index)?;
        self.held = false;
        Ok(())
    }
}

impl Drop for IndexLock {
    fn drop(&mut self) {
        if self.held {
            let _ = std::fs::remove_file(&self.lock);
        }
    }
}

/// Removes a scratch file (and libgit2's lock for it) when dropped.
pub(super) struct Scratch(pub(super) PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let mut lock = self.0.clone().into_os_string();
        lock.push(".lock");
        let _ = std::fs::remove_file(lock);
    }
}
