//! What the native backend builds for a policy on this machine, and what it reports: the
//! machine's support (view, pid namespace, network), the Landlock and seccomp plans, and the
//! enforcement report over every layer a run has. Compiled in the parent; nothing here runs
//! in the child.

use std::path::{Path, PathBuf};

use sandbox_policy::compile;
use sandbox_policy::Policy;

use super::options::NativeOptions;
use super::{abi, landlock};

use crate::backends::native::userns::{self, ViewSupport};

use crate::error::HostError;
use crate::report::Enforcement;
use sandbox_policy::compile::seccomp::SeccompPlan;

/// Whether this machine gives `options` a private view (the probe, cached in the private
/// directory when that is usable).
pub(super) fn view_support(options: &NativeOptions) -> ViewSupport {
    let private = crate::privdir::ensure("native", &options.private_dir).ok();
    userns::support(private.as_deref())
}

/// Whether a run gets a pid namespace of its own: only with the view, where the probe says
/// its `/proc` mounts (cached in the private directory). `Err` says why not.
pub(super) fn pid_support(options: &NativeOptions, support: &ViewSupport) -> Result<(), String> {
    match support {
        ViewSupport::Available => {
            let private = crate::privdir::ensure("native", &options.private_dir).ok();
            userns::pid_namespace_support(private.as_deref())
        }
        ViewSupport::Unavailable { .. } => Err("it needs the private view".into()),
    }
}

/// What a run's network is on this machine.
#[derive(Debug, Clone)]
pub(super) enum NetState {
    /// Fully open: no namespace of its own.
    Open,
    /// A private network namespace with this plan.
    Namespace(crate::backends::native::net::NetPlan),
    /// The policy wants one (`--block-net`, `--allow-domain`) and this machine cannot give
    /// it: why not.
    Missing(String),
}

impl NetState {
    pub(super) fn plan(&self) -> Option<&crate::backends::native::net::NetPlan> {
        match self {
            NetState::Namespace(plan) => Some(plan),
            _ => None,
        }
    }
}

/// The network of a run of `policy` here: a namespace only with the view, where the probe
/// says one works (cached in the private directory).
pub(super) fn net_state(
    policy: &Policy,
    options: &NativeOptions,
    support: &ViewSupport,
) -> Result<NetState, HostError> {
    let resolver = crate::backends::native::net::resolver_from_env()
        .map_err(|message| HostError::Network { message })?;
    let mut taken = policy.net.open_ports(policy.hook_port).unwrap_or_default();
    taken.extend(policy.publish.iter().map(|p| p.inner_port));
    let port = crate::backends::native::net::pick_proxy_port(&taken);
    let Some(plan) = crate::backends::native::net::NetPlan::of(policy, port, resolver) else {
        return Ok(NetState::Open);
    };
    let why = match support {
        ViewSupport::Available => {
            let private = crate::privdir::ensure("native", &options.private_dir).ok();
            match userns::net_namespace_support(private.as_deref()) {
                Ok(()) => return Ok(NetState::Namespace(plan)),
                Err(why) => why,
            }
        }
        ViewSupport::Unavailable { .. } => "it needs the private view".to_string(),
    };
    Ok(NetState::Missing(why))
}

/// The Landlock rules: under the view, a main worktree is protected by its read-only binds;
/// without it, Landlock alone must be able to protect the git data. In a network namespace
/// no port rule: the namespace is the boundary.
pub(super) fn landlock_plan(
    policy: &Policy,
    support: &ViewSupport,
    net: &NetState,
) -> Result<compile::landlock::LandlockPlan, sandbox_policy::PolicyError> {
    let mut plan = match support {
        ViewSupport::Available => compile::landlock::compile_under_view(policy),
        ViewSupport::Unavailable { .. } => compile::landlock::compile(policy),
    }?;
    // In a network namespace of its own the run's loopback is its own and the namespace has
    // no way out but the ports the supervisor relays in: the namespace holds `--block-net`,
    // and Landlock's port rules would only refuse the run's own servers (a test suite that
    // binds 127.0.0.1:0 and connects to it), as they never did under `--allow-domain`.
    if matches!(net, NetState::Namespace(_)) {
        plan.tcp = None;
    }
    Ok(plan)
}

