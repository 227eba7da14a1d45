//! Enforcing a [`Policy`](sandbox_policy::Policy) on the host.
//!
//! The crate's face is six modules; everything else is its inside:
//!
//! * [`run`]: the run sequence every caller follows — assemble, prepare, arm, spawn, reap,
//!   finish — and the one exit rule ([`run::Outcome`]).
//! * [`seam`]: what a backend implements and the registry that opens it by name
//!   ([`Backends`]); the other crates' backends (Lima, BoxLite) plug in here.
//! * [`backends`]: this crate's backends, a folder each — `native` (the private view,
//!   Landlock, seccomp, the network namespace; Seatbelt on macOS), `nono`, `custom`, `host`.
//! * [`assembly`]: one policy assembly (defaults, grants, environment, trusted places, the
//!   private home and TMPDIR, an agent's profile) for the CLI and the daemon.
//! * [`limits`]: a run's resource limits — what this machine can enforce and the cgroups.
//! * [`report`]: what is enforced on this machine, for `doctor` and `policy show`, and which
//!   layer of a run holds each property.
//!
//! Inside: `aftercare` (the git checks after a command and the journal that has them done
//! even after a killed supervisor), `beneath` (file operations by descriptor in trees a run
//! can write), `privdir` (the private directory of files that decide the boundary), `sys`
//! (the raw system calls behind safe wrappers: the only `unsafe` of the crate but the
//! `fork`s that must keep their callers' promise).

mod aftercare;
pub mod assembly;
pub mod backends;
mod beneath;
mod error;
mod kind;
pub mod limits;
mod privdir;
pub mod report;
pub mod run;
pub mod seam;
mod sys;

pub use error::HostError;
pub use kind::BackendKind;
pub use report::Enforcement;
pub use run::{Armed, ExitStatus, Invocation, Live, Outcome, Reaped, Reaper, Run};
pub use seam::{
    Backend, BackendOptions, BackendSession, Backends, Finished, PreparedCommand, Provider,
    Recheck, RunEnd,
};
