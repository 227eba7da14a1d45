//! Capabilities: reading and setting the three sets (capget/capset), the bounding set, the
//! securebits and the ambient set.

use nix::errno::Errno;

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`: one 32-bit word of each set (version 3 takes two).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CapData {
    pub(crate) effective: u32,
    pub(crate) permitted: u32,
    pub(crate) inheritable: u32,
}

fn header() -> CapHeader {
    CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    }
}

/// capget(2) of the calling thread: its sets, capabilities 0-31 then 32-63.
pub(crate) fn capget() -> nix::Result<[CapData; 2]> {
    let mut header = header();
    let mut data = [CapData::default(); 2];
    // SAFETY: capget(2) with a version-3 header (which it may write) and room for its two
    // data words, all on our stack.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capget,
            std::ptr::addr_of_mut!(header),
            data.as_mut_ptr(),
        )
    };
    Errno::result(rc).map(|_| data)
}

/// capset(2) of the calling thread's sets.
pub(crate) fn capset(data: &[CapData; 2]) -> nix::Result<()> {
    let mut header = header();
    // SAFETY: capset(2) reads a version-3 header and its two data words, from our stack and
    // the array we borrow.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capset,
            std::ptr::addr_of_mut!(header),
            data.as_ptr(),
        )
    };
    Errno::result(rc).map(drop)
}

/// `PR_CAPBSET_DROP`: `cap` leaves the bounding set (EINVAL for one this kernel lacks).
pub(crate) fn drop_bounding_cap(cap: u32) -> nix::Result<()> {
    // SAFETY: prctl(PR_CAPBSET_DROP) takes integers only.
    Errno::result(unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) })
        .map(drop)
}

/// `PR_SET_SECUREBITS`.
pub(crate) fn set_securebits(bits: libc::c_ulong) -> nix::Result<()> {
    // SAFETY: prctl(PR_SET_SECUREBITS) takes integers only.
    Errno::result(unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0) }).map(drop)
}

/// `PR_CAP_AMBIENT_CLEAR_ALL`: empties the ambient set.
pub(crate) fn clear_ambient_caps() -> nix::Result<()> {
    // SAFETY: prctl(PR_CAP_AMBIENT) takes integers only.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    Errno::result(rc).map(drop)
}
