//! File operations the host makes in trees a run can write (the private home, the package
//! caches' layers): every name is resolved from a directory descriptor, one component at a
//! time, never through a link (`O_NOFOLLOW`). A run of the same project that swaps a
//! directory for a link between two of our steps makes the step fail, instead of sending it
//! outside the tree (`DESIGN.md` §2: descriptors, never paths).

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};
use nix::unistd::UnlinkatFlags;

use crate::sys;

/// What an entry of a directory is, its link not followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File { empty: bool },
    Link,
    Other,
}

/// How deep [`Dir::disk_usage`] goes: each level holds a descriptor open.
pub const MAX_DEPTH: usize = 256;

/// An open directory of a tree the host works in.
#[derive(Debug)]
pub struct Dir(OwnedFd);

impl Dir {
    /// Opens `path`, the tree's root: a path of ours (the state directory's), so only its
    /// last component is refused as a link.
    pub fn open(path: &Path) -> io::Result<Dir> {
        open_at(None, path.as_os_str())
    }

    /// The directory `name` in this one (a single component; a link is refused).
    pub fn dir(&self, name: &OsStr) -> io::Result<Dir> {
        single(name)?;
        open_at(Some(self), name)
    }

    /// The directory at `rel` below this one, each component opened as in [`Self::dir`].
    pub fn walk(&self, rel: &Path) -> io::Result<Dir> {
        let mut at = self.dir(OsStr::new("."))?;
        for component in rel.components() {
            match component {
                Component::Normal(name) => at = at.dir(name)?,
                Component::CurDir => {}
                _ => return Err(io::Error::other(format!("{}: not beneath", rel.display()))),
            }
        }
        Ok(at)
    }

