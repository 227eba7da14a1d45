//! The private TMPDIR of a run: a fresh, empty directory (mode 0700) under a new random name,
//! gone when the run ends.
//!
//! Why not simply `mkdir` and `rm -r`: on ext4 every new directory allocates an inode, and the
//! allocator scans past recently freed ones — a workload that creates and removes a directory
//! per command (an agent's) makes that scan long. It was an eighth of a whole `sandbox run`
//! (BENCHMARKS.md). So an emptied TMPDIR is parked in a pool beside the others,
//! `<root>/.sandbox-tmp-pool-<uid>-<task>/`, and the next run of the same task takes one out
//! with a rename under a new random name: no inode is allocated or freed.
//!
//! The pool is used only when it is a directory owned by us that no one else can enter, and a
//! parked directory goes back only when it is empty, mode 0700 again and carries no extended
//! attributes (an ACL the agent set could otherwise open the next run's TMPDIR to others).
//! Pools are per task (the workspace root): a directory is only ever reused by the task that
//! had it, so even a process of an earlier run that escaped its end with a descriptor of the
//! directory reaches nothing its own task could not.
//!
//! A pool names its task (a link, `.task`, to the workspace root); whenever a new pool is
//! made, the pools of tasks that are gone (a removed worktree, every test's temporary task)
//! are removed, so they do not pile up in `<root>`.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// At most this many emptied directories wait in a pool; more are removed.
const POOL_SIZE: usize = 4;

/// A private TMPDIR. Emptied and parked (or removed) by [`PrivateTmpdir::close`] or on drop.
#[derive(Debug)]
pub struct PrivateTmpdir {
    path: PathBuf,
    /// The pool it is parked in when closed.
    pool: PathBuf,
    /// The task whose pool it is (the workspace root).
    task: PathBuf,
    open: bool,
}

/// The name of this user's pools in a root, but for the task's part.
fn pool_prefix() -> String {
    format!(".sandbox-tmp-pool-{}-", nix::unistd::geteuid().as_raw())
}

fn pool_dir(root: &Path, task: &Path) -> PathBuf {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(task.as_os_str().as_bytes());
    let task: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    root.join(format!("{}{task}", pool_prefix()))
}

/// The link in a pool to its task; never a parked directory.
const TASK_LINK: &str = ".task";

/// The directories parked in `pool`.
fn parked_in(pool: &Path) -> impl Iterator<Item = std::fs::DirEntry> {
    std::fs::read_dir(pool)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name() != TASK_LINK)
}

/// Removes this user's pools in `root` but `keep` whose task is gone: the pool's link to it
/// leads nowhere, or it has none (a pool of an older version). Only pools that are private
/// directories of ours; a pool that cannot be read is left.
fn remove_pools_of_gone_tasks(root: &Path, keep: &Path) {
    let prefix = pool_prefix();
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let pool = entry.path();
        let ours = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(&prefix));
        if !ours || pool == keep || !owned_private_dir(&pool) {
            continue;
        }
        let gone = match std::fs::read_link(pool.join(TASK_LINK)) {
            Ok(task) => {
                std::fs::symlink_metadata(task).is_err_and(|e| e.kind() == io::ErrorKind::NotFound)
            }
            Err(e) => e.kind() == io::ErrorKind::NotFound,
        };
        if gone {
            // Another run of that task cannot be: at worst a run parking into it loses its
            // rename and removes its directory instead.
            let _ = std::fs::remove_dir_all(&pool);
        }
    }
}

/// A directory owned by us, mode 0700 exactly, not a link.
fn owned_private_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| {
        m.is_dir() && m.uid() == nix::unistd::geteuid().as_raw() && m.mode() & 0o7777 == 0o700
    })
}

/// A fresh name, or `None` if the kernel's random source fails (the pool is only a cache:
/// its callers then skip it).
fn random_name(prefix: &str) -> Option<String> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).ok()?;
    let suffix: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Some(format!("{prefix}{suffix}"))
}

