//! The Lima backend behind the seam: prepare = the task's sandbox view and its watcher, the
//! project's VM created or started lazily and checked; command = `limactl shell --workdir
//! <view> <instance> -- enter …` with the view's git store layer read back on the host.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sandbox_exec::CommandSpec;
use sandbox_git::quarantine::{LiveQuarantine, StoreQuarantine};
use sandbox_git::{View, ViewManager, WatcherHandle};
use sandbox_host::seam::{Backend, BackendKind, BackendSession, Progress, Step};
use sandbox_host::{Enforcement, HostError, PreparedCommand};
use sandbox_policy::{NetPolicy, Policy};

use crate::error::LimaError;
use crate::limactl::Limactl;
use crate::mounts::{self, ViewLayout};
use crate::vm::{self, Vm, VmEvent};
use crate::yaml::{self, ImageChoice, LimaYaml, Overrides, Platform};

/// The trusted settings the CLI opens the backend with.
#[derive(Debug, Clone)]
pub struct LimaSettings {
    /// The `limactl` found (baked path, `SANDBOX_LIMACTL`, `PATH`); `None`: missing.
    pub limactl: Option<PathBuf>,
    /// The private `LIMA_HOME`.
    pub home: PathBuf,
    /// Where sandbox views live, and the runtime dir of their watchers' locks.
    pub views_root: PathBuf,
    pub runtime_dir: PathBuf,
    /// The flake's NixOS image (a qcow2 file or the directory holding one), if built with Nix.
    pub nix_image: Option<PathBuf>,
    /// Where each project's overrides live (`<dir>/<instance>.yaml`).
    pub overrides_dir: PathBuf,
    /// A private directory for the host's scratch files (the quarantine's).
    pub private_dir: PathBuf,
    /// Where Lima looks for the vhost-user description of its virtiofsd, in its order
    /// ([`crate::virtiofs::search_dirs_here`]); read only for a QEMU VM.
    pub vhost_user_dirs: Vec<PathBuf>,
    /// `limactl start --timeout` (`SANDBOX_LIMA_START_TIMEOUT`): a VM that boots slowly
    /// (QEMU without KVM) needs more than Lima's 10 minutes.
    pub start_timeout: Option<String>,
}

/// A project as the backend sees it: the VM's name, and everything its YAML is made of.
#[derive(Debug, Clone)]
pub struct Project {
    pub vm: Vm,
    pub views: Vec<View>,
    pub layouts: Vec<ViewLayout>,
    pub yaml: LimaYaml,
    pub overrides_path: PathBuf,
}

impl LimaSettings {
    pub fn limactl(&self) -> Result<Limactl, LimaError> {
        let path = self.limactl.clone().ok_or(LimaError::LimactlMissing)?;
        Ok(Limactl {
            path,
            home: self.home.clone(),
            start_timeout: self.start_timeout.clone(),
        })
    }

    pub fn views(&self) -> ViewManager {
        ViewManager::new(&self.views_root).with_runtime_dir(&self.runtime_dir)
    }

