//! The unprivileged user `limactl` runs as, and running commands as it.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use anyhow::{ensure, Context, Result};

/// The user the suite creates when it runs as root.
pub const NAME: &str = "sbxlima";

/// Who runs Lima: `sbxlima` under root, else whoever runs the suite.
#[derive(Debug, Clone)]
pub struct TestUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Whether commands switch to it (this process is root).
    switch: bool,
}

fn id(flag: &str, name: Option<&str>) -> Result<String> {
    let out = Command::new("id").arg(flag).args(name).output()?;
    ensure!(out.status.success(), "id {flag} {name:?} failed");
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

impl TestUser {
    pub fn ensure() -> Result<TestUser> {
        if !crate::lima::is_root() {
            return Ok(TestUser {
                name: id("-un", None)?,
                uid: id("-u", None)?.parse()?,
                gid: id("-g", None)?.parse()?,
                switch: false,
            });
        }
        if id("-u", Some(NAME)).is_err() {
            let status = Command::new("useradd")
                .args(["--create-home", "--shell", "/bin/bash", "--comment"])
                .arg("cargo xtask lima-test (limactl refuses root)")
                .arg(NAME)
                .status()
                .context("running useradd")?;
            ensure!(status.success(), "useradd {NAME} failed");
        }
        Ok(TestUser {
            name: NAME.into(),
            uid: id("-u", Some(NAME))?.parse()?,
            gid: id("-g", Some(NAME))?.parse()?,
            switch: true,
        })
    }

    /// `program` run as this user.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        if !self.switch {
            return Command::new(program);
        }
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .args(["--init-groups", "--"])
            .arg(program);
        cmd
    }

    /// Hands `path` (recursively) to this user.
    pub fn own(&self, path: &Path) -> Result<()> {
        if !self.switch {
            return Ok(());
        }
        let status = Command::new("chown")
            .arg("-R")
            .arg(format!("{}:{}", self.uid, self.gid))
            .arg(path)
            .status()?;
        ensure!(status.success(), "chown -R {}", path.display());
        Ok(())
    }
}

pub fn chmod(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", path.display()))
}

/// Runs `cmd` with `stdin` written to it (from a thread: the command may fill its output
/// pipes before it reads everything), collecting its output.
pub fn run_with_stdin(mut cmd: Command, stdin: &[u8]) -> Result<Output> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning {cmd:?}"))?;
    let mut pipe = child.stdin.take().context("no stdin pipe")?;
    let input = stdin.to_vec();
    let writer = std::thread::spawn(move || pipe.write_all(&input));
    let out = child.wait_with_output()?;
    let _ = writer.join();
    Ok(out)
}

/// The instances in `<run>/lh`, by `limactl list -q` as the user.
pub fn instances(limactl: &Path, user: &TestUser, run: &Path) -> Result<Vec<String>> {
    let mut cmd = user.command(limactl);
    cmd.args(["list", "-q"])
        .env_clear()
        .env("LIMA_HOME", run.join("lh"))
        .env("HOME", run.join("home"))
        .env("PATH", "/usr/bin:/bin");
    let out = run_with_stdin(cmd, b"")?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .collect())
}
