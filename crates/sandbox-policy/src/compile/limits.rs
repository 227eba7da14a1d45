//! Resource limits, as pure functions: the values a user writes (`--memory 2G`, `--cpus 0.5`,
//! `--pids 512`), the choice of the kernel mechanism that enforces each on a machine described
//! by a probe ([`Machine`], probed by `sandbox-host`), the files a cgroup gets
//! ([`GroupPlan::files`]), and what a finished run's counters say ([`Usage`]).
//!
//! The order of mechanisms (docs/limits.md): a cgroup v2 group this process may create
//! children in with the controller enabled for them; else the cgroup v1 hierarchy of that
//! controller where this process's own group there is writable (root); else, for the process
//! limit only, `RLIMIT_NPROC` set in each command's own user namespace, where the kernel
//! counts it per user namespace (Linux 5.14 and later: [`Machine::nproc_in_userns`]); else
//! nothing. No other rlimit means the same thing as its cgroup: `RLIMIT_AS` bounds one
//! process's address space (not the run's memory, and not resident memory), `RLIMIT_CPU` CPU
//! seconds (not a share of a core); and `RLIMIT_NPROC` outside a user namespace of the run's
//! own counts every process of the user's uid, in and outside the run.

use std::path::PathBuf;

use serde::Serialize;

use crate::model::{Limit, LimitSource, Limits};

/// The process limit every run gets unless told otherwise: far above what builds use
/// (threads count: a parallel cargo or node build reaches a few hundred), far below what a
/// fork bomb takes (the kernel's `pid_max` is 32768 on many machines, 4194304 at most).
pub const DEFAULT_PIDS: u64 = 4096;

/// cgroup CPU bandwidth period: 100 ms, the kernel's default.
pub const CPU_PERIOD_US: u64 = 100_000;

/// One limited resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Controller {
    Memory,
    Pids,
    Cpu,
}

impl Controller {
    pub const ALL: [Controller; 3] = [Controller::Memory, Controller::Pids, Controller::Cpu];

    /// The kernel's controller name (the same in v1 and v2).
    pub fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
        }
    }

    /// The flag that sets it.
    pub fn flag(self) -> &'static str {
        match self {
            Controller::Memory => "--memory",
            Controller::Pids => "--pids",
            Controller::Cpu => "--cpus",
        }
    }

    fn of(self, limits: &Limits) -> Option<Limit> {
        match self {
            Controller::Memory => limits.memory,
            Controller::Pids => limits.pids,
            Controller::Cpu => limits.cpu_millis,
        }
    }
}

/// A limit's value as people read it: `512 MiB`, `64 processes`, `0.5 CPU`.
pub fn describe(controller: Controller, value: u64) -> String {
    match controller {
        Controller::Memory => format_size(value),
        Controller::Pids => format!("{value} processes"),
        Controller::Cpu => format!("{} CPU", format_cpus(value)),
    }
}

/// `1.5` for 1500 thousandths.
pub fn format_cpus(millis: u64) -> String {
    let whole = millis / 1000;
    let frac = millis % 1000;
    if frac == 0 {
        whole.to_string()
    } else {
        format!("{whole}.{}", format!("{frac:03}").trim_end_matches('0'))
    }
}

/// `512 MiB`, `1.5 GiB`, `100 bytes`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (unit, size) in UNITS {
        if bytes >= size {
            let tenths = bytes * 10 / size;
            return if tenths % 10 == 0 {
                format!("{} {unit}", tenths / 10)
            } else {
                format!("{}.{} {unit}", tenths / 10, tenths % 10)
            };
        }
    }
    format!("{bytes} bytes")
}

fn off(text: &str) -> bool {
    matches!(text.trim(), "off" | "none" | "0" | "unlimited")
}