/// Why this machine cannot layer the policy's package caches, if it cannot: overlays in a
/// user namespace need Linux 5.11, and their upper layer `user.*` extended attributes.
/// The layers' filesystem is asked once (an xattr set and an `O_TMPFILE` made on the disk)
/// and the answer kept in `private`, keyed on which filesystem it is and the kernel.
pub(super) fn caches_unsupported(policy: &Policy, private: Option<&Path>) -> Option<String> {
    let home = policy.fs.home.as_ref()?;
    let first = home.caches.first()?;
    // The kernel's version, not the forking probe: the check runs on every start.
    if !kernel_at_least(5, 11) {
        return Some("overlays in a user namespace need Linux 5.11".into());
    }
    let layers = first.upper.parent()?;
    let why = match (private, filesystem_key(layers)) {
        (Some(dir), Some((file, key))) => match crate::privdir::recall(dir, &file, &key) {
            Some(answer) => (!answer.is_empty()).then_some(answer),
            None => {
                let why = crate::privdir::layer_unsupported(layers).map(str::to_string);
                crate::privdir::remember(dir, &file, &key, why.as_deref().unwrap_or_default());
                why
            }
        },
        _ => crate::privdir::layer_unsupported(layers).map(str::to_string),
    };
    why.map(|why| format!("{}: {why}", layers.display()))
}

/// Where the answer about the filesystem holding `dir` is kept, and its key: the
/// filesystem (its device, type and id) and the kernel. `None` when `dir` cannot be asked.
pub(super) fn filesystem_key(dir: &Path) -> Option<(String, String)> {
    let dev = nix::sys::stat::stat(dir).ok()?.st_dev;
    let fs = nix::sys::statfs::statfs(dir).ok()?;
    let key = format!(
        "v1|{}|{dev}|{:x}|{:?}",
        crate::privdir::kernel_key(),
        fs.filesystem_type().0,
        fs.filesystem_id()
    );
    Some((format!("layer-probe-{dev:x}"), key))
}

