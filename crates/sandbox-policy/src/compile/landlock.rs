//! Policy → Landlock rules, as data. The platform step (`sandbox-host`) turns each rule into a
//! `landlock` crate call and reports which rights this kernel's ABI enforces.

use std::path::PathBuf;

use serde::Serialize;

use crate::error::PolicyError;
use crate::model::Policy;

/// Abstract access classes; `sandbox-host` maps them to Landlock access-right sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// Read files, list directories, execute.
    ReadExec,
    /// Everything: read, write, create, remove, rename, truncate, execute.
    ReadWrite,
    /// Read and write files (character devices), including device ioctls.
    Device,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PathRule {
    pub path: PathBuf,
    pub access: Access,
    pub why: String,
}

/// TCP port rules; `None` in the plan means TCP is not restricted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TcpRules {
    pub connect: Vec<u16>,
    pub bind: Vec<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LandlockPlan {
    pub paths: Vec<PathRule>,
    pub tcp: Option<TcpRules>,
    /// Deny signals to processes outside the sandbox (ABI 6).
    pub scope_signals: bool,
    /// Deny connecting to abstract unix sockets created outside the sandbox (ABI 6).
    pub scope_abstract_unix: bool,
}

/// Compiles the filesystem, TCP and scoping parts. Refuses a layout whose git hooks/config the
/// kernel could not keep read-only (unless the user accepted that).
pub fn compile(policy: &Policy) -> Result<LandlockPlan, PolicyError> {
    if let Some(problem) = policy.git_protection_problem() {
        return Err(PolicyError::UnprotectedGit(problem));
    }
    let mut paths = Vec::new();
    for dir in &policy.fs.system_read {
        paths.push(PathRule {
            path: dir.clone(),
            access: Access::ReadExec,
            why: "system".into(),
        });
    }
    for grant in &policy.fs.read {
        paths.push(PathRule {
            path: grant.path.clone(),
            access: Access::ReadExec,
            why: grant.reason.as_str().into(),
        });
    }
    for grant in &policy.fs.write {
        paths.push(PathRule {
            path: grant.path.clone(),
            access: Access::ReadWrite,
            why: grant.reason.as_str().into(),
        });
    }
    for dev in &policy.fs.devices {
        paths.push(PathRule {
            path: dev.clone(),
            access: Access::Device,
            why: "device".into(),
        });
    }
    let tcp = policy
        .net
        .open_ports(policy.hook_port)
        .map(|ports| TcpRules {
            connect: ports.clone(),
            bind: ports,
        });
    Ok(LandlockPlan {
        paths,
        tcp,
        scope_signals: true,
        scope_abstract_unix: true,
    })
}
