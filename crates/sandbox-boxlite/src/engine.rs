//! The engine: one BoxLite runtime per home directory, and its boxes.
//!
//! [`Engine::open`] checks the runtime files against their pins, points BoxLite at them and
//! opens the runtime, which takes BoxLite's lock on the home directory — a second engine on
//! the same home fails ([`BoxliteError::RuntimeBusy`]). The sandbox daemon holds the one
//! engine of a home; boxes are created, started, used, stopped and removed through it, and
//! every failure is classified into one of [`BoxliteError`]'s kinds with the box's log paths.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use boxlite::{BoxCommand, BoxOptions, BoxliteOptions, BoxliteRuntime, LiteBox};

use crate::error::{BoxliteError, Devices, FileProblems, LogPaths};
use crate::runtime_files::{self, RuntimeLocation};
use crate::spec::{BoxSpec, ImageSource};

/// What BoxLite reads to find its runtime files (shim, guest agent, libkrunfw, e2fsprogs).
const BOXLITE_RUNTIME_DIR: &str = "BOXLITE_RUNTIME_DIR";

/// How an engine is opened.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// BoxLite's home: its lock, image store, disks, boxes and logs.
    pub home: PathBuf,
    /// The runtime files; `None`: [`runtime_files::locate`].
    pub runtime: Option<RuntimeLocation>,
    /// The KVM device checked before a boot (a test points it elsewhere to see the error).
    pub kvm_device: PathBuf,
    /// How long `start` waits for the guest agent to answer.
    pub ready_timeout: Duration,
}

/// Overrides the default ready timeout, in seconds (a slow machine: an emulated guest takes
/// minutes to import an image and boot).
pub const READY_TIMEOUT_VAR: &str = "SANDBOX_BOXLITE_READY_TIMEOUT";

impl EngineOptions {
    /// Waits 60 s for a start, or `SANDBOX_BOXLITE_READY_TIMEOUT` seconds.
    pub fn new(home: PathBuf) -> EngineOptions {
        let ready_timeout = std::env::var(READY_TIMEOUT_VAR)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|&s| s > 0)
            .map_or(Duration::from_secs(60), Duration::from_secs);
        EngineOptions {
            home,
            runtime: None,
            kvm_device: PathBuf::from("/dev/kvm"),
            ready_timeout,
        }
    }
}

/// The one BoxLite runtime of a home directory.
pub struct Engine {
    runtime: BoxliteRuntime,
    options: EngineOptions,
    runtime_dir: PathBuf,
    /// The devices each box created or found here asks for, by name (named in a start that
    /// ran out of interrupts).
    devices: Mutex<std::collections::HashMap<String, Devices>>,
}

/// The value of `BOXLITE_RUNTIME_DIR` this process set, if any (it is process-wide).
static EXPORTED: Mutex<Option<PathBuf>> = Mutex::new(None);

impl Engine {
    /// Checks the runtime files, then opens BoxLite's runtime on `options.home`.
    pub fn open(options: EngineOptions) -> Result<Engine, BoxliteError> {
        let location = options
            .runtime
            .clone()
            .or_else(runtime_files::locate)
            .ok_or(BoxliteError::RuntimeNotFound)?;
        let checks = runtime_files::check_dir(&location.dir);
        let bad: Vec<_> = checks.into_iter().filter(|c| !c.is_ok()).collect();
        if !bad.is_empty() {
            return Err(BoxliteError::RuntimeFiles {
                dir: location.dir,
                version: runtime_files::VERSION,
                problems: FileProblems(bad),
            });
        }
        let runtime_dir =
            std::fs::canonicalize(&location.dir).map_err(|e| BoxliteError::Runtime {
                what: "resolving the runtime directory",
                detail: format!("{}: {e}", location.dir.display()),
            })?;
        export_runtime_dir(&runtime_dir)?;
        std::fs::create_dir_all(&options.home).map_err(|e| BoxliteError::Runtime {
            what: "creating the BoxLite home",
            detail: format!("{}: {e}", options.home.display()),
        })?;
        let runtime = BoxliteRuntime::new(BoxliteOptions {
            home_dir: options.home.clone(),
            ..BoxliteOptions::default()
        })
        .map_err(|e| {
            let detail = e.to_string();
            if detail.contains("already using directory") {
                BoxliteError::RuntimeBusy {
                    home: options.home.clone(),
                    detail,
                }
            } else if detail.contains("/dev/kvm") || detail.to_lowercase().contains("kvm") {
                classify_kvm(&options, "", detail)
            } else {
                BoxliteError::Runtime {
                    what: "opening the BoxLite runtime",
                    detail,
                }
            }
        })?;
        Ok(Engine {
            runtime,
            options,
            runtime_dir,
            devices: Mutex::default(),
        })
    }

