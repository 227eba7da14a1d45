//! The setup report: a close-on-exec pipe through which the child tells its parent which step
//! of its setup failed (or that `execve` did), so that the parent's error names it.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::error::ExecError;
use crate::setup::{SetupFailure, EXEC_FAILED};
use crate::sys;

/// A raw report as the error it stands for, and the setup failure when it was one (not
/// the exec's own).
pub(crate) fn reported_error(
    reported: Option<(u32, i32, u32)>,
) -> (std::io::Error, Option<SetupFailure>) {
    match reported {
        None => (std::io::Error::other("the child exited before exec"), None),
        Some((EXEC_FAILED, errno, _)) => (std::io::Error::from_raw_os_error(errno), None),
        Some((step, errno, detail)) => (
            std::io::Error::from_raw_os_error(errno),
            Some(SetupFailure::from_raw(step, errno, detail)),
        ),
    }
}

/// A CLOEXEC pipe through which the child says "my setup failed", so that a Landlock failure
/// (exit 125) is never mistaken for "command not found" (127) with the same errno.
pub(crate) struct SetupReport {
    read: OwnedFd,
    write: OwnedFd,
}

impl SetupReport {
    pub(crate) fn new() -> Result<Self, ExecError> {
        let (read, write) = sys::cloexec_pipe(false)
            .map_err(|e| ExecError::io("creating the setup report pipe", e.into()))?;
        Ok(SetupReport { read, write })
    }

    pub(crate) fn write_fd(&self) -> RawFd {
        self.write.as_raw_fd()
    }

    /// Child side: reports `failure` to the parent and returns the error that makes the
    /// spawn fail. Async-signal safe.
    pub(crate) fn fail(fd: RawFd, failure: SetupFailure) -> std::io::Error {
        Self::send(
            fd,
            failure.step as u32,
            failure.errno as i32,
            failure.detail,
        );
        std::io::Error::from_raw_os_error(failure.errno as i32)
    }

    /// Child side: writes one report (a step number, an errno, the step's item). Async-signal
    /// safe.
    pub(crate) fn send(fd: RawFd, step: u32, errno: i32, detail: u32) {
        let mut bytes = [0u8; 12];
        bytes[..4].copy_from_slice(&step.to_ne_bytes());
        bytes[4..8].copy_from_slice(&errno.to_ne_bytes());
        bytes[8..].copy_from_slice(&detail.to_ne_bytes());
        // `fd` is open in the child (it was inherited across fork and is closed by exec only).
        // 12 bytes are below PIPE_BUF, so the write is atomic.
        let _ = sys::write(fd, &bytes);
    }

    /// Parent side, after spawn returned: closes our write end, reads what the child sent,
    /// with the step as sent (a child may send [`EXEC_FAILED`]).
    pub(crate) fn finish_raw(self) -> Option<(u32, i32, u32)> {
        let SetupReport { read, write } = self;
        drop(write);
        let mut bytes = [0u8; 12];
        // The write end is closed in the parent and closed by exec (or exit) in the child, so
        // this read returns 0 or 12 bytes without blocking once spawn has returned.
        let n = nix::unistd::read(read.as_raw_fd(), &mut bytes).unwrap_or(0);
        let word = |i: usize| -> [u8; 4] { [bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]] };
        (n == 12).then(|| {
            (
                u32::from_ne_bytes(word(0)),
                i32::from_ne_bytes(word(4)),
                u32::from_ne_bytes(word(8)),
            )
        })
    }
}