    /// Creates the private `LIMA_HOME` (0700) and checks it.
    pub fn ensure_home(&self) -> Result<(), LimaError> {
        use std::os::unix::fs::DirBuilderExt;
        vm::check_home(&self.home)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.home)
            .map_err(crate::error::io("creating", &self.home))
    }

    /// The image: the flake's NixOS image with its digest (cached beside `LIMA_HOME`, keyed by
    /// the immutable store path), else Ubuntu 24.04.
    pub fn image(&self) -> Result<ImageChoice, LimaError> {
        let Some(path) = &self.nix_image else {
            return Ok(ImageChoice::Ubuntu);
        };
        let file = if path.is_dir() {
            std::fs::read_dir(path)
                .map_err(crate::error::io("reading", path))?
                .flatten()
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|e| e == "qcow2"))
                .ok_or_else(|| LimaError::BadPath {
                    path: path.clone(),
                    why: "the NixOS image directory holds no .qcow2 file",
                })?
        } else {
            path.clone()
        };
        let digest = image_digest(&file, &self.home)?;
        Ok(ImageChoice::Nix { path: file, digest })
    }

    /// Reads the project's overrides (an absent file: none).
    pub fn overrides(&self, path: &Path) -> Result<Overrides, LimaError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Overrides::parse(&text).map_err(|message| LimaError::Overrides {
                path: path.to_path_buf(),
                message,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Overrides::default()),
            Err(e) => Err(crate::error::io("reading", path)(e)),
        }
    }

    /// What the project of `view` would run: its instance name and the YAML for all of its
    /// views. Needs no `limactl` (`sandbox lima config` shows it on a machine without Lima).
    pub fn plan(&self, view: &View) -> Result<Plan, LimaError> {
        self.plan_with(view, &sandbox_policy::Limits::default())
    }

    /// [`Self::plan`], with a run's resource limits sizing the VM where the project's
    /// overrides do not ([`Overrides::with_limits`]).
    pub fn plan_with(
        &self,
        view: &View,
        limits: &sandbox_policy::Limits,
    ) -> Result<Plan, LimaError> {
        let views = self.views();
        let project = views.project_of(&view.task_worktree)?;
        let mut all = views.list(Some(&project))?;
        if !all.iter().any(|v| v.view_path == view.view_path) {
            all.push(view.clone());
        }
        let instance = vm::instance_name(&view.project, &view.common_dir);
        let overrides_path = self.overrides_dir.join(format!("{instance}.yaml"));
        let overrides = self.overrides(&overrides_path)?.with_limits(limits);
        let (mounts, layouts) = mounts::project_mounts(&all)?;
        let image = self.image()?;
        let yaml = yaml::generate(&yaml::Inputs {
            platform: Platform::here(),
            arch: yaml::host_arch(),
            image: &image,
            mounts: &mounts,
            views: &layouts,
            overrides: &overrides,
        });
        Ok(Plan {
            instance,
            views: all,
            layouts,
            yaml,
            overrides_path,
        })
    }

    /// The project of `view`: its VM (through `limactl`) and the YAML for all of its views.
    pub fn project(&self, view: &View) -> Result<Project, LimaError> {
        self.project_with(view, &sandbox_policy::Limits::default())
    }

    /// [`Self::project`] for a run with these resource limits.
    pub fn project_with(
        &self,
        view: &View,
        limits: &sandbox_policy::Limits,
    ) -> Result<Project, LimaError> {
        let limactl = self.limactl()?;
        let plan = self.plan_with(view, limits)?;
        Ok(Project {
            vm: Vm::new(limactl, plan.instance),
            views: plan.views,
            layouts: plan.layouts,
            yaml: plan.yaml,
            overrides_path: plan.overrides_path,
        })
    }

    /// The instance's YAML as Lima keeps it (`<LIMA_HOME>/<instance>/lima.yaml`), if the
    /// instance exists; read without `limactl`.
    pub fn current_yaml(&self, instance: &str) -> Option<LimaYaml> {
        let text = std::fs::read_to_string(self.home.join(instance).join("lima.yaml")).ok()?;
        serde_yaml::from_str(&text).ok()
    }
}

/// A project's VM as it would be made, without `limactl`: [`LimaSettings::plan`].
#[derive(Debug, Clone)]
pub struct Plan {
    pub instance: String,
    pub views: Vec<View>,
    pub layouts: Vec<ViewLayout>,
    pub yaml: LimaYaml,
    pub overrides_path: PathBuf,
}

