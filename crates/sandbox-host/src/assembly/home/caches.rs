//! The package caches' private layers, claimed by one command at a time.
//!
//! Each cache of the private home is an overlay in the command's view: the user's cache
//! below, the project's private layer above (`$XDG_STATE_HOME/sandbox/caches/<key>/<cache>/`
//! `upper`, with overlayfs's `work` beside it). Every command mounts its own overlays, and a
//! layer serves one mount at a time: a second mount would clean the first one's work
//! directory under it, and a `volatile` mount (no sync of the whole disk when the command's
//! namespace goes away) leaves a marker, `work/work/incompat/volatile`, that makes the kernel
//! refuse every later mount of that layer (`EINVAL`) until it is removed.
//!
//! So a layer belongs to a command, not to a run: [`claim`] is called for each command (each
//! step of `sandbox exec`, each `box.exec` of a daemon box) and takes the project's layers
//! when no other command holds them, else gives the command fresh layers of its own, thrown
//! away when it ends. Its [`CacheClaim`] is kept until the command's processes are gone (the
//! mounts go with its namespace), then sets each used work directory aside (renamed in its
//! layer, a new empty one made: two operations on the disk, where removing the marker's four
//! directories cost up to 35 ms a command beside other builds), so the next command finds
//! them as the first did. The directories set aside are removed by later claims, a few per
//! claim, in a thread of their own while the command runs: no command waits for them, and
//! none removes a batch. A killed run's leftovers (a marker, throwaway layers) are cleared by
//! the next claim. A claim of the project's layers stamps them, and its end has them measured
//! for the bound ([`super::bound`]).

use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use sandbox_policy::{CacheLayer, HomePolicy};

use crate::beneath::Dir;
use crate::error::HostError;

/// The prefix of a command's throwaway layers: `busy-<pid>-<start>-<n>`.
const THROWAWAY: &str = super::THROWAWAY_LAYERS;

/// The prefix of a work directory set aside in its layer: `work.old-<pid>-<start>-<n>`.
const SET_ASIDE: &str = "work.old-";

/// How many directories set aside one claim removes, per cache: more than a command sets
/// aside (one per cache), so they never pile up, and a bounded amount of work per claim.
const REMOVED_PER_CLAIM: usize = 2;

/// The claim of one command on the layers its overlays mount; released when dropped.
#[derive(Debug)]
pub struct CacheClaim {
    /// The project's layers directory (`caches/<key>`).
    layers: Dir,
    /// The project's lock, while this command holds the project's own layers.
    lock: Option<std::fs::File>,
    /// Where the layers are and the token this command stamped them with
    /// ([`super::bound`]): measured once it ends. With the project's own layers only.
    measure: Option<(std::path::PathBuf, String)>,
    /// The caches' names (one directory each).
    names: Vec<String>,
    /// This command's own layers, removed when it ends (the project's were busy).
    throwaway: Option<OsString>,
    /// The thread removing directories earlier commands set aside (never waited for but in
    /// tests: a command's end does not depend on it).
    _cleaner: Option<std::thread::JoinHandle<()>>,
}

