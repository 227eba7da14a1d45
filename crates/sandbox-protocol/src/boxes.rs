//! The box methods (`box.create`, `box.start`, `box.stop`, `box.remove`) and the `boxState`
//! event of a box's lifecycle.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `box.create`: a name, a backend and the Policy fields, fixed for the box's life.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BoxCreateParams {
    pub name: String,
    /// `native` (default), `host`, or any backend this build can prepare.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// The task's worktree: the writable workspace of every command in the box.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_read: Vec<PathBuf>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_write: Vec<PathBuf>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub block_net: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_ports: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_domains: Vec<String>,
    /// `--publish [HOST_ADDR:]HOST_PORT[:INNER_PORT]`: the box's servers published to the
    /// daemon's host (native backend; a connection goes to the newest exec whose namespace
    /// accepts it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub publish: Vec<String>,
    /// `--credential NAME`: API credentials the box's proxy adds (secrets read by the
    /// daemon on its host; the box holds placeholders).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<String>,
    /// Variables set in every command of the box.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Default per-exec timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unprotected_git: bool,
    /// `--allow-nested-git`: keep the repositories the box's commands create in the
    /// worktree (a nested `.git`, a bare repository) instead of setting them aside.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_nested_git: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_degraded: bool,
    /// Image-based backends (boxlite): a registry reference for the box's root file system.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Image-based backends: an OCI image layout directory instead of `image` (no registry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<PathBuf>,
    /// Virtual CPUs and memory of a VM box; for the backends on this machine's kernel
    /// (native, nono, custom) the resource limits of each command: `cpus` whole CPUs
    /// (`cpuMillis` for a fraction), `memoryMib` its memory (0: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// The CPU limit in thousandths of a CPU (500: half a core; 0: no limit), over `cpus`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<u64>,
    /// Processes and threads each command may have at once (0: no limit; default the
    /// configuration's, else 4096). Backends on this machine's kernel only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_size_gb: Option<u64>,
    /// VM backends: host directories shown in the box (the workdir is always mounted at its
    /// own path).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<MountParam>,
    /// VM backends: the only hosts (names or CIDR blocks) the box may reach; empty: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_net: Vec<String>,
}

/// One `box.create` mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MountParam {
    pub host: PathBuf,
    /// Where it appears in the box; default: `host`, the same path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BoxNameParams {
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BoxStopParams {
    pub name: String,
    /// `box.stop`: SIGKILL at once instead of SIGTERM and a grace period. `box.remove`: stop
    /// running commands first instead of refusing.
    #[serde(default)]
    pub force: bool,
}

/// A `boxState` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BoxStateEvent {
    pub box_id: String,
    pub name: String,
    pub state: BoxState,
    /// Since the request that caused the event began (`box.create`: since it was received).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_ms: Option<u64>,
    /// `creating` only: the named step of preparing the backend (a VM's "starting the VM").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// `creating` only: `started`, `done` or `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_state: Option<String>,
    /// A `done` step's own duration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_ms: Option<u64>,
    /// Why a `failed` step failed (the `box.create` error that follows says it too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_error: Option<String>,
}

/// A box's lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum BoxState {
    /// Only in `boxState` events, while `box.create` prepares the backend step by step; a box
    /// is listed from `created` on.
    Creating,
    Created,
    Running,
    Stopping,
    Stopped,
    Removed,
}

impl BoxState {
    pub fn as_str(self) -> &'static str {
        match self {
            BoxState::Creating => "creating",
            BoxState::Created => "created",
            BoxState::Running => "running",
            BoxState::Stopping => "stopping",
            BoxState::Stopped => "stopped",
            BoxState::Removed => "removed",
        }
    }
}