/// Whether the running kernel is at least `major.minor` (`uname -r`).
pub(crate) fn kernel_at_least(major: u32, minor: u32) -> bool {
    let Ok(uts) = nix::sys::utsname::uname() else {
        return false;
    };
    let release = uts.release().to_string_lossy();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    match (parts.next(), parts.next()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

/// What `policy show` and `doctor` say of the private home under this backend.
pub(super) fn home_report(e: &mut Enforcement, policy: &Policy, view: bool) {
    let Some(home) = &policy.fs.home else {
        return;
    };
    let chains: Vec<&str> = home
        .toolchains
        .iter()
        .filter(|t| t.enabled)
        .map(|t| t.name.as_str())
        .collect();
    let chains = if chains.is_empty() {
        "none".to_string()
    } else {
        chains.join(", ")
    };
    if view {
        e.enforced.push(format!(
            "private home {} at {} (HOME keeps its path; {}, persistent); toolchains read-only at their real paths: {chains}; package caches copy-on-write over yours: {}; /tmp private and writable; / listable",
            home.dir.display(),
            home.path.display(),
            home.scope,
            if home.caches.is_empty() {
                "none".to_string()
            } else {
                home.caches
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ));
    } else {
        e.downgrades.push(format!(
            "no private view: HOME is the private home's own path {} (not {}); toolchains read-only: {chains}; package caches not shared with yours (downloads go into the private home); /tmp is the host's and not writable (use $TMPDIR)",
            home.dir.display(),
            home.path.display()
        ));
    }
    for m in &home.masked {
        e.notes.push(format!(
            "left out of a toolchain: {} ({})",
            m.path.display(),
            m.what
        ));
    }
}

/// What the native backend would enforce for `policy` on this kernel, without preparing it.
pub fn enforcement(policy: &Policy, options: &NativeOptions) -> Result<Enforcement, HostError> {
    let support = view_support(options);
    let net = net_state(policy, options, &support)?;
    let plan = landlock_plan(policy, &support, &net)?;
    let seccomp = seccomp_plan(policy, &support, options, &net);
    let pid = pid_support(options, &support);
    Ok(report(
        policy, &plan, &seccomp, &support, &pid, &net, options,
    ))
}

/// The compiled forms a native run of `policy` would use on this machine (`policy show`).
pub struct Compiled {
    /// The private view's mounts, when the machine gives one.
    pub view: Option<Result<sandbox_policy::compile::view::ViewPlan, HostError>>,
    pub landlock: Result<compile::landlock::LandlockPlan, HostError>,
    pub seccomp: SeccompPlan,
    /// Where the view's bind of the host's proc is replaced by the pid namespace's own,
    /// when a run here gets one ([`crate::backends::native::view::PreparedView::proc_dir`]).
    pub own_proc: Option<PathBuf>,
}

pub fn compiled(policy: &Policy, options: &NativeOptions) -> Compiled {
    let support = view_support(options);
    let net = net_state(policy, options, &support).unwrap_or(NetState::Open);
    let view = (support == ViewSupport::Available).then(|| {
        // The layers a run would make, named as they would be (a run directory of each
        // command's own replaces `<run>`).
        let run = options.private_dir.join("git-store/<run>");
        // `layer/` is the run's bounded tmpfs (mounted in the child).
        let layers = sandbox_policy::compile::view::GitStoreLayers {
            upper: run.join("layer/upper"),
            work: run.join("layer/work"),
            snapshot: run.join("snapshot"),
            pinned_refs: Vec::new(),
            remotes: Vec::new(),
        };
        crate::backends::native::view::plan(policy, Some(&layers))
    });
    let binds_proc = matches!(&view, Some(Ok(plan))
        if plan.ops.iter().any(crate::backends::native::view::binds_host_proc));
    let own_proc = (binds_proc && pid_support(options, &support).is_ok())
        .then(|| PathBuf::from(crate::backends::native::view::PROC));
    Compiled {
        view,
        landlock: landlock_plan(policy, &support, &net).map_err(HostError::from),
        seccomp: seccomp_plan(policy, &support, options, &net),
        own_proc,
    }
}

/// The seccomp rules of a run: the policy's, plus — without a private view — a deny of new
/// unix sockets, since a pathname socket (tmux, D-Bus, docker) would reach the host.
///
/// Without a network namespace, a blocked network also denies the ways into a TCP connection
/// that pass neither `connect(2)` nor `bind(2)` and that seccomp can see (TCP fast open's
/// `sendto`/`sendmsg`); in a namespace there is no route for them to take.
pub(super) fn seccomp_plan(
    policy: &Policy,
    support: &ViewSupport,
    options: &NativeOptions,
    net: &NetState,
) -> SeccompPlan {
    let mut plan = compile::seccomp::compile(policy);
    plan.rules.extend(compile::seccomp::chown_rules(
        nix::unistd::geteuid().as_raw(),
    ));
    if matches!(support, ViewSupport::Unavailable { .. }) && !options.allow_unix_sockets {
        plan.rules.push(compile::seccomp::unix_socket_rule());
    }
    if matches!(policy.net, sandbox_policy::NetPolicy::Block { .. })
        && !matches!(net, NetState::Namespace(_))
    {
        plan.rules.extend(compile::seccomp::fast_open_rules());
    }
    plan
}

pub(super) fn report(
    policy: &Policy,
    plan: &compile::landlock::LandlockPlan,
    seccomp: &SeccompPlan,
    support: &ViewSupport,
    pid: &Result<(), String>,
    net: &NetState,
    options: &NativeOptions,
) -> Enforcement {
    let abi = abi::landlock_abi();
    let mut e = landlock::enforcement(plan, abi);
    account_layers(
        &mut e,
        plan,
        support,
        pid.is_ok(),
        net.plan().is_some(),
        abi,
    );
    match net {
        NetState::Open if !policy.publish.is_empty() => e.notes.push(format!(
            "--publish {}: the run shares the host's network, so its server listens on the \
             host's own port (nothing is relayed)",
            policy
                .publish
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" --publish ")
        )),
        NetState::Open => {}
        NetState::Namespace(plan) => e.enforced.push(plan.describe()),
        NetState::Missing(why) if crate::backends::native::net::needs_proxy(policy) => {
            e.gaps.push(format!(
                "--allow-domain/--credential: no network namespace ({why}), so the proxy cannot \
             be the only way out; use a machine with user namespaces (or --backend nono for \
             a domain list)"
            ))
        }
        NetState::Missing(why) => e.downgrades.push(format!(
            "no network namespace ({why}): --block-net holds by Landlock's TCP rules and \
             seccomp only: connect(2) and bind(2) to other ports and TCP fast open are \
             denied, but listen(2) on an unbound socket binds an ephemeral port no rule sees \
             (a host process can connect in), and --allow-port P reaches port P of every \
             address, not only the host's loopback"
        )),
    }
    match pid {
        Ok(()) => e.enforced.push(
            "pid namespace: the command is pid 2 of a namespace of its own (its /proc shows \
             only the run's processes); its init dies with sandbox, so when sandbox is killed, \
             even with SIGKILL, the kernel ends every process of the run"
                .into(),
        ),
        Err(why) => e.downgrades.push(format!(
            "no pid namespace ({why}): the run's processes are ended through their process \
             group and the parent-death signal of the command itself; a process that leaves \
             the group (setsid) outlives a SIGKILLed sandbox, and /proc shows the host's \
             processes"
        )),
    }
    match support {
        ViewSupport::Available => {
            e.mechanism = "view+landlock+seccomp".into();
            // Landlock alone would leave pathname sockets reachable; the view does not.
            e.notes.retain(|n| !n.contains("pathname unix sockets"));
            e.enforced.insert(
                0,
                "private view (user + mount namespaces, a new root): only the policy's paths \
                 exist — no unix socket, $HOME or /run of the host; a private /tmp; a minimal \
                 /dev with its device nodes bound read-only and a private devpts (new ptys \
                 work, the user's other terminals do not exist); git hooks, config and \
                 pointer files bound read-only"
                    .into(),
            );
            e.notes.push(
                "metadata: inside the view a run can change mode bits (never setuid/setgid), \
                 times and group of what it may write (the worktree, git data, TMPDIR, \
                 grants); the read-only binds refuse any change elsewhere"
                    .into(),
            );
        }
        ViewSupport::Unavailable { reason } => {
            let layer = format!("no private view: {reason}");
            e.downgrades.push(
                "metadata: without the view, Landlock does not mediate chmod, chown or utime: \
                 a run can change the mode bits (never setuid/setgid: seccomp), times and group \
                 of any file its user owns anywhere on the host (a private key made \
                 world-readable, /dev/null's mode as root), and the user's other terminals in \
                 /dev/pts are reachable"
                    .into(),
            );
            if options.allow_unix_sockets {
                e.downgrades.push(format!(
                    "{layer}; unix sockets are allowed (--allow-unix-sockets), so a pathname \
                     socket outside the policy (tmux, D-Bus, docker) is reachable"
                ));
            } else {
                e.downgrades.push(format!(
                    "{layer}; Landlock + seccomp only, and creating unix sockets is denied \
                     (socketpair works; --allow-unix-sockets lifts this)"
                ));
            }
        }
    }
    let quarantined = policy
        .workspace
        .git
        .as_ref()
        .is_some_and(|git| git.quarantined(&policy.workspace.root, policy.unprotected_git));
    match support {
        ViewSupport::Available if quarantined => e.enforced.push(
            "git store quarantined: objects and refs are written to a private layer; the host \
             applies the task branch and refs the run creates (compare-and-swap) and new \
             objects by their hash; every other ref is read-only inside"
                .into(),
        ),
        ViewSupport::Unavailable { .. } if quarantined => e.downgrades.push(
            "git store not quarantined (needs the private view): the repository's objects, \
             refs and logs are writable, so other branches and existing objects can be changed"
                .into(),
        ),
        _ => {}
    }
    home_report(&mut e, policy, *support == ViewSupport::Available);
    e.enforced
        .push(format!("seccomp: {}", describe_seccomp(seccomp)));
    e
}

/// The policy's properties, judged over every layer this run has (`crate::report::layers`): what
/// holds (and by which layer), the gaps that fail a run closed, and the downgrades it reports.
pub(super) fn account_layers(
    e: &mut Enforcement,
    plan: &compile::landlock::LandlockPlan,
    support: &ViewSupport,
    pid_namespace: bool,
    net_namespace: bool,
    abi: i32,
) {
    let needs = crate::report::layers::Needs {
        tcp_ports: plan.tcp.is_some(),
        scope_signals: plan.scope_signals,
        scope_abstract_unix: plan.scope_abstract_unix,
    };
    let layers = crate::report::layers::Layers {
        landlock_abi: abi,
        view: *support == ViewSupport::Available,
        pid_namespace,
        net_namespace,
    };
    let accounting = crate::report::layers::account(&needs, &layers);
    e.enforced
        .extend(accounting.held.iter().map(|v| v.enforced_line()));
    e.gaps
        .extend(accounting.gaps.iter().map(|v| v.missing_line()));
    e.downgrades.extend(accounting.downgrades.iter().map(|v| {
        let pid = if v.property == crate::report::layers::Property::Signals {
            ", and no pid namespace without the private view"
        } else {
            ""
        };
        format!(
            "{}: no layer of this run holds it (Landlock ABI {abi}{pid})",
            v.missing_line()
        )
    }));
}

pub(super) fn describe_seccomp(plan: &compile::seccomp::SeccompPlan) -> String {
    let mut reasons: Vec<&str> = Vec::new();
    for rule in &plan.rules {
        if !reasons.contains(&rule.why) {
            reasons.push(rule.why);
        }
    }
    reasons.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layers' filesystem is asked once per filesystem and kernel: two directories of
    /// one filesystem share the answer, another filesystem (a tmpfs) has its own.
    #[test]
    fn the_filesystem_key_names_the_filesystem_and_the_kernel() {
        let disk = tempfile::tempdir().unwrap();
        std::fs::create_dir(disk.path().join("a")).unwrap();
        std::fs::create_dir(disk.path().join("b")).unwrap();
        let (file_a, key_a) = filesystem_key(&disk.path().join("a")).unwrap();
        let (file_b, key_b) = filesystem_key(&disk.path().join("b")).unwrap();
        assert_eq!((&file_a, &key_a), (&file_b, &key_b));
        assert!(key_a.contains(&crate::privdir::kernel_key()), "{key_a}");
        let shm = Path::new("/dev/shm");
        if shm.is_dir() {
            let memory = tempfile::tempdir_in(shm).unwrap();
            let (file_m, key_m) = filesystem_key(memory.path()).unwrap();
            if nix::sys::stat::stat(memory.path()).unwrap().st_dev
                != nix::sys::stat::stat(disk.path()).unwrap().st_dev
            {
                assert_ne!(file_m, file_a);
                assert_ne!(key_m, key_a);
            }
        }
        assert_eq!(filesystem_key(&disk.path().join("missing")), None);
    }
}
