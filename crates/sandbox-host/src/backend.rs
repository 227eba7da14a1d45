//! Choosing a backend by name and preparing a command for it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use sandbox_exec::{ChildSetup, CommandSpec, ExitOutcome};
use sandbox_policy::Policy;

use crate::custom::{self, LauncherConfig};
use crate::error::HostError;
use crate::nono::{self, NonoLocation, StartMarker};
use crate::report::Enforcement;

/// Every backend name the product knows. Not all are available on every machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// No boundary: an explicit, labelled opt-out.
    Host,
    /// In-process kernel limits: Landlock + seccomp (Linux), Seatbelt (macOS).
    Native,
    /// The pinned `nono` CLI.
    Nono,
    /// A user-provided launcher.
    Custom,
    /// A Lima VM on a sandbox view.
    Lima,
    /// A BoxLite microVM.
    Boxlite,
}

impl BackendKind {
    pub const ALL: &'static [BackendKind] = &[
        BackendKind::Native,
        BackendKind::Host,
        BackendKind::Nono,
        BackendKind::Custom,
        BackendKind::Lima,
        BackendKind::Boxlite,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Native => "native",
            BackendKind::Nono => "nono",
            BackendKind::Custom => "custom",
            BackendKind::Lima => "lima",
            BackendKind::Boxlite => "boxlite",
        }
    }

    /// The platform name of the native backend here.
    pub fn native_platform_name() -> &'static str {
        if cfg!(target_os = "macos") {
            "seatbelt"
        } else {
            "landlock"
        }
    }

    /// Parses a name, accepting this platform's name for the native backend.
    pub fn parse(name: &str) -> Result<BackendKind, HostError> {
        let kind = match name {
            "host" => BackendKind::Host,
            "native" => BackendKind::Native,
            "landlock" if cfg!(target_os = "linux") => BackendKind::Native,
            "seatbelt" if cfg!(target_os = "macos") => BackendKind::Native,
            "landlock" | "seatbelt" => {
                return Err(HostError::Unavailable {
                    backend: "native",
                    message: format!(
                        "{name} is not this platform's mechanism; use `native` (here: {})",
                        Self::native_platform_name()
                    ),
                })
            }
            "nono" => BackendKind::Nono,
            "custom" => BackendKind::Custom,
            "lima" => BackendKind::Lima,
            "boxlite" => BackendKind::Boxlite,
            other => {
                return Err(HostError::Unavailable {
                    backend: "sandbox",
                    message: format!(
                        "unknown backend {other:?}; known: native ({}), host, nono, custom, lima, boxlite",
                        Self::native_platform_name()
                    ),
                })
            }
        };
        Ok(kind)
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Options that are not part of the policy: how to react to this machine, and the trusted
/// settings of the backends that hand the boundary to another program.
#[derive(Debug, Clone, Default)]
pub struct BackendOptions {
    /// Run even if the kernel cannot enforce part of the policy (reported as a warning).
    pub allow_degraded: bool,
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
}

impl BackendOptions {
    fn spawn_dir<'a>(&'a self, policy: &'a Policy) -> &'a Path {
        self.spawn_dir
            .as_deref()
            .unwrap_or(policy.workspace.cwd.as_path())
    }

    fn private_dir(&self) -> PathBuf {
        self.private_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("sandbox-{}", nix::unistd::geteuid()))
        })
    }

    fn nono(&self, policy: &Policy) -> Result<nono::Nono, HostError> {
        nono::locate(
            self.nono.as_ref(),
            policy,
            self.spawn_dir(policy),
            self.private_dir.as_deref(),
        )
    }
}

/// A command ready to spawn under a backend.
pub struct Prepared {
    pub kind: BackendKind,
    pub spec: CommandSpec,
    pub setup: Option<Arc<dyn ChildSetup>>,
    pub enforcement: Enforcement,
    /// Private files the run needs until it ends (the nono manifest); removed on drop.
    pub files: Option<tempfile::TempDir>,
    /// Set when the backend's own failure must be told apart from the command's status.
    pub start_marker: Option<Arc<StartMarker>>,
    /// The custom launcher that runs the command.
    pub launcher: Option<PathBuf>,
}

