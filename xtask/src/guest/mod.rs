//! Real Linux guests under QEMU's software emulation (TCG), for testing the product on the
//! kernels users run (no KVM guest runs on this machine; a TCG guest does, and KVM
//! works inside one with `-cpu max`).
//!
//! The pieces, each usable on its own (`guest_test` uses them all; the BoxLite-in-a-guest test
//! reuses them with [`BootOptions::qemu_args`] `-cpu max` and a `modprobe kvm_amd`):
//!
//! - [`Image::ensure`]: builds once, and caches under `target/guest/<key>/` (the key is a hash
//!   of every input: suites, packages, mirror, the scripts in this directory), a Debian
//!   bookworm root file system on an ext4 disk image (`mmdebstrap`, then `mke2fs -d`), each
//!   suite's kernel from Debian's packages, and a tiny initramfs of busybox and the boot
//!   modules (`build-hook.sh`, `init.sh`).
//! - [`Guest::boot`]: starts `qemu-system-x86_64 -accel tcg` on one kernel with the disk as a
//!   throw-away snapshot and host directories shared in over 9p ([`Share`]), and waits for the
//!   agent's `ready` line on the virtio-serial port (an event, bounded by a timeout that fails
//!   with the console's tail). The guest's PID 1 is `guest-init.sh`, its agent `agent.py`: both
//!   are shared in at boot, so changing them does not rebuild the image.
//! - [`Guest::run`]: one command (as root or as `user`, uid 1000), its exit status and output.
//! - [`Guest::poweroff`]: powers off and waits for QEMU to exit.

pub mod boxlite;
pub mod lima;
pub mod suite;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest as _, Sha256};

const BUILD_HOOK: &str = include_str!("build-hook.sh");
const INIT: &str = include_str!("init.sh");
const GUEST_INIT: &str = include_str!("guest-init.sh");
const AGENT: &str = include_str!("agent.py");

/// The root file system's suite and packages: what the checks need (git, bash, python3 for the
/// agent, util-linux's `setpriv`/`unshare`), busybox and cpio for the initramfs, kmod and
/// xz/zstd for the modules, iproute2 for the loopback.
const ROOT_SUITE: &str = "bookworm";
const PACKAGES: &[&str] = &[
    "bash",
    "coreutils",
    "git",
    "python3",
    "util-linux",
    "kmod",
    "busybox-static",
    "cpio",
    "xz-utils",
    "zstd",
    "procps",
    "iproute2",
    "ca-certificates",
];
const DPKG_EXCLUDES: &[&str] = &[
    "/usr/share/doc/*",
    "/usr/share/man/*",
    "/usr/share/info/*",
    "/usr/share/locale/*",
];
const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

/// The kernels the image carries: (suite, what it stands for). Each suite's `linux-image-amd64`.
pub const KERNEL_SUITES: &[(&str, &str)] = &[
    ("bullseye", "Debian 11: 5.10, no Landlock"),
    ("bookworm", "Debian 12: 6.1, Landlock ABI 2"),
    (
        "bookworm-backports",
        "Debian 12 backports: 6.12, Landlock ABI 6",
    ),
];

/// A built, cached guest image.
#[derive(Clone, Debug)]
pub struct Image {
    pub dir: PathBuf,
    pub disk: PathBuf,
    pub initrd: PathBuf,
    pub kernels: Vec<Kernel>,
}

/// One kernel of the image.
#[derive(Clone, Debug)]
pub struct Kernel {
    /// The Debian suite it came from.
    pub suite: String,
    /// `uname -r`, e.g. `6.1.0-50-amd64`.
    pub release: String,
    pub vmlinuz: PathBuf,
}

