//! Enforcing a [`Policy`](sandbox_policy::Policy) on the host.
//!
//! * [`linux`]: the native backend on Linux — Landlock + seccomp, prepared in the parent and
//!   applied between fork and exec ([`sandbox_exec::ChildSetup`]).
//! * [`seatbelt`]: the native backend on macOS — the SBPL profile run through
//!   `/usr/bin/sandbox-exec`.
//! * [`nono`]: the nono backend — the policy as a nono manifest, run by the pinned nono CLI.
//! * [`custom`]: the custom backend — a user's launcher owns the boundary; [`placement`]
//!   keeps such programs out of everything the sandbox can write.
//! * [`run`]: the run sequence every caller follows — assemble, prepare, arm, spawn, reap,
//!   finish — and the one exit rule ([`run::Outcome`]).
//! * [`backend`]: the seam the run goes through — the registry of backends ([`Backends`]),
//!   each one's session and armed commands.
//! * [`assembly`]: one policy assembly (defaults, grants, environment, trusted places) for the
//!   CLI and the daemon.
//! * [`report`]: what is enforced on this machine, for `doctor` and `policy show`;
//!   [`layers`]: which layer of a run holds each property of the policy.
//! * [`net`]: a run's network plan (the private network namespace, its relayed ports and
//!   the domain allow-list's proxy).

pub mod agent;
pub mod assembly;
pub mod backend;
pub mod beneath;
pub mod custom;
pub mod error;
pub mod gitguard;
pub mod home;
pub mod journal;
pub mod layers;
pub mod limits;
#[cfg(target_os = "linux")]
pub mod linux;
pub mod net;
pub mod nono;
pub mod notices;
pub mod placement;
pub mod privdir;
pub mod report;
pub mod resolve;
pub mod run;
pub mod seatbelt;
pub mod tmpdir;

pub use backend::{
    Backend, BackendKind, BackendOptions, BackendSession, Backends, Finished, PreparedCommand,
    Provider, Recheck, RunEnd,
};
pub use error::HostError;
pub use report::Enforcement;
pub use run::{Armed, ExitStatus, Invocation, Live, Outcome, Reaped, Reaper, Run};