/// `--memory`: `512M`, `2G`, `1.5GiB`, `1048576` (bytes); binary units (K, M, G, T, with an
/// optional `i`/`iB`/`B`); `off` (or 0) for no limit. At least 4 MiB: less cannot start a
/// program.
pub fn parse_memory(text: &str) -> Result<Option<u64>, String> {
    if off(text) {
        return Ok(None);
    }
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "ki" | "kib" | "kb" => 10,
        "m" | "mi" | "mib" | "mb" => 20,
        "g" | "gi" | "gib" | "gb" => 30,
        "t" | "ti" | "tib" | "tb" => 40,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (use K, M, G or T, e.g. 512M, 2G; or off)"
            ))
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (e.g. 512M, 2G, or off)"))?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("{text:?} is too large"));
    }
    let bytes = bytes as u64;
    if bytes < 4 << 20 {
        return Err(format!(
            "{text:?} is below 4 MiB, too little to start a program (off for no limit)"
        ));
    }
    Ok(Some(bytes))
}

/// `--cpus`: a number of CPUs (`0.5`, `2`), at most three decimals; `off` (or 0) for no
/// limit. Returns thousandths of a CPU, at least 0.01 CPU.
pub fn parse_cpus(text: &str) -> Result<Option<u64>, String> {
    if off(text) {
        return Ok(None);
    }
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of CPUs (e.g. 0.5, 2, or off)"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!(
            "{text:?} is not a number of CPUs (e.g. 0.5, 2, or off)"
        ));
    }
    if value > 4096.0 {
        return Err(format!("{text:?}: at most 4096 CPUs"));
    }
    let millis = (value * 1000.0).round() as u64;
    if millis < 10 {
        return Err(format!("{text:?}: at least 0.01 CPU (off for no limit)"));
    }
    Ok(Some(millis))
}

/// `--pids`: how many processes and threads may exist at once, 1 to 4194304 (the kernel's
/// largest `pid_max`); `off` (or 0) for no limit.
pub fn parse_pids(text: &str) -> Result<Option<u64>, String> {
    if off(text) {
        return Ok(None);
    }
    let value: u64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of processes (e.g. 512, or off)"))?;
    if value > 4_194_304 {
        return Err(format!("{text:?}: at most 4194304 processes"));
    }
    Ok(Some(value))
}

/// The limits of a run: the flag's value over the configuration's over the built-in default
/// (only `pids` has one). `Some(None)` in a layer means "no limit" (`off`) and stops there.
pub fn resolve(
    flags: [Option<Option<u64>>; 3],
    config: [Option<Option<u64>>; 3],
) -> [Option<Limit>; 3] {
    let mut out = [None; 3];
    for (i, controller) in Controller::ALL.into_iter().enumerate() {
        let default = (controller == Controller::Pids).then_some(DEFAULT_PIDS);
        let (value, source) = match (flags[i], config[i]) {
            (Some(v), _) => (v, LimitSource::Flag),
            (None, Some(v)) => (v, LimitSource::Config),
            (None, None) => (default, LimitSource::Default),
        };
        out[i] = value.map(|value| Limit { value, source });
    }
    out
}

/// A VM's size from the same limits (BoxLite's box options, Lima's YAML): whole CPUs,
/// rounded up (a VM has no half CPU), and memory in MiB, rounded up.
pub fn vm_size(cpu_millis: Option<u64>, memory_bytes: Option<u64>) -> (Option<u64>, Option<u64>) {
    (
        cpu_millis.map(|m| m.div_ceil(1000).max(1)),
        memory_bytes.map(|b| b.div_ceil(1 << 20)),
    )
}

/// What a probe found on this machine (`sandbox-host`'s `linux::cgroup::probe`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Machine {
    /// The cgroup v2 group this process may create groups below, when there is one.
    pub v2: Option<V2Parent>,
    /// Why cgroup v2 cannot be used, or for which controllers (for messages).
    pub v2_why_not: String,
    /// The cgroup v1 hierarchies whose group of this process is writable.
    pub v1: Vec<V1Parent>,
    /// Why each v1 controller cannot be used, when it cannot.
    pub v1_why_not: Vec<(Controller, String)>,
    /// The systemd user manager runs (delegation can be had from it).
    pub systemd_user: bool,
    /// This process runs as root.
    pub root: bool,
    /// `RLIMIT_NPROC` set in each command's own user namespace bounds exactly the command's
    /// processes and threads: the kernel counts it per user namespace (Linux 5.14 and later),
    /// the run's commands get one (the native backend's private view), and the user is not
    /// root (the kernel exempts uid 0 from the limit). Set by the host for a run, not by the
    /// cgroup probe.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nproc_in_userns: bool,
}

