//! Refs in the quarantine: what existed at the start, what the sandbox changed in its layer,
//! which changes the host applies ([`judge`], pure), and the compare-and-swap that applies
//! them.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use git2::{Oid, Repository};

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
fn parse_packed(bytes: &[u8]) -> HashMap<String, Oid> {
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
            // SAFETY: lgetxattr(2) with NUL-terminated strings, writing at most `value.len()`
            // bytes into our buffer; it never follows a link.
            let n = unsafe {
                libc::lgetxattr(
                    path.as_ptr(),
                    name.as_ptr(),
                    value.as_mut_ptr().cast(),
                    value.len(),
                )
            };
            n == 1 && value[0] == b'y'
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

/// Opens `path`, a regular file the sandbox wrote in its layer `root`: resolved beneath
/// `root` with no symbolic link in any component (`openat2`), and without blocking on a FIFO.
/// A link the sandbox planted can thus never make the host read one of its own files (whose
/// last line would land in a reflog the sandbox can read).
#[cfg(not(target_os = "linux"))]
pub(crate) fn open_untrusted(_root: &Path, _path: &Path) -> std::io::Result<std::fs::File> {
    // No openat2: nothing here could read the layer as safely. The quarantine needs Linux's
    // private view anyway.
    Err(std::io::ErrorKind::Unsupported.into())
}

/// [`open_untrusted`] on Linux.
#[cfg(target_os = "linux")]
pub(crate) fn open_untrusted(root: &Path, path: &Path) -> std::io::Result<std::fs::File> {
    use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
    use std::os::fd::FromRawFd;
    let rel = path
        .strip_prefix(root)
        .map_err(|_| std::io::Error::other("outside the layer"))?;
    let dir = std::fs::File::open(root)?;
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
    let fd = openat2(std::os::fd::AsRawFd::as_raw_fd(&dir), rel, how)?;
    // SAFETY: openat2 returned a fresh descriptor that nothing else owns.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(file)
}

/// Reads at most `limit` bytes of `path`, a file the sandbox wrote in its layer `root`,
/// opened as [`open_untrusted`] opens it.
pub(crate) fn read_untrusted(root: &Path, path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    open_untrusted(root, path)?
        .take(limit)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
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

/// A full object id (SHA-1 or SHA-256), as a detached `HEAD` holds it.
pub fn is_object_id(text: &str) -> bool {
    matches!(text.len(), 40 | 64) && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether a run may end with its worktree's `HEAD` reading `found`. The next run takes the
/// branch `HEAD` names for its task branch, so `HEAD` may be left detached (a commit id) or
/// naming the task branch, a ref this run `created`, or a branch that does not exist
/// (`exists` asks the host) — never another existing branch. Pure.
pub fn head_allowed(
    found: &str,
    task_branch: Option<&str>,
    created: &[&str],
    exists: impl Fn(&str) -> bool,
) -> bool {
    let found = found.trim_end();
    if is_object_id(found) {
        return true;
    }
    let Some(name) = found.strip_prefix("ref: ") else {
        return false;
    };
    if !name.starts_with("refs/heads/") || !valid_ref_name(name) {
        return false;
    }
    Some(name) == task_branch || created.contains(&name) || !exists(name)
}

/// What the host does with one changed ref.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefVerdict {
    /// Already so on the host (or never existed, and still does not).
    Unchanged,
    /// Apply it if the host still has `expected` (`None`: absent).
    Apply {
        expected: Option<Oid>,
    },
    Refuse(String),
}

/// The rule, as a pure function: the task branch may move (not be deleted); refs the run
/// created may move and be deleted; a ref that did not exist at the start may be created as
/// a branch, a tag or the stash, unless it shadows a ref the host has ([`creation_refused`]);
/// nothing else changes. `start` holds every ref at the start, `applied` the last value the
/// host set for a ref during this run.
pub fn judge(
    name: &str,
    wanted: Option<Oid>,
    task_branch: Option<&str>,
    start: &HashMap<String, Option<Oid>>,
    applied: &HashMap<String, Option<Oid>>,
    created: &HashSet<String>,
) -> RefVerdict {
    let current = match applied.get(name) {
        Some(value) => *value,
        None => start.get(name).copied().flatten(),
    };
    if wanted == current {
        return RefVerdict::Unchanged;
    }
    if !valid_ref_name(name) {
        return RefVerdict::Refuse("not a valid ref name".into());
    }
    if Some(name) == task_branch {
        return match wanted {
            None => RefVerdict::Refuse(
                "the task branch is never deleted from inside the sandbox".into(),
            ),
            Some(_) => RefVerdict::Apply { expected: current },
        };
    }
    if created.contains(name) {
        return RefVerdict::Apply { expected: current };
    }
    if !start.contains_key(name) && !applied.contains_key(name) {
        if wanted.is_none() {
            return RefVerdict::Unchanged;
        }
        if let Some(reason) = creation_refused(name, |other| match applied.get(other) {
            Some(value) => value.is_some(),
            None => start.contains_key(other),
        }) {
            return RefVerdict::Refuse(reason);
        }
        return RefVerdict::Apply { expected: None };
    }
    RefVerdict::Refuse(
        "it existed before the run, and only the task branch and refs the run creates are \
         applied"
            .into(),
    )
}

/// Where a run may create refs: branches, tags and the stash. Everything else changes what
/// the host's git does with names it already has — `refs/replace/<oid>` makes every reader
/// see another object in place of one `main` holds (`git show main:a.txt`, a fresh checkout),
/// `refs/notes/*` adds text to `git log`, `refs/remotes/*` moves what `origin/main` means.
pub fn creatable_namespace(name: &str) -> bool {
    name == "refs/stash"
        || name
            .strip_prefix("refs/heads/")
            .or_else(|| name.strip_prefix("refs/tags/"))
            .is_some_and(|rest| !rest.is_empty())
}

/// git's lookup order for a short name `s` (`refs.c`, `ref_rev_parse_rules`): the first of
/// these that exists is what `git show s`, `git reset s`, `git log s` use; `git checkout s`
/// and `git switch s` try `refs/heads/s` first.
const LOOKUP_RULES: [(&str, &str); 6] = [
    ("", ""),
    ("refs/", ""),
    ("refs/tags/", ""),
    ("refs/heads/", ""),
    ("refs/remotes/", ""),
    ("refs/remotes/", "/HEAD"),
];

/// A name git keeps at the top of the store (`HEAD`, `ORIG_HEAD`, `FETCH_HEAD`, …): the first
/// lookup rule finds it whether or not it exists now.
fn is_root_ref(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
        && (name.ends_with("HEAD")
            || matches!(
                name,
                "AUTO_MERGE" | "BISECT_EXPECTED_REV" | "NOTES_MERGE_PARTIAL" | "NOTES_MERGE_REF"
            ))
}

/// Another ref the user may mean by a short name of `name` (`exists` says which refs the host
/// has): a new `refs/tags/main` beside `refs/heads/main` turns `git reset --hard main` into the
/// agent's tag, a new `refs/heads/origin/main` wins over `refs/remotes/origin/main`, and a new
/// `refs/heads/refs/heads/main` is what `git checkout refs/heads/main` switches to. Any other
/// ref reached by any short name of `name`, by any rule, counts. Pure.
pub fn shadows(name: &str, exists: impl Fn(&str) -> bool) -> Option<String> {
    for (prefix, suffix) in LOOKUP_RULES {
        let Some(short) = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix(suffix))
            .filter(|s| !s.is_empty())
        else {
            continue;
        };
        for (p, s) in LOOKUP_RULES {
            let other = format!("{p}{short}{s}");
            if other == name {
                continue;
            }
            if (p.is_empty() && is_root_ref(&other)) || exists(&other) {
                return Some(other);
            }
        }
    }
    None
}

/// Why a run may not create `name` (a valid ref name that does not exist), if so: outside
/// [`creatable_namespace`], or [`shadows`] a ref the host has.
pub fn creation_refused(name: &str, exists: impl Fn(&str) -> bool) -> Option<String> {
    if !creatable_namespace(name) {
        return Some(
            "a run creates refs only under refs/heads/, refs/tags/ and refs/stash; this one \
             would change what the repository's existing names mean (create it on the host \
             if you want it)"
                .into(),
        );
    }
    shadows(name, exists).map(|other| {
        format!(
            "its short name would also mean {other}, which the repository has: git would \
             resolve that name to the run's ref (pick another name)"
        )
    })
}

/// Sets (or deletes) `name` only if the repository still has `expected` — or, for an update,
/// has a commit `wanted` descends from — under git's own ref lock, so a concurrent git on the
/// host either sees the whole update or none of it, and never loses a commit to it. Returns
/// the value replaced.
pub(crate) fn compare_and_swap(
    repo: &Repository,
    name: &str,
    expected: Option<Oid>,
    wanted: Option<Oid>,
    may_fast_forward: bool,
    message: &str,
) -> Result<Option<Oid>, String> {
    let mut tx = repo.transaction().map_err(|e| e.message().to_string())?;
    tx.lock_ref(name)
        .map_err(|e| format!("it is locked on the host ({})", e.message()))?;
    let now = match repo.find_reference(name) {
        Ok(reference) => match reference.target() {
            Some(oid) => Some(oid),
            None => return Err("it is a symbolic ref on the host".into()),
        },
        Err(e) if e.code() == git2::ErrorCode::NotFound => None,
        Err(e) => return Err(e.message().to_string()),
    };
    // The task branch, moved on the host meanwhile (another run in the same worktree, the
    // user), may still be moved forward: nothing of the host's is lost when the new commit
    // descends from it. Never another ref: one created meanwhile is someone else's.
    let fast_forward = match (now, wanted) {
        _ if !may_fast_forward => false,
        (Some(now), Some(wanted)) => repo.graph_descendant_of(wanted, now).unwrap_or(false),
        _ => false,
    };
    if now != expected && !fast_forward {
        return Err(format!(
            "it moved on the host during the run (expected {}, found {})",
            describe(expected),
            describe(now)
        ));
    }
    match wanted {
        Some(oid) => tx.set_target(name, oid, None, message),
        None => tx.remove(name),
    }
    .and_then(|()| tx.commit())
    .map(|()| now)
    .map_err(|e| e.message().to_string())
}

fn describe(oid: Option<Oid>) -> String {
    oid.map_or("no ref".into(), |o| o.to_string()[..12].to_string())
}

/// One reflog entry, as git writes it: `<old> <new> <name> <<email>> <time> <tz>\t<message>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReflogEntry {
    pub new: Oid,
    pub name: String,
    pub email: String,
    pub time: i64,
    pub offset_minutes: i32,
    pub message: String,
}

