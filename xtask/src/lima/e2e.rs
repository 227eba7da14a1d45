//! `cargo xtask lima-test`: the Lima backend against the real `limactl` ([`super::install`]),
//! booting the Debian guest ([`super::image`]) — one VM for the whole suite, made by the first
//! `sandbox run --backend lima` and deleted by the last check.
//!
//! `limactl` refuses to run as root, so as root (CI) everything Lima-side runs as an
//! unprivileged user of its own, `sbxlima` (created once), with a fresh `HOME`, `LIMA_HOME` and
//! repository under `/var/tmp/sbx-lima-<uid>/` on every run. Its `HOME` holds what
//! docs/lima.md has users install: the virtiofsd wrapper (`sandbox_lima::virtiofs::wrapper`,
//! around the Rust virtiofsd) and its vhost-user description.
//!
//! Where `/dev/kvm` is there but runs no guest (this kind of machine: QEMU dies setting an
//! MSR), Lima still picks KVM — `pkg/driver/qemu/qemu.go`'s `Accel` only stats the device, and
//! no setting or variable of Lima's changes that. A `qemu-system-x86_64` first on the user's
//! `PATH` ([`QEMU_TCG`]) then runs Lima's exact QEMU command line under TCG instead. The probe
//! is real: QEMU started with KVM, its CPU run through QMP.

mod checks;
mod user;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

pub use user::TestUser;

/// Lima's QEMU under TCG (see the module's doc): the machine's `accel=kvm` becomes
/// multi-threaded TCG (as Lima itself runs TCG, `-accel tcg,thread=multi,tb-size=512`), and
/// `-cpu host`, which TCG lacks, `max`. Everything else is Lima's.
pub const QEMU_TCG: &str = r#"#!/bin/bash
# Lima's QEMU under TCG: this machine's /dev/kvm cannot run a guest (cargo xtask lima-test).
args=() prev= tcg=
for a in "$@"; do
  if [ "$prev" = -machine ] && [[ $a == *,accel=kvm* ]]; then
    a=${a/,accel=kvm/}
    tcg=1
  elif [ "$prev" = -cpu ] && [[ $a == host* ]]; then
    a=max${a#host}
  fi
  args+=("$a")
  prev=$a
done
[ -n "$tcg" ] && args+=(-accel tcg,thread=multi,tb-size=512)
exec /usr/bin/qemu-system-x86_64 "${args[@]}"
"#;

/// Whether QEMU runs a guest CPU with KVM here: `-S` holds the CPU, QMP's `cont` runs it, and a
/// KVM that cannot (this machine's) aborts QEMU before `query-status` answers "running".
pub fn kvm_runs() -> bool {
    if !Path::new("/dev/kvm").exists() {
        return false;
    }
    let child = Command::new("qemu-system-x86_64")
        .args([
            "-accel",
            "kvm",
            "-machine",
            "q35",
            "-cpu",
            "host",
            "-m",
            "64",
            "-nodefaults",
            "-display",
            "none",
            "-S",
            "-qmp",
            "stdio",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let Ok(mut child) = child else { return false };
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write as _;
        let _ = stdin.write_all(
            br#"{"execute":"qmp_capabilities"}{"execute":"cont"}{"execute":"query-status"}{"execute":"quit"}"#,
        );
    }
    child
        .wait_with_output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(r#""status": "running""#))
}

/// The Rust virtiofsd: `SANDBOX_VIRTIOFSD`, `PATH`, `/usr/libexec`, `~/.cargo/bin`.
fn virtiofsd() -> Result<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os("SANDBOX_VIRTIOFSD").filter(|v| !v.is_empty()) {
        candidates.push(v.into());
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("virtiofsd")));
    }
    candidates.push("/usr/libexec/virtiofsd".into());
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(PathBuf::from(home).join(".cargo/bin/virtiofsd"));
    }
    for exe in candidates.into_iter().filter(|p| p.is_file()) {
        let help = Command::new(&exe).arg("--help").output();
        if help.is_ok_and(|h| String::from_utf8_lossy(&h.stdout).contains("--shared-dir")) {
            return Ok(exe);
        }
    }
    bail!(
        "no Rust virtiofsd (cargo install virtiofsd, apt install virtiofsd, or SANDBOX_VIRTIOFSD)"
    )
}

/// `cargo build` of the CLI; the binary's path.
fn build_sandbox(root: &Path) -> Result<PathBuf> {
    eprintln!("lima-test: building the sandbox CLI");
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root)
        .args(["build", "--locked", "-p", "sandbox-cli", "--bin", "sandbox"])
        .arg("--message-format=json")
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running cargo build")?;
    ensure!(out.status.success(), "cargo build failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["target"]["name"] == "sandbox")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .context("cargo built no sandbox binary")
}

/// What the checks run with.
pub struct Setup {
    pub user: TestUser,
    /// `/var/tmp/sbx-lima-<uid>`: `home/`, `lh/` (LIMA_HOME), `work/` (the repository).
    pub run: PathBuf,
    pub limactl: PathBuf,
    pub image: PathBuf,
    pub path: String,
}

impl Setup {
    pub fn home(&self) -> PathBuf {
        self.run.join("home")
    }

    pub fn lima_home(&self) -> PathBuf {
        self.run.join("lh")
    }

    pub fn work(&self) -> PathBuf {
        self.run.join("work")
    }

