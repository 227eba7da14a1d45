//! The policy model of `sandbox`: one plain-data [`Policy`], built from flags and trusted
//! configuration, and pure compilers from it to each backend's own form. Nothing here
//! applies anything; the `sandbox-host`, `sandbox-lima` and `sandbox-box` crates do.

pub mod env;

pub use env::EnvPolicy;
