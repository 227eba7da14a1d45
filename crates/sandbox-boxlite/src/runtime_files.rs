//! BoxLite's runtime files: what they are, where they come from, and whether a directory
//! holds exactly them.
//!
//! The `boxlite` crate's build script downloads its native runtime (the shim, the guest agent,
//! libkrunfw, e2fsprogs) from GitHub, which fails offline. The same files ship inside the
//! PyPI wheel of the same version: its one native module,
//! `boxlite/boxlite.cpython-311-x86_64-linux-gnu.so`, carries them as `include_bytes!`
//! payloads that the Python SDK writes out to `~/.local/share/boxlite/runtimes/…` on first use.
//! Since the wheel is pinned by its sha256, each file sits at a fixed offset in that module,
//! and `cargo xtask boxlite-runtime` (and the flake) cut them out by offset and length and
//! check each against its own sha256 — no Python is run, nothing is guessed.
//!
//! The offsets were found once by letting the wheel's module extract its runtime
//! (`XDG_DATA_HOME=$tmp python3.11 -c 'import boxlite; boxlite.Boxlite(boxlite.Options(home_dir=…))'`)
//! and locating each extracted file's bytes in the module; see docs/boxlite.md.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

/// The BoxLite version: the crate (`boxlite = "=0.10.8"`) and the wheel must be the same.
pub const VERSION: &str = "0.10.8";

/// The pinned wheel that carries the runtime files.
#[derive(Debug, Clone, Copy)]
pub struct Wheel {
    pub file_name: &'static str,
    pub sha256: &'static str,
    /// The zip member that embeds the runtime files.
    pub member: &'static str,
    /// `pip download` arguments that fetch exactly this wheel whatever the local Python is.
    pub pip_args: &'static [&'static str],
}

/// One runtime file: its name in the runtime directory and where it lies in the wheel's
/// native module.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RuntimeFile {
    pub name: &'static str,
    /// Byte offset in [`Wheel::member`].
    pub offset: u64,
    pub size: u64,
    pub sha256: &'static str,
    /// What BoxLite uses it for.
    pub role: &'static str,
}

/// The wheel for this platform, if one is pinned.
pub fn wheel() -> Option<Wheel> {
    if cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        Some(LINUX_X86_64_WHEEL)
    } else {
        None
    }
}

/// The runtime files for this platform (empty where no wheel is pinned).
pub fn files() -> &'static [RuntimeFile] {
    if cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        LINUX_X86_64_FILES
    } else {
        &[]
    }
}

const LINUX_X86_64_WHEEL: Wheel = Wheel {
    file_name: "boxlite-0.10.8-cp311-cp311-manylinux_2_28_x86_64.whl",
    sha256: "bf8ee64adac854c128c8bc51e673c16748f08400718926b066fc6515b0566c5e",
    member: "boxlite/boxlite.cpython-311-x86_64-linux-gnu.so",
    pip_args: &[
        "download",
        "boxlite==0.10.8",
        "--no-deps",
        "--only-binary=:all:",
        "--platform",
        "manylinux_2_28_x86_64",
        "--python-version",
        "3.11",
        "--implementation",
        "cp",
        "--abi",
        "cp311",
    ],
};

