//! Every seccomp rule of the native backend, exercised for real.
//!
//! For each row a forked child loads the product's filters — `sandbox_policy`'s plan compiled to
//! BPF by `sandbox_host::backends::native::seccomp`, installed with `seccompiler::apply_filter` after
//! `PR_SET_NO_NEW_PRIVS`, as `NativeSandbox` does — makes the syscall with libc and exits with
//! its errno. The same call is then made without the filter (the control), which must not give
//! that errno, so every row can fail. Arguments are chosen so that the unfiltered call fails
//! harmlessly with another errno (or succeeds without side effects), for root and other users
//! alike: seccomp answers before the kernel looks at any argument.
//!
//! A handful of kernel paths check a capability before anything else; their controls run in a
//! fresh user + mount namespace where any user holds that capability (or, for the machine-level
//! syscalls that need the initial namespace's capabilities, are only conclusive as root).
#![cfg(target_os = "linux")]
// A panic is how a test or a benchmark reports failure; the workspace lints against
// unwrap/expect apply to shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::fmt;
use std::ptr::null;

use libc::{c_long, c_void};
use sandbox_policy::compile::seccomp::consts;
use seccompiler::BpfProgram;

/// The child's exit code when the syscall succeeded.
const SUCCESS: i32 = 0;
/// The child could not load the filter.
const FILTER_FAILED: i32 = 200;
/// The child could not enter the namespaces its row asked for.
const PREPARE_FAILED: i32 = 201;
/// A grandchild (fork, spawn, thread) did not finish as it should.
const CHILD_FAILED: i32 = 202;

/// What one run of a probe came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ok,
    Errno(i32),
    FilterFailed,
    PrepareFailed,
    ChildFailed,
    Signaled(i32),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Outcome::Ok => "ok".to_string(),
            Outcome::Errno(e) => format!("{:?}", nix::errno::Errno::from_raw(*e)),
            Outcome::FilterFailed => "the filter did not load".into(),
            Outcome::PrepareFailed => "no user namespace".into(),
            Outcome::ChildFailed => "a child process failed".into(),
            Outcome::Signaled(s) => format!("killed by signal {s}"),
        };
        f.pad(&text)
    }
}

/// Done in the child before the filter loads, in both runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Prepare {
    Nothing,
    /// A new user + mount namespace: past `may_mount()` for any user, and nothing it could
    /// mount would touch the host's mount table.
    UserAndMountNamespace,
}

/// When an unfiltered run can tell the filter's errno apart. A control that gives the
/// filter's errno fails the row, unless this environment cannot tell them apart: the variant
/// says when, and a test process that already runs under a seccomp filter (a container's, Nix's
/// build sandbox, this product's) never can. Such rows are reported as inconclusive; set
/// `SANDBOX_SECCOMP_TEST_STRICT=1` to fail them too.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Control {
    /// For any user.
    Always,
    /// When a new user namespace gives this user CAP_SYS_ADMIN over a new mount namespace
    /// (always as root; for other users unless user namespaces are disabled or restricted).
    InUserNamespace,
    /// Only with the initial namespace's capability, which the kernel checks first: a
    /// non-root control gets the kernel's own EPERM.
    AsRoot,
}

struct Row {
    /// The syscall of the plan this row exercises.
    syscall: &'static str,
    /// What the call is, for messages.
    what: &'static str,
    prepare: Prepare,
    /// Runs in the child; returns 0 or an errno.
    call: fn() -> i32,
    /// The filter's answer.
    expect: i32,
    control: Control,
    /// What the unfiltered call does instead (one line, shown when the row fails).
    why_control: &'static str,
}

/// errno of a raw syscall result.
fn errno_of(rc: c_long) -> i32 {
    if rc < 0 {
        nix::errno::Errno::last_raw()
    } else {
        SUCCESS
    }
}

const NO_PID: libc::pid_t = 0x7fff_ffff;
const NO_SUCH_PATH: &std::ffi::CStr = c"/nonexistent-sandbox-seccomp-test";

/// fork-like clone(2) with `flags`: the new process exits at once.
fn clone_and_reap(flags: libc::c_ulong) -> i32 {
    // SAFETY: a fork-like clone (no CLONE_VM, no stack): the child only calls _exit.
    let rc = unsafe { libc::syscall(libc::SYS_clone, flags, 0, 0, 0, 0) };
    match rc {
        // SAFETY: in the forked child: _exit(2) ends it without running destructors or touching
        // what it shares with the parent.
        0 => unsafe { libc::_exit(0) },
        pid if pid > 0 => reap(pid as libc::pid_t),
        _ => errno_of(rc),
    }
}

/// Waits for `pid`: SUCCESS when it exited 0.
fn reap(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    // SAFETY: waitpid writes one int.
    if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
        return CHILD_FAILED;
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        SUCCESS
    } else {
        CHILD_FAILED
    }
}

/// `clone(flag | CLONE_THREAD)` without CLONE_SIGHAND: the kernel refuses the combination with
/// EINVAL (copy_process) before it looks at any namespace flag, so no process is created.
fn clone_flag_with_thread(flag: u64) -> i32 {
    clone_and_reap((flag as libc::c_ulong) | libc::CLONE_THREAD as libc::c_ulong)
}

/// One row per namespace flag of clone(2).
macro_rules! clone_row {
    ($flag:ident) => {
        Row {
            syscall: "clone",
            what: concat!("clone(", stringify!($flag), " | CLONE_THREAD)"),
            prepare: Prepare::Nothing,
            call: || clone_flag_with_thread(consts::$flag),
            expect: libc::EPERM,
            control: Control::Always,
            why_control: "CLONE_THREAD without CLONE_SIGHAND: EINVAL before any namespace check",
        }
    };
}

