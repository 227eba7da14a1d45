//! The BoxLite backend's errors: each says what failed and, for a box, where its logs are.

use std::path::PathBuf;
use std::time::Duration;

use crate::runtime_files::FileCheck;
use crate::spec::SpecError;

/// Where to look when a box fails: the runtime's log directory and, once BoxLite has given the
/// box a directory, the box's own: the shim's log directory, the shim's stderr (where libkrun
/// reports KVM errors) and the guest console.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LogPaths {
    pub runtime: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shim: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shim_stderr: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub console: Option<PathBuf>,
}

impl std::fmt::Display for LogPaths {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "logs: {}", self.runtime.display())?;
        for p in [&self.shim, &self.shim_stderr, &self.console]
            .into_iter()
            .flatten()
        {
            write!(f, ", {}", p.display())?;
        }
        Ok(())
    }
}

/// Problems with the runtime files, one per file.
#[derive(Debug, Clone)]
pub struct FileProblems(pub Vec<FileCheck>);

impl std::fmt::Display for FileProblems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, c) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: ", c.name)?;
            match &c.status {
                crate::runtime_files::FileStatus::Ok { .. } => f.write_str("ok")?,
                crate::runtime_files::FileStatus::Patched { .. } => f.write_str("patched")?,
                crate::runtime_files::FileStatus::Missing => f.write_str("missing")?,
                crate::runtime_files::FileStatus::Mismatch { sha256, expected } => {
                    write!(f, "sha256 {sha256}, expected {expected}")?
                }
                crate::runtime_files::FileStatus::NotExecutable => f.write_str("not executable")?,
                crate::runtime_files::FileStatus::Unreadable { error } => f.write_str(error)?,
            }
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BoxliteError {
    #[error(
        "boxlite: the BoxLite engine is not in this build: build sandbox with the cargo feature \
         `boxlite` (`cargo build -p sandbox-cli --features boxlite`, see docs/boxlite.md) or use \
         the flake's sandbox-boxlite package"
    )]
    NotInBuild,
    #[error(
        "boxlite: runtime files not found: set SANDBOX_BOXLITE_RUNTIME to the directory `cargo \
         xtask boxlite-runtime` writes (target/boxlite-runtime), or use a build that has it built in"
    )]
    RuntimeNotFound,
    #[error(
        "boxlite: the runtime files in {dir} do not match BoxLite {version}: {problems}; run \
         `cargo xtask boxlite-runtime` again (or fix SANDBOX_BOXLITE_RUNTIME)"
    )]
    RuntimeFiles {
        dir: PathBuf,
        version: &'static str,
        problems: FileProblems,
    },
    #[error(
        "boxlite: the runtime directory {home} is in use by another BoxLite runtime (BoxLite \
         allows one per home; the sandbox daemon owns it): {detail}"
    )]
    RuntimeBusy { home: PathBuf, detail: String },
    #[error("boxlite: {0}")]
    Spec(#[from] SpecError),
    #[error(
        "boxlite: box {name}: no {device}: this host offers no KVM, so no microVM can boot \
         (load the kvm module, or run where hardware virtualisation is exposed); {logs}"
    )]
    NoKvm {
        name: String,
        device: PathBuf,
        logs: Box<LogPaths>,
    },
    #[error("boxlite: box {name}: {device} cannot be opened: {error}; add yourself to the kvm group; {logs}")]
    KvmDenied {
        name: String,
        device: PathBuf,
        error: String,
        logs: Box<LogPaths>,
    },
    #[error(
        "boxlite: box {name}: KVM is present but cannot boot the runtime's guest kernel \
         (a nested or paravirtualised KVM, such as kvm-pvm, that runs no stock guest): {detail}; \
         {logs}"
    )]
    KvmCannotBoot {
        name: String,
        detail: String,
        logs: Box<LogPaths>,
    },
    #[error("boxlite: box {name}: image missing: {detail}; {logs}")]
    ImageMissing {
        name: String,
        detail: String,
        logs: Box<LogPaths>,
    },
    #[error(
        "boxlite: box {name}: the guest was not ready after {}; {logs}",
        humanize(*.after)
    )]
    GuestNotReady {
        name: String,
        after: Duration,
        logs: Box<LogPaths>,
    },
    /// libkrun ran out of interrupts for the box's devices (x86_64: one per virtio-mmio
    /// device, from a small fixed range).
    #[error(
        "boxlite: box {name}: libkrun could not build the VM: no interrupt left for a device \
         ({detail}); the box asked for {devices}, and libkrun on x86_64 has interrupts for \
         {fit} of a VM's devices; give it fewer mounts, or block the network; {logs}"
    )]
    DevicesExhausted {
        name: String,
        devices: Devices,
        fit: usize,
        detail: String,
        logs: Box<LogPaths>,
    },
    /// libkrun refused to build the VM for another reason of its own (not KVM's).
    #[error("boxlite: box {name}: libkrun could not build the VM: {detail}; {logs}")]
    VmBuild {
        name: String,
        detail: String,
        logs: Box<LogPaths>,
    },
    #[error("boxlite: box {name}: {what}: {detail}; {logs}")]
    Engine {
        name: String,
        what: &'static str,
        detail: String,
        logs: Box<LogPaths>,
    },
    #[error("boxlite: {what}: {detail}")]
    Runtime { what: &'static str, detail: String },
}