/// The SHA-256 of the image, cached in `<home>/_sandbox/digests/<hash of the path>` with the
/// file's size and modification time: a Nix store path never changes, but an image named by
/// `SANDBOX_LIMA_IMAGE` may be rebuilt in place, and Lima refuses a digest that does not match.
fn image_digest(file: &Path, home: &Path) -> Result<String, LimaError> {
    use sha2::Digest;
    use std::os::unix::fs::MetadataExt as _;
    let cache = home
        .join("_sandbox")
        .join("digests")
        .join(mounts::view_id(file));
    let meta = std::fs::metadata(file).map_err(crate::error::io("reading", file))?;
    let stamp = format!("{} {}.{}", meta.size(), meta.mtime(), meta.mtime_nsec());
    if let Ok(text) = std::fs::read_to_string(&cache) {
        if let Some((seen, digest)) = text.trim().rsplit_once(' ') {
            if seen == stamp && yaml::is_digest(digest) {
                return Ok(digest.to_string());
            }
        }
    }
    let mut hasher = sha2::Sha256::new();
    let mut f = std::fs::File::open(file).map_err(crate::error::io("opening", file))?;
    std::io::copy(&mut f, &mut hasher).map_err(crate::error::io("reading", file))?;
    let digest = format!(
        "sha256:{}",
        hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    if let Some(dir) = cache.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = std::fs::write(&cache, format!("{stamp} {digest}"));
    Ok(digest)
}

fn host_err(e: LimaError) -> HostError {
    HostError::Backend {
        backend: BackendKind::Lima,
        source: Box::new(e),
    }
}

/// The Lima backend.
pub struct LimaBackend {
    pub settings: LimaSettings,
}

/// The Lima backend for the binary's registry ([`sandbox_host::Backends`]): its trusted
/// settings are worked out by `settings` when it is opened, so a run on another backend pays
/// nothing for them.
pub struct LimaProvider<F>(pub F);

impl<F> sandbox_host::Provider for LimaProvider<F>
where
    F: Fn() -> LimaSettings + Send + Sync,
{
    fn kind(&self) -> BackendKind {
        BackendKind::Lima
    }

    fn open(&self, _options: &sandbox_host::BackendOptions) -> Result<Box<dyn Backend>, HostError> {
        Ok(Box::new(LimaBackend {
            settings: (self.0)(),
        }))
    }
}

fn enforcement(instance: Option<&str>) -> Enforcement {
    Enforcement {
        mechanism: "lima VM (limactl shell)".into(),
        enforced: vec![
            format!(
                "a separate Linux VM{}: the host's files are not there except the task's sandbox \
                 view (tracked files only, on s/<branch>) and its git data",
                instance.map(|i| format!(" ({i})")).unwrap_or_default()
            ),
            "the repository's common git dir is read-only; commits land in the view's git store \
             layer, which the host reads back (objects by hash, s/<branch> and new refs by \
             compare-and-swap, nothing else)"
                .into(),
            "no home directory, no SSH agent or keys, no host token; the status hook is reached \
             at host.lima.internal with a sandbox-scoped token"
                .into(),
        ],
        notes: vec![
            "one VM per project: its tasks share the VM, each in its own view".into(),
            "--allow-read/--allow-write paths are not mounted into the VM".into(),
        ],
        ..Enforcement::default()
    }
}

impl Backend for LimaBackend {
    fn enforcement(&self, _policy: &Policy) -> Result<Enforcement, HostError> {
        let limactl = self.settings.limactl().map_err(host_err)?;
        limactl.check_version().map_err(host_err)?;
        Ok(enforcement(None))
    }

    fn prepare(
        &self,
        policy: &Policy,
        progress: &dyn Progress,
    ) -> Result<Arc<dyn BackendSession>, HostError> {
        let mut relay = Relay {
            progress,
            started: None,
            current: None,
        };
        let session = prepare(&self.settings, policy, &mut relay).map_err(|e| {
            // The step under way when preparing failed is reported as failed, with why.
            relay.failed(&e);
            host_err(e)
        })?;
        Ok(Arc::new(session))
    }
}

/// Relays the VM's named steps to the seam's [`Progress`], timing each.
struct Relay<'a> {
    progress: &'a dyn Progress,
    started: Option<Instant>,
    /// The step started and not done yet.
    current: Option<&'static str>,
}

