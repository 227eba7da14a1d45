//! Every failure of the Lima backend names the step that failed and the log to read.

use std::path::PathBuf;

/// An error of the Lima backend.
#[derive(Debug, thiserror::Error)]
pub enum LimaError {
    #[error(
        "lima: limactl not found (looked at SANDBOX_LIMACTL, the package's limactl and PATH); \
         install Lima {min} or newer, or set SANDBOX_LIMACTL to its path",
        min = crate::MIN_LIMA_VERSION
    )]
    LimactlMissing,
    #[error(
        "lima: {path} is Lima {found}; the instance YAML needs {min} or newer",
        path = .path.display(),
        min = crate::MIN_LIMA_VERSION
    )]
    TooOld { path: PathBuf, found: String },
    #[error("lima: cannot tell the version of {path}: {output:?}", path = .path.display())]
    UnknownVersion { path: PathBuf, output: String },
    #[error(
        "lima: {path} refuses to run as root (\"limactl: must not run as the root user\"); \
         run the Lima backend as your own user",
        path = .path.display()
    )]
    Root { path: PathBuf },
    #[error("lima: {step}: no hardware virtualisation here ({detail}); read {log}", log = .log.display())]
    NoVirtualization {
        step: &'static str,
        detail: String,
        log: PathBuf,
    },
    #[error("lima: {step}: the VM image could not be downloaded ({detail}); check the network and read {log}", log = .log.display())]
    ImageDownload {
        step: &'static str,
        detail: String,
        log: PathBuf,
    },
    #[error(
        "lima: provisioning the VM {instance} failed ({detail}); read {log} on the host and \
         /var/log/cloud-init-output.log (Ubuntu) or `journalctl -u sandbox-lima-init` (NixOS) in \
         the guest (`sandbox lima console`)",
        log = .log.display()
    )]
    Provisioning {
        instance: String,
        detail: String,
        log: PathBuf,
    },
    #[error(
        "lima: the VM {instance} is degraded: it runs, but file sharing or port forwarding does \
         not work ({detail}); read {log}, then `sandbox lima recreate`",
        log = .log.display()
    )]
    Degraded {
        instance: String,
        detail: String,
        log: PathBuf,
    },
    #[error("lima: {step} failed (limactl exited with {code}): {detail}; read {log}", log = .log.display())]
    Step {
        step: &'static str,
        code: i32,
        detail: String,
        log: PathBuf,
    },
    #[error("lima: running {program}: {source}", program = .program.display())]
    Spawn {
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("lima: the working directory {path} does not exist in the VM {instance}; is the sandbox view mounted? (`sandbox lima status`)", path = .path.display())]
    Workdir { instance: String, path: PathBuf },
    #[error(
        "lima: {path} exists: a Lima default or override file would change every sandbox VM \
         (it can add mounts); the sandbox's LIMA_HOME must not have one. Remove it.",
        path = .path.display()
    )]
    GlobalOverride { path: PathBuf },
    #[error(
        "lima: LIMA_HOME {path} is too long: {len} bytes leave no room for Lima's sockets under \
         macOS's 104-byte limit (at most {max}); set backends.lima.home to a shorter path",
        path = .path.display()
    )]
    HomeTooLong {
        path: PathBuf,
        len: usize,
        max: usize,
    },
    #[error(
        "lima: the VM {instance} runs without the mounts this task needs ({missing}) and other \
         tasks are using it; it picks them up on its next start: `sandbox lima stop` when they \
         are done"
    )]
    MountsPending { instance: String, missing: String },
    #[error(
        "lima: the VM {instance} must be recreated to apply: {changes}; run `sandbox lima \
         recreate` (its disk is discarded; the views stay on the host)"
    )]
    NeedsRecreate { instance: String, changes: String },
    #[error("lima: the overrides {path}: {message}", path = .path.display())]
    Overrides { path: PathBuf, message: String },
    #[error("lima: {what} {path}: {source}", path = .path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("lima: {0}")]
    View(#[from] sandbox_git::ViewError),
    #[error("lima: the workspace {path} is not a git worktree; the Lima backend mounts a sandbox view of one", path = .path.display())]
    NotGit { path: PathBuf },
    #[error(
        "lima: virtiofs is not available on this host: {detail}. The VM's mounts must be \
         virtiofs: Lima's default for QEMU, 9p, cannot carry the views' git store layer \
         (overlayfs cannot use it as an upper layer, and its mapped-xattr model corrupts objects \
         after git gc). Install the Rust virtiofsd (`apt install virtiofsd` on Debian 13 or \
         Ubuntu 24.04, `dnf install virtiofsd`, or `cargo install virtiofsd`), then the wrapper \
         Lima must start instead (it adds --xattr, and --readonly for the shares that are not \
         writable) as ~/.local/libexec/virtiofsd-xattr, described to QEMU first in \
         ~/.local/share/qemu/vhost-user/40-virtiofsd-xattr.json: the script and the commands \
         are in docs/lima.md"
    )]
    VirtiofsUnavailable { detail: String },
    #[error("lima: the path {path} cannot be shared with the VM: {why}", path = .path.display())]
    BadPath { path: PathBuf, why: &'static str },
}

pub(crate) fn io<'a>(
    what: &'static str,
    path: &'a std::path::Path,
) -> impl FnOnce(std::io::Error) -> LimaError + 'a {
    move |source| LimaError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}