/// The virtio devices a box asks libkrun for: BoxLite's own, a virtio-fs device per share,
/// and the network's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Devices {
    pub shares: usize,
    pub network: bool,
}

impl Devices {
    /// BoxLite 0.10.8's own: its shared directory, two disks, vsock, the console, entropy and
    /// the memory balloon.
    pub const BOXLITES: usize = 7;

    pub fn total(&self) -> usize {
        Self::BOXLITES + self.shares + usize::from(self.network)
    }
}

impl std::fmt::Display for Devices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} virtio devices (BoxLite's {}, {} share{}{})",
            self.total(),
            Self::BOXLITES,
            self.shares,
            if self.shares == 1 { "" } else { "s" },
            if self.network { ", the network" } else { "" }
        )
    }
}

fn humanize(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

impl BoxliteError {
    /// The box's log paths, when the error is about a box.
    pub fn logs(&self) -> Option<&LogPaths> {
        match self {
            BoxliteError::NoKvm { logs, .. }
            | BoxliteError::KvmDenied { logs, .. }
            | BoxliteError::KvmCannotBoot { logs, .. }
            | BoxliteError::ImageMissing { logs, .. }
            | BoxliteError::GuestNotReady { logs, .. }
            | BoxliteError::DevicesExhausted { logs, .. }
            | BoxliteError::VmBuild { logs, .. }
            | BoxliteError::Engine { logs, .. } => Some(logs),
            _ => None,
        }
    }

    /// A short stable name for the kind of failure (`--json`, protocol `data.reason`).
    pub fn reason(&self) -> &'static str {
        match self {
            BoxliteError::NotInBuild => "notInBuild",
            BoxliteError::RuntimeNotFound => "runtimeNotFound",
            BoxliteError::RuntimeFiles { .. } => "runtimeFilesMismatch",
            BoxliteError::RuntimeBusy { .. } => "runtimeBusy",
            BoxliteError::Spec(SpecError::LayoutMissing { .. }) => "imageMissing",
            BoxliteError::Spec(_) => "invalidBox",
            BoxliteError::NoKvm { .. } => "noKvm",
            BoxliteError::KvmDenied { .. } => "kvmDenied",
            BoxliteError::KvmCannotBoot { .. } => "kvmCannotBoot",
            BoxliteError::ImageMissing { .. } => "imageMissing",
            BoxliteError::GuestNotReady { .. } => "guestNotReady",
            BoxliteError::DevicesExhausted { .. } => "devicesExhausted",
            BoxliteError::VmBuild { .. } => "vmBuild",
            BoxliteError::Engine { .. } | BoxliteError::Runtime { .. } => "engine",
        }
    }
}

/// Why a box could not be prepared (`BoxliteBackend::prepare`, the daemon's `box.create`).
/// Each kind is told apart by the caller (the daemon's protocol codes); nothing of the box is
/// left in BoxLite unless the failure says it was kept from before.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The box's description is refused: nothing was created.
    #[error("boxlite: {0}")]
    Spec(#[from] SpecError),
    #[error("two mounts at {} in the box", guest.display())]
    TwoMounts { guest: PathBuf },
    #[error("boxlite: reading the git layout of {}: {source}", workdir.display())]
    GitLayout {
        workdir: PathBuf,
        #[source]
        source: sandbox_policy::PolicyError,
    },
    /// The box's git directory (where its commits come back) could not be laid out.
    #[error("boxlite: {0}")]
    BoxGit(#[source] sandbox_git::quarantine::QuarantineError),
    /// The directory of the boxes' git directories could not be created.
    #[error("creating {}: {source}", dir.display())]
    StateDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A mount would show BoxLite's own home (its database, every box's disk) in the box.
    #[error("the mount {} reaches BoxLite's home {}", mount.display(), home.display())]
    ReachesHome { mount: PathBuf, home: PathBuf },
    /// The runtime or the box failed, with its kind and log paths.
    #[error(transparent)]
    Engine(#[from] BoxliteError),
    /// BoxLite keeps a box of this name from an earlier daemon, made from another image.
    #[error(
        "BoxLite keeps a box named {name:?} made from {kept}, not {wanted}; box.remove it \
         first or use another name"
    )]
    KeptOther {
        name: String,
        kept: String,
        wanted: String,
    },
    /// BoxLite's record of a kept box could not be read.
    #[error("boxlite: {0}")]
    KeptUnreadable(String),
    /// The backend was opened without a box's description (only `box.create` prepares one).
    #[error(
        "boxlite: no box description (image, mounts, sizes) was given: BoxLite boxes are made \
         by the daemon's box.create"
    )]
    NoRequest,
    /// Preparing drives the engine on the daemon's async runtime, from one of its blocking
    /// threads; there was none.
    #[error("boxlite: preparing a box needs the daemon's async runtime: {0}")]
    NoRuntime(String),
}