impl Relay<'_> {
    fn failed(&mut self, error: &LimaError) {
        if let Some(step) = self.current.take() {
            self.started = None;
            self.progress.step(Step::Failed {
                step,
                error: error.to_string(),
            });
        }
    }

    fn event(&mut self, event: VmEvent) {
        match event {
            VmEvent::Step { step } => {
                self.started = Some(Instant::now());
                self.current = Some(step);
                self.progress.step(Step::Started { step });
            }
            VmEvent::Done { step } => {
                self.current = None;
                let elapsed_ms = self
                    .started
                    .take()
                    .map(|s| u64::try_from(s.elapsed().as_millis()).unwrap_or(u64::MAX))
                    .unwrap_or(0);
                self.progress.step(Step::Done { step, elapsed_ms });
            }
        }
    }
}

fn prepare(
    settings: &LimaSettings,
    policy: &Policy,
    relay: &mut Relay<'_>,
) -> Result<LimaSession, LimaError> {
    if matches!(policy.net, NetPolicy::Block { .. }) {
        return Err(LimaError::Step {
            step: "checking the policy",
            code: 0,
            detail: "the Lima backend cannot block the network yet (--block-net); use the \
                     native or nono backend for that"
                .into(),
            log: settings.home.clone(),
        });
    }
    if policy.workspace.git.is_none() {
        return Err(LimaError::NotGit {
            path: policy.workspace.root.clone(),
        });
    }
    let limactl = settings.limactl()?;
    limactl.check_version()?;
    settings.ensure_home()?;
    let mut sink = |e: VmEvent| relay.event(e);
    sink(VmEvent::Step {
        step: "preparing the sandbox view",
    });
    let views = settings.views();
    let created = views.create_or_reuse(&policy.workspace.root, None)?;
    let view = created.view;
    // The watcher carries commits on s/<branch> to <branch>; one runs per view, so start it
    // here only if none does (`sandbox view watch`, the daemon, another run).
    let watcher = if views.watcher_state(&view).running {
        None
    } else {
        Some(views.watch(vec![view.clone()], |event| {
            tracing::info!("lima: {}", event.describe());
        })?)
    };
    sink(VmEvent::Done {
        step: "preparing the sandbox view",
    });
    let project = settings.project_with(&view, &policy.limits)?;
    // Every mount is virtiofs (the overrides refuse any other mountType); for a QEMU VM, Lima
    // serves it with a virtiofsd of the host's, which must be there before a VM is made.
    if project.yaml.vm_type == "qemu" {
        crate::virtiofs::find(&settings.vhost_user_dirs)?;
    }
    project.vm.ensure_running(&project.yaml, &mut sink)?;
    sink(VmEvent::Step { step: "launching" });
    let layout = project
        .layouts
        .iter()
        .find(|l| l.view_path == view.view_path)
        .cloned()
        .ok_or_else(|| LimaError::BadPath {
            path: view.view_path.clone(),
            why: "the view is not among the mounts of its project's VM",
        })?;
    let git = sandbox_policy::git::discover(&view.view_path)
        .ok()
        .flatten()
        .map(|d| d.layout);
    sink(VmEvent::Done { step: "launching" });
    Ok(LimaSession {
        enforcement: enforcement(Some(&project.vm.instance)),
        vm: project.vm,
        view,
        layout,
        git,
        task_root: policy.workspace.root.clone(),
        private_dir: settings.private_dir.join("lima-quarantine"),
        _watcher: Mutex::new(watcher),
    })
}

/// A prepared Lima session: the running VM and the task's view.
pub struct LimaSession {
    enforcement: Enforcement,
    vm: Vm,
    view: View,
    layout: ViewLayout,
    git: Option<sandbox_policy::GitLayout>,
    task_root: PathBuf,
    private_dir: PathBuf,
    _watcher: Mutex<Option<WatcherHandle>>,
}

/// Variables that describe the host, not the guest: never forwarded into the VM.
const HOST_ONLY: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TMPDIR",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "_",
    "XDG_RUNTIME_DIR",
    "DISPLAY",
    "WAYLAND_DISPLAY",
    "SSH_AUTH_SOCK",
    "DBUS_SESSION_BUS_ADDRESS",
    "SANDBOX_HOST_TOKEN",
];

