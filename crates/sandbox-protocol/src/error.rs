//! The errors a reply carries.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Every error a reply can carry. Serialised in camelCase (`"unknownMethod"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ErrorCode {
    /// The frame is not JSON.
    ParseError,
    /// JSON, but not a request envelope (`id`, `method`, `params`).
    InvalidRequest,
    UnknownMethod,
    /// The method's parameters are wrong: a missing or unknown field, a bad value.
    InvalidParams,
    RequestTooLarge,
    FrameTooLarge,
    UnsupportedProtocol,
    /// `host.hello` with a valid host token has not been sent on this connection.
    Unauthenticated,
    NoSuchBox,
    NoSuchExec,
    /// A box of that name exists with different settings.
    BoxExists,
    /// The box is not in a state that allows this (exec on a stopped box, …).
    BoxState,
    /// The box still runs commands (`box.remove` without `force`).
    BoxBusy,
    /// The backend cannot be used here; nothing was created or run.
    BackendUnavailable,
    /// The command was refused before it ran (working directory outside the workspace, …).
    Denied,
    /// The command could not be started; `data.exitCode` is what a CLI would exit with.
    SpawnFailed,
    /// Earlier `exec.stdin` writes for this exec are still queued.
    StdinBusy,
    /// The exec's stdin is closed (or was never a pipe).
    StdinClosed,
    ShuttingDown,
    Internal,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::ParseError => "parseError",
            ErrorCode::InvalidRequest => "invalidRequest",
            ErrorCode::UnknownMethod => "unknownMethod",
            ErrorCode::InvalidParams => "invalidParams",
            ErrorCode::RequestTooLarge => "requestTooLarge",
            ErrorCode::FrameTooLarge => "frameTooLarge",
            ErrorCode::UnsupportedProtocol => "unsupportedProtocol",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::NoSuchBox => "noSuchBox",
            ErrorCode::NoSuchExec => "noSuchExec",
            ErrorCode::BoxExists => "boxExists",
            ErrorCode::BoxState => "boxState",
            ErrorCode::BoxBusy => "boxBusy",
            ErrorCode::BackendUnavailable => "backendUnavailable",
            ErrorCode::Denied => "denied",
            ErrorCode::SpawnFailed => "spawnFailed",
            ErrorCode::StdinBusy => "stdinBusy",
            ErrorCode::StdinClosed => "stdinClosed",
            ErrorCode::ShuttingDown => "shuttingDown",
            ErrorCode::Internal => "internal",
        }
    }
}

/// The `error` member of a reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct RpcError {
    pub code: ErrorCode,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }
}
