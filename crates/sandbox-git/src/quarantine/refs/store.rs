//! The host's refs as they stand: `packed-refs` read (and frozen for the sandbox), every
//! ref listed from the files as git lays them out.

use std::collections::HashMap;
use std::path::Path;

use git2::Oid;

/// `packed-refs` as it was: its bytes (frozen for the sandbox) and its refs.
pub(crate) struct Packed {
    pub bytes: Vec<u8>,
    pub refs: HashMap<String, Oid>,
}

/// Written when the repository has no `packed-refs`: the sandbox then sees an empty one it
/// cannot replace (git reads a missing and an empty file alike).
const EMPTY_PACKED: &str = "# pack-refs with: peeled fully-peeled sorted \n";

pub(crate) fn read_packed(path: &Path) -> std::io::Result<Packed> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => EMPTY_PACKED.as_bytes().to_vec(),
        Err(e) => return Err(e),
    };
    let refs = parse_packed(&bytes);
    Ok(Packed { bytes, refs })
}

/// The refs a `packed-refs` file holds (peeled lines and comments skipped, names that are not
/// refs' dropped).
pub(super) fn parse_packed(bytes: &[u8]) -> HashMap<String, Oid> {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('^'))
        .filter_map(|l| {
            let (oid, name) = l.split_once(' ')?;
            // The names become paths in the snapshot layer: never one that is not a ref's
            // (`refs/heads/../../x`, written by an earlier run that had `packed-refs` writable).
            valid_ref_name(name).then_some(())?;
            Some((name.to_string(), Oid::from_str(oid).ok()?))
        })
        .collect()
}

/// A ref under `refs/` with a name git accepts (no `..`, no control characters, …).
pub fn valid_ref_name(name: &str) -> bool {
    name.starts_with("refs/") && git2::Reference::is_valid_name(name)
}

/// Whether ref `name` (a valid ref name) exists in the store at `common`: loose, or in
/// `packed-refs`.
pub fn ref_exists(common: &Path, name: &str) -> bool {
    common.join(name).symlink_metadata().is_ok()
        || read_packed(&common.join("packed-refs")).is_ok_and(|p| p.refs.contains_key(name))
}

/// Every ref of the store (loose over packed), with its direct target (`None`: symbolic),
/// read from the files as git lays them out: no repository open (and its config reads) on
/// every run's start.
pub(crate) fn list(common: &Path, packed: &HashMap<String, Oid>) -> HashMap<String, Option<Oid>> {
    let mut refs: HashMap<String, Option<Oid>> = packed
        .iter()
        .map(|(name, oid)| (name.clone(), Some(*oid)))
        .collect();
    list_loose(&common.join("refs"), "refs", &mut refs);
    refs
}

fn list_loose(dir: &Path, prefix: &str, refs: &mut HashMap<String, Option<Oid>>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(file) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let name = format!("{prefix}/{file}");
        match entry.file_type() {
            Ok(t) if t.is_dir() => list_loose(&entry.path(), &name, refs),
            Ok(t) if t.is_file() && !file.ends_with(".lock") => {
                let Ok(text) = std::fs::read_to_string(entry.path()) else {
                    continue;
                };
                let text = text.trim_end();
                if text.starts_with("ref: ") {
                    refs.insert(name, None);
                } else if let Ok(oid) = Oid::from_str(text) {
                    refs.insert(name, Some(oid));
                }
            }
            _ => {}
        }
    }
}

/// Where a symbolic ref points (`refs/remotes/origin/HEAD`).
pub(crate) fn symbolic_target(common: &Path, name: &str) -> Option<String> {
    let text = std::fs::read_to_string(common.join(name)).ok()?;
    text.trim_end().strip_prefix("ref: ").map(str::to_string)
}