    /// How long later starts wait for the guest agent.
    pub fn set_ready_timeout(&mut self, timeout: Duration) {
        self.options.ready_timeout = timeout;
    }

    pub fn home(&self) -> &Path {
        &self.options.home
    }

    pub fn runtime_dir(&self) -> &Path {
        &self.runtime_dir
    }

    /// The runtime's log directory and, for a box BoxLite knows, its shim log and console.
    pub fn log_paths(&self, box_id: Option<&str>) -> LogPaths {
        let runtime = self.options.home.join("logs");
        match box_id {
            Some(id) => {
                let dir = self.options.home.join("boxes").join(id);
                LogPaths {
                    runtime,
                    shim: Some(dir.join("logs")),
                    shim_stderr: Some(dir.join("shim.stderr")),
                    console: Some(dir.join("logs/console.log")),
                }
            }
            None => LogPaths {
                runtime,
                ..LogPaths::default()
            },
        }
    }

    /// The BoxLite options a spec compiles to (pure; `policy show` and the tests read it).
    pub fn options_for(spec: &BoxSpec) -> BoxOptions {
        compile(spec)
    }

    /// Creates the box `spec.name`, or finds the one BoxLite already keeps under that name
    /// (its disk, and whatever was installed on it, survive across daemons). Returns the box
    /// and whether it was created now.
    pub async fn create(&self, spec: &BoxSpec) -> Result<(LiteBox, bool), BoxliteError> {
        if let ImageSource::Layout(dir) = &spec.image {
            crate::spec::check_layout(dir)?;
        }
        self.devices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(spec.name.clone(), devices(spec));
        if let Some(existing) = self
            .runtime
            .get(&spec.name)
            .await
            .map_err(|e| self.engine_error(&spec.name, None, "looking the box up", e))?
        {
            return Ok((existing, false));
        }
        let created = self
            .runtime
            .create(compile(spec), Some(spec.name.clone()))
            .await
            .map_err(|e| self.engine_error(&spec.name, None, "creating the box", e))?;
        Ok((created, true))
    }

    /// Boots a box: the image is imported (a layout) or pulled (a reference), the disks are
    /// prepared, the shim starts the VM, and the guest agent must answer within the ready
    /// timeout.
    pub async fn start(&self, name: &str, b: &LiteBox) -> Result<Duration, BoxliteError> {
        let id = b.id().as_str().to_string();
        self.check_kvm(name, &id)?;
        let started = Instant::now();
        match tokio::time::timeout(self.options.ready_timeout, b.start()).await {
            Err(_) => Err(BoxliteError::GuestNotReady {
                name: name.to_string(),
                after: started.elapsed(),
                logs: Box::new(self.log_paths(Some(&id))),
            }),
            Ok(Err(e)) => Err(self.classify_start(name, &id, e)),
            Ok(Ok(())) => Ok(started.elapsed()),
        }
    }

    /// The host checks BoxLite does not name precisely: the device exists and opens.
    fn check_kvm(&self, name: &str, id: &str) -> Result<(), BoxliteError> {
        let device = &self.options.kvm_device;
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(device)
        {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(BoxliteError::NoKvm {
                name: name.to_string(),
                device: device.clone(),
                logs: Box::new(self.log_paths(Some(id))),
            }),
            Err(e) => Err(BoxliteError::KvmDenied {
                name: name.to_string(),
                device: device.clone(),
                error: e.to_string(),
                logs: Box::new(self.log_paths(Some(id))),
            }),
        }
    }

