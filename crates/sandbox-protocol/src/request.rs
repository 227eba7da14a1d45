//! The request parser: a frame becomes a [`Request`] to act on or the error reply it
//! deserves, and a [`Request`] becomes a frame again (for clients).

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::boxes::{BoxCreateParams, BoxNameParams, BoxStopParams};
use crate::envelope::{Id, MAX_FRAME_BYTES, MAX_REQUEST_BYTES};
use crate::error::{ErrorCode, RpcError};
use crate::exec::{BoxExecParams, ExecKillParams, ExecStdinParams};
use crate::frame::Frame;
use crate::host::{DescribeParams, HelloParams, NoParams, TokenIssueParams};
use crate::json;

/// The request envelope as it is on the wire.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope<'a> {
    id: Id,
    method: String,
    #[serde(default, borrow)]
    params: Option<&'a RawValue>,
}

/// Only the id, for answering a request that is too large to act on (or has a bad envelope):
/// every other member is skipped without being stored.
#[derive(Deserialize)]
struct IdOnly {
    #[serde(default)]
    id: Option<Id>,
}

/// A parsed request.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Hello(HelloParams),
    Describe(DescribeParams),
    /// Boxed: the largest parameters by far (the VM fields).
    BoxCreate(Box<BoxCreateParams>),
    BoxStart(BoxNameParams),
    BoxExec(BoxExecParams),
    ExecStdin(ExecStdinParams),
    ExecKill(ExecKillParams),
    BoxStop(BoxStopParams),
    BoxRemove(BoxStopParams),
    BoxList(NoParams),
    TokenIssue(TokenIssueParams),
    Shutdown(NoParams),
}

/// Every method name, for `host.describe` and error messages.
pub const METHODS: &[&str] = &[
    "host.hello",
    "host.describe",
    "box.create",
    "box.start",
    "box.exec",
    "exec.stdin",
    "exec.kill",
    "box.stop",
    "box.remove",
    "box.list",
    "token.issue",
    "shutdown",
];

impl Request {
    pub fn method(&self) -> &'static str {
        match self {
            Request::Hello(_) => "host.hello",
            Request::Describe(_) => "host.describe",
            Request::BoxCreate(_) => "box.create",
            Request::BoxStart(_) => "box.start",
            Request::BoxExec(_) => "box.exec",
            Request::ExecStdin(_) => "exec.stdin",
            Request::ExecKill(_) => "exec.kill",
            Request::BoxStop(_) => "box.stop",
            Request::BoxRemove(_) => "box.remove",
            Request::BoxList(_) => "box.list",
            Request::TokenIssue(_) => "token.issue",
            Request::Shutdown(_) => "shutdown",
        }
    }

    /// The `params` member for this request.
    pub fn params(&self) -> Value {
        match self {
            Request::Hello(p) => json::to_value(p),
            Request::Describe(p) => json::to_value(p),
            Request::BoxCreate(p) => json::to_value(p),
            Request::BoxStart(p) => json::to_value(p),
            Request::BoxExec(p) => json::to_value(p),
            Request::ExecStdin(p) => json::to_value(p),
            Request::ExecKill(p) => json::to_value(p),
            Request::BoxStop(p) | Request::BoxRemove(p) => json::to_value(p),
            Request::BoxList(p) | Request::Shutdown(p) => json::to_value(p),
            Request::TokenIssue(p) => json::to_value(p),
        }
    }

    /// One request frame (without the newline).
    pub fn encode(&self, id: &Id) -> Vec<u8> {
        json::to_vec(&serde_json::json!({
            "id": id,
            "method": self.method(),
            "params": self.params(),
        }))
    }
}

fn params<'a, T: Deserialize<'a> + Default>(
    method: &str,
    raw: Option<&'a RawValue>,
) -> Result<T, RpcError> {
    match raw {
        None => Ok(T::default()),
        Some(raw) => typed(method, Some(raw)),
    }
}

fn typed<'a, T: Deserialize<'a>>(method: &str, raw: Option<&'a RawValue>) -> Result<T, RpcError> {
    let Some(raw) = raw else {
        return Err(RpcError::new(
            ErrorCode::InvalidParams,
            format!("{method}: params are required"),
        ));
    };
    serde_json::from_str(raw.get())
        .map_err(|e| RpcError::new(ErrorCode::InvalidParams, format!("{method}: {e}")))
}

