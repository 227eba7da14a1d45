//! The files the workspace's Rust code reads from its own source tree at build or test time:
//! `include_str!`/`include_bytes!` arguments and `Path::new(env!("CARGO_MANIFEST_DIR"))
//! .join("…")` literals, resolved to paths relative to the repository root. The flake's crane
//! source must contain each of them (`cargo xtask nix-check`, "crate sources").

use std::path::{Component, Path, PathBuf};

use anyhow::Result;
use regex::Regex;

/// Repository-relative paths of the files read, from every `.rs` file under `crates/` and
/// `xtask/` of `root`.
pub fn files_read_by_tests(root: &Path) -> Result<Vec<PathBuf>> {
    let include = Regex::new(r#"include_(?:str|bytes)!\(\s*"([^"]+)"\s*\)"#)?;
    let manifest = Regex::new(r#"env!\("CARGO_MANIFEST_DIR"\)\)?\s*\.join\(\s*"([^"]+)"\s*\)"#)?;
    let mut found = Vec::new();
    for top in ["crates", "xtask"] {
        let mut dirs = vec![root.join(top)];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir)? {
                let path = entry?.path();
                if path.is_dir() {
                    // The fuzz crate is not a workspace member, and target/ is build output.
                    if !matches!(
                        path.file_name().and_then(|n| n.to_str()),
                        Some("target" | "fuzz")
                    ) {
                        dirs.push(path);
                    }
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&path)?;
                let crate_dir = crate_dir(&path);
                for caps in include.captures_iter(&text) {
                    let base = path.parent().unwrap_or(root);
                    found.push(normalise(&base.join(&caps[1]), root));
                }
                if let Some(crate_dir) = &crate_dir {
                    for caps in manifest.captures_iter(&text) {
                        found.push(normalise(&crate_dir.join(&caps[1]), root));
                    }
                }
            }
        }
    }
    // Build outputs a test may use when present (`target/box-image`, `target/boxlite-runtime`)
    // are not sources.
    let mut found: Vec<PathBuf> = found
        .into_iter()
        .flatten()
        .filter(|p| !p.starts_with("target"))
        .collect();
    found.sort();
    found.dedup();
    Ok(found)
}

/// The nearest directory above `file` with a Cargo.toml.
fn crate_dir(file: &Path) -> Option<PathBuf> {
    file.ancestors()
        .skip(1)
        .find(|d| d.join("Cargo.toml").is_file())
        .map(Path::to_path_buf)
}

/// `path` with `.` and `..` resolved lexically, relative to `root` (None outside it).
fn normalise(path: &Path, root: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out.strip_prefix(root).ok().map(Path::to_path_buf)
}
