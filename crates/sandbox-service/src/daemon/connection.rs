//! One control connection: a reader that decodes frames and starts a task per request, and a
//! writer that is the single consumer of the connection's bounded queue. Replies and events
//! share that queue, which is what orders them.

use crate::locks::Locked as _;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandbox_protocol::{
    self as protocol, encode_event, Decoded, ErrorCode, Frame, OutputEncoder, Request, RpcError,
    MAX_FRAME_BYTES, PROTOCOL,
};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use super::dispatch::{describe, handle, queue_stdin};
use super::frames::FrameReader;
use super::state::{peer_hung_up, until_true, Conn, Outbound, State};

/// Frames a connection's queue holds before producers wait (replies and events alike).
const QUEUE: usize = 64;

#[derive(PartialEq)]
enum Flow {
    Continue,
    Close,
}

pub(super) async fn connection(state: Arc<State>, stream: UnixStream) {
    // The socket is 0600 in a 0700 directory; this check also holds if someone widened them.
    let me = nix::unistd::geteuid().as_raw();
    match stream.peer_cred() {
        Ok(cred) if cred.uid() == me => {}
        other => {
            tracing::warn!(?other, "refused a connection from another user");
            return;
        }
    }
    let socket = match stream.as_fd().try_clone_to_owned() {
        Ok(fd) => Arc::new(fd),
        Err(e) => {
            tracing::warn!(error = %e, "refused a connection: cannot duplicate its socket");
            return;
        }
    };
    let conn_id = state.next_id();
    let (rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::channel(QUEUE);
    let writer = tokio::spawn(write_loop(wr, rx));
    let conn = Arc::new(Conn {
        id: conn_id,
        out: tx,
        authed: AtomicBool::new(false),
        execs: watch::channel(0).0,
        leased_tokens: Mutex::new(Vec::new()),
        socket,
    });
    let mut reader = FrameReader::new(rd, MAX_FRAME_BYTES);
    let mut inflight = JoinSet::new();
    let mut shutdown = state.shutdown.subscribe();
    loop {
        tokio::select! {
            frame = reader.next() => match frame {
                Ok(Some(frame)) => {
                    if on_frame(&state, &conn, frame, &mut inflight).await == Flow::Close {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(conn = conn_id, error = %e, "read failed");
                    break;
                }
            },
            Some(_) = inflight.join_next(), if !inflight.is_empty() => {}
            _ = until_true(&mut shutdown) => break,
        }
    }
    // No more requests. Finish the ones in flight and this connection's commands (a client
    // may send its requests and close its writing side), unless the peer is gone entirely:
    // then there is no one to report to and its commands are killed.
    let mut execs = conn.execs.subscribe();
    let finished = async {
        while inflight.join_next().await.is_some() {}
        let _ = execs.wait_for(|n| *n == 0).await;
    };
    tokio::pin!(finished);
    let mut writer = writer;
    loop {
        tokio::select! {
            _ = &mut finished => break,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                if peer_hung_up(conn.socket.as_fd()) {
                    // Dropping the queue's receiver tells every exec task of this
                    // connection that its client is gone.
                    writer.abort();
                }
            }
        }
    }
    state.conns.locked().remove(&conn_id);
    for token in conn.leased_tokens.locked().drain(..) {
        state.tokens.revoke_token(&token);
    }
    drop(conn);
    drop(reader);
    let _ = (&mut writer).await;
}

async fn on_frame(
    state: &Arc<State>,
    conn: &Arc<Conn>,
    frame: Frame,
    inflight: &mut JoinSet<()>,
) -> Flow {
    let (id, request) = match protocol::decode_frame(&frame) {
        Decoded::Blank => return Flow::Continue,
        Decoded::Error(id, e) => {
            conn.reply(id.as_ref(), &Err(e)).await;
            return Flow::Continue;
        }
        Decoded::Request(id, r) => (id, r),
    };
    drop(frame);
    let authed = conn.authed.load(Ordering::SeqCst);
    match request {
        Request::Hello(p) => {
            // Sequential on purpose: nothing after it on this connection may run before the
            // connection is authenticated.
            if let Err(e) = protocol::check_protocol(p.protocol.as_deref()) {
                conn.reply(Some(&id), &Err(e)).await;
                return Flow::Continue;
            }
            if crate::token::same(&p.token, state.tokens.host()) {
                conn.authed.store(true, Ordering::SeqCst);
                state.conns.locked().insert(conn.id, conn.out.clone());
                tracing::debug!(conn = conn.id, client = ?p.client, "authenticated");
                let result = json!({
                    "protocol": PROTOCOL,
                    "pid": std::process::id(),
                    "connectionId": conn.id,
                });
                conn.reply(Some(&id), &Ok(result)).await;
                Flow::Continue
            } else {
                let e = RpcError::new(
                    ErrorCode::Unauthenticated,
                    "host.hello: wrong token; the connection is closed",
                );
                conn.reply(Some(&id), &Err(e)).await;
                Flow::Close
            }
        }
        Request::Describe(p) => {
            let outcome =
                protocol::check_protocol(p.protocol.as_deref()).map(|()| describe(state, conn));
            conn.reply(Some(&id), &outcome).await;
            Flow::Continue
        }
        _ if !authed => {
            let e = RpcError::new(
                ErrorCode::Unauthenticated,
                format!(
                    "send host.hello with the host token (in {}) first",
                    state.opts.runtime.host_token().display()
                ),
            );
            conn.reply(Some(&id), &Err(e)).await;
            Flow::Continue
        }
        Request::ExecStdin(p) => {
            // Queued here, in arrival order, so pipelined writes reach the pipe in order.
            let rx = match queue_stdin(state, p) {
                Ok(rx) => rx,
                Err(e) => {
                    conn.reply(Some(&id), &Err(e)).await;
                    return Flow::Continue;
                }
            };
            let conn = conn.clone();
            inflight.spawn(async move {
                let outcome = match rx.await {
                    Ok(Ok(())) => Ok(json!({ "ok": true })),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(RpcError::new(
                        ErrorCode::StdinClosed,
                        "stdin: the command ended before the data was written",
                    )),
                };
                conn.reply(Some(&id), &outcome).await;
            });
            Flow::Continue
        }
        request => {
            let conn = conn.clone();
            let state = state.clone();
            inflight.spawn(async move {
                let mut after = None;
                let outcome = handle(&state, &conn, request, &mut after).await;
                conn.reply(Some(&id), &outcome).await;
                if let Some(after) = after {
                    after();
                }
            });
            Flow::Continue
        }
    }
}

/// The connection's writer: the single consumer of its queue. Output is encoded here —
/// text as a JSON string, anything else as base64 — holding back an incomplete UTF-8
/// sequence at a chunk's end until the next chunk (or the exit) decides it.
async fn write_loop(mut wr: OwnedWriteHalf, mut rx: mpsc::Receiver<Outbound>) {
    let mut buf: Vec<u8> = Vec::with_capacity(256 * 1024);
    let mut enc = OutputEncoder::default();
    while let Some(item) = rx.recv().await {
        encode_item(item, &mut buf, &mut enc);
        // Batch whatever else is ready into one write.
        while buf.len() < (1 << 20) {
            match rx.try_recv() {
                Ok(item) => encode_item(item, &mut buf, &mut enc),
                Err(_) => break,
            }
        }
        if let Err(e) = wr.write_all(&buf).await {
            tracing::debug!(error = %e, "client went away");
            break;
        }
        buf.clear();
        if buf.capacity() > (4 << 20) {
            buf.shrink_to(256 * 1024);
        }
    }
}

fn encode_item(item: Outbound, buf: &mut Vec<u8>, enc: &mut OutputEncoder) {
    match item {
        Outbound::Frame(frame) => {
            buf.extend_from_slice(&frame);
            buf.push(b'\n');
        }
        Outbound::Output {
            exec_id,
            stream,
            data,
        } => enc.output(buf, exec_id, stream.as_str(), &data),
        Outbound::Exit(exit) => {
            enc.finish(buf, exit.exec_id);
            buf.extend_from_slice(&encode_event("exit", &exit));
            buf.push(b'\n');
        }
    }
}
