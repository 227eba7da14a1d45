//! The instance YAML, generated with `serde_yaml` from the policy's view mounts and the
//! configuration (pure). Only keys Lima documents are emitted (tests check them against
//! `lima-default.yaml`); everything the sandbox does not decide is left to Lima's defaults.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::mounts::{LimaMount, ViewLayout};

/// Ubuntu 24.04 cloud images, pinned with their digests (from Lima's own
/// `templates/_images/ubuntu-24.04.yaml`, release 20260705).
pub const UBUNTU_IMAGES: &[(&str, &str, &str)] = &[
    (
        "x86_64",
        "https://cloud-images.ubuntu.com/releases/noble/release-20260705/ubuntu-24.04-server-cloudimg-amd64.img",
        "sha256:ffe6203da54deeb6db5d2a98a83f9ec8e55f149d3f7ba622e1abe5fa966ee3d6",
    ),
    (
        "aarch64",
        "https://cloud-images.ubuntu.com/releases/noble/release-20260705/ubuntu-24.04-server-cloudimg-arm64.img",
        "sha256:7df0201546f75b8bcc1044594c806c35749421ad3c9bc1be2a3ab806cfae39cc",
    ),
];

/// One `images:` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Image {
    pub location: String,
    pub arch: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// `containerd:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Containerd {
    pub system: bool,
    pub user: bool,
}

/// `ssh:`: nothing of the host's SSH reaches the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ssh {
    #[serde(rename = "loadDotSSHPubKeys")]
    pub load_dot_ssh_pub_keys: bool,
    pub forward_agent: bool,
    #[serde(rename = "forwardX11")]
    pub forward_x11: bool,
}

/// One `provision:` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provision {
    pub mode: String,
    pub script: String,
}

/// One `portForwards:` rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PortForward {
    pub guest_port: u16,
    pub proto: String,
    pub ignore: bool,
}

/// The instance YAML (the keys the sandbox sets).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LimaYaml {
    pub minimum_lima_version: String,
    pub vm_type: String,
    pub arch: String,
    pub images: Vec<Image>,
    pub cpus: u32,
    pub memory: String,
    pub disk: String,
    pub mounts: Vec<LimaMount>,
    pub mount_type: String,
    pub containerd: Containerd,
    pub ssh: Ssh,
    pub port_forwards: Vec<PortForward>,
    pub provision: Vec<Provision>,
}

/// The host platform, which picks the VM type and mount type.
///
/// The mount type is virtiofs everywhere: the guest stacks each view's git store overlay with
/// a shared directory for its upper layer, and only virtiofs can be one. QEMU's 9p (Lima's
/// default for QEMU) has no `trusted.*` xattrs and makes no device nodes, so overlayfs cannot
/// use it as an upper at all when QEMU runs as a user, and its `mapped-xattr` model corrupts
/// objects after `git gc` when QEMU runs as root; reverse-sshfs makes no whiteouts either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    /// Virtualization.framework and virtiofs.
    MacOs,
    /// QEMU (KVM) and virtiofs, served by the Rust `virtiofsd` that Lima starts per mount
    /// ([`crate::virtiofs`]).
    Linux,
}

impl Platform {
    pub fn here() -> Self {
        if cfg!(target_os = "macos") {
            Platform::MacOs
        } else {
            Platform::Linux
        }
    }

    fn vm_type(self) -> &'static str {
        match self {
            Platform::MacOs => "vz",
            Platform::Linux => "qemu",
        }
    }

    fn mount_type(self) -> &'static str {
        MOUNT_TYPE
    }
}

/// The only mount type that can carry the git store layer (see [`Platform`]).
pub const MOUNT_TYPE: &str = "virtiofs";

/// Lima's name for this machine's architecture.
pub fn host_arch() -> &'static str {
    if cfg!(target_arch = "aarch64") {
        "aarch64"
    } else {
        "x86_64"
    }
}

