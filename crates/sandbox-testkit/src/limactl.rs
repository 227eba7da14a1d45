//! The `limactl` stand-in (`crates/sandbox-lima/tests/fixtures/limactl-standin.sh`): a script
//! that records its argv and `LIMA_HOME` in `calls` and plays back Lima's real log lines and
//! exit codes (`fixtures/playback/`). What the product does around it — the lifecycle, the
//! progress parsing, the error mapping — is the real code.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// sandbox-lima's fixtures: the script and its playback.
fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../sandbox-lima/tests/fixtures")
}

/// A stand-in installed in a directory of its own.
pub struct Standin {
    /// Where the script, its playback, its switches (`mode.<step>`, `shell-exit`,
    /// `version`) and its record (`calls`) live.
    pub dir: PathBuf,
}

impl Standin {
    /// Installs the stand-in in `dir` (created if missing).
    pub fn install(dir: &Path) -> Standin {
        std::fs::create_dir_all(dir).expect("the stand-in's directory");
        let script = std::fs::read_to_string(fixtures().join("limactl-standin.sh"))
            .expect("the stand-in script")
            .replace("@DIR@", &format!("'{}'", dir.display()));
        let exe = dir.join("limactl");
        std::fs::write(&exe, script).expect("writing the stand-in");
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755))
            .expect("making the stand-in executable");
        let copied = std::process::Command::new("cp")
            .arg("-r")
            .arg(fixtures().join("playback"))
            .arg(dir.join("playback"))
            .status()
            .expect("cp runs");
        assert!(copied.success(), "copying the playback");
        // The wrapper docs/lima.md has users describe (a virtiofsd run with `--xattr` and
        // `--readonly`, `sandbox_lima::virtiofs::WRAPPER`), its
        // daemon standing in for the Rust virtiofsd's answers to `--version` and `--help`,
        // described the way Lima finds one.
        let virtiofsd = dir.join("virtiofsd");
        std::fs::write(
            &virtiofsd,
            concat!(
                "#!/bin/sh\n",
                "daemon() {\n",
                "  case \"$1\" in\n",
                "  --version) echo 'virtiofsd 1.14.0' ;;\n",
                "  --help) echo 'Usage: virtiofsd --shared-dir <SHARED_DIR> --socket-path <SOCKET_PATH>' ;;\n",
                "  *) exit 1 ;;\n",
                "  esac\n",
                "}\n",
                "case \"$1\" in\n",
                "--version | --help) daemon \"$1\" ;;\n",
                "*) daemon --xattr --readonly \"$@\" ;;\n",
                "esac\n",
            ),
        )
        .expect("writing the virtiofsd stand-in");
        std::fs::set_permissions(&virtiofsd, std::fs::Permissions::from_mode(0o755))
            .expect("making the virtiofsd stand-in executable");
        let vhost = dir.join("vhost-user");
        std::fs::create_dir_all(&vhost).expect("the vhost-user directory");
        std::fs::write(
            vhost.join("50-virtiofsd.json"),
            serde_json::json!({"description": "virtiofsd stand-in", "type": "fs",
                               "binary": virtiofsd})
            .to_string(),
        )
        .expect("writing the vhost-user description");
        Standin {
            dir: dir.to_path_buf(),
        }
    }

    /// A directory holding the vhost-user description of the stand-in's virtiofsd (for
    /// `LimaSettings::vhost_user_dirs`).
    pub fn vhost_user_dir(&self) -> PathBuf {
        self.dir.join("vhost-user")
    }

    /// Describes the stand-in's virtiofsd in `home`'s `~/.local/share/qemu/vhost-user/`,
    /// where Lima (and the product, judging for it) looks first.
    pub fn register_virtiofsd(&self, home: &Path) {
        let to = home.join(".local/share/qemu/vhost-user");
        std::fs::create_dir_all(&to).expect("the vhost-user directory in HOME");
        std::fs::copy(
            self.vhost_user_dir().join("50-virtiofsd.json"),
            to.join("50-virtiofsd.json"),
        )
        .expect("copying the vhost-user description");
    }

    /// The executable to give the product (`SANDBOX_LIMACTL`, `LimaSettings::limactl`).
    pub fn exe(&self) -> PathBuf {
        self.dir.join("limactl")
    }

    /// Sets how `step` behaves (`mode.<step>`: "download-fails" and the like).
    pub fn mode(&self, step: &str, mode: &str) {
        std::fs::write(self.dir.join(format!("mode.{step}")), mode).expect("writing a mode");
    }

    /// The recorded calls, one line each: `LIMA_HOME=<home> <argv…>`.
    pub fn calls(&self) -> String {
        std::fs::read_to_string(self.dir.join("calls")).unwrap_or_default()
    }

    /// Forgets the calls recorded so far.
    pub fn clear_calls(&self) {
        let _ = std::fs::remove_file(self.dir.join("calls"));
    }
}
