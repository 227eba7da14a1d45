//! The exec layer of `sandbox`: every backend starts its processes through this crate.
//!
//! * an argv runs as an argv ([`CommandRequest`]); a shell only when asked for explicitly;
//! * every child leads its own session and process group, and a finished, timed-out, cancelled
//!   or dropped run takes its whole group with it ([`process_group`]);
//! * output is a bounded lossless stream with backpressure plus a lossy observer
//!   ([`output`]); [`Running::wait_with_output`] bounds the post-exit drain;
//! * an admission policy ([`CommandPolicy`], [`WorkspaceGuard`]) gates every request;
//! * interactive runs get a fresh pty relayed to the user's terminal ([`pty`]);
//! * a [`ChildSetup`] hook applies a sandbox between fork and exec, in the one child prelude
//!   of every spawn path (session, parent-death signal, the hook, no stray descriptors);
//! * a command the caller only starts and waits for runs without an async runtime and without
//!   copying the caller's memory ([`direct`]).
//!
//! Inside: the setup's vocabulary (the hook, its steps and failures) is a leaf module every
//! spawn path shares (`setup`), and every raw system call is made in one module (`sys`), as a
//! safe wrapper with its `SAFETY` comment.

pub mod cgroups;
pub mod direct;
pub mod error;
pub mod output;
#[cfg(target_os = "linux")]
mod pidns;
pub mod policy;
mod prelude;
pub mod process_group;
pub mod pty;
mod report;
pub mod resolve;
mod setup;
pub mod signals;
pub mod spawn;
pub mod spec;
pub mod status;
mod sys;

pub use cgroups::JoinCgroups;
pub use direct::{spawn_direct, DirectChild, SignalPipe};
pub use error::ExecError;
pub use output::{OutputChunk, OutputLimits, OutputObserver, OutputReceiver, StreamKind};
pub use policy::{AllowAll, CommandPolicy, WorkspaceGuard};
pub use pty::{run_interactive, PtyOptions};
pub use setup::{ChildSetup, SetupFailure, SetupStep};
pub use signals::SignalRelay;
pub use spawn::{spawn, Output, OutputMode, Running, SpawnOptions, StdinMode};
pub use spec::{CommandRequest, CommandSpec};

/// Whether this build and platform can run a command in a pid namespace of its own
/// ([`ChildSetup::pid_namespace`]): Linux on x86_64 or aarch64.
pub fn pid_namespace_supported() -> bool {
    #[cfg(target_os = "linux")]
    {
        pidns::SUPPORTED
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}
pub use status::{ExitOutcome, ExitStatus, Outcome, Unstartable};
