//! After a run: the git pointer files must still say what they said before.
//!
//! An agent that can write its worktree can rewrite `.git` (the "gitdir: …" pointer) to a git
//! directory of its own whose config or hooks run code the next time *the host* uses git in
//! that worktree; `commondir` and `gitdir` in the worktree's private git dir are writable for
//! the same reason. Each is compared with the bytes recorded before the run and restored.

use std::path::{Path, PathBuf};

use sandbox_policy::GitLayout;
use serde::Serialize;

/// One pointer that was changed during the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tampering {
    pub path: PathBuf,
    /// What was there after the run ("(missing)", "(directory)", "(symlink)" or the text).
    pub found: String,
    /// Whether the original was put back.
    pub restored: bool,
    /// Where a replaced directory was moved, so nothing is deleted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quarantined: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl std::fmt::Display for Tampering {
    /// "the sandboxed command changed git pointer P (found "…"); restored it[; …]" — the one
    /// wording `sandbox run` and the daemon both report.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the sandboxed command changed git pointer {} (found {:?}); {}",
            self.path.display(),
            self.found.trim(),
            if self.restored {
                "restored it"
            } else {
                "could NOT restore it"
            }
        )?;
        if let Some(q) = &self.quarantined {
            write!(f, "; the directory it left is at {}", q.display())?;
        }
        if let Some(e) = &self.error {
            write!(f, ": {e}")?;
        }
        Ok(())
    }
}

fn describe(path: &Path) -> Option<String> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(_) => return Some("(missing)".into()),
    };
    if meta.file_type().is_symlink() {
        return Some(format!(
            "(symlink to {})",
            std::fs::read_link(path)
                .map(|t| t.display().to_string())
                .unwrap_or_default()
        ));
    }
    if meta.is_dir() {
        return Some("(directory)".into());
    }
    match std::fs::read(path) {
        Ok(bytes) => Some(String::from_utf8_lossy(&bytes).into_owned()),
        Err(e) => Some(format!("(unreadable: {e})")),
    }
}

fn restore(path: &Path, content: &str, t: &mut Tampering) {
    let result = (|| -> std::io::Result<()> {
        let meta = std::fs::symlink_metadata(path).ok();
        if let Some(meta) = meta {
            if meta.is_dir() && !meta.file_type().is_symlink() {
                let stamp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let aside = path.with_file_name(format!(
                    "{}.sandbox-quarantine-{stamp}",
                    path.file_name().unwrap_or_default().to_string_lossy()
                ));
                std::fs::rename(path, &aside)?;
                t.quarantined = Some(aside);
            } else {
                std::fs::remove_file(path)?;
            }
        }
        let tmp = path.with_file_name(format!(
            ".{}.sandbox-restore",
            path.file_name().unwrap_or_default().to_string_lossy()
        ));
        std::fs::write(&tmp, content)?;
        std::fs::rename(&tmp, path)
    })();
    match result {
        Ok(()) => t.restored = true,
        Err(e) => t.error = Some(e.to_string()),
    }
}

/// Compares every recorded pointer with the filesystem and restores the changed ones.
pub fn check_and_restore(layout: &GitLayout) -> Vec<Tampering> {
    let mut found = Vec::new();
    for pointer in &layout.pointers {
        let now = describe(&pointer.path);
        if now.as_deref() == Some(pointer.content.as_str()) {
            continue;
        }
        let mut t = Tampering {
            path: pointer.path.clone(),
            found: now.unwrap_or_default(),
            restored: false,
            quarantined: None,
            error: None,
        };
        restore(&pointer.path, &pointer.content, &mut t);
        found.push(t);
    }
    found
}

/// True if `extensions.worktreeConfig` is on now but was off before the run.
pub fn worktree_config_enabled_since(layout: &GitLayout) -> bool {
    if layout.worktree_config {
        return false;
    }
    git_config_bool(
        &layout.common_dir.join("config"),
        "extensions.worktreeConfig",
    )
}

/// Reads one boolean from a git config file without running git (and so without honouring
/// anything the file might say about hooks or includes).
fn git_config_bool(path: &Path, key: &str) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    let (section, name) = key.split_once('.').unwrap_or(("", key));
    let mut in_section = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_section = line
                .trim_matches(|c| c == '[' || c == ']')
                .trim()
                .eq_ignore_ascii_case(section);
            continue;
        }
        if in_section {
            if let Some((k, v)) = line.split_once('=') {
                if k.trim().eq_ignore_ascii_case(name) {
                    return matches!(
                        v.trim().to_ascii_lowercase().as_str(),
                        "true" | "yes" | "on" | "1"
                    );
                }
            } else if line.eq_ignore_ascii_case(name) {
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_policy::PointerFile;

    fn layout(dir: &Path) -> GitLayout {
        let pointer = dir.join(".git");
        std::fs::write(&pointer, "gitdir: /repo/.git/worktrees/t\n").unwrap();
        GitLayout {
            is_linked: true,
            common_dir: dir.join("common"),
            worktree_gitdir: dir.join("common/worktrees/t"),
            worktree_config: false,
            pointers: vec![PointerFile {
                path: pointer,
                content: "gitdir: /repo/.git/worktrees/t\n".into(),
            }],
        }
    }

    #[test]
    fn untouched_pointers_report_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert!(check_and_restore(&layout(dir.path())).is_empty());
    }

    #[test]
    fn rewritten_pointer_is_restored() {
        let dir = tempfile::tempdir().unwrap();
        let l = layout(dir.path());
        std::fs::write(dir.path().join(".git"), "gitdir: /tmp/evil\n").unwrap();
        let t = check_and_restore(&l);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].found, "gitdir: /tmp/evil\n");
        assert!(t[0].restored);
        assert_eq!(
            std::fs::read_to_string(dir.path().join(".git")).unwrap(),
            "gitdir: /repo/.git/worktrees/t\n"
        );
    }

    #[test]
    fn replaced_by_a_directory_is_quarantined_not_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let l = layout(dir.path());
        std::fs::remove_file(dir.path().join(".git")).unwrap();
        std::fs::create_dir_all(dir.path().join(".git/hooks")).unwrap();
        std::fs::write(dir.path().join(".git/config"), "[core]\nhooksPath=x\n").unwrap();
        let t = check_and_restore(&l);
        assert_eq!(t[0].found, "(directory)");
        let aside = t[0].quarantined.clone().unwrap();
        assert!(aside.join("config").exists());
        assert!(dir.path().join(".git").is_file());
    }

    #[test]
    fn config_bool_parsing() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("config");
        std::fs::write(
            &cfg,
            "[core]\n\tbare = false\n[extensions]\n\tworktreeConfig = true\n",
        )
        .unwrap();
        assert!(git_config_bool(&cfg, "extensions.worktreeConfig"));
        std::fs::write(&cfg, "[extensions]\n\tworktreeconfig = false\n").unwrap();
        assert!(!git_config_bool(&cfg, "extensions.worktreeConfig"));
    }
}