/// How a run ended, as far as the backend can tell.
#[derive(Debug)]
pub enum RunEnd {
    /// The command ran; the outcome is its own.
    Command,
    /// The backend failed before the command started: nothing ran (exit 125).
    SetupFailed(HostError),
    /// The custom launcher (or the command it ran — a launcher is opaque) ended unsuccessfully.
    Launcher {
        launcher: PathBuf,
        outcome: ExitOutcome,
    },
}

impl Prepared {
    fn plain(kind: BackendKind, spec: CommandSpec, enforcement: Enforcement) -> Self {
        Prepared {
            kind,
            spec,
            setup: None,
            enforcement,
            files: None,
            start_marker: None,
            launcher: None,
        }
    }

    /// Judges a finished run: whether the command started at all, and who to blame.
    pub fn judge(&self, outcome: ExitOutcome) -> RunEnd {
        if let Some(marker) = &self.start_marker {
            if let ExitOutcome::Exited(status) = outcome {
                if !marker.fired() {
                    return RunEnd::SetupFailed(nono::setup_failed(status, marker));
                }
            }
        }
        if let Some(launcher) = &self.launcher {
            if matches!(outcome, ExitOutcome::Exited(c) if c != 0)
                || matches!(outcome, ExitOutcome::Signaled(_))
            {
                return RunEnd::Launcher {
                    launcher: launcher.clone(),
                    outcome,
                };
            }
        }
        RunEnd::Command
    }
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("kind", &self.kind)
            .field("spec", &self.spec)
            .field("setup", &self.setup.as_ref().map(|s| s.name().to_string()))
            .finish()
    }
}

/// What `kind` would enforce for `policy` on this machine (no side effects), for backends
/// that need no options (nono and custom report "not configured" here; see
/// [`enforcement_with`]).
pub fn enforcement(kind: BackendKind, policy: &Policy) -> Result<Enforcement, HostError> {
    enforcement_with(kind, policy, &BackendOptions::default())
}

/// What `kind` would enforce for `policy` on this machine with these options. Locates nono
/// (and asks its version) or checks the launcher's placement; changes nothing.
pub fn enforcement_with(
    kind: BackendKind,
    policy: &Policy,
    options: &BackendOptions,
) -> Result<Enforcement, HostError> {
    match kind {
        BackendKind::Host => Ok(host_enforcement()),
        BackendKind::Native => native_enforcement(policy),
        BackendKind::Nono => nono::enforcement(policy, &options.nono(policy)?),
        BackendKind::Custom => {
            let launcher = custom::locate(
                options.custom.as_ref(),
                policy,
                options.spawn_dir(policy),
                std::env::var_os("PATH").as_deref(),
            )?;
            Ok(custom::enforcement(&launcher))
        }
        other => Err(not_available(other)),
    }
}

fn host_enforcement() -> Enforcement {
    Enforcement {
        mechanism: "none".into(),
        enforced: vec![
            "nothing: the host backend is an explicit opt-out; the command runs with your \
             full permissions"
                .into(),
            "environment filtering, own session (no TIOCSTI into your terminal), process-group \
             cleanup"
                .into(),
        ],
        ..Enforcement::default()
    }
}

#[cfg(target_os = "linux")]
fn native_enforcement(policy: &Policy) -> Result<Enforcement, HostError> {
    crate::linux::native::enforcement(policy)
}

