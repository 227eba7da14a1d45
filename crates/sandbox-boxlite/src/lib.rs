//! The BoxLite backend: microVM boxes booted from OCI images by the `boxlite` crate.
//!
//! - [`runtime_files`]: the pinned runtime files (shim, guest agent, libkrunfw, e2fsprogs),
//!   where they come from and whether a directory holds exactly them;
//! - [`spec`]: a box's description (image or OCI layout, sizes, mounts, network allow-list,
//!   environment), checked before anything touches the machine;
//! - [`git`]: how a worktree's git data is mounted so that a box cannot write what the
//!   host's git runs;
//! - [`host`]: whether this host can boot guests (KVM device, then a real boot);
//! - [`error`]: every failure, with the box's log paths;
//! - `engine` (cargo feature `boxlite`): the one BoxLite runtime of a home and its boxes;
//! - `session` (cargo feature `boxlite`): a box behind the run seam — its backend session,
//!   whose commands the run sequence arms and launches in the guest.
//!
//! Everything but the engine is built without the feature, so `doctor`, the daemon and
//! `cargo xtask boxlite-runtime` can describe BoxLite in every build.

pub mod error;
pub mod git;
pub mod host;
pub mod layout;
pub mod relay;
pub mod runtime_files;
pub mod spec;

#[cfg(feature = "boxlite")]
pub mod engine;
#[cfg(feature = "boxlite")]
pub mod session;

/// The BoxLite crate itself, for the daemon's commands and streams.
#[cfg(feature = "boxlite")]
pub use boxlite;

pub use error::{BoxliteError, LogPaths};
pub use spec::{BoxSpec, ImageSource, Mount, NetTarget, SpecError};

/// Whether this build carries the BoxLite engine (cargo feature `boxlite`).
pub const IN_BUILD: bool = cfg!(feature = "boxlite");

/// BoxLite's version (the crate's and the runtime files').
pub const VERSION: &str = runtime_files::VERSION;

/// BoxLite's entry in the binary's backend registry ([`sandbox_host::Backends`]), linked only
/// with the cargo feature `boxlite`. Its boxes belong to the daemon (one runtime per home), so
/// opening it in another process is refused, typed ([`sandbox_host::HostError::RunsInDaemon`]).
#[cfg(feature = "boxlite")]
pub struct BoxliteProvider;

#[cfg(feature = "boxlite")]
impl sandbox_host::Provider for BoxliteProvider {
    fn kind(&self) -> sandbox_host::BackendKind {
        sandbox_host::BackendKind::Boxlite
    }

    fn open(
        &self,
        _options: &sandbox_host::BackendOptions,
    ) -> Result<Box<dyn sandbox_host::Backend>, sandbox_host::HostError> {
        Err(sandbox_host::HostError::RunsInDaemon {
            backend: sandbox_host::BackendKind::Boxlite,
        })
    }
}
