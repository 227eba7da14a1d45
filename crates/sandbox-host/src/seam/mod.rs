//! The backend seam: every way the product starts a command goes through it.
//!
//! A backend is chosen by name ([`BackendKind`]) among those the binary links ([`Backends`],
//! the registry) and opened with the trusted options of this machine ([`Backends::open`]).
//! Then, in this order — which [`crate::run`] owns for every runner:
//!
//! 1. [`Backend::enforcement`]: what it would enforce for a policy here (no side effects) —
//!    for `doctor`, `policy show` and the daemon's `host.describe`;
//! 2. [`Backend::prepare`]: a [`BackendSession`] owning everything that must outlive a single
//!    command (the compiled Landlock ruleset, nono's manifest, the checked launcher; later a
//!    VM or a box), reporting named steps to a [`Progress`];
//! 3. [`BackendSession::command`]: one command armed for this backend ([`PreparedCommand`]),
//!    spawned with pipes or on a pseudo-terminal;
//! 4. [`PreparedCommand::finish`], once every process of the command is gone: judges whether
//!    the backend failed before the command started (exit 125), checks and restores the git
//!    pointers, and removes the command's private files.
//!
//! `sandbox run`, `sandbox shell`, `policy show`, `doctor` and the daemon's `box.create` /
//! `box.exec` all use this seam, so a fix lands once for every path; they call it through
//! [`crate::run::Run`], which fixes the order.

mod command;
pub mod guest;
mod registry;
pub(crate) mod trusted;
pub mod vm;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use sandbox_exec::CommandSpec;
use sandbox_policy::Policy;

use crate::error::HostError;
pub use crate::kind::BackendKind;
use crate::report::Enforcement;

pub use command::{
    CommandJudge, CommandNetwork, Finished, GuestNote, PreparedCommand, Recheck, RunEnd, StartMark,
    WorktreeConfigEnabled,
};
pub use guest::{
    GuestEnd, GuestExit, GuestFuture, GuestGit, GuestInput, GuestLaunch, GuestProcess,
};
pub use registry::{Backends, Provider};
pub use trusted::{TrustedPlace, TrustedPlaces};
pub use vm::{VmMount, VmRequest};

/// The launcher as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LauncherConfig {
    /// `backends.custom.command`, unsplit.
    pub command: String,
    /// The configuration file that set it.
    pub source: Option<PathBuf>,
}

/// Where the CLI found the nono binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NonoLocation {
    /// `None` when nono was not found anywhere.
    pub path: Option<PathBuf>,
    /// "baked", "env", "config", "path" — for messages.
    pub source: String,
}

/// Options that are not part of the policy: how to react to this machine, and the trusted
/// settings of the backends that hand the boundary to another program.
#[derive(Debug, Clone, Default)]
pub struct BackendOptions {
    /// Run even if the kernel cannot enforce part of the policy (reported as a warning).
    pub allow_degraded: bool,
    /// Where the native backend has no private view (no user namespaces), allow unix
    /// sockets anyway (`--allow-unix-sockets`); otherwise creating them is denied.
    pub allow_unix_sockets: bool,
    /// The bound of a native run's git store layer in bytes (default 1 GiB).
    pub git_store_bytes: Option<u64>,
    /// Where the CLI found the `nono` binary (nono backend).
    pub nono: Option<NonoLocation>,
    /// The configured launcher (custom backend), from the user or system configuration only.
    pub custom: Option<LauncherConfig>,
    /// Where the command is spawned when that is not the policy's working directory; the
    /// launcher and nono must not live there.
    pub spawn_dir: Option<PathBuf>,
    /// A private directory outside everything the sandbox can write, for files a backend
    /// needs during the run (the nono manifest) and small caches; created with mode 0700 and
    /// refused if anyone else could write it. Default: `$TMPDIR/sandbox-<uid>`.
    pub private_dir: Option<PathBuf>,
    /// A private directory that survives a reboot, for records the boundary relies on
    /// across runs (which branch a worktree's runs own: the git task records). Default:
    /// `$XDG_STATE_HOME/sandbox`, else `~/.local/state/sandbox`.
    pub state_dir: Option<PathBuf>,
    /// The places no grant may reach (configuration, remembered choices, the daemon's
    /// token); checked by [`check_policy`] for every backend but `host`.
    pub trusted: TrustedPlaces,
    /// A VM box's description beyond its policy (image, sizes, mounts), for the backends
    /// that boot one from it (BoxLite in the daemon); `None` for every other run.
    pub vm: Option<VmRequest>,
}