/// `rename(2)` that never replaces an existing target.
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let from = CString::new(from.as_os_str().as_bytes())?;
    let to = CString::new(to.as_os_str().as_bytes())?;
    crate::sys::rename_noreplace(&from, &to).map_err(io::Error::from)
}

/// Whether `path` carries extended attributes (ACLs included).
fn has_xattrs(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return true;
    };
    // A failure to list them counts as some: the directory is not reused.
    !matches!(crate::sys::xattr_list_len(&c), Ok(0))
}

impl PrivateTmpdir {
    /// A new private TMPDIR in `root` for a run of `task` (its workspace root), named
    /// `<prefix><random>`: a parked one of this task renamed out of its pool if there is one,
    /// else a new directory.
    pub fn create(prefix: &str, root: &Path, task: &Path) -> io::Result<Self> {
        let pool = pool_dir(root, task);
        if let Some(path) = Self::take_parked(prefix, root, &pool) {
            return Ok(PrivateTmpdir {
                path,
                pool,
                task: task.to_path_buf(),
                open: true,
            });
        }
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            // Private: other local users must not read what the agent leaves here.
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir_in(root)?;
        Ok(PrivateTmpdir {
            path: dir.keep(),
            pool,
            task: task.to_path_buf(),
            open: true,
        })
    }

    fn take_parked(prefix: &str, root: &Path, pool: &Path) -> Option<PathBuf> {
        if !owned_private_dir(pool) {
            return None;
        }
        for entry in parked_in(pool).take(POOL_SIZE * 2) {
            let target = root.join(random_name(prefix)?);
            // Another run may take the same one first: then it is gone (ENOENT); try the next.
            if rename_noreplace(&entry.path(), &target).is_err() {
                continue;
            }
            let empty = std::fs::read_dir(&target).is_ok_and(|mut d| d.next().is_none());
            if owned_private_dir(&target) && empty && !has_xattrs(&target) {
                return Some(target);
            }
            // Not as it was parked: never hand it out.
            let _ = std::fs::remove_dir_all(&target);
        }
        None
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Empties the directory and parks it in the pool (or removes it when the pool is full or
    /// the directory is not fit to be handed out again).
    pub fn close(mut self) -> io::Result<()> {
        self.open = false;
        self.finish()
    }

    fn finish(&self) -> io::Result<()> {
        if self.empty_out().is_err() || !self.park() {
            return std::fs::remove_dir_all(&self.path);
        }
        Ok(())
    }

    fn empty_out(&self) -> io::Result<()> {
        for entry in std::fs::read_dir(&self.path)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                std::fs::remove_dir_all(entry.path())?;
            } else {
                std::fs::remove_file(entry.path())?;
            }
        }
        Ok(())
    }

    /// Moves the (empty) directory into the pool; `false` if it must be removed instead.
    fn park(&self) -> bool {
        // The run could chmod its TMPDIR or give it an ACL; only a plain private directory is
        // handed to the next run.
        if std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(0o700)).is_err()
            || !owned_private_dir(&self.path)
            || has_xattrs(&self.path)
        {
            return false;
        }
        let pool = &self.pool;
        if let Err(e) = std::fs::create_dir(pool) {
            if e.kind() != io::ErrorKind::AlreadyExists {
                return false;
            }
        } else {
            let _ = std::fs::set_permissions(pool, std::fs::Permissions::from_mode(0o700));
            let _ = std::os::unix::fs::symlink(&self.task, pool.join(TASK_LINK));
            if let Some(root) = pool.parent() {
                remove_pools_of_gone_tasks(root, pool);
            }
        }
        if !owned_private_dir(pool) {
            return false;
        }
        let parked = std::fs::read_dir(pool).map_or(usize::MAX, |d| {
            d.flatten().filter(|e| e.file_name() != TASK_LINK).count()
        });
        parked < POOL_SIZE
            && random_name("t-")
                .is_some_and(|name| rename_noreplace(&self.path, &pool.join(name)).is_ok())
    }
}

