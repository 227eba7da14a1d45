//! The bound on a project's cache layers (`cache_size_mib`), checked when a run starts
//! against the layers as the last command that held them left them.
//!
//! Summing the layers takes an `fstatat` per file in them, and a layer after one `cargo build`
//! inside holds tens of thousands (60+ ms of an 80 ms run), so it is kept off a run's way in.
//! Each command that holds the project's layers stamps them when it claims them
//! ([`stamp_claim`]: a new token in `claimed`) and, once it has ended, has them measured off
//! its path ([`measure_after`]): in a process of its own from the CLI, whose exit the agent is
//! waiting for, or a thread in the daemon, which lives on. The measure writes `measured`:
//! `<token> <bytes>`. A run's check ([`check_cap`]) takes that figure only when its token is
//! the last claim's — no command touched the layers since — waits for a measure still under
//! way, and otherwise sums the layers itself (a killed command, the first run, commands that
//! overlapped).
//!
//! What this gives up: a command running while another run of the project starts is not
//! counted until it ends (its writes were never bounded while it ran anyway).

use std::ffi::OsStr;
use std::path::Path;
use std::sync::OnceLock;

use sandbox_policy::HomePolicy;

use crate::beneath::Dir;
use crate::error::HostError;

use super::usage::human_bytes;

/// The last claim's token, in the layers directory (`caches/<key>/`).
const CLAIMED: &str = "claimed";
/// `<token> <bytes>`: the layers' size after the command of that token ended.
const MEASURED: &str = "measured";
/// Held (`flock`) by a measure while it sums the layers.
const MEASURING: &str = "measuring";

/// How the layers are measured once a command that held them ended.
#[derive(Debug, Clone)]
pub enum Measurer {
    /// In a thread of this process: for a process that lives on after its commands (the
    /// daemon). The default; a process that exits first just leaves no figure, and the next
    /// run sums the layers itself.
    Thread,
    /// In a process of its own, `<exe> __measure-cache-layers <layers> <token>`, detached:
    /// for the CLI, which exits as its command does.
    Process(std::path::PathBuf),
}

static MEASURER: OnceLock<Measurer> = OnceLock::new();

/// Sets how this process has the layers measured after its commands (once, first wins).
pub fn measure_with(measurer: Measurer) {
    let _ = MEASURER.set(measurer);
}

/// The hidden argument [`Measurer::Process`] starts the binary with.
pub const MEASURE_ARG: &str = "__measure-cache-layers";

/// Writes a new token for the command that now holds the project's layers (`layers`, the
/// project's lock held): every figure measured before is stale from here on.
pub fn stamp_claim(layers: &Dir) -> std::io::Result<String> {
    let mut random = [0u8; 8];
    getrandom::fill(&mut random).map_err(std::io::Error::other)?;
    let token: String = random.iter().map(|b| format!("{b:02x}")).collect();
    layers.replace_file(OsStr::new(CLAIMED), token.as_bytes())?;
    Ok(token)
}

/// Has the layers in `root` measured for `token`'s command, which has ended, as set by
/// [`measure_with`].
pub fn measure_after(root: &Path, token: String) {
    match MEASURER.get().cloned().unwrap_or(Measurer::Thread) {
        Measurer::Thread => {
            let root = root.to_path_buf();
            let spawned = std::thread::Builder::new()
                .name("cache-measure".into())
                .spawn(move || record(&root, &token));
            if let Err(e) = spawned {
                tracing::debug!(error = %e, "the cache layers are measured by the next run");
            }
        }
        Measurer::Process(exe) => {
            use std::os::unix::process::CommandExt as _;
            use std::process::{Command, Stdio};
            // Its own process group (a ^C to the terminal is the command's, not its), no
            // stream of the caller's held open, never waited for: it outlives this process.
            let spawned = Command::new(exe)
                .arg(MEASURE_ARG)
                .arg(root)
                .arg(&token)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn();
            if let Err(e) = spawned {
                tracing::debug!(error = %e, "the cache layers are measured by the next run");
            }
        }
    }
}

/// Measures the layers in `root` for `token`'s command and records the figure (what
/// [`Measurer`] runs). Errors leave no figure: the next run sums the layers itself.
pub fn record(root: &Path, token: &str) {
    let Ok(_measuring) = super::flock(&root.join(MEASURING), libc::LOCK_EX) else {
        return;
    };
    let Ok(layers) = Dir::open(root) else {
        return;
    };
    let bytes = sum(&layers);
    write_measured(&layers, token, bytes);
}

/// Records `bytes` as the layers' size after `token`'s command.
fn write_measured(layers: &Dir, token: &str, bytes: u64) {
    let written = layers.replace_file(OsStr::new(MEASURED), format!("{token} {bytes}").as_bytes());
    if let Err(e) = written {
        tracing::debug!(error = %e, "the cache layers' size was not recorded");
    }
}

