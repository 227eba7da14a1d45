//! Landlock rules from a [`LandlockPlan`], built in the parent (opening every granted path
//! once, with `O_PATH`). Only the finished ruleset's fd crosses into the child.

use std::os::fd::OwnedFd;

use landlock::{
    Access, AccessFs, AccessNet, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope, ABI,
};
use sandbox_policy::compile::landlock::{Access as Class, LandlockPlan};

use crate::error::HostError;
use crate::report::Enforcement;

/// The newest ABI this build knows. Rights the running kernel lacks are dropped by the
/// crate's best-effort mode; [`gaps`] reports the ones that matter.
const TARGET: ABI = ABI::V10;

fn err(step: impl Into<String>, e: impl std::fmt::Display) -> HostError {
    HostError::LandlockRuleset {
        step: step.into(),
        cause: e.to_string(),
    }
}

fn rights(class: Class, is_dir: bool) -> landlock::BitFlags<AccessFs> {
    let all = match class {
        Class::ReadExec => AccessFs::from_read(TARGET),
        Class::ReadWrite => AccessFs::from_all(TARGET),
        // Devices: read, write, truncate and ioctl, no directory operations.
        Class::Device => AccessFs::from_file(TARGET),
    };
    if is_dir {
        all
    } else {
        all & AccessFs::from_file(TARGET)
    }
}

/// Creates the ruleset and returns its fd (`None` when the kernel has no Landlock at all).
pub fn build(plan: &LandlockPlan) -> Result<Option<OwnedFd>, HostError> {
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(TARGET))
        .map_err(|e| err("handling filesystem access", e))?;
    if plan.tcp.is_some() {
        ruleset = ruleset
            .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
            .map_err(|e| err("handling TCP access", e))?;
    }
    let mut scopes = landlock::BitFlags::<Scope>::EMPTY;
    if plan.scope_signals {
        scopes |= Scope::Signal;
    }
    if plan.scope_abstract_unix {
        scopes |= Scope::AbstractUnixSocket;
    }
    if !scopes.is_empty() {
        ruleset = ruleset
            .scope(scopes)
            .map_err(|e| err("scoping signals and abstract sockets", e))?;
    }
    let mut created = ruleset
        .create()
        .map_err(|e| err("creating the Landlock ruleset", e))?;
    for rule in &plan.paths {
        let fd = match PathFd::new(&rule.path) {
            Ok(fd) => fd,
            // A system directory may vanish between discovery and now; a grant the user
            // asked for was checked to exist when the policy was built.
            Err(e) => {
                tracing::debug!(path = %rule.path.display(), error = %e, "skipping rule");
                continue;
            }
        };
        let is_dir = std::fs::metadata(&rule.path)
            .map(|m| m.is_dir())
            .unwrap_or(false);
        created = created
            .add_rule(PathBeneath::new(fd, rights(rule.access, is_dir)))
            .map_err(|e| err(format!("granting {}", rule.path.display()), e))?;
    }
    if let Some(tcp) = &plan.tcp {
        for &port in &tcp.connect {
            created = created
                .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
                .map_err(|e| err(format!("allowing TCP connect to port {port}"), e))?;
        }
        for &port in &tcp.bind {
            created = created
                .add_rule(NetPort::new(port, AccessNet::BindTcp))
                .map_err(|e| err(format!("allowing TCP bind on port {port}"), e))?;
        }
    }
    Ok(created.into())
}

/// The filesystem rights a read-write rule grants a directory on this kernel, as
/// `landlock_add_rule` takes them (for a rule added in the child).
pub fn read_write_dir_bits(abi: i32) -> u64 {
    (rights(Class::ReadWrite, true) & AccessFs::from_all(ABI::from(abi))).bits()
}

/// Listing a directory only, as `landlock_add_rule` takes it: the view's root (`ls /`), where
/// only the policy's paths exist.
pub fn list_dir_bits() -> u64 {
    (AccessFs::from_all(ABI::V1) & AccessFs::ReadDir).bits()
}

/// The rights a read-only grant gives a directory (the pid namespace's `/proc`) on this
/// kernel, as `landlock_add_rule` takes them (for a rule added in the child).
pub fn read_dir_bits(abi: i32) -> u64 {
    (rights(Class::ReadExec, true) & AccessFs::from_all(ABI::from(abi))).bits()
}

/// The rights a device rule grants a directory of devices (the private devpts) on this
/// kernel, as `landlock_add_rule` takes them (for a rule added in the child).
pub fn device_dir_bits(abi: i32) -> u64 {
    (rights(Class::Device, true) & AccessFs::from_all(ABI::from(abi))).bits()
}

/// What Landlock on this kernel gives `plan`: the filesystem rights it handles and its
/// caveats. Which of the policy's properties hold, and by which layer, is the run's
/// accounting over all its layers ([`crate::report::layers::account`]).
pub fn enforcement(plan: &LandlockPlan, abi: i32) -> Enforcement {
    let kernel = ABI::from(abi);
    let handled = AccessFs::from_all(kernel);
    let names = |set: landlock::BitFlags<AccessFs>| -> Vec<String> {
        set.iter().map(|a| format!("{a:?}")).collect()
    };
    let mut e = Enforcement {
        mechanism: "landlock+seccomp".into(),
        landlock_abi: Some(abi),
        fs_rights_enforced: names(handled),
        fs_rights_missing: names(AccessFs::from_all(TARGET) & !handled),
        ..Enforcement::default()
    };
    if abi < 9 {
        e.notes.push(
            "connecting to pathname unix sockets is not filtered before Landlock ABI 9; the \
             sandbox's own services authenticate their clients instead"
                .into(),
        );
    }
    if plan.tcp.is_some() {
        e.notes.push(
            "Landlock port rules match ports, not addresses: an allowed port is reachable on \
             every host"
                .into(),
        );
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_policy::compile::landlock::TcpRules;

    fn plan(block: bool) -> LandlockPlan {
        LandlockPlan {
            paths: vec![],
            tcp: block.then(|| TcpRules {
                connect: vec![3000],
                bind: vec![3000],
            }),
            scope_signals: true,
            scope_abstract_unix: true,
        }
    }

    #[test]
    fn no_landlock_handles_no_filesystem_right() {
        let e = enforcement(&plan(false), 0);
        assert!(e.fs_rights_enforced.is_empty());
        let e = enforcement(&plan(false), 2);
        assert!(
            !e.fs_rights_enforced.contains(&"Truncate".to_string()),
            "{e:?}"
        );
        assert!(
            e.fs_rights_missing.contains(&"Truncate".to_string()),
            "{e:?}"
        );
    }

    #[test]
    fn abi_7_handles_the_device_ioctl_right() {
        let e = enforcement(&plan(true), 7);
        assert!(
            !e.fs_rights_missing.contains(&"IoctlDev".to_string()),
            "{e:?}"
        );
        assert!(e.fs_rights_enforced.contains(&"IoctlDev".to_string()));
        assert!(e.notes.iter().any(|n| n.contains("ports, not addresses")));
    }
}
