//! The real Lima, here: `limactl` built from Lima's Go module at the pinned release
//! ([`install`], `cargo xtask lima-install`), a Debian guest image made offline with mmdebstrap
//! ([`image`], `cargo xtask lima-image`), and the Lima backend end to end against them — a VM
//! booted by `limactl` under QEMU's TCG, `sandbox run --backend lima` in a linked worktree
//! ([`e2e`], `cargo xtask lima-test`). docs/lima.md says what each proves.
//!
//! Both the build and the image are cached by their inputs outside the work tree
//! ([`cache_base`]), so a fresh clone on the same machine (CI's) reuses them.

pub mod e2e;
pub mod image;
pub mod install;

use std::path::PathBuf;

/// Where the built Lima and the images are kept: `/var/cache/sandbox-lima` for root (CI: it
/// outlives the clone, and the unprivileged user `limactl` runs as can read it), else
/// `$XDG_CACHE_HOME/sandbox-lima` (`~/.cache/sandbox-lima`). `SANDBOX_LIMA_CACHE` overrides.
pub fn cache_base() -> PathBuf {
    if let Some(dir) = std::env::var_os("SANDBOX_LIMA_CACHE").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    if is_root() {
        return PathBuf::from("/var/cache/sandbox-lima");
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    cache.join("sandbox-lima")
}

/// Whether this process runs as root (`limactl` refuses to: `cmd/limactl/main.go`).
pub fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
}

/// Lima's name for this machine's architecture, and Go's.
pub fn arches() -> (&'static str, &'static str) {
    if cfg!(target_arch = "aarch64") {
        ("aarch64", "arm64")
    } else {
        ("x86_64", "amd64")
    }
}