/// A cgroup v2 group of this process's own (or delegated to it), writable by it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct V2Parent {
    pub dir: PathBuf,
    /// Controllers enabled for its children (`cgroup.subtree_control`): the ones a group
    /// created below it gets. With [`V2Parent::vacate`], the ones it will enable.
    pub enabled: Vec<Controller>,
    /// This process is alone in the group, whose controllers are delegated to it but not
    /// enabled for groups below it: a scope made by `systemd-run --user --scope -p
    /// Delegate=yes`. A group with a process in it cannot enable them, so a run first moves
    /// this process into a leaf group of its own below the group and then enables them (and
    /// the last run of this process undoes both). Also set when this process is in that leaf
    /// already (a run of it is alive).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub vacate: bool,
}

/// This process's group in the v1 hierarchy of `controller`, writable by it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct V1Parent {
    pub controller: Controller,
    pub dir: PathBuf,
    /// `memory.memsw.limit_in_bytes` exists (swap is accounted): swap is limited too.
    #[serde(default)]
    pub memsw: bool,
}

/// The kernel mechanism enforcing one limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mechanism {
    CgroupV2,
    CgroupV1,
    /// `RLIMIT_NPROC` in each command's own user namespace (the process limit only).
    RlimitNproc,
}

impl Mechanism {
    pub fn as_str(self) -> &'static str {
        match self {
            Mechanism::CgroupV2 => "cgroup v2",
            Mechanism::CgroupV1 => "cgroup v1",
            Mechanism::RlimitNproc => "RLIMIT_NPROC in the command's own user namespace",
        }
    }

    /// Whether it is a cgroup (then the run has a group of it, below [`Enforced::parent`]).
    pub fn is_cgroup(self) -> bool {
        matches!(self, Mechanism::CgroupV2 | Mechanism::CgroupV1)
    }
}

/// One limit that a run gets, and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Enforced {
    pub controller: Controller,
    pub limit: Limit,
    pub mechanism: Mechanism,
    /// The group the run's group is created below (empty for an rlimit).
    pub parent: PathBuf,
}

/// One limit this machine cannot enforce: why, and how to get it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unenforced {
    pub controller: Controller,
    pub limit: Limit,
    pub why: String,
    pub how: String,
}

impl Unenforced {
    /// The line for a refusal, `policy show` and `doctor`.
    pub fn message(&self) -> String {
        format!(
            "{} {} ({}) cannot be enforced here: {}; {}",
            self.controller.flag(),
            describe(self.controller, self.limit.value),
            self.limit.source.as_str(),
            self.why,
            self.how
        )
    }
}

/// Every limit of a run, each enforced or not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LimitsPlan {
    pub enforced: Vec<Enforced>,
    pub unenforced: Vec<Unenforced>,
}

/// One group to create for a run: below `parent`, in one hierarchy (v2: every controller;
/// v1: one), with `files` written in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPlan {
    pub mechanism: Mechanism,
    pub parent: PathBuf,
    pub controllers: Vec<Controller>,
    /// `(file, value, required)`: a file that is not required may be missing on a kernel
    /// (`memory.swap.max` without swap accounting); every other failure fails the run.
    pub files: Vec<(&'static str, String, bool)>,
}

fn how_to_get(controller: Controller, machine: &Machine) -> String {
    let mut how = String::new();
    if machine.systemd_user {
        how.push_str(&format!(
            "run sandbox in a systemd scope delegated to you \
             (`systemd-run --user --scope -p Delegate={} sandbox …`)",
            controller.name()
        ));
    } else {
        how.push_str(
            "enable cgroup v2 delegation for your user (systemd: `Delegate=memory pids cpu` \
             for user@.service, then run sandbox in a scope of your user manager)",
        );
    }
    if !machine.root {
        how.push_str(&format!(
            ", or run as root where the cgroup v1 {} hierarchy is mounted",
            controller.name()
        ));
    }
    how.push_str(&format!(
        ", or pass {} off; --allow-degraded runs without it",
        controller.flag()
    ));
    how
}

