//! The Lima VM backend: one VM per project, on sandbox views, driven through a pinned
//! `limactl` with a private `LIMA_HOME`.
//!
//! The mechanism is split so that everything but the last step is testable anywhere:
//!
//! - [`mounts`]: the project's mount list (each view, its admin dir and git store layer
//!   writable; the common dir read-only; nothing else) — pure;
//! - [`provision`]: the idempotent guest provisioning script and its sentinel — pure;
//! - [`yaml`]: the instance YAML from the mounts and the user's overrides, and which changes
//!   need a recreate — pure;
//! - [`progress`]: Lima's JSON log lines, classified into the seed's named steps and failures
//!   — pure;
//! - [`virtiofs`]: whether Lima can serve virtiofs mounts on a Linux host (the virtiofsd it
//!   would start), judged before a VM is made;
//! - [`limactl`]: the command line of every lifecycle step (pure) and running them;
//! - [`vm`]: a project's VM — state, create, start, stop, delete, the provisioning check;
//! - [`backend`]: the backend seam (`sandbox_host::Backend`): a view and its watcher, the VM,
//!   and each command through `limactl shell --workdir <view> <instance> …` with the view's
//!   git store quarantine read back on the host.

pub mod backend;
mod error;
pub mod limactl;
pub mod mounts;
pub mod progress;
pub mod provision;
pub mod virtiofs;
pub mod vm;
pub mod yaml;

pub use backend::{LimaBackend, LimaProvider, LimaSettings, Plan, Project};
pub use error::LimaError;
pub use limactl::Limactl;
pub use vm::{Vm, VmEvent, VmState};

/// The oldest Lima the generated YAML and the command lines work with (`minimumLimaVersion`,
/// `--log-format json`, `limactl list --format json`).
pub const MIN_LIMA_VERSION: &str = "2.0.0";

/// The address the guest reaches the host's loopback at (Lima's user-mode network).
pub const HOST_ADDRESS: &str = "host.lima.internal";
