//! Running the sandbox as an unprivileged user: as `nobody` (65534) via setpriv when the
//! tests run as root, else as the test user itself.

use std::path::{Path, PathBuf};
use std::process::Command;

/// setpriv, which drops root to `nobody`; a test run as root checks it exists first.
pub const SETPRIV: &str = "/usr/bin/setpriv";

/// `nobody`'s uid and gid.
pub const NOBODY: u32 = 65534;

/// `args` as an unprivileged user: as `nobody` via setpriv when the tests run as root (check
/// [`SETPRIV`] first), else as ourselves; with an empty environment but `PATH`.
pub fn unprivileged(args: &[&str]) -> Command {
    let mut cmd = if nix::unistd::geteuid().is_root() {
        let mut c = Command::new(SETPRIV);
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]);
        c.args(args);
        c
    } else {
        let mut c = Command::new(args[0]);
        c.args(&args[1..]);
        c
    };
    cmd.env_clear().env("PATH", "/usr/local/bin:/usr/bin:/bin");
    cmd
}

/// A user's own places under a test's directory: its work directory, home and runtime
/// directory, and a copy of the sandbox binary anyone may run.
#[derive(Debug)]
pub struct UserDirs {
    pub work: PathBuf,
    pub home: PathBuf,
    pub run: PathBuf,
    /// The copy of the binary.
    pub bin: PathBuf,
    nobody: bool,
}

impl UserDirs {
    /// Makes `dir` world-readable (0755), `<prefix>-work`, `<prefix>-home`, `<prefix>-run`
    /// in it — given to `nobody` when `nobody` is asked for and the tests run as root — and
    /// copies `bin` to `dir/sandbox`, mode 0755.
    pub fn new(dir: &Path, prefix: &str, bin: &str, nobody: bool) -> UserDirs {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, PermissionsExt::from_mode(0o755)).unwrap();
        let [work, home, run] = ["work", "home", "run"].map(|d| dir.join(format!("{prefix}-{d}")));
        for d in [&work, &home, &run] {
            std::fs::create_dir_all(d).unwrap();
        }
        // A home as a real user's: caches with entries, rc files, agent state.
        crate::home::lived_in(&home);
        if nobody && nix::unistd::geteuid().is_root() {
            for d in [&work, &home, &run] {
                give_to_nobody(d);
            }
        }
        let copy = dir.join("sandbox");
        copy_executable(Path::new(bin), &copy);
        UserDirs {
            work,
            home,
            run,
            bin: copy,
            nobody,
        }
    }

    /// The binary's copy as the first argument of [`UserDirs::command`].
    pub fn bin_str(&self) -> &str {
        self.bin.to_str().unwrap()
    }

    /// `args` as this user ([`unprivileged`] for `nobody`, else the test user with an empty
    /// environment but `PATH`), with HOME and the XDG directories its own, in its work
    /// directory.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = if self.nobody {
            unprivileged(args)
        } else {
            let mut c = Command::new(args[0]);
            c.args(&args[1..])
                .env_clear()
                .env("PATH", "/usr/local/bin:/usr/bin:/bin");
            c
        };
        c.env("HOME", &self.home)
            .env("XDG_CONFIG_HOME", self.home.join(".config"))
            .env("XDG_STATE_HOME", self.home.join(".state"))
            .env("XDG_RUNTIME_DIR", &self.run)
            .current_dir(&self.work);
        c
    }
}

/// Gives `path` and everything below it to `nobody` (links themselves, never their targets).
fn give_to_nobody(path: &Path) {
    let id = (
        Some(nix::unistd::Uid::from_raw(NOBODY)),
        Some(nix::unistd::Gid::from_raw(NOBODY)),
    );
    nix::unistd::fchownat(
        None,
        path,
        id.0,
        id.1,
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .unwrap();
    if path.symlink_metadata().unwrap().is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            give_to_nobody(&entry.unwrap().path());
        }
    }
}

/// Copies the program `from` to `to` (mode 0755) in a `cp` process of its own. Copied here,
/// the file's write descriptor would be inherited by any child another test thread forks at
/// that moment, until that child executes: running the copy then fails with `ETXTBSY` ("Text
/// file busy"), seen beside CPU hogs. `cp`'s descriptor is its own.
pub fn copy_executable(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("--")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp runs");
    assert!(status.success(), "cp {} {}", from.display(), to.display());
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755)).unwrap();
}
