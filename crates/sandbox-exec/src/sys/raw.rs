//! The system calls the pid namespace's init makes (`crate::pidns`), without the C library:
//! init is a child of a possibly multi-threaded process (a copy of its memory, where a lock
//! the C library holds may stay held for good), and the command's process shares init's
//! memory until it executes, so no wrapper of the C library is called and no `errno` is
//! written. Each returns the kernel's answer as it is: the result, or minus the errno.

/// # Safety
/// The arguments must be valid for system call `n` (pointers into live memory).
#[cfg(target_arch = "x86_64")]
unsafe fn syscall(n: libc::c_long, a: usize, b: usize, c: usize, d: usize) -> isize {
    let ret: isize;
    // SAFETY: the syscall instruction with the Linux x86_64 convention (rcx and r11 are
    // clobbered by the kernel); what the call does with its arguments is the caller's
    // contract (this function is unsafe).
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") n as isize => ret,
            in("rdi") a,
            in("rsi") b,
            in("rdx") c,
            in("r10") d,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack)
        );
    }
    ret
}

/// # Safety
/// The arguments must be valid for system call `n` (pointers into live memory).
#[cfg(target_arch = "aarch64")]
unsafe fn syscall(n: libc::c_long, a: usize, b: usize, c: usize, d: usize) -> isize {
    let ret: isize;
    // SAFETY: svc 0 with the Linux aarch64 convention; what the call does with its
    // arguments is the caller's contract (this function is unsafe).
    unsafe {
        core::arch::asm!(
            "svc 0",
            in("x8") n,
            inlateout("x0") a as isize => ret,
            in("x1") b,
            in("x2") c,
            in("x3") d,
            options(nostack)
        );
    }
    ret
}

/// Elsewhere the split is refused before init exists (`crate::pidns::SUPPORTED`).
///
/// # Safety
/// None needed: nothing is called.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
unsafe fn syscall(_n: libc::c_long, _a: usize, _b: usize, _c: usize, _d: usize) -> isize {
    -(libc::ENOSYS as isize)
}

/// `PR_SET_PDEATHSIG`: `signal` reaches the caller when its parent dies.
pub(crate) fn set_parent_death_signal(signal: libc::c_int) -> isize {
    // SAFETY: prctl(2) with integer arguments.
    unsafe {
        syscall(
            libc::SYS_prctl,
            libc::PR_SET_PDEATHSIG as usize,
            signal as usize,
            0,
            0,
        )
    }
}

/// `PR_SET_DUMPABLE`: whether the caller's memory can be read through `/proc/PID/mem`,
/// `environ` and ptrace by a process without `CAP_SYS_PTRACE` where its memory belongs.
pub(crate) fn set_dumpable(dumpable: bool) -> isize {
    // SAFETY: prctl(2) with integer arguments.
    unsafe {
        syscall(
            libc::SYS_prctl,
            libc::PR_SET_DUMPABLE as usize,
            usize::from(dumpable),
            0,
            0,
        )
    }
}

/// close_range(2) from `first` to `last`, closing.
pub(crate) fn close_range(first: usize, last: usize) -> isize {
    // SAFETY: close_range(2) with integer arguments.
    unsafe { syscall(libc::SYS_close_range, first, last, 0, 0) }
}

/// close(2) of a descriptor number (EBADF for a free one).
pub(crate) fn close(fd: usize) -> isize {
    // SAFETY: close(2) takes an integer.
    unsafe { syscall(libc::SYS_close, fd, 0, 0, 0) }
}

/// write(2) of one byte.
pub(crate) fn write_byte(fd: usize, byte: u8) -> isize {
    // SAFETY: write(2) reads one byte from our stack.
    unsafe { syscall(libc::SYS_write, fd, std::ptr::addr_of!(byte) as usize, 1, 0) }
}

/// write(2) of `bytes`: the count written, or minus the errno.
pub(crate) fn write(fd: usize, bytes: &[u8]) -> isize {
    // SAFETY: write(2) reads `bytes.len()` bytes from the slice we borrow.
    unsafe { syscall(libc::SYS_write, fd, bytes.as_ptr() as usize, bytes.len(), 0) }
}

/// wait4(2) for any child (`__WALL`: clones too), its status into `status`: the pid reaped.
pub(crate) fn wait_any(status: &mut libc::c_int) -> isize {
    // SAFETY: wait4(2) writes the status into the integer we borrow mutably.
    unsafe {
        syscall(
            libc::SYS_wait4,
            -1isize as usize,
            std::ptr::from_mut(status) as usize,
            libc::__WALL as usize,
            0,
        )
    }
}

/// munmap(2).
///
/// # Safety
/// `addr` and `len` are a mapping of ours that nothing uses any more.
pub(crate) unsafe fn munmap(addr: *mut libc::c_void, len: usize) -> isize {
    // SAFETY: the caller's contract (this function is unsafe).
    unsafe { syscall(libc::SYS_munmap, addr as usize, len, 0, 0) }
}

/// exit_group(2): ends every thread of the process.
pub(crate) fn exit_group(code: usize) -> ! {
    loop {
        // SAFETY: exit_group(2) does not return.
        unsafe { syscall(libc::SYS_exit_group, code, 0, 0, 0) };
    }
}