    fn classify_start(&self, name: &str, id: &str, e: boxlite::BoxliteError) -> BoxliteError {
        let detail = e.to_string();
        let logs = self.log_paths(Some(id));
        let read = |p: &Option<PathBuf>| {
            p.as_deref()
                .and_then(|p| std::fs::read(p).ok())
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
        };
        let console = read(&logs.console);
        let shim = read(&logs.shim_stderr);
        let lower = format!("{detail}\n{console}\n{shim}").to_lowercase();
        if matches!(e, boxlite::BoxliteError::Image(_))
            || lower.contains("failed to pull image")
            || lower.contains("rootfs path does not exist")
            || lower.contains("oci-layout")
            || lower.contains("manifest unknown")
        {
            return BoxliteError::ImageMissing {
                name: name.to_string(),
                detail,
                logs: Box::new(logs),
            };
        }
        // Whether this KVM can boot guests at all, judged from the machine (not guessed from
        // the failure): only then is a failed boot the KVM's fault.
        let shim_error = shim_error_line(&logs, &shim);
        // libkrun's own refusals to build the VM name themselves; they are not KVM's.
        if let Some(line) = shim_error
            .as_deref()
            .filter(|l| l.contains("Building the microVM failed") || l.contains("IrqsExhausted"))
        {
            let detail = format!("{detail} (shim: {line})");
            let logs = Box::new(logs);
            return match self.devices_of(name) {
                Some(devices) if line.contains("IrqsExhausted") => BoxliteError::DevicesExhausted {
                    name: name.to_string(),
                    devices,
                    fit: DEVICES_THAT_FIT,
                    detail,
                    logs,
                },
                _ => BoxliteError::VmBuild {
                    name: name.to_string(),
                    detail,
                    logs,
                },
            };
        }
        let kvm = crate::host::kvm_bootable(&self.options.kvm_device);
        // libkrun's words on its stderr when KVM runs the guest's first instructions but not
        // the kernel (kvm-pvm and other nested or paravirtualised KVMs).
        if !kvm.bootable {
            if let Some(line) = shim
                .lines()
                .find(|l| l.contains("KVM_EXIT_INTERNAL_ERROR") || l.contains("KVM_RUN"))
            {
                return classify_kvm(
                    &self.options,
                    name,
                    format!("{detail} (shim: {}; {})", line.trim(), kvm.detail),
                )
                .with_logs(logs);
            }
            if lower.contains("vm failed to start") || lower.contains("kvm") {
                return classify_kvm(
                    &self.options,
                    name,
                    format!("{}; {}", detail_with_console(detail, &console), kvm.detail),
                )
                .with_logs(logs);
            }
        }
        // A KVM that boots guests: the shim's own error is the reason.
        let detail = match shim_error {
            Some(line) => format!("{detail} (shim: {line})"),
            None => detail_with_console(detail, &console),
        };
        BoxliteError::Engine {
            name: name.to_string(),
            what: "starting the box",
            detail,
            logs: Box::new(logs),
        }
    }

    fn devices_of(&self, name: &str) -> Option<Devices> {
        self.devices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .copied()
    }

    /// Runs a command in a started box.
    pub async fn exec(
        &self,
        name: &str,
        b: &LiteBox,
        command: BoxCommand,
    ) -> Result<boxlite::Execution, BoxliteError> {
        b.exec(command)
            .await
            .map_err(|e| self.engine_error(name, Some(b.id().as_str()), "running a command", e))
    }

    pub async fn stop(&self, name: &str, b: &LiteBox) -> Result<(), BoxliteError> {
        b.stop()
            .await
            .map_err(|e| self.engine_error(name, Some(b.id().as_str()), "stopping the box", e))
    }

    /// Removes a box and its disks.
    pub async fn remove(&self, name: &str) -> Result<(), BoxliteError> {
        self.runtime
            .remove(name, true)
            .await
            .map_err(|e| self.engine_error(name, None, "removing the box", e))
    }

