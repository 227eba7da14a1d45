//! The `network` family: the network under --block-net, and abstract unix sockets.

use std::net::UdpSocket;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::fixture::{rand_suffix, Fixture};
use super::harness::{accepted, block_net_flags, free_listener, judge, Attack, Verdict, MARK};

/// A connection to an abstract unix socket the test listens on outside, from inside a run
/// with `flags`.
pub(super) fn abstract_socket_attack(f: &Fixture, b: &str, flags: &[String]) -> Verdict {
    let name = format!("sandbox-escape-{}-{}", std::process::id(), rand_suffix());
    let addr =
        <SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(name.as_bytes())
            .unwrap();
    let listener = UnixListener::bind_addr(&addr).unwrap();
    listener.set_nonblocking(true).unwrap();
    let script = format!(
        "echo {MARK}; /usr/bin/python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('\\0{name}'); s.send(b'pwned')\""
    );
    let out = f.run(b, flags, &script);
    let reached = listener.accept().is_ok();
    judge(&out, reached, "abstract socket reached")
}

/// The network under --block-net, and abstract unix sockets.
pub(super) fn network_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "connect to an abstract unix socket outside",
            needs: Some("/usr/bin/python3"),
            run: |f, b| abstract_socket_attack(f, b, &[]),
        },
        Attack {
            name: "TCP connect to a port not allowed under --block-net",
            needs: Some("/bin/bash"),
            run: |f, b| {
                let allowed = free_listener();
                let target = free_listener();
                let port = target.local_addr().unwrap().port();
                let flags = block_net_flags(allowed.local_addr().unwrap().port());
                let out = f.run(
                    b,
                    &flags,
                    &format!("echo {MARK}; bash -c 'echo pwned > /dev/tcp/127.0.0.1/{port}'"),
                );
                judge(&out, accepted(&target).is_some(), "forbidden port reached")
            },
        },
        Attack {
            name: "UDP send under --block-net",
            needs: Some("/bin/bash"),
            run: |f, b| {
                let allowed = free_listener();
                let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
                sink.set_read_timeout(Some(Duration::from_millis(300)))
                    .unwrap();
                let port = sink.local_addr().unwrap().port();
                let flags = block_net_flags(allowed.local_addr().unwrap().port());
                let out = f.run(
                    b,
                    &flags,
                    &format!("echo {MARK}; bash -c 'echo pwned > /dev/udp/127.0.0.1/{port}'"),
                );
                let mut buf = [0u8; 64];
                judge(&out, sink.recv(&mut buf).is_ok(), "UDP datagram arrived")
            },
        },
        Attack {
            name: "UDP through the x32 syscall ABI under --block-net",
            needs: Some("/usr/bin/gcc"),
            run: |f, b| {
                // Per-number seccomp rules do not match x32 numbers (nr | 0x40000000), which
                // share x86_64's audit arch; the filter refuses them all. Observable only on a
                // kernel built with x32 support: probe it outside the sandbox first.
                let Some(program) = x32_udp_program(f) else {
                    return Verdict::Skipped("x32-abi", "not an x86_64 build".into());
                };
                let allowed = free_listener();
                let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
                sink.set_read_timeout(Some(Duration::from_millis(300)))
                    .unwrap();
                let port = sink.local_addr().unwrap().port().to_string();
                let probe = Command::new(&program).arg(&port).output().unwrap();
                let mut buf = [0u8; 64];
                if !probe.status.success() || sink.recv(&mut buf).is_err() {
                    return Verdict::Skipped(
                        "x32-abi",
                        format!(
                            "this kernel has no x32 ABI (CONFIG_X86_X32_ABI): {}",
                            String::from_utf8_lossy(&probe.stdout).trim()
                        ),
                    );
                }
                let flags = block_net_flags(allowed.local_addr().unwrap().port());
                let out = f.run(
                    b,
                    &flags,
                    &format!("echo {MARK}; {} {port}", program.display()),
                );
                judge(
                    &out,
                    sink.recv(&mut buf).is_ok(),
                    "x32 UDP datagram arrived",
                )
            },
        },
    ]
}

/// Builds (with the host's gcc, outside the sandbox) a program that sends one UDP datagram to
/// 127.0.0.1:<argv[1]> using only x32-ABI syscall numbers. It lives in the worktree so every
/// backend may run it. `None` off x86_64, where there is no x32 ABI.
fn x32_udp_program(f: &Fixture) -> Option<PathBuf> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    let source = f.outside.join("x32_udp.c");
    std::fs::write(
        &source,
        r#"#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#define X32(nr) (0x40000000L | (nr))
int main(int argc, char **argv) {
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    long fd = syscall(X32(SYS_socket), AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) { printf("x32 socket: %s\n", strerror(errno)); return 1; }
    long n = syscall(X32(SYS_sendto), fd, "pwned", 5, 0, &to, sizeof to);
    if (n < 0) { printf("x32 sendto: %s\n", strerror(errno)); return 1; }
    puts("sent");
    return 0;
}
"#,
    )
    .unwrap();
    let program = f.task.join("x32_udp");
    let out = Command::new("gcc")
        .arg("-o")
        .arg(&program)
        .arg(&source)
        .output()
        .unwrap();
    assert!(out.status.success(), "gcc: {}", crate::common::text(&out));
    Some(program)
}
