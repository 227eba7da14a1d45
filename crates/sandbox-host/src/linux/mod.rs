//! The Linux native backend: a private view (user + mount namespaces), Landlock and seccomp,
//! applied between fork and exec.

pub mod abi;
pub mod caches;
pub mod cgroup;
pub mod landlock;
pub mod native;
pub mod netns;
pub(crate) mod publish;
pub mod seccomp;
pub mod userns;
pub mod view;
