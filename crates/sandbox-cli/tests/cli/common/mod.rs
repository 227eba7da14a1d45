//! Shared helpers for the CLI integration tests: the real `sandbox` binary, run with its
//! XDG directories and HOME inside a temporary directory so that no test reads or writes the
//! machine's real configuration.

pub mod daemon;
pub mod escape;

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub const BIN: &str = env!("CARGO_BIN_EXE_sandbox");

pub use sandbox_testkit::nobody::{unprivileged, UserDirs};
pub use sandbox_testkit::{alive, report, skip, wait_dead};

/// What a test prints when the nono CLI is missing.
pub const NONO_MISSING: &str = "nono not installed (cargo install nono-cli --no-default-features)";

/// The nono CLI as the product finds it: `SANDBOX_NONO`, the package's (`SANDBOX_PACKAGE_NONO`,
/// which the flake's nextest check sets), then the test process's `PATH` (the tests' own `PATH`
/// is minimal, so it is passed explicitly).
pub fn nono_path() -> Option<PathBuf> {
    let from_env = std::env::var_os("SANDBOX_NONO")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let baked = std::env::var_os("SANDBOX_PACKAGE_NONO")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let on_path = || {
        std::env::split_paths(&std::env::var_os("PATH")?)
            .filter(|d| d.is_absolute())
            .map(|d| d.join("nono"))
            .find(|p| p.is_file())
    };
    from_env.or(baked).or_else(on_path)
}

/// A private home for one test: `home/`, XDG dirs under it, and a scratch dir beside it.
pub struct Env {
    pub dir: tempfile::TempDir,
}

/// A run killed with SIGKILL leaves its cgroups on the host (named in its run journal's
/// record), and the next run in the same environment removes them; a test that ends without
/// a next run does that removal itself here, as that run would (`limits::recover`: only
/// records whose owner is gone, only the groups they name).
impl Drop for Env {
    fn drop(&mut self) {
        let mut journals = Vec::new();
        Self::cgroup_journals(self.dir.path(), &mut journals);
        for journal in journals {
            sandbox_host::limits::recover(&journal);
        }
    }
}

impl Env {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("sandbox-test-")
            .tempdir()
            .unwrap();
        for sub in [
            "home/.config",
            "home/.local/state",
            "home/.local/share",
            "run",
            "work",
        ] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        // A real user's home has package caches (their overlays are mounted only then), rc
        // files and agent state: a suite of empty homes missed every cache-layer defect.
        sandbox_testkit::home::lived_in(&dir.path().join("home"));
        Env { dir }
    }

    /// The run journal directories under this environment that hold records of cgroups.
    fn cgroup_journals(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if is_dir {
                Self::cgroup_journals(&path, out);
            } else if path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("cgroups-") && n.ends_with(".json"))
                && !out.iter().any(|d| d.as_path() == dir)
            {
                out.push(dir.to_path_buf());
            }
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn home(&self) -> PathBuf {
        self.path().join("home")
    }

    /// A plain directory to run in.
    pub fn work(&self) -> PathBuf {
        self.path().join("work")
    }

    pub fn config_file(&self) -> PathBuf {
        self.home().join(".config/sandbox/config.yaml")
    }

    pub fn write_config(&self, text: &str) {
        let path = self.config_file();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// `sandbox <args>` with this test's environment.
    pub fn cmd(&self) -> Command {
        self.cmd_under(&[])
    }

    /// `WRAPPER… sandbox <args>` with this test's environment: `wrapper` execs its last
    /// arguments (the sandbox binary and what follows).
    pub fn cmd_under(&self, wrapper: &[&str]) -> Command {
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(BIN);
                cmd
            }
            None => Command::new(BIN),
        };
        cmd.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.home())
            .env("XDG_CONFIG_HOME", self.home().join(".config"))
            .env("XDG_STATE_HOME", self.home().join(".local/state"))
            .env("XDG_DATA_HOME", self.home().join(".local/share"))
            .env("XDG_RUNTIME_DIR", self.path().join("run"))
            .env("LANG", "C.UTF-8")
            .current_dir(self.work());
        if let Some(nono) = nono_path() {
            cmd.env("SANDBOX_NONO", nono);
        }
        // The machine's BoxLite settings pass through: where the runtime files are, and how
        // long a start may take (an emulated guest, `cargo xtask guest-boxlite`, needs minutes).
        for var in ["SANDBOX_BOXLITE_RUNTIME", "SANDBOX_BOXLITE_READY_TIMEOUT"] {
            if let Some(value) = std::env::var_os(var) {
                cmd.env(var, value);
            }
        }
        cmd
    }
}