/// Which image the VM boots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageChoice {
    /// The flake's prebuilt NixOS image (a qcow2 file), with its digest.
    Nix { path: PathBuf, digest: String },
    /// Ubuntu 24.04, pinned.
    Ubuntu,
}

/// The user's settings for a project's VM (`sandbox lima config --edit`): resources and the
/// image. Mounts are not among them: a sandbox VM mounts its views and nothing else.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Overrides {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Vec<Image>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_type: Option<String>,
}

impl Overrides {
    /// Parses and validates overrides (unknown keys, `mounts` included, are refused).
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Ok(Overrides::default());
        }
        let o: Overrides = serde_yaml::from_str(text).map_err(|e| {
            let hint = if text.contains("mounts") {
                " (a sandbox VM mounts its views and nothing else; mounts cannot be added)"
            } else {
                ""
            };
            format!("{e}{hint}")
        })?;
        o.validate()?;
        Ok(o)
    }

    pub fn validate(&self) -> Result<(), String> {
        if let Some(v) = &self.vm_type {
            one_of("vmType", v, &["qemu", "vz"])?;
        }
        if let Some(v) = &self.arch {
            one_of("arch", v, &["x86_64", "aarch64"])?;
        }
        if let Some(v) = &self.mount_type {
            if v != MOUNT_TYPE {
                return Err(format!(
                    "mountType: {v:?} cannot carry the views' git store layer (overlayfs needs an \
                     upper layer that takes whiteouts and xattrs: QEMU's 9p has neither and its \
                     mapped-xattr model corrupts objects after git gc, reverse-sshfs makes no \
                     whiteouts); only \"{MOUNT_TYPE}\" is accepted — remove the key"
                ));
            }
        }
        if self.cpus == Some(0) {
            return Err("cpus: must be at least 1".into());
        }
        for (key, v) in [("memory", &self.memory), ("disk", &self.disk)] {
            if let Some(v) = v {
                parse_size(v).ok_or_else(|| format!("{key}: {v:?} is not a size like \"4GiB\""))?;
            }
        }
        for image in self.images.iter().flatten() {
            one_of("images[].arch", &image.arch, &["x86_64", "aarch64"])?;
            if let Some(d) = &image.digest {
                if !is_digest(d) {
                    return Err(format!(
                        "images[].digest: {d:?} is not sha256:<64 hex digits>"
                    ));
                }
            }
        }
        Ok(())
    }
}

fn one_of(key: &str, value: &str, allowed: &[&str]) -> Result<(), String> {
    if allowed.contains(&value) {
        Ok(())
    } else {
        Err(format!(
            "{key}: {value:?} is not one of {}",
            allowed.join(", ")
        ))
    }
}

/// `sha256:` and 64 lowercase hex digits.
pub fn is_digest(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Bytes of a Lima size (`"4GiB"`, `"512MiB"`, `"10G"`).
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.')?;
    let (num, unit) = text.split_at(split);
    let num: f64 = num.parse().ok()?;
    let mult: u64 = match unit.trim() {
        "KiB" | "K" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        "TiB" | "T" => 1 << 40,
        _ => return None,
    };
    Some((num * mult as f64) as u64)
}

/// Everything the YAML is generated from.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub platform: Platform,
    pub arch: &'a str,
    pub image: &'a ImageChoice,
    pub mounts: &'a [LimaMount],
    pub views: &'a [ViewLayout],
    pub overrides: &'a Overrides,
}

/// The defaults of the seed: 2 CPUs, 4 GiB memory, 10 GiB disk.
pub const DEFAULT_CPUS: u32 = 2;
pub const DEFAULT_MEMORY: &str = "4GiB";
pub const DEFAULT_DISK: &str = "10GiB";

