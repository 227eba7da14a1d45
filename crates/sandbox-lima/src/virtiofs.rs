//! Whether Lima can serve the VM's virtiofs mounts on a Linux host, judged the way Lima's QEMU
//! driver finds its daemon (`FindVirtiofsd` in `pkg/driver/qemu/qemu.go` of the pinned Lima):
//! the first vhost-user backend description (`*.json`, by name) of `"type": "fs"` in
//! `~/.local/share/qemu/vhost-user/`, `<QEMU's prefix>/share/qemu/vhost-user/` and
//! `/usr/share/qemu/vhost-user/`, whose `binary` answers `--version`. Lima then starts that
//! binary once per mount, as the user, with `--socket-path` and `--shared-dir`.
//!
//! Only the Rust `virtiofsd` takes those options (and runs unprivileged). QEMU 7.2 and older
//! ship their own C `virtiofsd` with a description of its own (Debian 12:
//! `/usr/share/qemu/vhost-user/50-qemu-virtiofsd.json`): it answers `--version` too, so Lima
//! picks it, and it then fails (it takes `-o source=`, and needs root). Such a host is refused
//! here by name, before a VM is made, instead of leaving the VM on a mount type that cannot
//! carry the git store layer.
//!
//! And Lima passes no `--xattr`, without which a virtiofs share cannot be the guest overlay's
//! upper layer (overlayfs wants xattrs, whiteouts and `d_type` from a remote upper, and
//! refuses the mount: "upper fs missing required features"). So the binary Lima would start
//! must be a wrapper script that adds `--xattr` (docs/lima.md); the daemon itself is refused.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Deserialize;

use crate::error::LimaError;

/// A virtiofsd Lima would start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Virtiofsd {
    pub binary: PathBuf,
    /// The description that named it.
    pub description: PathBuf,
}

#[derive(Deserialize)]
struct Backend {
    #[serde(rename = "type")]
    kind: String,
    binary: PathBuf,
}

/// Where Lima looks, in its order: `home`'s `.local`, the prefix of `qemu` (the
/// `qemu-system-<arch>` Lima runs), `/usr`.
pub fn search_dirs(home: Option<&Path>, qemu: Option<&Path>) -> Vec<PathBuf> {
    const REL: &str = "share/qemu/vhost-user";
    let mut dirs = Vec::new();
    if let Some(home) = home {
        dirs.push(home.join(".local").join(REL));
    }
    let prefix = qemu.and_then(Path::parent).and_then(Path::parent);
    if let Some(prefix) = prefix {
        dirs.push(prefix.join(REL));
    }
    if prefix != Some(Path::new("/usr")) {
        dirs.push(Path::new("/usr").join(REL));
    }
    dirs
}

/// The dirs of [`search_dirs`] for this process: `$HOME`, and `qemu-system-<arch>` as Lima
/// finds it (`QEMU_SYSTEM_<ARCH>`, else `PATH`).
pub fn search_dirs_here() -> Vec<PathBuf> {
    let arch = crate::yaml::host_arch();
    let exe = std::env::var_os(format!("QEMU_SYSTEM_{}", arch.to_uppercase()))
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from(format!("qemu-system-{arch}"))));
    let qemu = exe.and_then(|exe| {
        if exe.is_absolute() {
            return Some(exe);
        }
        std::env::split_paths(&std::env::var_os("PATH")?)
            .map(|d| d.join(&exe))
            .find(|p| p.is_file())
    });
    let home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    search_dirs(home.as_deref(), qemu.as_deref())
}

