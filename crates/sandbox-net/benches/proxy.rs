//! What the proxy costs, against a direct connection in the same run, on loopback:
//!
//! * per-connection latency: connect, one byte there and back, close — directly, through a
//!   `CONNECT` to a listed IP literal (the proxy's own work), and through a `CONNECT` to a
//!   listed name resolved by the system resolver (`localhost`, from `/etc/hosts`);
//! * throughput of one large download (512 MiB) directly and through a `CONNECT` tunnel.
//!
//!     cargo bench -p sandbox-net --bench proxy

// A panic is how a test or a benchmark reports failure; the workspace lints against
// unwrap/expect apply to shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use sandbox_net::{AllowList, Proxy, Resolver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const CONNECTIONS: usize = 2000;
const WARM_UP: usize = 100;
const DOWNLOAD: u64 = 512 << 20;
const ROUNDS: usize = 3;

/// Answers one byte with one byte, then waits for the client to close.
async fn ping_server() -> u16 {
    let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let mut b = [0u8; 1];
                if s.read_exact(&mut b).await.is_ok() {
                    let _ = s.write_all(&b).await;
                    let mut rest = Vec::new();
                    let _ = s.read_to_end(&mut rest).await;
                }
            });
        }
    });
    port
}

/// Sends DOWNLOAD bytes to each connection, then closes.
async fn download_server() -> u16 {
    let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let chunk = vec![7u8; 256 * 1024];
                let mut left = DOWNLOAD;
                while left > 0 {
                    let n = left.min(chunk.len() as u64) as usize;
                    if s.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    left -= n as u64;
                }
            });
        }
    });
    port
}

/// A tunnel, and how many bytes of the server's came with the proxy's answer head.
async fn tunnel(proxy: SocketAddr, target: &str) -> (TcpStream, usize) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    // Read in bulk, as a real client does (reading the head byte by byte, as this bench
    // once did, timed the client's own syscalls); the server's first bytes may follow it.
    let mut head = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk).await.unwrap();
        assert!(
            n > 0,
            "the proxy closed: {}",
            String::from_utf8_lossy(&head)
        );
        head.extend_from_slice(&chunk[..n]);
    };
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    (s, head.len() - end)
}

#[derive(Clone, Copy)]
enum Path<'a> {
    Direct(u16),
    Proxy(SocketAddr, &'a str),
}

async fn open(path: Path<'_>) -> (TcpStream, usize) {
    match path {
        Path::Direct(port) => {
            let s = TcpStream::connect((LOOPBACK, port)).await.unwrap();
            s.set_nodelay(true).unwrap();
            (s, 0)
        }
        Path::Proxy(proxy, target) => tunnel(proxy, target).await,
    }
}

async fn ping_once(path: Path<'_>) -> Duration {
    let start = Instant::now();
    let (mut s, _) = open(path).await;
    s.write_all(b"p").await.unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).await.unwrap();
    let took = start.elapsed();
    drop(s);
    took
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn latency(path: Path<'_>) -> (Duration, Duration) {
    for _ in 0..WARM_UP {
        ping_once(path).await;
    }
    let mut times = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        times.push(ping_once(path).await);
    }
    times.sort();
    (percentile(&times, 0.5), percentile(&times, 0.99))
}

async fn download(path: Path<'_>) -> f64 {
    let (mut s, early) = open(path).await;
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = early as u64;
    let start = Instant::now();
    loop {
        let n = s.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(total, DOWNLOAD);
    total as f64 / secs / f64::from(1 << 20)
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// A thread of its own with a current-thread runtime, as the supervisor's proxy and the
/// servers are other processes in real use; returns what `start` returned.
fn on_thread<T, F, Fut>(name: &str, start: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
{
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                tx.send(start().await).unwrap();
                std::future::pending::<()>().await;
            });
        });
    spawned.unwrap();
    rx.recv().unwrap()
}

/// CPU time each named thread of this process has used (`/proc/self/task/*/schedstat`,
/// nanoseconds on the CPU), by thread name. Per byte, it depends far less on what else the
/// machine runs than throughput does.
fn thread_cpu() -> Vec<(String, String, u64)> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for task in tasks.flatten() {
        let path = task.path();
        let tid = task.file_name().to_string_lossy().into_owned();
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        let ns = std::fs::read_to_string(path.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        out.push((tid, name.trim().to_owned(), ns));
    }
    out
}

