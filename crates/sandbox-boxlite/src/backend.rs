//! BoxLite behind the backend seam: its [`BoxliteProvider`] for the registry and the backend
//! that prepares a box in [`sandbox_host::Run::prepare`], like every other backend.
//!
//! A box belongs to the daemon, which holds the one BoxLite runtime of the user's home
//! ([`Engines`], opened on the first box). The CLI links the refusing form
//! ([`BoxliteProvider::refusing`]): `sandbox run` starts no VM. The daemon links
//! [`BoxliteProvider::daemon`], whose `prepare` — on the daemon's blocking thread of
//! `box.create` — does, in order:
//!
//! 1. the box's description ([`BackendOptions::vm`](sandbox_host::BackendOptions::vm))
//!    checked into a [`BoxSpec`](crate::BoxSpec) ([`crate::request`]);
//! 2. its mounts refused where they reach a trusted place or BoxLite's home;
//! 3. "opening the BoxLite runtime" and "creating the box" (or finding the one BoxLite keeps
//!    under that name, from the same image), each a named step of the [`Progress`];
//! 4. the [`Enforcement`] and the [`BoxSession`] its commands run in.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sandbox_host::seam::{Progress, Step};
use sandbox_host::{
    Backend, BackendKind, BackendOptions, BackendSession, Enforcement, HostError, Provider,
};
use sandbox_policy::{Grant, GrantReason, NetPolicy, Policy};

use crate::engine::{Engine, EngineOptions};
use crate::error::{BoxliteError, PrepareError};
use crate::request::{self, BOX_GIT_DIR, COMMITS_FROM_BOXES};
use crate::session::{BoxSession, BoxShare, Commits};
use crate::share;
use crate::spec::{BoxSpec, ImageSource};

/// The daemon's one BoxLite runtime, opened on first use and shared by every box (and shut
/// down by the daemon when it exits). Not kept when opening fails, so a user who fixes the
/// runtime files does not have to restart the daemon.
pub struct Engines {
    home: PathBuf,
    ready_timeout: Option<Duration>,
    engine: Mutex<Option<Arc<Engine>>>,
}

