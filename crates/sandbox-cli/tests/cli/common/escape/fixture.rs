//! The fixture every attack runs against: a home, a repository with a linked worktree, a
//! directory outside, and the ways a run is started in it (`sandbox run`, a daemon's box,
//! the `native-nouserns` column); git as the host runs it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use crate::common::Env;

pub const SECRET: &str = "-----BEGIN OPENSSH PRIVATE KEY----- sandbox-test-secret";

/// A fresh home, repository, linked worktree and outside directory.
pub struct Fixture {
    pub env: Env,
    pub home: PathBuf,
    pub main: PathBuf,
    pub task: PathBuf,
    pub common: PathBuf,
    pub outside: PathBuf,
    /// This fixture's daemon, for the `<backend>@daemon` columns.
    daemon: std::sync::OnceLock<crate::common::daemon::Daemon>,
}

/// Appended to a backend's name, runs each attack through the daemon (`box.exec`) instead of
/// `sandbox run`: `native@daemon`.
pub const DAEMON: &str = "@daemon";

/// A column, not a backend: `sandbox run --backend native` started in a user namespace
/// that may create no user namespaces of its own, as on hosts that disable unprivileged
/// ones. (It runs as root of that namespace: `--map-root-user` is the mapping that can set
/// the limit.)
pub const NATIVE_NOUSERNS: &str = "native-nouserns";

/// Execs its arguments in a new user namespace that may create no user namespaces itself
/// (`unshare(CLONE_NEWUSER)` fails with ENOSPC there).
pub const NOUSERNS_WRAPPER: [&str; 7] = [
    "unshare",
    "--user",
    "--map-root-user",
    "sh",
    "-c",
    "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$@\"",
    "sh",
];

/// Why the `native-nouserns` column cannot run here, if so: the test itself cannot create the
/// user namespace that holds it (then the native column already runs without one).
pub fn nouserns_unavailable() -> Option<String> {
    let probe = Command::new(NOUSERNS_WRAPPER[0])
        .args(&NOUSERNS_WRAPPER[1..])
        .args(["sh", "-c", "unshare --user true 2>&1; test $? -ne 0"])
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(Stdio::null())
        .output();
    match probe {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!(
            "{NATIVE_NOUSERNS}: cannot set up a user namespace without nested ones here: {}",
            crate::common::text(&out)
        )),
        Err(e) => Some(format!("{NATIVE_NOUSERNS}: unshare: {e}")),
    }
}

/// A number unique in this process (box names, file names).
pub fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

pub use sandbox_testkit::git;

impl Fixture {
    pub fn new() -> Self {
        let env = Env::new();
        let home = env.home();
        std::fs::create_dir_all(home.join(".ssh")).unwrap();
        std::fs::write(home.join(".ssh/id_ed25519"), SECRET).unwrap();
        std::fs::write(home.join(".bashrc"), "# original\n").unwrap();
        let outside = env.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("victim.txt"), "original\n").unwrap();

