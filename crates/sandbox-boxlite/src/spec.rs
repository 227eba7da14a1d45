//! What a box is made of, checked before anything touches the machine: the image (a registry
//! reference or an OCI layout directory), its size, its mounts, its network allow-list and its
//! environment. Pure; the engine compiles a checked [`BoxSpec`] into BoxLite's `BoxOptions`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Where a box's root file system comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ImageSource {
    /// A registry reference (`debian:bookworm-slim`), pulled on first start.
    Registry(String),
    /// An OCI image layout directory (`oci-layout`, `index.json`, `blobs/`): no registry.
    Layout(PathBuf),
}

/// One directory shown in the box.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host: PathBuf,
    pub guest: PathBuf,
    pub read_only: bool,
}

/// One entry of the network allow-list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind", content = "value")]
pub enum NetTarget {
    Host(String),
    Cidr { addr: IpAddr, prefix: u8 },
}

impl NetTarget {
    /// A host name (`registry.npmjs.org`), an address, or a CIDR block (`10.0.0.0/8`).
    pub fn parse(s: &str) -> Result<NetTarget, SpecError> {
        let bad = || SpecError::AllowNet(s.to_string());
        if let Some((addr, prefix)) = s.split_once('/') {
            let addr: IpAddr = addr.parse().map_err(|_| bad())?;
            let prefix: u8 = prefix.parse().map_err(|_| bad())?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            if prefix > max {
                return Err(bad());
            }
            return Ok(NetTarget::Cidr { addr, prefix });
        }
        if let Ok(addr) = s.parse::<IpAddr>() {
            let prefix = if addr.is_ipv4() { 32 } else { 128 };
            return Ok(NetTarget::Cidr { addr, prefix });
        }
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        };
        let host = s.strip_prefix("*.").unwrap_or(s);
        if s.len() > 253 || !host.split('.').all(label_ok) {
            return Err(bad());
        }
        Ok(NetTarget::Host(s.to_ascii_lowercase()))
    }

    /// The form BoxLite's `allow_net` takes.
    pub fn to_rule(&self) -> String {
        match self {
            NetTarget::Host(h) => h.clone(),
            NetTarget::Cidr { addr, prefix } => format!("{addr}/{prefix}"),
        }
    }
}

/// A box, checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BoxSpec {
    pub name: String,
    pub image: ImageSource,
    pub cpus: Option<u8>,
    pub memory_mib: Option<u32>,
    pub disk_size_gb: Option<u64>,
    pub mounts: Vec<Mount>,
    /// The staging directory in which the mounts are composed and shared through one or two
    /// devices ([`crate::share`]); `None`: a share per mount.
    pub share: Option<PathBuf>,
    /// Empty: the network is open (the product's default, as for every backend).
    pub allow_net: Vec<NetTarget>,
    /// No network at all (no interface in the guest).
    pub block_net: bool,
    pub env: BTreeMap<String, String>,
    /// The working directory of commands that name none.
    pub workdir: Option<PathBuf>,
}

/// Why a box's description was refused; nothing was created.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("a box needs an image: give `image` (a registry reference) or `rootfs` (an OCI layout directory)")]
    NoImage,
    #[error("give either `image` or `rootfs`, not both")]
    BothImages,
    #[error(
        "image missing: {path} is not an OCI image layout directory ({missing} not found); \
         build one with `cargo xtask box-image` or pass another `rootfs`"
    )]
    LayoutMissing {
        path: PathBuf,
        missing: &'static str,
    },
    #[error("mount {host}: {why}")]
    Mount { host: PathBuf, why: String },
    #[error(
        "allowNet {0:?}: expected a host name (example.org, *.example.org), an address or a \
         CIDR block (10.0.0.0/8)"
    )]
    AllowNet(String),
    #[error("allowNet and blockNet together: a blocked network has nothing to allow")]
    AllowOnBlocked,
    #[error("{field} {value}: {why}")]
    Size {
        field: &'static str,
        value: u64,
        why: &'static str,
    },
    #[error("env {0:?}: not a variable name")]
    EnvName(String),
    #[error(
        "{count} mounts ({mounts}) and the network: BoxLite 0.10.8 gives each mount a device \
         of its own, and beside the network device a box has room for {max} (the shim fails \
         with RegisterNetDevice(IrqsExhausted)). A linked worktree takes three: the worktree, \
         the repository's git directory and the worktree's .git pointer, both read-only. Block \
         the network (`--block-net`, `blockNet`), or mount fewer directories"
    )]
    TooManyMounts {
        count: usize,
        max: usize,
        mounts: String,
    },
}

