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
    // The quarantined store's overlay gets its rule in the child, on the overlay itself (a
    // rule on a covered mount point is never consulted): see the host's view.
    Ok(rules(policy))
}

/// The same rules, as a second layer under the private view ([`super::view`]): the view keeps
/// git hooks and config read-only with binds, so only the layouts it cannot protect are
/// refused (a main worktree is fine there).
pub fn compile_under_view(policy: &Policy) -> Result<LandlockPlan, PolicyError> {
    if let Some(problem) = super::view::view_git_problem(policy) {
        return Err(PolicyError::UnprotectedGit(problem));
    }
    let mut plan = rules(policy);
    // In the view a private copy is what lies at the real path: the run may write it. The
    // rule is opened on the host, so it names the copy's own file (the bind shares its inode).
    for copy in &policy.fs.copies {
        plan.paths.push(PathRule {
            path: copy.copy.clone(),
            access: Access::ReadWrite,
            why: "a private copy (the host's file is untouched)".into(),
        });
    }
    Ok(plan)
}

fn rules(policy: &Policy) -> LandlockPlan {
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
    LandlockPlan {
        paths,
        tcp,
        scope_signals: true,
        scope_abstract_unix: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::linked_policy;
    use std::path::Path;

    fn access_of(plan: &LandlockPlan, path: &str) -> Vec<Access> {
        plan.paths
            .iter()
            .filter(|r| r.path == Path::new(path))
            .map(|r| r.access)
            .collect()
    }

    #[test]
    fn linked_worktree_rules() {
        let plan = compile(&linked_policy(false)).unwrap();
        assert_eq!(access_of(&plan, "/work/task"), vec![Access::ReadWrite]);
        assert_eq!(access_of(&plan, "/repo/.git"), vec![Access::ReadExec]);
        assert_eq!(
            access_of(&plan, "/repo/.git/objects"),
            vec![Access::ReadWrite]
        );
        assert_eq!(
            access_of(&plan, "/repo/.git/worktrees/task"),
            vec![Access::ReadWrite]
        );
        assert_eq!(access_of(&plan, "/usr"), vec![Access::ReadExec]);
        assert_eq!(access_of(&plan, "/dev/null"), vec![Access::Device]);
        // Nothing grants hooks or config beyond the read-only common dir.
        assert!(plan
            .paths
            .iter()
            .all(|r| !r.path.starts_with("/repo/.git/hooks")));
        assert!(plan.tcp.is_none());
        assert!(plan.scope_signals && plan.scope_abstract_unix);
    }

    #[test]
    fn blocked_network_allows_listed_ports_and_the_hook_port() {
        let plan = compile(&linked_policy(true)).unwrap();
        let tcp = plan.tcp.unwrap();
        assert_eq!(tcp.connect, vec![3000, 7465]);
        assert_eq!(tcp.bind, vec![3000, 7465]);
    }

    #[test]
    fn main_worktree_is_refused_unless_accepted() {
        let mut p = linked_policy(false);
        let git = p.workspace.git.as_mut().unwrap();
        git.is_linked = false;
        git.common_dir = "/work/task/.git".into();
        let err = compile(&p).unwrap_err();
        assert!(matches!(err, PolicyError::UnprotectedGit(_)), "{err}");
        p.unprotected_git = true;
        assert!(compile(&p).is_ok());
    }

    #[test]
    fn a_hooks_path_in_the_writable_tree_is_refused_without_the_view() {
        let mut p = linked_policy(false);
        p.workspace.git.as_mut().unwrap().hooks_path = Some("/work/task/.husky".into());
        let err = compile(&p).unwrap_err().to_string();
        assert!(err.contains("core.hooksPath /work/task/.husky"), "{err}");
        // The view keeps it read-only instead.
        assert!(compile_under_view(&p).is_ok());
        p.unprotected_git = true;
        assert!(compile(&p).is_ok());
        // Outside the grants it is none of the sandbox's business.
        p.unprotected_git = false;
        p.workspace.git.as_mut().unwrap().hooks_path = Some("/home/u/.githooks".into());
        assert!(compile(&p).is_ok());
    }

    #[test]
    fn a_write_grant_covering_the_common_dir_is_refused() {
        let mut p = linked_policy(false);
        p.fs.write.push(crate::model::Grant {
            path: "/repo".into(),
            reason: crate::model::GrantReason::User,
        });
        let err = compile(&p).unwrap_err().to_string();
        assert!(err.contains("/repo"), "{err}");
    }
}
