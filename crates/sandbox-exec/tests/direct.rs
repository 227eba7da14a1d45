//! The direct spawn (`clone(CLONE_VM | CLONE_VFORK)`, no runtime) against real processes:
//! what the child gets (argv, environment, directory, session, stdio, the setup hook), how
//! failures are told apart, and that a finished, timed-out or dropped run takes its whole group
//! with it. The signal relay has its own test binary (`direct_signals.rs`): a signal to the
//! process would reach every test of this one.

// A panic is how a test or a benchmark reports failure; the workspace lints against
// unwrap/expect apply to shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sandbox_exec::{
    spawn_direct, ChildSetup, CommandSpec, ExitOutcome, OutputMode, SetupFailure, SetupStep,
    SignalPipe, SpawnOptions, StdinMode,
};

fn spec(argv: &[&str], cwd: &Path) -> CommandSpec {
    let mut spec = CommandSpec::argv(argv.iter().copied(), cwd).unwrap();
    spec.set_env("PATH", "/usr/local/bin:/usr/bin:/bin");
    spec
}

/// Runs `spec` to its end with a fresh relay.
fn run(spec: &CommandSpec, options: SpawnOptions) -> ExitOutcome {
    let relay = SignalPipe::install().unwrap();
    let mut child = spawn_direct(spec, options).unwrap();
    child.wait_relaying(&relay).unwrap()
}

/// Waits until process `pid` has ended, by its pidfd (an event, not a polling loop). `false`
/// if it is still running after `within` — a generous bound that only a failure reaches.
fn ends_within(pid: i32, within: Duration) -> bool {
    // SAFETY: pidfd_open(2) with a pid and no flags.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        // ESRCH: gone already (and reaped).
        return std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    }
    // SAFETY: a descriptor just returned by the kernel, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) on one pollfd of ours.
    let ready = unsafe { libc::poll(&mut pfd, 1, within.as_millis() as i32) };
    if ready == 1 {
        return true;
    }
    // A zombie (its parent has not reaped it yet) has ended too.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| stat.rsplit(')').next().unwrap().split_whitespace().next() == Some("Z"))
        .unwrap_or(true)
}

#[test]
fn argv_environment_directory_and_exit_code_reach_the_child() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut s = spec(
        &[
            "sh",
            "-c",
            "printf '%s|%s|%s|%s' \"$0\" \"$1\" \"$GREETING\" \"$(pwd)\" > out; exit 7",
            "zero",
            "one two",
        ],
        dir.path(),
    );
    s.set_env("GREETING", "héllo");
    let outcome = run(&s, SpawnOptions::default());
    assert_eq!(outcome, ExitOutcome::Exited(7));
    let cwd = std::fs::canonicalize(dir.path()).unwrap();
    assert_eq!(
        std::fs::read_to_string(out).unwrap(),
        format!("zero|one two|héllo|{}", cwd.display())
    );
}

#[test]
fn the_environment_is_exactly_the_specs() {
    let dir = tempfile::tempdir().unwrap();
    // Ours has HOME (cargo's test runner passes it on); the spec does not.
    assert!(std::env::var_os("HOME").is_some());
    let redirect = spec(&["sh", "-c", "exec /usr/bin/env > env.txt"], dir.path());
    assert_eq!(
        run(&redirect, SpawnOptions::default()),
        ExitOutcome::Exited(0)
    );
    let env = std::fs::read_to_string(dir.path().join("env.txt")).unwrap();
    assert!(!env.contains("HOME="), "{env}");
    assert!(env.contains("PATH=/usr/local/bin:/usr/bin:/bin"), "{env}");
}