    /// The environment every command of the user's gets (and nothing of ours).
    pub fn env(&self) -> Vec<(String, String)> {
        let s = |p: PathBuf| p.display().to_string();
        vec![
            ("HOME".into(), s(self.home())),
            ("USER".into(), self.user.name.clone()),
            ("LOGNAME".into(), self.user.name.clone()),
            ("PATH".into(), self.path.clone()),
            ("LANG".into(), "C.UTF-8".into()),
            ("SANDBOX_LIMACTL".into(), s(self.limactl.clone())),
            ("SANDBOX_LIMA_HOME".into(), s(self.lima_home())),
            ("LIMA_HOME".into(), s(self.lima_home())),
            ("SANDBOX_LIMA_IMAGE".into(), s(self.image.clone())),
            // Under TCG beside other work a boot took over Lima's 10 minutes once (docs/lima.md).
            ("SANDBOX_LIMA_START_TIMEOUT".into(), "25m".into()),
        ]
    }

    /// `bash -c script` as the user in `dir`, with `stdin`.
    pub fn sh(&self, dir: &Path, script: &str, stdin: &[u8]) -> Result<std::process::Output> {
        let mut cmd = self.user.command("bash");
        cmd.args(["-c", script])
            .current_dir(dir)
            .env_clear()
            .envs(self.env());
        user::run_with_stdin(cmd, stdin)
    }
}

fn prepare(root: &Path) -> Result<Setup> {
    let installed = super::install::ensure(&super::install::default_prefix())?;
    let image = super::image::ensure()?;
    let sandbox = build_sandbox(root)?;
    let virtiofsd = virtiofsd()?;
    let user = TestUser::ensure()?;
    let run = PathBuf::from(format!("/var/tmp/sbx-lima-{}", user.uid));
    // A run before this one may have left its VM: Lima ends it (QEMU, virtiofsd, host agent).
    if run.join("lh").is_dir() {
        for name in user::instances(&installed.limactl, &user, &run)? {
            let mut c = user.command(&installed.limactl);
            c.args(["delete", "--force", "--tty=false", &name])
                .env_clear()
                .env("LIMA_HOME", run.join("lh"))
                .env("HOME", run.join("home"))
                .env("PATH", "/usr/bin:/bin");
            let _ = user::run_with_stdin(c, b"");
        }
    }
    if run.exists() {
        std::fs::remove_dir_all(&run).with_context(|| format!("removing {}", run.display()))?;
    }
    let bin = run.join("bin");
    let vhost = run.join("home/.local/share/qemu/vhost-user");
    let libexec = run.join("home/.local/libexec");
    for d in [&bin, &vhost, &libexec, &run.join("lh"), &run.join("work")] {
        std::fs::create_dir_all(d)?;
    }
    std::fs::copy(&sandbox, bin.join("sandbox"))?;
    std::fs::copy(&virtiofsd, bin.join("virtiofsd"))?;
    let wrapper = libexec.join("virtiofsd-xattr");
    std::fs::write(
        &wrapper,
        sandbox_lima::virtiofs::wrapper(&bin.join("virtiofsd")),
    )?;
    user::chmod(&wrapper, 0o755)?;
    std::fs::write(
        vhost.join("40-virtiofsd-xattr.json"),
        format!(
            "{{\"type\": \"fs\", \"binary\": \"{}\"}}\n",
            wrapper.display()
        ),
    )?;
    let mut path = String::new();
    if !kvm_runs() {
        let qemu = run.join("qemu-tcg/bin");
        std::fs::create_dir_all(&qemu)?;
        std::fs::write(qemu.join("qemu-system-x86_64"), QEMU_TCG)?;
        user::chmod(&qemu.join("qemu-system-x86_64"), 0o755)?;
        // Lima looks for firmware and vhost-user descriptions beside QEMU's prefix too.
        std::os::unix::fs::symlink("/usr/share", run.join("qemu-tcg/share"))?;
        eprintln!("lima-test: /dev/kvm runs no guest here: Lima's QEMU runs under TCG");
        path.push_str(&format!("{}:", qemu.display()));
    }
    path.push_str(&format!(
        "{}:{}:/usr/local/bin:/usr/bin:/bin",
        installed.prefix.join("bin").display(),
        bin.display()
    ));
    user.own(&run)?;
    Ok(Setup {
        user,
        run,
        limactl: installed.limactl,
        image: image.path,
        path,
    })
}

/// One check's outcome.
pub struct Outcome {
    pub name: &'static str,
    pub result: Result<String>,
    pub took: Duration,
}

/// `cargo xtask lima-test [--keep]`: the checks, each reported; false if any failed.
pub fn run(args: &[String]) -> Result<bool> {
    let keep = match args {
        [] => false,
        [k] if k == "--keep" => true,
        _ => bail!("usage: cargo xtask lima-test [--keep]"),
    };
    let root = crate::nix_check::workspace_root()?;
    let started = Instant::now();
    let setup = prepare(&root)?;
    eprintln!(
        "lima-test: set up in {:.0} s (user {}, {})",
        started.elapsed().as_secs_f64(),
        setup.user.name,
        setup.run.display()
    );
    let outcomes = checks::all(&setup, keep);
    let failed = outcomes.iter().filter(|o| o.result.is_err()).count();
    for o in &outcomes {
        match &o.result {
            Ok(detail) => println!("ok: {} ({:.1} s) {detail}", o.name, o.took.as_secs_f64()),
            Err(e) => println!("FAILED: {} ({:.1} s): {e:#}", o.name, o.took.as_secs_f64()),
        }
    }
    println!(
        "lima-test: {} passed, {failed} failed ({:.0} s)",
        outcomes.len() - failed,
        started.elapsed().as_secs_f64()
    );
    Ok(failed == 0)
}
