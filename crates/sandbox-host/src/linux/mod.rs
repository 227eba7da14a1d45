//! The Linux native backend: Landlock + seccomp, applied between fork and exec.

pub mod abi;
pub mod landlock;
pub mod native;
pub mod seccomp;
