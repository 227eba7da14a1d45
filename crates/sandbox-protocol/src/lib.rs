//! The JSONL control protocol of the sandbox service: the envelope, every method's parameters,
//! replies, events and errors, and the frame codec. `docs/protocol.md` is the reader's version
//! of this crate.
//!
//! A crate of its own, without an async runtime or an HTTP stack, so that any client — a GUI,
//! a script, the fuzz target — speaks the protocol without linking the daemon
//! (`sandbox-service`). The codec is sans-IO ([`FrameDecoder`]); the daemon wraps it for Tokio.
//!
//! Parsing is strict on purpose: unknown methods and unknown fields are errors, never ignored,
//! so a client that misspells `blockNet` learns it instead of getting an open network.
//!
//! One module per family: `envelope` (the wire version, limits, ids, replies), `error`, the
//! methods' parameters and events by family (`host`, `boxes`, `exec` with the exit event's
//! `report`s), `request` (the parser), `output` (the byte-carrying event), `incoming` (a
//! client's read of any frame) and [`frame`] (the codec). The modules are the crate's insides:
//! its face is the items re-exported here (`sandbox_protocol::Request`).

mod boxes;
mod envelope;
mod error;
mod exec;
pub mod frame;
mod host;
mod incoming;
mod json;
mod output;
mod report;
mod request;

pub use boxes::{
    BoxCreateParams, BoxNameParams, BoxState, BoxStateEvent, BoxStopParams, MountParam,
};
pub use envelope::{
    check_protocol, encode_event, encode_reply, Id, MAX_FRAME_BYTES, MAX_REQUEST_BYTES, PROTOCOL,
};
pub use error::{ErrorCode, RpcError};
pub use exec::{BoxExecParams, Encoding, ExecKillParams, ExecStdinParams, ExitEvent, SignalArg};
pub use frame::{BlockingFrameReader, Frame, FrameDecoder};
pub use host::{DescribeParams, HelloParams, NoParams, TokenIssueParams};
pub use incoming::Incoming;
pub use output::{decode_data, encode_output, OutputEncoder};
pub use report::{GitObjectRejected, GitRefApplied, GitRefRefused, GitStoreReport, NetConnection};
pub use request::{decode_frame, Decoded, Request, METHODS};

#[cfg(test)]
mod tests;
