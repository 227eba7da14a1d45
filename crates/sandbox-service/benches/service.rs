//! Service protocol benchmark: request round trip and output-event throughput, each against a
//! baseline measured in the same run.
//!
//! `cargo bench -p sandbox-service --bench service`
//!
//! The daemon runs in this process (on its own threads, exactly `daemon::run`), and the
//! benchmark talks to it through its real Unix socket with the blocking [`Client`].
//!
//! * round trip: `box.list` on an empty registry, sequentially; baseline: one JSON line
//!   echoed by a thread over a plain Unix socket pair.
//! * throughput: a native box runs a command that writes N bytes; measured at the client, as
//!   decoded payload bytes per second until the `exit` event. Baseline: the same command
//!   read from a plain pipe in 64 KiB reads.

// A panic is how a test or a benchmark reports failure; the workspace lints against
// unwrap/expect apply to shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_host::assembly::Defaults;
use sandbox_service::daemon::{self, DaemonOptions};
use sandbox_service::{Client, RuntimePaths};
use serde_json::json;

use sandbox_testkit::req;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let paths = RuntimePaths::new(dir.path().join("run"));
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let opts = DaemonOptions {
        runtime: paths.clone(),
        hook_port: None,
        defaults: Defaults::default(),
        kill_grace: Duration::from_secs(2),
        backend: Default::default(),
        backends: sandbox_host::Backends::builtin(),
        box_tmp_root: Some(dir.path().to_path_buf()),
        boxlite_home: dir.path().join("boxlite"),
        boxlite_ready_timeout: None,
        idle_exit: None,
    };
    std::thread::spawn(move || daemon::run(opts).unwrap());
    let mut client = loop {
        match Client::connect_authenticated(&paths, "bench") {
            Ok(c) => break c,
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    };

    // --- round trip ---------------------------------------------------------------------
    let n = 20_000;
    let list = req("box.list", json!({}));
    for _ in 0..2_000 {
        client.call(&list).unwrap();
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        client.call(&list).unwrap();
        samples.push(t.elapsed());
    }
    samples.sort();

    let (mut a, b) = UnixStream::pair().unwrap();
    std::thread::spawn(move || {
        let mut r = BufReader::new(b.try_clone().unwrap());
        let mut w = b;
        let mut line = String::new();
        while r.read_line(&mut line).unwrap_or(0) > 0 {
            w.write_all(line.as_bytes()).unwrap();
            line.clear();
        }
    });
    let mut ar = BufReader::new(a.try_clone().unwrap());
    let frame = b"{\"id\":1,\"method\":\"box.list\",\"params\":{}}\n";
    let mut base = Vec::with_capacity(n);
    let mut line = String::new();
    for i in 0..n + 2_000 {
        let t = Instant::now();
        a.write_all(frame).unwrap();
        line.clear();
        ar.read_line(&mut line).unwrap();
        if i >= 2_000 {
            base.push(t.elapsed());
        }
    }
    base.sort();
    println!("## round trip ({n} sequential requests after 2000 warm-up)");
    println!("| | p50 | p99 | max |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| `box.list` through the daemon | {} | {} | {} |",
        us(percentile(&samples, 0.5)),
        us(percentile(&samples, 0.99)),
        us(*samples.last().unwrap())
    );
    println!(
        "| baseline: echo over a Unix socket pair | {} | {} | {} |",
        us(percentile(&base, 0.5)),
        us(percentile(&base, 0.99)),
        us(*base.last().unwrap())
    );

    // --- throughput ---------------------------------------------------------------------
    client
        .call(&req(
            "box.create",
            json!({"name": "bench", "workdir": work}),
        ))
        .unwrap();
    client
        .call(&req("box.start", json!({"name": "bench"})))
        .unwrap();
    let size: u64 = 512 << 20;
    let text = format!(
        "yes 'the quick brown fox jumps over the lazy dog 0123456789 ABCDEFGHIJ' | head -c {size}"
    );
    // Random bytes prepared up front (a xorshift stream, not valid UTF-8), so the producer is
    // `cat` from the page cache rather than /dev/urandom, which is slower than the path
    // under test.
    let random = work.join("random.bin");
    write_random(&random, (size / 2) as usize);
    let binary = format!("cat '{}'", random.display());
    println!();
    println!("## output events");
    println!("| stream | bytes | through the daemon | plain pipe | ratio |");
    println!("| --- | --- | --- | --- | --- |");
    for (label, script, bytes) in [
        ("text (UTF-8 → JSON string)", &text, size),
        ("binary (random bytes → base64)", &binary, size / 2),
    ] {
        let mut via = Vec::new();
        let mut plain = Vec::new();
        for _ in 0..3 {
            via.push(through_daemon(&mut client, script, bytes));
            plain.push(through_pipe(script, bytes));
        }
        via.sort_by(f64::total_cmp);
        plain.sort_by(f64::total_cmp);
        println!(
            "| {label} | {} MiB | {:.0} MB/s | {:.0} MB/s | {:.2} |",
            bytes >> 20,
            via[1],
            plain[1],
            via[1] / plain[1]
        );
    }
    client.call(&req("shutdown", json!({}))).unwrap();
}

fn write_random(path: &std::path::Path, len: usize) {
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    let mut data = Vec::with_capacity(len);
    while data.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        data.extend_from_slice(&state.to_le_bytes());
    }
    data.truncate(len);
    std::fs::write(path, data).unwrap();
}

/// MB/s of payload received at the client (median of 3 is taken by the caller).
fn through_daemon(client: &mut Client, script: &str, expect: u64) -> f64 {
    let t = Instant::now();
    let reply = client
        .call(&req(
            "box.exec",
            json!({"name": "bench", "command": "sh", "args": ["-c", script], "stdin": false}),
        ))
        .unwrap();
    let id = reply["execId"].as_u64().unwrap();
    let mut got = 0u64;
    loop {
        let e = client.next_event().unwrap();
        if e.exec_id != Some(id) {
            continue;
        }
        match e.kind.as_deref() {
            Some("output") => got += e.output_bytes().unwrap().len() as u64,
            Some("exit") => break,
            _ => {}
        }
    }
    assert_eq!(got, expect, "lost bytes");
    got as f64 / t.elapsed().as_secs_f64() / 1e6
}

fn through_pipe(script: &str, expect: u64) -> f64 {
    let t = Instant::now();
    let mut child = Command::new("sh")
        .args(["-c", script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0u64;
    loop {
        let n = out.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    child.wait().unwrap();
    assert_eq!(got, expect);
    got as f64 / t.elapsed().as_secs_f64() / 1e6
}
