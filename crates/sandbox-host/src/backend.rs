//! Choosing a backend by name and preparing a command for it.

use std::sync::Arc;

use serde::Serialize;

use sandbox_exec::{ChildSetup, CommandSpec};
use sandbox_policy::Policy;

use crate::error::HostError;
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

/// Options that are not part of the policy: how to react to this machine.
#[derive(Debug, Clone, Default)]
pub struct BackendOptions {
    /// Run even if the kernel cannot enforce part of the policy (reported as a warning).
    pub allow_degraded: bool,
}

/// A command ready to spawn under a backend.
pub struct Prepared {
    pub kind: BackendKind,
    pub spec: CommandSpec,
    pub setup: Option<Arc<dyn ChildSetup>>,
    pub enforcement: Enforcement,
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

/// What `kind` would enforce for `policy` on this machine (no side effects).
pub fn enforcement(kind: BackendKind, policy: &Policy) -> Result<Enforcement, HostError> {
    match kind {
        BackendKind::Host => Ok(host_enforcement()),
        BackendKind::Native => native_enforcement(policy),
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
        BackendKind::Nono => "the nono backend is not available in this build yet",
        BackendKind::Custom => "the custom launcher backend is not available in this build yet",
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
        BackendKind::Host => Ok(Prepared {
            kind,
            spec,
            setup: None,
            enforcement: host_enforcement(),
        }),
        BackendKind::Native => prepare_native(policy, spec, options),
        other => Err(not_available(other)),
    }
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
        kind: BackendKind::Native,
        spec,
        setup: Some(Arc::new(sandbox)),
        enforcement,
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
    Ok(Prepared {
        kind: BackendKind::Native,
        spec: wrapped,
        setup: None,
        enforcement: native_enforcement(policy)?,
    })
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
