//! Where a program that decides the boundary may live: never where the sandbox can write.
//!
//! A custom launcher, or the `nono` binary, that a sandboxed agent can edit (or re-point
//! through a symlink) is one it can turn off for the next spawn. So the program's path is
//! resolved the way the kernel resolves it — every symlink followed, `..` applied to the
//! resolved directory — and every place on the way that decides what runs (the path itself,
//! each symlink that was followed, the final file) must be outside the task worktree, the
//! spawn directory and every path the policy makes writable.

use std::path::{Component, Path, PathBuf};

use sandbox_policy::Policy;

/// Why a program's location was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The place on the resolution chain that is writable from inside.
    pub place: PathBuf,
    /// "inside the task worktree /w/task", …
    pub why: String,
}

/// The result of resolving a path: the final file and every symlink passed on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub target: PathBuf,
    /// Where each symlink that was followed lives (itself resolved).
    pub links: Vec<PathBuf>,
}

/// Resolves an absolute `path` on the real filesystem, recording every symlink followed.
/// Fails if a component is missing, unreadable, or a symlink loop.
pub fn resolve_chain(path: &Path) -> std::io::Result<Chain> {
    if !path.is_absolute() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not an absolute path",
        ));
    }
    let resolution = sandbox_exec::policy::resolve_path(Path::new("/"), path)?;
    if resolution.missing {
        return Err(std::io::Error::from(std::io::ErrorKind::NotFound));
    }
    Ok(Chain {
        target: resolution.path,
        links: resolution.links,
    })
}

/// Canonical form of a policy path for comparisons (policy paths are already canonical; a
/// spawn directory given by a caller may not be).
fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Checks one place against the writable areas. The spawn directory is named first when it
/// is narrower than the worktree, so the message names the most specific reason.
fn judge(place: &Path, policy: &Policy, spawn_dir: &Path) -> Option<Refusal> {
    let root = &policy.workspace.root;
    let spawn = canonical(spawn_dir);
    let refusal = |why: String| Refusal {
        place: place.to_path_buf(),
        why,
    };
    if place.starts_with(&spawn) && spawn != *root {
        return Some(refusal(format!(
            "inside the spawn directory {}",
            spawn.display()
        )));
    }
    if place.starts_with(root) {
        return Some(refusal(format!(
            "inside the task worktree {}",
            root.display()
        )));
    }
    if place.starts_with(&spawn) {
        return Some(refusal(format!(
            "inside the spawn directory {}",
            spawn.display()
        )));
    }
    for grant in &policy.fs.write {
        if place.starts_with(&grant.path) {
            return Some(refusal(format!(
                "inside {}, which the sandbox may write ({})",
                grant.path.display(),
                grant.reason.as_str()
            )));
        }
    }
    None
}

/// Resolves `path` (absolute) and refuses it if the path, a symlink on the way, or the file
/// it ends at is somewhere the sandbox could write. Returns the final file.
pub fn check(path: &Path, policy: &Policy, spawn_dir: &Path) -> Result<PathBuf, PlacementError> {
    // The path as written first (before symlinks): `<worktree>/bin/tool` is refused even if
    // it is a symlink to somewhere safe, since the agent can re-point it.
    let lexical = lexical_parent_resolved(path);
    if let Some(r) = judge(&lexical, policy, spawn_dir) {
        return Err(PlacementError::Refused(r));
    }
    let chain = resolve_chain(path).map_err(|e| PlacementError::Unresolvable {
        path: path.to_path_buf(),
        cause: e.to_string(),
    })?;
    for place in chain.links.iter().chain(std::iter::once(&chain.target)) {
        if let Some(r) = judge(place, policy, spawn_dir) {
            return Err(PlacementError::Refused(r));
        }
    }
    Ok(chain.target)
}

