//! `cargo xtask lima-image`: the Lima guest this machine can build — the flake's NixOS image
//! needs Nix and its binary cache — a Debian 12 disk made offline from Debian's packages
//! (`image.sh`: mmdebstrap, an ESP with systemd-boot, an ext4 root, a qcow2), cached by its
//! inputs (the script, the package list, the mirror). The CLI boots it when
//! `SANDBOX_LIMA_IMAGE` names it (the Nix packages bake in their NixOS image instead).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use sha2::{Digest as _, Sha256};

const SCRIPT: &str = include_str!("image.sh");
const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
/// The file in the image's directory.
pub const FILE: &str = "lima-debian.qcow2";

/// The guest's packages and why each is there: what Lima's boot needs, what the backend's
/// provisioning and commands need, nothing else (the origin's nodejs, npm, python3 and
/// build-essential are left to the user's own image: the tests need none of them).
pub const PACKAGES: &[(&str, &str)] = &[
    (
        "linux-image-amd64/bookworm-backports",
        "6.12: the git store overlay (userxattr) on virtiofs, as guest-test proved it",
    ),
    (
        "initramfs-tools",
        "the initramfs that finds the root by its label",
    ),
    ("systemd", "init; Lima's guest agent is a systemd unit"),
    ("systemd-sysv", "/sbin/init"),
    (
        "udev",
        "/dev/disk/by-label/cidata, which Lima's boot script mounts",
    ),
    ("dbus", "logind, for the user session Lima waits for"),
    ("libpam-systemd", "the user session Lima waits for"),
    (
        "cloud-init",
        "Lima's cidata: the user, its key, the mounts, the boot scripts",
    ),
    (
        "cloud-guest-utils",
        "growpart: the root grows to Lima's `disk`",
    ),
    ("e2fsprogs", "resize2fs and fsck for the root"),
    ("openssh-server", "`limactl shell`"),
    (
        "sudo",
        "the Lima user's passwordless sudo; the backend's `enter`",
    ),
    ("git", "the commands the backend runs"),
    (
        "util-linux",
        "unshare, nsenter, setpriv, findmnt: the backend's provisioning",
    ),
    ("mount", "mount and umount"),
    ("iproute2", "Lima's boot scripts use `ip`"),
    ("netbase", "/etc/protocols and /etc/services"),
    (
        "libnss-myhostname",
        "the guest's own name resolves (sudo warns on every call otherwise)",
    ),
    (
        "rsync",
        "Lima's boot installs it otherwise (30-install-packages.sh)",
    ),
    (
        "iptables",
        "Lima's boot redirects DNS to its host agent with it, and installs it otherwise",
    ),
    ("tzdata", "cloud-init's timezone module (Lima sets one)"),
    ("ca-certificates", "TLS from the guest"),
    ("curl", "the status hook from the guest"),
    ("procps", "ps, pgrep"),
    ("kmod", "modprobe (virtiofs, overlay)"),
    ("systemd-boot-efi", "the boot loader, copied onto the ESP"),
];

/// A built image.
#[derive(Debug, Clone)]
pub struct GuestImage {
    pub path: PathBuf,
    /// `sha256:<hex>` of the qcow2 file, as Lima's `images[].digest` takes it.
    pub digest: String,
}

fn key(mirror: &str) -> String {
    let mut hash = Sha256::new();
    for part in [SCRIPT, mirror] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    for (p, _) in PACKAGES {
        hash.update(p.as_bytes());
        hash.update([0]);
    }
    format!("{:x}", hash.finalize())
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut hash = Sha256::new();
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    std::io::copy(&mut file, &mut hash)?;
    Ok(format!("sha256:{:x}", hash.finalize()))
}

/// The image under `<cache>/images/<key>/`, built unless it is there.
pub fn ensure() -> Result<GuestImage> {
    let mirror =
        std::env::var("SANDBOX_LIMA_IMAGE_MIRROR").unwrap_or_else(|_| DEFAULT_MIRROR.to_owned());
    let key = key(&mirror);
    let base = super::cache_base().join("images");
    let dir = base.join(&key[..16]);
    let path = dir.join(FILE);
    if let Ok(digest) = std::fs::read_to_string(dir.join("digest")) {
        if path.is_file() {
            eprintln!("lima-image: up to date ({})", path.display());
            return Ok(GuestImage {
                path,
                digest: digest.trim().to_owned(),
            });
        }
    }
    let started = Instant::now();
    let build = base.join(format!("{}.build", &key[..16]));
    if build.exists() {
        std::fs::remove_dir_all(&build)?;
    }
    std::fs::create_dir_all(&build)?;
    let script = build.join("image.sh");
    std::fs::write(&script, SCRIPT)?;
    let names: Vec<&str> = PACKAGES.iter().map(|(p, _)| *p).collect();
    eprintln!(
        "lima-image: mmdebstrap bookworm ({}) from {mirror}",
        names.join(", ")
    );
    let status = match Command::new("bash")
        .arg(&script)
        .arg(&build)
        .arg(&mirror)
        .args(&names)
        .status()
    {
        Err(e) => bail!("running bash {}: {e}", script.display()),
        Ok(s) => s,
    };
    ensure!(
        status.success(),
        "image.sh failed ({status}); it needs mmdebstrap, dosfstools, mtools, fdisk (sfdisk), \
         e2fsprogs and qemu-utils"
    );
    let built = build.join(FILE);
    let digest = sha256_file(&built)?;
    std::fs::create_dir_all(&dir)?;
    std::fs::rename(&built, &path)?;
    std::fs::write(dir.join("digest"), format!("{digest}\n"))?;
    std::fs::remove_dir_all(&build)?;
    // `limactl` runs unprivileged and copies the image: it must be able to read it.
    for d in [super::cache_base(), base, dir.clone()] {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))?;
    }
    eprintln!(
        "lima-image: built in {:.0} s ({})",
        started.elapsed().as_secs_f64(),
        path.display()
    );
    Ok(GuestImage { path, digest })
}

/// `cargo xtask lima-image`: builds (or finds) the image and prints its path and digest.
pub fn run(args: &[String]) -> Result<()> {
    ensure!(args.is_empty(), "usage: cargo xtask lima-image");
    let image = ensure()?;
    println!("{}", image.path.display());
    println!("{}", image.digest);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_follows_every_input() {
        let a = key("http://deb.debian.org/debian");
        assert_eq!(a, key("http://deb.debian.org/debian"));
        assert_ne!(a, key("http://mirror.example/debian"));
    }
}
