//! The crate's raw system calls, behind safe wrappers (as youki's `syscall/`): every `libc`
//! call that needs `unsafe` is made here, once, with its `SAFETY` comment, and reports failure
//! as an [`Errno`](nix::errno::Errno) (`nix::Result`). The rest of the crate calls these
//! functions instead of `libc`.
//!
//! Much of this runs in a child between fork (or clone) and exec: the child prelude
//! ([`crate::prelude`]), the pid namespace split (`crate::pidns`) and the direct path's child
//! ([`crate::direct`]), in a child of a possibly multi-threaded parent, some of it sharing the
//! parent's memory. So every wrapper here is one system call (or a fixed few) and nothing
//! else: no allocation, no lock, no `tracing`; it reads `errno` right after its call and
//! writes nothing else. Buffers come from the caller (slices, [`CStr`](std::ffi::CStr)s,
//! structs on the stack); what must be allocated, such as an `execve` argument array
//! ([`CStrArray`]), is built in the parent before the fork.
//!
//! A few functions stay `unsafe fn`, because what they do cannot be made sound by their
//! arguments alone (starting a process that shares our memory, unmapping a stack): their
//! callers keep the `SAFETY` comment that says why the contract holds. [`raw`] is apart: the
//! system calls of the pid namespace's init, made without the C library.

mod fd;
mod process;
#[cfg(target_os = "linux")]
pub(crate) mod raw;
mod signal;

pub(crate) use fd::*;
pub(crate) use process::*;
pub(crate) use signal::*;
