//! Admission: every request passes a [`CommandPolicy`] before anything is spawned.
//!
//! [`WorkspaceGuard`] keeps the working directory and path-like arguments inside a workspace.
//! It decides by resolving paths against the real filesystem — every symlink followed, every
//! `..` applied to the resolved parent — never by comparing strings. It is an early, friendly
//! refusal; the kernel boundary (Landlock, a VM) is what holds against a process that swaps a
//! path for a symlink after admission.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::error::ExecError;
use crate::spec::CommandSpec;

/// Decides whether a request may run.
pub trait CommandPolicy: Send + Sync {
    fn admit(&self, spec: &CommandSpec) -> Result<(), ExecError>;
}

/// Admits everything. For callers whose boundary is entirely elsewhere.
#[derive(Debug, Default, Clone, Copy)]
pub struct AllowAll;

impl CommandPolicy for AllowAll {
    fn admit(&self, _spec: &CommandSpec) -> Result<(), ExecError> {
        Ok(())
    }
}

/// Rejects working directories and path arguments that resolve outside the workspace.
#[derive(Debug, Clone)]
pub struct WorkspaceGuard {
    root: PathBuf,
    extra_roots: Vec<PathBuf>,
    check_args: bool,
}

impl WorkspaceGuard {
    /// `root` must exist; it is canonicalized once, here.
    pub fn new(root: impl AsRef<Path>) -> Result<Self, ExecError> {
        let root = root.as_ref();
        let canonical = std::fs::canonicalize(root).map_err(|e| ExecError::Permission {
            path: root.to_path_buf(),
            cause: format!("workspace root cannot be resolved: {e}"),
        })?;
        Ok(WorkspaceGuard {
            root: canonical,
            extra_roots: Vec::new(),
            check_args: true,
        })
    }

    /// Whether path-like arguments are checked too (default) or only the working directory.
    pub fn check_args(mut self, check: bool) -> Self {
        self.check_args = check;
        self
    }

    /// Also admits paths under `root` (a granted folder, the run's TMPDIR).
    pub fn allow_root(mut self, root: impl AsRef<Path>) -> Result<Self, ExecError> {
        let root = root.as_ref();
        let canonical = std::fs::canonicalize(root).map_err(|e| ExecError::Permission {
            path: root.to_path_buf(),
            cause: format!("granted path cannot be resolved: {e}"),
        })?;
        self.extra_roots.push(canonical);
        Ok(self)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn inside(&self, resolved: &Path) -> bool {
        std::iter::once(&self.root)
            .chain(self.extra_roots.iter())
            .any(|root| resolved.starts_with(root))
    }

    /// Resolves `path` (relative to `base`) and checks it is inside the workspace.
    pub fn check_path(&self, base: &Path, path: &Path) -> Result<PathBuf, ExecError> {
        let resolved = resolve_beneath_fs(base, path).map_err(|e| ExecError::Denied {
            policy: "workspace guard",
            reason: format!("{}: cannot be resolved: {e}", path.display()),
        })?;
        if self.inside(&resolved) {
            Ok(resolved)
        } else {
            Err(ExecError::Denied {
                policy: "workspace guard",
                reason: format!(
                    "{} resolves to {}, outside the workspace {}",
                    path.display(),
                    resolved.display(),
                    self.root.display()
                ),
            })
        }
    }
}

impl CommandPolicy for WorkspaceGuard {
    fn admit(&self, spec: &CommandSpec) -> Result<(), ExecError> {
        let cwd = self.check_path(&self.root, &spec.cwd)?;
        if !self.check_args {
            return Ok(());
        }
        for arg in &spec.args {
            for candidate in path_candidates(arg) {
                self.check_path(&cwd, candidate)?;
            }
        }
        Ok(())
    }
}

/// The parts of an argument that name a path: the argument itself when it contains a `/` or
/// is `.`/`..`, and the value of `--opt=VALUE` when that does. Arguments without a slash are
/// names relative to the (already checked) working directory and cannot leave it, except
/// through a symlink — so a bare name that is an existing symlink is checked too.
fn path_candidates(arg: &OsStr) -> Vec<&Path> {
    let bytes = arg.as_bytes();
    let mut out = Vec::new();
    let looks_like_path = |b: &[u8]| b.contains(&b'/') || b == b"." || b == b"..";
    if looks_like_path(bytes) && !bytes.starts_with(b"-") {
        out.push(Path::new(arg));
    } else if bytes.starts_with(b"-") {
        if let Some(eq) = bytes.iter().position(|&b| b == b'=') {
            let value = &bytes[eq + 1..];
            if looks_like_path(value) {
                out.push(Path::new(OsStr::from_bytes(value)));
            }
        }
    } else if !bytes.is_empty() {
        out.push(Path::new(arg));
    }
    out
}

/// The result of resolving a path on the real filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// The resolved path (components that do not exist are appended as written).
    pub path: PathBuf,
    /// Every symlink followed on the way, by its own (resolved) location.
    pub links: Vec<PathBuf>,
    /// Some component did not exist.
    pub missing: bool,
}

