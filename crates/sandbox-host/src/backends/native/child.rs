//! The native sandbox as a [`ChildSetup`]: everything is prepared in the parent (the Landlock
//! ruleset fd, the BPF programs); the child makes three kinds of syscalls and execs.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::errno::Errno;
use sandbox_exec::{ChildSetup, SetupFailure, SetupStep};
use sandbox_policy::compile;
use sandbox_policy::Policy;
use seccompiler::BpfProgram;

use super::{abi, landlock, seccomp};
use crate::backends::native::userns::{self, ViewSupport};
use crate::backends::native::view::PreparedView;
use crate::error::HostError;
use crate::report::Enforcement;
use sandbox_policy::compile::seccomp::SeccompPlan;

/// How the native backend may react to this machine.
#[derive(Debug, Clone)]
pub struct NativeOptions {
    /// Run although the kernel cannot enforce part of the policy.
    pub allow_degraded: bool,
    /// Without a private view, unix sockets are denied unless the user allows them.
    pub allow_unix_sockets: bool,
    /// Our private directory: the probe's cache and the view's staging directory live here.
    pub private_dir: PathBuf,
    /// Our persistent private directory: the git task records live here.
    pub state_dir: PathBuf,
    /// The bound of a run's git store layer, in bytes (a tmpfs of this size per command).
    pub git_store_bytes: u64,
}

impl NativeOptions {
    /// The native backend's options from the seam's (the one place they are converted).
    pub fn of(options: &crate::seam::BackendOptions) -> Self {
        NativeOptions {
            allow_degraded: options.allow_degraded,
            allow_unix_sockets: options.allow_unix_sockets,
            private_dir: options.private_dir(),
            state_dir: options.state_dir(),
            git_store_bytes: options.git_store_bytes.unwrap_or(DEFAULT_GIT_STORE_BYTES),
        }
    }
}

/// The git store layer's bound when the configuration names none.
pub const DEFAULT_GIT_STORE_BYTES: u64 = 1 << 30;

/// A prepared native sandbox: everything compiled once per session. Each command gets a
/// [`NativeChild`] from [`NativeSandbox::command`].
pub struct NativeSandbox {
    view: Option<ViewMode>,
    ruleset: Option<OwnedFd>,
    /// What `ruleset` was built from: a command whose child adds a rule of its own (for a
    /// mount only its view has) builds a ruleset of its own from it.
    landlock: compile::landlock::LandlockPlan,
    filters: Vec<BpfProgram>,
    /// Set when running as root: the highest capability number to drop from the bounding
    /// set. Root keeps `CAP_SYS_PTRACE`, `CAP_DAC_OVERRIDE` and friends otherwise, and some
    /// kernel checks (reading another root process's `/proc/<pid>/environ`) then succeed even
    /// inside a Landlock domain.
    drop_caps_up_to: Option<u32>,
    /// Each command in a pid namespace of its own (with the view, where the probe allows).
    pid_namespace: bool,
    enforcement: Enforcement,
    /// Under the view, Landlock rules each command's child adds once its mounts exist: the
    /// private `/tmp` (writable), the root (listable), each package cache's overlay.
    view_rules: Vec<(PathBuf, u64)>,
    /// Each command in a network namespace of its own (the view, and a network that is not
    /// fully open): the supervisor's relay of its listeners.
    net: Option<crate::backends::native::netns::NetRelay>,
}

