//! The sandbox service: the per-user daemon that owns the boxes and the backends' runtimes,
//! and what talks to it. The protocol it speaks is the `sandbox-protocol` crate.
//!
//! * [`daemon`]: the daemon — one per user — that multiplexes any number of connections on a
//!   Unix socket.
//! * [`registry`]: the registry of named, reusable boxes.
//! * [`reaper`]: the supervisor that makes "the daemon died" mean "everything it started died".
//! * [`hooks`]: the loopback HTTP endpoint for agent status, with host and sandbox tokens
//!   ([`token`]).
//! * [`client`]: a blocking client; [`runtime`]: the private runtime directory.

pub mod client;
pub mod daemon;
pub mod hooks;
mod json;
mod locks;
pub mod reaper;
pub mod registry;
pub mod runtime;
pub mod token;

pub use client::{Client, ClientError};
pub use daemon::{DaemonError, DaemonOptions};
pub use runtime::RuntimePaths;
