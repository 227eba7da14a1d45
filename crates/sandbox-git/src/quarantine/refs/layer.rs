//! What the sandbox changed: every ref it wrote or deleted in its layer (or in a box's copy of
//! the common dir), read the way the overlay reads it, and never through a link it planted.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use git2::Oid;

use super::store::parse_packed;
use super::untrusted::read_untrusted;

/// What the sandbox set a ref to, as read from its layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted {
    /// A commit, or `None`: deleted.
    Value(Option<Oid>),
    /// Something that is not a plain ref (a symbolic ref, a FIFO, garbage): never applied.
    Unreadable(String),
}

/// Every ref the sandbox wrote or deleted in its layer. A deleted loose ref (an overlay
/// whiteout) falls back to the frozen `packed-refs`, as git would read it inside.
///
/// `below`: the host's common dir when the layer is a persistent one stacked directly on it
/// (a VM's, [`super::StoreQuarantine::attach`]). There is no frozen snapshot between them, so
/// what the layer hides of it counts too, read the way the overlay reads it: a whiteout over
/// a directory of loose refs, or a directory marked opaque (`user.overlay.opaque` or
/// `trusted.overlay.opaque`), deletes every loose ref below it; and a `packed-refs` the
/// sandbox wrote (`git pack-refs`, `git gc`) is what a deleted loose ref falls back to, and
/// names refs that now exist only there. Whatever this finds is judged by the same rules.
///
/// `snapshot`: the frozen layer between a run's own layer and the common dir (loose copies of
/// the refs of the start), when there is one. `packed-refs` is not pinned there: git before
/// 2.43 rewrites it to delete any ref (`git tag -d`, `git branch -D`), so the run may write its
/// own in its layer, which is read like a persistent layer's — never by git on the host.
///
/// [`super::StoreQuarantine::attach`]: crate::quarantine::StoreQuarantine::attach
pub(crate) fn changed(
    upper: &Path,
    packed_at_start: &HashMap<String, Oid>,
    below: Option<&Path>,
    snapshot: Option<&Path>,
) -> Vec<(String, Wanted)> {
    let layer_packed = layer_packed_refs(upper);
    let packed = layer_packed.as_ref().unwrap_or(packed_at_start);
    let mut found = Vec::new();
    let walk_below = below.map(|b| b.join("refs"));
    walk(
        upper,
        &upper.join("refs"),
        "refs",
        packed,
        walk_below.as_deref(),
        &mut found,
    );
    if let (Some(below), Some(layer_packed)) = (below.or(snapshot), &layer_packed) {
        // Refs that live only in a `packed-refs`: the sandbox's now, the host's at the start
        // (one the sandbox's leaves out is deleted). A loose ref below (the host's, or its
        // frozen copy) that the layer does not hide is what the sandbox sees, whatever either
        // file says.
        let seen: HashSet<String> = found.iter().map(|(n, _)| n.clone()).collect();
        let mut names: Vec<&String> = layer_packed.keys().chain(packed_at_start.keys()).collect();
        names.sort();
        names.dedup();
        for name in names {
            if seen.contains(name)
                || below
                    .join(name)
                    .symlink_metadata()
                    .is_ok_and(|m| m.is_file())
            {
                continue;
            }
            found.push((name.clone(), Wanted::Value(layer_packed.get(name).copied())));
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found.dedup_by(|a, b| a.0 == b.0);
    found
}

/// Every ref of a *copy* of the common dir that a guest wrote (a box's generation,
/// [`super::generation`]): its loose refs, its own `packed-refs` (read as an untrusted file),
/// and each ref of the start that is in neither — deleted. A copy has no whiteouts: a loose
/// ref is gone when its file is. A symbolic ref left as the host has it is no change.
///
/// [`super::generation`]: crate::quarantine::generation
pub(crate) fn changed_in_copy(
    copy: &Path,
    common: &Path,
    start: &HashMap<String, Option<Oid>>,
) -> Vec<(String, Wanted)> {
    let mut loose = Vec::new();
    walk(
        copy,
        &copy.join("refs"),
        "refs",
        &HashMap::new(),
        None,
        &mut loose,
    );
    let packed_path = copy.join("packed-refs");
    let packed = match read_untrusted(copy, &packed_path, MAX_PACKED_REFS_BYTES) {
        Ok(bytes) => parse_packed(&bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashMap::new(),
        Err(_) => {
            // A link or a FIFO in its place: nothing packed is believed.
            HashMap::new()
        }
    };
    let mut found: Vec<(String, Wanted)> = Vec::new();
    for (name, wanted) in loose {
        let same_symbolic = matches!(start.get(&name), Some(None))
            && read_untrusted(copy, &copy.join(&name), 256).ok()
                == std::fs::read(common.join(&name)).ok();
        if !same_symbolic {
            found.push((name, wanted));
        }
    }
    for (name, oid) in &packed {
        if !found.iter().any(|(n, _)| n == name) {
            found.push((name.clone(), Wanted::Value(Some(*oid))));
        }
    }
    for name in start.keys() {
        if !found.iter().any(|(n, _)| n == name) && !packed.contains_key(name) {
            let loose_left = copy.join(name).symlink_metadata().is_ok();
            if !loose_left {
                found.push((name.clone(), Wanted::Value(None)));
            }
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// The `packed-refs` the sandbox wrote in its layer, if it wrote one: `Some(empty)` for a
/// whiteout (it deleted the file). One that is not a regular file is never read.
fn layer_packed_refs(upper: &Path) -> Option<HashMap<String, Oid>> {
    let path = upper.join("packed-refs");
    let meta = path.symlink_metadata().ok()?;
    if is_whiteout(&meta) {
        return Some(HashMap::new());
    }
    if !meta.is_file() {
        return None;
    }
    let bytes = read_untrusted(upper, &path, MAX_PACKED_REFS_BYTES).ok()?;
    Some(parse_packed(&bytes))
}

/// A `packed-refs` in a layer is read up to this size (a repository with a million refs).
const MAX_PACKED_REFS_BYTES: u64 = 256 << 20;

/// An overlay whiteout: a character device 0:0 in the upper layer, which hides the name below.
pub(crate) fn is_whiteout(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    meta.file_type().is_char_device() && meta.rdev() == 0
}

/// Whether the overlay treats directory `dir` of an upper layer as opaque (nothing below it
/// shows through): `user.overlay.opaque` (an overlay mounted with `userxattr`) or
/// `trusted.overlay.opaque` set to `y`.
#[cfg(target_os = "linux")]
pub(crate) fn is_opaque(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    [c"user.overlay.opaque", c"trusted.overlay.opaque"]
        .iter()
        .any(|name| {
            let mut value = [0u8; 4];
            // Never follows a link.
            crate::sys::lgetxattr(&path, name, &mut value) == Ok(1) && value[0] == b'y'
        })
}

/// [`is_opaque`] elsewhere: no overlay.
#[cfg(not(target_os = "linux"))]
pub(crate) fn is_opaque(_dir: &Path) -> bool {
    false
}

fn walk(
    upper: &Path,
    dir: &Path,
    prefix: &str,
    packed: &HashMap<String, Oid>,
    below: Option<&Path>,
    found: &mut Vec<(String, Wanted)>,
) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(file) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let name = format!("{prefix}/{file}");
        let Ok(meta) = entry.path().symlink_metadata() else {
            continue;
        };
        let below_here = below.map(|b| b.join(&file));
        if meta.is_dir() {
            if let Some(lower) = &below_here {
                if is_opaque(&entry.path()) {
                    hidden(lower, &name, Some(&entry.path()), packed, found);
                }
            }
            // Below an opaque directory nothing of the host's shows through.
            let below_next = below_here.as_deref().filter(|_| !is_opaque(&entry.path()));
            walk(upper, &entry.path(), &name, packed, below_next, found);
        } else if file.ends_with(".lock") {
            // git's own lock files, mid-update.
        } else if is_whiteout(&meta) {
            found.push((name.clone(), Wanted::Value(packed.get(&name).copied())));
        } else if meta.is_file() {
            found.push((name.clone(), read_ref(upper, &entry.path())));
        } else {
            found.push((
                name.clone(),
                Wanted::Unreadable("it is not a regular file".into()),
            ));
        }
        if !meta.is_dir() {
            if let Some(lower) = &below_here {
                // Anything but a directory over a directory of the host's (a whiteout, a
                // file) hides every ref in it.
                hidden(lower, &name, None, packed, found);
            }
        }
    }
}

/// The host's loose refs in `lower` (a directory of its common dir, named `prefix`) that the
/// layer hides: deleted inside, falling back to `packed`. Those the layer's own directory
/// `upper` holds are the walk's.
fn hidden(
    lower: &Path,
    prefix: &str,
    upper: Option<&Path>,
    packed: &HashMap<String, Oid>,
    found: &mut Vec<(String, Wanted)>,
) {
    let Ok(entries) = std::fs::read_dir(lower) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(file) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let name = format!("{prefix}/{file}");
        // The layer's own entry of that name, if any (under an opaque directory it hides
        // everything of the host's below it too).
        let in_upper = upper
            .map(|u| u.join(&file))
            .and_then(|u| u.symlink_metadata().ok().map(|m| (u, m)));
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            let upper_dir = in_upper
                .as_ref()
                .filter(|(_, m)| m.is_dir())
                .map(|(u, _)| u.as_path());
            hidden(&entry.path(), &name, upper_dir, packed, found);
        } else if kind.is_file() && !file.ends_with(".lock") {
            // A ref the layer holds under the same name is the walk's.
            if in_upper.as_ref().is_some_and(|(_, m)| !m.is_dir()) {
                continue;
            }
            found.push((name.clone(), Wanted::Value(packed.get(&name).copied())));
        }
    }
}

fn read_ref(upper: &Path, path: &Path) -> Wanted {
    let bytes = match read_untrusted(upper, path, 256) {
        Ok(bytes) => bytes,
        Err(e) => return Wanted::Unreadable(format!("it cannot be read ({e})")),
    };
    let text = String::from_utf8_lossy(&bytes);
    let text = text.trim_end();
    if text.starts_with("ref: ") {
        return Wanted::Unreadable("it was made a symbolic ref".into());
    }
    match Oid::from_str(text) {
        Ok(oid) if text.len() == 40 || text.len() == 64 => Wanted::Value(Some(oid)),
        _ => Wanted::Unreadable("it does not hold an object id".into()),
    }
}