/// CPU nanoseconds per MiB of each thread (server, proxy, client) over `f`.
async fn cpu_per_mib<F: std::future::Future<Output = f64>>(f: F) -> (f64, Vec<(String, f64)>) {
    let before = thread_cpu();
    let rate = f.await;
    let after = thread_cpu();
    let mib = (DOWNLOAD >> 20) as f64;
    // By thread id (the resolver's helper threads share a name), summed by name.
    let mut per: Vec<(String, f64)> = Vec::new();
    for (tid, name, ns) in &after {
        let was = before
            .iter()
            .find(|(t, _, _)| t == tid)
            .map_or(0, |(_, _, b)| *b);
        let used = ns.saturating_sub(was) as f64 / mib;
        match per.iter_mut().find(|(n, _)| n == name) {
            Some((_, sum)) => *sum += used,
            None => per.push((name.clone(), used)),
        }
    }
    per.retain(|(_, ns)| *ns >= 1e3);
    (rate, per)
}

fn main() {
    // The client's thread, by name in the CPU figures.
    let _ = std::fs::write("/proc/thread-self/comm", "bench-client");
    let (ping, big) = on_thread("bench-server", || async {
        (ping_server().await, download_server().await)
    });
    let proxy = Proxy::new(
        AllowList::parse(["127.0.0.1", "localhost"]).unwrap(),
        Resolver::System,
    );
    let serving = proxy.clone();
    let addr = on_thread("bench-proxy", move || async move {
        let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { serving.serve(listener).await });
        addr
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let literal = format!("127.0.0.1:{ping}");
        let named = format!("localhost:{ping}");
        println!("per connection: connect, 1 byte there and back, close; {CONNECTIONS} runs after {WARM_UP} warm-up");
        let (d50, d99) = latency(Path::Direct(ping)).await;
        println!("  direct                         p50 {}  p99 {}", ms(d50), ms(d99));
        let (l50, l99) = latency(Path::Proxy(addr, &literal)).await;
        println!(
            "  proxy, listed IP literal       p50 {}  p99 {}  (+{} at p50)",
            ms(l50),
            ms(l99),
            ms(l50.saturating_sub(d50))
        );
        let (n50, n99) = latency(Path::Proxy(addr, &named)).await;
        println!(
            "  proxy, name (system resolver)  p50 {}  p99 {}  (+{} at p50)",
            ms(n50),
            ms(n99),
            ms(n50.saturating_sub(d50))
        );

        println!("one download of {} MiB, median of {ROUNDS}", DOWNLOAD >> 20);
        let mut direct = Vec::new();
        let mut proxied = Vec::new();
        let target = format!("127.0.0.1:{big}");
        for _ in 0..ROUNDS {
            direct.push(cpu_per_mib(download(Path::Direct(big))).await);
            proxied.push(cpu_per_mib(download(Path::Proxy(addr, &target))).await);
        }
        direct.sort_by(|a, b| a.0.total_cmp(&b.0));
        proxied.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (d, p) = (&direct[ROUNDS / 2], &proxied[ROUNDS / 2]);
        println!("  direct   {:.0} MiB/s", d.0);
        println!("  proxy    {:.0} MiB/s  ({:.0} % of direct)", p.0, p.0 / d.0 * 100.0);
        // On a machine with a core per thread, the busiest thread sets the pace.
        let show = |per: &[(String, f64)]| {
            per.iter()
                .map(|(n, ns)| format!("{n} {:.0} us", ns / 1e3))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let busiest = |per: &[(String, f64)]| per.iter().map(|(_, ns)| *ns).fold(0.0, f64::max);
        println!("  CPU per MiB, direct: {}", show(&d.1));
        println!("  CPU per MiB, proxy:  {}", show(&p.1));
        println!(
            "  with a core per thread: proxy at {:.0} % of direct (busiest thread's CPU per MiB)",
            busiest(&d.1) / busiest(&p.1) * 100.0
        );
        let log = proxy.wait_for_log(2 * (CONNECTIONS + WARM_UP) + ROUNDS).await;
        assert!(log.iter().all(|c| c.allowed && c.error.is_none()));
    });
}
