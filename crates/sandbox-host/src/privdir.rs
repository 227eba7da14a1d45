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

/// The answer `dir/file` holds for `key` (the file is `key`, a newline, the answer), or
/// `None`: no such file, another key, or a file that is not ours alone (mode 0600, our uid),
/// which is never trusted. `dir` is a private directory ([`ensure`]). For what a run would
/// otherwise ask the machine again every time: each answer's key names everything it depends
/// on, so a key that no longer matches is a question asked anew.
pub fn recall(dir: &Path, file: &str, key: &str) -> Option<String> {
    use std::io::Read as _;
    use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dir.join(file))
        .ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file() || meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o077 != 0
    {
        return None;
    }
    let mut text = String::new();
    f.read_to_string(&mut text).ok()?;
    let (k, value) = text.split_once('\n')?;
    (k == key).then(|| value.to_string())
}

/// Stores `value` as the answer for `key` in `dir/file` ([`recall`]): written beside it with
/// mode 0600, then renamed over it, so a reader finds the old answer or the new one whole.
/// A failure only means the question is asked again next time.
pub fn remember(dir: &Path, file: &str, key: &str, value: &str) {
    use std::io::Write as _;
    let written = tempfile::Builder::new()
        .prefix(&format!(".{file}."))
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .tempfile_in(dir)
        .and_then(|mut f| {
            f.write_all(format!("{key}\n{value}").as_bytes())?;
            f.persist(dir.join(file)).map_err(|e| e.error)
        });
    if let Err(e) = written {
        tracing::debug!(file, error = %e, "an answer was not kept");
    }
}

/// What every answer about the kernel depends on: this boot and the kernel's release.
#[cfg(target_os = "linux")]
pub fn kernel_key() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{}|{release}", boot.trim())
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
    if crate::sys::set_xattr(&path, name, b"1").is_err() {
        return false;
    }
    let _ = crate::sys::remove_xattr(&path, name);
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

#[cfg(target_os = "linux")]
/// Whether `dir` can hold an unnamed temporary file (`O_TMPFILE`, which an overlay's copy-up
/// uses on its writable layer).
fn takes_tmpfile(dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
        .is_ok()
}

#[cfg(target_os = "linux")]
/// Why `dir` cannot hold an overlay's writable layer in a user namespace, if it cannot: the
/// layer keeps whiteouts and opaque markers in `user.*` extended attributes, which tmpfs has
/// only from Linux 6.6, and copies up through `O_TMPFILE`.
pub fn layer_unsupported(dir: &Path) -> Option<&'static str> {
    if !takes_user_xattrs(dir) {
        Some("takes no user.* extended attributes (tmpfs before Linux 6.6)")
    } else if !takes_tmpfile(dir) {
        Some("takes no O_TMPFILE files")
    } else {
        None
    }
}

#[cfg(target_os = "linux")]
/// The on-disk fallback for private layers: `$XDG_STATE_HOME/sandbox/layers`, or
/// `~/.local/state/sandbox/layers` (the CLI's state directory, `sandbox-cli`'s `paths.rs`).
fn state_layers_dir() -> Option<PathBuf> {
    let state = match std::env::var_os("XDG_STATE_HOME") {
        Some(d) if Path::new(&d).is_absolute() => PathBuf::from(d),
        _ => PathBuf::from(std::env::var_os("HOME")?).join(".local/state"),
    };
    Some(state.join("sandbox/layers"))
}

#[cfg(target_os = "linux")]
/// Where a run's private layers (the git store quarantine's) go, and why there: in memory
/// where that takes what a layer needs ([`memory_scratch`]), else `private` itself, else the
/// state directory on disk. An error names every place tried and what each lacks.
pub fn layer_dir(
    private: &Path,
    usable: &dyn Fn(&Path) -> bool,
) -> Result<(PathBuf, String), String> {
    if let Some(dir) = memory_scratch(private, usable) {
        return Ok((dir, "in memory".into()));
    }
    let mut tried = Vec::new();
    match layer_unsupported(private) {
        None if usable(private) => return Ok((private.to_path_buf(), "the private dir".into())),
        None => tried.push(format!("{}: the policy grants it", private.display())),
        Some(why) => tried.push(format!("{}: {why}", private.display())),
    }
    if let Some(dir) = state_layers_dir() {
        match ensure("native", &dir) {
            Ok(dir) => match layer_unsupported(&dir) {
                None if usable(&dir) => {
                    return Ok((
                        dir,
                        format!(
                            "on disk, since {} {}",
                            private.display(),
                            tried[0].split_once(": ").map_or("", |(_, w)| w)
                        ),
                    ))
                }
                None => tried.push(format!("{}: the policy grants it", dir.display())),
                Some(why) => tried.push(format!("{}: {why}", dir.display())),
            },
            Err(e) => tried.push(e.to_string()),
        }
    }
    Err(format!(
        "no place for the git store quarantine's private layers: {}. Point XDG_STATE_HOME (or \
         XDG_RUNTIME_DIR) at a directory on ext4, xfs or btrfs, or use Linux 6.6 or later",
        tried.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer is taken only under the key it was kept with, and only from a file of ours
    /// that no one else can read or write.
    #[test]
    fn an_answer_is_recalled_under_its_key_from_a_file_ours_alone() {
        use std::os::unix::fs::PermissionsExt as _;
        let t = tempfile::tempdir().unwrap();
        let dir = ensure("native", &t.path().join("private")).unwrap();
        assert_eq!(recall(&dir, "answer", "k1"), None);
        remember(&dir, "answer", "k1", "the answer");
        assert_eq!(recall(&dir, "answer", "k1").as_deref(), Some("the answer"));
        assert_eq!(recall(&dir, "answer", "k2"), None, "another key");
        let file = dir.join("answer");
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(recall(&dir, "answer", "k1"), None, "readable by others");
        remember(&dir, "answer", "k1", "");
        assert_eq!(recall(&dir, "answer", "k1").as_deref(), Some(""));
    }

    /// The kernel's key names this boot and this release: another either is another key.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_kernel_key_names_the_boot_and_the_release() {
        let key = kernel_key();
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
        let release = nix::sys::utsname::uname().unwrap();
        assert_eq!(
            key,
            format!("{}|{}", boot.trim(), release.release().to_string_lossy())
        );
    }
}
