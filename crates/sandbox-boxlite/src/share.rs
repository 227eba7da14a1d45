//! Few filesystem shares per box: all of a box's mounts through one or two virtio-fs devices.
//!
//! BoxLite 0.10.8 gives each volume a virtio-fs device of its own, and libkrun on x86_64 has
//! interrupts for ten of a VM's virtio-mmio devices: beside BoxLite's own seven (its shared
//! directory, two disks, vsock, console, entropy, balloon) a box fits two volumes with the
//! network on, three without. A linked worktree whose commits come back needs four.
//!
//! So where the daemon may make mounts on the host, it composes the box's view on the host,
//! in a per-box *staging directory* (`<state>/boxlite-share/<box>/`), out of bind mounts, and
//! shares at most two directories of it:
//!
//! - `main`: the mount that holds the box's working directory (the worktree), bound with
//!   every mount that lies inside it in the guest bound at the same place inside it (a main
//!   worktree's `.git`, the box's `.git` pointer over a linked worktree's, `core.hooksPath` in
//!   the tree). BoxLite mounts it at its own guest path, as before: the working directory is
//!   a real mount, not a link.
//! - `others/<index>`: every other mount that lies inside no other (the repository's common
//!   dir, the box's git directory, the caller's mounts), each with what lies inside it. It is
//!   shared at [`GUEST_SHARE`], and the box's *entry* — a small Perl program run as root
//!   right after each boot, before any command (Perl is what the output relay needs already)
//!   — puts a symbolic link at each one's guest path to `GUEST_SHARE/<index>`.
//!
//! Read-only mounts are remounted read-only on the host, so the host's kernel refuses the
//! guest's writes there whatever the guest does (its root included); what a read-only mount
//! covers in the guest is covered in the staging directory too, so the share does not reach
//! it. No capability is added to the box's container: the entry makes directories and links
//! in the box's own root file system only.
//!
//! libkrun's passthrough looks each name up with `openat` beneath the shared directory,
//! which crosses the host's mount points like any path walk, and keys its inodes by device,
//! inode *and* mount id, so a file reached through a read-only bind is opened through it.

use std::path::{Path, PathBuf};

use crate::spec::Mount;

/// Where the shared directory of the other mounts (`others`) appears in the box.
pub const GUEST_SHARE: &str = "/run/sandbox-share";

/// Below the state directory: the boxes' staging directories (`<this>/<box name>`).
pub const SHARE_DIR: &str = "boxlite-share";

/// The staging directory's part BoxLite mounts at the working directory's mount.
pub const MAIN: &str = "main";

/// The staging directory's part shared at [`GUEST_SHARE`].
pub const OTHERS: &str = "others";

/// One bind the host makes in the staging directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostBind {
    /// What is shown (a directory or a file of the host's).
    pub source: PathBuf,
    /// Relative to the staging directory.
    pub target: PathBuf,
    pub read_only: bool,
}

/// How a box's mounts are composed into its shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The binds, parents before what lies in them.
    pub binds: Vec<HostBind>,
    /// The mount shared as `main`: its guest path and whether it is read-only.
    pub main: (PathBuf, bool),
    /// The mounts shared in `others`, by index: each one's guest path.
    pub others: Vec<(usize, PathBuf)>,
}

/// Composes `mounts` (in [`crate::git::order_for_guest`]'s order: a parent before what lies
/// in it) for a box whose working directory is `workdir`.
pub fn layout(mounts: &[Mount], workdir: &Path) -> Layout {
    let mut targets: Vec<PathBuf> = Vec::with_capacity(mounts.len());
    let mut binds = Vec::new();
    let mut others = Vec::new();
    // The mount that holds the working directory (the deepest that does, among the roots).
    let main = mounts
        .iter()
        .position(|m| workdir.starts_with(&m.guest))
        .unwrap_or(0);
    for (i, m) in mounts.iter().enumerate() {
        // The deepest earlier mount this one lies in: it is bound inside that one's target.
        let parent = (0..i)
            .filter(|&j| m.guest.starts_with(&mounts[j].guest) && m.guest != mounts[j].guest)
            .max_by_key(|&j| mounts[j].guest.components().count());
        let target = match parent {
            Some(j) => {
                let rel = m.guest.strip_prefix(&mounts[j].guest).unwrap_or(&m.guest);
                targets[j].join(rel)
            }
            None if i == main => PathBuf::from(MAIN),
            None => {
                others.push((i, m.guest.clone()));
                Path::new(OTHERS).join(i.to_string())
            }
        };
        binds.push(HostBind {
            source: m.host.clone(),
            target: target.clone(),
            read_only: m.read_only,
        });
        targets.push(target);
    }
    Layout {
        binds,
        main: mounts
            .get(main)
            .map(|m| (m.guest.clone(), m.read_only))
            .unwrap_or_default(),
        others,
    }
}

