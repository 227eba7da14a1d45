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

pub mod frame;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

pub use frame::{BlockingFrameReader, Frame, FrameDecoder};

/// Serialising the protocol's own values, which cannot fail: `serde_json` fails only for a
/// `Serialize` impl that returns an error or a map whose keys are not strings or numbers, and
/// every type this crate serialises is derived with field-name or string keys (a [`Value`]
/// always serialises); writing into a `Vec` does no I/O. A failure would be a bug in this
/// crate's types, so it panics naming that instead of making every encoder fallible.
mod json {
    use serde::Serialize;
    use serde_json::Value;

    const WHY: &str = "the protocol's derived types serialise to JSON";

    #[allow(clippy::expect_used)] // see the module doc
    pub(crate) fn to_value<T: Serialize + ?Sized>(v: &T) -> Value {
        serde_json::to_value(v).expect(WHY)
    }

    #[allow(clippy::expect_used)] // see the module doc
    pub(crate) fn to_vec<T: Serialize + ?Sized>(v: &T) -> Vec<u8> {
        serde_json::to_vec(v).expect(WHY)
    }

    #[allow(clippy::expect_used)] // see the module doc
    pub(crate) fn write<T: Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) {
        serde_json::to_writer(out, v).expect(WHY)
    }
}

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

/// Parameters that must be an empty object (or absent).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HelloParams {
    /// The host token from `$XDG_RUNTIME_DIR/sandbox/host.token`.
    pub token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// A name for logs (`"studio"`, `"sandbox ps"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DescribeParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

/// `box.create`: a name, a backend and the Policy fields, fixed for the box's life.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BoxCreateParams {
    pub name: String,
    /// `native` (default), `host`, or any backend this build can prepare.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// The task's worktree: the writable workspace of every command in the box.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_read: Vec<PathBuf>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_write: Vec<PathBuf>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub block_net: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_ports: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_domains: Vec<String>,
    /// `--publish [HOST_ADDR:]HOST_PORT[:INNER_PORT]`: the box's servers published to the
    /// daemon's host (native backend; a connection goes to the newest exec whose namespace
    /// accepts it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub publish: Vec<String>,
    /// `--credential NAME`: API credentials the box's proxy adds (secrets read by the
    /// daemon on its host; the box holds placeholders).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<String>,
    /// Variables set in every command of the box.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Default per-exec timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unprotected_git: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_degraded: bool,
    /// Image-based backends (boxlite): a registry reference for the box's root file system.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Image-based backends: an OCI image layout directory instead of `image` (no registry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<PathBuf>,
    /// Virtual CPUs and memory of a VM box; for the backends on this machine's kernel
    /// (native, nono, custom) the resource limits of each command: `cpus` whole CPUs
    /// (`cpuMillis` for a fraction), `memoryMib` its memory (0: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// The CPU limit in thousandths of a CPU (500: half a core; 0: no limit), over `cpus`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<u64>,
    /// Processes and threads each command may have at once (0: no limit; default the
    /// configuration's, else 4096). Backends on this machine's kernel only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_size_gb: Option<u64>,
    /// VM backends: host directories shown in the box (the workdir is always mounted at its
    /// own path).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<MountParam>,
    /// VM backends: the only hosts (names or CIDR blocks) the box may reach; empty: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_net: Vec<String>,
}

