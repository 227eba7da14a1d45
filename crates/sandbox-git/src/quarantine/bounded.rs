//! A run's writable layer bounded in size: a tmpfs the command's child mounts in its own
//! mount namespace and hands back to the host by a descriptor.

#[cfg(target_os = "linux")]
use std::path::{Path, PathBuf};

#[cfg(target_os = "linux")]
use super::error::io;
use super::error::QuarantineError;
#[cfg(target_os = "linux")]
use super::{BoundedLayer, HeldDir, UPPER_SKELETON};
use super::{LayerMount, StoreQuarantine};

impl StoreQuarantine {
    /// Puts this run's writable layer on a tmpfs of `bytes` that the command's child mounts
    /// over `<run>/layer` in its own mount namespace: writes to the git store beyond the bound
    /// fail with ENOSPC inside, and the host's memory is never the limit. Returns what the
    /// child needs; the host end of the socket stays here.
    #[cfg(not(target_os = "linux"))]
    pub fn bound_layer(&mut self, _bytes: u64) -> Result<LayerMount, QuarantineError> {
        // The child's tmpfs and the descriptor it sends back are Linux's private view.
        Err(QuarantineError::Io {
            what: "bounding the writable layer (Linux only) of",
            path: self.dir.clone(),
            source: std::io::ErrorKind::Unsupported.into(),
        })
    }

    /// [`Self::bound_layer`] on Linux.
    #[cfg(target_os = "linux")]
    pub fn bound_layer(&mut self, bytes: u64) -> Result<LayerMount, QuarantineError> {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        let dir = self.dir.join("layer");
        if self.layers.upper != dir.join("upper") {
            return Err(QuarantineError::Io {
                what: "bounding a writable layer that is not the run's own",
                path: self.layers.upper.clone(),
                source: std::io::Error::other("a persistent layer"),
            });
        }
        let (host, child) = socketpair(
            AddressFamily::Unix,
            SockType::Datagram,
            None,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        )
        .map_err(|e| io("creating the layer's socket for", &dir)(e.into()))?;
        let mut subdirs = vec![PathBuf::from("upper"), PathBuf::from("work")];
        for sub in UPPER_SKELETON {
            let mut at = PathBuf::from("upper");
            for part in Path::new(sub).components() {
                at.push(part);
                if !subdirs.contains(&at) {
                    subdirs.push(at.clone());
                }
            }
        }
        self.bounded = Some(BoundedLayer {
            socket: host,
            bytes,
            received: std::sync::OnceLock::new(),
        });
        Ok(LayerMount {
            dir,
            bytes,
            subdirs,
            socket: child,
        })
    }

    /// The host end of the bounded layer's socket, to wait on (`None`: not bounded).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn layer_socket(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.bounded
            .as_ref()
            .filter(|b| b.received.get().is_none())
            .map(|b| b.socket.as_fd())
    }

    /// Takes the bounded layer's descriptor if the child sent it (never blocks).
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn receive_layer(&self) {}

    /// [`Self::receive_layer`] on Linux.
    #[cfg(target_os = "linux")]
    pub(crate) fn receive_layer(&self) {
        use std::os::fd::AsRawFd;
        let Some(bounded) = &self.bounded else {
            return;
        };
        if bounded.received.get().is_some() {
            return;
        }
        let Ok(fds) = crate::sys::try_recv_fds::<1>(bounded.socket.as_raw_fd()) else {
            return;
        };
        for fd in fds {
            if bounded.received.get().is_some() {
                continue;
            }
            // The layer's `upper`, held by a descriptor of its own (the tmpfs root's
            // descriptor closes at the end of this block).
            let upper = PathBuf::from(format!("/proc/self/fd/{}/upper", fd.as_raw_fd()));
            match HeldDir::open(&upper) {
                Ok(held) => {
                    let _ = bounded.received.set(held);
                }
                Err(e) => tracing::warn!(error = %e, "git quarantine: the bounded layer"),
            }
        }
    }

    /// Whether the bounded layer is (nearly) full now: less free than one page per MiB of
    /// the bound, or none at all.
    pub(super) fn layer_full(&self) -> Option<u64> {
        let bounded = self.bounded.as_ref()?;
        let held = bounded.received.get()?;
        let st = nix::sys::statvfs::fstatvfs(&held._fd).ok()?;
        let free = st.blocks_available() as u64 * st.fragment_size() as u64;
        (free < (bounded.bytes >> 8).max(64 << 10)).then_some(bounded.bytes)
    }
}
