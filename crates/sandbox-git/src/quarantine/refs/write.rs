//! Applying a ref on the host: the compare-and-swap under git's ref lock, and the reflog.

use std::path::Path;

use git2::{Oid, Repository};

use super::untrusted::read_untrusted;

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