/// Claims the layers of `home`'s caches for one command. `Ok(None)` when the layers to mount
/// are the policy's own, else the command's throwaway layers to mount instead.
pub fn claim(home: &HomePolicy) -> Result<(CacheClaim, Option<Vec<CacheLayer>>), HostError> {
    let Some(root) = layers_dir(home)? else {
        return Err(HostError::Home {
            path: home.dir.clone(),
            cause: "the private home has no package cache to claim".into(),
        });
    };
    let fail = |path: &Path, e: std::io::Error| HostError::Home {
        path: path.to_path_buf(),
        cause: format!("claiming the package caches' layers: {e}"),
    };
    let layers = Dir::open(root).map_err(|e| fail(root, e))?;
    let names: Vec<String> = home.caches.iter().map(|c| c.name.clone()).collect();
    match crate::assembly::home::lock(root) {
        Ok(lock) => {
            // Leftovers of a killed command: its marker, and throwaway layers of processes
            // that are gone.
            for name in &names {
                clear_work(&layers, name).map_err(|e| fail(&root.join(name), e))?;
            }
            remove_abandoned(&layers);
            let token = super::bound::stamp_claim(&layers).map_err(|e| fail(root, e))?;
            let cleaner = remove_set_aside(root, &names);
            Ok((
                CacheClaim {
                    layers,
                    lock: Some(lock),
                    measure: Some((root.to_path_buf(), token)),
                    names,
                    throwaway: None,
                    _cleaner: cleaner,
                },
                None,
            ))
        }
        Err(_) => {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let name = format!(
                "{THROWAWAY}{}-{}",
                crate::limits::cgroup::process_tag(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            );
            let own = root.join(&name);
            // On failure the claim's drop removes what was made.
            let claim = CacheClaim {
                layers,
                lock: None,
                measure: None,
                names,
                throwaway: Some(name.clone().into()),
                _cleaner: None,
            };
            let make = |layers: &Dir| -> std::io::Result<Vec<CacheLayer>> {
                layers.mkdir(OsStr::new(&name), 0o700)?;
                let dir = layers.dir(OsStr::new(&name))?;
                let mut made = Vec::new();
                for cache in &home.caches {
                    dir.mkdir(OsStr::new(&cache.name), 0o700)?;
                    let at = dir.dir(OsStr::new(&cache.name))?;
                    at.mkdir(OsStr::new("upper"), 0o755)?;
                    at.mkdir(OsStr::new("work"), 0o755)?;
                    made.push(CacheLayer {
                        upper: own.join(&cache.name).join("upper"),
                        work: own.join(&cache.name).join("work"),
                        ..cache.clone()
                    });
                }
                Ok(made)
            };
            let made = make(&claim.layers).map_err(|e| fail(&own, e))?;
            Ok((claim, Some(made)))
        }
    }
}

/// The one directory every cache layer of `home` is in (`caches/<key>`), `None` without
/// caches. The layers are made by [`crate::assembly::home::attach`], always side by side.
fn layers_dir(home: &HomePolicy) -> Result<Option<&Path>, HostError> {
    let mut dirs = home
        .caches
        .iter()
        .map(|c| c.upper.parent().and_then(Path::parent));
    let Some(first) = dirs.next() else {
        return Ok(None);
    };
    match first {
        Some(dir) if dirs.all(|d| d == Some(dir)) => Ok(Some(dir)),
        _ => Err(HostError::Home {
            path: home.dir.clone(),
            cause: "the package caches' layers are not in one directory".into(),
        }),
    }
}

/// Leaves the layer `name`'s work directory empty, as overlayfs wants it: when a mount used
/// it (its `work/work`, the volatile marker in it), it is set aside in the layer under a name
/// of this process's and a new empty one made.
fn clear_work(layers: &Dir, name: &str) -> std::io::Result<()> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let layer = layers.dir(OsStr::new(name))?;
    // Markers an earlier version moved aside instead.
    layer.remove_all(OsStr::new("aside"))?;
    let work = OsStr::new("work");
    if layer.dir(work)?.kind(work)?.is_none() {
        return Ok(());
    }
    let aside = format!(
        "{SET_ASIDE}{}-{}",
        crate::limits::cgroup::process_tag(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    layer.rename(work, OsStr::new(&aside))?;
    layer.mkdir(work, 0o755)
}

/// Removes up to [`REMOVED_PER_CLAIM`] work directories set aside per cache of the layers
/// in `root`, in a thread of its own. A command that ends first does not wait: what is left
/// (even a directory half removed) the next claim removes.
fn remove_set_aside(root: &Path, names: &[String]) -> Option<std::thread::JoinHandle<()>> {
    let root = root.to_path_buf();
    let names = names.to_vec();
    let spawned = std::thread::Builder::new()
        .name("cache-clean".into())
        .spawn(move || {
            let Ok(layers) = Dir::open(&root) else {
                return;
            };
            for name in &names {
                let Ok(layer) = layers.dir(OsStr::new(name)) else {
                    continue;
                };
                let old = layer.names().unwrap_or_default().into_iter().filter(|n| {
                    n.to_str().is_some_and(|n| n.starts_with(SET_ASIDE))
                });
                for old in old.take(REMOVED_PER_CLAIM) {
                    if let Err(e) = layer.remove_all(&old) {
                        tracing::debug!(name = ?old, error = %e, "a work directory set aside stays");
                    }
                }
            }
        });
    spawned.ok()
}

/// Removes throwaway layers whose process is gone (a killed run's).
fn remove_abandoned(layers: &Dir) {
    let Ok(names) = layers.names() else {
        return;
    };
    for name in names {
        let Some(tag) = name.to_str().and_then(|n| n.strip_prefix(THROWAWAY)) else {
            continue;
        };
        // `<pid>-<start>-<n>`: the process is gone when no process has that pid and start.
        let mut parts = tag.splitn(3, '-');
        let (Some(Ok(pid)), Some(Ok(start))) = (
            parts.next().map(str::parse::<u32>),
            parts.next().map(str::parse::<u64>),
        ) else {
            continue;
        };
        if crate::limits::cgroup::process_alive(pid, start) {
            continue;
        }
        if let Err(e) = layers.remove_all(&name) {
            tracing::debug!(name = ?name, error = %e, "could not remove an abandoned cache layer");
        }
    }
}

impl Drop for CacheClaim {
    fn drop(&mut self) {
        let done = match &self.throwaway {
            Some(name) => self.layers.remove_all(name),
            None => self
                .names
                .iter()
                .try_for_each(|name| clear_work(&self.layers, name)),
        };
        if let Err(e) = done {
            // The next claim clears it.
            tracing::debug!(error = %e, "could not clear a package cache's work directory");
        }
        drop(self.lock.take());
        // The command is over: what it left in the layers is what the next run's bound
        // check needs.
        if let Some((root, token)) = self.measure.take() {
            super::bound::measure_after(&root, token);
        }
    }
}

/// The layers a policy names, as `policy` with `layers` in their place.
pub fn with_layers(
    policy: &sandbox_policy::Policy,
    layers: Vec<CacheLayer>,
) -> sandbox_policy::Policy {
    let mut policy = policy.clone();
    if let Some(home) = &mut policy.fs.home {
        home.caches = layers;
    }
    policy
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn home_with_caches(state: &Path, names: &[&str]) -> HomePolicy {
        let layers = state.join("caches/proj");
        let caches = names
            .iter()
            .map(|n| {
                let at = layers.join(n);
                std::fs::create_dir_all(at.join("upper")).unwrap();
                std::fs::create_dir_all(at.join("work")).unwrap();
                CacheLayer {
                    name: n.to_string(),
                    path: PathBuf::from("/home/u").join(n),
                    lower: PathBuf::from("/home/u").join(n),
                    upper: at.join("upper"),
                    work: at.join("work"),
                }
            })
            .collect();
        HomePolicy {
            path: "/home/u".into(),
            dir: state.join("homes/proj"),
            scope: "per-project".into(),
            toolchains: vec![],
            caches,
            masked: vec![],
            cache_cap_bytes: None,
        }
    }

    #[test]
    fn a_second_claim_while_the_first_holds_gets_throwaway_layers_removed_at_its_end() {
        let t = tempfile::tempdir().unwrap();
        let home = home_with_caches(t.path(), &["npm", "pip"]);
        let (first, own) = claim(&home).unwrap();
        assert!(own.is_none(), "the first claim mounts the project's layers");
        let (second, throwaway) = claim(&home).unwrap();
        let throwaway = throwaway.expect("the layers are busy");
        assert_eq!(throwaway.len(), 2);
        for layer in &throwaway {
            assert!(layer.upper.is_dir() && layer.work.is_dir(), "{layer:?}");
            assert!(!layer
                .upper
                .starts_with(home.caches[0].upper.parent().unwrap()));
        }
        drop(second);
        assert!(!throwaway[0].upper.parent().unwrap().exists());
        drop(first);
        let (_third, own) = claim(&home).unwrap();
        assert!(own.is_none(), "released: the project's layers again");
    }

    #[test]
    fn a_volatile_marker_is_cleared_at_the_end_and_a_killed_runs_at_the_next_claim() {
        let t = tempfile::tempdir().unwrap();
        let home = home_with_caches(t.path(), &["npm"]);
        let marker = home.caches[0].work.join("work/incompat/volatile/dirty");
        std::fs::create_dir_all(&marker).unwrap();
        let (claim1, _) = claim(&home).unwrap();
        assert!(
            !home.caches[0].work.join("work").exists(),
            "a killed run's marker"
        );
        std::fs::create_dir_all(&marker).unwrap();
        drop(claim1);
        assert!(home.caches[0].work.is_dir());
        assert!(
            !home.caches[0].work.join("work").exists(),
            "cleared at the end"
        );
    }

    #[test]
    fn an_abandoned_throwaway_layer_is_removed_by_the_next_claim() {
        let t = tempfile::tempdir().unwrap();
        let home = home_with_caches(t.path(), &["npm"]);
        let layers = home.caches[0].upper.parent().unwrap().parent().unwrap();
        // pid 0's start is no process's; a live process's layer stays.
        let gone = layers.join(format!("{THROWAWAY}0-1-0/npm/upper"));
        let live = layers.join(format!(
            "{THROWAWAY}{}-7/npm/upper",
            crate::limits::cgroup::process_tag()
        ));
        for d in [&gone, &live] {
            std::fs::create_dir_all(d).unwrap();
        }
        let _claim = claim(&home).unwrap();
        assert!(!layers.join(format!("{THROWAWAY}0-1-0")).exists());
        assert!(live.exists());
    }

    /// A used work directory is set aside when its command ends (the layer's `work` is left
    /// empty at once); those set aside are removed by later claims, two per cache each, in
    /// a thread the command does not wait for — overlayfs's unsearchable `work/work` too.
    #[test]
    fn work_directories_set_aside_are_removed_a_few_per_claim() {
        use std::os::unix::fs::PermissionsExt as _;
        let t = tempfile::tempdir().unwrap();
        let home = home_with_caches(t.path(), &["npm"]);
        let layer = home.caches[0].work.parent().unwrap().to_path_buf();
        let set_aside = || -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(&layer)
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(SET_ASIDE))
                .collect();
            names.sort();
            names
        };
        // A command that used the layer: its marker set aside at its end.
        let (mut claim1, _) = claim(&home).unwrap();
        claim1._cleaner.take().unwrap().join().unwrap();
        std::fs::create_dir_all(home.caches[0].work.join("work/incompat/volatile/dirty")).unwrap();
        drop(claim1);
        assert_eq!(set_aside().len(), 1);
        assert_eq!(std::fs::read_dir(&home.caches[0].work).unwrap().count(), 0);
        // Two more, as overlayfs leaves them (work/work without permissions).
        for n in 0..2 {
            let old = layer.join(format!("{SET_ASIDE}0-1-{n}"));
            std::fs::create_dir_all(old.join("work/incompat/volatile/dirty")).unwrap();
            std::fs::set_permissions(old.join("work"), std::fs::Permissions::from_mode(0o000))
                .unwrap();
        }
        assert_eq!(set_aside().len(), 3);
        let (mut claim2, _) = claim(&home).unwrap();
        claim2._cleaner.take().unwrap().join().unwrap();
        assert_eq!(set_aside().len(), 1, "two removed by this claim");
        drop(claim2);
        let (mut claim3, _) = claim(&home).unwrap();
        claim3._cleaner.take().unwrap().join().unwrap();
        assert_eq!(set_aside(), Vec::<String>::new());
    }
}
