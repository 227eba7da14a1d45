//! The nono backend: the policy compiled to a nono capability manifest
//! ([`sandbox_policy::compile::nono`]) and enforced by the pinned `nono` CLI.
//!
//! The effects live here: locating nono (the path the CLI resolved: baked in at build time,
//! `SANDBOX_NONO`, the configuration or `PATH`) and refusing one the sandbox could replace,
//! checking its version, writing the manifest to a private file outside everything the
//! sandbox can write, and telling nono's own failures from the command's exit status.
//!
//! That last part: nono 0.81 exits 1 with `nono: <message>` when it cannot set the sandbox up
//! (a bad manifest, a refused path, a kernel without Landlock) and 126 when its child fails
//! before exec — both indistinguishable by status alone from a command that exits 1 or 126.
//! So nono does not exec the command directly but a one-line `/bin/sh` trampoline, which runs
//! inside the sandbox after nono applied it, leaves a start mark, and execs the command with
//! its argv unchanged:
//!
//! * `nono wrap` (the usual case): `printf 1 >&3 && exec 3>&- && exec "$@"`. Descriptor 3 is
//!   a pipe we hold (put there between fork and exec); the command never sees it, and nothing
//!   it does can take the byte back.
//! * `nono run` (a domain allow-list: nono stays as the proxy's parent) closes inherited
//!   descriptors, so the mark is a file with a fresh random name in the run's private TMPDIR
//!   (writable only by this run's sandboxed processes): `: > "$1" && shift && exec "$@"`.
//!
//! No mark after the run means the command never started: nono's message is already on
//! stderr, and the run ends with exit 125.

use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::errno::Errno;
use sandbox_exec::{ChildSetup, SetupFailure, SetupStep};
use sandbox_policy::compile::nono::{self as compile_nono, NetworkMode, NonoInvocation, NonoPlan};
use sandbox_policy::Policy;

use crate::backends::placement::{self, PlacementError};
use crate::error::HostError;
use crate::report::Enforcement;
pub use crate::seam::NonoLocation;

mod wrap;
pub use wrap::wrap;

/// The oldest nono this backend drives: the manifest schema 0.1.0 and every switch in
/// [`NonoInvocation::flags`] exist from here on (and it is the version CI pins).
pub const MIN_VERSION: (u64, u64, u64) = (0, 81, 0);

/// What to tell a user whose nono is missing or too old.
pub const INSTALL_HINT: &str = "install it with `cargo install nono-cli --no-default-features` \
     (or use the Nix flake's package, which bakes its path in), or point SANDBOX_NONO or \
     `backends.nono.path` at it";

/// The shell line nono runs inside the sandbox under `nono wrap`: mark fd 3, close it, exec.
pub const TRAMPOLINE_FD: &str = "printf 1 >&3 && exec 3>&- && exec \"$@\"";
/// The same under `nono run`: create the marker file named by `$1`, then exec the rest.
pub const TRAMPOLINE_FILE: &str = ": > \"$1\" && shift && exec \"$@\"";
/// `$0` of the trampoline (appears in its messages).
pub const TRAMPOLINE_NAME: &str = "sandbox-nono";
/// The shell that runs the trampoline (read-only system path on every supported OS).
pub const SHELL: &str = "/bin/sh";
/// The descriptor the `nono wrap` trampoline writes its mark to.
const MARKER_FD: i32 = 3;

/// A located, version-checked nono.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nono {
    pub path: PathBuf,
    pub version: String,
}

fn unavailable(message: String) -> HostError {
    HostError::Unavailable {
        backend: "nono",
        message,
    }
}

/// Parses `nono 0.81.0` (or `0.81.0`) into its numbers.
pub fn parse_version(text: &str) -> Option<(u64, u64, u64)> {
    let word = text
        .split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()))?;
    let core = word.split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    Some((
        parts.next()??,
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
    ))
}

fn version_string(v: (u64, u64, u64)) -> String {
    format!("{}.{}.{}", v.0, v.1, v.2)
}

