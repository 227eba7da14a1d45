//! Processes: sessions, the parent-death signal, starting (clone, fork) and ending one,
//! waiting for it, executing a program, the stacks of children that share our memory.

use std::ffi::{CStr, CString};
#[cfg(not(any(target_os = "linux", target_os = "android")))]
use std::os::fd::AsRawFd;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;

/// setsid(2): the caller leads a new session and process group.
pub(crate) fn setsid() -> nix::Result<()> {
    // SAFETY: setsid(2) takes no arguments.
    Errno::result(unsafe { libc::setsid() }).map(drop)
}

/// `PR_SET_PDEATHSIG`: `signal` reaches the caller when the thread that started it dies.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) fn set_parent_death_signal(signal: libc::c_int) -> nix::Result<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes integers only.
    let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong, 0, 0, 0) };
    Errno::result(rc).map(drop)
}

/// `RLIMIT_NPROC`, soft and hard, to `limit`: in a user namespace of the caller's own on
/// Linux 5.14 and later, how many processes and threads of its uid may exist in that
/// namespace (docs/limits.md).
#[cfg(target_os = "linux")]
pub(crate) fn set_process_rlimit(limit: u64) -> nix::Result<()> {
    let rlimit = libc::rlimit {
        rlim_cur: limit as libc::rlim_t,
        rlim_max: limit as libc::rlim_t,
    };
    // SAFETY: setrlimit(2) reads one `rlimit` from our stack.
    Errno::result(unsafe { libc::setrlimit(libc::RLIMIT_NPROC, &rlimit) }).map(drop)
}

/// `PR_SET_CHILD_SUBREAPER`: orphaned descendants are re-parented to the caller.
#[cfg(target_os = "linux")]
pub(crate) fn set_child_subreaper() -> nix::Result<()> {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes one integer argument and touches no
    // memory of ours.
    Errno::result(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) }).map(drop)
}

/// getppid(2).
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) fn getppid() -> libc::pid_t {
    // SAFETY: getppid(2) takes no arguments and cannot fail.
    unsafe { libc::getppid() }
}

/// getpid(2).
#[cfg(target_os = "linux")]
pub(crate) fn getpid() -> libc::pid_t {
    // SAFETY: getpid(2) takes no arguments and cannot fail.
    unsafe { libc::getpid() }
}

/// kill(2): `signal` to `pid` (a negative `pid`: to that process group).
#[cfg(target_os = "linux")]
pub(crate) fn kill(pid: libc::pid_t, signal: libc::c_int) -> nix::Result<()> {
    // SAFETY: kill(2) takes integers only.
    Errno::result(unsafe { libc::kill(pid, signal) }).map(drop)
}

/// waitpid(2) for `pid` with `options`: the pid that changed state (0 with `WNOHANG` when
/// none did) and its wait status.
pub(crate) fn waitpid(
    pid: libc::pid_t,
    options: libc::c_int,
) -> nix::Result<(libc::pid_t, libc::c_int)> {
    let mut status = 0;
    // SAFETY: waitpid(2) writes the status into our stack value.
    let rc = unsafe { libc::waitpid(pid, &mut status, options) };
    Errno::result(rc).map(|pid| (pid, status))
}

/// _exit(2): ends the process at once, without running atexit handlers or destructors (in a
/// child sharing its parent's memory, they are the parent's).
pub(crate) fn exit(code: libc::c_int) -> ! {
    // SAFETY: _exit(2) takes an integer and does not return.
    unsafe { libc::_exit(code) }
}

/// chdir(2).
pub(crate) fn chdir(path: &CStr) -> nix::Result<()> {
    // SAFETY: chdir(2) on a NUL-terminated path we borrow.
    Errno::result(unsafe { libc::chdir(path.as_ptr()) }).map(drop)
}

/// The open-files limit (`RLIMIT_NOFILE`).
pub(crate) fn open_files_limit() -> nix::Result<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes into the struct on our stack.
    Errno::result(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }).map(|_| limit)
}

/// No core dumps from here on (`RLIMIT_CORE` 0).
#[cfg(target_os = "linux")]
pub(crate) fn disable_core_dumps() -> nix::Result<()> {
    let none = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit(2) reads the struct on our stack.
    Errno::result(unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) }).map(drop)
}

/// A stack of `size` bytes for a process started on it ([`clone`]): an anonymous private
/// mapping whose lowest page is a guard (an overflow faults instead of writing below it).
/// Returns its lowest address; the caller unmaps it ([`unmap_stack`]) once nothing runs on it.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) fn map_stack(size: usize) -> nix::Result<*mut libc::c_void> {
    // SAFETY: an anonymous private mapping: it aliases no memory of ours.
    let stack = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if stack == libc::MAP_FAILED {
        return Err(Errno::last());
    }
    // SAFETY: mprotect(2) of the first page of the mapping made above, which nothing uses yet.
    unsafe { libc::mprotect(stack, 4096, libc::PROT_NONE) };
    Ok(stack)
}

/// Unmaps a stack made by [`map_stack`].
///
/// # Safety
/// `stack` and `size` are a mapping [`map_stack`] returned, and no process runs on it any
/// more (it has exec'ed, exited or been reaped).
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) unsafe fn unmap_stack(stack: *mut libc::c_void, size: usize) {
    // SAFETY: the caller's contract: the mapping is ours and unused.
    unsafe { libc::munmap(stack, size) };
}