impl Drop for PrivateTmpdir {
    fn drop(&mut self) {
        if self.open {
            if let Err(e) = self.finish() {
                tracing::debug!(path = %self.path.display(), error = %e, "could not remove TMPDIR");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TASK: &str = "/work/proj-task1";

    fn parked(root: &Path) -> usize {
        parked_in(&pool_dir(root, Path::new(TASK))).count()
    }

    fn create(root: &Path) -> PrivateTmpdir {
        PrivateTmpdir::create("sandbox-run-", root, Path::new(TASK)).unwrap()
    }

    #[test]
    fn a_closed_tmpdir_is_emptied_parked_and_handed_out_under_a_new_name() {
        let root = tempfile::tempdir().unwrap();
        let first = create(root.path());
        let first_path = first.path().to_path_buf();
        let inode = std::fs::metadata(&first_path).unwrap().ino();
        std::fs::create_dir_all(first_path.join("a/b")).unwrap();
        std::fs::write(first_path.join("a/b/f"), "left behind").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", first_path.join("link")).unwrap();
        first.close().unwrap();
        assert!(!first_path.exists());
        assert_eq!(parked(root.path()), 1);

        let second = create(root.path());
        assert_ne!(second.path(), first_path, "a new name");
        assert_eq!(
            std::fs::metadata(second.path()).unwrap().ino(),
            inode,
            "reused"
        );
        assert!(
            std::fs::read_dir(second.path()).unwrap().next().is_none(),
            "empty"
        );
        assert_eq!(
            std::fs::metadata(second.path()).unwrap().mode() & 0o7777,
            0o700
        );
        assert_eq!(parked(root.path()), 0);
        // /etc/passwd was a link target, never followed.
        assert!(Path::new("/etc/passwd").exists());
    }

    #[test]
    fn a_tmpdir_opened_up_by_the_run_is_closed_again_or_not_reused() {
        let root = tempfile::tempdir().unwrap();
        let dir = create(root.path());
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        dir.close().unwrap();
        let next = create(root.path());
        assert_eq!(
            std::fs::metadata(next.path()).unwrap().mode() & 0o7777,
            0o700
        );

        // An extended attribute (an ACL is one) keeps it out of the pool.
        let c = CString::new(next.path().as_os_str().as_bytes()).unwrap();
        let set = crate::sys::set_xattr(&c, c"user.mark", b"1");
        if set.is_err() {
            sandbox_testkit::skip("user-xattrs", "this file system takes no user xattrs");
            return;
        }
        let before = parked(root.path());
        let path = next.path().to_path_buf();
        next.close().unwrap();
        assert!(!path.exists());
        assert_eq!(
            parked(root.path()),
            before,
            "a directory with xattrs was parked"
        );
    }

    #[test]
    fn a_pool_others_can_enter_or_a_link_is_never_used() {
        let root = tempfile::tempdir().unwrap();
        let pool = pool_dir(root.path(), Path::new(TASK));
        std::fs::create_dir(&pool).unwrap();
        std::fs::create_dir(pool.join("planted")).unwrap();
        std::fs::write(pool.join("planted/secret"), "x").unwrap();
        std::fs::set_permissions(&pool, std::fs::Permissions::from_mode(0o777)).unwrap();
        let dir = create(root.path());
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
        assert!(
            pool.join("planted/secret").exists(),
            "took from an open pool"
        );
        dir.close().unwrap();
        assert!(pool.join("planted").exists());
        assert_eq!(parked(root.path()), 1, "parked in a pool others can enter");

        // A link in the pool's place is not followed either way.
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::create_dir(elsewhere.path().join("spare")).unwrap();
        std::fs::set_permissions(
            elsewhere.path().join("spare"),
            std::fs::Permissions::from_mode(0o700),
        )
        .unwrap();
        std::fs::remove_dir_all(&pool).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), &pool).unwrap();
        let dir = create(root.path());
        assert!(
            elsewhere.path().join("spare").exists(),
            "took through a link"
        );
        dir.close().unwrap();
        assert_eq!(
            std::fs::read_dir(elsewhere.path()).unwrap().count(),
            1,
            "parked through a link"
        );
    }

    #[test]
    fn a_parked_dir_that_changed_is_never_handed_out() {
        let root = tempfile::tempdir().unwrap();
        create(root.path()).close().unwrap();
        let pool = pool_dir(root.path(), Path::new(TASK));
        let spare = parked_in(&pool).next().unwrap().path();
        std::fs::write(spare.join("planted"), "x").unwrap();
        let dir = create(root.path());
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
        assert!(
            !spare.exists(),
            "the changed spare was removed, not handed out"
        );
    }

    #[test]
    fn another_task_never_gets_this_tasks_directory() {
        let root = tempfile::tempdir().unwrap();
        let mine = create(root.path());
        let inode = std::fs::metadata(mine.path()).unwrap().ino();
        mine.close().unwrap();
        assert_eq!(parked(root.path()), 1);
        let other =
            PrivateTmpdir::create("sandbox-run-", root.path(), Path::new("/work/other")).unwrap();
        assert_ne!(std::fs::metadata(other.path()).unwrap().ino(), inode);
        assert_eq!(
            parked(root.path()),
            1,
            "the other task took this task's spare"
        );
    }

    #[test]
    fn two_runs_never_get_the_same_directory() {
        let root = tempfile::tempdir().unwrap();
        create(root.path()).close().unwrap();
        let barrier = std::sync::Barrier::new(2);
        let (a, b) = std::thread::scope(|s| {
            let take = || {
                barrier.wait();
                create(root.path())
            };
            let a = s.spawn(take);
            let b = s.spawn(take);
            (a.join().unwrap(), b.join().unwrap())
        });
        assert_ne!(a.path(), b.path());
        let ino = |d: &PrivateTmpdir| std::fs::metadata(d.path()).unwrap().ino();
        assert_ne!(ino(&a), ino(&b), "one directory handed to both runs");
    }

    /// A pool whose task is gone (its worktree removed, a test's temporary task) is removed
    /// when the next new pool is made; the pool of a task that is still there, a pool of an
    /// older version without its link, and a pool others can enter are dealt with as said.
    #[test]
    fn the_pools_of_tasks_that_are_gone_are_removed() {
        let root = tempfile::tempdir().unwrap();
        let tasks = tempfile::tempdir().unwrap();
        let task = |name: &str| {
            let t = tasks.path().join(name);
            std::fs::create_dir_all(&t).unwrap();
            t
        };
        let run = |task: &Path| {
            PrivateTmpdir::create("sandbox-run-", root.path(), task)
                .unwrap()
                .close()
                .unwrap();
            pool_dir(root.path(), task)
        };
        let (gone, kept) = (task("gone"), task("kept"));
        let gone_pool = run(&gone);
        let kept_pool = run(&kept);
        assert_eq!(
            std::fs::read_link(gone_pool.join(TASK_LINK)).unwrap(),
            gone,
            "a pool names its task"
        );
        assert_eq!(parked_in(&gone_pool).count(), 1);
        // Of an older version: no link.
        let old = pool_dir(root.path(), Path::new("/work/an-old-one"));
        std::fs::create_dir(&old).unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o700)).unwrap();
        // Not private: not ours to judge.
        let open = pool_dir(root.path(), Path::new("/work/an-open-one"));
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::remove_dir_all(&gone).unwrap();
        // An existing pool is reused without a sweep.
        run(&kept);
        assert!(gone_pool.exists());
        // A new task's first run makes a pool: the gone task's goes.
        let new_pool = run(&task("new"));
        assert!(!gone_pool.exists(), "the gone task's pool is left");
        assert!(!old.exists(), "a pool without its link is left");
        assert!(kept_pool.exists() && new_pool.exists());
        assert_eq!(parked_in(&kept_pool).count(), 1);
        assert!(open.exists(), "a pool others can enter was removed");
    }
}