/// The box's entry: a symbolic link at each guest path to its part of the share
/// (`perl -e ENTRY SHARE/INDEX GUEST ...`). Makes the parent directories; replaces a link or an
/// empty directory it finds there (an earlier boot's, or the image's), refuses anything else.
/// Only built-ins: a minimal Perl runs it.
pub const ENTRY: &str = r#"
sub make_dir { my $p = ''; for (grep { length } split m{/}, $_[0]) { $p .= "/$_"; mkdir $p } }
while (@ARGV) {
    my ($src, $dst) = splice(@ARGV, 0, 2);
    (my $parent = $dst) =~ s{/[^/]*$}{};
    make_dir($parent);
    if (-l $dst) { unlink $dst or die "entry: $dst: $!\n" }
    elsif (-d $dst) { rmdir $dst or die "entry: $dst is in the image and not empty: $!\n" }
    elsif (-e $dst) { die "entry: $dst is in the image\n" }
    symlink($src, $dst) or die "entry: linking $dst to $src: $!\n";
}
"#;

/// The program and arguments of the entry of `layout`; `None` when nothing lies outside
/// the main share.
pub fn entry(layout: &Layout) -> Option<(String, Vec<String>)> {
    if layout.others.is_empty() {
        return None;
    }
    let mut args = vec!["-e".to_string(), ENTRY.to_string()];
    for (i, guest) in &layout.others {
        args.push(format!("{GUEST_SHARE}/{i}"));
        args.push(guest.display().to_string());
    }
    Some(("perl".to_string(), args))
}

/// Why a staging directory could not be laid out.
#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    #[error("boxlite: staging the box's share in {}: {what} {}: {source}", dir.display(), path.display())]
    Io {
        dir: PathBuf,
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "boxlite: staging the box's share in {}: {} is left from before and is not an empty \
         mount point; nothing was removed",
        dir.display(), path.display()
    )]
    Leftover { dir: PathBuf, path: PathBuf },
}

#[cfg(target_os = "linux")]
pub use linux::{can_bind, sweep, Staging};

#[cfg(target_os = "linux")]
mod linux {
    //! The host's side: the staging directory's mounts, made and taken down.
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt as _;
    use std::path::{Path, PathBuf};

    use super::{HostBind, ShareError};