/// Which mechanism enforces each limit of `limits` on `machine`: cgroup v2 when the v2
/// parent has the controller enabled for its children, else cgroup v1 when this process's
/// group of that controller is writable, else, for the process limit, `RLIMIT_NPROC` in the
/// command's own user namespace where [`Machine::nproc_in_userns`], else none.
pub fn plan(limits: &Limits, machine: &Machine) -> LimitsPlan {
    let mut out = LimitsPlan::default();
    for controller in Controller::ALL {
        let Some(limit) = controller.of(limits) else {
            continue;
        };
        if let Some(v2) = machine
            .v2
            .as_ref()
            .filter(|v2| v2.enabled.contains(&controller))
        {
            out.enforced.push(Enforced {
                controller,
                limit,
                mechanism: Mechanism::CgroupV2,
                parent: v2.dir.clone(),
            });
        } else if let Some(v1) = machine.v1.iter().find(|v| v.controller == controller) {
            out.enforced.push(Enforced {
                controller,
                limit,
                mechanism: Mechanism::CgroupV1,
                parent: v1.dir.clone(),
            });
        } else if controller == Controller::Pids && machine.nproc_in_userns {
            out.enforced.push(Enforced {
                controller,
                limit,
                mechanism: Mechanism::RlimitNproc,
                parent: PathBuf::new(),
            });
        } else {
            let v1 = machine
                .v1_why_not
                .iter()
                .find(|(c, _)| *c == controller)
                .map(|(_, why)| why.as_str())
                .unwrap_or("no cgroup v1 hierarchy has it");
            out.unenforced.push(Unenforced {
                controller,
                limit,
                why: format!(
                    "no cgroup to put the run in ({}: {}; cgroup v1 {}: {})",
                    "cgroup v2",
                    if machine.v2_why_not.is_empty() {
                        "the controller is not delegated"
                    } else {
                        machine.v2_why_not.as_str()
                    },
                    controller.name(),
                    v1
                ),
                how: how_to_get(controller, machine),
            });
        }
    }
    out
}

impl LimitsPlan {
    /// The limits the user asked for that cannot be enforced: the run is refused (125)
    /// unless degraded runs are allowed.
    pub fn refused(&self) -> impl Iterator<Item = &Unenforced> {
        self.unenforced
            .iter()
            .filter(|u| u.limit.source.requested())
    }

    /// The enforced limit of `controller`.
    pub fn get(&self, controller: Controller) -> Option<&Enforced> {
        self.enforced.iter().find(|e| e.controller == controller)
    }

    /// The process limit, when `RLIMIT_NPROC` in the command's user namespace enforces it.
    pub fn process_rlimit(&self) -> Option<u64> {
        self.get(Controller::Pids)
            .filter(|e| e.mechanism == Mechanism::RlimitNproc)
            .map(|e| e.limit.value)
    }

    /// The groups to create: one in the v2 hierarchy for every v2 limit, one per v1
    /// controller. `machine` says whether v1 swap is accounted.
    pub fn groups(&self, machine: &Machine) -> Vec<GroupPlan> {
        let mut v2: Option<GroupPlan> = None;
        let mut out = Vec::new();
        for e in &self.enforced {
            let files = files(e, machine);
            match e.mechanism {
                Mechanism::CgroupV2 => {
                    let group = v2.get_or_insert_with(|| GroupPlan {
                        mechanism: Mechanism::CgroupV2,
                        parent: e.parent.clone(),
                        controllers: Vec::new(),
                        files: Vec::new(),
                    });
                    group.controllers.push(e.controller);
                    group.files.extend(files);
                }
                Mechanism::CgroupV1 => out.push(GroupPlan {
                    mechanism: Mechanism::CgroupV1,
                    parent: e.parent.clone(),
                    controllers: vec![e.controller],
                    files,
                }),
                // Set in the child, no group.
                Mechanism::RlimitNproc => {}
            }
        }
        v2.into_iter().chain(out).collect()
    }
}