/// The small file `name` of the layers directory (a token, a figure), `None` if unreadable.
fn read_small(layers: &Dir, name: &str) -> Option<String> {
    use std::io::Read as _;
    let mut text = String::new();
    layers
        .open_file(OsStr::new(name))
        .ok()?
        .take(256)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// Waits for a measure of the layers in `root` under way and keeps others from starting
/// until the file returned is dropped (`sandbox home reset` removing them).
pub fn hold_measures(root: &Path) -> std::io::Result<std::fs::File> {
    super::flock(&root.join(MEASURING), libc::LOCK_EX)
}

/// The upper layers' disk in `layers`: every cache's `upper`, not a command's throwaway
/// layers (removed when it ends) nor the work directories.
fn sum(layers: &Dir) -> u64 {
    let names = layers.names().unwrap_or_default();
    names
        .iter()
        .filter(|n| layers.kind(n).ok().flatten() == Some(crate::beneath::Kind::Dir))
        .filter(|n| !n.to_string_lossy().starts_with(super::THROWAWAY_LAYERS))
        .filter_map(|n| layers.dir(n).ok())
        .filter_map(|layer| layer.dir(OsStr::new("upper")).ok())
        .map(|upper| upper.disk_usage())
        .sum()
}

/// The size the last measure found, when no command claimed the layers after it: waits for
/// a measure under way.
fn recorded(root: &Path, layers: &Dir) -> Option<u64> {
    let current = || -> Option<u64> {
        let claimed = read_small(layers, CLAIMED)?;
        let measured = read_small(layers, MEASURED)?;
        let (token, bytes) = measured.split_once(' ')?;
        (token == claimed).then(|| bytes.parse().ok()).flatten()
    };
    current().or_else(|| {
        // A measure may be under way: once it is done, its figure may be the current one.
        let _done = super::flock(&root.join(MEASURING), libc::LOCK_SH).ok()?;
        current()
    })
}

/// Checks the project's cache layers against the bound: an error (exit 125) names the size,
/// the bound and what to do.
pub fn check_cap(home: &HomePolicy) -> Result<(), HostError> {
    let Some(cap) = home.cache_cap_bytes else {
        return Ok(());
    };
    let Some(root) = home
        .caches
        .first()
        .and_then(|c| c.upper.parent())
        .and_then(Path::parent)
    else {
        return Ok(());
    };
    let Ok(layers) = Dir::open(root) else {
        // Not made yet: nothing in them.
        return Ok(());
    };
    let used = match recorded(root, &layers) {
        Some(bytes) => bytes,
        None => measure_now(root, &layers),
    };
    if used > cap {
        return Err(HostError::Home {
            path: root.to_path_buf(),
            cause: format!(
                "the cache layers take {} (bound: {}). Nothing was run. Free them with \
                 `sandbox home reset --caches`, or raise `cache_size_mib` in the \
                 configuration",
                human_bytes(used),
                human_bytes(cap)
            ),
        });
    }
    Ok(())
}

/// Sums the layers now; when no command holds them, the figure is recorded for the last
/// claim's token (a new one if none), so the runs after this one need not.
fn measure_now(root: &Path, layers: &Dir) -> u64 {
    let Ok(_idle) = super::lock(root) else {
        // A command holds them: its end measures.
        return sum(layers);
    };
    let bytes = sum(layers);
    let claimed = read_small(layers, CLAIMED)
        .map(Ok)
        .unwrap_or_else(|| stamp_claim(layers));
    if let Ok(token) = claimed {
        write_measured(layers, &token, bytes);
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_policy::CacheLayer;

    fn layers(state: &Path) -> (HomePolicy, std::path::PathBuf) {
        let root = state.join("caches/key");
        let upper = root.join("npm/upper");
        std::fs::create_dir_all(&upper).unwrap();
        std::fs::create_dir_all(root.join("npm/work")).unwrap();
        let home = HomePolicy {
            path: "/home/u".into(),
            dir: state.join("homes/key"),
            scope: "per-project".into(),
            toolchains: vec![],
            caches: vec![CacheLayer {
                name: "npm".into(),
                path: "/home/u/.npm".into(),
                lower: "/home/u/.npm".into(),
                upper,
                work: root.join("npm/work"),
            }],
            masked: vec![],
            cache_cap_bytes: Some(1 << 20),
        };
        (home, root)
    }

    fn write(path: &Path, bytes: usize) {
        use std::io::Write as _;
        let mut f = std::fs::File::create(path).unwrap();
        f.write_all(&vec![7u8; bytes]).unwrap();
        f.sync_all().unwrap();
    }

    #[test]
    fn a_command_that_fills_the_layers_past_the_bound_refuses_the_next_run() {
        let state = tempfile::tempdir().unwrap();
        let (home, root) = layers(state.path());
        check_cap(&home).unwrap();
        let token = stamp_claim(&Dir::open(&root).unwrap()).unwrap();
        write(&home.caches[0].upper.join("big"), 2 << 20);
        record(&root, &token);
        let refused = check_cap(&home).unwrap_err().to_string();
        assert!(refused.contains("cache_size_mib"), "{refused}");
        assert!(refused.contains("sandbox home reset --caches"), "{refused}");
    }

    /// The recorded figure stands for the layers only until the next claim: a command that
    /// was killed (a claim, never measured) makes the next run sum them itself.
    #[test]
    fn a_claim_after_the_measure_makes_the_check_sum_the_layers() {
        let state = tempfile::tempdir().unwrap();
        let (home, root) = layers(state.path());
        let dir = Dir::open(&root).unwrap();
        let token = stamp_claim(&dir).unwrap();
        record(&root, &token);
        check_cap(&home).unwrap();
        // A killed command: it claimed and wrote, and nothing measured after it.
        stamp_claim(&dir).unwrap();
        write(&home.caches[0].upper.join("big"), 2 << 20);
        assert!(check_cap(&home).is_err(), "the stale figure was believed");
        // The check recorded what it found: the next one takes it (the file removed, the
        // figure stays until a claim).
        std::fs::remove_file(home.caches[0].upper.join("big")).unwrap();
        assert!(
            check_cap(&home).is_err(),
            "the check's own figure was not kept"
        );
        stamp_claim(&dir).unwrap();
        check_cap(&home).unwrap();
    }
}