/// The virtiofsd Lima would use from `dirs`, if it can serve Lima's mounts; otherwise why not,
/// and what to do.
pub fn find(dirs: &[PathBuf]) -> Result<Virtiofsd, LimaError> {
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        // Go's os.ReadDir, which Lima uses, returns the entries sorted by name.
        let mut files: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort();
        for description in files {
            let Some(backend) = std::fs::read(&description)
                .ok()
                .and_then(|b| serde_json::from_slice::<Backend>(&b).ok())
            else {
                continue;
            };
            if backend.kind != "fs" || !answers(&backend.binary, "--version") {
                continue;
            }
            // The one Lima picks: it must take the options Lima gives it.
            if !help_mentions(&backend.binary, "--shared-dir") {
                return Err(LimaError::VirtiofsUnavailable {
                    detail: format!(
                        "Lima would start {} (named by {}), which is not the Rust virtiofsd: it \
                         takes no --shared-dir (QEMU's own C virtiofsd, QEMU 7.2 and older, \
                         needs root)",
                        backend.binary.display(),
                        description.display()
                    ),
                });
            }
            // Lima gives it nothing but the socket and the directory, and overlayfs takes a
            // virtiofs upper layer only if the share carries xattrs (`--xattr`): the binary
            // Lima starts must be a wrapper that adds it.
            if !is_wrapper(&backend.binary) {
                return Err(LimaError::VirtiofsUnavailable {
                    detail: format!(
                        "Lima would start {} (named by {}) with only --socket-path and \
                         --shared-dir, so its shares carry no xattrs, and the guest's overlay \
                         cannot use one as its upper layer (the kernel wants xattrs on a remote \
                         upper), and none is read-only (root in the VM could write the \
                         repository); Lima's virtiofsd must be the wrapper docs/lima.md gives, \
                         which adds --xattr and --readonly",
                        backend.binary.display(),
                        description.display()
                    ),
                });
            }
            return Ok(Virtiofsd {
                binary: backend.binary,
                description,
            });
        }
    }
    Err(LimaError::VirtiofsUnavailable {
        detail: format!(
            "no vhost-user description of a virtiofsd that runs in {}",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

/// The wrapper Lima's virtiofsd must be on a Linux host (docs/lima.md), for the Rust
/// virtiofsd at `@VIRTIOFSD@`. Lima starts it per mount with `--socket-path
/// <LIMA_HOME>/<instance>/virtiofsd-<n>.sock --shared-dir <location>` and nothing else; it
/// adds `--xattr` (the guest's overlay needs xattrs on its upper layer), and in a sandbox's
/// `LIMA_HOME` (it has `_sandbox/`) `--readonly` for every share the backend did not list
/// writable in `_sandbox/<instance>.writable` ([`share_modes_path`]): Lima cannot make a
/// virtiofs share read-only, so without it root in the guest could remount the common dir
/// writable and write the host's repository. Other Lima instances get `--xattr` only.
pub const WRAPPER: &str = r#"#!/bin/sh
# Lima's virtiofsd for sandbox VMs (docs/lima.md): xattrs on; in a sandbox's LIMA_HOME,
# read-only unless the sandbox listed the share writable.
sock= dir= prev=
for a in "$@"; do
  case $prev in --socket-path) sock=$a ;; --shared-dir) dir=$a ;; esac
  prev=$a
done
inst=${sock%/*}
home=${inst%/*}
name=${inst##*/}
if [ -n "$dir" ] && [ -d "$home/_sandbox" ] &&
  ! grep -Fxq -- "$dir" "$home/_sandbox/$name.writable" 2>/dev/null; then
  exec @VIRTIOFSD@ --xattr --readonly "$@"
fi
exec @VIRTIOFSD@ --xattr "$@"
"#;

/// [`WRAPPER`] for the virtiofsd at `virtiofsd`.
pub fn wrapper(virtiofsd: &Path) -> String {
    WRAPPER.replace(
        "@VIRTIOFSD@",
        &crate::provision::sh_quote(&virtiofsd.to_string_lossy()),
    )
}

/// Where the backend lists the writable shares of `instance` for [`WRAPPER`].
pub fn share_modes_path(lima_home: &Path, instance: &str) -> PathBuf {
    lima_home
        .join("_sandbox")
        .join(format!("{instance}.writable"))
}

/// Writes the writable shares of `mounts` for [`WRAPPER`] (one location a line).
pub fn write_share_modes(
    lima_home: &Path,
    instance: &str,
    mounts: &[crate::mounts::LimaMount],
) -> Result<(), LimaError> {
    let path = share_modes_path(lima_home, instance);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(crate::error::io("creating", dir))?;
    }
    let text: String = mounts
        .iter()
        .filter(|m| m.writable)
        .map(|m| format!("{}\n", m.location.display()))
        .collect();
    std::fs::write(&path, text).map_err(crate::error::io("writing", &path))
}

/// Whether `binary` is a script that passes `--xattr` and `--readonly` on (the wrapper
/// [`WRAPPER`]); the daemon itself, an executable, takes only what Lima gives it.
fn is_wrapper(binary: &Path) -> bool {
    use std::io::Read;
    let mut head = Vec::new();
    let read = std::fs::File::open(binary).and_then(|f| f.take(64 << 10).read_to_end(&mut head));
    let text = String::from_utf8_lossy(&head);
    let code = |flag: &str| {
        text.lines()
            .any(|l| !l.trim_start().starts_with('#') && l.contains(flag))
    };
    read.is_ok() && head.starts_with(b"#!") && code("--xattr") && code("--readonly")
}

fn answers(binary: &Path, arg: &str) -> bool {
    Command::new(binary)
        .arg(arg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn help_mentions(binary: &Path, option: &str) -> bool {
    Command::new(binary)
        .arg("--help")
        .stdin(Stdio::null())
        .output()
        .is_ok_and(|out| {
            String::from_utf8_lossy(&out.stdout).contains(option)
                || String::from_utf8_lossy(&out.stderr).contains(option)
        })
}
