//! `cargo xtask lima-install`: `limactl` and Lima's guest agent, built from Lima's own Go module
//! at the pinned release, laid out as Lima's `make install` lays them out, so that `limactl`
//! finds its agent: `<prefix>/bin/limactl` and `<prefix>/share/lima/lima-guestagent.Linux-<arch>`
//! (`pkg/usrlocal/usrlocal.go`: `ShareLima` is `<dir of limactl>/../share/lima`,
//! `GuestAgentBinary` takes the file with or without `.gz`).
//!
//! The module is fetched with the ordinary `go` client (`go mod download`, checked by Go's
//! checksum database) and its hash compared with the pin; the build is Lima's Makefile's:
//! `limactl` with cgo (the host agent's DNS resolver needs it), the agent static, both with the
//! version stamped in. `go install mod@version` is not used: it asks the proxy for the module's
//! version list (for deprecations), which the proxy here refuses.
//!
//! Idempotent: a stamp with the module, its hash and the Go version skips the build.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use serde::Deserialize;

/// Lima's Go module and the release built: the latest release (nixpkgs' `lima` at the flake's
/// lock could not be read here; docs/lima.md says so), the contract files' base.
pub const MODULE: &str = "github.com/lima-vm/lima/v2";
pub const VERSION: &str = "v2.2.0";
/// The module's hash (`go.sum`'s `h1:`), as Go's checksum database has it.
pub const SUM: &str = "h1:rzjspEapDSzEPYA2UnGRX9cOzSyeYji1wqUEmF4PT3g=";

/// An installed Lima.
#[derive(Debug, Clone)]
pub struct Installed {
    pub prefix: PathBuf,
    pub limactl: PathBuf,
    pub guest_agent: PathBuf,
}

/// The default prefix: `<cache>/lima-<version>`.
pub fn default_prefix() -> PathBuf {
    super::cache_base().join(format!("lima-{VERSION}"))
}

fn layout(prefix: &Path) -> Installed {
    let (arch, _) = super::arches();
    Installed {
        prefix: prefix.to_owned(),
        limactl: prefix.join("bin/limactl"),
        guest_agent: prefix.join(format!("share/lima/lima-guestagent.Linux-{arch}")),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Download {
    dir: PathBuf,
    sum: String,
}

fn go() -> Command {
    Command::new(std::env::var_os("GO").unwrap_or_else(|| "go".into()))
}

fn go_version() -> Result<String> {
    let out = go()
        .arg("version")
        .output()
        .context("running `go version` (Go 1.25 or newer is needed: https://go.dev/dl)")?;
    ensure!(out.status.success(), "go version failed");
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Builds Lima into `prefix` unless the same build is there.
pub fn ensure(prefix: &Path) -> Result<Installed> {
    let installed = layout(prefix);
    let stamp_path = prefix.join(".stamp");
    let stamp = format!("{MODULE}@{VERSION} {SUM} {}\n", go_version()?);
    if std::fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp)
        && installed.limactl.is_file()
        && installed.guest_agent.is_file()
    {
        eprintln!(
            "lima-install: {MODULE}@{VERSION} up to date in {}",
            prefix.display()
        );
        return Ok(installed);
    }
    eprintln!("lima-install: {MODULE}@{VERSION} from the Go module proxy");
    let out = go()
        .args(["mod", "download", "-json", &format!("{MODULE}@{VERSION}")])
        .output()
        .context("running go mod download")?;
    let download: Download = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "go mod download gave no module: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    ensure!(
        download.sum == SUM,
        "{MODULE}@{VERSION} hashes to {}, not the pinned {SUM}",
        download.sum
    );
    let ldflags = format!("-s -w -X {MODULE}/pkg/version.Version={VERSION}");
    let (_, goarch) = super::arches();
    std::fs::create_dir_all(prefix.join("bin"))?;
    std::fs::create_dir_all(prefix.join("share/lima"))?;
    // `guest`: the agent, for a Linux guest of this machine's architecture, without cgo.
    let build = |what: &str, out: &Path, guest: bool| -> Result<()> {
        eprintln!("lima-install: go build ./cmd/{what}");
        let partial = out.with_extension("partial");
        let mut cmd = go();
        if guest {
            cmd.env("CGO_ENABLED", "0")
                .env("GOOS", "linux")
                .env("GOARCH", goarch);
        } else {
            cmd.env("CGO_ENABLED", "1");
        }
        let status = cmd
            .current_dir(&download.dir)
            .env("GOFLAGS", "-mod=readonly")
            .args(["build", "-trimpath", "-ldflags", &ldflags, "-o"])
            .arg(&partial)
            .arg(format!("./cmd/{what}"))
            .status()
            .context("running go build")?;
        ensure!(status.success(), "go build ./cmd/{what} failed ({status})");
        std::fs::rename(&partial, out)?;
        Ok(())
    };
    build("limactl", &installed.limactl, false)?;
    build("lima-guestagent", &installed.guest_agent, true)?;
    // Lima's Makefile installs the agent 0644: limactl copies it onto the cidata disk.
    set_mode(&installed.guest_agent, 0o644)?;
    set_mode(&installed.limactl, 0o755)?;
    for dir in [
        prefix,
        &prefix.join("bin"),
        &prefix.join("share"),
        &prefix.join("share/lima"),
    ] {
        set_mode(dir, 0o755)?;
    }
    std::fs::write(&stamp_path, stamp)?;
    Ok(installed)
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", path.display()))
}

/// `limactl --version`, run as an unprivileged user when this is root (Lima refuses root).
pub fn limactl_version(limactl: &Path) -> Result<String> {
    let mut cmd = if super::is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(limactl);
        c
    } else {
        Command::new(limactl)
    };
    let out = cmd
        .arg("--version")
        .output()
        .context("running limactl --version")?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || text.is_empty() {
        bail!(
            "limactl --version failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(text)
}

/// The first line of `program args`, or why not.
fn first_line(program: &str, args: &[&str]) -> String {
    match Command::new(program).args(args).output() {
        Ok(out) => String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("(no output)")
            .to_owned(),
        Err(e) => format!("not found ({e})"),
    }
}

/// `cargo xtask lima-install [--prefix DIR]`: builds (or finds) Lima and prints the versions
/// of everything a Lima VM here runs on.
pub fn run(args: &[String]) -> Result<()> {
    let prefix = match args {
        [] => default_prefix(),
        [flag, dir] if flag == "--prefix" => PathBuf::from(dir),
        _ => bail!("usage: cargo xtask lima-install [--prefix DIR]"),
    };
    let installed = ensure(&prefix)?;
    println!("limactl: {}", installed.limactl.display());
    println!("  {}", limactl_version(&installed.limactl)?);
    println!("guest agent: {}", installed.guest_agent.display());
    println!("{}", go_version()?);
    println!("qemu: {}", first_line("qemu-system-x86_64", &["--version"]));
    println!("qemu-img: {}", first_line("qemu-img", &["--version"]));
    println!(
        "virtiofsd: {}",
        first_line(
            &std::env::var("SANDBOX_VIRTIOFSD").unwrap_or_else(|_| "virtiofsd".into()),
            &["--version"]
        )
    );
    let ovmf = Path::new("/usr/share/OVMF/OVMF_CODE.fd");
    println!(
        "firmware: {}",
        if ovmf.is_file() {
            ovmf.display().to_string()
        } else {
            "no /usr/share/OVMF/OVMF_CODE.fd (apt-get install ovmf)".into()
        }
    );
    Ok(())
}
