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

async fn tunnel(proxy: SocketAddr, target: &str) -> TcpStream {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).await.unwrap();
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

#[derive(Clone, Copy)]
enum Path<'a> {
    Direct(u16),
    Proxy(SocketAddr, &'a str),
}

async fn open(path: Path<'_>) -> TcpStream {
    match path {
        Path::Direct(port) => {
            let s = TcpStream::connect((LOOPBACK, port)).await.unwrap();
            s.set_nodelay(true).unwrap();
            s
        }
        Path::Proxy(proxy, target) => tunnel(proxy, target).await,
    }
}

async fn ping_once(path: Path<'_>) -> Duration {
    let start = Instant::now();
    let mut s = open(path).await;
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
    let mut s = open(path).await;
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
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
fn on_thread<T, F, Fut>(start: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
{
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            tx.send(start().await).unwrap();
            std::future::pending::<()>().await;
        });
    });
    rx.recv().unwrap()
}

fn main() {
    let (ping, big) = on_thread(|| async { (ping_server().await, download_server().await) });
    let proxy = Proxy::new(
        AllowList::parse(["127.0.0.1", "localhost"]).unwrap(),
        Resolver::System,
    );
    let serving = proxy.clone();
    let addr = on_thread(move || async move {
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
            direct.push(download(Path::Direct(big)).await);
            proxied.push(download(Path::Proxy(addr, &target)).await);
        }
        direct.sort_by(f64::total_cmp);
        proxied.sort_by(f64::total_cmp);
        let (d, p) = (direct[ROUNDS / 2], proxied[ROUNDS / 2]);
        println!("  direct   {d:.0} MiB/s");
        println!("  proxy    {p:.0} MiB/s  ({:.0} % of direct)", p / d * 100.0);
        let log = proxy.wait_for_log(2 * (CONNECTIONS + WARM_UP) + ROUNDS).await;
        assert!(log.iter().all(|c| c.allowed && c.error.is_none()));
    });
}
