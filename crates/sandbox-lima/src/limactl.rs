//! `limactl`: where it is, its version, the command line of every lifecycle step (pure), and
//! running a step with its output turned into progress (effects).

use std::ffi::OsString;
use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::LimaError;
use crate::progress::{self, LogLine, Signal, VmStep};

/// A `limactl` binary and the private `LIMA_HOME` it runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limactl {
    pub path: PathBuf,
    pub home: PathBuf,
    /// How long `limactl start` waits for the VM to run (`--timeout`, a duration such as
    /// `30m`); Lima's default (10 minutes) when `None`.
    pub start_timeout: Option<String>,
}

/// Whether `text` is a duration `limactl start --timeout` takes and this backend passes on:
/// a number of seconds, minutes or hours (`90s`, `30m`, `1h`).
pub fn is_start_timeout(text: &str) -> bool {
    let Some(number) = text.strip_suffix(['s', 'm', 'h']) else {
        return false;
    };
    !number.is_empty() && number.len() <= 6 && number.bytes().all(|b| b.is_ascii_digit())
}

/// A version `major.minor.patch`.
pub type Version = (u32, u32, u32);

/// Parses `limactl --version` output (`limactl version 2.0.3`, or a git describe like
/// `2.0.0-12-gabcdef`).
pub fn parse_version(text: &str) -> Option<Version> {
    let word = text.split_whitespace().find(|w| {
        w.trim_start_matches('v')
            .starts_with(|c: char| c.is_ascii_digit())
    })?;
    let core = word.trim_start_matches('v').split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u32>().ok());
    Some((
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
        parts.next().flatten().unwrap_or(0),
    ))
}

/// [`crate::MIN_LIMA_VERSION`] as a [`Version`] (a test keeps the two equal).
pub fn min_version() -> Version {
    (2, 0, 0)
}

impl Limactl {
    /// The argv of one step, after the program (`limactl`).
    fn base(&self) -> Vec<OsString> {
        vec![
            self.path.clone().into(),
            "--log-format".into(),
            "json".into(),
            "--tty=false".into(),
        ]
    }

    pub fn version_argv(&self) -> Vec<OsString> {
        vec![self.path.clone().into(), "--version".into()]
    }

    /// `limactl list --format json <instance>` (one JSON object per instance; none if absent).
    pub fn list_argv(&self, instance: &str) -> Vec<OsString> {
        let mut v = self.base();
        v.extend([
            "list".into(),
            "--format".into(),
            "json".into(),
            instance.into(),
        ]);
        v
    }

    pub fn validate_argv(&self, yaml: &Path) -> Vec<OsString> {
        let mut v = self.base();
        v.extend(["validate".into(), yaml.as_os_str().to_os_string()]);
        v
    }

    pub fn create_argv(&self, instance: &str, yaml: &Path) -> Vec<OsString> {
        let mut v = self.base();
        v.extend([
            "create".into(),
            "--name".into(),
            instance.into(),
            yaml.as_os_str().to_os_string(),
        ]);
        v
    }

    pub fn start_argv(&self, instance: &str) -> Vec<OsString> {
        let mut v = self.base();
        v.push("start".into());
        if let Some(timeout) = &self.start_timeout {
            v.extend(["--timeout".into(), timeout.into()]);
        }
        v.push(instance.into());
        v
    }

    pub fn stop_argv(&self, instance: &str) -> Vec<OsString> {
        let mut v = self.base();
        v.extend(["stop".into(), instance.into()]);
        v
    }

    pub fn delete_argv(&self, instance: &str) -> Vec<OsString> {
        let mut v = self.base();
        v.extend(["delete".into(), "--force".into(), instance.into()]);
        v
    }

    /// `limactl shell --workdir <dir> <instance> -- <argv…>`.
    pub fn shell_argv(&self, instance: &str, workdir: &Path, argv: &[OsString]) -> Vec<OsString> {
        let mut v: Vec<OsString> = vec![
            self.path.clone().into(),
            "shell".into(),
            "--workdir".into(),
            workdir.as_os_str().to_os_string(),
            instance.into(),
        ];
        if !argv.is_empty() {
            v.push("--".into());
            v.extend(argv.iter().cloned());
        }
        v
    }

