//! What a backend enforces on this machine, as data for `doctor` and `policy show`.

use serde::Serialize;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Enforcement {
    /// "landlock+seccomp", "seatbelt", "nono", "launcher", "none".
    pub mechanism: String,
    pub landlock_abi: Option<i32>,
    /// Landlock filesystem rights this kernel enforces.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fs_rights_enforced: Vec<String>,
    /// Rights newer kernels add that this one lacks (informational).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fs_rights_missing: Vec<String>,
    /// Properties that hold for a run.
    pub enforced: Vec<String>,
    /// Parts of the policy this machine cannot enforce. A run fails closed while any exist,
    /// unless the user passed `--allow-degraded`.
    pub gaps: Vec<String>,
    /// Caveats worth knowing.
    pub notes: Vec<String>,
    /// Layers this machine cannot give (the private view without user namespaces): the run
    /// still starts, and says so at its start, every time.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub downgrades: Vec<String>,
}

/// The native backend's compiled forms for a policy, as a run here would use them: the
/// private view's mounts (when the machine gives one), the Landlock plan and the seccomp
/// rules (`policy show`). Asked of the seam, so callers need no platform module.
#[derive(Debug)]
pub struct NativeForms {
    pub view: Option<Result<sandbox_policy::compile::view::ViewPlan, crate::error::HostError>>,
    pub landlock: Result<sandbox_policy::compile::landlock::LandlockPlan, crate::error::HostError>,
    pub seccomp: sandbox_policy::compile::seccomp::SeccompPlan,
    /// Where a run's pid namespace mounts its own proc in place of the view's bind of the
    /// host's (`/proc`), when a run here gets a pid namespace.
    pub own_proc: Option<std::path::PathBuf>,
}

/// [`NativeForms`] for `policy` under `options` (its `allow_degraded`, `allow_unix_sockets` and
/// private directory, as a run would have them).
pub fn native_forms(
    policy: &sandbox_policy::Policy,
    options: &crate::backend::BackendOptions,
) -> NativeForms {
    #[cfg(target_os = "linux")]
    {
        let compiled = crate::linux::native::compiled(
            policy,
            &crate::linux::native::NativeOptions::of(options),
        );
        NativeForms {
            view: compiled.view,
            landlock: compiled.landlock,
            seccomp: compiled.seccomp,
            own_proc: compiled.own_proc,
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = options;
        NativeForms {
            view: None,
            landlock: sandbox_policy::compile::landlock::compile(policy).map_err(Into::into),
            seccomp: sandbox_policy::compile::seccomp::compile(policy),
            own_proc: None,
        }
    }
}

/// Whether the native backend can build its private view here (`doctor`): the real probe,
/// cached in the private directory of `options`; `Err` says why not.
pub fn private_view(options: &crate::backend::BackendOptions) -> Result<(), String> {
    #[cfg(target_os = "linux")]
    {
        use crate::linux::userns::{self, ViewSupport};
        let cache = crate::privdir::ensure("native", &options.private_dir()).ok();
        match userns::support(cache.as_deref()) {
            ViewSupport::Available => Ok(()),
            ViewSupport::Unavailable { reason } => Err(reason),
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = options;
        Err("the private view is built on Linux only".into())
    }
}

/// Where a run's git store quarantine layers would go here (`doctor`): a tmpfs before
/// Linux 6.6 takes no `user.*` xattrs, so they may go to disk; `Err` says why nowhere (or
/// that this kernel mounts no overlay in a user namespace).
pub fn quarantine_layers(
    options: &crate::backend::BackendOptions,
) -> Result<(std::path::PathBuf, String), String> {
    #[cfg(target_os = "linux")]
    {
        crate::linux::userns::overlay_probe()
            .and_then(|()| crate::privdir::layer_dir(&options.private_dir(), &|_| true))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = options;
        Err("the git store quarantine is built on Linux only".into())
    }
}
