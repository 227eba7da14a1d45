//! The daemon's frame reader: the protocol crate's sans-IO [`FrameDecoder`] fed from an async
//! socket. It lives here, not in `sandbox-protocol`, so that the protocol crate stays free of
//! Tokio for clients that do not want it.

use bytes::{Buf, BytesMut};
use sandbox_protocol::{Frame, FrameDecoder};
use tokio::io::{AsyncRead, AsyncReadExt};

const READ_CHUNK: usize = 64 * 1024;

/// Reads frames from an async byte stream with a [`FrameDecoder`].
pub(super) struct FrameReader<R> {
    inner: R,
    decoder: FrameDecoder,
    buf: BytesMut,
    eof: bool,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub(super) fn new(inner: R, max_frame: usize) -> Self {
        FrameReader {
            inner,
            decoder: FrameDecoder::new(max_frame),
            buf: BytesMut::with_capacity(READ_CHUNK),
            eof: false,
        }
    }

    /// The next frame; `None` at the end of the stream. Cancel-safe: bytes already read stay
    /// buffered for the next call.
    pub(super) async fn next(&mut self) -> std::io::Result<Option<Frame>> {
        loop {
            if !self.buf.is_empty() {
                let (used, frame) = self.decoder.decode(&self.buf);
                self.buf.advance(used);
                if frame.is_some() {
                    return Ok(frame);
                }
            }
            if self.eof {
                return Ok(self.decoder.finish());
            }
            self.buf.reserve(READ_CHUNK);
            if self.inner.read_buf(&mut self.buf).await? == 0 {
                self.eof = true;
            }
        }
    }
}
