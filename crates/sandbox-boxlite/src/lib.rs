//! The BoxLite backend: microVM boxes booted from OCI images by the `boxlite` crate.
//!
//! - [`runtime_files`]: the pinned runtime files (shim, guest agent, libkrunfw, e2fsprogs),
//!   where they come from and whether a directory holds exactly them;
//! - [`spec`]: a box's description (image or OCI layout, sizes, mounts, network allow-list,
//!   environment), checked before anything touches the machine;
//! - [`git`]: how a worktree's git data is mounted so that a box cannot write what the
//!   host's git runs;
//! - [`host`]: whether this host can boot guests (KVM device, then a real boot);
//! - [`request`]: a VM box as asked for (`sandbox_host::seam::VmRequest`) checked and
//!   compiled into a [`BoxSpec`], the git rules applied;
//! - [`share`]: a box's view composed on the host out of bind mounts and shared through one
//!   or two devices, as libkrun on x86_64 has interrupts for few;
//! - [`error`]: every failure, with the box's log paths;
//! - `engine` (cargo feature `boxlite`): the one BoxLite runtime of a home and its boxes;
//! - `backend` (cargo feature `boxlite`): the registry's provider and the backend whose
//!   `prepare` makes a box in `sandbox_host::Run::prepare`, like every other backend's;
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
pub mod request;
pub mod runtime_files;
pub mod share;
pub mod spec;

#[cfg(feature = "boxlite")]
pub mod backend;
#[cfg(feature = "boxlite")]
pub mod engine;
#[cfg(feature = "boxlite")]
pub mod session;

/// The BoxLite crate itself, for the daemon's commands and streams.
#[cfg(feature = "boxlite")]
pub use boxlite;

pub use error::{BoxliteError, LogPaths, PrepareError};
pub use spec::{BoxSpec, ImageSource, Mount, NetTarget, SpecError};

/// Whether this build carries the BoxLite engine (cargo feature `boxlite`).
pub const IN_BUILD: bool = cfg!(feature = "boxlite");

/// BoxLite's version (the crate's and the runtime files').
pub const VERSION: &str = runtime_files::VERSION;

#[cfg(feature = "boxlite")]
pub use backend::{BoxliteProvider, Engines};
