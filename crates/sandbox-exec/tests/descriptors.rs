//! No spawn path passes on a descriptor its caller holds without meaning to (the child
//! prelude marks every one beyond stdio close-on-exec), and a setup's descriptor passed on
//! purpose still arrives.
//!
//! Its own test binary: the process holds stray descriptors (not close-on-exec) on
//! [`STRAYS`] for its whole life, and its stdin is `/dev/null` for the pty path's relay.

// A panic is how a test or a benchmark reports failure; the workspace lints against
// unwrap/expect apply to shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::{Arc, Once};

use sandbox_exec::{
    run_interactive, spawn, spawn_direct, ChildSetup, CommandSpec, ExitOutcome, OutputLimits,
    OutputMode, PtyOptions, SetupFailure, SpawnOptions, StdinMode,
};

/// A directory holding a listening Unix socket, and that socket.
const STRAYS: [RawFd; 2] = [50, 51];

/// Puts the strays in place (once per process) and `/dev/null` on stdin.
fn hold_strays() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        let socket = std::os::unix::net::UnixListener::bind(dir.join("agent.sock")).unwrap();
        let dir_fd = std::fs::File::open(&dir).unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        for (from, to) in [
            (dir_fd.as_raw_fd(), STRAYS[0]),
            (socket.as_raw_fd(), STRAYS[1]),
            (null.as_raw_fd(), 0),
        ] {
            // SAFETY: dup2(2) onto numbers this test binary reserves for the strays (and its
            // stdin); the new descriptors are not close-on-exec.
            assert!(unsafe { libc::dup2(from, to) } >= 0);
        }
    });
}

/// `sh -c SCRIPT` in `dir`.
fn spec(script: &str, dir: &Path) -> CommandSpec {
    let mut spec = CommandSpec::argv(["sh", "-c", script], dir).unwrap();
    spec.set_env("PATH", "/usr/local/bin:/usr/bin:/bin");
    spec
}

/// The descriptors beyond stdio in an `ls -l /proc/self/fd` listing, but the one `ls` reads
/// the directory through.
fn strays_in(listing: &str) -> Vec<String> {
    assert!(listing.contains(" 0 -> "), "no listing:\n{listing}");
    listing
        .lines()
        .filter_map(|line| {
            let (left, target) = line.split_once(" -> ")?;
            let fd: i32 = left.split_whitespace().last()?.parse().ok()?;
            let own = target.starts_with("/proc/") && target.ends_with("/fd");
            (fd > 2 && !own).then(|| line.to_string())
        })
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn the_async_spawn_passes_no_stray_descriptor() {
    hold_strays();
    let dir = tempfile::tempdir().unwrap();
    let out = runtime().block_on(async {
        let options = SpawnOptions {
            stdin: StdinMode::Null,
            output: OutputMode::Capture(OutputLimits::default()),
            ..SpawnOptions::default()
        };
        spawn(&spec("ls -l /proc/self/fd", dir.path()), options)
            .unwrap()
            .wait_with_output()
            .await
            .unwrap()
    });
    assert_eq!(out.outcome, ExitOutcome::Exited(0));
    let strays = strays_in(&String::from_utf8_lossy(&out.stdout));
    assert!(strays.is_empty(), "inherited: {strays:#?}");
}

#[test]
fn the_direct_spawn_passes_no_stray_descriptor() {
    hold_strays();
    let dir = tempfile::tempdir().unwrap();
    let options = SpawnOptions {
        die_with_parent: true,
        ..SpawnOptions::default()
    };
    let mut child = spawn_direct(&spec("ls -l /proc/self/fd > fds", dir.path()), options).unwrap();
    let relay = sandbox_exec::SignalPipe::install().unwrap();
    assert_eq!(child.wait_relaying(&relay).unwrap(), ExitOutcome::Exited(0));
    let listing = std::fs::read_to_string(dir.path().join("fds")).unwrap();
    let strays = strays_in(&listing);
    assert!(strays.is_empty(), "inherited: {strays:#?}");
}

#[test]
fn the_pty_run_passes_no_stray_descriptor() {
    hold_strays();
    let dir = tempfile::tempdir().unwrap();
    let outcome = runtime()
        .block_on(run_interactive(
            &spec("ls -l /proc/self/fd > fds", dir.path()),
            PtyOptions::default(),
        ))
        .unwrap();
    assert_eq!(outcome, ExitOutcome::Exited(0));
    let listing = std::fs::read_to_string(dir.path().join("fds")).unwrap();
    let strays = strays_in(&listing);
    assert!(strays.is_empty(), "inherited: {strays:#?}");
}

/// A setup that passes one descriptor on purpose: the stray socket.
struct PassSocket;

impl ChildSetup for PassSocket {
    fn apply_in_child(&self) -> Result<(), SetupFailure> {
        Ok(())
    }
    fn name(&self) -> &str {
        "pass the socket"
    }
    fn passed_fds(&self) -> &[RawFd] {
        &STRAYS[1..]
    }
}

#[test]
fn a_descriptor_the_setup_passes_on_purpose_arrives_and_only_it() {
    hold_strays();
    let dir = tempfile::tempdir().unwrap();
    let options = SpawnOptions {
        setup: Some(Arc::new(PassSocket)),
        ..SpawnOptions::default()
    };
    let mut child = spawn_direct(&spec("ls -l /proc/self/fd > fds", dir.path()), options).unwrap();
    let relay = sandbox_exec::SignalPipe::install().unwrap();
    assert_eq!(child.wait_relaying(&relay).unwrap(), ExitOutcome::Exited(0));
    let listing = std::fs::read_to_string(dir.path().join("fds")).unwrap();
    let strays = strays_in(&listing);
    assert_eq!(strays.len(), 1, "{strays:#?}");
    assert!(
        strays[0].contains(" 51 -> socket:"),
        "the passed socket: {strays:#?}"
    );
}
