//! "Is a watcher running for this view?" — answered with a real liveness test.
//!
//! A watcher holds an exclusive `flock` on `<runtime>/views/<project>/<task>.lock` for as
//! long as it watches the view and writes its pid there. The kernel drops the lock when the
//! process dies, however it dies, so a probe that can take the lock knows nobody holds it.
//! The files live in the runtime directory, never inside a worktree or view. They are never
//! deleted: deleting a lock file races with a process that has it open and is about to lock.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::error::ViewError;
use crate::util::create_private_dir;

/// `$XDG_RUNTIME_DIR/sandbox`, else `<tmp>/sandbox-<uid>`: the same rule as the CLI's.
pub(crate) fn default_runtime_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(v) if Path::new(&v).is_absolute() => PathBuf::from(v).join("sandbox"),
        _ => std::env::temp_dir().join(format!("sandbox-{}", nix::unistd::getuid())),
    }
}

pub(crate) fn lock_path(lock_dir: &Path, project: &str, task: &str) -> PathBuf {
    lock_dir.join(project).join(format!("{task}.lock"))
}

/// Where a watcher leaves its last report about a view (for `status`).
pub(crate) fn report_path(lock_dir: &Path, project: &str, task: &str) -> PathBuf {
    lock_dir.join(project).join(format!("{task}.last.json"))
}

/// A held watch lock; dropping it releases the lock.
#[derive(Debug)]
pub(crate) struct WatchLock {
    _file: Flock<File>,
}

fn read_pid(file: &mut File) -> Option<u32> {
    let mut s = String::new();
    file.rewind().ok()?;
    file.read_to_string(&mut s).ok()?;
    s.trim().parse().ok()
}

/// Takes the lock for a view, retrying briefly: a concurrent `status` probe holds a shared
/// lock for a few microseconds and must not make a starting watcher give up.
pub(crate) fn acquire(path: &Path, task: &str) -> Result<WatchLock, ViewError> {
    if let Some(dir) = path.parent() {
        create_private_dir(dir)?;
    }
    let deadline = Instant::now() + Duration::from_millis(300);
    loop {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(ViewError::io("cannot open the watch lock", path))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(mut locked) => {
                let pid = std::process::id();
                let write = |f: &mut File| -> std::io::Result<()> {
                    f.set_len(0)?;
                    f.rewind()?;
                    writeln!(f, "{pid}")
                };
                write(&mut locked).map_err(ViewError::io("cannot write the watch lock", path))?;
                return Ok(WatchLock { _file: locked });
            }
            Err((mut file, Errno::EWOULDBLOCK)) => {
                if Instant::now() >= deadline {
                    return Err(ViewError::AlreadyWatched {
                        task: task.to_string(),
                        pid: read_pid(&mut file),
                        lock: path.to_path_buf(),
                    });
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err((_, errno)) => {
                return Err(ViewError::Io {
                    action: "cannot lock".into(),
                    path: path.to_path_buf(),
                    source: errno.into(),
                })
            }
        }
    }
}

/// `Some(pid)` (pid if recorded) when a live process holds the lock, `None` otherwise.
pub(crate) fn probe(path: &Path) -> Option<Option<u32>> {
    let file = File::open(path).ok()?;
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(_unlocked_on_drop) => None,
        Err((mut file, Errno::EWOULDBLOCK)) => Some(read_pid(&mut file)),
        Err(_) => None,
    }
}
