//! One filesystem share per box: every mount of a box through a single virtio-fs device.
//!
//! BoxLite 0.10.8 gives each volume a virtio-fs device of its own, and libkrun on x86_64 has
//! eleven interrupts for all of a VM's virtio-mmio devices: beside BoxLite's fixed set (its
//! shared directory, two disks, vsock, console, entropy, balloon) a box fits two volumes with
//! the network on, three without. A linked worktree whose commits come back needs four.
//!
//! So where the daemon may make mounts on the host, a box gets one volume: a per-box
//! *staging directory* (`<state>/boxlite-share/<box>/`) into which each of the box's mounts is
//! bind-mounted as `<index>` — read-only parts remounted read-only on the host, so the host's
//! kernel refuses the guest's writes there, whatever the guest does. Where a read-only part
//! hides something inside a writable part in the guest (a main worktree's `.git`, a linked
//! worktree's `.git` pointer, `core.hooksPath` in the tree), what it hides is also bound
//! read-only over itself inside that writable part's staging copy: the guest can reach the
//! writable part's whole tree through the share, not only through the guest's own binds.
//! libkrun's passthrough looks each name up with `openat` beneath the share, which crosses the
//! host's mount points like any path walk, and keys its inodes by device, inode *and* mount
//! id, so a file reached through a read-only bind is opened through that bind.
//!
//! In the guest, the box's *entry* (a Perl program run as root right after each boot, before
//! any command; Perl is what the output relay needs already) binds `<share>/<index>` onto
//! each mount's guest path, in the order [`crate::git::order_for_guest`] gave them, and
//! remounts the read-only ones read-only there too. That needs `CAP_SYS_ADMIN` in the box's
//! container, which BoxLite's default set leaves out; the box gets it (see
//! [`GUEST_CAPABILITY`]). What a guest root can do with it stays inside the VM: every write
//! that reaches the host goes through the share, which the host's mounts bound.

use std::path::{Path, PathBuf};

use crate::spec::Mount;

/// Where the one share appears in the box's container.
pub const GUEST_SHARE: &str = "/run/sandbox-share";

/// Below the state directory: the boxes' staging directories (`<this>/<box name>`).
pub const SHARE_DIR: &str = "boxlite-share";

/// The capability the box's container needs for its entry's binds.
pub const GUEST_CAPABILITY: &str = "CAP_SYS_ADMIN";

/// One bind the host makes in the staging directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostBind {
    /// What is shown (a directory or a file of the host's).
    pub source: PathBuf,
    /// Relative to the staging directory.
    pub target: PathBuf,
    pub read_only: bool,
    /// Made only where the source exists (what a read-only mount hides may be absent on the
    /// host: nothing is hidden then).
    pub where_present: bool,
}

/// What the host binds into the staging directory for `mounts`, in order: each mount as
/// `<index>`, then, inside each writable one, every host path a read-only mount hides in the
/// guest, read-only over itself.
pub fn host_binds(mounts: &[Mount]) -> Vec<HostBind> {
    let mut binds: Vec<HostBind> = mounts
        .iter()
        .enumerate()
        .map(|(i, m)| HostBind {
            source: m.host.clone(),
            target: PathBuf::from(i.to_string()),
            read_only: m.read_only,
            where_present: false,
        })
        .collect();
    for (w, writable) in mounts.iter().enumerate().filter(|(_, m)| !m.read_only) {
        for hidden in mounts.iter().filter(|m| m.read_only) {
            let Ok(rel) = hidden.guest.strip_prefix(&writable.guest) else {
                continue;
            };
            if rel.as_os_str().is_empty() {
                continue;
            }
            binds.push(HostBind {
                source: writable.host.join(rel),
                target: PathBuf::from(w.to_string()).join(rel),
                read_only: true,
                where_present: true,
            });
        }
    }
    binds
}