impl Image {
    /// The image for `root`'s `target/guest/`, built unless a complete one with the same inputs
    /// is there. The mirror is `SANDBOX_GUEST_MIRROR` (default deb.debian.org).
    pub fn ensure(root: &Path) -> Result<Image> {
        let mirror =
            std::env::var("SANDBOX_GUEST_MIRROR").unwrap_or_else(|_| DEFAULT_MIRROR.to_owned());
        let key = input_key(&mirror);
        let base = root.join("target/guest");
        let dir = base.join(&key[..16]);
        if let Ok(image) = Image::open(&dir) {
            eprintln!("guest image: up to date ({})", image.dir.display());
            return Ok(image);
        }
        let started = Instant::now();
        let build = base.join(format!("{}.build", &key[..16]));
        if build.exists() {
            std::fs::remove_dir_all(&build)
                .with_context(|| format!("removing {}", build.display()))?;
        }
        std::fs::create_dir_all(&build)?;
        std::fs::write(build.join("build-hook.sh"), BUILD_HOOK)?;
        std::fs::write(build.join("init.sh"), INIT)?;
        let rootfs = build.join("rootfs");
        let suites: Vec<&str> = KERNEL_SUITES.iter().map(|(s, _)| *s).collect();
        eprintln!(
            "guest image: mmdebstrap {ROOT_SUITE} ({}) with the kernels of {} from {mirror}",
            PACKAGES.join(", "),
            suites.join(", ")
        );
        let mut cmd = Command::new("mmdebstrap");
        cmd.args([
            "--mode=root",
            "--quiet",
            "--variant=apt",
            "--format=directory",
        ])
        .arg(format!("--include={}", PACKAGES.join(",")));
        for pattern in DPKG_EXCLUDES {
            cmd.arg(format!("--dpkgopt=path-exclude={pattern}"));
        }
        cmd.arg(format!(
            "--customize-hook=sh {} \"$1\" {} '{}'",
            build.join("build-hook.sh").display(),
            build.display(),
            suites.join(" ")
        ));
        cmd.arg(ROOT_SUITE).arg(&rootfs);
        for suite in std::iter::once(ROOT_SUITE).chain(suites.iter().copied()) {
            let line = format!("deb {mirror} {suite} main");
            if !cmd.get_args().any(|a| a == line.as_str()) {
                cmd.arg(line);
            }
        }
        let status = match cmd.status() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                bail!("mmdebstrap not found (install: apt-get install mmdebstrap)")
            }
            other => other.context("running mmdebstrap")?,
        };
        ensure!(status.success(), "mmdebstrap failed ({status})");

        // The disk: the tree plus room for the checks' repositories and builds.
        let used = du_bytes(&rootfs)?;
        let size_mib = used / (1 << 20) + 1024;
        eprintln!("guest image: ext4 disk of {size_mib} MiB (mke2fs -d)");
        let disk = build.join("rootfs.ext4");
        let status = Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4", "-L", "guestroot", "-d"])
            .arg(&rootfs)
            .arg(&disk)
            .arg(format!("{size_mib}M"))
            .status()
            .context("running mke2fs (apt-get install e2fsprogs)")?;
        ensure!(status.success(), "mke2fs failed ({status})");
        std::fs::remove_dir_all(&rootfs)?;
        std::fs::write(build.join("key"), &key)?;
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::rename(&build, &dir)?;
        let image = Image::open(&dir).context("the image just built is incomplete")?;
        eprintln!(
            "guest image: built in {:.0} s ({})",
            started.elapsed().as_secs_f64(),
            dir.display()
        );
        Ok(image)
    }

    /// A complete image in `dir`.
    pub fn open(dir: &Path) -> Result<Image> {
        let disk = dir.join("rootfs.ext4");
        let initrd = dir.join("initrd.cpio");
        ensure!(disk.is_file() && initrd.is_file() && dir.join("key").is_file());
        let list = std::fs::read_to_string(dir.join("kernels"))?;
        let mut kernels = Vec::new();
        for line in list.lines() {
            let (suite, release) = line
                .split_once(' ')
                .ok_or_else(|| anyhow!("bad line in {}/kernels: {line}", dir.display()))?;
            let vmlinuz = dir.join(format!("vmlinuz-{release}"));
            ensure!(vmlinuz.is_file(), "{} is missing", vmlinuz.display());
            kernels.push(Kernel {
                suite: suite.to_owned(),
                release: release.to_owned(),
                vmlinuz,
            });
        }
        ensure!(kernels.len() == KERNEL_SUITES.len());
        Ok(Image {
            dir: dir.to_owned(),
            disk,
            initrd,
            kernels,
        })
    }

    pub fn kernel(&self, suite: &str) -> Option<&Kernel> {
        self.kernels.iter().find(|k| k.suite == suite)
    }
}

fn input_key(mirror: &str) -> String {
    let mut hash = Sha256::new();
    for part in [BUILD_HOOK, INIT, ROOT_SUITE, mirror] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    for p in PACKAGES.iter().chain(DPKG_EXCLUDES) {
        hash.update(p.as_bytes());
        hash.update([0]);
    }
    for (s, _) in KERNEL_SUITES {
        hash.update(s.as_bytes());
        hash.update([0]);
    }
    format!("{:x}", hash.finalize())
}

