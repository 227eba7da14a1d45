//! One project's VM: its name, its private `LIMA_HOME`, and its lifecycle (status, create,
//! start, stop, delete), each step reported by name.

use std::fs::File;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::error::{io, LimaError};
use crate::limactl::Limactl;
use crate::progress::{self, Failure, LogLine, Signal, VmStep};
use crate::provision;
use crate::yaml::{self, LimaYaml};

/// Longest instance name: keeps `<LIMA_HOME>/<name>/ssh.sock.<ssh's 16 random chars>` short.
pub const MAX_INSTANCE: usize = 28;
/// Longest `LIMA_HOME`, so that Lima's sockets stay under macOS's 104-byte `sun_path`.
pub const MAX_HOME: usize = 104 - 1 - MAX_INSTANCE - "/ssh.sock".len() - 17 - 1;

/// The instance name of a project: `sbx-<name>-<hash of the common dir>`, at most
/// [`MAX_INSTANCE`] characters of `[a-z0-9-]`.
pub fn instance_name(project: &str, common_dir: &Path) -> String {
    let hash = crate::mounts::view_id(common_dir);
    let mut slug: String = project
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    slug = slug.trim_matches('-').to_string();
    let room = MAX_INSTANCE - "sbx--".len() - 6;
    slug.truncate(room);
    let slug = slug.trim_end_matches('-');
    if slug.is_empty() {
        format!("sbx-{}", &hash[..6])
    } else {
        format!("sbx-{slug}-{}", &hash[..6])
    }
}

/// Refuses a `LIMA_HOME` that is too long, or that holds a global default or override file
/// (which Lima merges into every instance, mounts included).
pub fn check_home(home: &Path) -> Result<(), LimaError> {
    let len = home.as_os_str().len();
    if len > MAX_HOME {
        return Err(LimaError::HomeTooLong {
            path: home.to_path_buf(),
            len,
            max: MAX_HOME,
        });
    }
    for name in ["default.yaml", "override.yaml", "base.yaml"] {
        let path = home.join("_config").join(name);
        if path.symlink_metadata().is_ok() {
            return Err(LimaError::GlobalOverride { path });
        }
    }
    Ok(())
}

/// What `limactl list --format json` says about an instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceInfo {
    pub name: String,
    pub status: String,
    #[serde(default)]
    pub dir: Option<PathBuf>,
    #[serde(default)]
    pub vm_type: Option<String>,
    #[serde(default)]
    pub arch: Option<String>,
    #[serde(default)]
    pub cpus: Option<u32>,
}

/// The VM's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum VmState {
    Absent,
    Stopped,
    Running,
    /// Lima's `Broken` (or any other status), with its word.
    Other {
        status: String,
    },
}

