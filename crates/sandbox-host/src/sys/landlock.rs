//! Landlock's three system calls as the crate makes them itself: the ABI version, a rule
//! added in the child, restricting the child. (The rulesets are built with the `landlock`
//! crate, in the parent.)

use std::os::fd::RawFd;

use nix::errno::Errno;

/// `LANDLOCK_CREATE_RULESET_VERSION`: ask for the ABI version instead of creating a ruleset.
const CREATE_RULESET_VERSION: libc::c_uint = 1 << 0;

/// `LANDLOCK_RULE_PATH_BENEATH`.
const RULE_PATH_BENEATH: libc::c_int = 1;

/// `struct landlock_path_beneath_attr` (packed in the kernel's header).
#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// landlock_create_ruleset(NULL, 0, VERSION): the kernel's Landlock ABI version (ENOSYS or
/// EOPNOTSUPP when Landlock is missing or disabled at boot).
pub(crate) fn landlock_abi_version() -> nix::Result<i32> {
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) reads no memory and returns a number.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    Errno::result(rc).map(|v| v as i32)
}

/// landlock_add_rule(2): `access` beneath the directory `parent` (a descriptor, `O_PATH`
/// will do) in the ruleset `ruleset`.
pub(crate) fn landlock_add_path_rule(
    ruleset: RawFd,
    parent: RawFd,
    access: u64,
) -> nix::Result<()> {
    let attr = PathBeneathAttr {
        allowed_access: access,
        parent_fd: parent,
    };
    // SAFETY: landlock_add_rule(2) reads one attribute struct from our stack; the
    // descriptors are numbers (EBADF for a wrong one).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            RULE_PATH_BENEATH,
            &attr as *const PathBeneathAttr,
            0,
        )
    };
    Errno::result(rc).map(drop)
}

/// `landlock_restrict_self` takes no flags we need.
const RESTRICT_SELF_FLAGS: libc::c_uint = 0;

/// landlock_restrict_self(2): the calling thread enters the domain of `ruleset`.
pub(crate) fn landlock_restrict_self(ruleset: RawFd) -> nix::Result<()> {
    // SAFETY: landlock_restrict_self(fd, flags) takes integers and reads no memory of ours.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_restrict_self,
            ruleset,
            RESTRICT_SELF_FLAGS,
        )
    };
    Errno::result(rc).map(drop)
}
