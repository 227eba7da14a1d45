//! The envelope every frame shares: the wire version, the size limits, request ids, and the
//! encoders of replies and of the events that carry no bytes.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ErrorCode, RpcError};
use crate::json;

/// The wire version. A client may send it (`host.hello`, `host.describe`); any other value is
/// refused with [`ErrorCode::UnsupportedProtocol`].
pub const PROTOCOL: &str = "sandbox-jsonl-v1";

/// The largest request the daemon acts on. Larger ones (up to [`MAX_FRAME_BYTES`]) are read,
/// answered with [`ErrorCode::RequestTooLarge`] under their own `id`, and dropped.
pub const MAX_REQUEST_BYTES: usize = 4 << 20;

/// The largest frame either side buffers. Longer lines are skipped without being stored and
/// answered with [`ErrorCode::FrameTooLarge`] (`id: null`).
pub const MAX_FRAME_BYTES: usize = 16 << 20;

/// A request id: a non-negative integer or a string, echoed verbatim in the reply.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Id {
    Num(u64),
    Str(String),
}

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Id::Num(n) => write!(f, "{n}"),
            Id::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// Checks a version a client sent.
pub fn check_protocol(sent: Option<&str>) -> Result<(), RpcError> {
    match sent {
        None => Ok(()),
        Some(v) if v == PROTOCOL => Ok(()),
        Some(v) => Err(RpcError::new(
            ErrorCode::UnsupportedProtocol,
            format!("protocol {v:?} is not supported; this daemon speaks {PROTOCOL:?}"),
        )
        .with_data(serde_json::json!({ "supported": [PROTOCOL] }))),
    }
}

/// Encodes a reply frame (without the newline).
pub fn encode_reply(id: Option<&Id>, outcome: &Result<Value, RpcError>) -> Vec<u8> {
    #[derive(Serialize)]
    struct Ok<'a> {
        id: Option<&'a Id>,
        result: &'a Value,
    }
    #[derive(Serialize)]
    struct Err<'a> {
        id: Option<&'a Id>,
        error: &'a RpcError,
    }
    match outcome {
        Result::Ok(result) => json::to_vec(&Ok { id, result }),
        Result::Err(error) => json::to_vec(&Err { id, error }),
    }
}

/// Encodes an event that carries no bytes (`exit`, `boxState`).
pub fn encode_event<T: Serialize>(kind: &str, body: &T) -> Vec<u8> {
    let mut value = json::to_value(body);
    if let Value::Object(map) = &mut value {
        map.insert("type".into(), Value::String(kind.into()));
    }
    json::to_vec(&value)
}
