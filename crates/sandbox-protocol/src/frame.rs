//! Newline-delimited frames with a hard size bound.
//!
//! [`FrameDecoder`] is a sans-IO state machine: it is fed bytes and yields frames, so the
//! fuzz target and the property tests drive exactly the code the daemon runs (the daemon's
//! async reader, in `sandbox-service`, only feeds it). A frame longer than the limit is
//! *discarded while it streams past* — its bytes are counted, never kept — and reported as
//! [`Frame::TooLarge`] once its newline arrives, so a peer sending an endless line costs the
//! daemon at most `max_frame` bytes of memory and still gets an answer.

/// One decoded unit of input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// The bytes of one line, without its `\n` (and without a trailing `\r`).
    Line(Vec<u8>),
    /// A line longer than the limit; `len` is its length in bytes (without the newline).
    TooLarge { len: usize },
}

/// Splits a byte stream into frames of at most `max_frame` bytes.
#[derive(Debug)]
pub struct FrameDecoder {
    max_frame: usize,
    /// The current line so far (never longer than `max_frame`).
    line: Vec<u8>,
    /// Set while skipping an over-long line: how many bytes it had so far.
    discarding: Option<usize>,
}

impl FrameDecoder {
    pub fn new(max_frame: usize) -> Self {
        FrameDecoder {
            max_frame,
            line: Vec::new(),
            discarding: None,
        }
    }

    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// Bytes currently held for an incomplete line. Never exceeds `max_frame`.
    pub fn buffered(&self) -> usize {
        self.line.len()
    }

    /// Consumes bytes from the front of `input` until one frame is complete or `input` is
    /// used up. Returns how many bytes were consumed and the frame, if one completed.
    pub fn decode(&mut self, input: &[u8]) -> (usize, Option<Frame>) {
        match memchr::memchr(b'\n', input) {
            Some(i) => {
                let frame = self.finish_line(&input[..i]);
                (i + 1, Some(frame))
            }
            None => {
                self.absorb(input);
                (input.len(), None)
            }
        }
    }

    /// The end of input: an unterminated last line still counts as a frame.
    pub fn finish(&mut self) -> Option<Frame> {
        if self.discarding.is_none() && self.line.is_empty() {
            return None;
        }
        Some(self.finish_line(&[]))
    }

    fn absorb(&mut self, part: &[u8]) {
        if let Some(len) = &mut self.discarding {
            *len = len.saturating_add(part.len());
            return;
        }
        if self.line.len() + part.len() > self.max_frame {
            self.discarding = Some(self.line.len() + part.len());
            // Give the memory back: the point of discarding is not to hold it.
            self.line = Vec::new();
        } else {
            self.line.extend_from_slice(part);
        }
    }

    fn finish_line(&mut self, tail: &[u8]) -> Frame {
        self.absorb(tail);
        if let Some(len) = self.discarding.take() {
            return Frame::TooLarge { len };
        }
        let mut line = std::mem::take(&mut self.line);
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if line.capacity() > 1 << 20 {
            // Keep a big request's buffer only as long as the request itself.
            line.shrink_to_fit();
        }
        Frame::Line(line)
    }
}

/// How much the reader asks its source for at a time.
const READ_CHUNK: usize = 64 * 1024;

/// Reads frames from a blocking reader with a [`FrameDecoder`] (the client and the `--stdio`
/// bridge).
pub struct BlockingFrameReader<R> {
    inner: R,
    decoder: FrameDecoder,
    buf: Vec<u8>,
    /// Unread bytes are `buf[start..end]`.
    start: usize,
    end: usize,
    eof: bool,
}

impl<R: std::io::Read> BlockingFrameReader<R> {
    pub fn new(inner: R, max_frame: usize) -> Self {
        BlockingFrameReader {
            inner,
            decoder: FrameDecoder::new(max_frame),
            buf: vec![0; READ_CHUNK],
            start: 0,
            end: 0,
            eof: false,
        }
    }

    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The next frame; `None` at the end of the stream.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> std::io::Result<Option<Frame>> {
        loop {
            if self.start < self.end {
                let (used, frame) = self.decoder.decode(&self.buf[self.start..self.end]);
                self.start += used;
                if frame.is_some() {
                    return Ok(frame);
                }
            }
            if self.eof {
                return Ok(self.decoder.finish());
            }
            self.start = 0;
            self.end = 0;
            match self.inner.read(&mut self.buf) {
                Ok(0) => self.eof = true,
                Ok(n) => self.end = n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}