#[cfg(target_os = "macos")]
fn native_enforcement(policy: &Policy) -> Result<Enforcement, HostError> {
    let _ = policy;
    Ok(Enforcement {
        mechanism: "seatbelt".into(),
        enforced: vec![
            "filesystem: only the listed paths; git hooks, config, info and packed-refs \
             read-only even inside writable trees (SBPL last-match-wins)"
                .into(),
            "signals only to processes of the same sandbox".into(),
            "network: blocked except localhost TCP ports when --block-net".into(),
        ],
        ..Enforcement::default()
    })
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn native_enforcement(_policy: &Policy) -> Result<Enforcement, HostError> {
    Err(HostError::Unavailable {
        backend: "native",
        message: "no native sandbox on this operating system".into(),
    })
}

fn not_available(kind: BackendKind) -> HostError {
    let message = match kind {
        BackendKind::Lima => {
            "the Lima backend is not available in this build yet; use `sandbox view create` \
             to prepare a sandbox view"
        }
        BackendKind::Boxlite => "the BoxLite backend is not available in this build yet",
        _ => "not available",
    };
    HostError::Unavailable {
        backend: kind.as_str(),
        message: message.into(),
    }
}

/// Prepares `spec` to run under `kind` with `policy`.
pub fn prepare(
    kind: BackendKind,
    policy: &Policy,
    spec: CommandSpec,
    options: &BackendOptions,
) -> Result<Prepared, HostError> {
    if kind != BackendKind::Nono && !policy.allow_domains.is_empty() {
        return Err(HostError::Unavailable {
            backend: kind.as_str(),
            message: format!(
                "cannot enforce a domain allow-list ({}); only the nono backend filters by \
                 domain (--backend nono)",
                policy.allow_domains.join(", ")
            ),
        });
    }
    match kind {
        BackendKind::Host if matches!(policy.net, sandbox_policy::NetPolicy::Block { .. }) => {
            Err(HostError::Unavailable {
                backend: "host",
                message: "the host backend enforces nothing, so it cannot block the network; \
                          use --backend native"
                    .into(),
            })
        }
        BackendKind::Host => Ok(Prepared::plain(kind, spec, host_enforcement())),
        BackendKind::Native => prepare_native(policy, spec, options),
        BackendKind::Nono => prepare_nono(policy, spec, options),
        BackendKind::Custom => prepare_custom(policy, spec, options),
        other => Err(not_available(other)),
    }
}

fn prepare_nono(
    policy: &Policy,
    spec: CommandSpec,
    options: &BackendOptions,
) -> Result<Prepared, HostError> {
    let located = options.nono(policy)?;
    let enforcement = nono::enforcement(policy, &located)?;
    let run = nono::prepare(policy, &spec, &located, &options.private_dir())?;
    // As root, nono would keep every capability; they are dropped before it starts (the
    // enforcement report says so).
    #[cfg(target_os = "linux")]
    let before = crate::linux::native::DropCapabilities::when_root()
        .map(|drop| Box::new(drop) as Box<dyn ChildSetup>);
    #[cfg(not(target_os = "linux"))]
    let before: Option<Box<dyn ChildSetup>> = None;
    let setup = nono::NonoChildSetup {
        marker: run.marker.clone(),
        before,
    };
    Ok(Prepared {
        setup: Some(Arc::new(setup)),
        files: Some(run.files),
        start_marker: Some(run.marker),
        ..Prepared::plain(BackendKind::Nono, run.spec, enforcement)
    })
}

fn prepare_custom(
    policy: &Policy,
    spec: CommandSpec,
    options: &BackendOptions,
) -> Result<Prepared, HostError> {
    // The launcher is looked up on the PATH it will be started with: the child's.
    let launcher = custom::locate(
        options.custom.as_ref(),
        policy,
        options.spawn_dir(policy),
        spec.env_var("PATH"),
    )?;
    let wrapped = custom::wrap(policy, &spec, &launcher);
    Ok(Prepared {
        launcher: Some(launcher.path.clone()),
        ..Prepared::plain(BackendKind::Custom, wrapped, custom::enforcement(&launcher))
    })
}

#[cfg(target_os = "linux")]
fn prepare_native(
    policy: &Policy,
    spec: CommandSpec,
    options: &BackendOptions,
) -> Result<Prepared, HostError> {
    let sandbox = crate::linux::native::NativeSandbox::prepare(policy, options.allow_degraded)?;
    let enforcement = sandbox.enforcement().clone();
    Ok(Prepared {
        setup: Some(Arc::new(sandbox)),
        ..Prepared::plain(BackendKind::Native, spec, enforcement)
    })
}

#[cfg(target_os = "macos")]
fn prepare_native(
    policy: &Policy,
    spec: CommandSpec,
    _options: &BackendOptions,
) -> Result<Prepared, HostError> {
    let program =
        sandbox_exec::resolve::resolve_program(&spec.program, spec.env_var("PATH"), &spec.cwd)
            .map_err(|e| HostError::Unavailable {
                backend: "native",
                message: e.to_string(),
            })?;
    let wrapped = crate::seatbelt::wrap(policy, &spec, &program);
    Ok(Prepared::plain(
        BackendKind::Native,
        wrapped,
        native_enforcement(policy)?,
    ))
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn prepare_native(
    _policy: &Policy,
    _spec: CommandSpec,
    _options: &BackendOptions,
) -> Result<Prepared, HostError> {
    Err(HostError::Unavailable {
        backend: "native",
        message: "no native sandbox on this operating system".into(),
    })
}