/// One `box.create` mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MountParam {
    pub host: PathBuf,
    /// Where it appears in the box; default: `host`, the same path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BoxNameParams {
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BoxStopParams {
    pub name: String,
    /// `box.stop`: SIGKILL at once instead of SIGTERM and a grace period. `box.remove`: stop
    /// running commands first instead of refusing.
    #[serde(default)]
    pub force: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BoxExecParams {
    pub name: String,
    /// The program (a bare name is looked up on the box's `PATH`); never run through a shell.
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Relative to the workdir, or absolute; must resolve inside the box's grants.
    #[serde(default)]
    pub working_dir: Option<PathBuf>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// A pseudo-terminal. Not offered by this daemon yet: `true` is refused.
    #[serde(default)]
    pub interactive: bool,
    /// Give the command a stdin pipe fed by `exec.stdin` (default); `false` is `/dev/null`.
    #[serde(default = "yes")]
    pub stdin: bool,
}

fn yes() -> bool {
    true
}

/// How `data` is encoded in `exec.stdin` and `output`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// `data` is the bytes themselves (valid UTF-8).
    #[default]
    Utf8,
    /// `data` is standard base64 (RFC 4648, padded) of arbitrary bytes.
    Base64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExecStdinParams {
    pub exec_id: u64,
    #[serde(default)]
    pub data: String,
    #[serde(default)]
    pub encoding: Encoding,
    /// Close the command's stdin after writing `data`.
    #[serde(default)]
    pub close: bool,
}

/// A signal by number or name (`"TERM"`, `"SIGKILL"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SignalArg {
    Num(i32),
    Name(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExecKillParams {
    pub exec_id: u64,
    /// Sent to the command's whole process group. Absent: SIGTERM, then SIGKILL after a grace
    /// period.
    #[serde(default)]
    pub signal: Option<SignalArg>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TokenIssueParams {
    /// The task the token may post status for (`sandbox run` uses the worktree's name).
    pub task: String,
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

/// An `exit` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExitEvent {
    pub exec_id: u64,
    /// The CLI convention: the command's code, 124 timed out, 128+N killed by signal N.
    pub exit_code: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    /// What the git store quarantine applied to the repository and refused (native with the
    /// private view, in a linked worktree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_store: Option<GitStoreReport>,
    /// Every connection the run's domain proxy answered, allowed or refused (native with
    /// `allowDomains`); absent when there was none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connections: Vec<NetConnection>,
}

/// One connection through a run's domain proxy, as `--report-json` has it too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetConnection {
    /// The host as the request named it.
    pub host: String,
    pub port: u16,
    /// `connect` (a tunnel) or `http` (plain HTTP).
    pub kind: String,
    pub allowed: bool,
    /// The allow-list entry that allowed it, or the refusing rule (`not-listed`,
    /// `ip-literal`, `non-public-answer`, …).
    pub rule: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The git store quarantine's account of one command: refs applied with compare-and-swap,
/// refs refused (unchanged in the repository), objects taken in by hash.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GitStoreReport {
    pub objects_imported: usize,
    pub applied: Vec<GitRefApplied>,
    pub refused: Vec<GitRefRefused>,
    pub rejected_objects: Vec<GitObjectRejected>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitRefApplied {
    pub name: String,
    /// `null`: created.
    pub old: Option<String>,
    /// `null`: deleted.
    pub new: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitRefRefused {
    pub name: String,
    /// What the command set it to (`null`: deleted).
    pub wanted: Option<String>,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitObjectRejected {
    pub path: String,
    pub reason: String,
}

/// A `boxState` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BoxStateEvent {
    pub box_id: String,
    pub name: String,
    pub state: BoxState,
    /// Since the request that caused the event began (`box.create`: since it was received).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_ms: Option<u64>,
    /// `creating` only: the named step of preparing the backend (a VM's "starting the VM").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// `creating` only: `started`, `done` or `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_state: Option<String>,
    /// A `done` step's own duration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_ms: Option<u64>,
    /// Why a `failed` step failed (the `box.create` error that follows says it too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_error: Option<String>,
}

/// A box's lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum BoxState {
    /// Only in `boxState` events, while `box.create` prepares the backend step by step; a box
    /// is listed from `created` on.
    Creating,
    Created,
    Running,
    Stopping,
    Stopped,
    Removed,
}

impl BoxState {
    pub fn as_str(self) -> &'static str {
        match self {
            BoxState::Creating => "creating",
            BoxState::Created => "created",
            BoxState::Running => "running",
            BoxState::Stopping => "stopping",
            BoxState::Stopped => "stopped",
            BoxState::Removed => "removed",
        }
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

/// Appends an `output` event for `data` to `out`. Valid UTF-8 goes as a JSON string; anything
/// else as base64 with `"encoding":"base64"`. Either way the client gets the exact bytes.
pub fn encode_output(out: &mut Vec<u8>, exec_id: u64, stream: &str, data: &[u8], text: bool) {
    use base64::Engine as _;
    out.extend_from_slice(b"{\"type\":\"output\",\"execId\":");
    out.extend_from_slice(exec_id.to_string().as_bytes());
    out.extend_from_slice(b",\"stream\":\"");
    out.extend_from_slice(stream.as_bytes());
    out.extend_from_slice(b"\",\"data\":");
    match std::str::from_utf8(data) {
        Ok(s) if text => json::write(out, s),
        _ => {
            out.push(b'"');
            let start = out.len();
            // Padded base64 is 4 bytes per started 3; a slice holds at most `isize::MAX`
            // bytes, so this cannot overflow.
            out.resize(start + data.len().div_ceil(3) * 4, 0);
            let engine = &base64::engine::general_purpose::STANDARD;
            match engine.encode_slice(data, &mut out[start..]) {
                Ok(written) => out.truncate(start + written),
                // Not reached (the buffer is sized above); encoding afresh keeps the bytes exact.
                Err(_) => {
                    out.truncate(start);
                    out.extend_from_slice(engine.encode(data).as_bytes());
                }
            }
            out.extend_from_slice(b"\",\"encoding\":\"base64\"");
        }
    }
    out.push(b'}');
}

/// Encodes one connection's `output` events, keeping text text across chunk boundaries: an
/// incomplete UTF-8 sequence at the end of a chunk is held back (at most 3 bytes per stream)
/// until the next chunk completes it — or the exec ends, when it goes out as base64. A chunk
/// with bytes that are not UTF-8 goes out whole as base64. Either way the bytes are exact.
#[derive(Debug, Default)]
pub struct OutputEncoder {
    carry: std::collections::HashMap<(u64, &'static str), Vec<u8>>,
}

impl OutputEncoder {
    /// Appends zero or one `output` frame (with its newline) for `data` to `out`.
    pub fn output(&mut self, out: &mut Vec<u8>, exec_id: u64, stream: &'static str, data: &[u8]) {
        let key = (exec_id, stream);
        let joined;
        let bytes: &[u8] = match self.carry.remove(&key) {
            Some(mut held) => {
                held.extend_from_slice(data);
                joined = held;
                &joined
            }
            None => data,
        };
        match std::str::from_utf8(bytes) {
            Ok(_) => encode_output(out, exec_id, stream, bytes, true),
            // Only an incomplete sequence at the very end: send the text before it.
            Err(e) if e.error_len().is_none() => {
                let (text, rest) = bytes.split_at(e.valid_up_to());
                self.carry.insert(key, rest.to_vec());
                if text.is_empty() {
                    return;
                }
                encode_output(out, exec_id, stream, text, true);
            }
            Err(_) => encode_output(out, exec_id, stream, bytes, false),
        }
        out.push(b'\n');
    }

    /// Flushes what is held for `exec_id` (before its `exit` event).
    pub fn finish(&mut self, out: &mut Vec<u8>, exec_id: u64) {
        for stream in ["stdout", "stderr"] {
            if let Some(held) = self.carry.remove(&(exec_id, stream)) {
                encode_output(out, exec_id, stream, &held, false);
                out.push(b'\n');
            }
        }
    }
}

/// Decodes `data` of an `exec.stdin` request or `output` event.
pub fn decode_data(data: &str, encoding: Encoding) -> Result<Vec<u8>, RpcError> {
    use base64::Engine as _;
    match encoding {
        Encoding::Utf8 => Ok(data.as_bytes().to_vec()),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| RpcError::new(ErrorCode::InvalidParams, format!("data: bad base64: {e}"))),
    }
}

/// Any frame the daemon sends, as a client reads it. Lenient (no `deny_unknown_fields`) so
/// that clients keep working when a later daemon adds members.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Incoming {
    /// Present (possibly `null`) on replies; absent on events.
    #[serde(default, deserialize_with = "present")]
    pub id: Option<Option<Id>>,
    #[serde(default)]
    pub result: Option<Value>,
    #[serde(default)]
    pub error: Option<RpcError>,
    /// The event kind: `output`, `exit`, `boxState`.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub exec_id: Option<u64>,
    #[serde(default)]
    pub stream: Option<String>,
    #[serde(default)]
    pub data: Option<String>,
    #[serde(default)]
    pub encoding: Option<Encoding>,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub signal: Option<i32>,
    #[serde(default)]
    pub timed_out: Option<bool>,
    #[serde(default)]
    pub error_message: Option<String>,
    #[serde(default)]
    pub git_store: Option<GitStoreReport>,
    /// An `exit` event's connection log (a run with a domain allow-list).
    #[serde(default)]
    pub connections: Vec<NetConnection>,
    #[serde(default)]
    pub box_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub state: Option<BoxState>,
    #[serde(default)]
    pub elapsed_ms: Option<u64>,
    #[serde(default)]
    pub step: Option<String>,
    #[serde(default)]
    pub step_state: Option<String>,
    #[serde(default)]
    pub step_ms: Option<u64>,
    #[serde(default)]
    pub step_error: Option<String>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<Id>>, D::Error> {
    Option::<Id>::deserialize(d).map(Some)
}

impl Incoming {
    pub fn is_reply(&self) -> bool {
        self.id.is_some()
    }

    /// The bytes of an `output` event.
    pub fn output_bytes(&self) -> Result<Vec<u8>, RpcError> {
        decode_data(
            self.data.as_deref().unwrap_or(""),
            self.encoding.unwrap_or_default(),
        )
    }
}

#[cfg(test)]
mod tests;