fn files(e: &Enforced, machine: &Machine) -> Vec<(&'static str, String, bool)> {
    let v = e.limit.value;
    match (e.mechanism, e.controller) {
        (Mechanism::CgroupV2, Controller::Memory) => vec![
            ("memory.max", v.to_string(), true),
            // Swap would let the run past the limit; the file is missing without swap
            // accounting (and then there is nothing to bound).
            ("memory.swap.max", "0".into(), false),
        ],
        (Mechanism::CgroupV2, Controller::Pids) => vec![("pids.max", v.to_string(), true)],
        (Mechanism::CgroupV2, Controller::Cpu) => vec![(
            "cpu.max",
            format!("{} {CPU_PERIOD_US}", v * CPU_PERIOD_US / 1000),
            true,
        )],
        (Mechanism::CgroupV1, Controller::Memory) => {
            let memsw = machine
                .v1
                .iter()
                .any(|p| p.controller == Controller::Memory && p.memsw);
            let mut files = vec![("memory.limit_in_bytes", v.to_string(), true)];
            // memory+swap no higher than memory: no swapping past the limit (written after
            // memory.limit_in_bytes, which it may not be below).
            if memsw {
                files.push(("memory.memsw.limit_in_bytes", v.to_string(), true));
            }
            files
        }
        (Mechanism::CgroupV1, Controller::Pids) => vec![("pids.max", v.to_string(), true)],
        (Mechanism::RlimitNproc, _) => Vec::new(),
        (Mechanism::CgroupV1, Controller::Cpu) => vec![
            ("cpu.cfs_period_us", CPU_PERIOD_US.to_string(), true),
            (
                "cpu.cfs_quota_us",
                (v * CPU_PERIOD_US / 1000).to_string(),
                true,
            ),
        ],
    }
}

/// What a run's groups counted, read before they are removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Processes the kernel's OOM killer killed in the run's memory group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_kills: Option<u64>,
    /// The run's peak memory, in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
    /// The most processes (and threads) the run had at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_processes: Option<u64>,
    /// How often a fork was refused at the process limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids_limit_hits: Option<u64>,
    /// CPU bandwidth periods in which the run was throttled at its CPU limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_throttled_periods: Option<u64>,
}

/// The value of `key` in a flat-keyed file (`memory.events`, `memory.oom_control`,
/// `pids.events`, `cpu.stat`: one `key value` per line).
pub fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        (parts.next() == Some(key))
            .then(|| parts.next()?.parse().ok())
            .flatten()
    })
}