impl Engines {
    /// The runtime of `home` (BoxLite's lock, images, disks, boxes, logs), not opened yet;
    /// `ready_timeout` overrides the engine's wait for a guest's agent.
    pub fn new(home: PathBuf, ready_timeout: Option<Duration>) -> Arc<Engines> {
        Arc::new(Engines {
            home,
            ready_timeout,
            engine: Mutex::new(None),
        })
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    /// The engine, opened now if it is not yet. Blocks (opening takes seconds): call it from
    /// a blocking thread. Two callers do not both open it: the second waits for the first.
    pub fn get(&self) -> Result<Arc<Engine>, BoxliteError> {
        let mut slot = self.engine.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(engine) = &*slot {
            return Ok(engine.clone());
        }
        let mut options = EngineOptions::new(self.home.clone());
        if let Some(t) = self.ready_timeout {
            options.ready_timeout = t;
        }
        let engine = Arc::new(Engine::open(options)?);
        *slot = Some(engine.clone());
        Ok(engine)
    }

    /// The engine if it was opened (the daemon's shutdown stops its boxes). Waits for an
    /// opening under way: call it from a blocking thread.
    pub fn opened(&self) -> Option<Arc<Engine>> {
        self.engine
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// BoxLite's entry in the binary's backend registry ([`sandbox_host::Backends`]), linked only
/// with the cargo feature `boxlite`.
pub struct BoxliteProvider {
    /// The daemon's runtime; `None` outside the daemon.
    engines: Option<Arc<Engines>>,
}

impl BoxliteProvider {
    /// Outside the daemon (the CLI): boxes belong to the daemon (one runtime per home), so
    /// opening the backend is refused, typed ([`HostError::RunsInDaemon`]).
    pub fn refusing() -> BoxliteProvider {
        BoxliteProvider { engines: None }
    }

    /// The daemon's: boxes are prepared with its runtime.
    pub fn daemon(engines: Arc<Engines>) -> BoxliteProvider {
        BoxliteProvider {
            engines: Some(engines),
        }
    }
}

impl Provider for BoxliteProvider {
    fn kind(&self) -> BackendKind {
        BackendKind::Boxlite
    }

    fn open(&self, options: &BackendOptions) -> Result<Box<dyn Backend>, HostError> {
        match &self.engines {
            None => Err(runs_in_daemon()),
            Some(engines) => Ok(Box::new(BoxliteBackend {
                engines: engines.clone(),
                options: options.clone(),
            })),
        }
    }
}

fn runs_in_daemon() -> HostError {
    HostError::RunsInDaemon {
        backend: BackendKind::Boxlite,
    }
}

/// The backend the daemon's provider opens for one `box.create`.
struct BoxliteBackend {
    engines: Arc<Engines>,
    options: BackendOptions,
}

impl Backend for BoxliteBackend {
    /// Availability is judged for a run in this process (`doctor`, `host.describe`): boxes
    /// are made through `box.create` only, so the daemon's answer stays the CLI's.
    fn enforcement(&self, _policy: &Policy) -> Result<Enforcement, HostError> {
        Err(runs_in_daemon())
    }

    fn prepare(
        &self,
        policy: &Policy,
        progress: &dyn Progress,
    ) -> Result<Arc<dyn BackendSession>, HostError> {
        let session = self.prepare_box(policy, progress)?;
        Ok(Arc::new(session))
    }
}

/// A failure of BoxLite's own, as the seam carries it (the caller downcasts the source).
fn failed(e: impl Into<PrepareError>) -> HostError {
    HostError::Backend {
        backend: BackendKind::Boxlite,
        source: Box::new(e.into()),
    }
}

impl BoxliteBackend {
    fn prepare_box(
        &self,
        policy: &Policy,
        progress: &dyn Progress,
    ) -> Result<BoxSession, HostError> {
        let vm = self
            .options
            .vm
            .as_ref()
            .ok_or_else(|| failed(PrepareError::NoRequest))?;
        // The box's workdir is the policy's working directory (`box.create`'s workdir,
        // canonical), mounted at its own path; the network is the policy's.
        let workdir = &policy.workspace.cwd;
        let block_net = matches!(policy.net, NetPolicy::Block { .. });
        // The box's git directory: by its name, so a box BoxLite keeps across daemons finds
        // the one its mounts name.
        let state_dir = self.options.state_dir();
        let commit_root = state_dir.join(BOX_GIT_DIR).join(&vm.name);
        // The view composed on the host where this daemon may make the staging directory's
        // binds (docs/boxlite.md, "Few shares per box"); else a share per mount, and read-only
        // git (the commit mounts would not fit).
        let share_dir = share::staging_dir(&state_dir, &vm.name);
        let one_share = one_share_here(&state_dir.join(share::SHARE_DIR));
        let commits = COMMITS_FROM_BOXES && one_share;
        if commits {
            let dir = state_dir.join(BOX_GIT_DIR);
            std::fs::create_dir_all(&dir)
                .map_err(|source| failed(PrepareError::StateDir { dir, source }))?;
        }
        let (spec, box_git) = request::box_spec_with(
            vm,
            workdir,
            block_net,
            commits.then_some(commit_root.as_path()),
            one_share.then_some(share_dir.as_path()),
        )
        .map_err(failed)?;
        // The mounts are grants: none may reach the user's configuration, the remembered
        // choices or the daemon's token (the policy's own grants were checked before this
        // backend was opened), nor BoxLite's own home.
        let mut granted = policy.clone();
        for m in request::granted_mounts(&spec, &commit_root) {
            let grant = Grant {
                path: m.host.clone(),
                reason: GrantReason::User,
            };
            match m.read_only {
                true => granted.fs.read.push(grant),
                false => granted.fs.write.push(grant),
            }
        }
        self.options.trusted.check(&granted)?;
        let home = self.engines.home();
        if let Some(mount) =
            request::reaching_home(request::granted_mounts(&spec, &commit_root), home)
        {
            return Err(failed(PrepareError::ReachesHome {
                mount,
                home: home.to_path_buf(),
            }));
        }
        let box_share = plan(&spec);
        // The engine's calls are async: driven on the daemon's runtime from this blocking
        // thread (its `box.create` prepares in `spawn_blocking`).
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| failed(PrepareError::NoRuntime(e.to_string())))?;
        let engine = timed(progress, "opening the BoxLite runtime", || {
            self.engines.get()
        })
        .map_err(failed)?;
        let (litebox, new_in_boxlite) = timed(progress, "creating the box", || {
            runtime.block_on(engine.create(&spec))
        })
        .map_err(failed)?;
        if !new_in_boxlite {
            // Kept from an earlier daemon: only reused when it is the same image.
            let info = runtime
                .block_on(litebox.info())
                .map_err(|e| failed(PrepareError::KeptUnreadable(e.to_string())))?;
            let wanted = image_name(&spec.image);
            if info.image != wanted {
                return Err(failed(PrepareError::KeptOther {
                    name: vm.name.clone(),
                    kept: info.image,
                    wanted,
                }));
            }
        }
        let enforcement = enforcement(&spec, vm.unprotected_git, box_git.is_some());
        let commits = box_git.map(|git| Commits {
            git,
            records: vec![state_dir.join("git-tasks")],
            scratch: self.options.private_dir().join(BOX_GIT_DIR),
        });
        Ok(BoxSession::new(
            engine,
            &vm.name,
            litebox,
            enforcement,
            commits,
            box_share,
            !new_in_boxlite,
        ))
    }
}

/// Whether this daemon's boxes get their view composed on the host: on Linux, where it may
/// make bind mounts
/// (tried once, in `dir`). Not on macOS (no bind mounts; Apple Silicon's VMs have interrupts
/// for every device).
fn one_share_here(dir: &Path) -> bool {
    #[cfg(target_os = "linux")]
    {
        static CAN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *CAN.get_or_init(|| {
            let can = std::fs::create_dir_all(dir).is_ok() && share::can_bind(dir);
            if can {
                // Binds a daemon left when it died booting a box: taken down now, so nothing
                // removing the state directory later reaches a worktree through them.
                share::sweep(dir);
            }
            can
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = dir;
        false
    }
}

/// What the box's boots lay out, when its view is composed on the host.
fn plan(spec: &BoxSpec) -> Option<BoxShare> {
    let dir = spec.share.as_ref()?;
    let layout = share::layout(&spec.mounts, &crate::engine::workdir_of(spec));
    Some(BoxShare {
        dir: dir.clone(),
        entry: share::entry(&layout),
        binds: layout.binds,
    })
}

/// Runs `f` as the named step `name`, reporting its end (done with its time, or failed with
/// the error's words). No `started` step: a box's `creating` events have always been these.
fn timed<T>(
    progress: &dyn Progress,
    name: &'static str,
    f: impl FnOnce() -> Result<T, BoxliteError>,
) -> Result<T, BoxliteError> {
    let started = Instant::now();
    let result = f();
    progress.step(match &result {
        Ok(_) => Step::Done {
            step: name,
            elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        },
        Err(e) => Step::Failed {
            step: name,
            error: e.to_string(),
        },
    });
    result
}

/// How BoxLite names a box's image in its records.
fn image_name(image: &ImageSource) -> String {
    match image {
        ImageSource::Registry(r) => r.clone(),
        ImageSource::Layout(d) => format!("rootfs:{}", d.display()),
    }
}

/// What a box enforces.
fn enforcement(spec: &BoxSpec, unprotected_git: bool, commits_come_back: bool) -> Enforcement {
    Enforcement {
        mechanism: "boxlite microVM (KVM)".into(),
        enforced: vec![
            "commands run in a hardware-isolated guest kernel".into(),
            "the guest sees only the box's image and its mounts".into(),
            if spec.block_net {
                "no network interface".into()
            } else if spec.allow_net.is_empty() {
                "network open (no allowNet)".into()
            } else {
                "outbound network only to allowNet".into()
            },
        ],
        notes: vec![if unprotected_git {
            "unprotected git: the repository's git directory is writable from the box \
                 (hooks and config included)"
                .into()
        } else if commits_come_back {
            "git data is mounted read-only (the .git pointer too); the box's git writes a \
                 private copy of the common dir whose commits the host takes back when no \
                 command runs: the task branch moves, nothing else does"
                .into()
        } else {
            "git data is mounted read-only (the .git pointer too): git in the box reads \
                 history and cannot commit"
                .into()
        }],
        ..Default::default()
    }
}
