//! Dropping the capabilities a child holds (a root caller's, or the view's new user
//! namespace's) between fork and exec: raw `capget`/`capset`, no allocation.

use nix::errno::Errno;
use sandbox_exec::{ChildSetup, SetupFailure, SetupStep};

use crate::sys;

pub(super) const CAP_SETPCAP: u32 = 8;

/// Whether this process holds `cap` in its effective set.
pub(super) fn has_effective_cap(cap: u32) -> bool {
    // capget(2) rather than parsing /proc/self/status, which the kernel formats in full for
    // every read (measurable on every run as root).
    sys::capget().is_ok_and(|data| {
        cap < 64 && data[(cap / 32) as usize].effective & (1u32 << (cap % 32)) != 0
    })
}

/// The highest capability this kernel knows (`/proc/sys/kernel/cap_last_cap`).
pub(super) fn last_capability() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

/// SECBIT_NOROOT | _LOCKED, SECBIT_NO_SETUID_FIXUP | _LOCKED, SECBIT_KEEP_CAPS_LOCKED,
/// SECBIT_NO_CAP_AMBIENT_RAISE | _LOCKED: uid 0 gets no capabilities at exec, ever.
pub(super) const SECURE_BITS: libc::c_ulong = 0b1110_1111;

/// Drops every capability for good. Async-signal safe: prctl(2) and capset(2) on stack data.
pub(super) fn drop_capabilities(last: u32) -> Result<(), Errno> {
    for cap in 0..=last {
        // EINVAL for a cap this kernel lacks.
        match sys::drop_bounding_cap(cap) {
            Ok(()) | Err(Errno::EINVAL) => {}
            Err(errno) => return Err(errno),
        }
    }
    sys::set_securebits(SECURE_BITS)?;
    let _ = sys::clear_ambient_caps();
    sys::capset(&[sys::CapData::default(); 2])
}

/// Drops every capability in the child right before exec, for a backend whose own enforcer
/// keeps them (nono): as root, `CAP_SYS_PTRACE`, `CAP_DAC_OVERRIDE` and `CAP_SYS_ADMIN` let
/// a sandboxed process read other root processes' `/proc/<pid>/environ` or push keystrokes
/// with TIOCSTI even inside a Landlock domain. Only built when running as root.
#[derive(Debug)]
pub struct DropCapabilities {
    pub(super) last: u32,
}

impl DropCapabilities {
    pub fn when_root() -> Option<Self> {
        nix::unistd::geteuid().is_root().then(|| DropCapabilities {
            last: last_capability(),
        })
    }
}

impl ChildSetup for DropCapabilities {
    fn apply_in_child(&self) -> Result<(), SetupFailure> {
        drop_capabilities(self.last).map_err(SetupFailure::at(SetupStep::DropCapabilities))
    }

    fn name(&self) -> &str {
        "drop capabilities"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capget_agrees_with_the_kernels_status_file() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let mask = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
            .unwrap();
        for cap in 0..=last_capability() {
            assert_eq!(
                has_effective_cap(cap),
                mask & (1u64 << cap) != 0,
                "capability {cap} (CapEff {mask:#x})"
            );
        }
    }
}
