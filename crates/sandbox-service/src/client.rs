//! A blocking client for the control socket: what `sandbox ps`, `sandbox run` (for its hook
//! token), the tests and the benchmark use. Replies are matched by id; events that arrive
//! while waiting for a reply are kept, in order, for [`Client::next_event`].

use std::collections::VecDeque;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::runtime::{RuntimeError, RuntimePaths};
use sandbox_protocol::{
    BlockingFrameReader, Frame, HelloParams, Id, Incoming, Request, RpcError, MAX_FRAME_BYTES,
    PROTOCOL,
};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "no sandbox daemon is running ({socket}: {source}); start one with `sandbox serve`",
        socket = .socket.display()
    )]
    NoDaemon {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("daemon connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("the daemon answered: {0}")]
    Rpc(#[from] RpcError),
    #[error("the daemon sent something unexpected: {0}")]
    Protocol(String),
    #[error("the daemon closed the connection")]
    Closed,
}

pub struct Client {
    stream: UnixStream,
    reader: BlockingFrameReader<UnixStream>,
    next_id: u64,
    events: VecDeque<Incoming>,
    replies: VecDeque<Incoming>,
}

impl Client {
    /// Connects without authenticating (only `host.describe` and `host.hello` work then).
    pub fn connect(socket: &Path) -> Result<Client, ClientError> {
        let stream = UnixStream::connect(socket).map_err(|source| ClientError::NoDaemon {
            socket: socket.to_path_buf(),
            source,
        })?;
        let reader = BlockingFrameReader::new(stream.try_clone()?, MAX_FRAME_BYTES);
        Ok(Client {
            stream,
            reader,
            next_id: 1,
            events: VecDeque::new(),
            replies: VecDeque::new(),
        })
    }

    /// Connects and authenticates with the host token from the runtime directory.
    pub fn connect_authenticated(paths: &RuntimePaths, name: &str) -> Result<Client, ClientError> {
        let mut client = Client::connect(&paths.socket())?;
        let token = paths.read_host_token()?;
        client.hello(&token, name)?;
        Ok(client)
    }

    pub fn hello(&mut self, token: &str, name: &str) -> Result<Value, ClientError> {
        self.call(&Request::Hello(HelloParams {
            token: token.to_string(),
            protocol: Some(PROTOCOL.to_string()),
            client: Some(name.to_string()),
        }))
    }

    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// Sends a request; returns its id. Does not wait.
    pub fn send(&mut self, request: &Request) -> Result<Id, ClientError> {
        let id = Id::Num(self.next_id);
        self.next_id += 1;
        let mut frame = request.encode(&id);
        frame.push(b'\n');
        self.stream.write_all(&frame)?;
        Ok(id)
    }

    /// Sends raw bytes as they are (tests of malformed input).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream.write_all(bytes)?;
        Ok(())
    }

    /// Sends a request and waits for its reply.
    pub fn call(&mut self, request: &Request) -> Result<Value, ClientError> {
        let id = self.send(request)?;
        self.wait_reply(&id)
    }

    /// Waits for the reply to `id`; events and other replies that come first are kept.
    pub fn wait_reply(&mut self, id: &Id) -> Result<Value, ClientError> {
        if let Some(reply) = self
            .replies
            .iter()
            .position(|r| r.id.as_ref().and_then(|i| i.as_ref()) == Some(id))
            .and_then(|i| self.replies.remove(i))
        {
            return into_result(reply);
        }
        loop {
            let frame = self.read()?;
            if !frame.is_reply() {
                self.events.push_back(frame);
                continue;
            }
            if frame.id.as_ref().and_then(|i| i.as_ref()) == Some(id) {
                return into_result(frame);
            }
            self.replies.push_back(frame);
        }
    }

    /// The next frame of any kind, in arrival order (kept ones first).
    pub fn next_frame(&mut self) -> Result<Incoming, ClientError> {
        if let Some(e) = self.events.pop_front() {
            return Ok(e);
        }
        if let Some(r) = self.replies.pop_front() {
            return Ok(r);
        }
        self.read()
    }

    /// The next event, keeping replies that come first for [`Client::wait_reply`].
    pub fn next_event(&mut self) -> Result<Incoming, ClientError> {
        if let Some(e) = self.events.pop_front() {
            return Ok(e);
        }
        loop {
            let frame = self.read()?;
            if frame.is_reply() {
                self.replies.push_back(frame);
            } else {
                return Ok(frame);
            }
        }
    }

    fn read(&mut self) -> Result<Incoming, ClientError> {
        match self.reader.next()? {
            None => Err(ClientError::Closed),
            Some(Frame::TooLarge { len }) => Err(ClientError::Protocol(format!(
                "a frame of {len} bytes, over the limit"
            ))),
            Some(Frame::Line(line)) => serde_json::from_slice(&line).map_err(|e| {
                ClientError::Protocol(format!("{e}: {}", String::from_utf8_lossy(&line)))
            }),
        }
    }
}

fn into_result(frame: Incoming) -> Result<Value, ClientError> {
    match (frame.result, frame.error) {
        (_, Some(e)) => Err(ClientError::Rpc(e)),
        (Some(v), None) => Ok(v),
        (None, None) => Err(ClientError::Protocol(
            "a reply without result or error".into(),
        )),
    }
}