/// How each command gets its private view.
// One per backend session, never moved in a loop: boxing the larger variant buys nothing.
#[allow(clippy::large_enum_variant)]
enum ViewMode {
    /// The same view for every command (but one whose package caches' layers were busy: it
    /// gets a view of its own from `policy`).
    Shared {
        view: Arc<PreparedView>,
        policy: Box<Policy>,
        staging: PathBuf,
    },
    /// A view per command: its git store quarantine has a private layer of its own (an
    /// overlay's writable layer cannot be shared by two mounts).
    Quarantined {
        policy: Box<Policy>,
        /// Each command builds its own ruleset from this: the child adds a rule for its own
        /// overlay, which must not land in a ruleset other commands share.
        landlock: compile::landlock::LandlockPlan,
        staging: PathBuf,
        /// Where each command's quarantine directory is made.
        store_dir: PathBuf,
        /// The bound of each command's writable layer (`None`: no tmpfs of its own can take
        /// the overlay's xattrs here, and the layer stays on disk).
        store_bytes: Option<u64>,
        common: PathBuf,
        /// The worktree's git dir, whose `HEAD` names the task branch at each command's start.
        gitdir: PathBuf,
        /// Where the record of each worktree's task branch is kept (private, persistent).
        task_records: PathBuf,
        /// Where earlier versions kept them (the runtime dir): still read.
        legacy_records: PathBuf,
        /// The push remotes (`--allow-push`), each quarantined like the store.
        push_remotes: Vec<PathBuf>,
    },
}

/// The git quarantines of one command: the worktree's store, and each push remote's.
#[derive(Debug, Default)]
pub struct Stores {
    pub store: Option<sandbox_git::quarantine::LiveQuarantine>,
    pub pushes: Vec<(PathBuf, sandbox_git::quarantine::LiveQuarantine)>,
    /// The supervisor's side of the command's network namespace, when it has one.
    pub net: Option<crate::backends::native::netns::CommandNet>,
    /// The command's claim on its package caches' layers, held until its processes are gone.
    pub caches: Option<crate::assembly::home::caches::CacheClaim>,
}

/// One command's setup: the session's sandbox, and the command's view.
pub struct NativeChild {
    sandbox: Arc<NativeSandbox>,
    view: Option<Arc<PreparedView>>,
    /// With mounts only the child's view has (the git store's overlay, the private devpts):
    /// the command's own ruleset, and the rules the child adds for them once they exist.
    own_ruleset: Option<OwnedFd>,
    child_rules: Vec<ChildRule>,
    /// The command's network namespace: its listeners, bound inside and handed over.
    net: Option<crate::backends::native::netns::ChildNet>,
}

/// A Landlock rule added in the child after the view is built, for a directory mounted only
/// there: Landlock does not consult a rule on the mount point such a mount covers.
struct ChildRule {
    path: std::ffi::CString,
    access: u64,
}

/// `struct landlock_path_beneath_attr` (packed in the kernel's header).
#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;

impl ChildRule {
    fn new(path: &std::path::Path, access: u64) -> Result<Self, HostError> {
        Ok(ChildRule {
            path: std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| {
                HostError::ViewPath {
                    path: path.to_path_buf(),
                    cause: "contains a NUL byte".into(),
                }
            })?,
            access,
        })
    }

    fn add(&self, ruleset: &OwnedFd) -> Result<(), SetupFailure> {
        let fail = || SetupFailure::last(SetupStep::LandlockAddRule);
        // SAFETY: open(2) of a NUL-terminated path, O_PATH: no access to the content.
        let fd = unsafe {
            libc::open(
                self.path.as_ptr(),
                libc::O_PATH | libc::O_CLOEXEC | libc::O_DIRECTORY,
            )
        };
        if fd < 0 {
            return Err(fail());
        }
        let attr = PathBeneathAttr {
            allowed_access: self.access,
            parent_fd: fd,
        };
        // SAFETY: landlock_add_rule(2) reads one attribute struct from our stack; both fds
        // are open in this process.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_landlock_add_rule,
                ruleset.as_raw_fd(),
                LANDLOCK_RULE_PATH_BENEATH,
                &attr as *const PathBeneathAttr,
                0,
            )
        };
        let result = if rc == 0 { Ok(()) } else { Err(fail()) };
        // SAFETY: close(2) of the fd opened above.
        unsafe { libc::close(fd) };
        result
    }
}

impl std::fmt::Debug for NativeSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeSandbox")
            .field("ruleset", &self.ruleset)
            .field("filters", &self.filters.len())
            .finish()
    }
}