    fn cstr(p: &Path) -> std::io::Result<CString> {
        CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other)
    }

    fn mount(source: Option<&Path>, target: &Path, flags: libc::c_ulong) -> std::io::Result<()> {
        let target = cstr(target)?;
        let source = source.map(cstr).transpose()?;
        // SAFETY: mount(2) with NUL-terminated strings borrowed for the call, NULL for the
        // absent source, file system type and data (a bind, a remount or a propagation
        // change takes none).
        let rc = unsafe {
            libc::mount(
                source.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
                target.as_ptr(),
                std::ptr::null(),
                flags,
                std::ptr::null(),
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// `path` opened `O_PATH | O_NOFOLLOW`, refused if it is a link, and whether it is a
    /// directory.
    fn open_path(path: &Path) -> std::io::Result<(std::os::fd::OwnedFd, bool)> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        not_a_link(file.into())
    }

    /// `fd` and whether it is a directory; a link (opened `O_PATH | O_NOFOLLOW`) is refused.
    fn not_a_link(fd: std::os::fd::OwnedFd) -> std::io::Result<(std::os::fd::OwnedFd, bool)> {
        let st = nix::sys::stat::fstat(std::os::fd::AsRawFd::as_raw_fd(&fd))
            .map_err(std::io::Error::from)?;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFLNK => Err(std::io::Error::from_raw_os_error(libc::ELOOP)),
            kind => Ok((fd, kind == libc::S_IFDIR)),
        }
    }

    /// `rel` below the directory `root`, every component opened `O_NOFOLLOW` from the one
    /// before (a link anywhere on the way is refused, never followed: the worktree is the
    /// box's to write, and a link it planted must not send a bind elsewhere on the host);
    /// with `make`, a missing component is made, a directory or (last, `Some(false)`) an
    /// empty file. Opened `O_PATH`; whether it is a directory.
    fn open_beneath(
        root: &Path,
        rel: &Path,
        make: Option<bool>,
    ) -> std::io::Result<(std::os::fd::OwnedFd, bool)> {
        use nix::errno::Errno;
        use nix::fcntl::{openat, OFlag};
        use nix::sys::stat::{mkdirat, Mode};
        use std::os::fd::AsRawFd as _;
        let path_flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let (mut at, _) = open_path(root)?;
        let parts: Vec<_> = rel.components().collect();
        for (i, part) in parts.iter().enumerate() {
            let std::path::Component::Normal(name) = part else {
                return Err(std::io::Error::other(format!(
                    "{}: not beneath",
                    rel.display()
                )));
            };
            let last = i + 1 == parts.len();
            let flags = if last {
                path_flags
            } else {
                path_flags | OFlag::O_DIRECTORY
            };
            let opened = match openat(Some(at.as_raw_fd()), *name, flags, Mode::empty()) {
                Err(Errno::ENOENT) if make.is_some() => {
                    if !last || make == Some(true) {
                        mkdirat(Some(at.as_raw_fd()), *name, Mode::from_bits_truncate(0o755))?;
                    } else {
                        let made = openat(
                            Some(at.as_raw_fd()),
                            *name,
                            OFlag::O_WRONLY
                                | OFlag::O_CREAT
                                | OFlag::O_EXCL
                                | OFlag::O_NOFOLLOW
                                | OFlag::O_CLOEXEC,
                            Mode::from_bits_truncate(0o644),
                        )?;
                        drop(owned(made));
                    }
                    openat(Some(at.as_raw_fd()), *name, flags, Mode::empty())?
                }
                // A link where a directory was to be: ENOTDIR with O_DIRECTORY.
                other => other?,
            };
            at = owned(opened);
        }
        not_a_link(at)
    }

    /// A descriptor `openat` just returned, owned (closed when dropped).
    fn owned(fd: std::os::fd::RawFd) -> std::os::fd::OwnedFd {
        use std::os::fd::FromRawFd as _;
        // SAFETY: `fd` was just returned open by openat(2) and nothing else holds it.
        unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
    }

    /// The magic link that names what a descriptor holds.
    fn fd_path(fd: &impl std::os::fd::AsRawFd) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
    }

    fn detach(target: &Path) -> std::io::Result<()> {
        let target = cstr(target)?;
        // SAFETY: umount2(2) of a NUL-terminated path borrowed for the call.
        let rc = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Whether this process may make the staging directory's binds: one tried in `scratch`
    /// (created, then removed). A daemon without `CAP_SYS_ADMIN` over its mount namespace
    /// (a user's) cannot, and its boxes get a share per mount.
    pub fn can_bind(scratch: &Path) -> bool {
        let probe = scratch.join(format!(".bind-probe-{}", std::process::id()));
        if std::fs::create_dir_all(&probe).is_err() {
            return false;
        }
        let ok = mount(Some(&probe), &probe, libc::MS_BIND).is_ok();
        if ok {
            let _ = detach(&probe);
        }
        let _ = std::fs::remove_dir(&probe);
        ok
    }

    /// A box's staging directory with its binds made; taken down when dropped.
    #[derive(Debug)]
    pub struct Staging {
        dir: PathBuf,
    }

    impl Staging {
        /// Lays `binds` out in `dir` (created if missing): anything mounted there before (a
        /// daemon that died) is detached and its empty mount points removed, never a
        /// directory's contents; then `dir` is bound over itself as a private mount, so
        /// nothing made in it propagates to the host's other mounts, and each bind is made,
        /// made private before anything is stacked on it (a bind of a shared mount would
        /// otherwise be its peer, and a bind on it would appear in the user's own tree), and
        /// remounted read-only where it is.
        pub fn new(dir: &Path, binds: &[HostBind]) -> Result<Staging, ShareError> {
            let io = |what: &'static str, path: &Path| {
                let dir = dir.to_path_buf();
                let path = path.to_path_buf();
                move |source| ShareError::Io {
                    dir,
                    what,
                    path,
                    source,
                }
            };
            std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
            clear(dir)?;
            mount(Some(dir), dir, libc::MS_BIND).map_err(io("binding", dir))?;
            let staging = Staging {
                dir: dir.to_path_buf(),
            };
            mount(None, dir, libc::MS_PRIVATE).map_err(io("making private", dir))?;
            // The first bind is the worktree's (`main`): what lies in it is opened beneath it.
            let tree = binds.first().map(|b| b.source.clone());
            for bind in binds {
                let inside = tree
                    .as_deref()
                    .filter(|t| *t != bind.source)
                    .and_then(|t| bind.source.strip_prefix(t).ok().map(|rel| (t, rel)));
                let source = match inside {
                    Some((tree, rel)) => open_beneath(tree, rel, None),
                    None => open_path(&bind.source),
                }
                .map_err(io("opening", &bind.source))?;
                let is_dir = source.1;
                let target = dir.join(&bind.target);
                // A mount point the guest would have had made (in a shared directory of the
                // user's, as BoxLite's container runtime makes it), or `others`; the target
                // may lie in a writable part (what a read-only part hides), so it is reached
                // and held as the source is, and the bind cannot land elsewhere on the host.
                let held = open_beneath(dir, &bind.target, Some(is_dir))
                    .map_err(io("opening", &target))?;
                let at = fd_path(&held.0);
                let flags = if is_dir && !bind.read_only {
                    libc::MS_BIND | libc::MS_REC
                } else {
                    // Read-only: not recursive, as a remount makes only the top read-only.
                    libc::MS_BIND
                };
                mount(Some(&fd_path(&source.0)), &at, flags).map_err(io("binding", &target))?;
                // The new mount, held the same way (a link swapped in meanwhile is refused).
                let held_top =
                    open_beneath(dir, &bind.target, None).map_err(io("opening", &target))?;
                let top = fd_path(&held_top.0);
                mount(None, &top, libc::MS_PRIVATE | libc::MS_REC)
                    .map_err(io("making private", &target))?;
                if bind.read_only {
                    mount(
                        None,
                        &top,
                        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                    )
                    .map_err(io("making read-only", &target))?;
                }
            }
            Ok(staging)
        }

        pub fn dir(&self) -> &Path {
            &self.dir
        }
    }

    impl Drop for Staging {
        fn drop(&mut self) {
            // Detaching the directory's own bind takes every bind made in it along.
            if let Err(e) = detach(&self.dir) {
                tracing::warn!("boxlite: taking down {}: {e}", self.dir.display());
            }
        }
    }

    /// Takes down every staging directory in `dir` (`<state>/boxlite-share`) that a daemon
    /// left (it died while a box booted), warning about any it cannot.
    pub fn sweep(dir: &Path) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                if let Err(e) = clear(&path).and_then(|()| {
                    std::fs::remove_dir(&path).map_err(|source| ShareError::Io {
                        dir: path.clone(),
                        what: "removing",
                        path: path.clone(),
                        source,
                    })
                }) {
                    tracing::warn!("{e}");
                }
            }
        }
    }

    /// Mount points at or below `dir`, deepest first (from /proc/self/mountinfo).
    fn mounted_below(dir: &Path) -> Vec<PathBuf> {
        let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
            return Vec::new();
        };
        let mut found: Vec<PathBuf> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(|p| PathBuf::from(unescape(p)))
            .filter(|p| p.starts_with(dir))
            .collect();
        found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        found.dedup();
        found
    }

    /// mountinfo's octal escapes (`\040` for a space).
    fn unescape(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
                let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
                out.push(v);
                i += 4;
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// What an earlier daemon left: its mounts detached, then its mount points removed one
    /// by one — an empty directory or an empty file, never anything with contents (a bind
    /// that did not come off shows the user's tree, which must not be touched).
    fn clear(dir: &Path) -> Result<(), ShareError> {
        for _ in 0..8 {
            let mounted = mounted_below(dir);
            if mounted.is_empty() {
                break;
            }
            for m in mounted {
                let _ = detach(&m);
            }
        }
        remove_mount_points(dir, dir, true)
    }

    /// Removes the empty mount points in `at` (and in its `others`, when `top`).
    fn remove_mount_points(dir: &Path, at: &Path, top: bool) -> Result<(), ShareError> {
        let entries = std::fs::read_dir(at).map_err(|source| ShareError::Io {
            dir: dir.to_path_buf(),
            what: "reading",
            path: at.to_path_buf(),
            source,
        })?;
        for entry in entries.flatten() {
            let path = entry.path();
            let leftover = || ShareError::Leftover {
                dir: dir.to_path_buf(),
                path: path.clone(),
            };
            let meta = std::fs::symlink_metadata(&path).map_err(|_| leftover())?;
            if top && meta.is_dir() && entry.file_name() == super::OTHERS {
                remove_mount_points(dir, &path, false)?;
            }
            let removed = if meta.is_dir() {
                std::fs::remove_dir(&path)
            } else if meta.is_file() && meta.len() == 0 {
                std::fs::remove_file(&path)
            } else {
                return Err(leftover());
            };
            removed.map_err(|_| leftover())?;
        }
        Ok(())
    }
}

