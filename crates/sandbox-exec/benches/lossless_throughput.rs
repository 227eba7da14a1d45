//! 1 GiB through the exec layer's lossless output path, against the same bytes read from a
//! plain pipe, in the same run. Each mode runs in a fresh child process of this benchmark so
//! its peak RSS (VmHWM) is its own.
//!
//!     cargo bench -p sandbox-exec --bench lossless_throughput
//!
//! Prints throughput for both, the ratio, and the peak memory of each process.

// A panic is how a test or a benchmark reports failure; the workspace lints against
// unwrap/expect apply to shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Instant;

use sandbox_exec::{spawn, CommandSpec, OutputLimits, OutputMode, SpawnOptions, StdinMode};

const BYTES: u64 = 1 << 30;
const ROUNDS: usize = 3;

fn producer() -> Vec<String> {
    vec![
        "head".into(),
        "-c".into(),
        BYTES.to_string(),
        "/dev/zero".into(),
    ]
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Baseline: the producer's stdout read by a tight loop from a plain pipe (default 64 KiB
/// kernel buffer, or enlarged to 1 MiB as the exec layer does, for a like-for-like view).
fn plain_pipe(pipe_bytes: Option<i32>) -> (u64, f64) {
    let argv = producer();
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    if let Some(bytes) = pipe_bytes {
        use std::os::fd::AsRawFd;
        // SAFETY: F_SETPIPE_SZ on a pipe fd we own.
        unsafe { libc::fcntl(out.as_raw_fd(), libc::F_SETPIPE_SZ, bytes) };
    }
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    let start = Instant::now();
    loop {
        let n = out.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    child.wait().unwrap();
    (total, secs)
}

/// The exec layer: bounded lossless channel of chunks, consumed as they arrive.
fn lossless() -> (u64, f64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut spec = CommandSpec::argv(producer(), "/").unwrap();
        spec.set_env("PATH", "/usr/bin:/bin");
        let start = Instant::now();
        let mut running = spawn(
            &spec,
            SpawnOptions {
                stdin: StdinMode::Null,
                output: OutputMode::Capture(OutputLimits::default()),
                ..SpawnOptions::default()
            },
        )
        .unwrap();
        let mut rx = running.take_output().unwrap();
        let mut total = 0u64;
        while let Some(chunk) = rx.recv().await {
            total += chunk.data.len() as u64;
        }
        running.wait().await.unwrap();
        (total, start.elapsed().as_secs_f64())
    })
}

fn child_mode(mode: &str) {
    let (total, secs) = match mode {
        "plain" => plain_pipe(None),
        "plain-1m" => plain_pipe(Some(1 << 20)),
        "lossless" => lossless(),
        _ => unreachable!(),
    };
    assert_eq!(total, BYTES, "{mode}: bytes lost");
    println!("{secs} {}", peak_rss_kib());
}

fn run_child(mode: &str) -> (f64, u64) {
    let out = Command::new(std::env::current_exe().unwrap())
        .arg("--child")
        .arg(mode)
        .output()
        .unwrap();
    assert!(out.status.success(), "{mode}: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut parts = text.split_whitespace();
    (
        parts.next().unwrap().parse().unwrap(),
        parts.next().unwrap().parse().unwrap(),
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        return child_mode(&args[i + 1]);
    }
    if args.iter().any(|a| a == "--list") {
        return;
    }
    let limits = OutputLimits::default();
    println!(
        "lossless path: {} MiB through it, capacity {} chunks x {} KiB (bound {} KiB), {ROUNDS} rounds",
        BYTES >> 20,
        limits.capacity,
        limits.chunk_size / 1024,
        limits.max_buffered_bytes() / 1024
    );
    let gib = BYTES as f64 / (1u64 << 30) as f64;
    let best = |mode: &str| {
        let mut runs: Vec<(f64, u64)> = (0..ROUNDS).map(|_| run_child(mode)).collect();
        runs.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
        let median = runs[ROUNDS / 2];
        let peak = runs.iter().map(|r| r.1).max().unwrap();
        println!(
            "{mode:>9}: median {:.3} s = {:.2} GiB/s, peak RSS {} KiB",
            median.0,
            gib / median.0,
            peak
        );
        (median.0, peak)
    };
    let (plain_s, plain_rss) = best("plain");
    let (plain_1m_s, _) = best("plain-1m");
    let (lossless_s, lossless_rss) = best("lossless");
    println!(
        "time ratio lossless/plain: {:.2}x, lossless/plain-1m: {:.2}x; extra peak RSS over plain: {} KiB",
        lossless_s / plain_s,
        lossless_s / plain_1m_s,
        lossless_rss.saturating_sub(plain_rss)
    );
}
