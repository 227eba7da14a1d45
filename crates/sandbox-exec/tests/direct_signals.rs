//! The direct spawn's signal relay: a SIGTERM sent to this process reaches the command's
//! group (which leads its own session, so nothing else would deliver it) and does not end
//! this process. One test in its own binary: the signal goes to the whole test process.

// A panic is how a test or a benchmark reports failure; the workspace lints against
// unwrap/expect apply to shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use sandbox_exec::{spawn_direct, CommandSpec, ExitOutcome, SignalPipe, SpawnOptions};

#[test]
fn a_signal_to_us_is_relayed_to_the_command_and_we_survive_it() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("ready");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let mut spec = CommandSpec::argv(
        ["sh", "-c", "echo ready > ready; exec sleep 100"],
        Path::new(dir.path()),
    )
    .unwrap();
    spec.set_env("PATH", "/usr/bin:/bin");
    let relay = SignalPipe::install().unwrap();
    let mut child = spawn_direct(&spec, SpawnOptions::default()).unwrap();
    // The shell has started once it opens the FIFO; it then execs sleep.
    assert_eq!(std::fs::read_to_string(&fifo).unwrap(), "ready\n");
    nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGTERM).unwrap();
    let outcome = child.wait_relaying(&relay).unwrap();
    assert_eq!(outcome, ExitOutcome::Signaled(libc::SIGTERM));
}