/// A progress event of the VM's lifecycle: a named step started or ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "event")]
pub enum VmEvent {
    Step { step: &'static str },
    Done { step: &'static str },
}

/// Where lifecycle events go (a terminal's progress lines, `--json`, the backend seam).
pub type Sink<'a> = &'a mut dyn FnMut(VmEvent);

/// One project's VM.
#[derive(Debug, Clone)]
pub struct Vm {
    pub limactl: Limactl,
    pub instance: String,
}

impl Vm {
    pub fn new(limactl: Limactl, instance: String) -> Self {
        Vm { limactl, instance }
    }

    /// The instance's YAML as Lima keeps it (`<LIMA_HOME>/<name>/lima.yaml`).
    pub fn yaml_path(&self) -> PathBuf {
        self.limactl.instance_dir(&self.instance).join("lima.yaml")
    }

    fn log(&self) -> PathBuf {
        self.limactl.ha_log(&self.instance)
    }

    pub fn state(&self) -> Result<(VmState, Option<InstanceInfo>), LimaError> {
        let argv = self.limactl.list_argv(&self.instance);
        let (code, stdout, lines) = self.limactl.output(&argv)?;
        if code != 0 {
            // `limactl list NAME` of an unknown instance: "No instance matching NAME found."
            // (an error in Lima 2, exit 1).
            if lines.iter().any(|l| l.msg.contains("No instance matching")) {
                return Ok((VmState::Absent, None));
            }
            return Err(self.failed(VmStep::Check, code, &lines));
        }
        let info = stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<InstanceInfo>(l).ok())
            .find(|i| i.name == self.instance);
        let state = match info.as_ref().map(|i| i.status.as_str()) {
            None => VmState::Absent,
            Some("Running") => VmState::Running,
            Some("Stopped") => VmState::Stopped,
            Some(other) => VmState::Other {
                status: other.to_string(),
            },
        };
        Ok((state, info))
    }

    /// The YAML the instance was created or last started with, if it parses.
    pub fn current_yaml(&self) -> Option<LimaYaml> {
        let text = std::fs::read_to_string(self.yaml_path()).ok()?;
        serde_yaml::from_str(&text).ok()
    }

    fn failed(&self, step: VmStep, code: i32, lines: &[LogLine]) -> LimaError {
        let log = self.log();
        let instance = self.instance.clone();
        match progress::judge_failure(lines) {
            Failure::NoVirtualization(detail) => LimaError::NoVirtualization {
                step: step.name(),
                detail,
                log,
            },
            Failure::ImageDownload(detail) => LimaError::ImageDownload {
                step: step.name(),
                detail,
                log,
            },
            Failure::Provisioning(detail) => LimaError::Provisioning {
                instance,
                detail,
                log,
            },
            Failure::Degraded(detail) => LimaError::Degraded {
                instance,
                detail,
                log,
            },
            Failure::Other(detail) => LimaError::Step {
                step: step.name(),
                code,
                detail,
                log,
            },
        }
    }

    /// Runs a long step, reporting Lima's own steps as they appear.
    fn long_step(
        &self,
        step: VmStep,
        argv: &[std::ffi::OsString],
        sink: Sink<'_>,
    ) -> Result<(), LimaError> {
        sink(VmEvent::Step { step: step.name() });
        let mut current = step;
        let mut on = |signal: Signal| {
            if let Signal::Step(next) = signal {
                if next > current {
                    sink(VmEvent::Done {
                        step: current.name(),
                    });
                    sink(VmEvent::Step { step: next.name() });
                    current = next;
                }
            }
        };
        let (code, lines) = self.limactl.run_step(argv, &mut on)?;
        if code != 0 {
            return Err(self.failed(current, code, &lines));
        }
        // `limactl start` succeeds on a degraded VM only with a warning; never hand it out.
        if lines.iter().any(|l| l.msg.contains("DEGRADED.")) {
            return Err(self.failed(current, code, &lines));
        }
        sink(VmEvent::Done {
            step: current.name(),
        });
        Ok(())
    }

    /// Writes `yaml` where `limactl create` reads it.
    fn stage(&self, yaml: &LimaYaml) -> Result<PathBuf, LimaError> {
        crate::virtiofs::write_share_modes(&self.limactl.home, &self.instance, &yaml.mounts)?;
        let path = self.limactl.home.join(format!("{}.yaml", self.instance));
        std::fs::write(&path, yaml.to_yaml()).map_err(io("writing", &path))?;
        Ok(path)
    }

    pub fn create(&self, yaml: &LimaYaml, sink: Sink<'_>) -> Result<(), LimaError> {
        let staged = self.stage(yaml)?;
        self.long_step(
            VmStep::Create,
            &self.limactl.create_argv(&self.instance, &staged),
            sink,
        )
    }

    pub fn start(&self, sink: Sink<'_>) -> Result<(), LimaError> {
        // Lima's virtiofsd wrapper reads which shares may be written (docs/lima.md).
        if let Some(yaml) = self.current_yaml() {
            crate::virtiofs::write_share_modes(&self.limactl.home, &self.instance, &yaml.mounts)?;
        }
        self.long_step(
            VmStep::Start,
            &self.limactl.start_argv(&self.instance),
            sink,
        )
    }

    pub fn stop(&self, sink: Sink<'_>) -> Result<(), LimaError> {
        sink(VmEvent::Step {
            step: "stopping the VM",
        });
        let (code, _, lines) = self
            .limactl
            .output(&self.limactl.stop_argv(&self.instance))?;
        if code != 0 {
            return Err(self.failed(VmStep::Check, code, &lines));
        }
        sink(VmEvent::Done {
            step: "stopping the VM",
        });
        Ok(())
    }

    pub fn delete(&self, sink: Sink<'_>) -> Result<(), LimaError> {
        sink(VmEvent::Step {
            step: "deleting the VM",
        });
        let (code, _, lines) = self
            .limactl
            .output(&self.limactl.delete_argv(&self.instance))?;
        if code != 0 {
            return Err(self.failed(VmStep::Check, code, &lines));
        }
        sink(VmEvent::Done {
            step: "deleting the VM",
        });
        Ok(())
    }

    /// Applies `want` to a stopped instance: refuses a change that needs a recreate, writes
    /// the rest into the instance's YAML for the next start.
    pub fn apply_stopped(&self, want: &LimaYaml) -> Result<(), LimaError> {
        if let Some(have) = self.current_yaml() {
            let recreate: Vec<String> = yaml::changes(&have, want)
                .into_iter()
                .filter(|c| c.needs_recreate)
                .map(|c| format!("{} {} → {}", c.key, c.from, c.to))
                .collect();
            if !recreate.is_empty() {
                return Err(LimaError::NeedsRecreate {
                    instance: self.instance.clone(),
                    changes: recreate.join("; "),
                });
            }
        }
        crate::virtiofs::write_share_modes(&self.limactl.home, &self.instance, &want.mounts)?;
        let path = self.yaml_path();
        std::fs::write(&path, want.to_yaml()).map_err(io("writing", &path))
    }

    /// The sessions lock: every command holds it shared; a restart needs it exclusively.
    pub fn sessions_lock(&self, exclusive: bool) -> Result<Option<Flock<File>>, LimaError> {
        let path = self
            .limactl
            .home
            .join(format!("{}.sessions", self.instance));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io("opening", &path))?;
        let arg = if exclusive {
            FlockArg::LockExclusiveNonblock
        } else {
            FlockArg::LockShared
        };
        match Flock::lock(file, arg) {
            Ok(lock) => Ok(Some(lock)),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) if exclusive => Ok(None),
            Err((_, e)) => Err(LimaError::Io {
                what: "locking",
                path,
                source: e.into(),
            }),
        }
    }

    /// Creates or starts the VM as needed so that it runs with `want`, then checks the
    /// provisioning sentinel. The first spawn's named steps go to `sink`.
    pub fn ensure_running(&self, want: &LimaYaml, sink: Sink<'_>) -> Result<(), LimaError> {
        sink(VmEvent::Step {
            step: VmStep::Check.name(),
        });
        let (state, _) = self.state()?;
        sink(VmEvent::Done {
            step: VmStep::Check.name(),
        });
        match state {
            VmState::Absent => {
                self.create(want, sink)?;
                self.start(sink)?;
            }
            VmState::Stopped => {
                self.apply_stopped(want)?;
                self.start(sink)?;
            }
            VmState::Running => {
                let have = self.current_yaml().map(|y| y.mounts).unwrap_or_default();
                let missing = crate::mounts::missing(&want.mounts, &have);
                if !missing.is_empty() {
                    // Mounts are fixed at start: restart, unless other tasks are using it.
                    let Some(_lock) = self.sessions_lock(true)? else {
                        return Err(LimaError::MountsPending {
                            instance: self.instance.clone(),
                            missing: missing
                                .iter()
                                .map(|m| m.location.display().to_string())
                                .collect::<Vec<_>>()
                                .join(", "),
                        });
                    };
                    self.stop(sink)?;
                    self.apply_stopped(want)?;
                    self.start(sink)?;
                }
            }
            VmState::Other { status } => {
                return Err(LimaError::Step {
                    step: VmStep::Check.name(),
                    code: 0,
                    detail: format!("the VM {} is {status}", self.instance),
                    log: self.log(),
                });
            }
        }
        self.check_provisioned(want, sink)
    }

    /// Lima does not fail `start` when a provisioning script fails: the sentinel the script
    /// writes last must hold this script's hash.
    pub fn check_provisioned(&self, want: &LimaYaml, sink: Sink<'_>) -> Result<(), LimaError> {
        let step = "checking provisioning";
        sink(VmEvent::Step { step });
        let expected = want
            .provision
            .iter()
            .find_map(|p| provision::sentinel_of(&p.script))
            .unwrap_or_default();
        let argv = self.limactl.shell_argv(
            &self.instance,
            Path::new("/"),
            &["cat".into(), provision::SENTINEL.into()],
        );
        let (code, stdout, _) = self.limactl.output(&argv)?;
        let found = stdout.trim();
        if code != 0 || found != expected {
            return Err(LimaError::Provisioning {
                instance: self.instance.clone(),
                detail: if code != 0 {
                    format!(
                        "{} is missing: the provisioning script did not finish",
                        provision::SENTINEL
                    )
                } else {
                    format!(
                        "{} holds {found:?}, not this configuration's {expected:?}",
                        provision::SENTINEL
                    )
                },
                log: self.log(),
            });
        }
        sink(VmEvent::Done { step });
        Ok(())
    }

    /// Whether `dir` exists in the guest (`limactl shell` exits 1 both for a missing workdir
    /// and for a command that exits 1, so it is checked first).
    pub fn check_workdir(&self, dir: &Path) -> Result<(), LimaError> {
        let argv = self.limactl.shell_argv(
            &self.instance,
            Path::new("/"),
            &["test".into(), "-d".into(), dir.as_os_str().to_os_string()],
        );
        let (code, _, _) = self.limactl.output(&argv)?;
        if code != 0 {
            return Err(LimaError::Workdir {
                instance: self.instance.clone(),
                path: dir.to_path_buf(),
            });
        }
        Ok(())
    }
}