#[test]
fn the_child_leads_a_new_session_without_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(
        &["sh", "-c", "cat /proc/self/stat > stat; echo $$ > pid"],
        dir.path(),
    );
    let relay = SignalPipe::install().unwrap();
    let mut child = spawn_direct(&s, SpawnOptions::default()).unwrap();
    let pid = child.pid().as_raw();
    assert_eq!(child.wait_relaying(&relay).unwrap(), ExitOutcome::Exited(0));
    let stat = std::fs::read_to_string(dir.path().join("stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    // cat is sh's child: its group and session are sh's, which are the spawned pid.
    let (pgrp, session, tty_nr) = (fields[2], fields[3], fields[4]);
    assert_eq!(pgrp, pid.to_string(), "own process group");
    assert_eq!(session, pid.to_string(), "own session");
    assert_eq!(tty_nr, "0", "no controlling terminal");
}

#[test]
fn null_stdio_is_dev_null_and_inherited_stdio_is_ours() {
    let dir = tempfile::tempdir().unwrap();
    // The shell's own descriptors, read from a subshell ($$ stays the shell's pid).
    let probe = "fds=$(readlink /proc/$$/fd/0 /proc/$$/fd/1 /proc/$$/fd/2); echo \"$fds\" > fds";
    let s = spec(&["sh", "-c", probe], dir.path());
    let null = SpawnOptions {
        stdin: StdinMode::Null,
        output: OutputMode::Null,
        ..SpawnOptions::default()
    };
    assert_eq!(run(&s, null), ExitOutcome::Exited(0));
    let fds = std::fs::read_to_string(dir.path().join("fds")).unwrap();
    assert_eq!(fds, "/dev/null\n/dev/null\n/dev/null\n");

    assert_eq!(run(&s, SpawnOptions::default()), ExitOutcome::Exited(0));
    let ours: Vec<String> = (0..3)
        .map(|fd| {
            std::fs::read_link(format!("/proc/self/fd/{fd}"))
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        })
        .collect();
    let fds = std::fs::read_to_string(dir.path().join("fds")).unwrap();
    assert_eq!(fds.lines().collect::<Vec<_>>(), ours);
}

#[test]
fn missing_non_executable_and_bad_directory_are_127_126_and_125() {
    let dir = tempfile::tempdir().unwrap();
    let err = spawn_direct(
        &spec(&["definitely-not-a-command-x"], dir.path()),
        SpawnOptions::default(),
    )
    .err()
    .unwrap();
    assert_eq!(err.exit_code(), 127, "{err}");
    let data = dir.path().join("data.txt");
    std::fs::write(&data, "not a program").unwrap();
    // Executable bit set, but no valid format: execve itself fails (ENOEXEC), in the child.
    std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let err = spawn_direct(
        &spec(&[data.to_str().unwrap()], dir.path()),
        SpawnOptions::default(),
    )
    .err()
    .unwrap();
    assert_eq!(err.exit_code(), 126, "{err}");
    assert!(err.to_string().contains("not a valid executable"), "{err}");
    let s = spec(&["true"], Path::new("/definitely/not/here"));
    let err = spawn_direct(&s, SpawnOptions::default()).err().unwrap();
    assert_eq!(err.exit_code(), 125, "{err}");
}

struct Refuse;

impl ChildSetup for Refuse {
    fn apply_in_child(&self) -> Result<(), SetupFailure> {
        Err(SetupFailure {
            step: SetupStep::SeccompLoad,
            errno: nix::errno::Errno::ENOENT,
            detail: 0,
        })
    }
    fn name(&self) -> &str {
        "test-setup"
    }
}

#[test]
fn a_failing_setup_is_a_setup_error_and_nothing_runs() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let err = spawn_direct(
        &spec(&["touch", marker.to_str().unwrap()], dir.path()),
        SpawnOptions {
            setup: Some(Arc::new(Refuse)),
            ..SpawnOptions::default()
        },
    )
    .err()
    .unwrap();
    // ENOENT from the setup must not be mistaken for "command not found".
    assert_eq!(err.exit_code(), 125, "{err}");
    let text = err.to_string();
    assert!(text.contains("test-setup"), "{err}");
    assert!(text.contains("loading the seccomp filter"), "{err}");
    assert!(
        !marker.exists(),
        "the command ran although its setup failed"
    );
}

/// A setup with an effect the command can see: a lower open-files limit.
struct LowerFileLimit;

const CHILD_FILE_LIMIT: libc::rlim_t = 37;

impl ChildSetup for LowerFileLimit {
    fn apply_in_child(&self) -> Result<(), SetupFailure> {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit with a struct on our stack.
        unsafe {
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
            limit.rlim_cur = CHILD_FILE_LIMIT;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(SetupFailure::last(SetupStep::Other));
            }
        }
        Ok(())
    }
    fn name(&self) -> &str {
        "lower file limit"
    }
}