    /// The boxes BoxLite keeps in this home: name, id, status, shim pid.
    pub async fn list(&self) -> Result<Vec<BoxSummary>, BoxliteError> {
        let infos = self
            .runtime
            .list_info()
            .await
            .map_err(|e| BoxliteError::Runtime {
                what: "listing boxes",
                detail: e.to_string(),
            })?;
        Ok(infos
            .into_iter()
            .map(|i| BoxSummary {
                id: i.id.as_str().to_string(),
                name: i.name,
                status: format!("{:?}", i.status).to_lowercase(),
                shim_pid: i.pid,
                image: i.image,
            })
            .collect())
    }

    /// Stops every box of this runtime (the daemon's shutdown).
    pub async fn shutdown(&self, timeout: Duration) -> Result<(), BoxliteError> {
        let secs = i32::try_from(timeout.as_secs()).unwrap_or(i32::MAX);
        self.runtime
            .shutdown(Some(secs))
            .await
            .map_err(|e| BoxliteError::Runtime {
                what: "shutting the runtime down",
                detail: e.to_string(),
            })
    }

    fn engine_error(
        &self,
        name: &str,
        id: Option<&str>,
        what: &'static str,
        e: boxlite::BoxliteError,
    ) -> BoxliteError {
        BoxliteError::Engine {
            name: name.to_string(),
            what,
            detail: e.to_string(),
            logs: Box::new(self.log_paths(id)),
        }
    }
}

/// One box as BoxLite lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BoxSummary {
    pub id: String,
    pub name: Option<String>,
    pub status: String,
    pub shim_pid: Option<u32>,
    pub image: String,
}

/// The shim's last error line: from its stderr, else from its log directory (libkrun's
/// `ERROR` lines, such as `RegisterNetDevice(IrqsExhausted)` when a box has more devices than
/// the VM has interrupts).
fn shim_error_line(logs: &LogPaths, stderr: &str) -> Option<String> {
    let is_error = |l: &&str| l.contains("ERROR") || l.contains("Error(") || l.contains("error:");
    if let Some(line) = stderr.lines().rev().find(is_error) {
        return Some(line.trim().to_string());
    }
    let dir = logs.shim.as_deref()?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| Some(p.as_path()) != logs.console.as_deref())
        .collect();
    files.sort();
    files.iter().rev().find_map(|f| {
        let text = std::fs::read(f).ok()?;
        let text = String::from_utf8_lossy(&text);
        text.lines()
            .rev()
            .find(is_error)
            .map(|l| l.trim().to_string())
    })
}

fn detail_with_console(detail: String, console: &str) -> String {
    let tail: Vec<&str> = console.lines().rev().take(3).collect();
    if tail.is_empty() {
        detail
    } else {
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!("{detail} (guest console: {})", tail.join(" | "))
    }
}

fn classify_kvm(options: &EngineOptions, name: &str, detail: String) -> BoxliteError {
    if !options.kvm_device.exists() {
        return BoxliteError::NoKvm {
            name: name.to_string(),
            device: options.kvm_device.clone(),
            logs: Box::new(LogPaths {
                runtime: options.home.join("logs"),
                ..LogPaths::default()
            }),
        };
    }
    BoxliteError::KvmCannotBoot {
        name: name.to_string(),
        detail,
        logs: Box::new(LogPaths {
            runtime: options.home.join("logs"),
            ..LogPaths::default()
        }),
    }
}

impl BoxliteError {
    fn with_logs(mut self, new: LogPaths) -> BoxliteError {
        match &mut self {
            BoxliteError::NoKvm { logs, .. }
            | BoxliteError::KvmDenied { logs, .. }
            | BoxliteError::KvmCannotBoot { logs, .. }
            | BoxliteError::ImageMissing { logs, .. }
            | BoxliteError::GuestNotReady { logs, .. }
            | BoxliteError::Engine { logs, .. } => **logs = new,
            _ => {}
        }
        self
    }
}