    /// A console: an interactive login shell in the VM's home directory (no view, no overlay).
    pub fn console_argv(&self, instance: &str) -> Vec<OsString> {
        vec![
            self.path.clone().into(),
            "shell".into(),
            "--workdir".into(),
            "/".into(),
            instance.into(),
        ]
    }

    /// The environment every `limactl` runs with: the private `LIMA_HOME`, and only what
    /// Lima needs from ours.
    pub fn env(&self) -> Vec<(OsString, OsString)> {
        let mut env: Vec<(OsString, OsString)> =
            ["PATH", "HOME", "USER", "LOGNAME", "TERM", "LANG", "TMPDIR"]
                .iter()
                .filter_map(|k| std::env::var_os(k).map(|v| (OsString::from(k), v)))
                .collect();
        env.push(("LIMA_HOME".into(), self.home.clone().into()));
        env
    }

    /// The instance's directory.
    pub fn instance_dir(&self, instance: &str) -> PathBuf {
        self.home.join(instance)
    }

    /// The host agent's log, the one every failure points to.
    pub fn ha_log(&self, instance: &str) -> PathBuf {
        self.instance_dir(instance).join("ha.stderr.log")
    }

    fn command(&self, argv: &[OsString]) -> Command {
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env_clear()
            .envs(self.env())
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `argv` to completion, capturing stdout; stderr is parsed as Lima's log.
    pub fn output(&self, argv: &[OsString]) -> Result<(i32, String, Vec<LogLine>), LimaError> {
        let out = self
            .command(argv)
            .output()
            .map_err(|source| LimaError::Spawn {
                program: self.path.clone(),
                source,
            })?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines = stderr.lines().filter_map(progress::parse_line).collect();
        Ok((
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            lines,
        ))
    }

    /// Runs a long step (`create`, `start`), calling `on_step` as Lima's log names each step.
    /// Returns the exit code and every log line.
    pub fn run_step(
        &self,
        argv: &[OsString],
        on_step: &mut dyn FnMut(Signal),
    ) -> Result<(i32, Vec<LogLine>), LimaError> {
        let mut child = self
            .command(argv)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| LimaError::Spawn {
                program: self.path.clone(),
                source,
            })?;
        let mut lines = Vec::new();
        if let Some(stderr) = child.stderr.take() {
            for raw in std::io::BufReader::new(stderr).lines() {
                let Ok(raw) = raw else { break };
                if let Some(line) = progress::parse_line(&raw) {
                    tracing::debug!(level = %line.level, "limactl: {}", line.msg);
                    on_step(progress::classify(&line));
                    lines.push(line);
                }
            }
        }
        let status = child.wait().map_err(|source| LimaError::Spawn {
            program: self.path.clone(),
            source,
        })?;
        Ok((status.code().unwrap_or(-1), lines))
    }

    /// The version of this `limactl`, refused when older than [`crate::MIN_LIMA_VERSION`].
    pub fn check_version(&self) -> Result<String, LimaError> {
        let out = self
            .command(&self.version_argv())
            .output()
            .map_err(|source| LimaError::Spawn {
                program: self.path.clone(),
                source,
            })?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let stderr = String::from_utf8_lossy(&out.stderr);
        // `cmd/limactl/main.go` exits 1 before anything else, `--version` included, as root.
        if !out.status.success() && stderr.contains("must not run as the root user") {
            return Err(LimaError::Root {
                path: self.path.clone(),
            });
        }
        let version = parse_version(&text).ok_or_else(|| LimaError::UnknownVersion {
            path: self.path.clone(),
            output: if text.is_empty() {
                stderr.trim().to_string()
            } else {
                text.clone()
            },
        })?;
        if version < min_version() {
            return Err(LimaError::TooOld {
                path: self.path.clone(),
                found: format!("{}.{}.{}", version.0, version.1, version.2),
            });
        }
        Ok(text)
    }
}

/// A step's name for an error message.
pub fn step_name(step: VmStep) -> &'static str {
    step.name()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_version_is_the_published_minimum() {
        assert_eq!(parse_version(crate::MIN_LIMA_VERSION), Some(min_version()));
    }
}
