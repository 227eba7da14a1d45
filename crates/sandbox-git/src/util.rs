//! Small helpers shared by the modules.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::ViewError;

/// Quotes `s` for a POSIX shell when it needs it, so suggested commands can be pasted.
pub(crate) fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:@%+=,".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

pub(crate) fn q(p: &Path) -> String {
    shell_quote(&p.to_string_lossy())
}

/// The first 12 hex digits of a commit id, for messages.
pub(crate) fn short(id: &git2::Oid) -> String {
    let s = id.to_string();
    s[..12.min(s.len())].to_string()
}

/// Writes `data` to `path` through a temporary file and a rename, so readers never see half.
pub(crate) fn write_atomic(path: &Path, data: &[u8]) -> Result<(), ViewError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        ViewError::Io {
            action: "cannot write".into(),
            path: path.to_path_buf(),
            source: e,
        }
    })
}

/// Reads a one-line git pointer file (`.git` of a worktree, `gitdir`, `commondir`) and returns
/// its path, resolved against `base` when relative. `prefix` is `"gitdir: "` for `.git` files.
pub(crate) fn read_pointer(file: &Path, prefix: &str, base: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(file).ok()?;
    let line = text.lines().next()?.trim_end();
    let value = line.strip_prefix(prefix)?;
    if value.is_empty() {
        return None;
    }
    let p = PathBuf::from(value);
    Some(if p.is_absolute() { p } else { base.join(p) })
}

/// Canonical form of `p` if it exists, else `p` itself (for comparisons).
pub(crate) fn canon(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

pub(crate) fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Creates `dir` (and parents) readable by the owner only: lock and state files live there.
pub(crate) fn create_private_dir(dir: &Path) -> Result<(), ViewError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(ViewError::io("cannot create directory", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("s/main"), "s/main");
        assert_eq!(shell_quote("/a b/c"), "'/a b/c'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
