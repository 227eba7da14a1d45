//! Child output as two paths with different promises:
//!
//! * the **lossless** path: a bounded channel of chunks. When it is full the reader stops
//!   reading the pipe, the pipe fills, and the child blocks in `write` — backpressure all the
//!   way down. Nothing is dropped, and memory is bounded by `capacity × chunk size`.
//! * the **observer** path: a broadcast channel for live display. A slow observer misses
//!   chunks (it is told how many) and never slows the lossless path.

use std::os::fd::OwnedFd;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{broadcast, mpsc};

/// Which of the child's streams a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamKind {
    Stdout,
    Stderr,
}

impl StreamKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StreamKind::Stdout => "stdout",
            StreamKind::Stderr => "stderr",
        }
    }
}

/// One read from a child's pipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputChunk {
    pub stream: StreamKind,
    pub data: Bytes,
}

/// Limits of the output paths.
#[derive(Debug, Clone, Copy)]
pub struct OutputLimits {
    /// Chunks buffered on the lossless path before the reader waits.
    pub capacity: usize,
    /// Largest single read, in bytes.
    pub chunk_size: usize,
    /// Chunks an observer may fall behind before it starts missing some.
    pub observer_capacity: usize,
}

impl Default for OutputLimits {
    fn default() -> Self {
        OutputLimits {
            capacity: 16,
            chunk_size: 64 * 1024,
            observer_capacity: 64,
        }
    }
}

impl OutputLimits {
    /// The most bytes the lossless path can hold at once (both streams).
    pub fn max_buffered_bytes(&self) -> usize {
        // Each stream's reader may hold one chunk while waiting for a free slot.
        (self.capacity + 2) * self.chunk_size
    }
}

/// The receiving end of the lossless path.
pub type OutputReceiver = mpsc::Receiver<OutputChunk>;

/// Handle for subscribing to the lossy observer path.
#[derive(Clone)]
pub struct OutputObserver {
    tx: broadcast::Sender<OutputChunk>,
}

impl OutputObserver {
    pub(crate) fn new(capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(capacity.max(1));
        OutputObserver { tx }
    }

    /// A new live view. `recv` returns `Err(Lagged(n))` when `n` chunks were skipped.
    pub fn subscribe(&self) -> broadcast::Receiver<OutputChunk> {
        self.tx.subscribe()
    }

    fn publish(&self, chunk: &OutputChunk) {
        if self.tx.receiver_count() > 0 {
            // Lossy by design: an error only means no one is listening.
            let _ = self.tx.send(chunk.clone());
        }
    }
}

/// Grows a pipe's kernel buffer so each read moves more bytes (fewer syscalls per GiB).
/// Best effort: the limit is `/proc/sys/fs/pipe-max-size`.
pub(crate) fn enlarge_pipe(fd: &OwnedFd, bytes: usize) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // Failure leaves the pipe as it was.
        let _ = crate::sys::set_pipe_size(fd.as_raw_fd(), bytes as libc::c_int);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (fd, bytes);
}

/// Reads `source` to EOF, sending every byte to the lossless channel (waiting when it is
/// full) and offering a copy to observers. If the lossless receiver is gone, keeps draining
/// into observers so the child never blocks on a pipe nobody reads.
pub(crate) async fn pump<R: AsyncRead + Unpin>(
    mut source: R,
    stream: StreamKind,
    chunk_size: usize,
    lossless: mpsc::Sender<OutputChunk>,
    observer: OutputObserver,
) {
    let mut buf = BytesMut::with_capacity(chunk_size);
    let mut receiver_gone = false;
    loop {
        if buf.capacity() < chunk_size / 4 {
            buf = BytesMut::with_capacity(chunk_size);
        }
        buf.clear();
        match source.read_buf(&mut buf).await {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::debug!(stream = stream.as_str(), error = %e, "output read failed");
                break;
            }
        }
        let chunk = OutputChunk {
            stream,
            data: buf.split().freeze(),
        };
        observer.publish(&chunk);
        if !receiver_gone && lossless.send(chunk).await.is_err() {
            receiver_gone = true;
        }
    }
}
