//! What a VM box is made of beyond its [`Policy`](sandbox_policy::Policy): an image, sizes,
//! the host directories shown in the guest, a network allow-list and the guest's own
//! environment. Backend-neutral data, handed to a VM backend's `prepare` through
//! [`BackendOptions::vm`](super::BackendOptions::vm); the backend checks it (a BoxLite box:
//! `sandbox_boxlite::spec`) and builds the box from it.
//!
//! The workspace and whether the network is blocked are the policy's (`workspace.root`,
//! `net`), not repeated here.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// One VM box, as asked for (nothing checked yet).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmRequest {
    /// The box's name: the VM runtime keeps a box under it (with its disk) across daemons.
    pub name: String,
    /// A registry reference for the root file system.
    pub image: Option<String>,
    /// An OCI image layout directory instead of `image`.
    pub rootfs: Option<PathBuf>,
    pub cpus: Option<u64>,
    pub memory_mib: Option<u64>,
    pub disk_size_gb: Option<u64>,
    /// Host directories shown in the guest, besides the workspace (always at its own path).
    pub mounts: Vec<VmMount>,
    /// The only hosts (names, addresses, CIDR blocks) the guest may reach; empty: all.
    pub allow_net: Vec<String>,
    /// Variables of the guest (its commands get nothing of this host's environment).
    pub env: BTreeMap<String, String>,
    /// The repository's git data is writable from the guest (`--unprotected-git`).
    pub unprotected_git: bool,
}

/// One host directory shown in a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmMount {
    pub host: PathBuf,
    /// Where it appears in the guest.
    pub guest: PathBuf,
    pub read_only: bool,
}
