//! The run's private home, on the host: where it lives, the toolchains and caches found on
//! this machine (probed here, decided by [`sandbox_policy::toolchains`]), the grants they
//! become, and the disk they take.
//!
//! ```text
//! $XDG_STATE_HOME/sandbox/homes/<key>/          the private home (HOME inside)
//! $XDG_STATE_HOME/sandbox/caches/<key>/<cache>/ {upper,work} of each cache's overlay
//! ```
//!
//! `<key>` names the task (the worktree, [`home_key`]; `home: per-project`: the repository,
//! shared by its worktrees). Both trees are the host's: a run writes the home and, through its
//! overlays, the cache layers, never the user's own caches or toolchains (read-only, at their
//! real paths).
//!
//! Per task by default because both trees hold code later runs execute: rc files, Python
//! `.pth` files, `~/.npmrc`'s `node-options`, agents' shell snapshots, extracted crate sources
//! with build scripts. Shared between tasks, one task's run (narrow grants) could leave code
//! that another task's run (a credential, the network, another worktree) runs. Runs of one
//! task share its worktree anyway, which holds such code too (a `.venv`, `package.json`).

#[cfg(target_os = "linux")]
pub(crate) mod caches;

use std::io::Write as _;
use std::path::{Path, PathBuf};

use sandbox_policy::secrets::{self, ListedEntry};
use sandbox_policy::toolchains::{self, HostSnapshot, Selection};
use sandbox_policy::{CacheLayer, Grant, GrantReason, HomePolicy, Masked, Policy, Toolchain};

use crate::error::HostError;

mod usage;
pub use usage::{disk_usage, human_bytes};

pub mod bound;
pub use bound::check_cap;

mod rc;
use rc::{upgrade_profile, write_shell_rc};
pub use rc::{PROFILE, RUN_PATH, SHELL_RC};

mod places;
use places::{keep_mount_points, place_copies, prepare_mount_points};

mod scan;

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

/// The name prefix of a command's throwaway cache layers ([`caches`]), which the bound
/// ([`bound`]) does not count: they go when their command ends.
const THROWAWAY_LAYERS: &str = "busy-";

/// The bound of a project's cache layers when the configuration names none: 10 GiB.
pub const DEFAULT_CACHE_CAP_BYTES: u64 = 10 << 30;

/// A run's hold on its project's private home, from [`attach`] to the run's end.
///
/// Every run of the project holds the home's users lock shared while it lives; `sandbox home
/// reset` takes it exclusively. The mount points the view needs in the home stay between
/// runs (made again and removed on every run, they were a dozen directory operations on the
/// disk per command): each run records them beside the home, and one that needs fewer
/// removes the others when no other run of the project lives (an empty `~/.cargo/bin` or
/// `~/.rustup` a run does not mount would otherwise show, and tools take such a directory
/// for an installed toolchain). The cache layers are claimed per command instead
/// ([`crate::assembly::home::caches`]).
#[derive(Debug, Default)]
pub struct HomeGuard {
    /// Held until the run ends (the lock goes with the descriptor).
    _users: Option<std::fs::File>,
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

/// The key of the private home and the cache layers of a run of `policy`: the worktree's
/// ([`key_of`] its directory) when `per_task`, else the project's. A main worktree's own home
/// gets a `-task` suffix, so that it is never the directory the project's shared home
/// (`home: per-project`, keyed on that same directory) was or is: a task starts from nothing
/// other tasks' runs left.
pub fn home_key(policy: &Policy, per_task: bool) -> String {
    let dir = project_dir(policy, per_task);
    let key = key_of(&dir);
    if per_task && policy.workspace.git.is_some() && dir == project_dir(policy, false) {
        format!("{key}-task")
    } else {
        key
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
    scan_secrets_with(home, dir, depth, &list)
}

/// [`scan_secrets`] with `list` listing each directory.
fn scan_secrets_with(
    home: &Path,
    dir: &Path,
    depth: usize,
    list: &dyn Fn(&Path) -> Option<Vec<ListedEntry>>,
) -> Vec<secrets::SecretHit> {
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

/// The toolchains of the machine for this run: detected, enabled as the settings say (their
/// variables passed, their trees granted read-only without credential files, which go to
/// `masked`), an unknown `--toolchain` refused.
fn toolchains_for(
    policy: &mut Policy,
    settings: &HomeSettings,
    home: &Path,
) -> Result<(Vec<Toolchain>, Vec<Masked>), HostError> {
    let mut masked = Vec::new();
    let mut chains = Vec::new();
    // What earlier runs found in the trees, while the directories they read are unchanged.
    let state = crate::privdir::ensure("native", &settings.state_dir).ok();
    let mut scans = scan::Scans::load(state.as_deref());
    for found in detect_here(home, &policy.fs.system_read) {
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
                paths.extend(scans.tree_grants(tree, home, &mut masked));
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
    scans.store();
    for unknown in &settings.add_toolchains {
        if !chains.iter().any(|c| &c.name == unknown) {
            return Err(HostError::Home {
                path: home.to_path_buf(),
                cause: format!(
                    "--toolchain {unknown}: no such toolchain on this machine (found: {}); \
                     `sandbox home` lists them",
                    chains
                        .iter()
                        .map(|c| c.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
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
    Ok((chains, masked))
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
    let key = home_key(policy, settings.per_task);
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
    let (chains, masked) = toolchains_for(policy, settings, &home)?;

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
    let users = keep_mount_points(&dir, &mount_points)
        .map_err(|e| fail(&dir, format!("locking the private home: {e}")))?;
    Ok((
        HomeGuard {
            _users: Some(users),
        },
        None,
    ))
}

/// Takes the lock of a project's cache layers (`dir`), without waiting: an error while a
/// command holds them.
pub fn lock(dir: &Path) -> Result<std::fs::File, std::io::Error> {
    flock(&dir.join("lock"), libc::LOCK_EX | libc::LOCK_NB)
}

/// Removes the tree `dir` of a private home or its cache layers (`sandbox home reset`),
/// following no link, with the directories overlayfs made without permissions in the layers'
/// work directories made searchable first: as a user, a plain recursive removal stops at
/// them ("Permission denied").
pub fn remove_tree(dir: &Path) -> std::io::Result<()> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Err(std::io::Error::other(format!(
            "{}: no parent",
            dir.display()
        )));
    };
    crate::beneath::Dir::open(parent)?.remove_all(name)
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
    // Released when the file is closed.
    crate::sys::flock(file.as_raw_fd(), how)?;
    Ok(file)
}

/// Makes a new private home at `dir` whole or not at all: built beside it, then renamed into
/// place, so a crash mid-way leaves no home without its shell rc.
fn create_home(homes: &Path, dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    let staging = homes.join(format!(".new-{name}"));
    // A crashed attempt's leftover (homes/ is ours, out of every run's reach).
    crate::beneath::Dir::open(homes)?.remove_all(staging.file_name().unwrap_or_default())?;
    std::fs::DirBuilder::new().mode(0o700).create(&staging)?;
    write_shell_rc(&staging)?;
    std::fs::rename(&staging, dir)
}

#[cfg(test)]
mod tests;