/// The entries of the reflog at `path`, oldest first (`read` reads the file); lines that do
/// not parse are skipped, messages lose control characters.
pub(crate) fn read_reflog(
    path: &Path,
    read: impl Fn(&Path) -> std::io::Result<Vec<u8>>,
) -> Vec<ReflogEntry> {
    let Ok(bytes) = read(path) else {
        return Vec::new();
    };
    String::from_utf8_lossy(&bytes)
        .lines()
        .filter_map(|line| {
            let (head, message) = line.split_once('\t').unwrap_or((line, ""));
            let mut words = head.splitn(3, ' ');
            let _old = words.next()?;
            let new = Oid::from_str(words.next()?).ok()?;
            let ident = words.next()?;
            let (who, when) = ident.rsplit_once('>')?;
            let (name, email) = who.split_once('<')?;
            let mut when = when.split_whitespace();
            let time = when.next()?.parse().ok()?;
            let tz: i32 = when.next()?.parse().ok()?;
            Some(ReflogEntry {
                new,
                name: name.trim().to_string(),
                email: email.to_string(),
                time,
                offset_minutes: tz.signum() * ((tz.abs() / 100) * 60 + tz.abs() % 100),
                message: message
                    .chars()
                    .filter(|c| !c.is_control())
                    .take(1000)
                    .collect(),
            })
        })
        .collect()
}

