//! Where one box's git data lives on the host.

use std::path::{Path, PathBuf};

use crate::quarantine::error::{io, QuarantineError};

/// Where one box's git data lives on the host, under its own directory `root`.
#[derive(Debug, Clone)]
pub struct BoxGit {
    /// The repository's common dir.
    pub common: PathBuf,
    /// The linked worktree's own git dir on the host (`<common>/worktrees/<name>`).
    pub worktree_gitdir: PathBuf,
    pub(super) root: PathBuf,
}

impl BoxGit {
    /// The box's git directories under `root` (created, mode 0700): `git/` is mounted
    /// writable in the box at its own path, `collect/` never is, `pointer` is the file mounted
    /// read-only over the worktree's `.git`.
    pub fn new(
        common: &Path,
        worktree_gitdir: &Path,
        root: &Path,
    ) -> Result<Self, QuarantineError> {
        use std::os::unix::fs::DirBuilderExt;
        let git = BoxGit {
            common: common.to_path_buf(),
            worktree_gitdir: worktree_gitdir.to_path_buf(),
            root: root.to_path_buf(),
        };
        for dir in [root.to_path_buf(), git.writable(), git.collect_dir()] {
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io("creating", &dir)(e)),
            }
            if !dir.symlink_metadata().is_ok_and(|m| m.is_dir()) {
                return Err(QuarantineError::Io {
                    what: "refusing a box git directory that is not a directory",
                    path: dir,
                    source: std::io::Error::other("not a directory"),
                });
            }
        }
        let pointer = git.pointer();
        std::fs::write(&pointer, git.pointer_text()).map_err(io("writing", &pointer))?;
        Ok(git)
    }

    /// Mounted writable in the box, at its own path: `current` and the generations.
    pub fn writable(&self) -> PathBuf {
        self.root.join("git")
    }

    /// Where a generation is moved to be read back: never in the box.
    pub(super) fn collect_dir(&self) -> PathBuf {
        self.root.join("collect")
    }

    /// The host's records of the generations in use: never in the box.
    pub(super) fn records_dir(&self) -> PathBuf {
        self.root.join("records")
    }

    /// The file mounted read-only over the worktree's `.git` in the box.
    pub fn pointer(&self) -> PathBuf {
        self.root.join("pointer")
    }

    pub(super) fn worktree_name(&self) -> String {
        self.worktree_gitdir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// What the box's `.git` says: the current generation's admin dir of the worktree.
    pub fn pointer_text(&self) -> String {
        format!(
            "gitdir: {}\n",
            self.writable()
                .join("current/worktrees")
                .join(self.worktree_name())
                .display()
        )
    }
}