fn du_bytes(dir: &Path) -> Result<u64> {
    let out = Command::new("du")
        .args(["-sb"])
        .arg(dir)
        .output()
        .context("running du")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| anyhow!("du gave no size for {}", dir.display()))
}

/// A host directory shared into the guest over 9p, mounted at `guest` (read-only ones with
/// `cache=loose`: fast, and right for files that do not change during the boot).
#[derive(Clone, Debug)]
pub struct Share {
    pub host: PathBuf,
    pub guest: PathBuf,
    pub read_only: bool,
}

/// How to boot.
#[derive(Clone, Debug)]
pub struct BootOptions {
    /// QEMU's `-accel` (`tcg`: multi-threaded TCG, one host thread per vCPU).
    pub accel: String,
    pub memory_mib: u32,
    pub cpus: u32,
    pub shares: Vec<Share>,
    /// Extra QEMU arguments (`-cpu max` for nested KVM).
    pub qemu_args: Vec<String>,
    /// Extra kernel command line.
    pub cmdline: String,
    /// From QEMU's start to the agent's `ready`.
    pub boot_timeout: Duration,
    /// Where the console log, the agent's socket and the harness share go.
    pub run_dir: PathBuf,
}

impl BootOptions {
    pub fn new(run_dir: PathBuf) -> Self {
        BootOptions {
            accel: "tcg".into(),
            memory_mib: 2048,
            cpus: 2,
            shares: Vec::new(),
            qemu_args: Vec::new(),
            cmdline: String::new(),
            boot_timeout: Duration::from_secs(120),
            run_dir,
        }
    }
}

/// Who runs a command in the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum User {
    Root,
    /// `user`, uid and gid 1000, home `/home/user` on the ext4 root, `XDG_RUNTIME_DIR` a tmpfs.
    User,
}

impl User {
    pub fn name(self) -> &'static str {
        match self {
            User::Root => "root",
            User::User => "user",
        }
    }
}

/// A command for [`Guest::run`].
#[derive(Clone, Debug)]
pub struct GuestCommand {
    pub argv: Vec<String>,
    pub user: User,
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
    pub timeout: Duration,
}

impl GuestCommand {
    /// `bash -c SCRIPT` as `user`.
    pub fn shell(user: User, script: &str) -> Self {
        GuestCommand {
            argv: vec!["bash".into(), "-c".into(), script.into()],
            user,
            env: Vec::new(),
            cwd: None,
            timeout: Duration::from_secs(600),
        }
    }
}

/// What a command did.
#[derive(Clone, Debug, Deserialize)]
pub struct Output {
    pub exit: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// Time inside the guest, from the agent's start of the command to its end.
    pub seconds: f64,
    #[serde(deserialize_with = "latin1")]
    pub stdout: Vec<u8>,
    #[serde(deserialize_with = "latin1")]
    pub stderr: Vec<u8>,
}

impl Output {
    pub fn success(&self) -> bool {
        self.exit == Some(0)
    }
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
    pub fn status_text(&self) -> String {
        match (self.exit, self.signal, self.timed_out) {
            (_, _, true) => "timed out".into(),
            (Some(c), _, _) => format!("exit {c}"),
            (None, Some(s), _) => format!("killed by signal {s}"),
            _ => "no status".into(),
        }
    }
}

fn latin1<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let s = String::deserialize(d)?;
    s.chars()
        .map(|c| u8::try_from(u32::from(c)).map_err(serde::de::Error::custom))
        .collect()
}

enum Event {
    Line(String),
    AgentClosed,
    QemuExited(String),
}

/// A booted guest.
pub struct Guest {
    pub kernel: Kernel,
    /// QEMU's start to the agent's `ready`.
    pub boot_time: Duration,
    /// The guest's uptime when the agent started.
    pub guest_uptime: f64,
    pid: u32,
    agent: UnixStream,
    events: mpsc::Receiver<Event>,
    console: PathBuf,
    next_id: u64,
    exited: bool,
    /// How much longer than a command's own timeout (kept by the agent on the guest's clock)
    /// the host waits for its answer before it calls the guest lost: 1 when the guest's clock
    /// follows the host's; more under `-icount`, where the guest's seconds count its own
    /// instructions and a loaded host runs fewer of them per second.
    pub host_wait_factor: u32,
}

