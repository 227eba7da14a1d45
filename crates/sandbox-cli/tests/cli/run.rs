//! `sandbox run` / `sandbox shell` through the real binary: exit codes, stdio integrity,
//! process-group cleanup, signal relay, configuration errors, the PTY relay.

use crate::common;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{text, wait_dead, Env};

fn run(env: &Env, args: &[&str]) -> std::process::Output {
    env.cmd().args(args).stdin(Stdio::null()).output().unwrap()
}

#[test]
fn exit_codes_follow_the_convention() {
    let env = Env::new();
    let cases: &[(&[&str], i32)] = &[
        (&["run", "--backend", "host", "--", "sh", "-c", "exit 3"], 3),
        (&["run", "--backend", "host", "--", "true"], 0),
        (
            &["run", "--backend", "host", "--", "no-such-command-here"],
            127,
        ),
        (
            &["run", "--backend", "host", "--", "sh", "-c", "kill -9 $$"],
            137,
        ),
        (
            &[
                "run",
                "--backend",
                "host",
                "--timeout",
                "300ms",
                "--",
                "sleep",
                "30",
            ],
            124,
        ),
        (&["run", "--backend", "no-such-backend", "--", "true"], 125),
    ];
    for (args, want) in cases {
        let out = run(&env, args);
        assert_eq!(out.status.code(), Some(*want), "{args:?}\n{}", text(&out));
    }
    // Not executable: a plain data file.
    let data = env.work().join("data.txt");
    std::fs::write(&data, "x").unwrap();
    let out = run(
        &env,
        &["run", "--backend", "host", "--", data.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(126), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("data.txt") && err.contains("cannot execute"),
        "{err}"
    );
    // The failure is one clear line on stderr.
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn argv_is_not_reinterpreted_by_a_shell() {
    let env = Env::new();
    let out = run(
        &env,
        &[
            "run",
            "--backend",
            "host",
            "--",
            "printf",
            "%s|",
            "a b",
            "$HOME",
            "*",
            ";true",
        ],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "a b|$HOME|*|;true|");
}

#[test]
fn sixty_four_mib_pass_through_untouched() {
    let env = Env::new();
    let payload: Vec<u8> = (0..64u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let file = env.work().join("payload");
    std::fs::write(&file, &payload).unwrap();
    let out = run(
        &env,
        &[
            "run",
            "--backend",
            "host",
            "--",
            "cat",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout.len(), payload.len());
    assert!(out.stdout == payload, "stdout differs from the payload");

    // And stdin the other way.
    let mut child = env
        .cmd()
        .args(["run", "--backend", "host", "--", "sha256sum"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(&payload));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    let direct = Command::new("sha256sum").arg(&file).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next(),
        String::from_utf8_lossy(&direct.stdout)
            .split_whitespace()
            .next()
    );
}

#[test]
fn background_descendant_does_not_hold_the_run_and_dies() {
    let env = Env::new();
    let started = Instant::now();
    let out = run(
        &env,
        &[
            "run",
            "--backend",
            "host",
            "--",
            "sh",
            "-c",
            "sleep 100 & echo $!; exit 0",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(started.elapsed() < Duration::from_secs(10));
    let pid: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(
        wait_dead(pid, Duration::from_secs(5)),
        "sleep {pid} survived"
    );
}

#[test]
fn timeout_kills_descendants_including_ones_that_left_the_group() {
    let env = Env::new();
    // One sleeper stays in the group; one escapes into its own session with setsid.
    let script = "sleep 100 & echo $!; setsid sh -c 'echo $$; exec sleep 100' & sleep 100";
    let out = run(
        &env,
        &[
            "run",
            "--backend",
            "host",
            "--timeout",
            "1s",
            "--",
            "sh",
            "-c",
            script,
        ],
    );
    assert_eq!(out.status.code(), Some(124), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("timed out"));
    let pids: Vec<i32> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert_eq!(pids.len(), 2, "{}", text(&out));
    for pid in pids {
        assert!(
            wait_dead(pid, Duration::from_secs(5)),
            "descendant {pid} survived"
        );
    }
}

#[test]
fn signals_are_relayed_to_the_child_group() {
    let env = Env::new();
    for (signal, name, code) in [
        (libc::SIGTERM, "TERM", 7),
        (libc::SIGINT, "INT", 8),
        (libc::SIGHUP, "HUP", 9),
    ] {
        let script = format!(
            "trap 'echo got-{name}; exit {code}' {name}; echo ready; while :; do sleep 0.05; done"
        );
        let mut child = env
            .cmd()
            .args(["run", "--backend", "host", "--", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut seen = String::new();
        let mut buf = [0u8; 256];
        while !seen.contains("ready") {
            let n = stdout.read(&mut buf).unwrap();
            assert!(n > 0, "child ended before it was ready");
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        // SAFETY: plain kill(2) on the pid of a child we own.
        unsafe { libc::kill(child.id() as i32, signal) };
        let status = child.wait().unwrap();
        stdout.read_to_string(&mut seen).unwrap();
        assert!(seen.contains(&format!("got-{name}")), "{name}: {seen}");
        assert_eq!(status.code(), Some(code), "{name}");
    }
}

#[test]
fn config_errors_name_file_line_and_key() {
    let env = Env::new();
    env.write_config("backend: host\nnetwork:\n  block: false\n  alow_ports: [1]\n");
    let out = run(&env, &["run", "--", "true"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    let file = env.config_file();
    assert!(
        err.contains(&format!("{}:4:", file.display())),
        "file and line missing: {err}"
    );
    assert!(err.contains("alow_ports"), "{err}");

    env.write_config("timeout: [not, a, duration]\n");
    let out = run(&env, &["run", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("timeout"));
}

#[test]
fn configuration_in_the_workdir_is_never_read() {
    let env = Env::new();
    env.write_config("backend: host\n");
    // A hostile worktree drops config files where a careless tool might look.
    for path in ["config.yaml", ".sandbox/config.yaml", "sandbox/config.yaml"] {
        let p = env.work().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, "backend: bogus\nunknown: key\n").unwrap();
    }
    let out = run(&env, &["run", "--", "sh", "-c", "echo $SANDBOX_BACKEND"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "host");
}

#[test]
fn workspace_guard_refuses_symlink_escapes() {
    let env = Env::new();
    let outside = env.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, env.work().join("escape")).unwrap();
    std::fs::create_dir_all(env.work().join("sub")).unwrap();
    std::os::unix::fs::symlink("sub", env.work().join("inner")).unwrap();

    let ok = run(
        &env,
        &["run", "--backend", "host", "--cd", "inner", "--", "pwd"],
    );
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok));
    assert!(String::from_utf8_lossy(&ok.stdout)
        .trim()
        .ends_with("/work/sub"));

    for cd in ["escape", "sub/../../outside", "../outside", "/tmp"] {
        let out = run(&env, &["run", "--backend", "host", "--cd", cd, "--", "pwd"]);
        assert_eq!(out.status.code(), Some(125), "--cd {cd}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("outside the workspace"),
            "{}",
            text(&out)
        );
        assert!(out.stdout.is_empty(), "nothing may run");
    }
    let out = run(
        &env,
        &[
            "run",
            "--backend",
            "host",
            "--guard-args",
            "--",
            "cat",
            "escape/x",
        ],
    );
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
}

#[test]
fn bad_env_arguments_are_refused_before_running() {
    let env = Env::new();
    let marker = env.work().join("ran");
    let out = run(
        &env,
        &[
            "run",
            "--env",
            "BAD-NAME",
            "--",
            "touch",
            marker.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(!marker.exists());
}

/// A pty pair owned by the test, standing in for the user's terminal.
struct TestTerminal {
    master: OwnedFd,
    slave: OwnedFd,
    rx: Option<mpsc::Receiver<Vec<u8>>>,
    seen: Vec<u8>,
}

impl TestTerminal {
    fn new(rows: u16, cols: u16) -> Self {
        let size = nix::pty::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = nix::pty::openpty(Some(&size), None).unwrap();
        TestTerminal {
            master: pty.master,
            slave: pty.slave,
            rx: None,
            seen: Vec::new(),
        }
    }

    fn start_reader(&mut self) {
        let master = self.master.try_clone().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut file = std::fs::File::from(master);
            let mut buf = [0u8; 4096];
            while let Ok(n) = file.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        self.rx = Some(rx);
    }

    /// `sandbox shell EXTRA --shell /bin/sh` with this terminal as its stdio; starts reading.
    fn spawn_shell(&mut self, env: &Env, extra: &[&str]) -> std::process::Child {
        self.spawn_shell_from(env.cmd(), extra)
    }

    /// [`Self::spawn_shell`] from `cmd` (`sandbox` prepared by the test).
    fn spawn_shell_from(&mut self, mut cmd: Command, extra: &[&str]) -> std::process::Child {
        let slave = || Stdio::from(self.slave.try_clone().unwrap());
        let child = cmd
            .arg("shell")
            .args(extra)
            .args(["--shell", "/bin/sh"])
            .env("TERM", "dumb")
            .stdin(slave())
            .stdout(slave())
            .stderr(slave())
            .spawn()
            .unwrap();
        self.start_reader();
        child
    }

    fn type_text(&self, s: &str) {
        nix::unistd::write(&self.master, s.as_bytes()).unwrap();
    }

    fn wait_for(&mut self, needle: &str) -> String {
        if !self.shows_within(needle, Duration::from_secs(20)) {
            panic!(
                "timed out waiting for {needle:?}; terminal shows:\n{}",
                String::from_utf8_lossy(&self.seen)
            );
        }
        String::from_utf8_lossy(&self.seen).into_owned()
    }

    /// Whether `needle` appears on the terminal within `within`.
    fn shows_within(&mut self, needle: &str, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let rx = self.rx.as_ref().unwrap();
        while !String::from_utf8_lossy(&self.seen).contains(needle) {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(bytes) => self.seen.extend_from_slice(&bytes),
                Err(_) => return false,
            }
        }
        true
    }
}

#[test]
fn interactive_shell_round_trip_through_a_fresh_pty() {
    let env = Env::new();
    let mut term = TestTerminal::new(33, 101);
    let mut child = term.spawn_shell(&env, &["--backend", "host"]);

    term.type_text("echo result=$((6*7))\r");
    term.wait_for("result=42");
    // The shell sees the window size of the terminal it was started from…
    term.type_text("stty size\r");
    term.wait_for("33 101");
    // …and its tty is not ours: the relay gave it a fresh one.
    let our_tty = std::fs::read_link(format!("/proc/self/fd/{}", term.slave.as_raw_fd())).unwrap();
    term.type_text("echo tty=$(tty)\r");
    let shown = term.wait_for("tty=/dev/pts/");
    let shell_tty = shown
        .split("tty=")
        .last()
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    assert_ne!(
        shell_tty,
        our_tty.to_string_lossy(),
        "shell got the user's terminal"
    );
    // Window changes are forwarded.
    let size = libc::winsize {
        ws_row: 40,
        ws_col: 120,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the stack; the fd is our pty slave.
    unsafe { libc::ioctl(term.slave.as_raw_fd(), libc::TIOCSWINSZ, &size) };
    // SAFETY: kill(2) takes integers; `child` is ours and not yet reaped, so its pid is not reused.
    unsafe { libc::kill(child.id() as i32, libc::SIGWINCH) };
    // The relay applies the size asynchronously; ask again until it shows (bounded), so a
    // slow machine does not turn into a failure.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        term.type_text("stty size\r");
        if term.shows_within("40 120", Duration::from_millis(500)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the window change never reached the shell; terminal shows:\n{}",
            String::from_utf8_lossy(&term.seen)
        );
    }

    term.type_text("exit 5\r");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(5));
}

#[test]
fn tiocsti_cannot_reach_the_users_terminal() {
    // As root, TIOCSTI works on any tty (CAP_SYS_ADMIN), so the session rule is only
    // observable for an unprivileged user; run the attempt as nobody when we are root.
    let python = "/usr/bin/python3";
    if !std::path::Path::new(python).exists() {
        common::skip("python3", format_args!("{python} is not installed"));
        return;
    }
    let is_root = nix::unistd::geteuid().is_root();
    if is_root && !std::path::Path::new("/usr/bin/setpriv").exists() {
        common::skip(
            "setpriv",
            "running as root and setpriv is missing to drop privileges",
        );
        return;
    }
    let env = Env::new();
    std::fs::set_permissions(
        env.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let inject = "import fcntl, termios, sys\n\
try:\n    fcntl.ioctl(0, termios.TIOCSTI, b'X')\n    print('injected')\n\
except OSError as e:\n    print('refused', e.errno)\n";
    // The build directory may sit below a directory nobody cannot enter (/root): run a copy
    // of the binary from the test's own world-readable directory.
    let bin_copy = env.path().join("sandbox");
    sandbox_testkit::nobody::copy_executable(std::path::Path::new(common::BIN), &bin_copy);
    std::fs::set_permissions(
        &bin_copy,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let as_user = |mut cmd: Command| -> Command {
        if is_root {
            let program = if cmd.get_program() == common::BIN {
                bin_copy.as_os_str().to_owned()
            } else {
                cmd.get_program().to_owned()
            };
            let mut wrapped = Command::new("/usr/bin/setpriv");
            wrapped
                .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg(program)
                .args(cmd.get_args());
            for (k, v) in cmd.get_envs() {
                match v {
                    Some(v) => wrapped.env(k, v),
                    None => wrapped.env_remove(k),
                };
            }
            if let Some(dir) = cmd.get_current_dir() {
                wrapped.current_dir(dir);
            }
            cmd = wrapped;
        }
        cmd
    };

    // Control: a process whose controlling terminal is the pty *can* inject — the attack
    // is real on this machine, so a refusal below means something.
    let term = TestTerminal::new(24, 80);
    let mut control = Command::new(python);
    control.args([
        "-c",
        &format!(
            "import os, fcntl, termios\nos.setsid()\nfcntl.ioctl(0, termios.TIOCSCTTY, 0)\n{inject}"
        ),
    ]);
    let control = as_user(control)
        .stdin(Stdio::from(term.slave.try_clone().unwrap()))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&control.stdout).trim(),
        "injected",
        "control case: {}",
        text(&control)
    );

    // Through sandbox run, stdin is the same terminal, but the child has no controlling
    // terminal (new session), so the kernel refuses.
    let term = TestTerminal::new(24, 80);
    let mut cmd = env.cmd();
    cmd.args(["run", "--backend", "host", "--", python, "-c", inject]);
    let out = as_user(cmd)
        .env("HOME", "/nonexistent")
        .stdin(Stdio::from(term.slave.try_clone().unwrap()))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("refused"),
        "{}",
        text(&out)
    );
}

#[test]
fn killing_the_cli_hard_takes_the_command_with_it() {
    let env = Env::new();
    let mut child = env
        .cmd()
        .args([
            "run",
            "--backend",
            "host",
            "--",
            "sh",
            "-c",
            "echo $$; exec sleep 100",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    let pid: i32 = line.trim().parse().unwrap();
    assert!(common::alive(pid));
    // SIGKILL cannot be relayed or handled: the kernel's parent-death signal does the work.
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        wait_dead(pid, Duration::from_secs(5)),
        "command {pid} outlived its CLI"
    );
}

#[test]
fn killing_the_cli_hard_takes_the_interactive_shell_with_it() {
    let env = Env::new();
    let mut term = TestTerminal::new(24, 80);
    let mut child = term.spawn_shell(&env, &["--backend", "host"]);
    // The shell shrugs off the hangup its terminal's end sends (as `nohup` would) and keeps
    // running: only the kernel's parent-death signal can end it now.
    // The answer reads "pid-2-<pid>-end-7"; the echoed typed line shows the arithmetic.
    term.type_text("trap '' HUP; echo pid-$((1+1))-$$-end-$((3+4)); exec sleep 100\r");
    let shown = term.wait_for("-end-7");
    let pid: i32 = shown
        .split("pid-2-")
        .nth(1)
        .and_then(|rest| rest.split("-end-7").next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid on the terminal:\n{shown}"));
    assert!(common::alive(pid));
    child.kill().unwrap();
    child.wait().unwrap();
    let gone = wait_dead(pid, Duration::from_secs(5));
    if !gone {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(gone, "shell {pid} outlived its SIGKILLed `sandbox shell`");
}

#[test]
fn a_command_of_sandbox_run_inherits_no_stray_descriptor() {
    for backend in ["host", "native"] {
        let env = Env::new();
        let strays = common::StrayFds::new();
        let mut cmd = env.cmd();
        cmd.args([
            "run",
            "--backend",
            backend,
            "--",
            "sh",
            "-c",
            common::LIST_FDS,
        ])
        .stdin(Stdio::null());
        strays.give_to(&mut cmd);
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{backend}: {}", text(&out));
        common::assert_no_strays(
            &format!("sandbox run --backend {backend}"),
            &String::from_utf8_lossy(&out.stdout),
        );
    }
}

#[test]
fn an_interactive_shell_inherits_no_stray_descriptor() {
    let env = Env::new();
    let strays = common::StrayFds::new();
    let mut cmd = env.cmd();
    strays.give_to(&mut cmd);
    let mut term = TestTerminal::new(24, 80);
    let mut child = term.spawn_shell_from(cmd, &["--backend", "host"]);
    term.type_text(&format!("{}; echo listed-$((6*7))\r", common::LIST_FDS));
    let shown = term.wait_for("listed-42");
    term.type_text("exit 0\r");
    assert_eq!(child.wait().unwrap().code(), Some(0));
    common::assert_no_strays("sandbox shell", &shown);
}

#[test]
fn interactive_shell_under_the_native_backend_is_confined() {
    let env = Env::new();
    let mut term = TestTerminal::new(24, 80);
    let mut child = term.spawn_shell(&env, &[]);
    let outside = env.path().join("outside-from-shell");
    term.type_text("echo backend=$SANDBOX_BACKEND\r");
    term.wait_for("backend=native");
    // The path lies under /tmp, which is private to the view: the touch may succeed there, and
    // never reaches the host (judged below). The typed line echoes "touch-$((1+1))"; only the
    // shell's answer reads "touch-2".
    term.type_text(&format!(
        "touch {} ; echo touch-$((1+1))\r",
        outside.display()
    ));
    term.wait_for("touch-2");
    term.type_text("echo inside > ok.txt && echo wrote-inside\r");
    term.wait_for("wrote-inside");
    term.type_text("exit 0\r");
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert!(!outside.exists());
    assert!(env.work().join("ok.txt").exists());
}

#[test]
fn completions_and_man_page_are_generated_and_a_closed_pipe_is_quiet() {
    let env = Env::new();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = run(&env, &["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", text(&out));
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(
            script.contains("sandbox") && script.contains("allow-write"),
            "{shell}"
        );
    }
    let out = run(&env, &["man"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(".TH sandbox 1"));

    // A reader that went away: no panic, no error line, the SIGPIPE convention.
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let out = env
        .cmd()
        .arg("man")
        .stdout(Stdio::from(write))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(128 + libc::SIGPIPE),
        "{}",
        text(&out)
    );
    assert!(out.stderr.is_empty(), "{}", text(&out));
}

/// When a round of the test below signals `sandbox run`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum When {
    /// As soon as the process exists: while it starts, prepares the run or spawns.
    AtOnce,
    /// As soon as it logged that the command was spawned (`SANDBOX_LOG=debug`).
    Spawned,
}

/// `sandbox run` started as a child whose stderr (its debug log) a thread reads: `spawned`
/// hears once the command was spawned; the log comes back when stderr ends.
struct LoggedRun {
    child: std::process::Child,
    spawned: mpsc::Receiver<()>,
    log: std::thread::JoinHandle<String>,
}

impl LoggedRun {
    fn start(env: &Env, args: &[&str]) -> LoggedRun {
        let mut child = env
            .cmd()
            .args(args)
            .env("SANDBOX_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, spawned) = mpsc::channel();
        let log = std::thread::spawn(move || {
            use std::io::BufRead;
            let mut log = String::new();
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("spawned (direct)") {
                    let _ = tx.send(());
                }
                log.push_str(&line);
                log.push('\n');
            }
            log
        });
        LoggedRun {
            child,
            spawned,
            log,
        }
    }

    /// Its exit status, or a loud failure (and SIGKILL to it) if it is still running after
    /// `within`: the wait is for its exit, `within` only turns a hang into a failure.
    fn wait(self, within: Duration, what: &str) -> (std::process::ExitStatus, String) {
        let LoggedRun { mut child, log, .. } = self;
        let pid = child.id() as i32;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        match rx.recv_timeout(within) {
            Ok(status) => (status.unwrap(), log.join().unwrap()),
            Err(_) => {
                // SAFETY: kill(2) of our own child, which has not been reaped (its waiter
                // thread is still blocked in wait).
                unsafe { libc::kill(pid, libc::SIGKILL) };
                panic!(
                    "{what}: sandbox run (pid {pid}) still ran {within:?} after the signal; \
                     its log:\n{}",
                    log.join().unwrap()
                );
            }
        }
    }
}

/// `sandbox run -- sleep` signalled with TERM, INT or KILL the moment it exists and the
/// moment its command was spawned, round after round beside a CPU hog, then with a timeout
/// that expires as the command starts: every round ends with the signal's status (128+N, or
/// `sandbox run` itself killed by N before it could relay anything) or 124, at once, and
/// leaves no process behind. A signal that came before the relay is installed ends
/// `sandbox run` by its default action, before any command exists; after, it is relayed,
/// queued until the command exists if need be (docs/backends.md, "Signals and timeouts").
#[test]
fn a_run_signalled_the_moment_it_started_always_ends_with_its_signal() {
    use std::os::unix::process::ExitStatusExt;
    const GONE: Duration = Duration::from_secs(30);
    let grace = sandbox_exec::process_group::DEFAULT_KILL_GRACE;
    let _hog = common::CpuHog::start();
    let env = Env::new();
    let signals = [
        ("TERM", libc::SIGTERM),
        ("INT", libc::SIGINT),
        ("KILL", libc::SIGKILL),
    ];
    // A command line no other test runs: what is left of a round is found by it.
    let marker = |round: usize| format!("1000.{:05}{round:03}", std::process::id() % 100_000);
    for round in 0..60 {
        let (name, number) = signals[round % signals.len()];
        let when = if round / signals.len() % 2 == 0 {
            When::AtOnce
        } else {
            When::Spawned
        };
        let what = format!("round {round}, SIG{name} {when:?}");
        let duration = marker(round);
        let run = LoggedRun::start(
            &env,
            &["run", "--backend", "native", "--", "sleep", &duration],
        );
        if when == When::Spawned {
            run.spawned
                .recv_timeout(GONE)
                .unwrap_or_else(|_| panic!("{what}: the command was never spawned"));
        }
        // SAFETY: kill(2) of our own child, not yet reaped.
        unsafe { libc::kill(run.child.id() as i32, number) };
        let sent = Instant::now();
        let (status, log) = run.wait(GONE, &what);
        let took = sent.elapsed();
        let relayed = status.code() == Some(128 + number);
        let killed = status.signal() == Some(number);
        match (when, number) {
            (When::Spawned, libc::SIGTERM | libc::SIGINT) => {
                assert!(relayed, "{what}: {status:?}\n{log}");
                assert!(
                    took <= grace,
                    "{what}: ended {took:?} after the signal\n{log}"
                );
            }
            _ => assert!(relayed || killed, "{what}: {status:?}\n{log}"),
        }
        for pid in common::scan_for(&["sleep", &duration]) {
            assert!(
                wait_dead(pid, GONE),
                "{what}: its command {pid} survived\n{log}"
            );
        }
    }
    for round in 0..20 {
        let what = format!("timeout round {round}");
        let duration = marker(100 + round);
        let run = LoggedRun::start(
            &env,
            &[
                "run",
                "--backend",
                "native",
                "--timeout",
                "1ms",
                "--",
                "sleep",
                &duration,
            ],
        );
        let (status, log) = run.wait(GONE, &what);
        assert_eq!(status.code(), Some(124), "{what}\n{log}");
        for pid in common::scan_for(&["sleep", &duration]) {
            assert!(
                wait_dead(pid, GONE),
                "{what}: its command {pid} survived\n{log}"
            );
        }
    }
}
