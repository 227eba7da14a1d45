//! The BoxLite backend: microVM boxes booted from OCI images by the `boxlite` crate.
//!
//! - [`runtime_files`]: the pinned runtime files (shim, guest agent, libkrunfw, e2fsprogs),
//!   where they come from and whether a directory holds exactly them. Always built: `doctor`
//!   and `cargo xtask boxlite-runtime` use it without the engine.

pub mod runtime_files;