/// Replaces the reflog of `name` in `repo` with `entries` (git's own format, by libgit2).
pub(crate) fn write_reflog(
    repo: &Repository,
    name: &str,
    entries: &[ReflogEntry],
) -> Result<(), git2::Error> {
    let mut reflog = repo.reflog(name)?;
    while !reflog.is_empty() {
        reflog.remove(reflog.len() - 1, false)?;
    }
    for e in entries {
        let when = git2::Time::new(e.time, e.offset_minutes);
        let who = git2::Signature::new(&e.name, &e.email, &when)?;
        reflog.append(e.new, &who, Some(&e.message))?;
    }
    reflog.write()
}

/// The message of the sandbox's last reflog entry for `name`, for the host's reflog.
pub(crate) fn last_reflog_message(upper: &Path, name: &str) -> String {
    let message = read_untrusted(upper, &upper.join("logs").join(name), 1 << 20)
        .ok()
        .and_then(|bytes| {
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let line = text.lines().last()?.to_string();
            let (_, message) = line.split_once('\t')?;
            Some(
                message
                    .chars()
                    .filter(|c| !c.is_control())
                    .take(200)
                    .collect::<String>(),
            )
        });
    match message {
        Some(m) if !m.is_empty() => format!("sandbox: {m}"),
        _ => "sandbox: update from a sandboxed run".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oid(n: u8) -> Oid {
        Oid::from_bytes(&[n; 20]).unwrap()
    }

    fn start() -> HashMap<String, Option<Oid>> {
        [
            ("refs/heads/main".to_string(), Some(oid(1))),
            ("refs/heads/task".to_string(), Some(oid(2))),
            ("refs/tags/v1".to_string(), Some(oid(1))),
        ]
        .into()
    }

    fn verdict(
        name: &str,
        wanted: Option<Oid>,
        applied: &[(&str, Option<Oid>)],
        created: &[&str],
    ) -> RefVerdict {
        let applied = applied.iter().map(|(n, v)| (n.to_string(), *v)).collect();
        let created = created.iter().map(|n| n.to_string()).collect();
        judge(
            name,
            wanted,
            Some("refs/heads/task"),
            &start(),
            &applied,
            &created,
        )
    }

    #[test]
    fn head_may_be_left_on_the_runs_own_branches_or_detached_only() {
        let exists =
            |name: &str| ["refs/heads/main", "refs/heads/task", "refs/heads/new"].contains(&name);
        let task = Some("refs/heads/task");
        let allowed = |found: &str| head_allowed(found, task, &["refs/heads/new"], exists);
        assert!(allowed("ref: refs/heads/task\n"));
        assert!(allowed("ref: refs/heads/new\n"), "created by the run");
        assert!(
            allowed("ref: refs/heads/unborn\n"),
            "does not exist: only a commit makes it"
        );
        assert!(allowed(&format!("{}\n", oid(7))), "detached");
        assert!(
            !allowed("ref: refs/heads/main\n"),
            "another existing branch"
        );
        assert!(!allowed("ref: refs/tags/v1\n"), "not a branch");
        assert!(!allowed("ref: refs/heads/../../x\n"), "not a ref name");
        assert!(!allowed("(symlink to /elsewhere)"));
        assert!(!allowed("(missing)"));
        assert!(
            !head_allowed("ref: refs/heads/main\n", None, &[], exists),
            "detached at the start"
        );
    }

    #[test]
    fn the_task_branch_moves_but_is_not_deleted() {
        assert_eq!(
            verdict("refs/heads/task", Some(oid(3)), &[], &[]),
            RefVerdict::Apply {
                expected: Some(oid(2))
            }
        );
        assert_eq!(
            verdict(
                "refs/heads/task",
                Some(oid(4)),
                &[("refs/heads/task", Some(oid(3)))],
                &[]
            ),
            RefVerdict::Apply {
                expected: Some(oid(3))
            }
        );
        assert_eq!(
            verdict("refs/heads/task", Some(oid(2)), &[], &[]),
            RefVerdict::Unchanged
        );
        assert!(matches!(
            verdict("refs/heads/task", None, &[], &[]),
            RefVerdict::Refuse(_)
        ));
    }

    #[test]
    fn other_existing_refs_never_change() {
        for name in ["refs/heads/main", "refs/tags/v1"] {
            assert!(
                matches!(verdict(name, Some(oid(9)), &[], &[]), RefVerdict::Refuse(_)),
                "{name}"
            );
            assert!(
                matches!(verdict(name, None, &[], &[]), RefVerdict::Refuse(_)),
                "{name}"
            );
            assert_eq!(verdict(name, Some(oid(1)), &[], &[]), RefVerdict::Unchanged);
        }
    }

    #[test]
    fn refs_the_run_creates_are_its_own() {
        assert_eq!(
            verdict("refs/heads/side", Some(oid(5)), &[], &[]),
            RefVerdict::Apply { expected: None }
        );
        assert_eq!(
            verdict("refs/heads/side", None, &[], &[]),
            RefVerdict::Unchanged
        );
        let applied = [("refs/heads/side", Some(oid(5)))];
        assert_eq!(
            verdict(
                "refs/heads/side",
                Some(oid(6)),
                &applied,
                &["refs/heads/side"]
            ),
            RefVerdict::Apply {
                expected: Some(oid(5))
            }
        );
        assert_eq!(
            verdict("refs/heads/side", None, &applied, &["refs/heads/side"]),
            RefVerdict::Apply {
                expected: Some(oid(5))
            }
        );
        // Deleted and created again: still its own.
        let deleted = [("refs/heads/side", None)];
        assert_eq!(
            verdict(
                "refs/heads/side",
                Some(oid(7)),
                &deleted,
                &["refs/heads/side"]
            ),
            RefVerdict::Apply { expected: None }
        );
        assert!(matches!(
            verdict("HEAD", Some(oid(5)), &[], &[]),
            RefVerdict::Refuse(_)
        ));
    }

    #[test]
    fn new_refs_only_as_branches_tags_or_the_stash() {
        for refused in [
            "refs/replace/0123456789012345678901234567890123456789",
            "refs/notes/commits",
            "refs/remotes/origin/evil",
            "refs/bisect/bad",
            "refs/evil",
            "refs/heads",
        ] {
            assert!(
                matches!(
                    verdict(refused, Some(oid(5)), &[], &[]),
                    RefVerdict::Refuse(_)
                ),
                "{refused}"
            );
        }
        for allowed in ["refs/heads/side", "refs/tags/v2", "refs/stash"] {
            assert_eq!(
                verdict(allowed, Some(oid(5)), &[], &[]),
                RefVerdict::Apply { expected: None },
                "{allowed}"
            );
        }
    }

    #[test]
    fn a_new_ref_may_not_shadow_an_existing_one() {
        let host = [
            "refs/heads/main",
            "refs/tags/v1",
            "refs/remotes/origin/main",
            "refs/remotes/origin/HEAD",
            "refs/heads/dir/x",
        ];
        let exists = |n: &str| host.contains(&n);
        for (new, shadowed) in [
            ("refs/tags/main", "refs/heads/main"),
            ("refs/heads/v1", "refs/tags/v1"),
            ("refs/heads/origin/main", "refs/remotes/origin/main"),
            ("refs/tags/origin/main", "refs/remotes/origin/main"),
            ("refs/heads/origin", "refs/remotes/origin/HEAD"),
            ("refs/heads/origin/HEAD", "refs/remotes/origin/HEAD"),
            ("refs/heads/refs/heads/main", "refs/heads/main"),
            ("refs/heads/heads/main", "refs/heads/main"),
            ("refs/tags/tags/v1", "refs/tags/v1"),
            ("refs/heads/HEAD", "HEAD"),
            ("refs/tags/ORIG_HEAD", "ORIG_HEAD"),
        ] {
            assert_eq!(shadows(new, exists).as_deref(), Some(shadowed), "{new}");
            assert!(creation_refused(new, exists).is_some(), "{new}");
        }
        for fine in [
            "refs/heads/side",
            "refs/tags/v2",
            "refs/heads/dir/y",
            "refs/stash",
        ] {
            assert_eq!(shadows(fine, exists), None, "{fine}");
        }
        // Through the judge: the refs of the start count, and so do those the run applied.
        assert!(matches!(
            verdict("refs/tags/task", Some(oid(5)), &[], &[]),
            RefVerdict::Refuse(_)
        ));
        assert!(matches!(
            verdict(
                "refs/tags/side",
                Some(oid(5)),
                &[("refs/heads/side", Some(oid(4)))],
                &["refs/heads/side"]
            ),
            RefVerdict::Refuse(_)
        ));
        // A ref the run deleted no longer exists.
        assert_eq!(
            verdict(
                "refs/tags/side",
                Some(oid(5)),
                &[("refs/heads/side", None)],
                &["refs/heads/side"]
            ),
            RefVerdict::Apply { expected: None }
        );
    }

    #[test]
    fn a_whiteout_falls_back_to_the_frozen_packed_refs() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let heads = dir.path().join("refs/heads");
        std::fs::create_dir_all(&heads).unwrap();
        std::fs::write(heads.join("task"), format!("{}\n", oid(3))).unwrap();
        std::fs::write(heads.join("task.lock"), "x").unwrap();
        std::fs::write(heads.join("junk"), "not an id\n").unwrap();
        symlink("/etc/passwd", heads.join("link")).unwrap();
        nix::unistd::mkfifo(&heads.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let packed: HashMap<String, Oid> = [("refs/heads/old".to_string(), oid(1))].into();
        let found: HashMap<String, Wanted> = changed(dir.path(), &packed, None, None)
            .into_iter()
            .collect();
        assert_eq!(found["refs/heads/task"], Wanted::Value(Some(oid(3))));
        assert!(!found.contains_key("refs/heads/task.lock"));
        for bad in ["refs/heads/junk", "refs/heads/link", "refs/heads/fifo"] {
            assert!(
                matches!(found[bad], Wanted::Unreadable(_)),
                "{bad}: {:?}",
                found[bad]
            );
        }
    }
}
