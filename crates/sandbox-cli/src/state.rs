//! Per-worktree choices (`sandbox use`), kept in the user's state directory — never in the
//! worktree, where the sandboxed process could change which boundary it gets next time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BackendChoices {
    /// Canonical worktree root → backend name.
    worktrees: BTreeMap<PathBuf, String>,
}

fn file(state_dir: &Path) -> PathBuf {
    state_dir.join("backends.json")
}

fn load(state_dir: &Path) -> anyhow::Result<BackendChoices> {
    let path = file(state_dir);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .with_context(|| format!("{}: not a valid backend-choice file", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BackendChoices::default()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

fn save(state_dir: &Path, choices: &BackendChoices) -> anyhow::Result<()> {
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("creating {}", state_dir.display()))?;
    let path = file(state_dir);
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(choices)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// The backend remembered for `worktree`, if any.
pub fn backend_for(state_dir: &Path, worktree: &Path) -> anyhow::Result<Option<String>> {
    Ok(load(state_dir)?.worktrees.get(worktree).cloned())
}

/// Remembers (or with `None`, forgets) the backend for `worktree`.
pub fn set_backend(state_dir: &Path, worktree: &Path, backend: Option<&str>) -> anyhow::Result<()> {
    let mut choices = load(state_dir)?;
    match backend {
        Some(b) => {
            choices
                .worktrees
                .insert(worktree.to_path_buf(), b.to_string());
        }
        None => {
            choices.worktrees.remove(worktree);
        }
    }
    save(state_dir, &choices)
}