/// Whether this machine gives `options` a private view (the probe, cached in the private
/// directory when that is usable).
fn view_support(options: &NativeOptions) -> ViewSupport {
    let private = crate::privdir::ensure("native", &options.private_dir).ok();
    userns::support(private.as_deref())
}

/// Whether a run gets a pid namespace of its own: only with the view, where the probe says
/// its `/proc` mounts (cached in the private directory). `Err` says why not.
fn pid_support(options: &NativeOptions, support: &ViewSupport) -> Result<(), String> {
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
enum NetState {
    /// Fully open: no namespace of its own.
    Open,
    /// A private network namespace with this plan.
    Namespace(crate::backends::native::net::NetPlan),
    /// The policy wants one (`--block-net`, `--allow-domain`) and this machine cannot give
    /// it: why not.
    Missing(String),
}

impl NetState {
    fn plan(&self) -> Option<&crate::backends::native::net::NetPlan> {
        match self {
            NetState::Namespace(plan) => Some(plan),
            _ => None,
        }
    }
}

/// The network of a run of `policy` here: a namespace only with the view, where the probe
/// says one works (cached in the private directory).
fn net_state(
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
fn landlock_plan(
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
fn caches_unsupported(policy: &Policy) -> Option<String> {
    let home = policy.fs.home.as_ref()?;
    let first = home.caches.first()?;
    // The kernel's version, not the forking probe: the check runs on every start.
    if !kernel_at_least(5, 11) {
        return Some("overlays in a user namespace need Linux 5.11".into());
    }
    let layers = first.upper.parent()?;
    crate::privdir::layer_unsupported(layers).map(|why| format!("{}: {why}", layers.display()))
}

/// Whether the running kernel is at least `major.minor` (`uname -r`).
fn kernel_at_least(major: u32, minor: u32) -> bool {
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
fn home_report(e: &mut Enforcement, policy: &Policy, view: bool) {
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
fn seccomp_plan(
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

fn report(
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
fn account_layers(
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

fn describe_seccomp(plan: &compile::seccomp::SeccompPlan) -> String {
    let mut reasons: Vec<&str> = Vec::new();
    for rule in &plan.rules {
        if !reasons.contains(&rule.why) {
            reasons.push(rule.why);
        }
    }
    reasons.join("; ")
}

impl NativeSandbox {
    /// Compiles and builds everything for one run. Fails closed when the kernel cannot
    /// enforce part of the policy, unless `allow_degraded`.
    pub fn prepare(policy: &Policy, options: &NativeOptions) -> Result<Self, HostError> {
        let allow_degraded = options.allow_degraded;
        let private = crate::privdir::ensure("native", &options.private_dir);
        let support = userns::support(private.as_ref().ok().map(PathBuf::as_path));
        let pid = pid_support(options, &support);
        let pid_namespace = pid.is_ok();
        let net = net_state(policy, options, &support)?;
        // A published port needs the relay into the run's namespace.
        if let (NetState::Missing(why), Some(p)) = (&net, policy.publish.first()) {
            return Err(HostError::Network {
                message: format!(
                    "--publish {p} needs the run's own network namespace (the supervisor \
                     relays into it), which this machine cannot give ({why}). Nothing was run. \
                     Use a machine with unprivileged user namespaces (`sandbox doctor`), or \
                     run the server with the open network (no --block-net): it then listens \
                     on the host's own port"
                ),
            });
        }
        // A domain list with no namespace to hold it would be an open network: refused,
        // degraded runs or not.
        if let (NetState::Missing(why), true) =
            (&net, crate::backends::native::net::needs_proxy(policy))
        {
            let what = if policy.allow_domains.is_empty() {
                "--credential"
            } else {
                "--allow-domain"
            };
            return Err(HostError::Network {
                message: format!(
                    "{what} needs the run's own network namespace (the proxy must be its only \
                     way out), which this machine cannot give ({why}). Nothing was run. Use a \
                     machine with unprivileged user namespaces (`sandbox doctor`), or for a \
                     domain list --backend nono (its proxy)"
                ),
            });
        }
        // Package caches are overlays in the view: where this machine cannot mount one, the
        // run goes without (the tools download into the private home instead) and says so.
        let without_caches;
        let mut cache_note = None;
        let policy = match (&support, caches_unsupported(policy)) {
            (ViewSupport::Available, Some(why)) => {
                let mut p = policy.clone();
                if let Some(home) = &mut p.fs.home {
                    home.caches.clear();
                }
                cache_note = Some(format!(
                    "package caches not layered ({why}): downloads go into the private home"
                ));
                without_caches = p;
                &without_caches
            }
            _ => policy,
        };
        let mut layer_note = None;
        let view = match &support {
            ViewSupport::Available => {
                let private = private?;
                let staging = private.join("view");
                if policy.is_writable(&staging) {
                    return Err(HostError::PrivateDirWritable { path: staging });
                }
                match &policy.workspace.git {
                    Some(git)
                        if git.quarantined(&policy.workspace.root, policy.unprotected_git) =>
                    {
                        // The quarantine's layers are made and removed on every run: in
                        // memory where this machine allows (see `privdir::memory_scratch`),
                        // else on disk where the filesystem takes what a layer needs
                        // (`privdir::layer_dir`), never where the policy lets the command write.
                        // Before Linux 5.11 no overlay mounts in a user namespace: say so
                        // before any command, not as the child's EPERM.
                        userns::overlay_probe().map_err(|why| {
                            HostError::QuarantineUnsupported {
                                reason: format!(
                                    "{why}. Nothing was run. Use Linux 5.11 or later, or pass \
                                 --unprotected-git to run without the quarantine (the \
                                 repository's objects and refs are then writable)"
                                ),
                            }
                        })?;
                        let usable = |dir: &Path| !policy.is_writable(dir);
                        let memory = crate::privdir::memory_scratch(&private, &usable);
                        // A tmpfs there takes user xattrs (Linux 6.6 and later), which the
                        // overlay's `userxattr` needs of its upper layer: so can the run's own
                        // bounded tmpfs. Otherwise the layer stays on disk, out of the host's
                        // memory, bounded only by that disk.
                        let store_bytes = memory.is_some().then_some(options.git_store_bytes);
                        let (scratch, why) = match memory {
                            Some(dir) => (dir, "in memory".to_string()),
                            None => crate::privdir::layer_dir(&private, &usable)
                                .map_err(|reason| HostError::QuarantineUnsupported { reason })?,
                        };
                        layer_note = Some(format!(
                            "git store quarantine layers under {} ({why})",
                            scratch.display()
                        ));
                        let store_dir = scratch.join("git-store");
                        if policy.is_writable(&store_dir) {
                            return Err(HostError::PrivateDirWritable { path: store_dir });
                        }
                        // The records must outlive a reboot (a SIGKILLed run's HEAD parked on
                        // main is refused by them at the next start): in the state dir. Those
                        // an earlier version kept in the runtime dir are still read.
                        let state = crate::privdir::ensure("native", &options.state_dir)?;
                        let task_records = state.join("git-tasks");
                        let legacy_records = private.join("git-tasks");
                        for dir in [&task_records, &legacy_records] {
                            if policy.is_writable(dir) {
                                return Err(HostError::PrivateDirWritable { path: dir.clone() });
                            }
                        }
                        // Checked now, so a layout the view refuses fails before any command.
                        crate::backends::native::view::plan(policy, None)?;
                        Some(ViewMode::Quarantined {
                            policy: Box::new(policy.clone()),
                            landlock: landlock_plan(policy, &support, &net)?,
                            staging,
                            store_dir,
                            store_bytes,
                            common: git.common_dir.clone(),
                            gitdir: git.worktree_gitdir.clone(),
                            task_records,
                            legacy_records,
                            push_remotes: git.push_remotes.clone(),
                        })
                    }
                    _ => Some(ViewMode::Shared {
                        view: Arc::new(
                            PreparedView::prepare(policy, &staging, None, pid_namespace)?
                                .with_net_namespace(net.plan().is_some()),
                        ),
                        policy: Box::new(policy.clone()),
                        staging,
                    }),
                }
            }
            ViewSupport::Unavailable { .. } => None,
        };
        let pushes = policy
            .workspace
            .git
            .iter()
            .flat_map(|g| &g.push_remotes)
            .next();
        if let (Some(remote), false) = (pushes, matches!(view, Some(ViewMode::Quarantined { .. })))
        {
            return Err(HostError::QuarantineUnsupported {
                reason: format!(
                    "--allow-push {}: a push is taken in only through the git store \
                     quarantine, which this run does not have (it needs a linked worktree and \
                     the private view: see `sandbox doctor`). Nothing was run",
                    remote.display()
                ),
            });
        }
        let plan = landlock_plan(policy, &support, &net)?;
        let rules = seccomp_plan(policy, &support, options, &net);
        let enforcement = report(policy, &plan, &rules, &support, &pid, &net, options);
        if !enforcement.gaps.is_empty() {
            if !allow_degraded {
                return Err(HostError::Degraded {
                    backend: "native",
                    gaps: enforcement.gaps.clone(),
                });
            }
            tracing::warn!(gaps = ?enforcement.gaps, "running with a degraded sandbox");
        }
        let ruleset = landlock::build(&plan)?;
        // Without Landlock the view alone confines the filesystem (the accounting above);
        // without either, nothing does.
        if ruleset.is_none() && view.is_none() && !allow_degraded {
            return Err(HostError::Degraded {
                backend: "native",
                gaps: vec!["filesystem limits (Landlock is not available)".into()],
            });
        }
        let filters = seccomp::compile(&rules)?;
        // Root inside an outer sandbox has no capabilities left to drop (and no CAP_SETPCAP to
        // drop them with); no_new_privs already keeps exec from granting any back.
        let drop_caps_up_to = (nix::unistd::geteuid().is_root() && has_effective_cap(CAP_SETPCAP))
            .then(last_capability);
        let mut enforcement = enforcement;
        enforcement.notes.extend(layer_note);
        enforcement.notes.extend(cache_note);
        if drop_caps_up_to.is_some() {
            enforcement.enforced.push(
                "running as root: every capability is dropped, and exec cannot regain them".into(),
            );
        }
        let mut view_rules = Vec::new();
        if view.is_some() {
            let abi = abi::landlock_abi();
            view_rules.push((PathBuf::from("/tmp"), landlock::read_write_dir_bits(abi)));
            view_rules.push((PathBuf::from("/"), landlock::list_dir_bits()));
            if let Some(home) = &policy.fs.home {
                for cache in &home.caches {
                    view_rules.push((cache.path.clone(), landlock::read_write_dir_bits(abi)));
                }
            }
        }
        let pid_namespace = pid_namespace && view.is_some();
        let wants_namespace = matches!(net, NetState::Namespace(_));
        let net = match net {
            NetState::Namespace(plan) if view.is_some() => {
                Some(crate::backends::native::netns::NetRelay::start(plan)?)
            }
            _ => None,
        };
        if let (None, Some(p), true) = (&net, policy.publish.first(), wants_namespace) {
            return Err(HostError::Network {
                message: format!(
                    "--publish {p}: the run's network namespace needs the private view, which \
                     this run does not get; nothing was run (`sandbox doctor` says why)"
                ),
            });
        }
        Ok(NativeSandbox {
            net,
            view_rules,
            view,
            ruleset,
            landlock: plan,
            filters,
            drop_caps_up_to,
            pid_namespace,
            enforcement,
        })
    }

    pub fn enforcement(&self) -> &Enforcement {
        &self.enforcement
    }

    /// Whether commands get the private view (else Landlock and seccomp only).
    pub fn has_view(&self) -> bool {
        self.view.is_some()
    }

    /// The network plan of each command's namespace, when commands get one.
    pub fn net_plan(&self) -> Option<&crate::backends::native::net::NetPlan> {
        self.net.as_ref().map(|relay| relay.plan())
    }

    /// The setup of one command, with its git store quarantine when the session has one
    /// (synced live from now on; finish it once the command's processes are gone).
    pub fn command(self: &Arc<Self>) -> Result<(NativeChild, Stores), HostError> {
        let mut child_rules = Vec::new();
        let mut pushes = Vec::new();
        let mut plan = &self.landlock;
        // The package caches' layers are the command's, not the session's: another command
        // may hold them (`crate::assembly::home::caches`).
        let home = match &self.view {
            Some(ViewMode::Shared { policy, .. } | ViewMode::Quarantined { policy, .. }) => {
                policy.fs.home.as_ref().filter(|h| !h.caches.is_empty())
            }
            None => None,
        };
        let (caches, busy) = match home {
            Some(home) => {
                let (claim, layers) = crate::assembly::home::caches::claim(home)?;
                (Some(claim), layers)
            }
            None => (None, None),
        };
        let (view, store) = match &self.view {
            None => (None, None),
            Some(ViewMode::Shared {
                view,
                policy,
                staging,
            }) => match busy {
                None => (Some(view.clone()), None),
                Some(layers) => {
                    let policy = crate::assembly::home::caches::with_layers(policy, layers);
                    let own = PreparedView::prepare(&policy, staging, None, self.pid_namespace)?
                        .with_net_namespace(self.net.is_some());
                    (Some(Arc::new(own)), None)
                }
            },
            Some(ViewMode::Quarantined {
                policy,
                landlock,
                staging,
                store_dir,
                store_bytes,
                common,
                gitdir,
                task_records,
                legacy_records,
                push_remotes,
            }) => {
                use sandbox_git::quarantine::{LiveQuarantine, StoreQuarantine};
                let mut store = StoreQuarantine::prepare_task(
                    common,
                    gitdir,
                    &[task_records.as_path(), legacy_records.as_path()],
                    store_dir,
                    push_remotes,
                )
                .map_err(HostError::GitQuarantine)?;
                let layer = store_bytes
                    .map(|bytes| store.bound_layer(bytes))
                    .transpose()
                    .map_err(HostError::GitQuarantine)?;
                let records = sandbox_git::quarantine::task::push_record_dir(task_records, gitdir);
                let mut layers = store.layers().clone();
                for remote in push_remotes {
                    let quarantine = StoreQuarantine::prepare_push(remote, &records, store_dir)
                        .map_err(HostError::GitQuarantine)?;
                    layers
                        .remotes
                        .push(sandbox_policy::compile::view::RemoteStoreLayers {
                            gitdir: remote.clone(),
                            layers: quarantine.layers().clone(),
                        });
                    child_rules.push(ChildRule::new(
                        remote,
                        landlock::read_write_dir_bits(abi::landlock_abi()),
                    )?);
                    pushes.push((remote.clone(), LiveQuarantine::start(quarantine)));
                }
                let own_layers;
                let policy = match busy {
                    None => &**policy,
                    Some(layers) => {
                        own_layers = crate::assembly::home::caches::with_layers(policy, layers);
                        &own_layers
                    }
                };
                let view = PreparedView::prepare_with_layer(
                    policy,
                    staging,
                    Some(&layers),
                    layer,
                    self.pid_namespace,
                )?
                .with_net_namespace(self.net.is_some());
                plan = landlock;
                child_rules.push(ChildRule::new(
                    common,
                    landlock::read_write_dir_bits(abi::landlock_abi()),
                )?);
                (Some(Arc::new(view)), Some(LiveQuarantine::start(store)))
            }
        };
        if view.is_some() {
            for (path, access) in &self.view_rules {
                child_rules.push(ChildRule::new(path, *access)?);
            }
        }
        if let Some(proc) = view.as_deref().and_then(PreparedView::proc_dir) {
            child_rules.push(ChildRule::new(
                proc,
                landlock::read_dir_bits(abi::landlock_abi()),
            )?);
        }
        if let Some(devpts) = view.as_deref().and_then(PreparedView::devpts) {
            child_rules.push(ChildRule::new(
                devpts,
                landlock::device_dir_bits(abi::landlock_abi()),
            )?);
        }
        // The child's rules must not land in the ruleset other commands share.
        let own_ruleset = match (&self.ruleset, child_rules.is_empty()) {
            (Some(_), false) => landlock::build(plan)?,
            _ => None,
        };
        let (net, command_net) = match &self.net {
            Some(relay) => {
                let (child, command) = relay.command()?;
                (Some(child), Some(command))
            }
            None => (None, None),
        };
        Ok((
            NativeChild {
                sandbox: self.clone(),
                view,
                own_ruleset,
                child_rules,
                net,
            },
            Stores {
                store,
                pushes,
                net: command_net,
                caches,
            },
        ))
    }
}

const CAP_SETPCAP: u32 = 8;

/// Whether this process holds `cap` in its effective set.
fn has_effective_cap(cap: u32) -> bool {
    // capget(2) rather than parsing /proc/self/status, which the kernel formats in full for
    // every read (measurable on every run as root).
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capget(2) with a version-3 header and room for its two data words.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capget,
            std::ptr::addr_of_mut!(header),
            data.as_mut_ptr(),
        )
    };
    rc == 0 && cap < 64 && data[(cap / 32) as usize].effective & (1u32 << (cap % 32)) != 0
}

/// The highest capability this kernel knows (`/proc/sys/kernel/cap_last_cap`).
fn last_capability() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
/// SECBIT_NOROOT | _LOCKED, SECBIT_NO_SETUID_FIXUP | _LOCKED, SECBIT_KEEP_CAPS_LOCKED,
/// SECBIT_NO_CAP_AMBIENT_RAISE | _LOCKED: uid 0 gets no capabilities at exec, ever.
const SECURE_BITS: libc::c_ulong = 0b1110_1111;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Drops every capability for good. Async-signal safe: prctl(2) and capset(2) on stack data.
fn drop_capabilities(last: u32) -> Result<(), Errno> {
    for cap in 0..=last {
        // SAFETY: PR_CAPBSET_DROP takes an integer; EINVAL for a cap this kernel lacks.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0
            && Errno::last() != Errno::EINVAL
        {
            return Err(Errno::last());
        }
    }
    // SAFETY: integers only.
    if unsafe { libc::prctl(libc::PR_SET_SECUREBITS, SECURE_BITS, 0, 0, 0) } != 0 {
        return Err(Errno::last());
    }
    // SAFETY: integers only.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset(2) reads a header and two data words from our stack.
    if unsafe {
        libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        )
    } != 0
    {
        return Err(Errno::last());
    }
    Ok(())
}

/// Drops every capability in the child right before exec, for a backend whose own enforcer
/// keeps them (nono): as root, `CAP_SYS_PTRACE`, `CAP_DAC_OVERRIDE` and `CAP_SYS_ADMIN` let
/// a sandboxed process read other root processes' `/proc/<pid>/environ` or push keystrokes
/// with TIOCSTI even inside a Landlock domain. Only built when running as root.
#[derive(Debug)]
pub struct DropCapabilities {
    last: u32,
}

impl DropCapabilities {
    pub fn when_root() -> Option<Self> {
        nix::unistd::geteuid().is_root().then(|| DropCapabilities {
            last: last_capability(),
        })
    }
}

impl ChildSetup for DropCapabilities {
    fn apply_in_child(&self) -> Result<(), SetupFailure> {
        drop_capabilities(self.last).map_err(SetupFailure::at(SetupStep::DropCapabilities))
    }

    fn name(&self) -> &str {
        "drop capabilities"
    }
}

/// `struct landlock_restrict_self` takes no flags we need.
const RESTRICT_SELF_FLAGS: libc::c_uint = 0;

impl ChildSetup for NativeChild {
    fn apply_in_child(&self) -> Result<(), SetupFailure> {
        // The view first: it needs the capabilities its new user namespace grants, which the
        // drop below and no_new_privs would otherwise limit.
        if let Some(view) = &self.view {
            view.apply_in_child()?;
            // In the namespace the view's unshare made, before Landlock and seccomp: `lo`
            // up, the listeners bound and handed to the supervisor.
            if let Some(net) = &self.net {
                net.apply_in_child()?;
            }
            if view.pid_namespace() {
                // The rest runs in the command's process inside the pid namespace.
                return Ok(());
            }
        }
        self.apply_limits()
    }

    fn pid_namespace(&self) -> bool {
        self.view.as_ref().is_some_and(|view| view.pid_namespace())
    }

    fn apply_in_namespace(&self) -> Result<(), SetupFailure> {
        if let Some(view) = &self.view {
            view.apply_in_namespace()?;
        }
        self.apply_limits()
    }

    fn name(&self) -> &str {
        if self.net.is_some() {
            "view+netns+landlock+seccomp"
        } else if self.view.is_some() {
            "view+landlock+seccomp"
        } else {
            "landlock+seccomp"
        }
    }

    fn describe(&self, step: SetupStep, detail: u32) -> Option<String> {
        if step == SetupStep::NetListeners && detail != 0 {
            return Some(format!("127.0.0.1:{detail}"));
        }
        self.view.as_ref()?.describe(step, detail)
    }
}

impl NativeChild {
    /// The rules for mounts only the child's view has, then the sandbox's limits.
    fn apply_limits(&self) -> Result<(), SetupFailure> {
        let ruleset = self.own_ruleset.as_ref().or(self.sandbox.ruleset.as_ref());
        if let Some(ruleset) = &self.own_ruleset {
            for rule in &self.child_rules {
                rule.add(ruleset)?;
            }
        }
        self.sandbox.apply_limits(ruleset)
    }
}

impl NativeSandbox {
    /// Capabilities, no_new_privs, Landlock and seccomp, in the child after its view.
    fn apply_limits(&self, ruleset: Option<&OwnedFd>) -> Result<(), SetupFailure> {
        if let Some(last) = self.drop_caps_up_to {
            drop_capabilities(last).map_err(SetupFailure::at(SetupStep::DropCapabilities))?;
        }
        // The child of fork() has exactly one thread, so restricting "self" covers every
        // thread the command will ever have: they all descend from this one.
        // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) takes integers only. Required by both Landlock
        // and seccomp for an unprivileged caller, and it keeps setuid binaries from
        // regaining privileges inside the sandbox.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(SetupFailure::last(SetupStep::NoNewPrivs));
        }
        if let Some(fd) = ruleset {
            // SAFETY: landlock_restrict_self(fd, flags) reads no memory of ours; the fd was
            // created in the parent and is open in this child (it is closed only at exec,
            // where Landlock no longer needs it: the domain is attached to the process).
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_landlock_restrict_self,
                    fd.as_raw_fd(),
                    RESTRICT_SELF_FLAGS,
                )
            };
            if rc != 0 {
                return Err(SetupFailure::last(SetupStep::LandlockRestrictSelf));
            }
        }
        // Seccomp must stay the last step: it denies mount, unshare, setns and namespace
        // clones, so any setup of that kind (a private mount namespace) has to happen above.
        for filter in &self.filters {
            // apply_filter builds a sock_fprog on the stack and calls seccomp(2); it does
            // not allocate on success, and on failure only wraps the errno.
            if seccompiler::apply_filter(filter).is_err() {
                let errno = Errno::last();
                return Err(SetupFailure {
                    step: SetupStep::SeccompLoad,
                    errno: if errno == Errno::UnknownErrno {
                        Errno::EINVAL
                    } else {
                        errno
                    },
                    detail: 0,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capget_agrees_with_the_kernels_status_file() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let mask = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
            .unwrap();
        for cap in 0..=last_capability() {
            assert_eq!(
                has_effective_cap(cap),
                mask & (1u64 << cap) != 0,
                "capability {cap} (CapEff {mask:#x})"
            );
        }
    }
}
