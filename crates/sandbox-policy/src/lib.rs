//! The policy model of `sandbox`: one plain-data [`Policy`], built from flags and trusted
//! configuration ([`build()`]), and pure compilers from it to each backend's own form
//! ([`compile`]). Nothing here applies anything; `sandbox-host` and the VM crates do.

pub mod agents;
pub mod build;
pub mod compile;
pub mod env;
pub mod error;
pub mod git;
pub mod model;
#[cfg(test)]
pub(crate) mod testutil;

pub use build::{build, PolicyRequest};
pub use env::{EnvNameError, EnvPolicy};
pub use error::PolicyError;
pub use model::{
    AgentGrantPath, AgentGrants, FsPolicy, GitLayout, Grant, GrantReason, Limits, NetPolicy,
    PointerFile, Policy, PrivateCopy, Workspace,
};
