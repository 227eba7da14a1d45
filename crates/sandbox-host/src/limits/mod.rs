//! A run's resource limits, on every platform: which backends take them from the host's
//! kernel ([`on_host_kernel`]), the plan for this machine ([`plan_here`]), and a command's
//! groups ([`Groups`]; cgroups on Linux, none elsewhere). The pure parts are in
//! `sandbox_policy::compile::limits`; docs/limits.md says what a user gets.

#[cfg(target_os = "linux")]
pub(crate) mod cgroup;

use std::path::Path;

use sandbox_policy::compile::limits::{self, LimitsPlan, Machine, Usage};
use sandbox_policy::Policy;
use serde::Serialize;

use crate::error::HostError;
use crate::kind::BackendKind;

/// The backends whose commands are processes of this machine, limited through its cgroups:
/// native, nono, custom. Not `host` (the labelled opt-out, and the tests' control) nor the
/// VM backends, which size their VM from the same policy fields instead.
pub fn on_host_kernel(kind: BackendKind) -> bool {
    matches!(
        kind,
        BackendKind::Native | BackendKind::Nono | BackendKind::Custom
    )
}

/// What this machine offers (Linux: the cgroup probe; elsewhere nothing).
pub fn probe() -> Machine {
    #[cfg(target_os = "linux")]
    {
        crate::limits::cgroup::probe()
    }
    #[cfg(not(target_os = "linux"))]
    {
        Machine {
            v2_why_not: "cgroups are Linux's; this platform has none".into(),
            ..Machine::default()
        }
    }
}