/// The box's entry: binds each part of the share onto its guest path (`perl -e ENTRY NR
/// SOURCE TARGET MODE ...`, `NR` the `mount` system call's number on this architecture).
/// Creates a missing mount point (a directory, or an empty file for a file part) first, as
/// BoxLite does for its own volumes. Only built-ins: a minimal Perl runs it.
pub const ENTRY: &str = r#"
my $nr = shift @ARGV;
sub make_dir { my $p = ''; for (grep { length } split m{/}, $_[0]) { $p .= "/$_"; mkdir $p } }
while (@ARGV) {
    my ($src, $dst, $mode) = splice(@ARGV, 0, 3);
    if (-d $src) { make_dir($dst) }
    elsif (!-e $dst) { (my $d = $dst) =~ s{/[^/]*$}{}; make_dir($d); open(my $f, '>', $dst) or die "entry: $dst: $!\n" }
    syscall($nr, $src, $dst, 0, 4096 | 16384, 0) == 0 or die "entry: binding $src on $dst: $!\n";
    next unless $mode eq 'ro';
    syscall($nr, 0, $dst, 0, 4096 | 32 | 1, 0) == 0 or die "entry: $dst read-only: $!\n";
}
"#;

/// `mount(2)`'s number for the guest, which runs the host's architecture.
const MOUNT_SYSCALL: u32 = if cfg!(target_arch = "aarch64") {
    40
} else {
    165
};

