//! The status-hook endpoint: HTTP on `127.0.0.1:<port>`.
//!
//! | route | host token | sandbox token | none / forged |
//! | --- | --- | --- | --- |
//! | `POST /hook` | any box or task (named in the body) | its own box or task only (else 403) | 401 |
//! | `GET /api/v1/status` | 200 | 403 | 401 |
//! | anything else under `/api/` | 404 | 403 | 401 |
//!
//! A sandboxed process can reach this port even under `--block-net` (the policy's
//! `hook_port`), which is why everything it can do here is scoped by its token.

pub mod client;

use crate::locks::Locked as _;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming as Body;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Deserialize;
use serde_json::json;
use tokio::net::TcpListener;

use crate::daemon::state::State;
use crate::registry::{self, AgentStatus};
use crate::token::Scope;

/// Largest accepted hook body.
pub const MAX_BODY: usize = 16 * 1024;
/// Largest status message kept.
pub const MAX_MESSAGE: usize = 4096;

/// A posted status event.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HookBody {
    /// `working`, `idle`, `needs-input`, `done`, … (1-64 of `[A-Za-z0-9._:-]`).
    event: String,
    #[serde(default)]
    message: Option<String>,
    /// With the host token: the box the status is for. With a sandbox token: optional, and
    /// must be its own.
    #[serde(default, rename = "box")]
    box_name: Option<String>,
    /// Like `box`, for a `sandbox run` task.
    #[serde(default)]
    task: Option<String>,
}

pub(crate) async fn serve(listener: TcpListener, state: Arc<State>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::debug!(error = %e, "hook accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(route(&state, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                // A client that trickles its headers is dropped instead of holding a task.
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn reply(status: StatusCode, body: serde_json::Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn error(status: StatusCode, message: impl Into<String>) -> Response<Full<Bytes>> {
    reply(status, json!({ "error": message.into() }))
}

fn bearer(req: &Request<Body>) -> Option<&str> {
    req.headers()
        .get(hyper::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

async fn route(state: &State, req: Request<Body>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let scope = bearer(&req).and_then(|t| state.tokens.scope_of(t));
    let has_token = bearer(&req).is_some();
    let unauthorized = || {
        error(
            StatusCode::UNAUTHORIZED,
            if has_token {
                "the token is not valid here"
            } else {
                "missing Authorization: Bearer <token>"
            },
        )
    };
    if path == "/hook" {
        if req.method() != Method::POST {
            return error(StatusCode::METHOD_NOT_ALLOWED, "POST /hook");
        }
        let Some(scope) = scope else {
            return unauthorized();
        };
        return post_hook(state, scope, req).await;
    }
    if path == "/api" || path.starts_with("/api/") {
        match scope {
            None => return unauthorized(),
            Some(Scope::Host) => {}
            Some(_) => {
                return error(
                    StatusCode::FORBIDDEN,
                    "a sandbox-scoped token may only post status hooks",
                )
            }
        }
        if path == "/api/v1/status" && req.method() == Method::GET {
            let boxes = state.boxes.locked().list();
            let tasks: serde_json::Map<String, serde_json::Value> = state
                .tasks
                .locked()
                .iter()
                .map(|(k, v)| (k.clone(), crate::json::to_value(v)))
                .collect();
            return reply(
                StatusCode::OK,
                json!({
                    "protocol": sandbox_protocol::PROTOCOL,
                    "pid": std::process::id(),
                    "boxes": boxes,
                    "tasks": tasks,
                }),
            );
        }
        return error(StatusCode::NOT_FOUND, format!("no route {path}"));
    }
    error(StatusCode::NOT_FOUND, format!("no route {path}"))
}

async fn post_hook(state: &State, scope: Scope, req: Request<Body>) -> Response<Full<Bytes>> {
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_BODY) {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("body over {MAX_BODY} bytes"),
        );
    }
    let body = Limited::new(req.into_body(), MAX_BODY);
    let bytes = match tokio::time::timeout(Duration::from_secs(10), body.collect()).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(_)) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("body over {MAX_BODY} bytes"),
            )
        }
        Err(_) => return error(StatusCode::REQUEST_TIMEOUT, "body not received in time"),
    };
    let body: HookBody = match serde_json::from_slice(&bytes) {
        Ok(b) => b,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("expected {{\"event\": …, \"message\"?: …}}: {e}"),
            )
        }
    };
    let event_ok = !body.event.is_empty()
        && body.event.len() <= 64
        && body
            .event
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b));
    if !event_ok {
        return error(
            StatusCode::BAD_REQUEST,
            "event must be 1-64 of letters, digits, '.', '_', ':' or '-'",
        );
    }
    if body.message.as_ref().is_some_and(|m| m.len() > MAX_MESSAGE) {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("message over {MAX_MESSAGE} bytes"),
        );
    }
    let target = match (&scope, &body.box_name, &body.task) {
        (_, Some(_), Some(_)) => {
            return error(StatusCode::BAD_REQUEST, "name a box or a task, not both")
        }
        (Scope::Host, Some(b), None) => Scope::Box(b.clone()),
        (Scope::Host, None, Some(t)) => Scope::Task(t.clone()),
        (Scope::Host, None, None) => {
            return error(
                StatusCode::BAD_REQUEST,
                "with the host token, name the box (\"box\") or task (\"task\")",
            )
        }
        (own, None, None) => own.clone(),
        (own @ Scope::Box(mine), Some(b), None) if b == mine => own.clone(),
        (own @ Scope::Task(mine), None, Some(t)) if t == mine => own.clone(),
        _ => {
            return error(
                StatusCode::FORBIDDEN,
                "a sandbox-scoped token may only post for its own box or task",
            )
        }
    };
    let status = AgentStatus {
        event: body.event,
        message: body.message,
        at_ms: registry::now_ms(),
    };
    match &target {
        Scope::Box(name) => {
            let mut boxes = state.boxes.locked();
            match boxes.get_mut(name) {
                Ok(entry) => entry.last_status = Some(status),
                Err(_) => return error(StatusCode::NOT_FOUND, format!("no box {name:?}")),
            }
        }
        Scope::Task(name) => {
            state.tasks.locked().insert(name.clone(), status);
        }
        Scope::Host => unreachable!("never a hook target"),
    }
    reply(StatusCode::OK, json!({ "ok": true, "for": target.key() }))
}