/// Whether this kernel counts `RLIMIT_NPROC` per user namespace (Linux 5.14 and later), so
/// that set in a command's own user namespace it bounds only that command's processes.
pub fn nproc_counts_per_user_namespace() -> bool {
    #[cfg(target_os = "linux")]
    {
        crate::backends::native::plans::kernel_at_least(5, 14)
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// `machine` as a run of `kind` gets it: [`Machine::nproc_in_userns`] where the process
/// limit can be `RLIMIT_NPROC` in each command's own user namespace — the native backend
/// with its private view (the cached probe its run uses), not root (the kernel exempts uid
/// 0), Linux 5.14 and later. (The child refuses to start rather than set the rlimit outside
/// a user namespace of its own, should the run go without the view after all.)
pub fn for_run(
    mut machine: Machine,
    kind: BackendKind,
    options: &crate::seam::BackendOptions,
) -> Machine {
    machine.nproc_in_userns = kind == BackendKind::Native
        && !machine.root
        && nproc_counts_per_user_namespace()
        && crate::backends::native::private_view(options).is_ok();
    machine
}

/// The limits of `policy` as a run of `kind` gets them on `machine`.
pub fn plan_for(policy: &Policy, kind: BackendKind, machine: &Machine) -> LimitsPlan {
    if on_host_kernel(kind) {
        limits::plan(&policy.limits, machine)
    } else {
        LimitsPlan::default()
    }
}

/// Fails closed: a limit the user asked for that this machine cannot enforce stops the run
/// (125), unless degraded runs are allowed.
pub fn check(plan: &LimitsPlan, kind: BackendKind, allow_degraded: bool) -> Result<(), HostError> {
    let missing: Vec<String> = plan.refused().map(|u| u.message()).collect();
    if missing.is_empty() || allow_degraded {
        Ok(())
    } else {
        Err(HostError::LimitsUnenforceable {
            backend: kind,
            missing,
        })
    }
}

/// What a finished command's limits were and what its groups counted (`--report-json`'s
/// `limits`).
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LimitsReport {
    pub plan: LimitsPlan,
    pub usage: Usage,
}

impl LimitsReport {
    /// The line to tell the user when the command was killed at its memory limit (by the
    /// kernel's count of OOM kills in the run's group, not a guess from the signal).
    pub fn memory_limit_message(&self) -> Option<String> {
        let memory = self.plan.get(limits::Controller::Memory)?;
        self.usage.memory_limit_hit().then(|| {
            format!(
                "the command hit the memory limit ({}, {}): the kernel killed {} process(es) of \
                 the run; raise it with --memory or `limits.memory` in the config",
                limits::format_size(memory.limit.value),
                memory.mechanism.as_str(),
                self.usage.oom_kills.unwrap_or(0)
            )
        })
    }

    /// The line when forks were refused at the process limit.
    pub fn pids_limit_message(&self) -> Option<String> {
        let pids = self.plan.get(limits::Controller::Pids)?;
        self.usage.pids_limit_hits.filter(|n| *n > 0).map(|n| {
            format!(
                "the run reached its process limit ({} processes, {}): {n} fork(s) were refused",
                pids.limit.value,
                pids.mechanism.as_str()
            )
        })
    }
}

/// One command's groups (Linux); none elsewhere.
#[derive(Debug)]
pub struct Groups {
    /// None when no limit of the run is a cgroup (the process limit as an rlimit alone).
    #[cfg(target_os = "linux")]
    inner: Option<crate::limits::cgroup::RunGroups>,
    plan: LimitsPlan,
}

impl Groups {
    /// Creates the groups for `plan`, or `None` when it enforces nothing.
    pub fn create(
        plan: &LimitsPlan,
        machine: &Machine,
        journal: Option<&Path>,
    ) -> Result<Option<Groups>, HostError> {
        if plan.enforced.is_empty() {
            return Ok(None);
        }
        #[cfg(target_os = "linux")]
        {
            let cgroups = plan.enforced.iter().any(|e| e.mechanism.is_cgroup());
            Ok(Some(Groups {
                inner: match cgroups {
                    true => Some(crate::limits::cgroup::RunGroups::create(
                        plan, machine, journal,
                    )?),
                    false => None,
                },
                plan: plan.clone(),
            }))
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (machine, journal);
            Ok(None)
        }
    }

    /// What the child joins first.
    pub fn join(&self) -> Option<std::sync::Arc<sandbox_exec::JoinCgroups>> {
        #[cfg(target_os = "linux")]
        {
            self.inner.as_ref().map(|g| g.join())
        }
        #[cfg(not(target_os = "linux"))]
        {
            None
        }
    }

    /// The counters, read once the command's processes are gone (the groups are removed
    /// when this value is dropped).
    pub fn report(&self) -> LimitsReport {
        LimitsReport {
            plan: self.plan.clone(),
            #[cfg(target_os = "linux")]
            usage: self.inner.as_ref().map(|g| g.usage()).unwrap_or_default(),
            #[cfg(not(target_os = "linux"))]
            usage: Usage::default(),
        }
    }
}

/// Removes the groups of killed runs recorded in `journal` (Linux).
pub fn recover(journal: &Path) -> usize {
    #[cfg(target_os = "linux")]
    {
        crate::limits::cgroup::recover(journal).len()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = journal;
        0
    }
}

/// Removes the empty groups of dead runs below the parents `machine` offers, whatever journal
/// named them (Linux; docs/limits.md).
pub fn sweep(machine: &Machine) -> usize {
    #[cfg(target_os = "linux")]
    {
        crate::limits::cgroup::sweep(machine).len()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = machine;
        0
    }
}

/// `policy show`'s lines: each limit of a run of `kind`, with its mechanism (or why none).
pub fn describe_plan(policy: &Policy, kind: BackendKind, plan: &LimitsPlan) -> Vec<String> {
    use limits::{describe, Controller};
    let l = &policy.limits;
    let asked = [
        (Controller::Memory, l.memory),
        (Controller::Pids, l.pids),
        (Controller::Cpu, l.cpu_millis),
    ];
    if matches!(kind, BackendKind::Lima | BackendKind::Boxlite) {
        let (cpus, mib) = limits::vm_size(l.cpu_millis.map(|c| c.value), l.memory.map(|m| m.value));
        return vec![format!(
            "the VM's size: cpus {}, memory {} (the VM's own kernel bounds what runs in it; \
             --pids does not apply)",
            cpus.map_or("the backend's default".into(), |c| c.to_string()),
            mib.map_or("the backend's default".into(), |m| format!("{m} MiB"))
        )];
    }
    if !on_host_kernel(kind) {
        return vec![format!(
            "none: the {kind} backend limits nothing (no sandbox)"
        )];
    }
    asked
        .into_iter()
        .map(|(controller, limit)| match limit {
            None => format!("{:<7}none", controller.name()),
            Some(limit) => {
                let what = format!(
                    "{:<7}{} ({})",
                    controller.name(),
                    describe(controller, limit.value),
                    limit.source.as_str()
                );
                match (
                    plan.get(controller),
                    plan.unenforced.iter().find(|u| u.controller == controller),
                ) {
                    (Some(e), _) if !e.mechanism.is_cgroup() => {
                        format!("{what}: {}", e.mechanism.as_str())
                    }
                    (Some(e), _) => format!(
                        "{what}: {} group below {}",
                        e.mechanism.as_str(),
                        e.parent.display()
                    ),
                    (None, Some(u)) if limit.source.requested() => {
                        format!(
                            "{what}: NOT ENFORCEABLE here, the run is refused: {}; {}",
                            u.why, u.how
                        )
                    }
                    (None, Some(u)) => format!("{what}: not enforced here: {}", u.why),
                    (None, None) => what,
                }
            }
        })
        .collect()
}

/// `doctor`'s lines: for each resource, the mechanism this machine offers (or why none, and
/// how to get one).
pub fn describe_machine(machine: &Machine) -> Vec<String> {
    use limits::Controller;
    use sandbox_policy::{Limit, LimitSource, Limits};
    Controller::ALL
        .into_iter()
        .map(|controller| {
            let probe = Limit {
                value: 1,
                source: LimitSource::Flag,
            };
            let mut l = Limits::default();
            match controller {
                Controller::Memory => l.memory = Some(probe),
                Controller::Pids => l.pids = Some(probe),
                Controller::Cpu => l.cpu_millis = Some(probe),
            }
            let plan = limits::plan(&l, machine);
            match (plan.enforced.first(), plan.unenforced.first()) {
                (Some(e), _) if !e.mechanism.is_cgroup() => format!(
                    "{} ({}): {}, for the native backend (its private view gives each command \
                     a user namespace, where Linux 5.14 and later count the limit); no cgroup \
                     here ({}), so nono and custom runs go without it",
                    controller.name(),
                    controller.flag(),
                    e.mechanism.as_str(),
                    if machine.v2_why_not.is_empty() {
                        "the controller is not delegated"
                    } else {
                        machine.v2_why_not.as_str()
                    }
                ),
                (Some(e), _) => format!(
                    "{} ({}): {}, groups below {}",
                    controller.name(),
                    controller.flag(),
                    e.mechanism.as_str(),
                    e.parent.display()
                ),
                (None, Some(u)) => format!(
                    "{} ({}): cannot be enforced: {}; {}",
                    controller.name(),
                    controller.flag(),
                    u.why,
                    u.how
                ),
                (None, None) => controller.name().to_string(),
            }
        })
        .collect()
}
