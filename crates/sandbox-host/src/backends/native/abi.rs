//! Which Landlock ABI this kernel speaks, asked directly of the kernel.

/// The kernel's Landlock ABI version; 0 when Landlock is missing or disabled at boot.
pub fn landlock_abi() -> i32 {
    crate::sys::landlock_abi_version().unwrap_or(0)
}
