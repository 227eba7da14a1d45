//! The run's private home, on the host: where it lives, the toolchains and caches found on
//! this machine (probed here, decided by [`sandbox_policy::toolchains`]), the grants they
//! become, and the disk they take.
//!
//! ```text
//! $XDG_STATE_HOME/sandbox/homes/<key>/          the private home (HOME inside)
//! $XDG_STATE_HOME/sandbox/caches/<key>/<cache>/ {upper,work} of each cache's overlay
//! ```
//!
//! `<key>` names the project (the repository's common dir; `home: per-task`: the worktree).
//! Both trees are the host's: a run writes the home and, through its overlays, the cache
//! layers, never the user's own caches or toolchains (read-only, at their real paths).

#[cfg(target_os = "linux")]
pub(crate) mod caches;

use std::io::Write as _;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};

use sandbox_policy::secrets::{self, ListedEntry};
use sandbox_policy::toolchains::{self, HostSnapshot, Selection};
use sandbox_policy::{CacheLayer, Grant, GrantReason, HomePolicy, Masked, Policy, Toolchain};

use crate::error::HostError;

/// The private home's settings, from the trusted configuration and the flags.
#[derive(Debug, Clone)]
pub struct HomeSettings {
    /// `$XDG_STATE_HOME/sandbox`.
    pub state_dir: PathBuf,
    /// `home: per-task` (else per project).
    pub per_task: bool,
    /// `toolchains:` in the configuration.
    pub toolchains: Selection,
    /// `--toolchain NAME`.
    pub add_toolchains: Vec<String>,
    /// `--no-toolchains`: none but those named with `--toolchain`.
    pub no_toolchains: bool,
    /// Layer the package caches (`caches: false` turns it off).
    pub caches: bool,
    /// The bound of all cache layers of one project, in bytes, checked at the start.
    pub cache_cap_bytes: Option<u64>,
}

/// The bound of a project's cache layers when the configuration names none: 10 GiB.
pub const DEFAULT_CACHE_CAP_BYTES: u64 = 10 << 30;

/// A run's hold on its project's private home, from [`attach`] to the run's end.
///
/// Every run of the project holds the home's users lock shared while it lives; `sandbox home
/// reset` takes it exclusively, and so does the run that ends last, to remove the mount points
/// its view needed in the home (an empty `~/.cargo/bin` or `~/.rustup` would otherwise stay,
/// and tools take such a directory for an installed toolchain). The cache layers are claimed
/// per command instead ([`crate::assembly::home::caches`]).
#[derive(Debug, Default)]
pub struct HomeGuard {
    users: Option<std::fs::File>,
    /// The lock runs take while they prepare the home.
    preparing: PathBuf,
    dir: PathBuf,
    /// The mount points [`prepare_mount_points`] ensured, relative to `dir`, parents first.
    mount_points: Vec<PathBuf>,
}

impl Drop for HomeGuard {
    fn drop(&mut self) {
        let Some(users) = self.users.take() else {
            return;
        };
        // No run prepares the home meanwhile (it would need the mount points again).
        let Ok(_preparing) = flock(&self.preparing, libc::LOCK_EX) else {
            return;
        };
        // The last run of the project removes them; another one still needs them.
        // SAFETY: flock(2) on the descriptor `users` owns; the lock goes with it.
        if unsafe { libc::flock(users.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return;
        }
        remove_mount_points(&self.dir, &self.mount_points);
    }
}

/// Removes the mount points `rel` (parents first) under `dir` that are still empty, children
/// first, through descriptors: a run could have put a link in their place.
fn remove_mount_points(dir: &Path, rel: &[PathBuf]) {
    use crate::beneath::{Dir, Kind};
    let Ok(home) = Dir::open(dir) else {
        return;
    };
    for path in rel.iter().rev() {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            continue;
        };
        let Ok(at) = home.walk(parent) else {
            continue;
        };
        // Only what is as the preparation left it: an empty directory or an empty file.
        let removed = match at.kind(name) {
            Ok(Some(Kind::Dir)) => at.rmdir(name),
            Ok(Some(Kind::File { empty: true })) => at.unlink(name),
            _ => continue,
        };
        if let Err(e) = removed {
            tracing::trace!(path = %path.display(), error = %e, "mount point kept");
        }
    }
}