/// Points BoxLite at the runtime files. BoxLite reads `BOXLITE_RUNTIME_DIR` from the process
/// environment (and hands it to each shim), so it is set once per process; a second engine
/// asking for another directory is refused rather than silently switching the first one's.
fn export_runtime_dir(dir: &Path) -> Result<(), BoxliteError> {
    let mut exported = EXPORTED.lock().unwrap_or_else(|e| e.into_inner());
    match exported.as_deref() {
        Some(current) if current == dir => Ok(()),
        Some(current) => Err(BoxliteError::Runtime {
            what: "choosing the runtime files",
            detail: format!(
                "this process already uses {}; one process uses one runtime directory",
                current.display()
            ),
        }),
        None => {
            // Rust's own environment accesses are serialised by std; BoxLite reads the
            // variable through std::env as well. Set before the first runtime is opened.
            std::env::set_var(BOXLITE_RUNTIME_DIR, dir);
            *exported = Some(dir.to_path_buf());
            Ok(())
        }
    }
}

/// How many of a VM's virtio devices libkrun on x86_64 gives an interrupt (measured in the
/// TCG guest with BoxLite 0.10.8: ten fit, the eleventh fails with `IrqsExhausted`).
pub const DEVICES_THAT_FIT: usize = 10;

/// The devices `spec` asks libkrun for.
pub fn devices(spec: &BoxSpec) -> Devices {
    Devices {
        shares: if spec.share.is_some() {
            let layout = crate::share::layout(&spec.mounts, &workdir_of(spec));
            1 + usize::from(!layout.others.is_empty())
        } else {
            spec.mounts.len()
        },
        network: !spec.block_net,
    }
}

/// The box's working directory (its first mount's guest path when it names none).
pub fn workdir_of(spec: &BoxSpec) -> PathBuf {
    spec.workdir
        .clone()
        .or_else(|| spec.mounts.first().map(|m| m.guest.clone()))
        .unwrap_or_default()
}

/// Compiles a checked spec into BoxLite's options.
fn compile(spec: &BoxSpec) -> BoxOptions {
    use boxlite::runtime::options::{NetworkSpec, RootfsSpec, VolumeSpec};
    let rootfs = match &spec.image {
        ImageSource::Registry(r) => RootfsSpec::Image(r.clone()),
        ImageSource::Layout(dir) => RootfsSpec::RootfsPath(dir.display().to_string()),
    };
    let network = if spec.block_net {
        NetworkSpec::Disabled
    } else {
        NetworkSpec::Enabled {
            allow_net: spec.allow_net.iter().map(|t| t.to_rule()).collect(),
        }
    };
    let mut options = BoxOptions {
        cpus: spec.cpus,
        memory_mib: spec.memory_mib,
        disk_size_gb: spec.disk_size_gb,
        working_dir: spec.workdir.as_ref().map(|w| w.display().to_string()),
        env: spec
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        rootfs,
        volumes: match &spec.share {
            // The staging directory's parts ([`crate::share`]): `main` at the working
            // directory's mount, `others` (when there are any) at the share's guest path.
            Some(staging) => {
                let layout = crate::share::layout(&spec.mounts, &workdir_of(spec));
                let (guest, read_only) = layout.main.clone();
                let mut volumes = vec![VolumeSpec {
                    read_only,
                    ..VolumeSpec::bind_mount(
                        staging.join(crate::share::MAIN).display().to_string(),
                        guest.display().to_string(),
                    )
                }];
                if !layout.others.is_empty() {
                    volumes.push(VolumeSpec::bind_mount(
                        staging.join(crate::share::OTHERS).display().to_string(),
                        crate::share::GUEST_SHARE,
                    ));
                }
                volumes
            }
            None => spec
                .mounts
                .iter()
                .map(|m| VolumeSpec {
                    read_only: m.read_only,
                    ..VolumeSpec::bind_mount(
                        m.host.display().to_string(),
                        m.guest.display().to_string(),
                    )
                })
                .collect(),
        },
        network,
        // Kept after it stops, so a named box is reused with what was installed in it; stopped
        // with the daemon that runs it (not detached), so no VM outlives its owner.
        auto_delete: Some(0),
        detach: false,
        ..BoxOptions::default()
    };
    options.auto_stop = None;
    options
}