/// `path` with `.` and `..` applied textually (no symlinks followed): the place a user
/// reading the configuration would think of.
fn lexical_parent_resolved(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlacementError {
    Refused(Refusal),
    Unresolvable { path: PathBuf, cause: String },
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn policy(root: &Path, writable: &Path) -> Policy {
        let mut p = sandbox_policy::build(sandbox_policy::PolicyRequest {
            workdir: root.to_path_buf(),
            allow_write: vec![(writable.to_path_buf(), sandbox_policy::GrantReason::User)],
            ..Default::default()
        })
        .unwrap();
        p.workspace.cwd = root.to_path_buf();
        p
    }

    struct Fix {
        _dir: tempfile::TempDir,
        root: PathBuf,
        grant: PathBuf,
        safe: PathBuf,
    }

    fn fix() -> Fix {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let root = base.join("task");
        let grant = base.join("cache");
        let safe = base.join("bin");
        for d in [&root, &grant, &safe, &root.join("sub")] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(safe.join("tool"), "#!/bin/sh\n").unwrap();
        Fix {
            _dir: dir,
            root,
            grant,
            safe,
        }
    }

    fn refused(r: Result<PathBuf, PlacementError>) -> String {
        match r {
            Err(PlacementError::Refused(r)) => r.why,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn outside_is_accepted_and_resolved() {
        let f = fix();
        let p = policy(&f.root, &f.grant);
        let link = f.safe.join("alias");
        symlink(f.safe.join("tool"), &link).unwrap();
        assert_eq!(check(&link, &p, &f.root).unwrap(), f.safe.join("tool"));
    }

    #[test]
    fn worktree_spawn_dir_and_grants_are_refused() {
        let f = fix();
        let p = policy(&f.root, &f.grant);
        std::fs::write(f.root.join("tool"), "x").unwrap();
        std::fs::write(f.root.join("sub/tool"), "x").unwrap();
        std::fs::write(f.grant.join("tool"), "x").unwrap();
        assert!(refused(check(&f.root.join("tool"), &p, &f.root)).contains("worktree"));
        assert!(
            refused(check(&f.root.join("sub/tool"), &p, &f.root.join("sub")))
                .contains("spawn directory")
        );
        assert!(refused(check(&f.grant.join("tool"), &p, &f.root)).contains("may write"));
    }

    #[test]
    fn symlinks_into_or_through_writable_places_are_refused() {
        let f = fix();
        let p = policy(&f.root, &f.grant);
        std::fs::write(f.root.join("real"), "x").unwrap();
        // Outside → inside.
        let out_in = f.safe.join("to-worktree");
        symlink(f.root.join("real"), &out_in).unwrap();
        assert!(refused(check(&out_in, &p, &f.root)).contains("worktree"));
        // Outside → a link inside the grant → outside again: the middle link can be re-pointed.
        let middle = f.grant.join("hop");
        symlink(f.safe.join("tool"), &middle).unwrap();
        let first = f.safe.join("via-grant");
        symlink(&middle, &first).unwrap();
        assert!(refused(check(&first, &p, &f.root)).contains("may write"));
        // Inside → outside: the link itself lives in the worktree.
        let in_out = f.root.join("launcher");
        symlink(f.safe.join("tool"), &in_out).unwrap();
        assert!(refused(check(&in_out, &p, &f.root)).contains("worktree"));
        // Dot-dot out of the safe dir into the worktree.
        let dotdot = f.safe.join("../task/real");
        assert!(refused(check(&dotdot, &p, &f.root)).contains("worktree"));
    }

    #[test]
    fn missing_and_looping_paths_are_errors() {
        let f = fix();
        let p = policy(&f.root, &f.grant);
        assert!(matches!(
            check(&f.safe.join("nope"), &p, &f.root),
            Err(PlacementError::Unresolvable { .. })
        ));
        symlink(f.safe.join("b"), f.safe.join("a")).unwrap();
        symlink(f.safe.join("a"), f.safe.join("b")).unwrap();
        assert!(matches!(
            check(&f.safe.join("a"), &p, &f.root),
            Err(PlacementError::Unresolvable { .. })
        ));
    }
}