/// A single-number file (`memory.peak`, `pids.peak`, `memory.max_usage_in_bytes`).
pub fn single(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

impl Usage {
    /// The message when the command died of the memory limit, from the kernel's counters.
    pub fn memory_limit_hit(&self) -> bool {
        self.oom_kills.is_some_and(|n| n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn limits(memory: Option<u64>, pids: Option<u64>, cpu: Option<u64>) -> Limits {
        let flag = |v: Option<u64>| {
            v.map(|value| Limit {
                value,
                source: LimitSource::Flag,
            })
        };
        Limits {
            memory: flag(memory),
            pids: flag(pids),
            cpu_millis: flag(cpu),
            ..Limits::default()
        }
    }

    #[test]
    fn a_vm_is_sized_in_whole_cpus_and_mib() {
        assert_eq!(vm_size(Some(500), Some(3 << 29)), (Some(1), Some(1536)));
        assert_eq!(vm_size(Some(2001), None), (Some(3), None));
        assert_eq!(vm_size(None, Some(1)), (None, Some(1)));
    }

    #[test]
    fn values_parse_as_people_write_them() {
        assert_eq!(parse_memory("512M"), Ok(Some(512 << 20)));
        assert_eq!(parse_memory("2G"), Ok(Some(2 << 30)));
        assert_eq!(parse_memory("1.5GiB"), Ok(Some(3 << 29)));
        assert_eq!(parse_memory("8388608"), Ok(Some(8 << 20)));
        assert_eq!(parse_memory("off"), Ok(None));
        assert!(parse_memory("1k").is_err(), "too small to run anything");
        assert!(parse_memory("12 parsecs").is_err());
        assert_eq!(parse_cpus("0.5"), Ok(Some(500)));
        assert_eq!(parse_cpus("2"), Ok(Some(2000)));
        assert_eq!(parse_cpus("0"), Ok(None));
        assert!(parse_cpus("-1").is_err());
        assert!(parse_cpus("0.001").is_err());
        assert_eq!(parse_pids("64"), Ok(Some(64)));
        assert_eq!(parse_pids("off"), Ok(None));
        assert!(parse_pids("lots").is_err());
        assert_eq!(format_cpus(500), "0.5");
        assert_eq!(format_cpus(2000), "2");
        assert_eq!(format_cpus(1250), "1.25");
        assert_eq!(format_size(512 << 20), "512 MiB");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
    }

    #[test]
    fn a_flag_beats_the_config_which_beats_the_default() {
        let [m, p, c] = resolve([None, None, None], [None, None, None]);
        assert_eq!((m, c), (None, None), "no memory or CPU default");
        assert_eq!(
            p,
            Some(Limit {
                value: DEFAULT_PIDS,
                source: LimitSource::Default
            })
        );
        let [m, p, _] = resolve(
            [None, Some(Some(64)), None],
            [Some(Some(1 << 30)), None, None],
        );
        assert_eq!(m.map(|l| l.source), Some(LimitSource::Config));
        assert_eq!(
            p.map(|l| (l.value, l.source)),
            Some((64, LimitSource::Flag))
        );
        // `off` in the config turns the default off; a flag turns a config limit off.
        let [_, p, _] = resolve([None, None, None], [None, Some(None), None]);
        assert_eq!(p, None);
        let [m, _, _] = resolve([Some(None), None, None], [Some(Some(1 << 30)), None, None]);
        assert_eq!(m, None);
    }

    fn v1_machine() -> Machine {
        Machine {
            v2: None,
            v2_why_not: "no controller is enabled in the v2 hierarchy".into(),
            v1: vec![
                V1Parent {
                    controller: Controller::Memory,
                    dir: "/sys/fs/cgroup/memory/me".into(),
                    memsw: true,
                },
                V1Parent {
                    controller: Controller::Pids,
                    dir: "/sys/fs/cgroup/pids".into(),
                    memsw: false,
                },
                V1Parent {
                    controller: Controller::Cpu,
                    dir: "/sys/fs/cgroup/cpu".into(),
                    memsw: false,
                },
            ],
            root: true,
            ..Machine::default()
        }
    }

    #[test]
    fn v1_controllers_give_one_group_each_with_swap_bounded() {
        let machine = v1_machine();
        let plan = plan(&limits(Some(256 << 20), Some(64), Some(500)), &machine);
        assert!(plan.unenforced.is_empty(), "{plan:?}");
        let groups = plan.groups(&machine);
        assert_eq!(groups.len(), 3);
        let memory = &groups[0];
        assert_eq!(memory.mechanism, Mechanism::CgroupV1);
        assert_eq!(memory.parent, Path::new("/sys/fs/cgroup/memory/me"));
        assert_eq!(
            memory.files,
            vec![
                ("memory.limit_in_bytes", "268435456".to_string(), true),
                ("memory.memsw.limit_in_bytes", "268435456".to_string(), true)
            ]
        );
        assert_eq!(groups[1].files, vec![("pids.max", "64".to_string(), true)]);
        assert_eq!(
            groups[2].files,
            vec![
                ("cpu.cfs_period_us", "100000".to_string(), true),
                ("cpu.cfs_quota_us", "50000".to_string(), true)
            ]
        );
    }

    #[test]
    fn v2_comes_first_for_the_controllers_it_delegates() {
        let mut machine = v1_machine();
        machine.v2 = Some(V2Parent {
            dir: "/sys/fs/cgroup/user.slice/me".into(),
            enabled: vec![Controller::Memory, Controller::Pids],
            vacate: false,
        });
        let plan = plan(&limits(Some(1 << 30), Some(64), Some(1500)), &machine);
        let groups = plan.groups(&machine);
        assert_eq!(groups.len(), 2, "{groups:?}");
        assert_eq!(groups[0].mechanism, Mechanism::CgroupV2);
        assert_eq!(
            groups[0].controllers,
            vec![Controller::Memory, Controller::Pids]
        );
        assert_eq!(
            groups[0].files,
            vec![
                ("memory.max", "1073741824".to_string(), true),
                ("memory.swap.max", "0".to_string(), false),
                ("pids.max", "64".to_string(), true)
            ]
        );
        // cpu is not delegated in v2: its v1 hierarchy takes it.
        assert_eq!(groups[1].mechanism, Mechanism::CgroupV1);
        assert_eq!(groups[1].controllers, vec![Controller::Cpu]);
        let v2_only = Machine {
            v1: Vec::new(),
            v2: Some(V2Parent {
                dir: "/sys/fs/cgroup/me".into(),
                enabled: Controller::ALL.to_vec(),
                vacate: true,
            }),
            ..Machine::default()
        };
        let plan2 = super::plan(&limits(None, None, Some(1500)), &v2_only);
        assert_eq!(
            plan2.groups(&v2_only)[0].files,
            vec![("cpu.max", "150000 100000".to_string(), true)]
        );
    }

    #[test]
    fn without_a_cgroup_the_process_limit_is_an_rlimit_in_the_commands_user_namespace() {
        let machine = Machine {
            v2_why_not: "no group of this process is writable".into(),
            nproc_in_userns: true,
            ..Machine::default()
        };
        let plan = plan(&limits(Some(1 << 30), Some(64), None), &machine);
        let pids = plan.get(Controller::Pids).unwrap();
        assert_eq!(pids.mechanism, Mechanism::RlimitNproc);
        assert_eq!(plan.process_rlimit(), Some(64));
        // Memory has no such fallback; the rlimit makes no group.
        assert_eq!(plan.unenforced.len(), 1);
        assert_eq!(plan.unenforced[0].controller, Controller::Memory);
        assert!(plan.groups(&machine).is_empty());
        // A cgroup comes first.
        let mut with_v1 = v1_machine();
        with_v1.nproc_in_userns = true;
        let plan = super::plan(&limits(None, Some(64), None), &with_v1);
        assert_eq!(
            plan.get(Controller::Pids).unwrap().mechanism,
            Mechanism::CgroupV1
        );
        assert_eq!(plan.process_rlimit(), None);
        // Without the user namespace (or before Linux 5.14, or as root) it is not one.
        let plan = super::plan(&limits(None, Some(64), None), &Machine::default());
        assert_eq!(plan.process_rlimit(), None);
        assert_eq!(plan.unenforced.len(), 1);
    }

    #[test]
    fn a_requested_limit_without_a_mechanism_is_refused_and_the_default_is_not() {
        let machine = Machine {
            v2_why_not: "the v2 hierarchy has no controllers".into(),
            v1_why_not: vec![(
                Controller::Memory,
                "/sys/fs/cgroup/memory is not writable".into(),
            )],
            systemd_user: false,
            ..Machine::default()
        };
        let mut l = limits(Some(1 << 30), None, None);
        l.pids = Some(Limit {
            value: DEFAULT_PIDS,
            source: LimitSource::Default,
        });
        let plan = plan(&l, &machine);
        assert!(plan.enforced.is_empty());
        assert_eq!(plan.unenforced.len(), 2);
        let refused: Vec<_> = plan.refused().collect();
        assert_eq!(refused.len(), 1, "only the one asked for: {refused:?}");
        let message = refused[0].message();
        assert!(message.contains("--memory 1 GiB (flag)"), "{message}");
        assert!(message.contains("not writable"), "{message}");
        assert!(message.contains("delegation"), "{message}");
        assert!(message.contains("--allow-degraded"), "{message}");
        assert!(message.contains("as root"), "{message}");
    }

    #[test]
    fn the_counters_are_read_from_the_kernels_files() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(keyed(v1, "oom_kill"), Some(2));
        let v2 = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(keyed(v2, "oom_kill"), Some(1));
        assert_eq!(keyed(v2, "oom"), Some(1));
        assert_eq!(keyed("max 7\n", "max"), Some(7));
        assert_eq!(keyed("", "max"), None);
        assert_eq!(single("4096\n"), Some(4096));
        assert!(Usage {
            oom_kills: Some(1),
            ..Usage::default()
        }
        .memory_limit_hit());
        assert!(!Usage::default().memory_limit_hit());
    }
}