/// Takes the users lock of the private home `dir` exclusively, without waiting: an error
/// while a run of its project lives (`sandbox home reset`).
pub fn idle(dir: &Path) -> Result<std::fs::File, std::io::Error> {
    flock(&users_lock(dir), libc::LOCK_EX | libc::LOCK_NB)
}

/// `homes/.<key>.users` beside the home `homes/<key>`.
fn users_lock(dir: &Path) -> PathBuf {
    side_file(dir, "users")
}

/// `homes/.<key>.<what>` beside the home `homes/<key>`: the host's, out of the run's reach.
fn side_file(dir: &Path, what: &str) -> PathBuf {
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    dir.with_file_name(format!(".{name}.{what}"))
}

/// `<name>-<hash of the path>`: a stable, readable key for a project or task directory.
pub fn key_of(dir: &Path) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(dir.as_os_str().as_encoded_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    let name: String = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    let name = name.trim_start_matches(['.', '_']);
    if name.is_empty() {
        hex
    } else {
        format!("{name}-{hex}")
    }
}

/// The directory a project (or task) is keyed on: the main worktree of a repository (its
/// common dir's parent, so every linked worktree of it shares one home), else the workspace.
pub fn project_dir(policy: &Policy, per_task: bool) -> PathBuf {
    match &policy.workspace.git {
        Some(git) if !per_task => git
            .common_dir
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| git.common_dir.clone()),
        _ => policy.workspace.root.clone(),
    }
}

/// Where the private homes and the cache layers of `state_dir` are.
pub fn homes_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("homes")
}

pub fn caches_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("caches")
}

/// The real home, as `$HOME` names it (absolute, not `/`).
pub fn real_home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute() && h != Path::new("/"))
}

/// The snapshot of this host that detection reads: the user's environment and filesystem.
pub fn detect_here(home: &Path, system: &[PathBuf]) -> Vec<toolchains::Detected> {
    with_snapshot(home, system, toolchains::detect)
}

fn with_snapshot<T>(home: &Path, system: &[PathBuf], f: impl FnOnce(&HostSnapshot<'_>) -> T) -> T {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let is_dir = |p: &Path| p.is_dir();
    let exists = |p: &Path| p.symlink_metadata().is_ok();
    let host = HostSnapshot {
        home: home.to_path_buf(),
        path: std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect())
            .unwrap_or_default(),
        var: &var,
        is_dir: &is_dir,
        exists: &exists,
        system: system.to_vec(),
    };
    f(&host)
}

/// A directory listing for [`secrets::secrets_under`]: links are never followed.
fn list(dir: &Path) -> Option<Vec<ListedEntry>> {
    let entries = std::fs::read_dir(dir).ok()?;
    Some(
        entries
            .filter_map(Result::ok)
            .map(|e| ListedEntry {
                name: e.file_name(),
                is_dir: e.file_type().is_ok_and(|t| t.is_dir()),
            })
            .collect(),
    )
}

/// The credential files and directories at or under `dir`, at most `depth` levels down, on
/// this machine's filesystem (links are not followed): [`secrets::secrets_under`] with the
/// real listing, judged relative to `home` where `dir` lies in it (so `~/.ssh` counts). Paths
/// come back absolute. For the toolchains' trees and warnings about grants that expose them.
pub fn scan_secrets(home: &Path, dir: &Path, depth: usize) -> Vec<secrets::SecretHit> {
    match dir.strip_prefix(home) {
        Ok(rel) => secrets::secrets_under(rel, depth, |d| list(&home.join(d)))
            .into_iter()
            .map(|hit| secrets::SecretHit {
                path: home.join(&hit.path),
                kind: hit.kind,
            })
            .collect(),
        Err(_) => secrets::secrets_under(dir, depth, list),
    }
}

/// How deep a toolchain's tree is searched for credential files on every run: its top two
/// levels (a run pays for each directory listed). Deeper known places are named in
/// [`DEEP_SECRETS`].
const SECRET_DEPTH: usize = 2;

