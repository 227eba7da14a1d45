//! How the native backend may react to this machine: its options, converted once from the
//! seam's.

use std::path::PathBuf;

/// How the native backend may react to this machine.
#[derive(Debug, Clone)]
pub struct NativeOptions {
    /// Run although the kernel cannot enforce part of the policy.
    pub allow_degraded: bool,
    /// Without a private view, unix sockets are denied unless the user allows them.
    pub allow_unix_sockets: bool,
    /// Our private directory: the probe's cache and the view's staging directory live here.
    pub private_dir: PathBuf,
    /// Our persistent private directory: the git task records live here.
    pub state_dir: PathBuf,
    /// The bound of a run's git store layer, in bytes (a tmpfs of this size per command).
    pub git_store_bytes: u64,
}

impl NativeOptions {
    /// The native backend's options from the seam's (the one place they are converted).
    pub fn of(options: &crate::seam::BackendOptions) -> Self {
        NativeOptions {
            allow_degraded: options.allow_degraded,
            allow_unix_sockets: options.allow_unix_sockets,
            private_dir: options.private_dir(),
            state_dir: options.state_dir(),
            git_store_bytes: options.git_store_bytes.unwrap_or(DEFAULT_GIT_STORE_BYTES),
        }
    }
}

/// The git store layer's bound when the configuration names none.
pub const DEFAULT_GIT_STORE_BYTES: u64 = 1 << 30;
