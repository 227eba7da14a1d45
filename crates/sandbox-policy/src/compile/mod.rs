//! Pure compilers from a [`Policy`](crate::Policy) to each backend's own form. Each is a
//! function of the policy alone, so tests can inspect the output on any OS.

pub mod hints;
pub mod landlock;
pub mod limits;
pub mod nono;
pub mod seatbelt;
pub mod seccomp;
pub mod view;