fn file_limit() -> libc::rlim_t {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes one `rlimit` into `limit`, a live struct on our stack.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(rc, 0);
    limit.rlim_cur
}

#[test]
fn the_setup_applies_to_the_child_and_never_to_us() {
    // The child shares our memory until it execs: what it changes must still be its own.
    let dir = tempfile::tempdir().unwrap();
    let before = file_limit();
    assert_ne!(before, CHILD_FILE_LIMIT);
    let s = spec(&["sh", "-c", "ulimit -n > limit"], dir.path());
    let options = SpawnOptions {
        setup: Some(Arc::new(LowerFileLimit)),
        ..SpawnOptions::default()
    };
    assert_eq!(run(&s, options), ExitOutcome::Exited(0));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("limit"))
            .unwrap()
            .trim(),
        CHILD_FILE_LIMIT.to_string()
    );
    let after = file_limit();
    assert_eq!(after, before, "the child's setup changed the parent");
}

#[test]
fn descendants_left_in_the_group_are_killed_when_the_command_exits() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(&["sh", "-c", "sleep 100 & echo $! > pid"], dir.path());
    assert_eq!(
        run(
            &s,
            SpawnOptions {
                kill_grace: Duration::from_millis(200),
                ..SpawnOptions::default()
            }
        ),
        ExitOutcome::Exited(0)
    );
    let sleeper: i32 = std::fs::read_to_string(dir.path().join("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        ends_within(sleeper, Duration::from_secs(10)),
        "the background sleep outlived the run"
    );
}

#[test]
fn a_timeout_kills_every_descendant_and_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(
        &[
            "sh",
            "-c",
            "sleep 100 & echo $! >> pids; sh -c 'sleep 100 & echo $! >> pids; wait' & wait",
        ],
        dir.path(),
    );
    s.timeout = Some(Duration::from_millis(300));
    let options = SpawnOptions {
        kill_grace: Duration::from_millis(200),
        ..SpawnOptions::default()
    };
    let outcome = run(&s, options);
    assert_eq!(outcome, ExitOutcome::TimedOut(Duration::from_millis(300)));
    assert_eq!(outcome.code(), 124);
    let pids: Vec<i32> = std::fs::read_to_string(dir.path().join("pids"))
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2, "both sleeps started before the timeout");
    for pid in pids {
        assert!(
            ends_within(pid, Duration::from_secs(10)),
            "descendant {pid} survived the timeout"
        );
    }
}

#[test]
fn dropping_an_unwaited_child_kills_its_group() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("ready");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let s = spec(
        &["sh", "-c", "sleep 100 & echo $! > ready; wait"],
        dir.path(),
    );
    let child = spawn_direct(&s, SpawnOptions::default()).unwrap();
    let leader = child.pid().as_raw();
    // Opening the FIFO waits for the shell to open it: the sleep has started by then.
    let sleeper: i32 = std::fs::read_to_string(&fifo)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    drop(child);
    assert!(
        ends_within(sleeper, Duration::from_secs(10)),
        "sleep survived"
    );
    assert!(
        ends_within(leader, Duration::from_secs(10)),
        "leader survived"
    );
}

#[test]
fn a_signal_death_is_128_plus_n() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(&["sh", "-c", "kill -TERM $$"], dir.path());
    let outcome = run(&s, SpawnOptions::default());
    assert_eq!(outcome, ExitOutcome::Signaled(libc::SIGTERM));
    assert_eq!(outcome.code(), 143);
}

#[test]
fn piped_or_captured_stdio_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let s = spec(&["touch", marker.to_str().unwrap()], dir.path());
    let piped = SpawnOptions {
        stdin: StdinMode::Piped,
        ..SpawnOptions::default()
    };
    assert!(spawn_direct(&s, piped).is_err());
    let captured = SpawnOptions {
        output: OutputMode::Capture(sandbox_exec::OutputLimits::default()),
        ..SpawnOptions::default()
    };
    assert!(spawn_direct(&s, captured).is_err());
    assert!(!marker.exists());
}