/// Asks `path --version`, through a small cache keyed on the file's identity so that every
/// run does not pay for a second process (the cache lives in the private directory, which
/// the sandbox cannot write).
fn version_of(path: &Path, cache_dir: Option<&Path>) -> Result<String, HostError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)
        .map_err(|e| unavailable(format!("{}: {e}; {INSTALL_HINT}", path.display())))?;
    let key = format!(
        "{}\0{}\0{}\0{}\0{}\0{}",
        path.display(),
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime_nsec() + meta.mtime() * 1_000_000_000,
        meta.ctime_nsec() + meta.ctime() * 1_000_000_000
    );
    let cache = cache_dir.map(|d| d.join("nono-version"));
    if let Some(cache) = &cache {
        if let Ok(text) = std::fs::read_to_string(cache) {
            if let Some((k, v)) = text.rsplit_once('\0') {
                if k == key {
                    return Ok(v.to_string());
                }
            }
        }
    }
    let out = std::process::Command::new(path)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .env_clear()
        .env("NONO_NO_UPDATE_CHECK", "1")
        .output()
        .map_err(|e| {
            unavailable(format!(
                "cannot run {} --version: {e}; {INSTALL_HINT}",
                path.display()
            ))
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next().unwrap_or("").trim().to_string();
    if !out.status.success() || parse_version(&line).is_none() {
        return Err(unavailable(format!(
            "{} --version did not print a nono version ({:?}); {INSTALL_HINT}",
            path.display(),
            line
        )));
    }
    if let Some(cache) = &cache {
        let tmp = cache.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, format!("{key}\0{line}")).is_ok() {
            let _ = std::fs::rename(&tmp, cache);
        }
    }
    Ok(line)
}

/// Finds nono where the CLI said, refuses one the sandbox could write, checks its version.
/// Why nono cannot run on a kernel with Landlock ABI `abi`, if it cannot: nono 0.81 asks for
/// signal scoping (`SignalMode::AllowSameSandbox`, Landlock ABI 6) on every run and refuses
/// every run below it, `--allow-degraded` or not (seen in Debian 12's 6.1 by
/// `cargo xtask guest-test`). Refusing here says why before nono starts, and keeps `doctor`
/// from listing nono as available with scoping it cannot give.
#[cfg(any(target_os = "linux", test))]
pub fn kernel_refusal(abi: i32) -> Option<String> {
    (abi < 6).then(|| {
        format!(
            "nono 0.81 needs Landlock ABI 6 (it scopes signals on every run) and this kernel \
             has ABI {abi}; use the native backend, which holds the policy with its private \
             view on this kernel, or Linux 6.12 or later"
        )
    })
}

pub fn locate(
    location: Option<&NonoLocation>,
    policy: &Policy,
    spawn_dir: &Path,
    cache_dir: Option<&Path>,
) -> Result<Nono, HostError> {
    #[cfg(target_os = "linux")]
    if let Some(why) = kernel_refusal(crate::backends::native::abi::landlock_abi()) {
        return Err(unavailable(why));
    }
    let Some(NonoLocation {
        path: Some(path),
        source,
    }) = location
    else {
        return Err(unavailable(format!(
            "the nono CLI was not found (not baked into this build, SANDBOX_NONO and \
             `backends.nono.path` unset, not on PATH); {INSTALL_HINT}"
        )));
    };
    if !path.is_absolute() {
        return Err(unavailable(format!(
            "the nono path {} (from {source}) is relative; give an absolute path",
            path.display()
        )));
    }
    let resolved = match placement::check(path, policy, spawn_dir) {
        Ok(p) => p,
        Err(PlacementError::Refused(r)) => {
            return Err(unavailable(format!(
                "refusing to run nono from {} (from {source}): {} is {}, so a sandboxed \
                 command could replace the program that confines it. Install nono outside \
                 every writable path (e.g. `cargo install nono-cli --no-default-features` \
                 into ~/.cargo/bin without granting ~/.cargo writable) and point SANDBOX_NONO \
                 or `backends.nono.path` at it",
                path.display(),
                r.place.display(),
                r.why
            )))
        }
        Err(PlacementError::Unresolvable { cause, .. }) => {
            return Err(unavailable(format!(
                "{} (from {source}): {cause}; {INSTALL_HINT}",
                path.display()
            )))
        }
    };
    let cache_dir = cache_dir.filter(|d| crate::privdir::is_private(d));
    let line = version_of(&resolved, cache_dir)?;
    let version = parse_version(&line).ok_or_else(|| {
        unavailable(format!(
            "{} reports version {line:?}, which is not a version; {INSTALL_HINT}",
            path.display()
        ))
    })?;
    if version < MIN_VERSION {
        return Err(unavailable(format!(
            "{} is {line}, older than the {} this backend needs; {INSTALL_HINT}",
            path.display(),
            version_string(MIN_VERSION)
        )));
    }
    // The checked file itself runs, not a name that could be re-pointed in between.
    Ok(Nono {
        path: resolved,
        version: line,
    })
}

