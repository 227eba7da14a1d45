//! The native sandbox of a session: everything compiled once in the parent — the view's
//! plan, the Landlock ruleset, the BPF programs — and each command's child armed from it
//! ([`NativeSandbox::command`]).

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sandbox_policy::compile;
use sandbox_policy::Policy;
use seccompiler::BpfProgram;

use super::capabilities::{has_effective_cap, last_capability, CAP_SETPCAP};
use super::child::{ChildRule, NativeChild};
use super::options::NativeOptions;
use super::plans::{
    caches_unsupported, landlock_plan, net_state, pid_support, report, seccomp_plan, NetState,
};
use super::{abi, landlock, seccomp};

use crate::backends::native::userns::{self, ViewSupport};
use crate::backends::native::view::PreparedView;
use crate::error::HostError;
use crate::report::Enforcement;

/// A prepared native sandbox: everything compiled once per session. Each command gets a
/// [`NativeChild`] from [`NativeSandbox::command`].
pub struct NativeSandbox {
    pub(super) view: Option<ViewMode>,
    /// The ruleset every command shares: only without the view (with it, each command's child
    /// adds rules of its own).
    pub(super) ruleset: Option<OwnedFd>,
    /// Whether this kernel has Landlock (the ruleset could be built).
    pub(super) landlock_on: bool,
    /// With the view: the ruleset built while preparing, for the first command to take as
    /// its own (a `sandbox run` has one command: one ruleset built, not two); later
    /// commands build theirs from `landlock`.
    spare: std::sync::Mutex<Option<OwnedFd>>,
    /// What the rulesets are built from.
    pub(super) landlock: compile::landlock::LandlockPlan,
    pub(super) filters: Vec<BpfProgram>,
    /// Set when running as root: the highest capability number to drop from the bounding
    /// set. Root keeps `CAP_SYS_PTRACE`, `CAP_DAC_OVERRIDE` and friends otherwise, and some
    /// kernel checks (reading another root process's `/proc/<pid>/environ`) then succeed even
    /// inside a Landlock domain.
    pub(super) drop_caps_up_to: Option<u32>,
    /// Each command in a pid namespace of its own (with the view, where the probe allows).
    pub(super) pid_namespace: bool,
    pub(super) enforcement: Enforcement,
    /// Under the view, Landlock rules each command's child adds once its mounts exist: the
    /// private `/tmp` (writable), the root (listable), each package cache's overlay.
    pub(super) view_rules: Vec<(PathBuf, u64)>,
    /// Each command in a network namespace of its own (the view, and a network that is not
    /// fully open): the supervisor's relay of its listeners.
    pub(super) net: Option<crate::backends::native::netns::NetRelay>,
}

/// How each command gets its private view.
// One per backend session, never moved in a loop: boxing the larger variant buys nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum ViewMode {
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

impl std::fmt::Debug for NativeSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeSandbox")
            .field("ruleset", &self.ruleset)
            .field("filters", &self.filters.len())
            .finish()
    }
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
        refuse_without_namespace(policy, &net)?;
        // Package caches are overlays in the view: where this machine cannot mount one, the
        // run goes without (the tools download into the private home instead) and says so.
        let without_caches;
        let mut cache_note = None;
        let private_dir = private.as_ref().ok().map(PathBuf::as_path);
        let policy = match (&support, caches_unsupported(policy, private_dir)) {
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
                        let (mode, note) =
                            quarantined_view(policy, git, options, &private, staging)?;
                        layer_note = Some(note);
                        Some(mode)
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
        let built = landlock::build(&plan)?;
        let landlock_on = built.is_some();
        // Without Landlock the view alone confines the filesystem (the accounting above);
        // without either, nothing does.
        if !landlock_on && view.is_none() && !allow_degraded {
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
        let (ruleset, spare) = match view {
            Some(_) => (None, built),
            None => (built, None),
        };
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
            ruleset,
            spare: std::sync::Mutex::new(spare),
            view,
            landlock_on,
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
        // The child's rules must not land in a ruleset other commands share: the first
        // command takes the one built while preparing, every later one builds its own.
        let own_ruleset = if self.landlock_on && !child_rules.is_empty() {
            let spare = self
                .spare
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            match spare {
                Some(fd) => Some(fd),
                None => landlock::build(&self.landlock)?,
            }
        } else {
            None
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

/// The view of a run whose git store is quarantined: where its layers go (in memory where the
/// machine allows, else on disk, never where the policy writes), where the task records live,
/// and the view's plan checked before any command. Also the note saying where the layers are.
fn quarantined_view(
    policy: &Policy,
    git: &sandbox_policy::GitLayout,
    options: &NativeOptions,
    private: &Path,
    staging: PathBuf,
) -> Result<(ViewMode, String), HostError> {
    // The quarantine's layers are made and removed on every run: in
    // memory where this machine allows (see `privdir::memory_scratch`),
    // else on disk where the filesystem takes what a layer needs
    // (`privdir::layer_dir`), never where the policy lets the command write.
    // Before Linux 5.11 no overlay mounts in a user namespace: say so
    // before any command, not as the child's EPERM.
    userns::overlay_support(Some(private)).map_err(|why| HostError::QuarantineUnsupported {
        reason: format!(
            "{why}. Nothing was run. Pass --unprotected-git to run \
                 without the quarantine (the repository's objects and refs \
                 are then writable)"
        ),
    })?;
    let usable = |dir: &Path| !policy.is_writable(dir);
    let memory = crate::privdir::memory_scratch(private, &usable);
    // A tmpfs there takes user xattrs (Linux 6.6 and later), which the
    // overlay's `userxattr` needs of its upper layer: so can the run's own
    // bounded tmpfs. Otherwise the layer stays on disk, out of the host's
    // memory, bounded only by that disk.
    let store_bytes = memory.is_some().then_some(options.git_store_bytes);
    let (scratch, why) = match memory {
        Some(dir) => (dir, "in memory".to_string()),
        None => crate::privdir::layer_dir(private, &usable)
            .map_err(|reason| HostError::QuarantineUnsupported { reason })?,
    };
    let layer_note = format!(
        "git store quarantine layers under {} ({why})",
        scratch.display()
    );
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
    let mode = ViewMode::Quarantined {
        policy: Box::new(policy.clone()),
        staging,
        store_dir,
        store_bytes,
        common: git.common_dir.clone(),
        gitdir: git.worktree_gitdir.clone(),
        task_records,
        legacy_records,
        push_remotes: git.push_remotes.clone(),
    };
    Ok((mode, layer_note))
}

/// What needs the run's own network namespace is refused, loudly, where the machine gives
/// none: a published port (the supervisor relays into the namespace) and a domain list or a
/// credential (the proxy must be the only way out), degraded runs or not.
fn refuse_without_namespace(policy: &Policy, net: &NetState) -> Result<(), HostError> {
    // A published port needs the relay into the run's namespace.
    if let (NetState::Missing(why), Some(p)) = (net, policy.publish.first()) {
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
    if let (NetState::Missing(why), true) = (net, crate::backends::native::net::needs_proxy(policy))
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
    Ok(())
}