/// Where layouts keep a credential file deeper down: `(parent of the versions, file)`, the
/// versions listed once each (nvm keeps a global `npmrc` at `versions/node/<v>/etc/npmrc`).
const DEEP_SECRETS: &[(&str, &str)] = &[("versions/node", "etc/npmrc")];

/// The grants of one toolchain tree with its credential files left out: the tree itself when
/// it holds none, else its entries one level down, recursively, except the secrets.
fn tree_grants(tree: &Path, home: &Path, masked: &mut Vec<Masked>) -> Vec<PathBuf> {
    if !tree.is_dir() {
        return vec![tree.to_path_buf()];
    }
    // rustup's tree is large and holds no credentials; walking it on every run would cost
    // more than the rest of the start-up.
    if tree.join("toolchains").is_dir() && tree.join("settings.toml").exists() {
        return vec![tree.to_path_buf()];
    }
    let mut hits = scan_secrets(home, tree, SECRET_DEPTH);
    for (versions, file) in DEEP_SECRETS {
        for version in list(&tree.join(versions)).unwrap_or_default() {
            let path = tree.join(versions).join(&version.name).join(file);
            if let Some(kind) = secrets::is_secret(&path) {
                if path.symlink_metadata().is_ok() {
                    hits.push(secrets::SecretHit { path, kind });
                }
            }
        }
    }
    if hits.is_empty() {
        return vec![tree.to_path_buf()];
    }
    for hit in &hits {
        if !masked.iter().any(|m| m.path == hit.path) {
            masked.push(Masked {
                path: hit.path.clone(),
                dir: hit.path.is_dir(),
                what: hit.kind.what.to_string(),
            });
        }
    }
    let mut out = Vec::new();
    split(
        tree,
        &hits.iter().map(|h| h.path.clone()).collect::<Vec<_>>(),
        &mut out,
    );
    out
}

/// `dir`'s entries as grants, descending into those that hold a secret, leaving the secrets.
fn split(dir: &Path, secrets: &[PathBuf], out: &mut Vec<PathBuf>) {
    let Some(entries) = list(dir) else {
        return;
    };
    for e in entries {
        let path = dir.join(&e.name);
        if secrets.contains(&path) {
            continue;
        }
        if e.is_dir && secrets.iter().any(|s| s.starts_with(&path)) {
            split(&path, secrets, out);
        } else {
            out.push(path);
        }
    }
}