const LINUX_X86_64_FILES: &[RuntimeFile] = &[
    RuntimeFile {
        name: "boxlite-guest",
        offset: 2_762_074,
        size: 21_702_672,
        sha256: "9060428e3ef3d5229b7ec3af9625c2d4aa1096ddfef554ac54d98e82a8f45e72",
        role: "guest agent (PID 1 in the VM, static)",
    },
    RuntimeFile {
        name: "boxlite-shim",
        offset: 24_464_758,
        size: 28_332_008,
        sha256: "c0d63b75913965a4bb7fdb2a2d70f6b7079ddbdaf0e299d11e13769a51618cda",
        role: "per-box VMM process (libkrun + gvproxy, static)",
    },
    RuntimeFile {
        name: "bwrap",
        offset: 52_796_766,
        size: 166_400,
        sha256: "301e5e4e943eafc36d56be9748a0c2511a8b8755ccc8e79340a596df7b7db223",
        role: "jailer around the shim (bubblewrap)",
    },
    RuntimeFile {
        name: "debugfs",
        offset: 52_963_173,
        size: 3_364_296,
        sha256: "3ca30fb0fcb80e41aafbe1afb3a792621d4ad788ee164cb8dea57329c1f8e51b",
        role: "host e2fsprogs: writes files into disk images",
    },
    RuntimeFile {
        name: "guest-mke2fs",
        offset: 56_327_481,
        size: 560_048,
        sha256: "7dc5d7d5b99667659c31e1c2482780f350fe7ca035dd6f68a3f954da296a6f62",
        role: "guest e2fsprogs: formats disks inside the VM (static)",
    },
    RuntimeFile {
        name: "guest-resize2fs",
        offset: 56_887_544,
        size: 399_448,
        sha256: "0a2c15cb20fa3e369a02e9712c611037a89236bc52ad109daf02c3d33a19ee97",
        role: "guest e2fsprogs: grows the root disk inside the VM (static)",
    },
    RuntimeFile {
        name: "libkrunfw.so.5",
        offset: 57_287_006,
        size: 21_431_992,
        sha256: "953201c0c367070946a2f99695cb50dbb8980d97e416964bfa3fb1e9d1f15f69",
        role: "the guest kernel, as a library libkrun loads",
    },
    RuntimeFile {
        name: "mke2fs",
        offset: 78_719_004,
        size: 2_820_704,
        sha256: "33b1aea6163fde9aadede9876586ca8cf689b904b32b4f5e5c6eaa8a4c2c62ac",
        role: "host e2fsprogs: builds ext4 disk images from image layers",
    },
];

/// The variable that names the runtime directory at run time.
pub const RUNTIME_ENV: &str = "SANDBOX_BOXLITE_RUNTIME";

/// Where the runtime directory was found, and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeLocation {
    pub dir: PathBuf,
    /// `SANDBOX_BOXLITE_RUNTIME`, `built in` (baked at build time), or `workspace` (a
    /// development build's `target/boxlite-runtime`).
    pub source: &'static str,
}

/// The runtime directory: `$SANDBOX_BOXLITE_RUNTIME`, else the path baked in at build time
/// (`SANDBOX_BOXLITE_RUNTIME` set while compiling, as the flake does), else — in a build from
/// this workspace — `target/boxlite-runtime`, where `cargo xtask boxlite-runtime` puts it.
pub fn locate() -> Option<RuntimeLocation> {
    if let Some(dir) = std::env::var_os(RUNTIME_ENV).filter(|v| !v.is_empty()) {
        return Some(RuntimeLocation {
            dir: dir.into(),
            source: RUNTIME_ENV,
        });
    }
    if let Some(dir) = option_env!("SANDBOX_BOXLITE_RUNTIME").filter(|v| !v.is_empty()) {
        return Some(RuntimeLocation {
            dir: dir.into(),
            source: "built in",
        });
    }
    let dev = workspace_runtime_dir();
    dev.is_dir().then_some(RuntimeLocation {
        dir: dev,
        source: "workspace",
    })
}

/// `<workspace>/target/boxlite-runtime`: where `cargo xtask boxlite-runtime` writes by default.
pub fn workspace_runtime_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/boxlite-runtime")
}

/// How one runtime file compares with its pin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "status")]
pub enum FileStatus {
    Ok {
        sha256: String,
    },
    /// Differs from its pin, and the packager says it patched this file for the system (the
    /// flake gives `bwrap`, `debugfs` and `mke2fs` Nix's loader): see [`patched_names`].
    Patched {
        sha256: String,
        pinned: String,
    },
    Missing,
    Mismatch {
        sha256: String,
        expected: String,
    },
    NotExecutable,
    Unreadable {
        error: String,
    },
}

/// One line of the runtime check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FileCheck {
    pub name: &'static str,
    pub path: PathBuf,
    pub role: &'static str,
    #[serde(flatten)]
    pub status: FileStatus,
}

impl FileCheck {
    pub fn is_ok(&self) -> bool {
        matches!(
            self.status,
            FileStatus::Ok { .. } | FileStatus::Patched { .. }
        )
    }
}

/// The variable (at run time, or baked in at build time) naming runtime files a packager
/// patched for its system, space-separated: those may differ from their pins. The flake sets
/// `bwrap debugfs mke2fs`, which it gives Nix's loader with patchelf after checking them.
pub const PATCHED_ENV: &str = "SANDBOX_BOXLITE_RUNTIME_PATCHED";

