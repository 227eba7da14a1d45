//! The lock that serialises creating and removing the views of one project.

use std::fs::{File, OpenOptions};
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

use crate::error::ViewError;

/// Serialises create/remove within one project (`<root>/<project>/.lock`), so two
/// concurrent `create`s cannot both decide to make the same view.
pub(super) struct ProjectLock {
    _held: Flock<File>,
}

impl ProjectLock {
    pub(super) fn take(dir: &Path) -> Result<Self, ViewError> {
        std::fs::create_dir_all(dir).map_err(ViewError::io("cannot create", dir))?;
        let path = dir.join(".lock");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(ViewError::io("cannot open", &path))?;
        Flock::lock(file, FlockArg::LockExclusive)
            .map(|held| ProjectLock { _held: held })
            .map_err(|(_, e)| ViewError::io("cannot lock", &path)(e.into()))
    }
}