/// Gives `policy` its private home: creates the directories, adds the home (writable) and
/// the enabled toolchains (read-only) as grants, the cache layers, and `HOME` and the XDG
/// base directories pointing into it. `Ok(None)` with a reason when the run keeps the real
/// `HOME` (no home to point at, or the workspace holds the home).
pub fn attach(
    policy: &mut Policy,
    settings: &HomeSettings,
) -> Result<(HomeGuard, Option<String>), HostError> {
    let Some(home) = real_home() else {
        return Ok((
            HomeGuard::default(),
            Some("HOME is unset or /: no private home".into()),
        ));
    };
    if home.starts_with(&policy.workspace.root) {
        return Ok((
            HomeGuard::default(),
            Some(format!(
                "the workspace {} holds the home {}: no private home",
                policy.workspace.root.display(),
                home.display()
            )),
        ));
    }
    let fail = |path: &Path, cause: String| HostError::Home {
        path: path.to_path_buf(),
        cause,
    };
    let key = key_of(&project_dir(policy, settings.per_task));
    let homes = crate::privdir::ensure("native", &homes_dir(&settings.state_dir))?;
    let dir = homes.join(&key);
    // Runs of one project (two boxes created at once, say) prepare its home one at a time:
    // each finds the home whole, never one another run is still making.
    let preparing = homes.join(format!(".{key}.lock"));
    let _preparing = flock(&preparing, libc::LOCK_EX)
        .map_err(|e| fail(&dir, format!("locking the private home: {e}")))?;
    if !dir.is_dir() {
        create_home(&homes, &dir)
            .map_err(|e| fail(&dir, format!("creating the private home: {e}")))?;
    } else if let Err(e) = upgrade_profile(&dir) {
        tracing::debug!(error = %e, "the private home's .profile was left as it was");
    }
    let dir = std::fs::canonicalize(&dir).map_err(|e| fail(&dir, e.to_string()))?;

    // Toolchains: detected, selected, their trees without credential files.
    let mut masked = Vec::new();
    let mut chains = Vec::new();
    for found in detect_here(&home, &policy.fs.system_read) {
        let enabled = if settings.no_toolchains {
            settings.add_toolchains.contains(&found.name)
        } else {
            settings
                .toolchains
                .enables(&found.name, &settings.add_toolchains)
        };
        let mut paths = Vec::new();
        if enabled {
            for tree in &found.paths {
                paths.extend(tree_grants(tree, &home, &mut masked));
            }
            for var in &found.pass {
                policy.env.pass.push(var.clone());
            }
        } else {
            paths = found.paths.clone();
        }
        chains.push(Toolchain {
            name: found.name,
            kind: found.kind,
            paths,
            enabled,
        });
    }
    for unknown in &settings.add_toolchains {
        if !chains.iter().any(|c| &c.name == unknown) {
            return Err(fail(
                &home,
                format!(
                    "--toolchain {unknown}: no such toolchain on this machine (found: {}); \
                     `sandbox home` lists them",
                    chains
                        .iter()
                        .map(|c| c.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    for chain in chains.iter().filter(|c| c.enabled) {
        for path in &chain.paths {
            // A toolchain inside the workspace or another grant is visible already.
            if policy.readable_paths().any(|p| path.starts_with(p)) {
                continue;
            }
            policy.fs.read.push(Grant {
                path: path.clone(),
                reason: GrantReason::Toolchain,
            });
        }
    }

    // Caches: an overlay each, over the user's cache, with the project's private layer
    // (claimed by each command: `crate::assembly::home::caches`).
    let mut caches = Vec::new();
    if settings.caches {
        let found = with_snapshot(&home, &policy.fs.system_read, toolchains::detect_caches);
        if !found.is_empty() {
            let root = crate::privdir::ensure("native", &caches_dir(&settings.state_dir))?;
            let layers = crate::privdir::ensure("native", &root.join(&key))?;
            for cache in found {
                let at = layers.join(cache.name);
                let (upper, work) = (at.join("upper"), at.join("work"));
                for d in [&upper, &work] {
                    std::fs::create_dir_all(d).map_err(|e| fail(d, e.to_string()))?;
                }
                caches.push(CacheLayer {
                    name: cache.name.to_string(),
                    path: cache.path.clone(),
                    lower: cache.path,
                    upper,
                    work,
                });
            }
        }
    }

    let home_policy = HomePolicy {
        path: home.clone(),
        dir: dir.clone(),
        scope: if settings.per_task {
            "per-task"
        } else {
            "per-project"
        }
        .into(),
        toolchains: chains,
        caches,
        masked,
        cache_cap_bytes: settings.cache_cap_bytes,
    };
    policy.fs.write.push(Grant {
        path: dir.clone(),
        reason: GrantReason::Home,
    });
    for (name, value) in home_policy.env(&home) {
        policy.env.set_var(name, value.to_string_lossy());
    }
    policy.fs.home = Some(home_policy);
    place_copies(policy, &home, &dir).map_err(|(path, e)| fail(&path, e))?;
    let mount_points = prepare_mount_points(policy).map_err(|(path, e)| fail(&path, e))?;
    let users = flock(&users_lock(&dir), libc::LOCK_SH)
        .map_err(|e| fail(&dir, format!("locking the private home: {e}")))?;
    Ok((
        HomeGuard {
            users: Some(users),
            preparing,
            dir,
            mount_points,
        },
        None,
    ))
}

/// Takes the lock of a project's cache layers (`dir`), without waiting: an error while a
/// command holds them.
pub fn lock(dir: &Path) -> Result<std::fs::File, std::io::Error> {
    flock(&dir.join("lock"), libc::LOCK_EX | libc::LOCK_NB)
}

/// Opens (creating) the lock file `path` and takes `flock(2)` with `how`; held until the file
/// is closed.
fn flock(path: &Path, how: libc::c_int) -> Result<std::fs::File, std::io::Error> {
    use std::os::fd::AsRawFd as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)?;
    // SAFETY: flock(2) on the descriptor we just opened; released when it is closed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), how) };
    if rc == 0 {
        Ok(file)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Makes a new private home at `dir` whole or not at all: built beside it, then renamed into
/// place, so a crash mid-way leaves no home without its shell rc.
fn create_home(homes: &Path, dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    let staging = homes.join(format!(".new-{name}"));
    remove_any(&staging)?;
    std::fs::DirBuilder::new().mode(0o700).create(&staging)?;
    write_shell_rc(&staging)?;
    std::fs::rename(&staging, dir)
}

/// An agent profile's private copies of files in the home (`~/.gemini/projects.json`) are put
/// in the private home itself, fresh from the host's each run, not bound over their path: an
/// agent replaces such a file by renaming a new one over it, or deletes and re-creates it,
/// which a mount point refuses (`EBUSY`). The host never reads them back. Written through
/// descriptors (a run may have left a link in the way); each copy then names its place.
///
/// A copy holds the host's data (an MCP server's command line and environment), so it lasts
/// only as long as runs that were given it: the ones an earlier run placed, listed beside the
/// home (`homes/.<key>.copies`, outside the run's reach), are removed when this run is not
/// given them (`--agent none`, another agent). A run of the same project still using one at
/// that moment finds it gone, as a new agent home would be.
fn place_copies(policy: &mut Policy, home: &Path, dir: &Path) -> Result<(), (PathBuf, String)> {
    let manifest = side_file(dir, "copies");
    let before: Vec<PathBuf> = std::fs::read_to_string(&manifest)
        .map(|text| text.lines().map(PathBuf::from).collect())
        .unwrap_or_default();
    let mut placed_rel: Vec<PathBuf> = Vec::new();
    let mut private = None;
    for copy in &mut policy.fs.copies {
        let Ok(rel) = copy.path.strip_prefix(home) else {
            continue;
        };
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
            continue;
        };
        let placed = dir.join(rel);
        let err = |e: std::io::Error| (placed.clone(), format!("placing a private copy: {e}"));
        let bytes = std::fs::read(&copy.copy).map_err(err)?;
        if private.is_none() {
            private = Some(crate::beneath::Dir::open(dir).map_err(err)?);
        }
        let Some(root) = &private else {
            continue;
        };
        root.make_dirs(parent)
            .and_then(|at| at.replace_file(name, &bytes))
            .map_err(err)?;
        copy.copy = placed;
        placed_rel.push(rel.to_path_buf());
    }
    let stale: Vec<&PathBuf> = before
        .iter()
        .filter(|rel| !placed_rel.contains(rel))
        .collect();
    if !stale.is_empty() {
        let root =
            crate::beneath::Dir::open(dir).map_err(|e| (dir.to_path_buf(), e.to_string()))?;
        for rel in stale {
            let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
                continue;
            };
            // Only a file: whatever else the run left there is its own.
            if let Ok(at) = root.walk(parent) {
                if matches!(at.kind(name), Ok(Some(crate::beneath::Kind::File { .. }))) {
                    let _ = at.unlink(name);
                }
            }
        }
    }
    if placed_rel != before {
        let text: String = placed_rel
            .iter()
            .map(|rel| format!("{}\n", rel.display()))
            .collect();
        let homes = dir.parent().unwrap_or(dir);
        let written = tempfile::NamedTempFile::new_in(homes)
            .and_then(|mut f| f.write_all(text.as_bytes()).map(|()| f))
            .and_then(|f| f.persist(&manifest).map_err(|e| e.error));
        written.map_err(|e| {
            (
                manifest.clone(),
                format!("recording the private copies: {e}"),
            )
        })?;
    }
    Ok(())
}

/// Everything the view mounts inside the real home's path needs a mount point in the private
/// home (which is bound from the host, not built on a tmpfs): each made here, as a real
/// directory or file — a link the run left in its way is removed, so a mount cannot be
/// redirected elsewhere in the view. A toolchain's link (`~/.nix-profile`) is recreated.
/// Returns the mount points, relative to the home, parents first (links not among them).
fn prepare_mount_points(policy: &Policy) -> Result<Vec<PathBuf>, (PathBuf, String)> {
    let mut made: Vec<PathBuf> = Vec::new();
    let Some(home) = &policy.fs.home else {
        return Ok(made);
    };
    let mut targets: Vec<(PathBuf, Option<PathBuf>)> = Vec::new();
    for grant in policy.fs.read.iter().chain(policy.fs.write.iter()) {
        if grant.reason == GrantReason::Home {
            continue;
        }
        targets.push((grant.path.clone(), None));
    }
    targets.extend(home.caches.iter().map(|c| (c.path.clone(), None)));
    targets.extend(policy.fs.devices.iter().map(|d| (d.clone(), None)));
    for (target, _) in targets {
        let Ok(rel) = target.strip_prefix(&home.path) else {
            continue;
        };
        if rel.as_os_str().is_empty() {
            continue;
        }
        let source = std::fs::symlink_metadata(&target);
        let link = match &source {
            Ok(m) if m.file_type().is_symlink() => std::fs::read_link(&target).ok(),
            _ => None,
        };
        let is_dir = target.is_dir();
        let mut at = home.dir.clone();
        let comps: Vec<_> = rel.components().collect();
        for (i, c) in comps.iter().enumerate() {
            at.push(c);
            let last = i + 1 == comps.len();
            let meta = std::fs::symlink_metadata(&at);
            if last {
                if let Some(link) = &link {
                    if std::fs::read_link(&at).ok().as_ref() != Some(link) {
                        remove_any(&at).map_err(|e| (at.clone(), e.to_string()))?;
                        std::os::unix::fs::symlink(link, &at)
                            .map_err(|e| (at.clone(), e.to_string()))?;
                    }
                    break;
                }
            }
            let want_dir = !last || is_dir;
            let relative = at.strip_prefix(&home.dir).unwrap_or(&at).to_path_buf();
            if !made.contains(&relative) {
                made.push(relative);
            }
            let ok = match &meta {
                Ok(m) => !m.file_type().is_symlink() && m.is_dir() == want_dir,
                Err(_) => false,
            };
            if ok {
                continue;
            }
            if meta.is_ok() {
                remove_any(&at).map_err(|e| (at.clone(), e.to_string()))?;
            }
            if want_dir {
                std::fs::create_dir(&at).map_err(|e| (at.clone(), e.to_string()))?;
            } else {
                std::fs::File::create(&at).map_err(|e| (at.clone(), e.to_string()))?;
            }
        }
    }
    Ok(made)
}

fn remove_any(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(_) => Ok(()),
    }
}

/// The minimal shell rc of a new private home: no host rc file is read inside.
pub const SHELL_RC: &str = "\
# The private home of a sandbox (`sandbox home`): none of your own rc files is read here.
# Edit this file to add what you need; `sandbox home reset` starts over.
PS1='[sandbox] \\w \\$ '
";

/// The variable that carries the run's `PATH` to a login shell's profile.
pub const RUN_PATH: &str = "SANDBOX_PATH";

/// The private home's `.profile` (and `.zprofile`): the shell rc, and the run's `PATH` back
/// after the system's profile reset it (Debian's /etc/profile sets a fixed one), so a login
/// shell finds the toolchains the run has (`bash -lc 'cargo test'`, as Codex runs commands).
pub const PROFILE: &str = "\
# The private home of a sandbox (`sandbox home`): none of your own rc files is read here.
# Edit this file to add what you need; `sandbox home reset` starts over.
PS1='[sandbox] \\w \\$ '
# The run's PATH (its toolchains), which the system's profile resets for a login shell.
if [ -n \"${SANDBOX_PATH-}\" ]; then PATH=$SANDBOX_PATH; export PATH; fi
";

fn write_shell_rc(dir: &Path) -> std::io::Result<()> {
    for (name, text) in [
        (".bashrc", SHELL_RC),
        (".profile", PROFILE),
        (".zprofile", PROFILE),
    ] {
        let mut f = std::fs::File::create(dir.join(name))?;
        f.write_all(text.as_bytes())?;
    }
    Ok(())
}

/// A home made before login shells got the run's `PATH` has the shell rc as its `.profile`:
/// that one (untouched since) becomes [`PROFILE`]. One the user edited stays as it is. Never
/// through a link the run left in its place (read `O_NOFOLLOW`, replaced by a rename).
fn upgrade_profile(dir: &Path) -> std::io::Result<()> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = dir.join(".profile");
    let mut old = Vec::new();
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
    {
        Ok(f) => f.take(SHELL_RC.len() as u64 + 1).read_to_end(&mut old)?,
        Err(_) => return Ok(()),
    };
    if old != SHELL_RC.as_bytes() {
        return Ok(());
    }
    let mut new = tempfile::NamedTempFile::new_in(dir)?;
    new.write_all(PROFILE.as_bytes())?;
    new.persist(&path).map_err(|e| e.error)?;
    Ok(())
}

/// The disk a directory takes, in bytes (allocated blocks; links not followed, each inode
/// once).
pub fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.filter_map(Result::ok) {
            let Ok(m) = e.metadata() else { continue };
            if seen.insert((m.dev(), m.ino())) {
                total += m.blocks() * 512;
            }
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    total
}

/// `1.2 GiB`, `340 KiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: &[&str] = &["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Checks the project's cache layers against the bound: an error (exit 125) names the size,
/// the bound and what to do.
pub fn check_cap(home: &HomePolicy) -> Result<(), HostError> {
    let Some(cap) = home.cache_cap_bytes else {
        return Ok(());
    };
    let Some(first) = home.caches.first() else {
        return Ok(());
    };
    let Some(layers) = first.upper.parent().and_then(Path::parent) else {
        return Ok(());
    };
    let used: u64 = home.caches.iter().map(|c| disk_usage(&c.upper)).sum();
    if used > cap {
        return Err(HostError::Home {
            path: layers.to_path_buf(),
            cause: format!(
                "the cache layers take {} (bound: {}). Nothing was run. Free them with \
                 `sandbox home reset --caches`, or raise `home_cache_size_mib` in the \
                 configuration",
                human_bytes(used),
                human_bytes(cap)
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_readable_and_distinct() {
        let a = key_of(Path::new("/work/proj"));
        assert_eq!(a, key_of(Path::new("/work/proj")));
        assert!(a.starts_with("proj-"), "{a}");
        assert_ne!(a, key_of(Path::new("/other/proj")));
        assert!(!key_of(Path::new("/x/.hidden dir")).contains([' ', '/', '.']));
    }

    #[test]
    fn a_tree_with_a_credential_file_is_granted_without_it() {
        let dir = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(dir.path()).unwrap();
        let nvm = home.join(".nvm");
        let etc = nvm.join("versions/node/v20/etc");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::create_dir_all(nvm.join("versions/node/v20/bin")).unwrap();
        std::fs::write(etc.join("npmrc"), "//registry.npmjs.org/:_authToken=secret").unwrap();
        std::fs::write(etc.join("other"), "").unwrap();
        std::fs::write(nvm.join("nvm.sh"), "").unwrap();
        let mut masked = Vec::new();
        let mut grants = tree_grants(&nvm, &home, &mut masked);
        grants.sort();
        assert_eq!(
            grants,
            vec![
                nvm.join("nvm.sh"),
                nvm.join("versions/node/v20/bin"),
                etc.join("other"),
            ]
        );
        assert_eq!(masked.len(), 1);
        assert_eq!(masked[0].path, etc.join("npmrc"));
        // No secret: the tree itself.
        std::fs::remove_file(etc.join("npmrc")).unwrap();
        let mut masked = Vec::new();
        assert_eq!(tree_grants(&nvm, &home, &mut masked), vec![nvm.clone()]);
        assert!(masked.is_empty());
    }

    #[test]
    fn a_scan_of_the_home_finds_home_anchored_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(home.join(".ssh")).unwrap();
        std::fs::write(home.join(".ssh/id_ed25519"), "key").unwrap();
        std::fs::create_dir_all(home.join("proj")).unwrap();
        std::fs::write(home.join("proj/.npmrc"), "token").unwrap();
        let hits: Vec<(PathBuf, &str)> = scan_secrets(&home, &home, 3)
            .into_iter()
            .map(|h| (h.path, h.kind.id))
            .collect();
        assert_eq!(
            hits,
            vec![
                (home.join(".ssh"), "ssh"),
                (home.join("proj/.npmrc"), "npmrc")
            ]
        );
        // Outside the home only the tails count.
        assert_eq!(scan_secrets(&home.join("proj"), &home, 3).len(), 1);
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(2048), "2.0 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}
