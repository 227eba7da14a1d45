//! The names of the backends ([`BackendKind`]): a leaf every other module may name (the
//! error type, the seam, the registry) without importing anything above it.

use serde::Serialize;

use crate::error::HostError;

/// Every backend name the product knows. Not all are in every build ([`Backends`]) or
/// available on every machine ([`Backends::availability`]).
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

    /// Whether its commands get the private home (`crate::assembly::home`): native and custom, which
    /// run on the host's filesystem. Not nono: it keeps its own state under `$HOME`, and
    /// refuses a writable grant over it. A VM has a home of its own.
    pub fn gets_private_home(self) -> bool {
        matches!(self, BackendKind::Native | BackendKind::Custom)
    }

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
                return Err(HostError::WrongPlatform {
                    name: name.to_string(),
                    here: Self::native_platform_name(),
                })
            }
            "nono" => BackendKind::Nono,
            "custom" => BackendKind::Custom,
            "lima" => BackendKind::Lima,
            "boxlite" => BackendKind::Boxlite,
            other => {
                return Err(HostError::UnknownBackend {
                    name: other.to_string(),
                    native: Self::native_platform_name(),
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