/// Generates the instance YAML.
pub fn generate(inputs: &Inputs<'_>) -> LimaYaml {
    let o = inputs.overrides;
    let arch = o.arch.clone().unwrap_or_else(|| inputs.arch.to_string());
    let images = match (&o.images, inputs.image) {
        (Some(images), _) => images.clone(),
        (None, ImageChoice::Nix { path, digest }) => vec![Image {
            location: path.to_string_lossy().into_owned(),
            arch: arch.clone(),
            digest: Some(digest.clone()),
        }],
        (None, ImageChoice::Ubuntu) => UBUNTU_IMAGES
            .iter()
            .map(|(a, location, digest)| Image {
                location: location.to_string(),
                arch: a.to_string(),
                digest: Some(digest.to_string()),
            })
            .collect(),
    };
    LimaYaml {
        minimum_lima_version: crate::MIN_LIMA_VERSION.to_string(),
        vm_type: o
            .vm_type
            .clone()
            .unwrap_or_else(|| inputs.platform.vm_type().to_string()),
        arch,
        images,
        cpus: o.cpus.unwrap_or(DEFAULT_CPUS),
        memory: o.memory.clone().unwrap_or_else(|| DEFAULT_MEMORY.into()),
        disk: o.disk.clone().unwrap_or_else(|| DEFAULT_DISK.into()),
        mounts: inputs.mounts.to_vec(),
        mount_type: o
            .mount_type
            .clone()
            .unwrap_or_else(|| inputs.platform.mount_type().to_string()),
        containerd: Containerd {
            system: false,
            user: false,
        },
        ssh: Ssh {
            load_dot_ssh_pub_keys: false,
            forward_agent: false,
            forward_x11: false,
        },
        // The guest's DHCP client (UDP 68) is never forwarded to the host (as nixos-lima does).
        port_forwards: vec![PortForward {
            guest_port: 68,
            proto: "udp".into(),
            ignore: true,
        }],
        provision: vec![Provision {
            mode: "system".into(),
            script: crate::provision::script(inputs.views),
        }],
    }
}

impl LimaYaml {
    /// The instance file. Serialising cannot fail: the types are derived, with string keys,
    /// and writing into a `String` does no I/O; a failure would be a bug in them.
    #[allow(clippy::expect_used)] // see the doc
    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(self).expect("the instance YAML serialises")
    }
}

/// A difference between the VM's YAML and the wanted one, and whether it needs a recreate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    pub key: &'static str,
    pub from: String,
    pub to: String,
    pub needs_recreate: bool,
}

/// What changes from `have` (the instance's YAML) to `want`. vmType, arch, the image and a
/// smaller disk need a recreate; cpus, memory, disk growth and mounts apply on the next start.
pub fn changes(have: &LimaYaml, want: &LimaYaml) -> Vec<Change> {
    let mut out = Vec::new();
    let mut add = |key, from: String, to: String, recreate| {
        if from != to {
            out.push(Change {
                key,
                from,
                to,
                needs_recreate: recreate,
            });
        }
    };
    add("vmType", have.vm_type.clone(), want.vm_type.clone(), true);
    add("arch", have.arch.clone(), want.arch.clone(), true);
    let image = |y: &LimaYaml| {
        y.images
            .iter()
            .find(|i| i.arch == y.arch)
            .map(|i| format!("{} {}", i.location, i.digest.as_deref().unwrap_or("")))
            .unwrap_or_default()
    };
    add("images", image(have), image(want), true);
    let shrink = match (parse_size(&have.disk), parse_size(&want.disk)) {
        (Some(h), Some(w)) => w < h,
        _ => true,
    };
    add("disk", have.disk.clone(), want.disk.clone(), shrink);
    add("cpus", have.cpus.to_string(), want.cpus.to_string(), false);
    add("memory", have.memory.clone(), want.memory.clone(), false);
    add(
        "mountType",
        have.mount_type.clone(),
        want.mount_type.clone(),
        false,
    );
    let mounts = |y: &LimaYaml| {
        y.mounts
            .iter()
            .map(|m| {
                format!(
                    "{}{}",
                    m.location.display(),
                    if m.writable { " (rw)" } else { "" }
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    add("mounts", mounts(have), mounts(want), false);
    out
}