// The rules every run gets, whatever the policy.
fn always_rows() -> Vec<Row> {
    use libc::*;
    vec![
        // Keyrings.
        Row {
            syscall: "keyctl",
            what: "keyctl(invalid operation)",
            prepare: Prepare::Nothing,
            // SAFETY: raw keyctl(2) with integer arguments only: no memory of ours is read or
            // written.
            call: || errno_of(unsafe { syscall(SYS_keyctl, 0x7fff_ffff, 0, 0, 0, 0) }),
            expect: EPERM,
            control: Control::Always,
            why_control: "an unknown operation: EOPNOTSUPP",
        },
        Row {
            syscall: "add_key",
            what: "add_key(NULL type)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw add_key(2); its pointers are NULL: the kernel has nothing of ours to
                // write to (it answers EFAULT if it reaches one).
                errno_of(unsafe {
                    syscall(
                        SYS_add_key,
                        null::<c_void>(),
                        null::<c_void>(),
                        null::<c_void>(),
                        0,
                        -2,
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "the type string is read first: EFAULT",
        },
        Row {
            syscall: "request_key",
            what: "request_key(NULL type)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw request_key(2); its pointers are NULL: the kernel has nothing of ours
                // to write to (it answers EFAULT if it reaches one).
                errno_of(unsafe {
                    syscall(
                        SYS_request_key,
                        null::<c_void>(),
                        null::<c_void>(),
                        null::<c_void>(),
                        0,
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "the type string is read first: EFAULT",
        },
        // io_uring.
        Row {
            syscall: "io_uring_setup",
            what: "io_uring_setup(1, NULL)",
            prepare: Prepare::Nothing,
            // SAFETY: raw io_uring_setup(2); its pointers are NULL: the kernel has nothing of ours
            // to write to (it answers EFAULT if it reaches one).
            call: || errno_of(unsafe { syscall(SYS_io_uring_setup, 1, null::<c_void>()) }),
            expect: EPERM,
            control: Control::Always,
            why_control: "the params struct is copied first: EFAULT",
        },
        Row {
            syscall: "io_uring_enter",
            what: "io_uring_enter(-1, …)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw io_uring_enter(2); its pointers are NULL: the kernel has nothing of
                // ours to write to (it answers EFAULT if it reaches one).
                errno_of(unsafe { syscall(SYS_io_uring_enter, -1, 0, 0, 0, null::<c_void>(), 0) })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no ring behind fd -1: EBADF",
        },
        Row {
            syscall: "io_uring_register",
            what: "io_uring_register(-1, …)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw io_uring_register(2); its pointers are NULL: the kernel has nothing
                // of ours to write to (it answers EFAULT if it reaches one).
                errno_of(unsafe { syscall(SYS_io_uring_register, -1, 0, null::<c_void>(), 0) })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no ring behind fd -1: EBADF",
        },
        // vsock.
        Row {
            syscall: "socket",
            what: "socket(AF_VSOCK, SOCK_STREAM, 0)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: socket(2) takes integers only; the fd it may return is closed below.
                let fd = unsafe { socket(AF_VSOCK, SOCK_STREAM, 0) };
                if fd >= 0 {
                    // SAFETY: `fd` was just returned by socket(2) and is not used again.
                    unsafe { close(fd) };
                }
                errno_of(fd as c_long)
            },
            expect: EACCES,
            control: Control::Always,
            why_control: "a socket (closed at once), or EAFNOSUPPORT without the vsock module",
        },
        // Exploit aids.
        Row {
            syscall: "userfaultfd",
            what: "userfaultfd(UFFD_USER_MODE_ONLY | invalid flag)",
            prepare: Prepare::Nothing,
            // UFFD_USER_MODE_ONLY (1) passes the privilege check; bit 2 is no flag: EINVAL.
            // SAFETY: raw userfaultfd(2) with integer arguments only: no memory of ours is read or
            // written.
            call: || errno_of(unsafe { syscall(SYS_userfaultfd, 0x1 | 0x2) }),
            expect: EPERM,
            control: Control::Always,
            why_control: "user-mode-only passes the privilege check, the unknown flag EINVAL",
        },
        Row {
            syscall: "perf_event_open",
            what: "perf_event_open(NULL attr)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw perf_event_open(2); its pointers are NULL: the kernel has nothing of
                // ours to write to (it answers EFAULT if it reaches one).
                errno_of(unsafe { syscall(SYS_perf_event_open, null::<c_void>(), 0, -1, -1, 0) })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "the attr struct is copied first: EFAULT",
        },
        // The mount family.
        Row {
            syscall: "mount",
            what: "mount(NULL, missing target, NULL, 0, NULL)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw mount(2); its pointers are NULL or C-string constants of this
                // program: the kernel has nothing of ours to write to (it answers EFAULT if it
                // reaches a NULL).
                errno_of(unsafe {
                    syscall(
                        SYS_mount,
                        null::<c_void>(),
                        NO_SUCH_PATH.as_ptr(),
                        null::<c_void>(),
                        0,
                        null::<c_void>(),
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "the target is looked up before may_mount(): ENOENT",
        },
        Row {
            syscall: "umount2",
            what: "umount2(missing target, invalid flags)",
            prepare: Prepare::Nothing,
            // SAFETY: raw umount2(2); its paths are C-string constants of this program, which the
            // kernel only reads.
            call: || errno_of(unsafe { syscall(SYS_umount2, NO_SUCH_PATH.as_ptr(), 0x7fff_0000) }),
            expect: EPERM,
            control: Control::Always,
            why_control: "flags are checked first: EINVAL",
        },
        Row {
            syscall: "chroot",
            what: "chroot(missing)",
            prepare: Prepare::Nothing,
            // SAFETY: chroot(2) of a NUL-terminated path that does not exist.
            call: || errno_of(unsafe { chroot(NO_SUCH_PATH.as_ptr()) } as c_long),
            expect: EPERM,
            control: Control::Always,
            why_control: "the path is looked up before the capability check: ENOENT",
        },
        Row {
            syscall: "pivot_root",
            what: "pivot_root(missing, missing) in a new user+mount namespace",
            prepare: Prepare::UserAndMountNamespace,
            call: || {
                // SAFETY: raw pivot_root(2); its paths are C-string constants of this program,
                // which the kernel only reads.
                errno_of(unsafe {
                    syscall(SYS_pivot_root, NO_SUCH_PATH.as_ptr(), NO_SUCH_PATH.as_ptr())
                })
            },
            expect: EPERM,
            control: Control::InUserNamespace,
            why_control: "may_mount() holds in the new namespace, then the lookup: ENOENT",
        },
        Row {
            syscall: "mount_setattr",
            what: "mount_setattr(-1, \"\", invalid flags, NULL, 0)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw mount_setattr(2); its pointers are NULL or C-string constants of this
                // program: the kernel has nothing of ours to write to (it answers EFAULT if it
                // reaches a NULL).
                errno_of(unsafe {
                    syscall(
                        SYS_mount_setattr,
                        -1,
                        c"".as_ptr(),
                        !0u32,
                        null::<c_void>(),
                        0,
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "flags are checked first: EINVAL",
        },
        Row {
            syscall: "open_tree",
            what: "open_tree(-1, \"\", invalid flags)",
            prepare: Prepare::Nothing,
            // SAFETY: raw open_tree(2); its paths are C-string constants of this program, which the
            // kernel only reads.
            call: || errno_of(unsafe { syscall(SYS_open_tree, -1, c"".as_ptr(), !0u32) }),
            expect: EPERM,
            control: Control::Always,
            why_control: "flags are checked first: EINVAL",
        },
        Row {
            syscall: "move_mount",
            what: "move_mount(-1, \"\", -1, \"\", invalid flags) in a new user+mount namespace",
            prepare: Prepare::UserAndMountNamespace,
            call: || {
                // SAFETY: raw move_mount(2); its paths are C-string constants of this program,
                // which the kernel only reads.
                errno_of(unsafe {
                    syscall(SYS_move_mount, -1, c"".as_ptr(), -1, c"".as_ptr(), !0u32)
                })
            },
            expect: EPERM,
            control: Control::InUserNamespace,
            why_control: "may_mount() holds in the new namespace, then flags: EINVAL",
        },
        Row {
            syscall: "fsopen",
            what: "fsopen(NULL, invalid flags) in a new user+mount namespace",
            prepare: Prepare::UserAndMountNamespace,
            // SAFETY: raw fsopen(2); its pointers are NULL: the kernel has nothing of ours to write
            // to (it answers EFAULT if it reaches one).
            call: || errno_of(unsafe { syscall(SYS_fsopen, null::<c_void>(), !0u32) }),
            expect: EPERM,
            control: Control::InUserNamespace,
            why_control: "CAP_SYS_ADMIN holds in the new namespace, then flags: EINVAL",
        },
        Row {
            syscall: "fsmount",
            what: "fsmount(-1, invalid flags, 0) in a new user+mount namespace",
            prepare: Prepare::UserAndMountNamespace,
            // SAFETY: raw fsmount(2) with integer arguments only: no memory of ours is read or
            // written.
            call: || errno_of(unsafe { syscall(SYS_fsmount, -1, !0u32, 0) }),
            expect: EPERM,
            control: Control::InUserNamespace,
            why_control: "may_mount() holds in the new namespace, then flags: EINVAL",
        },
        Row {
            syscall: "fsconfig",
            what: "fsconfig(-1, invalid command, NULL, NULL, 0)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw fsconfig(2); its pointers are NULL: the kernel has nothing of ours to
                // write to (it answers EFAULT if it reaches one).
                errno_of(unsafe {
                    syscall(
                        SYS_fsconfig,
                        -1,
                        0xff,
                        null::<c_void>(),
                        null::<c_void>(),
                        0,
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "an unknown command: EOPNOTSUPP (or EINVAL/EBADF)",
        },
        Row {
            syscall: "fspick",
            what: "fspick(-1, NULL, invalid flags) in a new user+mount namespace",
            prepare: Prepare::UserAndMountNamespace,
            // SAFETY: raw fspick(2); its pointers are NULL: the kernel has nothing of ours to write
            // to (it answers EFAULT if it reaches one).
            call: || errno_of(unsafe { syscall(SYS_fspick, -1, null::<c_void>(), !0u32) }),
            expect: EPERM,
            control: Control::InUserNamespace,
            why_control: "CAP_SYS_ADMIN holds in the new namespace, then flags: EINVAL",
        },
        // Namespaces.
        Row {
            syscall: "unshare",
            what: "unshare(0)",
            prepare: Prepare::Nothing,
            // SAFETY: raw unshare(2) with integer arguments only: no memory of ours is read or
            // written.
            call: || errno_of(unsafe { syscall(SYS_unshare, 0) }),
            expect: EPERM,
            control: Control::Always,
            why_control: "unsharing nothing succeeds",
        },
        Row {
            syscall: "setns",
            what: "setns(-1, 0)",
            prepare: Prepare::Nothing,
            // SAFETY: raw setns(2) with integer arguments only: no memory of ours is read or
            // written.
            call: || errno_of(unsafe { syscall(SYS_setns, -1, 0) }),
            expect: EPERM,
            control: Control::Always,
            why_control: "no namespace behind fd -1: EBADF",
        },
        clone_row!(CLONE_NEWNS),
        clone_row!(CLONE_NEWCGROUP),
        clone_row!(CLONE_NEWUTS),
        clone_row!(CLONE_NEWIPC),
        clone_row!(CLONE_NEWUSER),
        clone_row!(CLONE_NEWPID),
        clone_row!(CLONE_NEWNET),
        clone_row!(CLONE_NEWTIME),
        Row {
            syscall: "clone",
            what: "clone(CLONE_NEWUSER | SIGCHLD): a process in a new user namespace",
            prepare: Prepare::Nothing,
            call: || clone_and_reap(CLONE_NEWUSER as c_ulong | SIGCHLD as c_ulong),
            expect: EPERM,
            control: Control::InUserNamespace,
            why_control: "creates the process where user namespaces are allowed",
        },
        Row {
            syscall: "clone3",
            what: "clone3(NULL, 0)",
            prepare: Prepare::Nothing,
            // SAFETY: raw clone3(2); its pointers are NULL: the kernel has nothing of ours to write
            // to (it answers EFAULT if it reaches one).
            call: || errno_of(unsafe { syscall(SYS_clone3, null::<c_void>(), 0) }),
            expect: ENOSYS,
            control: Control::Always,
            why_control: "a size below CLONE_ARGS_SIZE_VER0: EINVAL",
        },
        // Tracing.
        Row {
            syscall: "ptrace",
            what: "ptrace(PTRACE_PEEKDATA, no such pid)",
            prepare: Prepare::Nothing,
            // SAFETY: raw ptrace(2) with integer arguments only: no memory of ours is read or
            // written.
            call: || errno_of(unsafe { syscall(SYS_ptrace, PTRACE_PEEKDATA, NO_PID, 0, 0) }),
            expect: EPERM,
            control: Control::Always,
            why_control: "no such process: ESRCH",
        },
        Row {
            syscall: "process_vm_readv",
            what: "process_vm_readv(no such pid, 1 byte)",
            prepare: Prepare::Nothing,
            call: || process_vm(SYS_process_vm_readv),
            expect: EPERM,
            control: Control::Always,
            why_control: "no such process: ESRCH",
        },
        Row {
            syscall: "process_vm_writev",
            what: "process_vm_writev(no such pid, 1 byte)",
            prepare: Prepare::Nothing,
            call: || process_vm(SYS_process_vm_writev),
            expect: EPERM,
            control: Control::Always,
            why_control: "no such process: ESRCH",
        },
        // Terminal injection.
        Row {
            syscall: "ioctl",
            what: "ioctl(-1, TIOCSTI)",
            prepare: Prepare::Nothing,
            // SAFETY: raw ioctl(2); its pointers are NULL: the kernel has nothing of ours to write
            // to (it answers EFAULT if it reaches one).
            call: || errno_of(unsafe { syscall(SYS_ioctl, -1, TIOCSTI, null::<c_void>()) }),
            expect: EPERM,
            control: Control::Always,
            why_control: "no terminal behind fd -1: EBADF",
        },
        Row {
            syscall: "ioctl",
            what: "ioctl(-1, TIOCLINUX)",
            prepare: Prepare::Nothing,
            // SAFETY: raw ioctl(2); its pointers are NULL: the kernel has nothing of ours to write
            // to (it answers EFAULT if it reaches one).
            call: || errno_of(unsafe { syscall(SYS_ioctl, -1, TIOCLINUX, null::<c_void>()) }),
            expect: EPERM,
            control: Control::Always,
            why_control: "no terminal behind fd -1: EBADF",
        },
        Row {
            syscall: "ioctl",
            what: "ioctl(-1, TIOCSETD)",
            prepare: Prepare::Nothing,
            call: || {
                let request = consts::TIOCSETD as c_long;
                // SAFETY: raw ioctl(2); its pointer is NULL: the kernel has nothing of ours to
                // read (it answers EFAULT if it reaches one).
                errno_of(unsafe { syscall(SYS_ioctl, -1, request, null::<c_void>()) })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no terminal behind fd -1: EBADF",
        },
    ]
}

/// process_vm_readv/writev of one byte with a process that does not exist.
fn process_vm(nr: c_long) -> i32 {
    let mut byte = 0u8;
    let local = libc::iovec {
        iov_base: (&mut byte as *mut u8).cast(),
        iov_len: 1,
    };
    let remote = libc::iovec {
        iov_base: 0x1000 as *mut c_void,
        iov_len: 1,
    };
    // SAFETY: two one-element iovec arrays on our stack; the kernel fails on the pid.
    errno_of(unsafe { libc::syscall(nr, NO_PID, &local, 1, &remote, 1, 0) })
}

/// The machine-level syscalls (denied since the first version). Most of them check a
/// capability of the initial namespace first, so only root's control can tell the filter's
/// EPERM from the kernel's. Every argument is invalid: as root, the kernel refuses each call
/// before it does anything.
fn machine_rows() -> Vec<Row> {
    use libc::*;
    vec![
        Row {
            syscall: "open_by_handle_at",
            what: "open_by_handle_at(-1, NULL, 0)",
            prepare: Prepare::Nothing,
            // SAFETY: raw open_by_handle_at(2); its pointers are NULL: the kernel has nothing of
            // ours to write to (it answers EFAULT if it reaches one).
            call: || errno_of(unsafe { syscall(SYS_open_by_handle_at, -1, null::<c_void>(), 0) }),
            expect: EPERM,
            control: Control::AsRoot,
            why_control: "as root: the handle is copied (EFAULT) or fd -1 refused (EBADF)",
        },
        Row {
            syscall: "kexec_load",
            what: "kexec_load(0, 0, NULL, invalid flags)",
            prepare: Prepare::Nothing,
            // SAFETY: raw kexec_load(2); its pointers are NULL: the kernel has nothing of ours to
            // write to (it answers EFAULT if it reaches one).
            call: || errno_of(unsafe { syscall(SYS_kexec_load, 0, 0, null::<c_void>(), !0u64) }),
            expect: EPERM,
            control: Control::AsRoot,
            why_control: "as root: unknown flags, EINVAL",
        },
        Row {
            syscall: "kexec_file_load",
            what: "kexec_file_load(-1, -1, 0, NULL, invalid flags)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw kexec_file_load(2); its pointers are NULL: the kernel has nothing of
                // ours to write to (it answers EFAULT if it reaches one).
                errno_of(unsafe {
                    syscall(SYS_kexec_file_load, -1, -1, 0, null::<c_void>(), !0u64)
                })
            },
            expect: EPERM,
            control: Control::AsRoot,
            why_control: "as root: unknown flags, EINVAL",
        },
        Row {
            syscall: "init_module",
            what: "init_module(NULL, 0, NULL)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw init_module(2); its pointers are NULL: the kernel has nothing of ours
                // to write to (it answers EFAULT if it reaches one).
                errno_of(unsafe { syscall(SYS_init_module, null::<c_void>(), 0, null::<c_void>()) })
            },
            expect: EPERM,
            control: Control::AsRoot,
            why_control: "as root: an empty image, ENOEXEC (or EFAULT)",
        },
        Row {
            syscall: "finit_module",
            what: "finit_module(-1, NULL, invalid flags)",
            prepare: Prepare::Nothing,
            // SAFETY: raw finit_module(2); its pointers are NULL: the kernel has nothing of ours to
            // write to (it answers EFAULT if it reaches one).
            call: || errno_of(unsafe { syscall(SYS_finit_module, -1, null::<c_void>(), !0u32) }),
            expect: EPERM,
            control: Control::AsRoot,
            why_control: "as root: unknown flags, EINVAL",
        },
        Row {
            syscall: "delete_module",
            what: "delete_module(NULL, 0)",
            prepare: Prepare::Nothing,
            // SAFETY: raw delete_module(2); its pointers are NULL: the kernel has nothing of ours
            // to write to (it answers EFAULT if it reaches one).
            call: || errno_of(unsafe { syscall(SYS_delete_module, null::<c_void>(), 0) }),
            expect: EPERM,
            control: Control::AsRoot,
            why_control: "as root: the name is copied, EFAULT",
        },
        Row {
            syscall: "reboot",
            what: "reboot(bad magic)",
            prepare: Prepare::Nothing,
            // SAFETY: raw reboot(2); its pointers are NULL: the kernel has nothing of ours to write
            // to (it answers EFAULT if it reaches one).
            call: || errno_of(unsafe { syscall(SYS_reboot, 0, 0, 0, null::<c_void>()) }),
            expect: EPERM,
            control: Control::AsRoot,
            why_control: "as root: the magic numbers are wrong, EINVAL",
        },
        Row {
            syscall: "swapon",
            what: "swapon(NULL, invalid flags)",
            prepare: Prepare::Nothing,
            // SAFETY: raw swapon(2); its pointers are NULL: the kernel has nothing of ours to write
            // to (it answers EFAULT if it reaches one).
            call: || errno_of(unsafe { syscall(SYS_swapon, null::<c_void>(), !0u32) }),
            expect: EPERM,
            // Flags are checked before the capability.
            control: Control::Always,
            why_control: "flags are checked first: EINVAL",
        },
        Row {
            syscall: "swapoff",
            what: "swapoff(NULL)",
            prepare: Prepare::Nothing,
            // SAFETY: raw swapoff(2); its pointers are NULL: the kernel has nothing of ours to
            // write to (it answers EFAULT if it reaches one).
            call: || errno_of(unsafe { syscall(SYS_swapoff, null::<c_void>()) }),
            expect: EPERM,
            control: Control::AsRoot,
            why_control: "as root: the path is copied, EFAULT",
        },
        Row {
            syscall: "bpf",
            what: "bpf(unknown command, NULL, 0)",
            prepare: Prepare::Nothing,
            // SAFETY: raw bpf(2); its pointers are NULL: the kernel has nothing of ours to write to
            // (it answers EFAULT if it reaches one).
            call: || errno_of(unsafe { syscall(SYS_bpf, 0xffff, null::<c_void>(), 0) }),
            expect: EPERM,
            control: Control::AsRoot,
            why_control: "as root: an unknown command, EINVAL",
        },
    ]
}

/// The extra rules under `--block-net` (their full effect is in the CLI's escape suite).
fn block_rows() -> Vec<Row> {
    use libc::*;
    fn sock(domain: c_int, ty: c_int, proto: c_int) -> i32 {
        // SAFETY: socket(2) takes integers; the fd is closed at once.
        let fd = unsafe { socket(domain, ty, proto) };
        if fd >= 0 {
            // SAFETY: `fd` was just returned by socket(2) and is not used again.
            unsafe { close(fd) };
        }
        errno_of(fd as c_long)
    }
    /// A TCP fast open of a listener made here, by `how` (0 sendto, 1 sendmsg, 2 sendmmsg):
    /// connects and sends without connect(2).
    fn fast_open(how: u8) -> i32 {
        // SAFETY: socket/bind/listen/getsockname/send*/close on sockets made here, with
        // addresses and buffers on our stack.
        unsafe {
            let listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            let mut addr: sockaddr_in = std::mem::zeroed();
            addr.sin_family = AF_INET as sa_family_t;
            addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
            let mut len = std::mem::size_of::<sockaddr_in>() as socklen_t;
            if bind(listener, std::ptr::addr_of!(addr).cast(), len) != 0
                || listen(listener, 1) != 0
                || getsockname(listener, std::ptr::addr_of_mut!(addr).cast(), &mut len) != 0
            {
                return 200;
            }
            let fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            let mut byte = [b'x'];
            let mut iov = iovec {
                iov_base: byte.as_mut_ptr().cast(),
                iov_len: 1,
            };
            let mut msg: msghdr = std::mem::zeroed();
            msg.msg_name = std::ptr::addr_of_mut!(addr).cast();
            msg.msg_namelen = len;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            let rc = match how {
                0 => sendto(
                    fd,
                    byte.as_ptr().cast(),
                    1,
                    MSG_FASTOPEN,
                    msg.msg_name.cast(),
                    len,
                ) as c_long,
                1 => sendmsg(fd, &msg, MSG_FASTOPEN) as c_long,
                _ => {
                    let mut one = mmsghdr {
                        msg_hdr: msg,
                        msg_len: 0,
                    };
                    sendmmsg(fd, &mut one, 1, MSG_FASTOPEN) as c_long
                }
            };
            let errno = errno_of(if rc < 0 { -1 } else { 0 });
            close(fd);
            close(listener);
            errno
        }
    }
    vec![
        Row {
            syscall: "sendto",
            what: "sendto(MSG_FASTOPEN) to a loopback listener",
            prepare: Prepare::Nothing,
            call: || fast_open(0),
            expect: EACCES,
            control: Control::Always,
            why_control: "TCP fast open connects and sends (net.ipv4.tcp_fastopen's client bit)",
        },
        Row {
            syscall: "sendmsg",
            what: "sendmsg(MSG_FASTOPEN) to a loopback listener",
            prepare: Prepare::Nothing,
            call: || fast_open(1),
            expect: EACCES,
            control: Control::Always,
            why_control: "TCP fast open connects and sends",
        },
        Row {
            syscall: "sendmmsg",
            what: "sendmmsg(MSG_FASTOPEN) to a loopback listener",
            prepare: Prepare::Nothing,
            call: || fast_open(2),
            expect: EACCES,
            control: Control::Always,
            why_control: "TCP fast open connects and sends",
        },
        Row {
            syscall: "socket",
            what: "socket(AF_INET, SOCK_DGRAM, 0)",
            prepare: Prepare::Nothing,
            call: || sock(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0),
            expect: EACCES,
            control: Control::Always,
            why_control: "a UDP socket, closed at once",
        },
        Row {
            syscall: "socket",
            what: "socket(AF_INET6, SOCK_RAW, IPPROTO_ICMPV6)",
            prepare: Prepare::Nothing,
            call: || sock(AF_INET6, SOCK_RAW, IPPROTO_ICMPV6),
            expect: EACCES,
            control: Control::Always,
            why_control: "a raw socket as root, EPERM otherwise",
        },
        Row {
            syscall: "socket",
            what: "socket(AF_PACKET, SOCK_RAW, 0)",
            prepare: Prepare::Nothing,
            call: || sock(AF_PACKET, SOCK_RAW, 0),
            expect: EACCES,
            control: Control::Always,
            why_control: "a packet socket as root, EPERM otherwise",
        },
        Row {
            syscall: "socket",
            what: "socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP)",
            prepare: Prepare::Nothing,
            call: || sock(AF_INET, SOCK_STREAM, IPPROTO_SCTP),
            expect: EACCES,
            control: Control::Always,
            why_control: "an SCTP socket, or EPROTONOSUPPORT without the module",
        },
    ]
}

/// A path whose directory does not exist: creating or changing it fails with ENOENT.
const IN_MISSING_DIR: &std::ffi::CStr = c"/nonexistent-sandbox-seccomp-test/file";

/// A uid that is not ours (root's when we are not root).
fn another_uid() -> u32 {
    if is_root() {
        1
    } else {
        0
    }
}

/// Setting S_ISUID/S_ISGID (by chmod or by creating a file with them) and giving a file
/// away. x86_64 has the legacy calls too; other architectures only the `*at` forms.
#[cfg(target_arch = "x86_64")]
fn file_owner_rows() -> Vec<Row> {
    use libc::*;
    let mut rows = vec![
        Row {
            syscall: "chmod",
            what: "chmod(missing, 0755|S_ISUID)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw chmod(2); its paths are C-string constants of this program, which the
                // kernel only reads.
                errno_of(unsafe { syscall(SYS_chmod, IN_MISSING_DIR.as_ptr(), 0o755 | S_ISUID) })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no such directory: ENOENT",
        },
        Row {
            syscall: "fchmod",
            what: "fchmod(-1, 0755|S_ISUID)",
            prepare: Prepare::Nothing,
            // SAFETY: raw fchmod(2) with integer arguments only: no memory of ours is read or
            // written.
            call: || errno_of(unsafe { syscall(SYS_fchmod, -1, 0o755 | S_ISUID) }),
            expect: EPERM,
            control: Control::Always,
            why_control: "no file behind fd -1: EBADF",
        },
        Row {
            syscall: "fchmodat",
            what: "fchmodat(missing, 0755|S_ISUID)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw fchmodat(2); its paths are C-string constants of this program, which
                // the kernel only reads.
                errno_of(unsafe {
                    syscall(
                        SYS_fchmodat,
                        AT_FDCWD,
                        IN_MISSING_DIR.as_ptr(),
                        0o755 | S_ISUID,
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no such directory: ENOENT",
        },
        Row {
            syscall: "fchmodat2",
            what: "fchmodat2(missing, 0755|S_ISUID, 0)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw fchmodat2(2); its paths are C-string constants of this program, which
                // the kernel only reads.
                errno_of(unsafe {
                    syscall(
                        SYS_fchmodat2,
                        AT_FDCWD,
                        IN_MISSING_DIR.as_ptr(),
                        0o755 | S_ISUID,
                        0,
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no such directory: ENOENT (ENOSYS before Linux 6.6)",
        },
        Row {
            syscall: "creat",
            what: "creat(missing dir, 0755|S_ISUID)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw creat(2); its paths are C-string constants of this program, which the
                // kernel only reads.
                errno_of(unsafe { syscall(SYS_creat, IN_MISSING_DIR.as_ptr(), 0o755 | S_ISUID) })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no such directory: ENOENT",
        },
        Row {
            syscall: "mknod",
            what: "mknod(missing dir, S_IFREG|0755|S_ISUID)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw mknod(2); its paths are C-string constants of this program, which the
                // kernel only reads.
                errno_of(unsafe {
                    syscall(
                        SYS_mknod,
                        IN_MISSING_DIR.as_ptr(),
                        S_IFREG | 0o755 | S_ISUID,
                        0,
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no such directory: ENOENT",
        },
        Row {
            syscall: "mknodat",
            what: "mknodat(missing dir, S_IFREG|0755|S_ISUID)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw mknodat(2); its paths are C-string constants of this program, which
                // the kernel only reads.
                errno_of(unsafe {
                    syscall(
                        SYS_mknodat,
                        AT_FDCWD,
                        IN_MISSING_DIR.as_ptr(),
                        S_IFREG | 0o755 | S_ISUID,
                        0,
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no such directory: ENOENT",
        },
        Row {
            syscall: "open",
            what: "open(missing dir, O_CREAT, 0755|S_ISUID)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw open(2); its paths are C-string constants of this program, which the
                // kernel only reads.
                errno_of(unsafe {
                    syscall(
                        SYS_open,
                        IN_MISSING_DIR.as_ptr(),
                        O_CREAT | O_WRONLY,
                        0o755 | S_ISUID,
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no such directory: ENOENT",
        },
        Row {
            syscall: "openat",
            what: "openat(missing dir, O_CREAT, 0755|S_ISUID)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw openat(2); its paths are C-string constants of this program, which
                // the kernel only reads.
                errno_of(unsafe {
                    syscall(
                        SYS_openat,
                        AT_FDCWD,
                        IN_MISSING_DIR.as_ptr(),
                        O_CREAT | O_WRONLY,
                        0o755 | S_ISUID,
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no such directory: ENOENT",
        },
        Row {
            syscall: "open",
            what: "open(missing dir, O_TMPFILE, 0755|S_ISUID)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw open(2); its paths are C-string constants of this program, which the
                // kernel only reads.
                errno_of(unsafe {
                    syscall(
                        SYS_open,
                        IN_MISSING_DIR.as_ptr(),
                        O_TMPFILE | O_WRONLY,
                        0o755 | S_ISUID,
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no such directory: ENOENT",
        },
        Row {
            syscall: "openat",
            what: "openat(missing dir, O_TMPFILE, 0755|S_ISUID)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw openat(2); its paths are C-string constants of this program, which
                // the kernel only reads.
                errno_of(unsafe {
                    syscall(
                        SYS_openat,
                        AT_FDCWD,
                        IN_MISSING_DIR.as_ptr(),
                        O_TMPFILE | O_WRONLY,
                        0o755 | S_ISUID,
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no such directory: ENOENT",
        },
        Row {
            syscall: "chmod",
            what: "chmod(missing, 0755|S_ISGID)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw chmod(2); its paths are C-string constants of this program, which the
                // kernel only reads.
                errno_of(unsafe { syscall(SYS_chmod, IN_MISSING_DIR.as_ptr(), 0o755 | S_ISGID) })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no such directory: ENOENT",
        },
        Row {
            syscall: "fchmod",
            what: "fchmod(-1, 0755|S_ISGID)",
            prepare: Prepare::Nothing,
            // SAFETY: raw fchmod(2) with integer arguments only: no memory of ours is read or
            // written.
            call: || errno_of(unsafe { syscall(SYS_fchmod, -1, 0o755 | S_ISGID) }),
            expect: EPERM,
            control: Control::Always,
            why_control: "no file behind fd -1: EBADF",
        },
        Row {
            syscall: "fchmodat",
            what: "fchmodat(missing, 0755|S_ISGID)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw fchmodat(2); its paths are C-string constants of this program, which
                // the kernel only reads.
                errno_of(unsafe {
                    syscall(
                        SYS_fchmodat,
                        AT_FDCWD,
                        IN_MISSING_DIR.as_ptr(),
                        0o755 | S_ISGID,
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no such directory: ENOENT",
        },
        Row {
            syscall: "fchmodat2",
            what: "fchmodat2(missing, 0755|S_ISGID, 0)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw fchmodat2(2); its paths are C-string constants of this program, which
                // the kernel only reads.
                errno_of(unsafe {
                    syscall(
                        SYS_fchmodat2,
                        AT_FDCWD,
                        IN_MISSING_DIR.as_ptr(),
                        0o755 | S_ISGID,
                        0,
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no such directory: ENOENT (ENOSYS before Linux 6.6)",
        },
        Row {
            syscall: "creat",
            what: "creat(missing dir, 0755|S_ISGID)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw creat(2); its paths are C-string constants of this program, which the
                // kernel only reads.
                errno_of(unsafe { syscall(SYS_creat, IN_MISSING_DIR.as_ptr(), 0o755 | S_ISGID) })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no such directory: ENOENT",
        },
        Row {
            syscall: "mknod",
            what: "mknod(missing dir, S_IFREG|0755|S_ISGID)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw mknod(2); its paths are C-string constants of this program, which the
                // kernel only reads.
                errno_of(unsafe {
                    syscall(
                        SYS_mknod,
                        IN_MISSING_DIR.as_ptr(),
                        S_IFREG | 0o755 | S_ISGID,
                        0,
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no such directory: ENOENT",
        },
        Row {
            syscall: "mknodat",
            what: "mknodat(missing dir, S_IFREG|0755|S_ISGID)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw mknodat(2); its paths are C-string constants of this program, which
                // the kernel only reads.
                errno_of(unsafe {
                    syscall(
                        SYS_mknodat,
                        AT_FDCWD,
                        IN_MISSING_DIR.as_ptr(),
                        S_IFREG | 0o755 | S_ISGID,
                        0,
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no such directory: ENOENT",
        },
        Row {
            syscall: "open",
            what: "open(missing dir, O_CREAT, 0755|S_ISGID)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw open(2); its paths are C-string constants of this program, which the
                // kernel only reads.
                errno_of(unsafe {
                    syscall(
                        SYS_open,
                        IN_MISSING_DIR.as_ptr(),
                        O_CREAT | O_WRONLY,
                        0o755 | S_ISGID,
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no such directory: ENOENT",
        },
        Row {
            syscall: "openat",
            what: "openat(missing dir, O_CREAT, 0755|S_ISGID)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw openat(2); its paths are C-string constants of this program, which
                // the kernel only reads.
                errno_of(unsafe {
                    syscall(
                        SYS_openat,
                        AT_FDCWD,
                        IN_MISSING_DIR.as_ptr(),
                        O_CREAT | O_WRONLY,
                        0o755 | S_ISGID,
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no such directory: ENOENT",
        },
        Row {
            syscall: "open",
            what: "open(missing dir, O_TMPFILE, 0755|S_ISGID)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw open(2); its paths are C-string constants of this program, which the
                // kernel only reads.
                errno_of(unsafe {
                    syscall(
                        SYS_open,
                        IN_MISSING_DIR.as_ptr(),
                        O_TMPFILE | O_WRONLY,
                        0o755 | S_ISGID,
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no such directory: ENOENT",
        },
        Row {
            syscall: "openat",
            what: "openat(missing dir, O_TMPFILE, 0755|S_ISGID)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw openat(2); its paths are C-string constants of this program, which
                // the kernel only reads.
                errno_of(unsafe {
                    syscall(
                        SYS_openat,
                        AT_FDCWD,
                        IN_MISSING_DIR.as_ptr(),
                        O_TMPFILE | O_WRONLY,
                        0o755 | S_ISGID,
                    )
                })
            },
            expect: EPERM,
            control: Control::Always,
            why_control: "no such directory: ENOENT",
        },
        Row {
            syscall: "openat2",
            what: "openat2(missing dir, NULL how)",
            prepare: Prepare::Nothing,
            call: || {
                // SAFETY: raw openat2(2); its pointers are NULL or C-string constants of this
                // program: the kernel has nothing of ours to write to (it answers EFAULT if it
                // reaches a NULL).
                errno_of(unsafe {
                    syscall(
                        SYS_openat2,
                        AT_FDCWD,
                        IN_MISSING_DIR.as_ptr(),
                        null::<c_void>(),
                        24,
                    )
                })
            },
            expect: ENOSYS,
            control: Control::Always,
            why_control: "the struct is read first: EFAULT",
        },
    ];
    let chown: [ChownRow; 4] = [
        (
            "chown",
            "chown(missing, another uid, -1)",
            // SAFETY: raw chown(2); its paths are C-string constants of this program, which the
            // kernel only reads.
            || errno_of(unsafe { syscall(SYS_chown, IN_MISSING_DIR.as_ptr(), another_uid(), -1) }),
            NO_DIR,
        ),
        (
            "lchown",
            "lchown(missing, another uid, -1)",
            // SAFETY: raw lchown(2); its paths are C-string constants of this program, which the
            // kernel only reads.
            || errno_of(unsafe { syscall(SYS_lchown, IN_MISSING_DIR.as_ptr(), another_uid(), -1) }),
            NO_DIR,
        ),
        (
            "fchown",
            "fchown(-1, another uid, -1)",
            // SAFETY: raw fchown(2) with integer arguments only: no memory of ours is read or
            // written.
            || errno_of(unsafe { syscall(SYS_fchown, -1, another_uid(), -1) }),
            "no file behind fd -1: EBADF",
        ),
        (
            "fchownat",
            "fchownat(missing, another uid, -1)",
            || {
                // SAFETY: raw fchownat(2); its paths are C-string constants of this program, which
                // the kernel only reads.
                errno_of(unsafe {
                    syscall(
                        SYS_fchownat,
                        AT_FDCWD,
                        IN_MISSING_DIR.as_ptr(),
                        another_uid(),
                        -1,
                        0,
                    )
                })
            },
            NO_DIR,
        ),
    ];
    for (syscall, what, call, why_control) in chown {
        rows.push(Row {
            syscall,
            what,
            prepare: Prepare::Nothing,
            call,
            expect: EPERM,
            control: Control::Always,
            why_control,
        });
    }
    rows
}

/// (syscall, what, call, why_control) of a chown row.
type ChownRow = (&'static str, &'static str, fn() -> i32, &'static str);

const NO_DIR: &str = "no such directory: ENOENT";

#[cfg(not(target_arch = "x86_64"))]
fn file_owner_rows() -> Vec<Row> {
    // The `*at` forms are exercised on x86_64; here the plan's legacy calls do not exist.
    Vec::new()
}

/// The product's filters for a policy on a scratch worktree.
fn filters(block_net: bool) -> (Vec<BpfProgram>, BTreeSet<&'static str>) {
    let dir = tempfile::tempdir().unwrap();
    let policy = sandbox_policy::build(sandbox_policy::PolicyRequest {
        workdir: dir.path().into(),
        block_net,
        ..Default::default()
    })
    .unwrap();
    let mut plan = sandbox_policy::compile::seccomp::compile(&policy);
    // As the native backend adds it: no chown away from the uid the command runs as.
    // SAFETY: no arguments.
    let uid = unsafe { libc::geteuid() };
    plan.rules
        .extend(sandbox_policy::compile::seccomp::chown_rules(uid));
    // As the native backend adds them under a blocked network without a network namespace.
    if block_net {
        plan.rules
            .extend(sandbox_policy::compile::seccomp::fast_open_rules());
    }
    let programs = sandbox_host::backends::native::seccomp::compile(&plan).unwrap();
    (programs, plan.syscalls().collect())
}

/// A new user + mount namespace; as root, at least a new mount namespace.
fn enter_user_and_mount_namespace() -> bool {
    // SAFETY: unshare(2) takes flags only; the forked child has a single thread.
    unsafe {
        libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) == 0
            || (libc::geteuid() == 0 && libc::unshare(libc::CLONE_NEWNS) == 0)
    }
}

/// Forks; the child prepares, loads `filters` (when given), runs `call` and exits with its
/// result. Only async-signal-safe work happens in the child, except for the probes that
/// create threads (glibc keeps its allocator and thread bookkeeping usable after fork).
fn run(filters: Option<&[BpfProgram]>, prepare: Prepare, call: fn() -> i32) -> Outcome {
    // SAFETY: the child makes raw syscalls and exits with _exit; it never returns into the
    // test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = (|| {
            if prepare == Prepare::UserAndMountNamespace && !enter_user_and_mount_namespace() {
                return PREPARE_FAILED;
            }
            if let Some(filters) = filters {
                // SAFETY: integers only.
                if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
                    return FILTER_FAILED;
                }
                for filter in filters {
                    if seccompiler::apply_filter(filter).is_err() {
                        return FILTER_FAILED;
                    }
                }
            }
            call()
        })();
        // SAFETY: ends the child without running the parent's destructors or atexit hooks.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waitpid writes one int.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid, "waitpid: {}", std::io::Error::last_os_error());
    if libc::WIFSIGNALED(status) {
        return Outcome::Signaled(libc::WTERMSIG(status));
    }
    match libc::WEXITSTATUS(status) {
        SUCCESS => Outcome::Ok,
        FILTER_FAILED => Outcome::FilterFailed,
        PREPARE_FAILED => Outcome::PrepareFailed,
        CHILD_FAILED => Outcome::ChildFailed,
        errno => Outcome::Errno(errno),
    }
}

fn is_root() -> bool {
    // SAFETY: no arguments.
    unsafe { libc::geteuid() == 0 }
}

/// Whether this test process already runs under a seccomp filter (`Seccomp:` in
/// `/proc/self/status` is 2): controls may then get that filter's answers.
fn already_filtered() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .is_some_and(|v| v.trim() != "0")
}

/// Whether a new user + mount namespace lets this user mount: making `/` private there is a
/// real mount operation that touches nothing outside.
fn user_namespace_grants_mounts() -> bool {
    fn remount_private() -> i32 {
        // SAFETY: mount(2) with static strings, in the child's own mount namespace.
        errno_of(unsafe {
            libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                null(),
                libc::MS_REC | libc::MS_PRIVATE,
                null(),
            )
        } as c_long)
    }
    run(None, Prepare::UserAndMountNamespace, remount_private) == Outcome::Ok
}

fn strict() -> bool {
    std::env::var_os("SANDBOX_SECCOMP_TEST_STRICT").is_some_and(|v| v == "1")
}

/// Runs each row with and without the filter; panics with every row that went wrong.
fn check(rows: &[Row], block_net: bool) {
    let (programs, _) = filters(block_net);
    let root = is_root();
    let outer_filter = already_filtered();
    let namespaces = user_namespace_grants_mounts();
    let mut failures = Vec::new();
    let mut inconclusive = Vec::new();
    for row in rows {
        let filtered = run(Some(&programs), row.prepare, row.call);
        let control = run(None, row.prepare, row.call);
        let expected = Outcome::Errno(row.expect);
        // Why this environment cannot tell the filter's errno from the kernel's, if it cannot.
        let blind = match row.control {
            _ if outer_filter => Some("this test already runs under a seccomp filter"),
            Control::AsRoot if !root => Some("only root gets past the kernel's own EPERM"),
            Control::InUserNamespace if !namespaces => {
                Some("a new user namespace gives this user no CAP_SYS_ADMIN")
            }
            _ => None,
        };
        let mut problems = Vec::new();
        let mut unjudged = None;
        if filtered == Outcome::PrepareFailed {
            match blind {
                Some(reason) => unjudged = Some(reason),
                None => problems.push(format!("{}: the namespace setup failed", row.what)),
            }
        } else if filtered != expected {
            problems.push(format!(
                "{}: under the filter {filtered}, expected {expected}",
                row.what
            ));
        }
        if control == expected || control == Outcome::PrepareFailed {
            match blind {
                Some(reason) => unjudged = Some(reason),
                None => problems.push(format!(
                    "{}: the control gives {control} too, so the row proves nothing \
                     (expected: {})",
                    row.what, row.why_control
                )),
            }
        } else if matches!(control, Outcome::FilterFailed | Outcome::Signaled(_)) {
            problems.push(format!("{}: the control run failed: {control}", row.what));
        }
        let verdict = match (problems.is_empty(), unjudged) {
            (false, _) => "FAIL".to_string(),
            (true, Some(reason)) => format!("inconclusive: {reason}"),
            (true, None) => "ok".to_string(),
        };
        failures.extend(problems);
        if let Some(reason) = unjudged {
            inconclusive.push(format!("{}: {reason}", row.what));
        }
        println!(
            "block_net={block_net:<5} {:<72} filtered: {filtered:<7} control: {control:<15} {verdict}",
            row.what
        );
    }
    if !inconclusive.is_empty() {
        eprintln!(
            "{} row(s) inconclusive here:\n  {}",
            inconclusive.len(),
            inconclusive.join("\n  ")
        );
        if strict() {
            failures.extend(inconclusive);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn always_on_rules_deny_under_an_open_network() {
    check(&always_rows(), false);
}

#[test]
fn always_on_rules_deny_under_a_blocked_network() {
    check(&always_rows(), true);
}

#[test]
fn setuid_setgid_modes_and_chown_to_another_owner_are_denied() {
    check(&file_owner_rows(), false);
}

/// What the file-owner rules must leave alone: plain modes, creating files, opening without
/// O_CREAT whatever the (unused) mode argument holds, chown to ourselves.
#[test]
fn ordinary_modes_and_owners_still_work_under_the_filter() {
    let (programs, _) = filters(false);
    let dir = tempfile::tempdir().unwrap();
    let file =
        std::ffi::CString::new(dir.path().join("f").into_os_string().into_encoded_bytes()).unwrap();
    let file: &'static std::ffi::CStr = Box::leak(file.into_boxed_c_str());
    FILE.set(file).unwrap();
    fn probe() -> i32 {
        use libc::*;
        let path = FILE.get().unwrap().as_ptr();
        // SAFETY: system calls on a NUL-terminated path of our scratch directory.
        unsafe {
            let fd = openat(AT_FDCWD, path, O_CREAT | O_WRONLY | O_CLOEXEC, 0o644);
            if fd < 0 {
                return 100;
            }
            close(fd);
            if fchmodat(AT_FDCWD, path, 0o755, 0) != 0 {
                return 101;
            }
            // The mode argument is ignored without O_CREAT: garbage there must pass.
            let fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC, 0o6755);
            if fd < 0 {
                return 102;
            }
            close(fd as c_int);
            if fchownat(AT_FDCWD, path, geteuid(), u32::MAX, 0) != 0 {
                return 103;
            }
            if fchownat(AT_FDCWD, path, u32::MAX, u32::MAX, 0) != 0 {
                return 104;
            }
            let mut st: libc::stat = std::mem::zeroed();
            if stat(path, &mut st) != 0 || st.st_mode & 0o7777 != 0o755 {
                return 105;
            }
        }
        SUCCESS
    }
    assert_eq!(run(Some(&programs), Prepare::Nothing, probe), Outcome::Ok);
}

static FILE: std::sync::OnceLock<&'static std::ffi::CStr> = std::sync::OnceLock::new();

#[test]
fn machine_level_syscalls_are_denied() {
    check(&machine_rows(), false);
    check(&machine_rows(), true);
}

#[test]
fn blocked_network_denies_other_sockets() {
    check(&block_rows(), true);
    // Under an open network the same calls pass the filter.
    let (programs, _) = filters(false);
    for row in block_rows() {
        let filtered = run(Some(&programs), row.prepare, row.call);
        let control = run(None, row.prepare, row.call);
        assert_eq!(filtered, control, "{} under an open network", row.what);
    }
}

/// A row for every syscall the plan names, so a new rule cannot go untested.
#[test]
fn every_rule_in_the_plan_has_a_row() {
    let rows: BTreeSet<&str> = always_rows()
        .iter()
        .chain(machine_rows().iter())
        .chain(block_rows().iter())
        .chain(file_owner_rows().iter())
        .map(|r| r.syscall)
        .collect();
    for block_net in [false, true] {
        let (_, syscalls) = filters(block_net);
        let untested: Vec<_> = syscalls.difference(&rows).collect();
        assert!(untested.is_empty(), "no test row for {untested:?}");
    }
}

/// clone3 answers ENOSYS, and glibc falls back to clone(2): fork, posix_spawn and threads
/// still work under the filter.
#[test]
fn processes_and_threads_still_start_under_the_filter() {
    fn fork_child() -> i32 {
        // SAFETY: the child only calls _exit.
        match unsafe { libc::fork() } {
            // SAFETY: in the forked child: _exit(2) ends it without running destructors or touching
            // what it shares with the parent.
            0 => unsafe { libc::_exit(0) },
            pid if pid > 0 => reap(pid),
            _ => errno_of(-1),
        }
    }
    fn spawn_true() -> i32 {
        let path = c"/bin/true";
        let argv = [path.as_ptr() as *mut libc::c_char, std::ptr::null_mut()];
        let envp = [std::ptr::null_mut::<libc::c_char>()];
        let mut pid = 0;
        // SAFETY: NUL-terminated argv and envp arrays on our stack; no file actions.
        let rc = unsafe {
            libc::posix_spawn(
                &mut pid,
                path.as_ptr(),
                null(),
                null(),
                argv.as_ptr(),
                envp.as_ptr(),
            )
        };
        if rc != 0 {
            return rc;
        }
        reap(pid)
    }
    fn start_thread() -> i32 {
        extern "C" fn body(arg: *mut c_void) -> *mut c_void {
            arg
        }
        let mut thread: libc::pthread_t = 0;
        let marker = 0x5eed_usize as *mut c_void;
        // SAFETY: default attributes; `body` returns its argument.
        let rc = unsafe { libc::pthread_create(&mut thread, null(), body, marker) };
        if rc != 0 {
            return rc;
        }
        let mut ret = std::ptr::null_mut();
        // SAFETY: joins the thread created above.
        if unsafe { libc::pthread_join(thread, &mut ret) } != 0 || ret != marker {
            return CHILD_FAILED;
        }
        SUCCESS
    }
    fn std_thread() -> i32 {
        match std::thread::spawn(|| 7).join() {
            Ok(7) => SUCCESS,
            _ => CHILD_FAILED,
        }
    }
    for block_net in [false, true] {
        let (programs, _) = filters(block_net);
        for (what, call) in [
            ("fork()", fork_child as fn() -> i32),
            ("posix_spawn(/bin/true)", spawn_true),
            ("pthread_create", start_thread),
            ("std::thread::spawn", std_thread),
        ] {
            let filtered = run(Some(&programs), Prepare::Nothing, call);
            println!("block_net={block_net} {what:<24} filtered: {filtered}");
            assert_eq!(filtered, Outcome::Ok, "{what} under the filter");
        }
    }
}

/// Without a private view the native backend adds one rule: no new unix sockets (a pathname
/// socket would reach host services), while `socketpair` keeps working.
#[test]
fn without_a_view_unix_sockets_are_denied_but_socketpair_works() {
    let dir = tempfile::tempdir().unwrap();
    let policy = sandbox_policy::build(sandbox_policy::PolicyRequest {
        workdir: dir.path().into(),
        ..Default::default()
    })
    .unwrap();
    let mut plan = sandbox_policy::compile::seccomp::compile(&policy);
    plan.rules
        .push(sandbox_policy::compile::seccomp::unix_socket_rule());
    let programs = sandbox_host::backends::native::seccomp::compile(&plan).unwrap();
    fn unix_socket() -> i32 {
        // SAFETY: socket(2) takes integers; the fd is closed at once.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd >= 0 {
            // SAFETY: `fd` was just returned by socket(2) and is not used again.
            unsafe { libc::close(fd) };
        }
        errno_of(fd as c_long)
    }
    fn pair() -> i32 {
        let mut fds = [0; 2];
        // SAFETY: socketpair(2) writes two ints into our array; both are closed at once.
        let rc = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) };
        if rc == 0 {
            // SAFETY: both fds were just returned by socketpair(2) and are not used again.
            unsafe {
                libc::close(fds[0]);
                libc::close(fds[1]);
            }
        }
        errno_of(rc as c_long)
    }
    assert_eq!(
        run(Some(&programs), Prepare::Nothing, unix_socket),
        Outcome::Errno(libc::EACCES)
    );
    assert_eq!(
        run(None, Prepare::Nothing, unix_socket),
        Outcome::Ok,
        "the control"
    );
    assert_eq!(run(Some(&programs), Prepare::Nothing, pair), Outcome::Ok);
}
