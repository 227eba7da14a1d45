//! The policy model of `sandbox`: one plain-data [`Policy`], built from flags and trusted
//! configuration ([`build()`]), and pure compilers from it to each backend's own form
//! ([`compile`]). Nothing here applies anything; `sandbox-host` and the VM crates do.

pub mod agents;
pub mod build;
pub mod compile;
pub mod env;
pub mod error;
pub mod git;
pub mod hostfiles;
pub mod model;
pub mod netmode;
pub mod secrets;
#[cfg(test)]
pub(crate) mod testutil;
pub mod toolchains;
pub mod why;

pub use build::{build, PolicyRequest};
pub use env::{EnvNameError, EnvPolicy};
pub use error::PolicyError;
pub use hostfiles::{HostFile, HOST_FILES};
pub use model::{
    AgentGrantPath, AgentGrants, CacheLayer, FsPolicy, GitLayout, Grant, GrantReason, HomePolicy,
    Limit, LimitSource, Limits, Masked, NetPolicy, PointerFile, Policy, PrivateCopy, Publish,
    Toolchain, Workspace,
};
pub use netmode::{NetMode, NetModeKind};
pub use secrets::{is_secret, secrets_under, SecretKind};