        // The project: a file to read, a program to build, a test suite to run (its script
        // executable in the commit, so that the worktree's checkout can run it).
        let main = env.path().join("repo");
        std::fs::create_dir_all(&main).unwrap();
        std::fs::write(main.join("README"), "hello\n").unwrap();
        std::fs::write(
            main.join("hello.c"),
            "#include <stdio.h>\nint main(void){puts(\"built and ran\");return 0;}\n",
        )
        .unwrap();
        std::fs::write(
            main.join("Makefile"),
            "test:\n\t@test 4 -eq $$((2+2)) && ./check.sh && echo tests-passed\n",
        )
        .unwrap();
        std::fs::write(main.join("check.sh"), "#!/bin/sh\ngrep -q hello README\n").unwrap();
        std::fs::set_permissions(
            main.join("check.sh"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let task = env.path().join("task");
        sandbox_testkit::linked_worktree_on(&main, &task, "trunk", "feature");
        // Who the commits made inside the sandbox are by.
        git(&main, &["config", "user.name", "Sandbox Test"]);
        git(&main, &["config", "user.email", "test@sandbox.invalid"]);
        let main = std::fs::canonicalize(main).unwrap();
        let task = std::fs::canonicalize(task).unwrap();
        let common = main.join(".git");
        Fixture {
            env,
            home,
            main,
            task,
            common,
            outside,
            daemon: std::sync::OnceLock::new(),
        }
    }

    /// `sandbox run --backend B FLAGS -- sh -c SCRIPT` in the worktree.
    pub fn run(&self, backend: &str, flags: &[String], script: &str) -> Output {
        self.run_with(backend, flags, script, Stdio::null())
    }

    pub fn run_with(&self, backend: &str, flags: &[String], script: &str, stdin: Stdio) -> Output {
        self.run_at(&self.task, backend, flags, script, stdin)
    }

    /// [`Self::run`] in `dir` (the main worktree, say) instead of the linked worktree.
    pub fn run_in(&self, dir: &Path, backend: &str, flags: &[String], script: &str) -> Output {
        self.run_at(dir, backend, flags, script, Stdio::null())
    }

    fn run_at(
        &self,
        dir: &Path,
        backend: &str,
        flags: &[String],
        script: &str,
        stdin: Stdio,
    ) -> Output {
        // The host backend is the control: it enforces nothing, so it takes no policy flags
        // (it refuses --block-net rather than pretend).
        let flags: &[String] = if backend == "host" { &[] } else { flags };
        if let Some(backend) = backend.strip_suffix(DAEMON) {
            return self.run_in_box(dir, backend, flags, script);
        }
        let (mut cmd, backend) = if backend == NATIVE_NOUSERNS {
            // A user namespace whose own limit on nested user namespaces is 0: inside it,
            // `unshare(CLONE_NEWUSER)` fails (ENOSPC) as on a host that disables them.
            (self.env.cmd_under(&NOUSERNS_WRAPPER), "native")
        } else {
            (self.env.cmd(), backend)
        };
        cmd.current_dir(dir)
            .arg("run")
            .arg("--backend")
            .arg(backend)
            .args(flags)
            .args(["--", "sh", "-c", script])
            .stdin(stdin);
        cmd.output().unwrap()
    }

    /// The same run as a `box.exec` in a box of this fixture's daemon (started on first use):
    /// the daemon's path through the backend seam. Commands there get no terminal.
    fn run_in_box(&self, dir: &Path, backend: &str, flags: &[String], script: &str) -> Output {
        let daemon = self.daemon();
        let mut params = serde_json::json!({ "backend": backend });
        let mut flags = flags.iter();
        while let Some(flag) = flags.next() {
            match flag.as_str() {
                "--block-net" => params["blockNet"] = true.into(),
                "--allow-nested-git" => params["allowNestedGit"] = true.into(),
                "--allow-port" => {
                    let port: u32 = flags.next().unwrap().parse().unwrap();
                    params["allowPorts"] = serde_json::json!([port]);
                }
                other => panic!("no box.create parameter for {other} yet"),
            }
        }
        daemon.run_once(dir, params, &["sh", "-c", script])
    }

    /// A second task of the repository: worktree `other-task` on branch `other`.
    pub fn other_task(&self) -> PathBuf {
        let other = self.env.path().join("other-task");
        sandbox_testkit::add_worktree(&self.main, &other, "other");
        other
    }

    /// This fixture's daemon, started on first use.
    pub fn daemon(&self) -> &crate::common::daemon::Daemon {
        self.daemon
            .get_or_init(|| crate::common::daemon::Daemon::start(&self.env))
    }

    pub fn spawn_outside(&self, args: &[&str], env: &[(&str, &str)]) -> Child {
        let mut cmd = Command::new(args[0]);
        cmd.args(&args[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.spawn().unwrap()
    }
}

/// What `rev` names in the repository, on the host.
pub fn rev_parse(f: &Fixture, rev: &str) -> String {
    let out = host_git(&f.main, &["rev-parse", "--verify", "-q", rev]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Git as the user runs it on the host after the run (no global or system config).
pub fn host_git(dir: &Path, args: &[&str]) -> Output {
    Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

pub(super) fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
}