/// The outcome of reading one frame: a request to act on, a frame to skip silently (blank
/// lines), or an error to answer under `id` (`None` when no id could be read).
#[derive(Debug)]
pub enum Decoded {
    Request(Id, Request),
    Blank,
    Error(Option<Id>, RpcError),
}

/// Turns one frame into a request or the error reply it deserves. Total: every input maps to
/// exactly one outcome, and only whitespace-only lines go unanswered.
pub fn decode_frame(frame: &Frame) -> Decoded {
    let line = match frame {
        Frame::TooLarge { len } => {
            return Decoded::Error(
                None,
                RpcError::new(
                    ErrorCode::FrameTooLarge,
                    format!(
                        "frame of {len} bytes exceeds the {MAX_FRAME_BYTES}-byte frame limit; \
                         it was skipped unread"
                    ),
                )
                .with_data(serde_json::json!({ "limit": MAX_FRAME_BYTES, "length": len })),
            )
        }
        Frame::Line(line) => line,
    };
    if line.iter().all(u8::is_ascii_whitespace) {
        return Decoded::Blank;
    }
    if line.len() > MAX_REQUEST_BYTES {
        let id = serde_json::from_slice::<IdOnly>(line)
            .ok()
            .and_then(|r| r.id);
        return Decoded::Error(
            id,
            RpcError::new(
                ErrorCode::RequestTooLarge,
                format!(
                    "request of {} bytes exceeds the {MAX_REQUEST_BYTES}-byte request limit \
                     (send large stdin in several exec.stdin calls)",
                    line.len()
                ),
            )
            .with_data(serde_json::json!({ "limit": MAX_REQUEST_BYTES, "length": line.len() })),
        );
    }
    let text = match std::str::from_utf8(line) {
        Ok(t) => t,
        Err(e) => {
            return Decoded::Error(
                None,
                RpcError::new(ErrorCode::ParseError, format!("frame is not UTF-8: {e}")),
            )
        }
    };
    let envelope: Envelope = match serde_json::from_str(text) {
        Ok(env) => env,
        Err(e) if e.is_syntax() || e.is_eof() => {
            return Decoded::Error(
                None,
                RpcError::new(ErrorCode::ParseError, format!("frame is not JSON: {e}")),
            )
        }
        Err(e) => {
            let id = serde_json::from_str::<IdOnly>(text).ok().and_then(|r| r.id);
            return Decoded::Error(
                id,
                RpcError::new(
                    ErrorCode::InvalidRequest,
                    format!(
                        "not a request envelope {{\"id\": <integer or string>, \"method\": \
                         <string>, \"params\": <object>}}: {e}"
                    ),
                ),
            );
        }
    };
    let id = envelope.id;
    let m = envelope.method.as_str();
    let p = envelope.params;
    let request = match m {
        "host.hello" => typed(m, p).map(Request::Hello),
        "host.describe" => params(m, p).map(Request::Describe),
        "box.create" => typed(m, p).map(|p| Request::BoxCreate(Box::new(p))),
        "box.start" => typed(m, p).map(Request::BoxStart),
        "box.exec" => typed(m, p).map(Request::BoxExec),
        "exec.stdin" => typed(m, p).map(Request::ExecStdin),
        "exec.kill" => typed(m, p).map(Request::ExecKill),
        "box.stop" => typed(m, p).map(Request::BoxStop),
        "box.remove" => typed(m, p).map(Request::BoxRemove),
        "box.list" => params(m, p).map(Request::BoxList),
        "token.issue" => typed(m, p).map(Request::TokenIssue),
        "shutdown" => params(m, p).map(Request::Shutdown),
        other => Err(RpcError::new(
            ErrorCode::UnknownMethod,
            format!("unknown method {other:?}; known: {}", METHODS.join(", ")),
        )),
    };
    match request {
        Ok(r) => Decoded::Request(id, r),
        Err(e) => Decoded::Error(Some(id), e),
    }
}