fn is_dir(path: &Path) -> bool {
    std::fs::metadata(path).map(|m| m.is_dir()).unwrap_or(false)
}

/// The plan for `policy` (the manifest as nono will read it).
pub fn plan(policy: &Policy) -> Result<NonoPlan, HostError> {
    Ok(compile_nono::compile(policy, &is_dir)?)
}

/// What the nono backend enforces for `policy`, given the located nono.
pub fn enforcement(policy: &Policy, nono: &Nono) -> Result<Enforcement, HostError> {
    let plan = plan(policy)?;
    let m = &plan.manifest;
    let mut enforced = vec![format!(
        "filesystem (nono, Landlock on Linux, Seatbelt on macOS): {} read-only and {} \
         read-write grants from the policy; everything else denied; git hooks, config, info \
         and packed-refs stay read-only in a linked worktree",
        m.filesystem
            .grants
            .iter()
            .filter(|g| g.access == compile_nono::Access::Read)
            .count(),
        m.filesystem
            .grants
            .iter()
            .filter(|g| g.access == compile_nono::Access::Readwrite)
            .count()
    )];
    let open_ports = match m.network.ports.as_ref().map(|p| &p.connect) {
        Some(ports) if !ports.is_empty() => format!(
            "TCP only to ports {}",
            ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ => "no TCP port open".into(),
    };
    enforced.push(match m.network.mode {
        NetworkMode::Unrestricted => "network: open (as the policy says)".into(),
        NetworkMode::Blocked => format!(
            "network: blocked by nono ({open_ports}); UDP, raw and non-IP sockets and io_uring \
             denied by nono's seccomp baseline"
        ),
        NetworkMode::Proxy => format!(
            "network: only {} through nono's filtering proxy (HTTP_PROXY/HTTPS_PROXY); \
             directly, {open_ports}",
            m.network.allow_domains.join(", ")
        ),
    });
    enforced.push(
        "signals and abstract unix sockets: only within the same sandbox (Landlock scopes)".into(),
    );
    enforced.push(
        "host side: environment filtering, own session (no TIOCSTI into your terminal), \
         process-group cleanup, git pointer check after the run"
            .into(),
    );
    if cfg!(target_os = "linux") && nix::unistd::geteuid().is_root() {
        enforced.push(
            "running as root: every capability is dropped before nono starts, and exec \
             cannot regain them"
                .into(),
        );
    }
    let mut notes = vec![format!(
        "{} ({}), run as `nono {} -c <manifest>`; rollback, audit, prompts and the trust scan \
         are off",
        nono.path.display(),
        nono.version,
        plan.invocation.flags().join(" ")
    )];
    if cfg!(target_os = "linux") {
        enforced.push(
            "terminal ioctls: TIOCSTI, TIOCLINUX and TIOCSETD denied by the native backend's \
             seccomp rules, installed before nono starts"
                .into(),
        );
    }
    notes.push(
        "not applied (the native backend's other seccomp rules): the deny list of \
         machine-changing syscalls; Landlock (which forbids mounts) and, as root, the dropped \
         capabilities cover them"
            .into(),
    );
    notes.push(
        "nono refuses grants that contain its own state directories (~/.nono, \
         ~/.local/state/nono), so a policy granting all of $HOME fails closed here"
            .into(),
    );
    // Quarantining the git store needs a mount namespace nono does not build.
    let downgrades = policy
        .workspace
        .git
        .as_ref()
        .filter(|git| git.quarantined(&policy.workspace.root, policy.unprotected_git))
        .map(|_| {
            "git store not quarantined (nono has no private view): the repository's objects, \
             refs and logs are writable, so other branches and existing objects can be changed; \
             the native backend quarantines them"
                .to_string()
        })
        .into_iter()
        .collect();
    Ok(Enforcement {
        mechanism: "nono".into(),
        enforced,
        notes,
        downgrades,
        ..Enforcement::default()
    })
}

/// The trampoline's mark: proof that the sandbox was in place and the command about to start.
pub enum StartMarker {
    /// A pipe whose write end becomes fd 3 in the child (`nono wrap`).
    Pipe { read: OwnedFd, write: OwnedFd },
    /// A file created in the run's private TMPDIR (`nono run`).
    File { path: PathBuf },
}

impl std::fmt::Debug for StartMarker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartMarker::Pipe { read, write } => f
                .debug_struct("Pipe")
                .field("read", &read.as_raw_fd())
                .field("write", &write.as_raw_fd())
                .finish(),
            StartMarker::File { path } => f.debug_struct("File").field("path", path).finish(),
        }
    }
}