impl Guest {
    /// Boots `kernel` of `image` and waits for the agent.
    pub fn boot(image: &Image, kernel: &Kernel, options: &BootOptions) -> Result<Guest> {
        let run = &options.run_dir;
        if run.exists() {
            std::fs::remove_dir_all(run)?;
        }
        let harness = run.join("harness");
        std::fs::create_dir_all(&harness)?;
        std::fs::write(harness.join("guest-init.sh"), GUEST_INIT)?;
        std::fs::write(harness.join("agent.py"), AGENT)?;
        let mut shares = String::new();
        for (i, share) in options.shares.iter().enumerate() {
            let mode = if share.read_only { "ro" } else { "rw" };
            shares.push_str(&format!("share{i} {} {mode}\n", share.guest.display()));
        }
        std::fs::write(harness.join("shares"), shares)?;
        let socket = run.join("agent.sock");
        let console = run.join("console.log");
        let listener = UnixListener::bind(&socket)
            .with_context(|| format!("binding the agent socket {}", socket.display()))?;

        let mut cmd = Command::new("qemu-system-x86_64");
        cmd.args([
            "-accel",
            &options.accel,
            "-nodefaults",
            "-display",
            "none",
            "-no-reboot",
        ])
        .args(["-m", &options.memory_mib.to_string()])
        .args(["-smp", &options.cpus.to_string()])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(&image.initrd)
        .args([
            "-append",
            &format!(
                "console=ttyS0 rdinit=/init panic=-1 loglevel=4 {}",
                options.cmdline
            ),
        ])
        .args([
            "-drive",
            &format!(
                "file={},format=raw,if=virtio,snapshot=on",
                image.disk.display()
            ),
        ])
        .args(["-serial", &format!("file:{}", console.display())])
        .args(["-device", "virtio-serial-pci"])
        .args([
            "-chardev",
            &format!("socket,id=agent,path={}", socket.display()),
        ])
        .args(["-device", "virtserialport,chardev=agent,name=agent"])
        .args(virtfs("harness", &harness, true));
        for (i, share) in options.shares.iter().enumerate() {
            cmd.args(virtfs(&format!("share{i}"), &share.host, share.read_only));
        }
        cmd.args(&options.qemu_args);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let mut child: Child = match cmd.spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                bail!("qemu-system-x86_64 not found (install: apt-get install qemu-system-x86)")
            }
            other => other.context("starting qemu-system-x86_64")?,
        };
        let pid = child.id();
        let (tx, events) = mpsc::channel();

        // QEMU connects to the socket as it starts; its exit is an event too.
        let (conn_tx, conn_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = conn_tx.send(listener.accept().map(|(s, _)| s));
        });
        let qemu_tx = tx.clone();
        let stderr = child.stderr.take();
        std::thread::spawn(move || {
            let mut err = String::new();
            if let Some(mut s) = stderr {
                let _ = std::io::Read::read_to_string(&mut s, &mut err);
            }
            let status = child.wait();
            let _ = qemu_tx.send(Event::QemuExited(format!("{status:?}: {}", err.trim())));
        });
        let deadline = started + options.boot_timeout;
        let agent = loop {
            match conn_rx.recv_timeout(Duration::from_millis(100)) {
                Ok(s) => break s.context("accepting QEMU's agent connection")?,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Ok(Event::QemuExited(why)) = events.try_recv() {
                        bail!("QEMU exited before connecting its agent port: {why}");
                    }
                    if Instant::now() > deadline {
                        kill(pid);
                        bail!("QEMU did not connect its agent port in time");
                    }
                }
                Err(e) => bail!("agent socket: {e}"),
            }
        };
        let reader = agent.try_clone()?;
        std::thread::spawn(move || {
            for line in BufReader::new(reader).lines() {
                match line {
                    Ok(l) => {
                        if tx.send(Event::Line(l)).is_err() {
                            return;
                        }
                    }
                    Err(_) => break,
                }
            }
            let _ = tx.send(Event::AgentClosed);
        });
        let mut guest = Guest {
            kernel: kernel.clone(),
            boot_time: Duration::ZERO,
            guest_uptime: 0.0,
            pid,
            agent,
            events,
            console,
            next_id: 1,
            exited: false,
            host_wait_factor: 1,
        };
        let ready: serde_json::Value = guest
            .next_line(deadline)
            .with_context(|| format!("booting {} (waiting for the agent)", kernel.release))?;
        ensure!(
            ready["ready"] == true,
            "the agent's first line is not ready: {ready}"
        );
        guest.boot_time = started.elapsed();
        guest.guest_uptime = ready["uptime"].as_f64().unwrap_or(0.0);
        let running = ready["kernel"].as_str().unwrap_or("");
        ensure!(
            running == kernel.release,
            "booted {running}, expected {}",
            kernel.release
        );
        Ok(guest)
    }

    fn next_line(&mut self, deadline: Instant) -> Result<serde_json::Value> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.events.recv_timeout(left) {
            Ok(Event::Line(l)) => {
                serde_json::from_str(&l).with_context(|| format!("agent sent {l:?}"))
            }
            Ok(Event::AgentClosed) => Err(anyhow!(
                "the agent's port closed; console:\n{}",
                self.console_tail()
            )),
            Ok(Event::QemuExited(why)) => {
                self.exited = true;
                Err(anyhow!(
                    "QEMU exited ({why}); console:\n{}",
                    self.console_tail()
                ))
            }
            Err(_) => Err(anyhow!("timed out; console:\n{}", self.console_tail())),
        }
    }

    /// The last lines of the serial console.
    pub fn console_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.console).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Runs `command` and returns what it did; an error only when the guest does not answer
    /// (within the command's timeout plus a margin).
    pub fn run(&mut self, command: &GuestCommand) -> Result<Output> {
        let id = self.next_id;
        self.next_id += 1;
        let env: serde_json::Map<String, serde_json::Value> = command
            .env
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        let request = json!({
            "id": id,
            "argv": command.argv,
            "user": command.user.name(),
            "env": env,
            "cwd": command.cwd,
            "timeout": command.timeout.as_secs_f64(),
        });
        writeln!(self.agent, "{request}").context("writing to the guest agent")?;
        let deadline =
            Instant::now() + command.timeout * self.host_wait_factor + Duration::from_secs(30);
        let reply = self
            .next_line(deadline)
            .with_context(|| format!("running {:?} in the guest", command.argv))?;
        ensure!(
            reply["id"] == id,
            "the agent answered {reply} to request {id}"
        );
        serde_json::from_value(reply).context("decoding the agent's answer")
    }

    /// `bash -c SCRIPT` as `user`.
    pub fn sh(&mut self, user: User, script: &str) -> Result<Output> {
        self.run(&GuestCommand::shell(user, script))
    }

    /// Powers the guest off and waits for QEMU to exit.
    pub fn poweroff(mut self) -> Result<()> {
        let id = self.next_id;
        writeln!(self.agent, "{}", json!({"id": id, "op": "poweroff"}))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(Event::QemuExited(_)) => {
                    self.exited = true;
                    return Ok(());
                }
                Ok(_) => continue,
                Err(_) => bail!("the guest did not power off in time"),
            }
        }
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if !self.exited {
            kill(self.pid);
        }
    }
}

