//! What the native backend would build here, for `policy show` and `doctor`: its compiled
//! forms for a policy, and whether this machine gives its private view and its git store
//! quarantine. Asked of the backend's own folder, so callers need no platform module.

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
    options: &crate::seam::BackendOptions,
) -> NativeForms {
    #[cfg(target_os = "linux")]
    {
        let compiled = crate::backends::native::plans::compiled(
            policy,
            &crate::backends::native::options::NativeOptions::of(options),
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
pub fn private_view(options: &crate::seam::BackendOptions) -> Result<(), String> {
    #[cfg(target_os = "linux")]
    {
        use crate::backends::native::userns::{self, ViewSupport};
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
    options: &crate::seam::BackendOptions,
) -> Result<(std::path::PathBuf, String), String> {
    #[cfg(target_os = "linux")]
    {
        crate::backends::native::userns::overlay_probe()
            .and_then(|()| crate::privdir::layer_dir(&options.private_dir(), &|_| true))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = options;
        Err("the git store quarantine is built on Linux only".into())
    }
}
