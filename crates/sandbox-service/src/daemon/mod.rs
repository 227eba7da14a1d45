//! The daemon: one per user, owning every box and every backend runtime, serving any number of
//! control connections on a Unix socket and the status-hook endpoint on loopback TCP.
//!
//! One module per job:
//!
//! * [`lifecycle`]: starting (the single-daemon lock, the listeners), the accept loop, shutdown.
//! * [`connection`]: one control connection: its reader, its writer and the queue between them.
//! * [`dispatch`]: which handler serves which method; `host.describe`, `token.issue`, `shutdown`.
//! * [`boxes`]: `box.create`, `box.start`, `box.stop`, `box.remove`, `box.list`.
//! * [`exec`]: `box.exec`, `exec.stdin`, `exec.kill`, and the end of an exec.
//! * [`microvm`]: what of a BoxLite box is the daemon's own.
//! * [`command`]: the task that owns one running command and reports its output and its end.
//! * [`spawner`]: the thread that spawns every command.
//! * [`frames`]: the async frame reader (the protocol's sans-IO decoder over a socket).
//! * [`state`]: what they all share (the state, a connection's queue, an exec's channels);
//!   [`options`]: how the daemon is run.
//!
//! The imports run one way: `lifecycle` → `connection` → `dispatch` → the handlers
//! (`boxes`, `exec`, `microvm`) → `command` → `state` → `spawner`, `options`. Only
//! `dispatch` and `lifecycle` import the handlers.
//!
//! Per connection: one reader decodes frames and dispatches requests **concurrently**; one
//! writer drains a single bounded queue that carries replies and events alike. Because a
//! command's `output` and `exit` events are queued by the one task that owns the command,
//! and replies that report its end are queued only after that, the client always sees a
//! command's output before its exit and its exit before such a reply. Queuing the `exit` and
//! forgetting the exec are one step ([`exec`]), so no request sees one without the other.

mod boxes;
mod command;
mod connection;
mod dispatch;
mod exec;
mod frames;
mod lifecycle;
pub(crate) mod microvm;
mod options;
mod spawner;
pub(crate) mod state;

pub use lifecycle::run;
pub use options::{DaemonError, DaemonOptions, DEFAULT_IDLE_EXIT};
