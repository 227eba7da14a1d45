//! The `net` family: the network under --block-net from every door into a connection.

use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::process::{Child, Output, Stdio};

use super::fixture::{Fixture, DAEMON, NATIVE_NOUSERNS, NOUSERNS_WRAPPER};
use super::harness::{block_net_flags, free_listener, judge, Attack, Verdict, MARK};
use super::network::abstract_socket_attack;

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
pub(super) fn net_attacks() -> Vec<Attack> {
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