/// clone(2) through the C library: a process that runs `main(arg)` on the stack `stack`
/// (made by [`map_stack`] with `size` bytes; it grows down from the top), with `flags`.
/// Returns its pid, or -1 with `errno` set, as the C library does: a caller that must not
/// touch `errno` (the pid namespace's init) can ignore it.
///
/// # Safety
/// With `CLONE_VM` the new process shares our memory: `arg` and everything `main` reads must
/// stay valid as long as it runs, `main` must make only async-signal-safe calls and never
/// return into our frames, and the stack must stay mapped until it has exec'ed or exited.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) unsafe fn clone(
    main: extern "C" fn(*mut libc::c_void) -> libc::c_int,
    stack: *mut libc::c_void,
    size: usize,
    flags: libc::c_int,
    arg: *mut libc::c_void,
) -> libc::c_int {
    // The top of the mapping: 16-byte aligned, as mmap returns page-aligned memory.
    let top = stack.cast::<u8>().wrapping_add(size).cast();
    // SAFETY: the caller's contract (this function is unsafe).
    unsafe { libc::clone(main, top, flags, arg) }
}

/// fork(2): the child's pid, 0 in the child, or -1 with `errno` set.
///
/// # Safety
/// The child of a possibly multi-threaded process must make only async-signal-safe calls
/// until it execs or exits, and never return into frames of the parent's.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(crate) unsafe fn fork() -> libc::pid_t {
    // SAFETY: the caller's contract (this function is unsafe).
    unsafe { libc::fork() }
}

/// A NULL-terminated array of pointers to NUL-terminated strings, as `execve` takes its
/// argument and environment vectors: built (allocated) in the parent, read in the child.
pub(crate) struct CStrArray {
    _strings: Vec<CString>,
    pointers: Vec<*const libc::c_char>,
}

// SAFETY: the pointers point into the CStrings the value owns (their heap buffers never move
// or change); sharing them is sharing immutable bytes.
unsafe impl Send for CStrArray {}
// SAFETY: as above: nothing is ever written through them.
unsafe impl Sync for CStrArray {}

impl CStrArray {
    pub(crate) fn new(strings: Vec<CString>) -> CStrArray {
        let pointers = strings
            .iter()
            .map(|s| s.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        CStrArray {
            _strings: strings,
            pointers,
        }
    }
}

/// execve(2); returns only when it failed, with its errno.
pub(crate) fn execve(path: &CStr, argv: &CStrArray, envp: &CStrArray) -> Errno {
    // SAFETY: a NUL-terminated path and NULL-terminated arrays of NUL-terminated strings
    // (CStrArray's invariant), all borrowed for the call.
    unsafe {
        libc::execve(
            path.as_ptr(),
            argv.pointers.as_ptr(),
            envp.pointers.as_ptr(),
        )
    };
    Errno::last()
}

/// A descriptor that `poll` reports readable once `pid` exited: its pidfd.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) fn exit_watch(pid: libc::pid_t) -> Result<OwnedFd, Errno> {
    // SAFETY: pidfd_open(2) takes a pid and flags; on success it returns a new descriptor
    // that nothing else owns.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: `fd` was just returned by the kernel and is owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// A descriptor that `poll` reports readable once `pid` exited: a kqueue holding one
/// `EVFILT_PROC`/`NOTE_EXIT` event for it (macOS and the BSDs have no pidfd).
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(crate) fn exit_watch(pid: libc::pid_t) -> Result<OwnedFd, Errno> {
    // SAFETY: kqueue(2) takes no arguments and returns a new descriptor owned by no one else.
    let kq = unsafe { libc::kqueue() };
    if kq < 0 {
        return Err(Errno::last());
    }
    // SAFETY: `kq` was just returned by the kernel.
    let kq = unsafe { OwnedFd::from_raw_fd(kq as RawFd) };
    // SAFETY: an all-zero kevent is a valid value of the plain C struct; the fields that
    // matter are set below.
    let mut change: libc::kevent = unsafe { std::mem::zeroed() };
    change.ident = pid as libc::uintptr_t;
    change.filter = libc::EVFILT_PROC;
    change.flags = libc::EV_ADD | libc::EV_ONESHOT;
    change.fflags = libc::NOTE_EXIT;
    // SAFETY: kevent(2) registers the one change read from our stack; no events are
    // returned (a null list of length 0) and no timeout is read.
    let rc = unsafe {
        libc::kevent(
            kq.as_raw_fd(),
            &change,
            1,
            std::ptr::null_mut(),
            0,
            std::ptr::null(),
        )
    };
    if rc < 0 {
        return Err(Errno::last());
    }
    Ok(kq)
}

/// Whether the calling thread has `CAP_SYS_RESOURCE` in its effective set (capget(2)): what
/// lowering a process's OOM score takes. Root may lack it (a container's bounding set).
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) fn has_sys_resource() -> bool {
    /// `struct __user_cap_header_struct`, version 3 (`_LINUX_CAPABILITY_VERSION_3`).
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    /// `struct __user_cap_data_struct`: one 32-bit word of each set.
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget(2) with a version-3 header (which it may write) and room for its two
    // data words, all on our stack.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capget,
            std::ptr::addr_of_mut!(header),
            data.as_mut_ptr(),
        )
    };
    // CAP_SYS_RESOURCE is capability 24, in the first word.
    rc == 0 && data[0].effective & (1 << 24) != 0
}
