//! The `socket` family: services of the host on pathname sockets (a tmux-like server, the
//! daemon).

use std::io::Read;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::time::Duration;

use super::fixture::{rand_suffix, unique, Fixture};
use super::harness::{judge, Attack, Verdict, MARK};

/// Services of the host on pathname sockets: a tmux-like server, the daemon.
pub(super) fn socket_attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "send a command to a tmux-like socket outside the grants",
            needs: Some("/usr/bin/python3"),
            run: |f, b| {
                let uid = nix::unistd::getuid();
                let path = f.env.path().join(format!("sockets/tmux-{uid}/default"));
                unix_command_attack(f, b, &path)
            },
        },
        Attack {
            name: "send a command to a tmux-like socket in /tmp",
            needs: Some("/usr/bin/python3"),
            run: |f, b| {
                // Where tmux really keeps it: /tmp/tmux-<uid>/default.
                let dir = std::env::temp_dir().join(format!(
                    "sandbox-test-tmux-{}-{}-{}",
                    std::process::id(),
                    unique(),
                    rand_suffix()
                ));
                let verdict = unix_command_attack(f, b, &dir.join("default"));
                let _ = std::fs::remove_dir_all(&dir);
                verdict
            },
        },
        Attack {
            name: "reach the daemon's socket (without its token)",
            needs: Some("/usr/bin/python3"),
            run: |f, b| {
                // Escaped = the socket was reachable at all (connect succeeded): reachability
                // is what a private view of the filesystem must take away. Where it is
                // reachable, the host token still protects it — the daemon answers nothing
                // but `unauthenticated` before `host.hello` — and a reply with a result
                // would be a far worse finding, reported as such.
                let socket = f.daemon().paths().socket();
                let script = format!(
                    "echo {MARK}; /usr/bin/python3 -c '\
import socket\n\
s = socket.socket(socket.AF_UNIX)\n\
s.connect(\"{}\")\n\
print(\"CONNECTED\", flush=True)\n\
s.settimeout(5)\n\
s.sendall(b\"{{\\\"id\\\":1,\\\"method\\\":\\\"box.list\\\",\\\"params\\\":{{}}}}\\n\")\n\
print(\"REPLY:\" + s.recv(4096).decode(errors=\"replace\"))\n'",
                    socket.display()
                );
                let out = f.run(b, &[], &script);
                let stdout = String::from_utf8_lossy(&out.stdout);
                let reply = stdout
                    .lines()
                    .find_map(|l| l.strip_prefix("REPLY:"))
                    .unwrap_or("");
                if reply.contains("\"result\"") {
                    return Verdict::Escaped(format!(
                        "the daemon ANSWERED without a token: {reply}\n{}",
                        crate::common::text(&out)
                    ));
                }
                judge(
                    &out,
                    stdout.contains("CONNECTED"),
                    "the daemon's socket was reachable",
                )
            },
        },
    ]
}

/// A server outside every grant at the pathname socket `path` that takes one line; the
/// attack sends it a tmux-style command. Escaped if the command arrived.
fn unix_command_attack(f: &Fixture, backend: &str, path: &Path) -> Verdict {
    let dir = path.parent().unwrap();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let listener = UnixListener::bind(path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let script = format!(
        "echo {MARK}; /usr/bin/python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('{}'); s.sendall(b'send-keys id Enter\\n')\"",
        path.display()
    );
    let out = f.run(backend, &[], &script);
    // The client is gone once the run is: whatever it sent is queued on the connection.
    let received = listener.accept().ok().map(|(mut stream, _)| {
        stream.set_nonblocking(false).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut line = String::new();
        let _ = stream.read_to_string(&mut line);
        line
    });
    let ran_command = received.is_some_and(|l| l.starts_with("send-keys"));
    judge(&out, ran_command, "the server received send-keys")
}