/// The guest's `env NAME=VALUE…` words for a command's environment: what the policy gave the
/// command minus host-only variables, with the hook URL pointed at the host's address as the
/// guest reaches it.
pub fn guest_env(env: &[(OsString, OsString)]) -> Vec<OsString> {
    let mut out = Vec::new();
    for (name, value) in env {
        let Some(name) = name.to_str() else { continue };
        if HOST_ONLY.contains(&name) || name.is_empty() || name.contains('=') {
            continue;
        }
        let mut value = value.clone();
        if name == "SANDBOX_API_URL" {
            if let Some(v) = value.to_str() {
                value = v
                    .replace("://127.0.0.1", &format!("://{}", crate::HOST_ADDRESS))
                    .replace("://localhost", &format!("://{}", crate::HOST_ADDRESS))
                    .into();
            }
        }
        let mut word = OsString::from(format!("{name}="));
        word.push(value);
        out.push(word);
    }
    out
}

/// The command line a command runs with: `limactl shell --workdir <dir> <instance> --
/// /bin/sh <enter> <view id> <dir> env NAME=VALUE… <argv…>`.
pub fn command_argv(
    limactl: &Limactl,
    instance: &str,
    layout: &ViewLayout,
    dir: &Path,
    env: &[(OsString, OsString)],
    argv: &[OsString],
) -> Vec<OsString> {
    let mut inner: Vec<OsString> = vec![
        crate::provision::ENTER_SHELL.into(),
        crate::provision::ENTER.into(),
        layout.id.clone().into(),
        dir.as_os_str().to_os_string(),
        "env".into(),
    ];
    inner.extend(guest_env(env));
    inner.extend(argv.iter().cloned());
    limactl.shell_argv(instance, dir, &inner)
}

/// Where the command's working directory is in the view (the same place relative to the
/// task worktree; the view root when it lies outside).
pub fn view_dir(task_root: &Path, view_path: &Path, cwd: &Path) -> PathBuf {
    match cwd.strip_prefix(task_root) {
        Ok(rel) if rel.as_os_str().is_empty() => view_path.to_path_buf(),
        Ok(rel) => view_path.join(rel),
        Err(_) => view_path.to_path_buf(),
    }
}

impl BackendSession for LimaSession {
    fn enforcement(&self) -> &Enforcement {
        &self.enforcement
    }

    fn command(&self, spec: CommandSpec) -> Result<PreparedCommand, HostError> {
        let dir = view_dir(&self.task_root, &self.view.view_path, &spec.cwd);
        self.vm.check_workdir(&dir).map_err(host_err)?;
        let mut argv = vec![spec.program.clone()];
        argv.extend(spec.args.iter().cloned());
        let line = command_argv(
            &self.vm.limactl,
            &self.vm.instance,
            &self.layout,
            &dir,
            &spec.env,
            &argv,
        );
        let mut words = line.into_iter();
        let wrapped = CommandSpec {
            // `command_argv` starts with limactl itself.
            program: words
                .next()
                .unwrap_or_else(|| self.vm.limactl.path.clone().into()),
            args: words.collect(),
            cwd: self.vm.limactl.home.clone(),
            env: self.vm.limactl.env(),
            timeout: spec.timeout,
        };
        let store = StoreQuarantine::attach(
            &self.view.common_dir,
            Some(&self.view.child_ref()),
            &self.layout.layer_dir,
            &self.private_dir,
        )
        .map_err(HostError::GitQuarantine)?;
        // Held shared while the command runs: the VM is not restarted under it.
        let lock = self.vm.sessions_lock(false).map_err(host_err)?;
        Ok(
            PreparedCommand::external(BackendKind::Lima, wrapped, self.git.clone())
                .with_store(Some(LiveQuarantine::start(store)))
                .keeping(Arc::new(Mutex::new(lock))),
        )
    }
}
