//! The exec layer against real processes: output integrity, backpressure, bounded draining,
//! whole-group termination, sessions.

// A panic is how a test or a benchmark reports failure; the workspace lints against
// unwrap/expect apply to shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use sandbox_exec::{
    spawn, CommandSpec, ExitOutcome, OutputLimits, OutputMode, SpawnOptions, StdinMode, StreamKind,
};
use sandbox_testkit::{alive, wait_dead};

fn spec(argv: &[&str]) -> CommandSpec {
    let mut spec = CommandSpec::argv(argv.iter().copied(), "/").unwrap();
    spec.set_env("PATH", "/usr/local/bin:/usr/bin:/bin");
    spec
}

fn capture() -> SpawnOptions {
    SpawnOptions {
        stdin: StdinMode::Null,
        output: OutputMode::Capture(OutputLimits::default()),
        ..SpawnOptions::default()
    }
}

fn random_file(dir: &Path, len: usize) -> (std::path::PathBuf, Vec<u8>) {
    // xorshift: deterministic, non-repeating enough to catch reordering or loss.
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut data = Vec::with_capacity(len);
    while data.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        data.extend_from_slice(&state.to_le_bytes());
    }
    data.truncate(len);
    let path = dir.join("payload");
    std::fs::File::create(&path)
        .unwrap()
        .write_all(&data)
        .unwrap();
    (path, data)
}

#[tokio::test]
async fn sixty_four_mib_arrive_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = random_file(dir.path(), 64 << 20);
    let running = spawn(&spec(&["cat", path.to_str().unwrap()]), capture()).unwrap();
    let out = running.wait_with_output().await.unwrap();
    assert_eq!(out.outcome, ExitOutcome::Exited(0));
    assert_eq!(out.stdout.len(), data.len());
    assert!(out.stdout == data, "stdout differs from the payload");
    assert!(!out.drain_cut_short);
}

#[tokio::test]
async fn interleaved_streams_are_separated() {
    let running = spawn(
        &spec(&[
            "sh",
            "-c",
            "for i in 1 2 3; do echo out$i; echo err$i >&2; done",
        ]),
        capture(),
    )
    .unwrap();
    let out = running.wait_with_output().await.unwrap();
    assert_eq!(out.stdout, b"out1\nout2\nout3\n");
    assert_eq!(out.stderr, b"err1\nerr2\nerr3\n");
}

#[tokio::test]
async fn lossless_path_applies_backpressure_and_stays_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = random_file(dir.path(), 16 << 20);
    let limits = OutputLimits {
        capacity: 4,
        chunk_size: 16 * 1024,
        observer_capacity: 4,
    };
    let mut running = spawn(
        &spec(&["cat", path.to_str().unwrap()]),
        SpawnOptions {
            stdin: StdinMode::Null,
            output: OutputMode::Capture(limits),
            ..SpawnOptions::default()
        },
    )
    .unwrap();
    let mut rx = running.take_output().unwrap();
    // A lagging observer that is never read must not slow or block anything.
    let mut observer = running.observer().subscribe();

    // Nobody reads the lossless path for a while: the child must be blocked, not finished,
    // because 16 MiB cannot fit in 4 chunks plus a (≤ 1 MiB) pipe.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        alive(running.pid().as_raw()),
        "the producer finished although nobody consumed: output was buffered without bound"
    );
    let mut got = Vec::with_capacity(data.len());
    let mut max_chunk = 0;
    let reader = async {
        while let Some(chunk) = rx.recv().await {
            assert_eq!(chunk.stream, StreamKind::Stdout);
            max_chunk = max_chunk.max(chunk.data.len());
            got.extend_from_slice(&chunk.data);
        }
    };
    let (_, outcome) = tokio::join!(reader, running.wait());
    assert_eq!(outcome.unwrap(), ExitOutcome::Exited(0));
    assert!(got == data, "lossless path lost or reordered bytes");
    assert!(max_chunk <= limits.chunk_size);
    // The observer lagged (it was never read) and says so rather than blocking.
    match observer.try_recv() {
        Err(tokio::sync::broadcast::error::TryRecvError::Lagged(n)) => assert!(n > 0),
        other => panic!("observer should report lag, got {other:?}"),
    }
}

#[tokio::test]
async fn descendant_holding_the_pipe_does_not_stall_wait_and_is_killed() {
    let started = Instant::now();
    let running = spawn(
        &spec(&["sh", "-c", "sleep 100 & echo $!; exit 0"]),
        SpawnOptions {
            drain_timeout: Duration::from_millis(200),
            kill_grace: Duration::from_millis(500),
            ..capture()
        },
    )
    .unwrap();
    let out = running.wait_with_output().await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(out.outcome, ExitOutcome::Exited(0));
    assert!(out.drain_cut_short, "the sleeper holds stdout open");
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    let sleeper: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(
        wait_dead(sleeper, Duration::from_secs(5)),
        "background sleep {sleeper} survived the run"
    );
}

#[tokio::test]
async fn deadline_applies_after_output_closed_early() {
    let started = Instant::now();
    let mut s = spec(&["sh", "-c", "exec >&- 2>&-; sleep 100"]);
    s.timeout = Some(Duration::from_millis(500));
    let running = spawn(
        &s,
        SpawnOptions {
            kill_grace: Duration::from_millis(200),
            ..capture()
        },
    )
    .unwrap();
    let pid = running.pid().as_raw();
    let out = running.wait_with_output().await.unwrap();
    assert!(matches!(out.outcome, ExitOutcome::TimedOut(_)), "{out:?}");
    assert_eq!(out.outcome.code(), 124);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(wait_dead(pid, Duration::from_secs(5)));
}

