//! The daemon's files in the user's runtime directory, and the checks that keep them private.
//!
//! Everything here lives in `$XDG_RUNTIME_DIR/sandbox` (or `/tmp/sandbox-<uid>`), which no
//! sandbox is ever granted: the host token in it is what separates the user from an agent
//! running as the same user (Landlock does not filter `connect()` to a pathname socket, so the
//! socket's mode alone would not keep a sandboxed process out).

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why the runtime directory or a file in it cannot be trusted or used.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{path}: {cause}", path = .path.display())]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error(
        "{path} is not private to you ({what}); remove it or fix its owner and mode (0700 for \
         the directory, 0600 for files)",
        path = .path.display()
    )]
    NotPrivate { path: PathBuf, what: String },
}

fn io(path: &Path, cause: std::io::Error) -> RuntimeError {
    RuntimeError::Io {
        path: path.to_path_buf(),
        cause,
    }
}

/// The daemon's paths inside one runtime directory.
#[derive(Debug, Clone)]
pub struct RuntimePaths {
    pub dir: PathBuf,
}

impl RuntimePaths {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        RuntimePaths { dir: dir.into() }
    }

    /// The control socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("sandbox.sock")
    }

    /// The host token (0600).
    pub fn host_token(&self) -> PathBuf {
        self.dir.join("host.token")
    }

    /// Held with `flock` by the one daemon of this user.
    pub fn lock(&self) -> PathBuf {
        self.dir.join("daemon.lock")
    }

    /// Where an auto-started daemon logs.
    pub fn log(&self) -> PathBuf {
        self.dir.join("daemon.log")
    }

    /// Creates the directory (0700) if needed and checks it is ours and private.
    pub fn ensure_dir(&self) -> Result<(), RuntimeError> {
        match std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
        {
            Ok(()) => {}
            Err(e) => return Err(io(&self.dir, e)),
        }
        check_private(&self.dir, 0o077)
    }

    /// Reads the host token, refusing a file that others could have read or written.
    pub fn read_host_token(&self) -> Result<String, RuntimeError> {
        let path = self.host_token();
        check_private(&self.dir, 0o077)?;
        check_private(&path, 0o077)?;
        let text = std::fs::read_to_string(&path).map_err(|e| io(&path, e))?;
        Ok(text.trim().to_string())
    }

    /// Writes the host token atomically with mode 0600 from the start (never readable by
    /// anyone else, not even for a moment).
    pub fn write_host_token(&self, token: &str) -> Result<(), RuntimeError> {
        let path = self.host_token();
        let tmp = self.dir.join(format!(".host.token.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| io(&tmp, e))?;
        file.write_all(token.as_bytes())
            .and_then(|()| file.write_all(b"\n"))
            .and_then(|()| file.sync_all())
            .map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))
    }
}

/// Checks that `path` belongs to the effective user and has none of the `forbidden` mode bits.
pub fn check_private(path: &Path, forbidden: u32) -> Result<(), RuntimeError> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| io(path, e))?;
    let uid = nix::unistd::geteuid().as_raw();
    if meta.file_type().is_symlink() {
        return Err(RuntimeError::NotPrivate {
            path: path.to_path_buf(),
            what: "a symlink".into(),
        });
    }
    if meta.uid() != uid {
        return Err(RuntimeError::NotPrivate {
            path: path.to_path_buf(),
            what: format!("owned by uid {}, you are {uid}", meta.uid()),
        });
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & forbidden != 0 {
        return Err(RuntimeError::NotPrivate {
            path: path.to_path_buf(),
            what: format!("mode {mode:04o}"),
        });
    }
    Ok(())
}

/// Sets a file's mode (the socket after `bind`).
pub fn set_mode(path: &Path, mode: u32) -> Result<(), RuntimeError> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| io(path, e))
}
