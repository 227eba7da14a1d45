//! The sandbox service.
//!
//! * [`protocol`]: the JSONL control protocol (types and the bounded frame codec) that a GUI,
//!   an ACP host or a script uses to drive every backend.
//! * [`server`]: the daemon — one per user — that owns the backends' runtimes and the boxes and
//!   multiplexes any number of connections on a Unix socket.
//! * [`boxes`]: the registry of named, reusable boxes.
//! * [`exec`]: the spawner thread and the task that owns each running command.
//! * [`reaper`]: the supervisor that makes "the daemon died" mean "everything it started died".
//! * [`hooks`]: the loopback HTTP endpoint for agent status, with host and sandbox tokens
//!   ([`token`]).
//! * [`client`]: a blocking client; [`runtime`]: the private runtime directory.

pub mod boxes;
pub mod client;
pub mod exec;
pub mod hooks;
pub mod protocol;
pub mod reaper;
pub mod runtime;
pub mod server;
pub mod token;

pub use client::{Client, ClientError};
pub use protocol::PROTOCOL;
pub use runtime::RuntimePaths;
pub use server::{DaemonError, DaemonOptions};