impl BackendOptions {
    pub(crate) fn spawn_dir<'a>(&'a self, policy: &'a Policy) -> &'a Path {
        self.spawn_dir
            .as_deref()
            .unwrap_or(policy.workspace.cwd.as_path())
    }

    /// The persistent private directory, or its default (the private directory when no
    /// home is known).
    pub fn state_dir(&self) -> PathBuf {
        if let Some(dir) = &self.state_dir {
            return dir.clone();
        }
        let state = match std::env::var_os("XDG_STATE_HOME") {
            Some(d) if Path::new(&d).is_absolute() => Some(PathBuf::from(d)),
            _ => std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".local/state")),
        };
        state.map_or_else(|| self.private_dir(), |s| s.join("sandbox"))
    }

    /// The private directory, or its default.
    pub fn private_dir(&self) -> PathBuf {
        self.private_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("sandbox-{}", nix::unistd::geteuid()))
        })
    }
}

/// One named step of preparing a backend, as reported to a [`Progress`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum Step {
    Started { step: &'static str },
    Done { step: &'static str, elapsed_ms: u64 },
    Failed { step: &'static str, error: String },
}

/// Receives the named steps of [`Backend::prepare`] (a VM's create/boot/provision, a host
/// backend's compile and checks), for a progress line, `--json` events or `boxState`.
pub trait Progress: Send + Sync {
    fn step(&self, step: Step);
}

/// A [`Progress`] that only logs (at debug level).
#[derive(Debug, Default, Clone, Copy)]
pub struct LogProgress;

impl Progress for LogProgress {
    fn step(&self, step: Step) {
        tracing::debug!(?step, "prepare");
    }
}

/// Runs `f` as the named step `name`, reporting its start and end.
pub fn step<T>(
    progress: &dyn Progress,
    name: &'static str,
    f: impl FnOnce() -> Result<T, HostError>,
) -> Result<T, HostError> {
    progress.step(Step::Started { step: name });
    let started = Instant::now();
    let result = f();
    progress.step(match &result {
        Ok(_) => Step::Done {
            step: name,
            elapsed_ms: millis(started.elapsed()),
        },
        Err(e) => Step::Failed {
            step: name,
            error: e.to_string(),
        },
    });
    result
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A backend, opened with this machine's trusted options.
pub trait Backend: Send + Sync {
    /// What this backend would enforce for `policy` here. Looks things up (nono's version, the
    /// launcher's placement, the kernel's Landlock ABI) but changes nothing.
    fn enforcement(&self, policy: &Policy) -> Result<Enforcement, HostError>;

    /// Sets up what must outlive a command, failing closed when the boundary cannot be built
    /// (a kernel gap is refused unless degraded runs were allowed).
    fn prepare(
        &self,
        policy: &Policy,
        progress: &dyn Progress,
    ) -> Result<Arc<dyn BackendSession>, HostError>;
}

/// A prepared backend: any number of commands run in it, one [`PreparedCommand`] each.
///
/// `Any`, so that the caller that chose a backend can reach that backend's own session type
/// through the run it prepared ([`crate::run::Run::session`]): the daemon boots, stops and
/// removes a BoxLite box through its `BoxSession`.
pub trait BackendSession: Send + Sync + std::any::Any {
    /// What this session enforces (gaps only when degraded runs were allowed).
    fn enforcement(&self) -> &Enforcement;

    /// Arms `spec` (resolved, with the child's environment) to run in this session.
    fn command(&self, spec: CommandSpec) -> Result<PreparedCommand, HostError>;

    /// Whether its commands run in a guest (a VM box) with an environment of their own: they
    /// get only their own variables ([`crate::assembly::guest_env`]), nothing of this host's.
    fn runs_in_guest(&self) -> bool {
        false
    }

    /// Where its commands reach the run's proxy (`127.0.0.1:PORT` inside), when it has one:
    /// what `{proxy}` stands for in an agent profile's arguments.
    fn proxy_address(&self) -> Option<String> {
        None
    }
}

/// Refuses a grant that puts the boundary's own state within reach (not for `host`, which
/// grants nothing: its command can reach everything anyway, by the user's explicit choice).
pub fn check_trusted_places(
    kind: BackendKind,
    policy: &Policy,
    options: &BackendOptions,
) -> Result<(), HostError> {
    if kind == BackendKind::Host {
        return Ok(());
    }
    options.trusted.check(policy)
}

/// What every backend checks before preparing: the trusted places, and that no backend but
/// nono is asked for a domain allow-list it cannot enforce.
pub fn check_policy(
    kind: BackendKind,
    policy: &Policy,
    options: &BackendOptions,
) -> Result<(), HostError> {
    check_trusted_places(kind, policy, options)?;
    let pushes = policy.workspace.git.iter().flat_map(|g| &g.push_remotes);
    if let (Some(remote), true) = (pushes.clone().next(), kind != BackendKind::Native) {
        return Err(HostError::Unavailable {
            backend: kind.as_str(),
            message: format!(
                "--allow-push {}: only the native backend's git quarantine can take a push in \
                 by its rules (the {kind} backend would have to make the remote writable, and \
                 a hook planted there would run on your next push); use --backend native",
                remote.display()
            ),
        });
    }
    // A credential's base URL points at the native backend's proxy; elsewhere the command
    // would hold only a placeholder that reaches nothing.
    if kind != BackendKind::Native && !policy.credentials.is_empty() {
        return Err(HostError::Network {
            message: format!(
                "--credential {}: only the native backend's proxy adds a credential on the way \
                 out (the {kind} backend has none); use --backend native, or pass the key \
                 itself with --env",
                policy.credentials.join(" --credential ")
            ),
        });
    }
    // Published ports: the native backend relays them into its namespace (checked when it
    // prepares); on the host's own network a server already listens on the host's port.
    if let Some(p) = policy.publish.first() {
        let why = match kind {
            BackendKind::Native => None,
            BackendKind::Host if policy.publish.iter().all(|p| p.is_identity()) => None,
            BackendKind::Host => Some(
                "the host backend runs on the host's own network: a server listens on the \
                 host's port itself, and no relay maps it to another address or port"
                    .to_string(),
            ),
            BackendKind::Nono => Some(
                "nono runs the command on the host's network (a server listens on the host's \
                 own port, unless --block-net denies it); it has no relay to publish through"
                    .to_string(),
            ),
            BackendKind::Lima => Some(
                "Lima forwards the VM's listening ports to the host's 127.0.0.1 itself (its \
                 portForwards); sandbox does not map them"
                    .to_string(),
            ),
            BackendKind::Boxlite => {
                Some("the BoxLite backend does not wire the box's port forwarding yet".to_string())
            }
            BackendKind::Custom => {
                Some("a custom launcher has no relay to publish through".to_string())
            }
        };
        if let Some(why) = why {
            return Err(HostError::Unavailable {
                backend: kind.as_str(),
                message: format!("--publish {p}: {why}; use --backend native"),
            });
        }
    }
    // The native backend's own proxy needs its network namespace: checked when it prepares.
    if !matches!(kind, BackendKind::Nono | BackendKind::Native) && !policy.allow_domains.is_empty()
    {
        return Err(HostError::DomainsNeedNono {
            backend: kind,
            domains: policy.allow_domains.clone(),
        });
    }
    Ok(())
}

/// Whether a backend can run commands here, as `doctor` and `host.describe` both report it.
#[derive(Debug, Clone, Serialize)]
pub struct Availability {
    pub name: &'static str,
    /// True when a run would start: no kernel gaps, or degraded runs are allowed, or the
    /// backend is `host` (which enforces nothing by design).
    pub available: bool,
    /// The kernel cannot enforce part of the policy.
    pub degraded: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enforcement: Option<Enforcement>,
}

/// Availability judged on an opened (or refused) backend: see [`Backends::availability`].
fn availability_of(
    kind: BackendKind,
    opened: Result<Box<dyn Backend>, HostError>,
    sample: &Policy,
    options: &BackendOptions,
) -> Availability {
    let result = opened.and_then(|b| b.enforcement(sample));
    match result {
        Ok(e) => {
            let degraded = !e.gaps.is_empty() && kind != BackendKind::Host;
            Availability {
                name: kind.as_str(),
                available: !degraded || options.allow_degraded,
                degraded,
                reason: degraded.then(|| {
                    format!(
                        "this kernel cannot enforce: {}; runs fail closed unless degraded runs \
                         are allowed (--allow-degraded)",
                        e.gaps.join("; ")
                    )
                }),
                enforcement: Some(e),
            }
        }
        Err(e) => Availability {
            name: kind.as_str(),
            available: false,
            degraded: false,
            reason: Some(e.to_string()),
            enforcement: None,
        },
    }
}

/// The representative policy availability is judged on: a scratch workspace with the network
/// blocked (so the report covers filesystem, TCP and scoping rules) and the hook port open.
pub fn sample_policy(scratch: &Path, hook_port: Option<u16>) -> Result<Policy, HostError> {
    Ok(sandbox_policy::build(sandbox_policy::PolicyRequest {
        workdir: scratch.to_path_buf(),
        block_net: true,
        hook_port,
        ..sandbox_policy::PolicyRequest::default()
    })?)
}
