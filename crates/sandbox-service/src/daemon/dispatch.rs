//! Which handler serves which method, and the small methods that need no module of their own.

use crate::locks::Locked as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use sandbox_host::seam::{self, BackendKind};
use sandbox_host::HostError;
use sandbox_protocol::{
    self as protocol, ErrorCode, Request, RpcError, MAX_FRAME_BYTES, MAX_REQUEST_BYTES, PROTOCOL,
};
use serde_json::{json, Value};

use super::boxes::{box_create, box_list, box_remove, box_start, box_stop, stop_everything};
use super::exec::{box_exec, exec_kill};
use super::state::{After, Conn, PeerLease, State};
use crate::registry;
use crate::token::Scope;

/// `exec.stdin`, which the connection's reader queues itself, in arrival order, so that
/// pipelined writes reach the pipe in order.
pub(super) use super::exec::queue_stdin;

/// Runs one request. `host.hello`, `host.describe` and `exec.stdin` never get here: the
/// connection's reader answers them itself, in arrival order.
pub(super) async fn handle(
    state: &Arc<State>,
    conn: &Arc<Conn>,
    request: Request,
    after: &mut After,
) -> Result<Value, RpcError> {
    if state.shutting_down.load(Ordering::SeqCst) && !matches!(request, Request::BoxList(_)) {
        return Err(RpcError::new(
            ErrorCode::ShuttingDown,
            "the daemon is shutting down",
        ));
    }
    match request {
        Request::Hello(_) | Request::Describe(_) | Request::ExecStdin(_) => {
            unreachable!("handled by the reader")
        }
        Request::BoxCreate(p) => box_create(state, conn, *p).await,
        Request::BoxStart(p) => box_start(state, conn, &p.name).await,
        Request::BoxExec(p) => box_exec(state, conn, p, after).await,
        Request::ExecKill(p) => exec_kill(state, p).await,
        Request::BoxStop(p) => box_stop(state, conn, &p.name, p.force).await,
        Request::BoxRemove(p) => box_remove(state, conn, &p.name, p.force).await,
        Request::BoxList(_) => Ok(box_list(state)),
        Request::TokenIssue(p) => token_issue(state, conn, &p.task),
        Request::Shutdown(_) => {
            stop_everything(state).await;
            let state = state.clone();
            *after = Some(Box::new(move || {
                let _ = state.shutdown.send(true);
            }));
            Ok(json!({ "ok": true }))
        }
    }
}

/// `token.issue`: a task token leased to this connection.
fn token_issue(state: &State, conn: &Conn, task: &str) -> Result<Value, RpcError> {
    registry::validate_name("task", task)?;
    let lease = Box::new(PeerLease(conn.socket.clone()));
    let token = state
        .tokens
        .issue_leased(Scope::Task(task.to_string()), lease)
        .map_err(|e| RpcError::new(ErrorCode::Internal, e.to_string()))?;
    conn.leased_tokens.locked().push(token.clone());
    Ok(json!({ "token": token, "url": state.hook_url(), "port": state.hook_port }))
}

/// `host.describe`: what this daemon offers; allowed before `host.hello`, so it holds no secret.
pub(super) fn describe(state: &State, conn: &Conn) -> Value {
    // The same sample policy and judgement as `sandbox doctor`, with this daemon's trusted
    // backend settings, so the two never disagree about what is available.
    let backends: Vec<Value> = match tempfile::tempdir()
        .map_err(|source| HostError::Tmpdir {
            root: std::env::temp_dir(),
            source,
        })
        .and_then(|scratch| seam::sample_policy(scratch.path(), Some(state.hook_port)))
    {
        Ok(sample) => BackendKind::ALL
            .iter()
            .map(|&kind| {
                let a = state
                    .opts
                    .backends
                    .availability(kind, &sample, &state.opts.backend);
                json!({
                    "name": a.name,
                    "available": a.available,
                    "degraded": a.degraded,
                    "mechanism": a.enforcement.as_ref().map(|e| e.mechanism.clone()),
                    "reason": a.reason,
                })
            })
            .collect(),
        Err(e) => vec![json!({ "error": e.to_string() })],
    };
    json!({
        "protocol": PROTOCOL,
        "version": env!("CARGO_PKG_VERSION"),
        "pid": std::process::id(),
        "authenticated": conn.authed.load(Ordering::SeqCst),
        "backends": backends,
        "methods": protocol::METHODS,
        "events": ["output", "exit", "boxState"],
        "capabilities": [
            "concurrentDispatch",
            "orderedOutput",
            "binaryOutputBase64",
            "sharedBoxes",
            "statusHooks"
        ],
        "limits": { "maxRequestBytes": MAX_REQUEST_BYTES, "maxFrameBytes": MAX_FRAME_BYTES },
        "hookUrl": state.hook_url(),
        "hookPort": state.hook_port,
    })
}