/// The program and arguments of the entry for `mounts` (`<share>/<index>` onto each guest
/// path, in order).
pub fn entry(mounts: &[Mount]) -> (String, Vec<String>) {
    let mut args = vec![
        "-e".to_string(),
        ENTRY.to_string(),
        MOUNT_SYSCALL.to_string(),
    ];
    for (i, m) in mounts.iter().enumerate() {
        args.push(format!("{GUEST_SHARE}/{i}"));
        args.push(m.guest.display().to_string());
        args.push(if m.read_only { "ro" } else { "rw" }.to_string());
    }
    ("perl".to_string(), args)
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
pub use linux::{can_bind, Staging};

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
        let st = nix::sys::stat::fstat(std::os::fd::AsRawFd::as_raw_fd(&file))
            .map_err(std::io::Error::from)?;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFLNK => Err(std::io::Error::from_raw_os_error(libc::ELOOP)),
            kind => Ok((file.into(), kind == libc::S_IFDIR)),
        }
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
            for bind in binds {
                let source = match open_path(&bind.source) {
                    Ok(fd) => fd,
                    Err(e) if bind.where_present && e.kind() == std::io::ErrorKind::NotFound => {
                        continue
                    }
                    Err(e) => return Err(io("opening", &bind.source)(e)),
                };
                let is_dir = source.1;
                let target = dir.join(&bind.target);
                if std::fs::symlink_metadata(&target).is_err() {
                    if is_dir {
                        std::fs::create_dir(&target).map_err(io("creating", &target))?;
                    } else {
                        std::fs::File::create(&target).map_err(io("creating", &target))?;
                    }
                }
                // The target may lie in a writable part (what a read-only part hides): held
                // by a descriptor that is no link, so a link planted there cannot send the
                // bind elsewhere on the host.
                let held = open_path(&target).map_err(io("opening", &target))?;
                let at = fd_path(&held.0);
                let flags = if is_dir && !bind.read_only {
                    libc::MS_BIND | libc::MS_REC
                } else {
                    // Read-only: not recursive, as a remount makes only the top read-only.
                    libc::MS_BIND
                };
                mount(Some(&fd_path(&source.0)), &at, flags).map_err(io("binding", &target))?;
                // The new mount, held the same way (a link swapped in meanwhile is refused).
                let held_top = open_path(&target).map_err(io("opening", &target))?;
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
        let entries = std::fs::read_dir(dir).map_err(|source| ShareError::Io {
            dir: dir.to_path_buf(),
            what: "reading",
            path: dir.to_path_buf(),
            source,
        })?;
        for entry in entries.flatten() {
            let path = entry.path();
            let leftover = || ShareError::Leftover {
                dir: dir.to_path_buf(),
                path: path.clone(),
            };
            let meta = std::fs::symlink_metadata(&path).map_err(|_| leftover())?;
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

    /// What a read-only mount hides inside a writable one in the guest is bound read-only in
    /// the writable one's staging copy: the guest reaches the whole share.
    #[test]
    fn hidden_paths_are_read_only_in_the_writable_parts_copy() {
        let mounts = [
            m("/w/task", "/w/task", false),
            m("/w/repo/.git", "/w/repo/.git", true),
            m("/state/box/pointer", "/w/task/.git", true),
            m("/state/box/git", "/state/box/git", false),
        ];
        let seen: Vec<(String, String, bool)> = host_binds(&mounts)
            .into_iter()
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
                s("/w/task", "0", false),
                s("/w/repo/.git", "1", true),
                s("/state/box/pointer", "2", true),
                s("/state/box/git", "3", false),
                // The host's own pointer, under the box's.
                s("/w/task/.git", "0/.git", true),
            ]
        );
    }

    #[test]
    fn the_entry_binds_each_part_on_its_guest_path_in_order() {
        let mounts = [m("/w", "/w", false), m("/w/.git", "/w/.git", true)];
        let (program, args) = entry(&mounts);
        assert_eq!(program, "perl");
        assert_eq!(
            &args[2..],
            [
                MOUNT_SYSCALL.to_string().as_str(),
                "/run/sandbox-share/0",
                "/w",
                "rw",
                "/run/sandbox-share/1",
                "/w/.git",
                "ro"
            ]
        );
    }

    /// Real binds (as root, or wherever this process may mount): a read-only part refuses
    /// writes even from root, the writable part takes them, what a read-only part hides in
    /// the writable one is read-only in the share, and the user's own tree shows none of the
    /// staging's mounts. Dropped, the staging leaves nothing mounted and is laid out again.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_host_kernel_refuses_writes_to_read_only_parts() {
        let t = tempfile::tempdir().unwrap();
        if !can_bind(t.path()) {
            sandbox_testkit::skip(
                "bind-mounts",
                "this process may not make bind mounts (not root)",
            );
            return;
        }
        let root = t.path().canonicalize().unwrap();
        let tree = root.join("tree");
        let common = root.join("common");
        std::fs::create_dir_all(tree.join(".git")).unwrap();
        std::fs::create_dir_all(&common).unwrap();
        std::fs::write(common.join("config"), "x").unwrap();
        std::fs::write(tree.join(".git/config"), "y").unwrap();
        let mounts = [
            m(tree.to_str().unwrap(), "/g/tree", false),
            m(common.to_str().unwrap(), "/g/tree/.git", true),
        ];
        let dir = root.join("staging");
        let staging = Staging::new(&dir, &host_binds(&mounts)).unwrap();
        std::fs::write(dir.join("0/file"), "w").unwrap();
        assert_eq!(std::fs::read(tree.join("file")).unwrap(), b"w");
        let refused = std::fs::write(dir.join("1/config"), "z").unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
        let hidden = std::fs::write(dir.join("0/.git/config"), "z").unwrap_err();
        assert_eq!(hidden.raw_os_error(), Some(libc::EROFS), "{hidden}");
        // Nothing of the staging's shows in the user's tree.
        std::fs::write(tree.join(".git/config"), "mine").unwrap();
        drop(staging);
        assert!(std::fs::read_dir(dir.join("0")).unwrap().next().is_none());
        // Laid out again over what was left.
        let again = Staging::new(&dir, &host_binds(&mounts)).unwrap();
        assert_eq!(std::fs::read(dir.join("1/config")).unwrap(), b"x");
        drop(again);
    }
}