/// How many directories (and files) a box with a network interface can be shown. BoxLite
/// 0.10.8 gives each mount its own virtio-fs device, beside its own share, two disks, vsock,
/// console, balloon and entropy devices, and libkrun has a fixed number of interrupts for
/// them: with the network device, a third mount fails the boot
/// (`RegisterNetDevice(IrqsExhausted)` in the shim's log), measured in a guest where boxes
/// boot (`cargo xtask guest-boxlite`). Without a network there is room for more.
pub const MAX_MOUNTS_WITH_NETWORK: usize = 2;

/// Refuses a box that would not start: more mounts than fit beside the network device, each
/// its own share (`one_share`: all of them through one).
pub fn check_device_budget(
    mounts: &[Mount],
    block_net: bool,
    one_share: bool,
) -> Result<(), SpecError> {
    if one_share || block_net || mounts.len() <= MAX_MOUNTS_WITH_NETWORK {
        return Ok(());
    }
    Err(SpecError::TooManyMounts {
        count: mounts.len(),
        max: MAX_MOUNTS_WITH_NETWORK,
        mounts: mounts
            .iter()
            .map(|m| m.guest.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// Checks that `dir` is an OCI image layout: `oci-layout` and `index.json` at its top.
pub fn check_layout(dir: &Path) -> Result<PathBuf, SpecError> {
    let dir = std::fs::canonicalize(dir).map_err(|_| SpecError::LayoutMissing {
        path: dir.to_path_buf(),
        missing: "the directory",
    })?;
    for file in ["oci-layout", "index.json"] {
        if !dir.join(file).is_file() {
            return Err(SpecError::LayoutMissing {
                path: dir,
                missing: file,
            });
        }
    }
    Ok(dir)
}

/// Checks a mount: the host side exists (resolved, so a symlink cannot point the box
/// elsewhere later), the guest side is absolute and not the guest's own root.
pub fn check_mount(host: &Path, guest: &Path, read_only: bool) -> Result<Mount, SpecError> {
    let err = |why: String| SpecError::Mount {
        host: host.to_path_buf(),
        why,
    };
    let real = std::fs::canonicalize(host).map_err(|e| err(format!("cannot resolve: {e}")))?;
    if !guest.is_absolute() || guest == Path::new("/") {
        return Err(err(format!(
            "the guest path {} must be absolute and not /",
            guest.display()
        )));
    }
    if guest
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(err(format!("the guest path {} has ..", guest.display())));
    }
    Ok(Mount {
        host: real,
        guest: guest.to_path_buf(),
        read_only,
    })
}

/// A box's size, checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sizes {
    pub cpus: Option<u8>,
    pub memory_mib: Option<u32>,
    pub disk_size_gb: Option<u64>,
}

/// Sizes BoxLite accepts (it takes `u8` CPUs; the limits keep a typo from asking for a
/// terabyte).
pub fn check_sizes(
    cpus: Option<u64>,
    memory_mib: Option<u64>,
    disk_size_gb: Option<u64>,
) -> Result<Sizes, SpecError> {
    let cpus = match cpus {
        Some(c @ 1..=64) => Some(c as u8),
        Some(c) => {
            return Err(SpecError::Size {
                field: "cpus",
                value: c,
                why: "between 1 and 64",
            })
        }
        None => None,
    };
    let memory_mib = match memory_mib {
        Some(m @ 128..=262_144) => Some(m as u32),
        Some(m) => {
            return Err(SpecError::Size {
                field: "memoryMib",
                value: m,
                why: "between 128 and 262144",
            })
        }
        None => None,
    };
    let disk_size_gb = match disk_size_gb {
        Some(d @ 1..=2048) => Some(d),
        Some(d) => {
            return Err(SpecError::Size {
                field: "diskSizeGb",
                value: d,
                why: "between 1 and 2048",
            })
        }
        None => None,
    };
    Ok(Sizes {
        cpus,
        memory_mib,
        disk_size_gb,
    })
}

/// Environment names a shell could export.
pub fn check_env(env: &BTreeMap<String, String>) -> Result<(), SpecError> {
    for name in env.keys() {
        let ok = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !ok {
            return Err(SpecError::EnvName(name.clone()));
        }
    }
    Ok(())
}

/// Picks the image source from the two optional fields of `box.create` / `sandbox exec`.
pub fn image_source(image: Option<&str>, rootfs: Option<&Path>) -> Result<ImageSource, SpecError> {
    match (image, rootfs) {
        (Some(_), Some(_)) => Err(SpecError::BothImages),
        (None, None) => Err(SpecError::NoImage),
        (Some(r), None) => Ok(ImageSource::Registry(r.to_string())),
        (None, Some(dir)) => Ok(ImageSource::Layout(check_layout(dir)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_net_takes_hosts_addresses_and_cidrs() {
        assert_eq!(
            NetTarget::parse("Registry.NPMjs.org").unwrap(),
            NetTarget::Host("registry.npmjs.org".into())
        );
        assert_eq!(
            NetTarget::parse("*.example.org").unwrap().to_rule(),
            "*.example.org"
        );
        assert_eq!(
            NetTarget::parse("10.0.0.0/8").unwrap().to_rule(),
            "10.0.0.0/8"
        );
        assert_eq!(NetTarget::parse("1.2.3.4").unwrap().to_rule(), "1.2.3.4/32");
        assert_eq!(NetTarget::parse("fd00::/8").unwrap().to_rule(), "fd00::/8");
        for bad in [
            "",
            "10.0.0.0/33",
            "fd00::/129",
            "a b",
            "-x.org",
            "x..org",
            "1.2.3.4/x",
            "http://x",
        ] {
            assert!(NetTarget::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_image_is_a_reference_or_a_layout_directory() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(image_source(None, None), Err(SpecError::NoImage));
        assert_eq!(
            image_source(Some("debian"), Some(dir.path())),
            Err(SpecError::BothImages)
        );
        assert!(matches!(
            image_source(None, Some(dir.path())),
            Err(SpecError::LayoutMissing {
                missing: "oci-layout",
                ..
            })
        ));
        assert!(matches!(
            image_source(None, Some(&dir.path().join("absent"))),
            Err(SpecError::LayoutMissing {
                missing: "the directory",
                ..
            })
        ));
        std::fs::write(dir.path().join("oci-layout"), "{}").unwrap();
        assert!(matches!(
            image_source(None, Some(dir.path())),
            Err(SpecError::LayoutMissing {
                missing: "index.json",
                ..
            })
        ));
        std::fs::write(dir.path().join("index.json"), "{}").unwrap();
        assert_eq!(
            image_source(None, Some(dir.path())).unwrap(),
            ImageSource::Layout(dir.path().canonicalize().unwrap())
        );
    }

    #[test]
    fn mounts_resolve_the_host_side_and_need_an_absolute_guest_side() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
        let m = check_mount(&dir.path().join("link"), Path::new("/work"), false).unwrap();
        assert_eq!(m.host, real.canonicalize().unwrap());
        for guest in ["work", "/", "/a/../etc"] {
            assert!(
                check_mount(&real, Path::new(guest), false).is_err(),
                "{guest}"
            );
        }
        assert!(check_mount(&dir.path().join("absent"), Path::new("/w"), true).is_err());
    }

    #[test]
    fn mounts_beyond_the_device_budget_are_refused_only_with_a_network() {
        let m = |g: &str| Mount {
            host: "/h".into(),
            guest: g.into(),
            read_only: true,
        };
        let two = [m("/a"), m("/b")];
        check_device_budget(&two, false, false).unwrap();
        let three = [m("/a"), m("/b"), m("/c")];
        check_device_budget(&three, true, false).unwrap();
        check_device_budget(&three, false, true).unwrap();
        let err = check_device_budget(&three, false, false).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("3 mounts (/a, /b, /c)"), "{text}");
        assert!(text.contains("--block-net"), "{text}");
    }

    #[test]
    fn sizes_and_env_names_are_bounded() {
        assert_eq!(
            check_sizes(Some(2), Some(1024), Some(8)).unwrap(),
            Sizes {
                cpus: Some(2),
                memory_mib: Some(1024),
                disk_size_gb: Some(8)
            }
        );
        assert!(check_sizes(Some(0), None, None).is_err());
        assert!(check_sizes(Some(300), None, None).is_err());
        assert!(check_sizes(None, Some(64), None).is_err());
        assert!(check_sizes(None, None, Some(0)).is_err());
        let mut env = BTreeMap::new();
        env.insert("GOOD_1".to_string(), "x".to_string());
        check_env(&env).unwrap();
        env.insert("1BAD".to_string(), "x".to_string());
        assert!(check_env(&env).is_err());
    }
}