/// The staging directory of the box `name` below the state directory.
pub fn staging_dir(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join(SHARE_DIR).join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(host: &str, guest: &str, read_only: bool) -> Mount {
        Mount {
            host: host.into(),
            guest: guest.into(),
            read_only,
        }
    }

    /// The working directory's mount is `main`, with what lies in it bound inside it; every
    /// other root is in `others`, linked at its guest path by the entry.
    #[test]
    fn the_guest_view_is_composed_on_the_host() {
        let mounts = [
            m("/w/task", "/w/task", false),
            m("/w/repo/.git", "/w/repo/.git", true),
            m("/state/box/pointer", "/w/task/.git", true),
            m("/state/box/git", "/state/box/git", false),
        ];
        let l = layout(&mounts, Path::new("/w/task"));
        let seen: Vec<(String, String, bool)> = l
            .binds
            .iter()
            .map(|b| {
                (
                    b.source.display().to_string(),
                    b.target.display().to_string(),
                    b.read_only,
                )
            })
            .collect();
        let s = |a: &str, b: &str, ro| (a.to_string(), b.to_string(), ro);
        assert_eq!(
            seen,
            [
                s("/w/task", "main", false),
                s("/w/repo/.git", "others/1", true),
                // The box's pointer over the worktree's own: the guest sees it there.
                s("/state/box/pointer", "main/.git", true),
                s("/state/box/git", "others/3", false),
            ]
        );
        assert_eq!(l.main, (PathBuf::from("/w/task"), false));
        let (program, args) = entry(&l).unwrap();
        assert_eq!(program, "perl");
        assert_eq!(
            &args[2..],
            [
                "/run/sandbox-share/1",
                "/w/repo/.git",
                "/run/sandbox-share/3",
                "/state/box/git"
            ]
        );
        // A main worktree: one share, no entry.
        let main = [m("/r", "/r", false), m("/r/.git", "/r/.git", true)];
        let l = layout(&main, Path::new("/r"));
        assert!(entry(&l).is_none());
        assert_eq!(l.binds[1].target, Path::new("main/.git"));
    }

    /// A scratch directory (kept while the first is) where this process may make bind mounts,
    /// canonical; `None`, reported as skipped, where it may not (not root).
    #[cfg(target_os = "linux")]
    fn bind_root() -> Option<(tempfile::TempDir, PathBuf)> {
        let t = tempfile::tempdir().unwrap();
        if !can_bind(t.path()) {
            sandbox_testkit::skip(
                "bind-mounts",
                "this process may not make bind mounts (not root)",
            );
            return None;
        }
        let root = t.path().canonicalize().unwrap();
        Some((t, root))
    }

    /// Real binds (as root, or wherever this process may mount): a read-only part refuses
    /// writes even from root, the writable part takes them, what a read-only part hides in
    /// the writable one is read-only in the share, and the user's own tree shows none of the
    /// staging's mounts. Dropped, the staging leaves nothing mounted and is laid out again.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_host_kernel_refuses_writes_to_read_only_parts() {
        let Some((_t, root)) = bind_root() else {
            return;
        };
        let tree = root.join("tree");
        let common = root.join("common");
        std::fs::create_dir_all(tree.join(".git")).unwrap();
        std::fs::create_dir_all(&common).unwrap();
        std::fs::write(common.join("config"), "x").unwrap();
        std::fs::write(tree.join(".git/config"), "y").unwrap();
        let elsewhere = root.join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("config"), "e").unwrap();
        let mounts = [
            m(tree.to_str().unwrap(), "/g/tree", false),
            m(elsewhere.to_str().unwrap(), "/g/elsewhere", true),
            m(common.to_str().unwrap(), "/g/tree/.git", true),
        ];
        let dir = root.join("staging");
        let binds = layout(&mounts, Path::new("/g/tree")).binds;
        let staging = Staging::new(&dir, &binds).unwrap();
        std::fs::write(dir.join("main/file"), "w").unwrap();
        assert_eq!(std::fs::read(tree.join("file")).unwrap(), b"w");
        let refused = std::fs::write(dir.join("others/1/config"), "z").unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
        // What the guest sees at .git is the common dir, read-only, and the tree's own .git
        // is out of reach.
        assert_eq!(std::fs::read(dir.join("main/.git/config")).unwrap(), b"x");
        let covered = std::fs::write(dir.join("main/.git/config"), "z").unwrap_err();
        assert_eq!(covered.raw_os_error(), Some(libc::EROFS), "{covered}");
        // Nothing of the staging's shows in the user's tree.
        assert_eq!(std::fs::read(tree.join(".git/config")).unwrap(), b"y");
        drop(staging);
        assert!(std::fs::read_dir(dir.join("main"))
            .unwrap()
            .next()
            .is_none());
        // Laid out again over what was left.
        let again = Staging::new(&dir, &binds).unwrap();
        assert_eq!(std::fs::read(dir.join("others/1/config")).unwrap(), b"e");
        drop(again);
    }

    /// A link the box planted in its worktree where a bind inside it goes (the tree's
    /// `core.hooksPath`, `.husky/_`, with `.husky` made a link to a directory of the host's)
    /// is refused: the box is not started, and nothing is made or mounted where the link
    /// points.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_link_planted_in_the_tree_sends_no_bind_elsewhere() {
        let Some((_t, root)) = bind_root() else {
            return;
        };
        let tree = root.join("tree");
        let host = root.join("host-only");
        std::fs::create_dir_all(&tree).unwrap();
        std::fs::create_dir_all(host.join("_")).unwrap();
        std::fs::write(host.join("_/secret"), "s").unwrap();
        std::os::unix::fs::symlink(&host, tree.join(".husky")).unwrap();
        let hooks = tree.join(".husky/_");
        let mounts = [
            m(tree.to_str().unwrap(), "/g/tree", false),
            m(hooks.to_str().unwrap(), "/g/tree/.husky/_", true),
        ];
        let binds = layout(&mounts, Path::new("/g/tree")).binds;
        let dir = root.join("staging");
        let refused = Staging::new(&dir, &binds).unwrap_err().to_string();
        assert!(refused.contains(".husky"), "{refused}");
        // The control: the same paths resolved the usual way reach the host's directory.
        assert_eq!(std::fs::read(hooks.join("secret")).unwrap(), b"s");
        // Nothing was mounted over the host's directory, nothing is left mounted.
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mountinfo.contains(host.to_str().unwrap()), "{mountinfo}");
        assert!(!mountinfo.contains(dir.to_str().unwrap()), "{mountinfo}");
        assert_eq!(std::fs::read_dir(&host).unwrap().count(), 1);
    }
}
