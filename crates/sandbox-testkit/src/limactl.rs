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
        Standin {
            dir: dir.to_path_buf(),
        }
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
