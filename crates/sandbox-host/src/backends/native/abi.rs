//! Which Landlock ABI this kernel speaks, asked directly of the kernel.

/// `LANDLOCK_CREATE_RULESET_VERSION`: ask for the ABI version instead of creating a ruleset.
const CREATE_RULESET_VERSION: libc::c_uint = 1 << 0;

/// The kernel's Landlock ABI version; 0 when Landlock is missing or disabled at boot.
pub fn landlock_abi() -> i32 {
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) reads no memory and returns a number
    // (or -1 with errno ENOSYS/EOPNOTSUPP).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if rc < 0 {
        0
    } else {
        rc as i32
    }
}