    /// What `name` is, `None` when there is nothing of that name.
    pub fn kind(&self, name: &OsStr) -> io::Result<Option<Kind>> {
        single(name)?;
        let st = match fstatat(
            Some(self.0.as_raw_fd()),
            name,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => st,
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let format = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
        Ok(Some(match format {
            SFlag::S_IFDIR => Kind::Dir,
            SFlag::S_IFREG => Kind::File {
                empty: st.st_size == 0,
            },
            SFlag::S_IFLNK => Kind::Link,
            _ => Kind::Other,
        }))
    }

    /// Makes the directory `name` (`mode` before the umask); one that exists is an error.
    pub fn mkdir(&self, name: &OsStr, mode: u32) -> io::Result<()> {
        single(name)?;
        nix::sys::stat::mkdirat(
            Some(self.0.as_raw_fd()),
            name,
            Mode::from_bits_truncate(mode as _),
        )?;
        Ok(())
    }

    /// Removes the empty directory `name` (not a link, not a full directory).
    pub fn rmdir(&self, name: &OsStr) -> io::Result<()> {
        single(name)?;
        nix::unistd::unlinkat(Some(self.0.as_raw_fd()), name, UnlinkatFlags::RemoveDir)?;
        Ok(())
    }

    /// Removes the file or link `name` (never what a link points to).
    pub fn unlink(&self, name: &OsStr) -> io::Result<()> {
        single(name)?;
        nix::unistd::unlinkat(Some(self.0.as_raw_fd()), name, UnlinkatFlags::NoRemoveDir)?;
        Ok(())
    }

    /// The directory at `rel` below this one, each missing component made (`0700`) and each
    /// that is not a directory — a link, a file a run left in the way — removed first.
    pub fn make_dirs(&self, rel: &Path) -> io::Result<Dir> {
        let mut at = self.dir(OsStr::new("."))?;
        for component in rel.components() {
            let Component::Normal(name) = component else {
                return Err(io::Error::other(format!("{}: not beneath", rel.display())));
            };
            match at.kind(name)? {
                Some(Kind::Dir) => {}
                None => at.mkdir(name, 0o700)?,
                Some(_) => {
                    at.remove_all(name)?;
                    at.mkdir(name, 0o700)?;
                }
            }
            at = at.dir(name)?;
        }
        Ok(at)
    }

    /// Puts a new file `name` holding `bytes` (mode `0600`) in place of whatever had that
    /// name: written under a fresh name (`O_EXCL|O_NOFOLLOW`), then renamed over it — a link
    /// in its place is replaced, never followed.
    pub fn replace_file(&self, name: &OsStr, bytes: &[u8]) -> io::Result<()> {
        use std::io::Write as _;
        single(name)?;
        let mut random = [0u8; 8];
        getrandom::fill(&mut random).map_err(io::Error::other)?;
        let temp = format!(
            ".sandbox-new-{}",
            random
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        let fd = sys::openat(
            Some(self.0.as_raw_fd()),
            temp.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )?;
        let mut file = std::fs::File::from(fd);
        let written = file.write_all(bytes).and_then(|()| {
            nix::fcntl::renameat(
                Some(self.0.as_raw_fd()),
                temp.as_str(),
                Some(self.0.as_raw_fd()),
                name,
            )
            .map_err(io::Error::from)
        });
        if written.is_err() {
            let _ = self.unlink(OsStr::new(&temp));
        }
        written
    }

    /// Makes the empty file `name` (`0600`): `O_CREAT|O_EXCL|O_NOFOLLOW`, so whatever is in
    /// its place (a link) is an error, never followed.
    pub fn create_file(&self, name: &OsStr) -> io::Result<()> {
        single(name)?;
        sys::openat(
            Some(self.0.as_raw_fd()),
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )?;
        Ok(())
    }

    /// Opens the regular file `name` for reading, never through a link, never blocking on a
    /// FIFO a run left in its place.
    pub fn open_file(&self, name: &OsStr) -> io::Result<std::fs::File> {
        single(name)?;
        let fd = sys::openat(
            Some(self.0.as_raw_fd()),
            name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let file = std::fs::File::from(fd);
        if !file.metadata()?.is_file() {
            return Err(io::Error::other(format!(
                "{}: not a regular file",
                Path::new(name).display()
            )));
        }
        Ok(file)
    }

    /// Makes the link `name` pointing at `target` (`symlinkat`: `name` in this directory).
    pub fn symlink(&self, target: &Path, name: &OsStr) -> io::Result<()> {
        single(name)?;
        nix::unistd::symlinkat(target, Some(self.0.as_raw_fd()), name)?;
        Ok(())
    }

    /// Renames `from` to `to` in this directory (`renameat`, single names: neither is
    /// followed if a link; an existing `to` is replaced as `rename(2)` does). Only the
    /// cache layers use it, which only Linux has.
    #[cfg(target_os = "linux")]
    pub fn rename(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        single(from)?;
        single(to)?;
        let fd = self.0.as_raw_fd();
        nix::fcntl::renameat(Some(fd), from, Some(fd), to)?;
        Ok(())
    }

    /// Where the link `name` points (`readlinkat`), `None` when `name` is not a link.
    pub fn read_link(&self, name: &OsStr) -> io::Result<Option<std::path::PathBuf>> {
        if self.kind(name)? != Some(Kind::Link) {
            return Ok(None);
        }
        let target = nix::fcntl::readlinkat(Some(self.0.as_raw_fd()), name)?;
        Ok(Some(target.into()))
    }

    /// The names in this directory (not `.` and `..`).
    pub fn names(&self) -> io::Result<Vec<std::ffi::OsString>> {
        // Dir takes its descriptor: read through a new one of the same directory.
        let fd = openat(
            Some(self.0.as_raw_fd()),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let mut dir = nix::dir::Dir::from_fd(fd)?;
        let mut names = Vec::new();
        for entry in dir.iter() {
            let entry = entry?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name != "." && name != ".." {
                names.push(name.to_os_string());
            }
        }
        Ok(names)
    }

    /// Removes `name` and everything below it, following no link. Directories overlayfs
    /// made without permissions (its `work/work`, `incompat/volatile`) are made searchable
    /// first: they are the user's own, and only root could remove them as they are.
    pub fn remove_all(&self, name: &OsStr) -> io::Result<()> {
        match self.kind(name)? {
            None => Ok(()),
            Some(Kind::Dir) => {
                match self.rmdir(name) {
                    Ok(()) => return Ok(()),
                    Err(e) if is_not_empty(&e) => {}
                    Err(e) => return Err(e),
                }
                let inner = match self.dir(name) {
                    Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
                        self.make_searchable(name)?;
                        self.dir(name)?
                    }
                    other => other?,
                };
                for entry in inner.names()? {
                    inner.remove_all(&entry)?;
                }
                self.rmdir(name)
            }
            Some(_) => self.unlink(name),
        }
    }

    /// The disk the tree below this directory takes, in bytes: the allocated blocks of every
    /// entry, each inode once, no link followed. Directories past [`MAX_DEPTH`] (or that
    /// cannot be read) are not counted.
    // The casts: `st_dev`, `st_ino` and `st_blocks` are not `u64` on every platform.
    #[allow(clippy::unnecessary_cast)]
    pub fn disk_usage(&self) -> u64 {
        use std::collections::HashSet;
        use std::rc::Rc;
        let mut seen: HashSet<(u64, u64)> = HashSet::new();
        let mut total = 0u64;
        // Depth first: the open directories are those on the way down, one per level.
        let mut stack: Vec<(Rc<Dir>, std::ffi::OsString, usize)> = Vec::new();
        let mut visit = |dir: Rc<Dir>, depth: usize, stack: &mut Vec<_>| {
            for name in dir.names().unwrap_or_default() {
                let Ok(st) = fstatat(
                    Some(dir.0.as_raw_fd()),
                    name.as_os_str(),
                    nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                ) else {
                    continue;
                };
                if seen.insert((st.st_dev as u64, st.st_ino as u64)) {
                    total += st.st_blocks as u64 * 512;
                }
                let is_dir =
                    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
                if is_dir && depth < MAX_DEPTH {
                    stack.push((Rc::clone(&dir), name, depth + 1));
                }
            }
        };
        match self.dir(OsStr::new(".")) {
            Ok(root) => visit(Rc::new(root), 0, &mut stack),
            Err(_) => return 0,
        }
        while let Some((parent, name, depth)) = stack.pop() {
            if let Ok(dir) = parent.dir(&name) {
                drop(parent);
                visit(Rc::new(dir), depth, &mut stack);
            }
        }
        total
    }

    /// Gives the directory `name` (ours) owner rights, through a descriptor of it: `chmod`
    /// by name would follow a link put in its place.
    #[cfg(target_os = "linux")]
    fn make_searchable(&self, name: &OsStr) -> io::Result<()> {
        // O_PATH needs no right on the directory itself; fchmod refuses an O_PATH
        // descriptor, but chmod of its /proc/self/fd entry reaches the same directory.
        let fd = sys::openat(
            Some(self.0.as_raw_fd()),
            name,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        nix::sys::stat::fchmodat(
            None,
            format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str(),
            Mode::S_IRWXU,
            nix::sys::stat::FchmodatFlags::FollowSymlink,
        )?;
        Ok(())
    }

    /// Elsewhere no overlay leaves such directories.
    #[cfg(not(target_os = "linux"))]
    fn make_searchable(&self, _name: &OsStr) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::EACCES))
    }
}

fn is_not_empty(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTEMPTY) | Some(libc::EEXIST))
}