/// Resolves `path` (relative to `base`) the way the kernel would when opening it: symlinks
/// are followed (at most 40, as `MAXSYMLINKS`), `..` moves to the parent of the *resolved*
/// directory, and components that do not exist yet are appended as written.
pub fn resolve_path(base: &Path, path: &Path) -> std::io::Result<Resolution> {
    fn push_rev(pending: &mut Vec<std::ffi::OsString>, p: &Path) {
        for c in p.components().rev() {
            match c {
                Component::RootDir | Component::Prefix(_) | Component::CurDir => {}
                other => pending.push(other.as_os_str().to_os_string()),
            }
        }
    }
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    };
    let mut pending = Vec::new();
    push_rev(&mut pending, &joined);
    let mut resolved = PathBuf::from("/");
    let mut links = Vec::new();
    let mut missing = false;
    while let Some(part) = pending.pop() {
        if part == ".." {
            resolved.pop();
            continue;
        }
        let next = resolved.join(&part);
        if missing {
            resolved = next;
            continue;
        }
        match std::fs::symlink_metadata(&next) {
            Ok(meta) if meta.file_type().is_symlink() => {
                if links.len() >= 40 {
                    return Err(std::io::Error::from_raw_os_error(libc::ELOOP));
                }
                let target = std::fs::read_link(&next)?;
                links.push(next);
                if target.is_absolute() {
                    resolved = PathBuf::from("/");
                }
                push_rev(&mut pending, &target);
            }
            Ok(_) => resolved = next,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                missing = true;
                resolved = next;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Resolution {
        path: resolved,
        links,
        missing,
    })
}

/// [`resolve_path`], keeping only the resolved path.
pub fn resolve_beneath_fs(base: &Path, path: &Path) -> std::io::Result<PathBuf> {
    resolve_path(base, path).map(|r| r.path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), "s").unwrap();
        (dir, root, outside)
    }

    #[test]
    fn dotdot_is_applied_after_symlinks() {
        let (_d, root, outside) = setup();
        // ws/link -> ../outside ; ws/link/../.. must be judged from the link's target.
        symlink(&outside, root.join("link")).unwrap();
        let got = resolve_beneath_fs(&root, Path::new("link/../ws/src")).unwrap();
        assert_eq!(got, std::fs::canonicalize(root.join("src")).unwrap());
        let got = resolve_beneath_fs(&root, Path::new("link/secret")).unwrap();
        assert_eq!(got, std::fs::canonicalize(outside.join("secret")).unwrap());
    }

    #[test]
    fn guard_rejects_symlink_escapes_and_accepts_inside() {
        let (_d, root, outside) = setup();
        symlink(&outside, root.join("escape")).unwrap();
        symlink("src", root.join("inner")).unwrap();
        let guard = WorkspaceGuard::new(&root).unwrap();

        let ok =
            CommandSpec::argv(["cat", "src/new-file", "./inner", "--out=src/x"], &root).unwrap();
        guard.admit(&ok).unwrap();

        for bad in [
            "escape/secret",
            "escape",
            "../outside/secret",
            "src/../../outside",
            "/etc/passwd",
            "--file=../outside/secret",
        ] {
            let spec = CommandSpec::argv(["cat", bad], &root).unwrap();
            let err = guard.admit(&spec).unwrap_err();
            assert!(matches!(err, ExecError::Denied { .. }), "{bad}: {err}");
        }
        // Working directory through a symlink that leaves.
        let spec = CommandSpec::argv(["true"], root.join("escape")).unwrap();
        assert!(guard.admit(&spec).is_err());
    }

    #[test]
    fn symlink_loops_are_errors_not_hangs() {
        let (_d, root, _) = setup();
        symlink("b", root.join("a")).unwrap();
        symlink("a", root.join("b")).unwrap();
        let guard = WorkspaceGuard::new(&root).unwrap();
        let spec = CommandSpec::argv(["cat", "./a"], &root).unwrap();
        let err = guard.admit(&spec).unwrap_err();
        assert!(err.to_string().contains("cannot be resolved"), "{err}");
    }

    #[test]
    fn extra_roots_are_admitted() {
        let (_d, root, outside) = setup();
        let guard = WorkspaceGuard::new(&root)
            .unwrap()
            .allow_root(&outside)
            .unwrap();
        let spec =
            CommandSpec::argv(["cat", outside.join("secret").to_str().unwrap()], &root).unwrap();
        guard.admit(&spec).unwrap();
    }
}