/// Stdout and stderr as text, for assertion messages.
pub fn text(out: &std::process::Output) -> String {
    format!(
        "status={:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Descriptors a caller of `sandbox` holds without meaning to pass them on: a directory
/// holding a listening Unix socket, and that socket. [`StrayFds::give_to`] puts them on
/// [`STRAY_FDS`] of the started process, not close-on-exec, as a careless caller (a shell
/// with `exec 50<dir`, a daemon manager) would.
pub struct StrayFds {
    /// Holds the directory (and the socket in it) until the strays are dropped.
    _dir: tempfile::TempDir,
    dir_fd: std::os::fd::OwnedFd,
    socket: std::os::unix::net::UnixListener,
}

/// Where [`StrayFds::give_to`] puts the directory and the socket.
pub const STRAY_FDS: [i32; 2] = [50, 51];

/// A command line that lists its own descriptors (read by [`strays_in`]).
pub const LIST_FDS: &str = "ls -l /proc/self/fd";

impl StrayFds {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = std::os::unix::net::UnixListener::bind(dir.path().join("agent.sock")).unwrap();
        let dir_fd = std::fs::File::open(dir.path()).unwrap().into();
        StrayFds {
            _dir: dir,
            dir_fd,
            socket,
        }
    }

    /// Makes `cmd`'s process start with the directory and the socket on [`STRAY_FDS`].
    pub fn give_to(&self, cmd: &mut Command) {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let from = [self.dir_fd.as_raw_fd(), self.socket.as_raw_fd()];
        // SAFETY: runs between fork and exec; dup2(2) only (async-signal safe). dup2 leaves
        // the new descriptor without FD_CLOEXEC, so exec passes it on.
        unsafe {
            cmd.pre_exec(move || {
                for (from, to) in from.into_iter().zip(STRAY_FDS) {
                    if libc::dup2(from, to) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
    }
}

/// The lines of a [`LIST_FDS`] listing that show a descriptor beyond stdio, except the one
/// `ls` itself reads `/proc/self/fd` through.
pub fn strays_in(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|line| {
            let (left, target) = line.trim().split_once(" -> ")?;
            let fd: i32 = left.split_whitespace().last()?.parse().ok()?;
            let own = target.starts_with("/proc/") && target.ends_with("/fd");
            (fd > 2 && !own).then(|| line.trim().to_string())
        })
        .collect()
}

/// Asserts that `listing` (a [`LIST_FDS`] output of `path`) shows nothing beyond stdio, and
/// that it is a listing at all.
pub fn assert_no_strays(path: &str, listing: &str) {
    assert!(
        listing.contains(" 0 -> ") && listing.contains(" 2 -> "),
        "{path}: no descriptor listing:\n{listing}"
    );
    let strays = strays_in(listing);
    assert!(
        strays.is_empty(),
        "{path}: the command inherited descriptors it was never meant to get: {strays:#?}"
    );
}

/// The host pids of the processes whose command line is exactly `argv`. A command in a pid
/// namespace of its own (the native backend's view) knows only its namespace's pids, so a
/// test finds its processes on the host by a unique command line.
///
/// One scan, no retry: callers ask once the process has executed `argv` (its own shell
/// waited with [`EXECED_FN`]), and a process of a nested pid namespace is a process of the
/// host's, in its `/proc` from `fork` until it is reaped, with the `cmdline` its last `execve`
/// set. (The scan used to be repeated for up to 5 s because it missed processes under load:
/// the shells waited with `grep -q '^sleep' /proc/$p/cmdline`, and GNU grep splits a file with
/// NUL bytes into lines at the NULs, so it matched the *script* in the forked shell's
/// `sh\0-c\0sleep …`, or setsid's `setsid\0sleep\0…`, before `sleep` was executed.)
pub fn pids_running(argv: &[&str]) -> Vec<i32> {
    scan_for(argv)
}

/// The shell function `execed NAME PID`: returns once process PID runs the program NAME —
/// its `comm`, which `execve` sets: `sh` while it is still the forked shell, `setsid` while
/// setsid runs, then the program. `read` is the shell's own, so the wait forks nothing.
pub const EXECED_FN: &str =
    r#"execed() { until read -r c < /proc/$2/comm 2>/dev/null && [ "$c" = "$1" ]; do :; done; }"#;

/// The host pids of the processes whose command line is exactly `argv`, now (one scan).
pub fn scan_for(argv: &[&str]) -> Vec<i32> {
    // The program as given or as the view's PATH resolved it (`sh` or `/usr/bin/sh`).
    let matches = |cmdline: Vec<u8>| {
        let mut got = cmdline.split(|b| *b == 0);
        let program = got.next().unwrap_or_default();
        let rest: Vec<&[u8]> = got.collect();
        let want_rest: Vec<&[u8]> = argv[1..]
            .iter()
            .map(|a| a.as_bytes())
            .chain([&b""[..]])
            .collect();
        let name = std::path::Path::new(std::ffi::OsStr::from_bytes(program)).file_name();
        (program == argv[0].as_bytes() || name == Some(std::ffi::OsStr::new(argv[0])))
            && rest == want_rest
    };
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(matches))
        .filter(|pid| sandbox_testkit::alive(*pid))
        .collect()
}

/// What runs leave under the state dir that they should have removed: overlay work
/// directories, throwaway cache layers, empty mount points in a private home that no run
/// recorded as needed.
pub fn leftovers(state: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for layers in std::fs::read_dir(state.join("caches"))
        .into_iter()
        .flatten()
        .flatten()
    {
        for layer in std::fs::read_dir(layers.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = layer.file_name().to_string_lossy().into_owned();
            if name.starts_with("busy-") {
                found.push(layer.path());
            }
            let work = layer.path().join("work");
            if std::fs::read_dir(&work).is_ok_and(|mut d| d.next().is_some()) {
                found.push(work);
            }
        }
    }
    for home in std::fs::read_dir(state.join("homes"))
        .into_iter()
        .flatten()
        .flatten()
    {
        // The mount points the project's runs need stay between runs, on the home's record
        // (`homes/.<key>.points`); an empty one not on it is a leftover.
        let name = home.file_name().to_string_lossy().into_owned();
        let recorded =
            std::fs::read(state.join("homes").join(format!(".{name}.points"))).unwrap_or_default();
        let recorded: Vec<&[u8]> = recorded.split(|b| *b == 0).collect();
        for entry in [".npm", ".cargo/registry", ".cache/pip", ".cargo", ".cache"] {
            let path = home.path().join(entry);
            if std::fs::read_dir(&path).is_ok_and(|mut d| d.next().is_none())
                && !recorded.contains(&entry.as_bytes())
            {
                found.push(path);
            }
        }
    }
    found
}

/// A CPU hog beside a test (`yes`, its output thrown away), stopped by its pid when dropped.
/// Races between starting a command and signalling it show under load: a lost `exec.kill`
/// was seen about once in sixty rounds beside two hogs, never on an idle machine.
pub struct CpuHog(std::process::Child);

impl CpuHog {
    pub fn start() -> CpuHog {
        CpuHog(
            Command::new("yes")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }
}

impl Drop for CpuHog {
    fn drop(&mut self) {
        // Child::kill signals this child's pid, nothing else.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