impl crate::seam::StartMark for StartMarker {
    fn fired(&self) -> bool {
        StartMarker::fired(self)
    }

    fn setup_failed(&self, status: i32) -> HostError {
        setup_failed(status, self)
    }
}

impl StartMarker {
    /// A pipe, close-on-exec on our side, non-blocking for reading.
    pub fn pipe() -> Result<Self, HostError> {
        let io = |e: Errno| HostError::StartMarkerPipe(std::io::Error::from(e));
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io)?;
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let (read, write) = {
            let (r, w) = nix::unistd::pipe().map_err(io)?;
            for fd in [&r, &w] {
                nix::fcntl::fcntl(
                    fd.as_raw_fd(),
                    nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
                )
                .map_err(io)?;
            }
            (r, w)
        };
        nix::fcntl::fcntl(
            read.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .map_err(io)?;
        Ok(StartMarker::Pipe { read, write })
    }

    /// A fresh, unguessable file name in the run's private TMPDIR.
    pub fn file(tmpdir: &Path) -> Self {
        let mut bytes = [0u8; 8];
        let random = std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
            .is_ok();
        let mut tag: u64 = u64::from_le_bytes(bytes);
        if !random {
            tag ^= std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
        }
        StartMarker::File {
            path: tmpdir.join(format!(
                ".sandbox-nono-started-{}-{tag:016x}",
                std::process::id()
            )),
        }
    }

    /// True once the trampoline ran inside the sandbox (the command was about to be exec'd).
    pub fn fired(&self) -> bool {
        match self {
            StartMarker::Pipe { read, .. } => {
                let mut buf = [0u8; 8];
                matches!(nix::unistd::read(read.as_raw_fd(), &mut buf), Ok(n) if n > 0)
            }
            StartMarker::File { path } => std::fs::symlink_metadata(path).is_ok(),
        }
    }

    /// Puts the pipe's write end on fd 3 in the child. Async-signal safe: dup2 and fcntl only.
    /// (`/bin/sh` redirects only descriptors 0-9. Fd 3 cannot be one of the spawn's own
    /// close-on-exec reporting pipes: it was taken in the parent when this pipe was made —
    /// `pipe2` hands out the lowest free numbers — and the pipe lives until the run ends.)
    fn apply_in_child(&self) -> Result<(), SetupFailure> {
        let StartMarker::Pipe { write, .. } = self else {
            return Ok(());
        };
        let write = write.as_raw_fd();
        let failed = SetupFailure::at(SetupStep::StartMarker);
        if write == MARKER_FD {
            // dup2 onto itself would keep FD_CLOEXEC; clear it instead.
            nix::fcntl::fcntl(
                write,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
            )
            .map_err(&failed)?;
        } else {
            nix::unistd::dup2(write, MARKER_FD).map_err(&failed)?;
        }
        Ok(())
    }
}