/// The files that may differ from their pins (see [`PATCHED_ENV`]).
pub fn patched_names() -> Vec<String> {
    let value = std::env::var(PATCHED_ENV)
        .ok()
        .or_else(|| option_env!("SANDBOX_BOXLITE_RUNTIME_PATCHED").map(str::to_string))
        .unwrap_or_default();
    value.split_whitespace().map(str::to_string).collect()
}

/// Hashes every pinned file in `dir` and compares it with its pin.
pub fn check_dir(dir: &Path) -> Vec<FileCheck> {
    check_dir_allowing(dir, &patched_names())
}

/// [`check_dir`], with `patched` the names that may differ from their pins.
pub fn check_dir_allowing(dir: &Path, patched: &[String]) -> Vec<FileCheck> {
    files()
        .iter()
        .map(|f| {
            let path = dir.join(f.name);
            let status = match check_file(&path, f) {
                FileStatus::Mismatch { sha256, expected }
                    if patched.iter().any(|p| p == f.name) && is_executable(&path) =>
                {
                    FileStatus::Patched {
                        sha256,
                        pinned: expected,
                    }
                }
                other => other,
            };
            FileCheck {
                name: f.name,
                role: f.role,
                status,
                path,
            }
        })
        .collect()
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o100 != 0)
}

fn check_file(path: &Path, pin: &RuntimeFile) -> FileStatus {
    use std::os::unix::fs::PermissionsExt as _;
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return FileStatus::Missing,
        Err(e) => {
            return FileStatus::Unreadable {
                error: e.to_string(),
            }
        }
    };
    let sha256 = match sha256_file(path) {
        Ok(h) => h,
        Err(e) => {
            return FileStatus::Unreadable {
                error: e.to_string(),
            }
        }
    };
    if sha256 != pin.sha256 {
        return FileStatus::Mismatch {
            sha256,
            expected: pin.sha256.to_string(),
        };
    }
    if meta.permissions().mode() & 0o100 == 0 {
        return FileStatus::NotExecutable;
    }
    FileStatus::Ok { sha256 }
}

/// The hex sha256 of a file, streamed.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

/// The hex sha256 of bytes.
pub fn sha256_bytes(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn the_pins_do_not_overlap_and_name_every_file_boxlite_looks_for() {
        let mut spans: Vec<_> = files().iter().map(|f| (f.offset, f.size)).collect();
        spans.sort();
        for pair in spans.windows(2) {
            assert!(pair[0].0 + pair[0].1 <= pair[1].0, "{pair:?} overlap");
        }
        if wheel().is_some() {
            let names: Vec<_> = files().iter().map(|f| f.name).collect();
            for needed in [
                "boxlite-shim",
                "boxlite-guest",
                "libkrunfw.so.5",
                "mke2fs",
                "debugfs",
            ] {
                assert!(names.contains(&needed), "{needed} is not pinned");
            }
        }
    }

    #[test]
    fn a_directory_is_checked_file_by_file() {
        let Some(first) = files().first() else {
            sandbox_testkit::skip(
                "boxlite-wheel",
                "no BoxLite wheel is pinned for this platform",
            );
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        // A wrong file under the first name, nothing under the others.
        std::fs::write(dir.path().join(first.name), b"not the shim").unwrap();
        let checks = check_dir(dir.path());
        assert_eq!(checks.len(), files().len());
        match &checks[0].status {
            FileStatus::Mismatch { sha256, expected } => {
                assert_eq!(sha256, &sha256_bytes(b"not the shim"));
                assert_eq!(expected, first.sha256);
            }
            other => panic!("{other:?}"),
        }
        assert!(checks[1..].iter().all(|c| c.status == FileStatus::Missing));
        // A file the packager declares patched may differ, if it is executable; only that one.
        std::fs::set_permissions(
            dir.path().join(first.name),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        let allowed = check_dir_allowing(dir.path(), &[first.name.to_string()]);
        assert!(
            matches!(allowed[0].status, FileStatus::Patched { .. }),
            "{allowed:?}"
        );
        assert!(allowed[0].is_ok());
        assert!(!allowed[1].is_ok());
        // An unreadable file says so rather than passing.
        let locked = dir.path().join(files()[1].name);
        std::fs::write(&locked, b"x").unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
        let status = check_file(&locked, &files()[1]);
        if nix::unistd::geteuid().is_root() {
            assert!(matches!(status, FileStatus::Mismatch { .. }), "{status:?}");
        } else {
            assert!(
                matches!(status, FileStatus::Unreadable { .. }),
                "{status:?}"
            );
        }
    }
}