#[tokio::test]
async fn timeout_kills_every_descendant_in_the_group() {
    let mut s = spec(&[
        "sh",
        "-c",
        "sleep 100 & echo $!; sh -c 'sleep 100 & echo $!; wait' & wait",
    ]);
    s.timeout = Some(Duration::from_millis(500));
    let mut running = spawn(
        &s,
        SpawnOptions {
            kill_grace: Duration::from_millis(300),
            ..capture()
        },
    )
    .unwrap();
    let mut rx = running.take_output().unwrap();
    let mut pids = Vec::new();
    let mut text = String::new();
    while pids.len() < 2 {
        let chunk = rx
            .recv()
            .await
            .expect("pids are printed before the timeout");
        text.push_str(&String::from_utf8_lossy(&chunk.data));
        pids = text
            .lines()
            .filter_map(|l| l.trim().parse::<i32>().ok())
            .collect();
    }
    let outcome = running.wait().await.unwrap();
    assert!(matches!(outcome, ExitOutcome::TimedOut(_)));
    for pid in pids {
        assert!(
            wait_dead(pid, Duration::from_secs(5)),
            "descendant {pid} survived"
        );
    }
}

#[tokio::test]
async fn dropping_a_run_kills_its_group() {
    let mut running = spawn(&spec(&["sh", "-c", "sleep 100 & echo $!; wait"]), capture()).unwrap();
    let mut rx = running.take_output().unwrap();
    let chunk = rx.recv().await.unwrap();
    let sleeper: i32 = String::from_utf8_lossy(&chunk.data).trim().parse().unwrap();
    let leader = running.pid().as_raw();
    drop(running);
    assert!(
        wait_dead(sleeper, Duration::from_secs(5)),
        "sleep survived the drop"
    );
    assert!(
        wait_dead(leader, Duration::from_secs(5)),
        "leader survived the drop"
    );
}

#[tokio::test]
async fn child_leads_a_new_session_without_a_terminal() {
    let running = spawn(&spec(&["cat", "/proc/self/stat"]), capture()).unwrap();
    let pid = running.pid().as_raw();
    let out = running.wait_with_output().await.unwrap();
    let stat = String::from_utf8(out.stdout).unwrap();
    // Fields after the command name: state ppid pgrp session tty_nr …
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    let (pgrp, session, tty_nr) = (fields[2], fields[3], fields[4]);
    assert_eq!(pgrp, pid.to_string(), "own process group");
    assert_eq!(session, pid.to_string(), "own session");
    assert_eq!(tty_nr, "0", "no controlling terminal");
}

#[tokio::test]
async fn stdin_is_piped_through() {
    let mut running = spawn(
        &spec(&["tr", "a-z", "A-Z"]),
        SpawnOptions {
            stdin: StdinMode::Piped,
            ..capture()
        },
    )
    .unwrap();
    let mut stdin = running.take_stdin().unwrap();
    use tokio::io::AsyncWriteExt;
    stdin.write_all(b"hello sandbox\n").await.unwrap();
    drop(stdin);
    let out = running.wait_with_output().await.unwrap();
    assert_eq!(out.stdout, b"HELLO SANDBOX\n");
}

#[tokio::test]
async fn typed_errors_for_missing_and_non_executable() {
    let err = spawn(&spec(&["definitely-not-a-command-x"]), capture())
        .err()
        .unwrap();
    assert_eq!(err.exit_code(), 127, "{err}");
    assert!(err.to_string().contains("definitely-not-a-command-x"));
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.txt");
    std::fs::write(&data, "not a program").unwrap();
    let err = spawn(&spec(&[data.to_str().unwrap()]), capture())
        .err()
        .unwrap();
    assert_eq!(err.exit_code(), 126, "{err}");
    let mut s = spec(&["true"]);
    s.cwd = "/definitely/not/here".into();
    let err = spawn(&s, capture()).err().unwrap();
    assert_eq!(err.exit_code(), 125, "{err}");
    assert!(err.to_string().contains("/definitely/not/here"), "{err}");
}

#[tokio::test]
async fn failing_child_setup_is_a_setup_error_and_nothing_runs() {
    struct Refuse;
    impl sandbox_exec::ChildSetup for Refuse {
        fn apply_in_child(&self) -> Result<(), sandbox_exec::SetupFailure> {
            Err(sandbox_exec::SetupFailure {
                step: sandbox_exec::SetupStep::SeccompLoad,
                errno: nix::errno::Errno::ENOENT,
                detail: 0,
            })
        }
        fn name(&self) -> &str {
            "test-setup"
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let err = spawn(
        &spec(&["touch", marker.to_str().unwrap()]),
        SpawnOptions {
            setup: Some(std::sync::Arc::new(Refuse)),
            ..capture()
        },
    )
    .err()
    .unwrap();
    // ENOENT from setup must not be mistaken for "command not found".
    assert_eq!(err.exit_code(), 125, "{err}");
    // The message names the setup, the step that failed and its errno.
    let text = err.to_string();
    assert!(text.contains("test-setup"), "{err}");
    assert!(text.contains("loading the seccomp filter"), "{err}");
    assert!(text.contains("No such file or directory"), "{err}");
    assert!(!marker.exists(), "the command ran although setup failed");
}

#[tokio::test]
async fn signal_exit_is_128_plus_n() {
    let mut running = spawn(&spec(&["sh", "-c", "kill -TERM $$"]), capture()).unwrap();
    let outcome = running.wait().await.unwrap();
    assert_eq!(outcome, ExitOutcome::Signaled(15));
    assert_eq!(outcome.code(), 143);
}
