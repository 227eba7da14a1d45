//! Program lookup on the *child's* `PATH`, done in the parent so that "not found" (127) and
//! "not executable" (126) are typed errors with a clear message rather than a bare errno.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::unistd::{access, AccessFlags};

use crate::error::ExecError;

/// Resolves `program` the way `execvp` would, against `path_var` (the child's `PATH`) and
/// `cwd` (for relative names containing a slash).
pub fn resolve_program(
    program: &OsStr,
    path_var: Option<&OsStr>,
    cwd: &Path,
) -> Result<PathBuf, ExecError> {
    let display = program.to_string_lossy().into_owned();
    if program.as_bytes().contains(&b'/') {
        let candidate = cwd.join(program);
        return check_executable(&candidate, &display);
    }
    let path_var: OsString = path_var
        .map(OsStr::to_os_string)
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    let mut first_denied: Option<ExecError> = None;
    for dir in std::env::split_paths(&path_var) {
        // An empty PATH entry means the current directory, as in execvp.
        let dir = if dir.as_os_str().is_empty() {
            cwd.to_path_buf()
        } else if dir.is_relative() {
            cwd.join(dir)
        } else {
            dir
        };
        let candidate = dir.join(program);
        match std::fs::metadata(&candidate) {
            Ok(meta) if meta.is_file() => match check_executable(&candidate, &display) {
                Ok(path) => return Ok(path),
                Err(e) => {
                    first_denied.get_or_insert(e);
                }
            },
            _ => continue,
        }
    }
    Err(first_denied.unwrap_or(ExecError::NotFound {
        program: display,
        searched: Some(path_var.to_string_lossy().into_owned()),
    }))
}

fn check_executable(candidate: &Path, display: &str) -> Result<PathBuf, ExecError> {
    let meta = match std::fs::metadata(candidate) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ExecError::NotFound {
                program: display.to_string(),
                searched: None,
            })
        }
        Err(e) => {
            return Err(ExecError::NotExecutable {
                program: display.to_string(),
                cause: e.to_string(),
            })
        }
    };
    if meta.is_dir() {
        return Err(ExecError::NotExecutable {
            program: display.to_string(),
            cause: "is a directory".into(),
        });
    }
    // access(2) asks the kernel, so it also accounts for noexec mounts and (for root) the
    // rule that at least one execute bit must be set.
    if let Err(errno) = access(candidate, AccessFlags::X_OK) {
        return Err(ExecError::NotExecutable {
            program: display.to_string(),
            cause: format!("{} ({})", errno.desc(), candidate.display()),
        });
    }
    Ok(candidate.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn finds_on_given_path_not_parent_path() {
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("mytool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let found = resolve_program(
            OsStr::new("mytool"),
            Some(dir.path().as_os_str()),
            Path::new("/"),
        )
        .unwrap();
        assert_eq!(found, tool);
        let err = resolve_program(
            OsStr::new("mytool"),
            Some(OsStr::new("/usr/bin")),
            Path::new("/"),
        )
        .unwrap_err();
        assert_eq!(err.exit_code(), 127, "{err}");
    }

    #[test]
    fn non_executable_is_126() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("data");
        std::fs::write(&file, "x").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = resolve_program(file.as_os_str(), None, Path::new("/")).unwrap_err();
        assert_eq!(err.exit_code(), 126, "{err}");
        let err = resolve_program(dir.path().as_os_str(), None, Path::new("/")).unwrap_err();
        assert_eq!(err.exit_code(), 126, "{err}");
    }
}