fn kill(pid: u32) {
    // The QEMU child this module started (its waiter thread reaps it).
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
}

fn virtfs(tag: &str, host: &Path, read_only: bool) -> [String; 2] {
    let mut spec = format!(
        "local,path={},mount_tag={tag},security_model=none",
        host.display()
    );
    if read_only {
        spec.push_str(",readonly=on");
    }
    ["-virtfs".into(), spec]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_bytes_travel_losslessly_as_latin1() {
        let all: String = (0u8..=255).map(char::from).collect();
        let reply = json!({"exit": 0, "signal": null, "timed_out": false, "seconds": 0.5,
                           "stdout": all, "stderr": "é"});
        let out: Output = serde_json::from_value(reply).unwrap();
        assert_eq!(out.stdout, (0u8..=255).collect::<Vec<_>>());
        assert_eq!(out.stderr, vec![0xe9]);
        // A code point above 255 is not a byte: refused, not mangled.
        let bad = json!({"exit": 0, "signal": null, "timed_out": false, "seconds": 0,
                         "stdout": "\u{100}", "stderr": ""});
        assert!(serde_json::from_value::<Output>(bad).is_err());
    }

    #[test]
    fn the_cache_key_follows_the_inputs() {
        assert_eq!(input_key("http://a"), input_key("http://a"));
        assert_ne!(input_key("http://a"), input_key("http://b"));
    }

    #[test]
    fn an_incomplete_image_directory_is_not_an_image() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Image::open(dir.path()).is_err());
        std::fs::write(dir.path().join("rootfs.ext4"), "").unwrap();
        std::fs::write(dir.path().join("initrd.cpio"), "").unwrap();
        std::fs::write(dir.path().join("key"), "k").unwrap();
        std::fs::write(dir.path().join("kernels"), "bookworm 6.1.0-50-amd64\n").unwrap();
        // The kernel image is missing, and there is one kernel, not three.
        assert!(Image::open(dir.path()).is_err());
    }
}
