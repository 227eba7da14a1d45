//! The crate's raw system calls, behind safe wrappers (as youki's `syscall/`, and as
//! `sandbox-exec`'s `sys/`): every `libc` call that needs `unsafe` is made here, once, with its
//! `SAFETY` comment, and reports failure as an [`Errno`](nix::errno::Errno) (`nix::Result`).
//! The rest of the crate calls these functions instead of `libc`.
//!
//! Much of this runs in the child between fork and exec: the private view's mounts
//! (`backends::native::view`), the capability drop, Landlock's `restrict_self`, the network
//! namespace's loopback and the listeners handed over (`backends::native::netns`), the
//! published ports' connector (`backends::native::publish`), the probes of `userns`. The
//! child of a possibly multi-threaded parent may make only async-signal-safe calls. So every
//! wrapper here is one system call (or a fixed few) and nothing else: no allocation, no lock,
//! no `tracing`; it reads `errno` right after its call and writes nothing else (a caller that
//! reads [`Errno::last`](nix::errno::Errno::last) after a failed wrapper still gets that
//! call's errno). Buffers come from the caller (slices, [`CStr`](std::ffi::CStr)s, structs on
//! the stack, raw descriptor numbers). The few wrappers made only for the parent (opening a
//! descriptor it then owns, a `Vec` of received descriptors) say so.
//!
//! One function stays `unsafe fn`, because what it does cannot be made sound by its arguments
//! alone: `fork` (the child of a multi-threaded process must make only async-signal-safe
//! calls until it exits). Its callers keep the `SAFETY` comment that says why the contract
//! holds.
//!
//! Files: `fs.rs` (descriptors, paths, locks, extended attributes), `beneath.rs` (a path
//! opened beneath a directory through no link, for the view's mounts), `mount.rs` (mounts and the
//! root), `namespace.rs` (entering and naming namespaces), `socket.rs` (sockets and descriptor
//! passing), `process.rs` (fork, exit, prctl, waiting), `landlock.rs`, `caps.rs`
//! (capabilities). Everything is re-exported here: callers write `sys::mount(..)`.

#[cfg(target_os = "linux")]
mod beneath;
#[cfg(target_os = "linux")]
mod caps;
mod fs;
#[cfg(target_os = "linux")]
mod landlock;
#[cfg(target_os = "linux")]
mod mount;
#[cfg(target_os = "linux")]
mod namespace;
#[cfg(target_os = "linux")]
mod process;
#[cfg(target_os = "linux")]
mod socket;

#[cfg(target_os = "linux")]
pub(crate) use beneath::*;
#[cfg(target_os = "linux")]
pub(crate) use caps::*;
pub(crate) use fs::*;
#[cfg(target_os = "linux")]
pub(crate) use landlock::*;
#[cfg(target_os = "linux")]
pub(crate) use mount::*;
#[cfg(target_os = "linux")]
pub(crate) use namespace::*;
#[cfg(target_os = "linux")]
pub(crate) use process::*;
#[cfg(target_os = "linux")]
pub(crate) use socket::*;
