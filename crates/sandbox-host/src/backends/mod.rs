//! The backends of this crate, one place each: what a backend enforces, how it prepares a
//! session and arms a command behind the seam ([`crate::seam`]). The registry there opens
//! them by name; Lima and BoxLite live in their own crates behind the same seam.
//!
//! * [`native`]: in-process kernel limits — the private view, Landlock, seccomp and the
//!   network namespace on Linux; Seatbelt on macOS.
//! * [`nono`]: the policy as a nono manifest, run by the pinned nono CLI.
//! * [`custom`]: a user's launcher owns the boundary.
//! * `host`: no boundary, an explicit and labelled opt-out.
//! * `placement`: where a program that decides the boundary may live (nono, a launcher).

pub mod custom;
pub(crate) mod host;
pub mod native;
pub mod nono;
pub(crate) mod placement;