/// What runs in the child between fork and exec of nono: as root, every capability is dropped
/// (nono would keep them), and the terminal ioctl filter is installed (Linux); the
/// start-marker pipe is put on fd 3.
pub struct NonoChildSetup {
    pub marker: Arc<StartMarker>,
    pub before: Vec<Box<dyn ChildSetup>>,
}

impl ChildSetup for NonoChildSetup {
    fn apply_in_child(&self) -> Result<(), SetupFailure> {
        for before in &self.before {
            before.apply_in_child()?;
        }
        self.marker.apply_in_child()
    }

    fn name(&self) -> &str {
        "nono start marker"
    }

    /// The start marker's pipe on fd 3 (`nono wrap`): the one descriptor nono's trampoline
    /// inherits on purpose.
    fn passed_fds(&self) -> &[std::os::fd::RawFd] {
        match &*self.marker {
            StartMarker::Pipe { .. } => &[MARKER_FD],
            StartMarker::File { .. } => &[],
        }
    }
}

/// The manifest of one session, written where the sandbox cannot change it; removed on drop.
#[derive(Debug)]
pub struct WrittenManifest {
    pub plan: NonoPlan,
    pub path: PathBuf,
    /// The private directory holding it.
    _files: tempfile::TempDir,
}

/// Variables nono reads itself (`NONO_ALLOW`, `NONO_PROFILE`, `NONO_BLOCK_NET`, …): none may
/// reach it, since they would change the boundary around what the manifest says.
fn is_nono_variable(name: &OsStr) -> bool {
    name.as_encoded_bytes().starts_with(b"NONO_")
}

/// Compiles `policy` and writes its manifest into a fresh directory inside `private_dir`,
/// which must be private to us and out of the sandbox's reach.
pub fn write_manifest(policy: &Policy, private_dir: &Path) -> Result<WrittenManifest, HostError> {
    let plan = plan(policy)?;
    if plan.invocation == NonoInvocation::Run && policy.fs.tmpdir.is_none() {
        return Err(HostError::NonoNeedsTmpdir);
    }
    let private = crate::privdir::ensure("nono", private_dir)?;
    if policy.is_writable(&private) {
        return Err(HostError::PrivateDirWritable { path: private });
    }
    let files = tempfile::Builder::new()
        .prefix("nono-")
        .tempdir_in(&private)
        .map_err(|source| HostError::ManifestWrite {
            path: private.clone(),
            source,
        })?;
    let path = files.path().join("manifest.json");
    std::fs::write(&path, plan.manifest_json()).map_err(|source| HostError::ManifestWrite {
        path: path.clone(),
        source,
    })?;
    Ok(WrittenManifest {
        plan,
        path,
        _files: files,
    })
}

/// A fresh start marker for one command of `policy` under `manifest`.
pub fn start_marker(policy: &Policy, manifest: &WrittenManifest) -> Result<StartMarker, HostError> {
    match manifest.plan.invocation {
        NonoInvocation::Wrap => StartMarker::pipe(),
        NonoInvocation::Run => match policy.fs.tmpdir.as_deref() {
            Some(tmpdir) => Ok(StartMarker::file(tmpdir)),
            None => Err(HostError::NonoNeedsTmpdir),
        },
    }
}

/// The message for a nono run whose command never started.
fn setup_failed(status: i32, marker: &StartMarker) -> HostError {
    let subcommand = match marker {
        StartMarker::Pipe { .. } => "wrap",
        StartMarker::File { .. } => "run",
    };
    HostError::NonoSetupFailed { subcommand, status }
}

#[cfg(test)]
mod tests;