/// A name of one component: no `/`, not `..`.
fn single(name: &OsStr) -> io::Result<()> {
    if name.is_empty() || name == ".." || name.as_bytes().contains(&b'/') {
        return Err(io::Error::other(format!(
            "{}: not a single name",
            Path::new(name).display()
        )));
    }
    Ok(())
}

fn open_at(dir: Option<&Dir>, name: &OsStr) -> io::Result<Dir> {
    let fd = sys::openat(
        dir.map(|d| d.0.as_raw_fd()),
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    Ok(Dir(fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_in_the_way_is_refused_never_followed() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir_all(outside.join("victim")).unwrap();
        let tree = t.path().join("tree");
        std::fs::create_dir(&tree).unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("swapped")).unwrap();
        let root = Dir::open(&tree).unwrap();
        assert!(root.walk(Path::new("swapped/victim")).is_err());
        assert_eq!(root.kind(OsStr::new("swapped")).unwrap(), Some(Kind::Link));
        root.remove_all(OsStr::new("swapped")).unwrap();
        assert!(
            outside.join("victim").is_dir(),
            "the link's target is untouched"
        );
        assert!(tree.join("swapped").symlink_metadata().is_err());
    }

    #[test]
    fn remove_all_takes_directories_without_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let deep = t.path().join("work/work/incompat/volatile/dirty");
        std::fs::create_dir_all(&deep).unwrap();
        for d in [
            "work/work/incompat/volatile",
            "work/work/incompat",
            "work/work",
        ] {
            std::fs::set_permissions(t.path().join(d), std::fs::Permissions::from_mode(0o000))
                .unwrap();
        }
        let root = Dir::open(t.path()).unwrap();
        root.dir(OsStr::new("work"))
            .unwrap()
            .remove_all(OsStr::new("work"))
            .unwrap();
        assert!(t.path().join("work").is_dir());
        assert!(t.path().join("work/work").symlink_metadata().is_err());
    }

    #[test]
    fn a_file_is_put_in_place_of_a_link_and_through_no_link() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("f.json"), "host").unwrap();
        let tree = t.path().join("tree");
        std::fs::create_dir(&tree).unwrap();
        // A run swapped the directory for a link, and left a link at the file's name.
        std::os::unix::fs::symlink(&outside, tree.join(".agent")).unwrap();
        let root = Dir::open(&tree).unwrap();
        let dir = root.make_dirs(Path::new(".agent")).unwrap();
        std::os::unix::fs::symlink(outside.join("f.json"), tree.join(".agent/f.json")).unwrap();
        dir.replace_file(OsStr::new("f.json"), b"copy").unwrap();
        assert_eq!(
            std::fs::read_to_string(outside.join("f.json")).unwrap(),
            "host"
        );
        let placed = tree.join(".agent/f.json");
        assert!(!placed.symlink_metadata().unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(placed).unwrap(), "copy");
    }

    #[test]
    fn names_that_climb_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let root = Dir::open(t.path()).unwrap();
        assert!(root.dir(OsStr::new("..")).is_err());
        assert!(root.kind(OsStr::new("a/b")).is_err());
        assert!(root.walk(Path::new("../x")).is_err());
    }
}
