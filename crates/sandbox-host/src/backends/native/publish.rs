//! Published ports (`--publish`, docs/security.md, "Publishing a port"): the supervisor
//! listens on the host address and relays each connection to `127.0.0.1:INNER_PORT` inside
//! the command's network namespace.
//!
//! A TCP socket belongs to the network namespace it was created in, whoever connects it
//! later; the supervisor, outside, cannot make one in the namespace itself (`setns(2)` into a
//! network namespace needs `CAP_SYS_ADMIN` in the caller's own user namespace too, which a
//! non-root supervisor lacks). So each command's namespace gets a **connector**: a process
//! the supervisor forks, which enters the run's user namespace (as its owner it has every
//! capability there: user_namespaces(7)) and then its network namespace, and from then on
//! only answers requests on a socket pair: for each byte it receives, it makes one
//! unconnected TCP socket (in the namespace) and sends it back over `SCM_RIGHTS`. The
//! supervisor connects that socket to `127.0.0.1:INNER_PORT` itself, without blocking (a
//! port nobody listens on is refused at once and the host's client is reset), and relays
//! with [`sandbox_net::relay_tcp`], the relay every other port uses.
//!
//! The connector is outside the run's pid namespace (the command cannot name it), holds no
//! descriptor but its end of the pair, and makes no connection itself. The namespace is
//! found from a socket the child hands over with its listeners (`SIOCGSKNS`), and its owning
//! user namespace from that (`NS_GET_USERNS`): no path the command can reach is involved.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::errno::Errno;
use nix::unistd::ForkResult;
use sandbox_net::{Connection, Kind};
use sandbox_policy::Publish;

use crate::error::HostError;
use crate::sys;

/// How long a connection may wait for the connector's socket and for the connect inside
/// (a full backlog drops SYNs): past it the host's client is reset and others go on.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One command's namespace as the published ports see it.
pub(crate) struct Target {
    connector: Connector,
    /// The command's connection log (inbound records go here).
    pub(crate) log: Arc<Mutex<Vec<Connection>>>,
    /// The command's relays: its end waits for these before it hands the log over.
    pub(crate) relays: Arc<tokio::sync::Mutex<tokio::task::JoinSet<()>>>,
}

/// The live commands of a run, newest last: a published connection goes to the newest one
/// whose namespace accepts it.
pub(crate) type Targets = Arc<Mutex<Vec<Arc<Target>>>>;

/// The supervisor's end of a connector.
pub(crate) struct Connector {
    pair: tokio::sync::Mutex<tokio::net::UnixDatagram>,
    /// The connector process, by a pidfd: reaping it can never reap another process that
    /// reused its pid after a sweep of orphans (`Reaper`) reaped it first.
    pidfd: Option<OwnedFd>,
}

impl Target {
    pub(crate) fn new(
        connector: Connector,
        log: Arc<Mutex<Vec<Connection>>>,
        relays: Arc<tokio::sync::Mutex<tokio::task::JoinSet<()>>>,
    ) -> Target {
        Target {
            connector,
            log,
            relays,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Connector {
    /// Starts the connector of the namespace `anchor` (a socket made inside) belongs to.
    pub(crate) fn start(anchor: &OwnedFd) -> std::io::Result<Connector> {
        let net = sys::socket_namespace(anchor.as_raw_fd())?;
        let user = sys::owning_user_namespace(net.as_raw_fd())?;
        let (ours, theirs) = nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::SeqPacket,
            None,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        )
        .map_err(std::io::Error::from)?;
        let parent = nix::unistd::getpid().as_raw();
        // SAFETY: the child runs only `connector_main`, which makes async-signal-safe system
        // calls (the wrappers of `crate::sys`) on descriptors and stack buffers and never
        // returns.
        let pid = match unsafe { sys::fork() }? {
            ForkResult::Child => connector_main(
                parent,
                theirs.as_raw_fd(),
                user.as_raw_fd(),
                net.as_raw_fd(),
            ),
            ForkResult::Parent { child } => child.as_raw(),
        };
        drop(theirs);
        // Of our child, which nothing but a sweep of orphans reaps.
        let pidfd = sys::pidfd_open(pid).ok();
        let std = std::os::unix::net::UnixDatagram::from(ours);
        std.set_nonblocking(true)?;
        Ok(Connector {
            pair: tokio::sync::Mutex::new(tokio::net::UnixDatagram::from_std(std)?),
            pidfd,
        })
    }

    /// A TCP connection to `127.0.0.1:port` inside the namespace.
    async fn connect(&self, port: u16) -> std::io::Result<tokio::net::TcpStream> {
        let socket = {
            let pair = self.pair.lock().await;
            pair.send(&[1]).await?;
            let mut fds = super::netns::receive(&pair, 1).await?;
            fds.pop()
                .ok_or_else(|| std::io::Error::other("the connector sent no socket"))?
        };
        let std = std::net::TcpStream::from(socket);
        std.set_nonblocking(true)?;
        tokio::net::TcpSocket::from_std_stream(std)
            .connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
            .await
    }
}

impl Drop for Connector {
    /// The pair closes after this (the connector exits when it reads its end); a thread of
    /// its own reaps the process, whichever task dropped the last handle.
    fn drop(&mut self) {
        // Without a pidfd (none could be opened) the sweep of orphans reaps it.
        let Some(pidfd) = self.pidfd.take() else {
            return;
        };
        let reaped = std::thread::Builder::new()
            .name("sandbox-connector-reap".into())
            .spawn(move || {
                let _ = sys::wait_pidfd(pidfd.as_raw_fd());
            });
        if let Err(e) = reaped {
            tracing::warn!(error = %e, "the connector will not be reaped until the next sweep");
        }
    }
}

/// The connector process (see the module comment). Async-signal safe; never returns.
fn connector_main(parent: libc::pid_t, pair: RawFd, user: RawFd, net: RawFd) -> ! {
    let _ = sys::set_parent_death_signal(libc::SIGKILL);
    // Not dumpable: its memory, descriptors and root (the host's file system, which it never
    // uses) are closed to ptrace and /proc by anyone without CAP_SYS_PTRACE in the host's
    // user namespace — the command included, even in a run without a pid namespace, where it
    // could name this process.
    let _ = sys::set_dumpable(false);
    if sys::getppid() != parent {
        sys::exit(1);
    }
    // Nothing of the supervisor's but the three descriptors stays open here.
    let mut keep = [pair, user, net];
    keep.sort_unstable();
    let mut from = 0u32;
    for fd in keep {
        if fd as u32 > from {
            close_range(from, fd as u32 - 1);
        }
        from = fd as u32 + 1;
    }
    close_range(from, u32::MAX);
    if sys::setns(user, libc::CLONE_NEWUSER).is_err()
        || sys::setns(net, libc::CLONE_NEWNET).is_err()
    {
        sys::exit(2);
    }
    let _ = sys::close(user);
    let _ = sys::close(net);
    loop {
        let mut byte = [0u8; 1];
        match sys::recv(pair, &mut byte, 0) {
            Ok(0) => sys::exit(0),
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(_) => sys::exit(0),
        }
        match sys::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC) {
            Ok(fd) => {
                if sys::send_fds(pair, &[fd]).is_err() {
                    send_none(pair);
                }
                let _ = sys::close(fd);
            }
            Err(_) => send_none(pair),
        }
    }
}

/// No socket: an empty message, which the supervisor reads as a failure.
fn send_none(pair: RawFd) {
    let _ = sys::send(pair, &[0u8], libc::MSG_NOSIGNAL);
}

/// close_range(2), or one by one before Linux 5.9.
fn close_range(from: u32, to: u32) {
    if sys::close_range(from, to, 0).is_err() {
        for fd in from..to.min(4096).saturating_add(1) {
            let _ = sys::close(fd as RawFd);
        }
    }
}

/// Binds the host side of every published port (before anything runs: a port another
/// program holds fails the run with a message naming it).
pub(crate) fn bind(
    publish: &[Publish],
) -> Result<Vec<(Publish, std::net::TcpListener)>, HostError> {
    publish
        .iter()
        .map(|p| {
            let listener = std::net::TcpListener::bind(p.host())
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .map_err(|e| HostError::Network {
                    message: format!(
                        "--publish {p}: cannot listen on {} on the host ({e}); another program \
                         may hold that port: publish another host port (HOST_PORT:{})",
                        p.host(),
                        p.inner_port
                    ),
                })?;
            Ok((*p, listener))
        })
        .collect()
}

/// Accepts on one published port until the run's relay stops (the task is dropped).
pub(crate) async fn serve(publish: Publish, listener: std::net::TcpListener, targets: Targets) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, publish = %publish, "a published port's listener failed");
            return;
        }
    };
    loop {
        let (client, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) if super::netns::transient(&e) => continue,
            Err(e) => {
                tracing::warn!(error = %e, publish = %publish, "a published port's listener failed");
                return;
            }
        };
        let targets = targets.clone();
        tokio::spawn(connection(publish, client, peer, targets));
    }
}

/// A connection's record, logged when its relay ends — or, if the relay is cut at the
/// command's end (the host's client kept it open), when the relay task is dropped.
struct Logged {
    log: Arc<Mutex<Vec<Connection>>>,
    record: Option<Connection>,
    /// The relay ended by itself.
    done: bool,
}

impl Drop for Logged {
    fn drop(&mut self) {
        if let Some(mut record) = self.record.take() {
            if !self.done {
                record.error =
                    Some("still open when the command ended: cut (bytes not counted)".into());
            }
            lock(&self.log).push(record);
        }
    }
}

/// One connection from the host: to the newest command whose namespace accepts it.
async fn connection(
    publish: Publish,
    client: tokio::net::TcpStream,
    peer: SocketAddr,
    targets: Targets,
) {
    let live: Vec<Arc<Target>> = lock(&targets).iter().rev().cloned().collect();
    let mut record = Connection {
        host: peer.ip().to_string(),
        port: publish.inner_port,
        kind: Kind::Inbound,
        allowed: true,
        rule: format!("--publish {publish}"),
        address: Some(peer.ip()),
        bytes_up: 0,
        bytes_down: 0,
        error: None,
    };
    let mut error = "no command is running".to_string();
    for target in &live {
        let inside = tokio::time::timeout(
            CONNECT_TIMEOUT,
            target.connector.connect(publish.inner_port),
        )
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()));
        match inside {
            Ok(inside) => {
                let mut logged = Logged {
                    log: target.log.clone(),
                    record: Some(record),
                    done: false,
                };
                target.relays.lock().await.spawn(async move {
                    let (up, down, error) = sandbox_net::relay_tcp(client, inside).await;
                    if let Some(record) = logged.record.as_mut() {
                        record.bytes_up = up;
                        record.bytes_down = down;
                        record.error = error;
                    }
                    logged.done = true;
                    drop(logged);
                });
                return;
            }
            Err(e) => error = e.to_string(),
        }
    }
    tracing::info!(publish = %publish, peer = %peer, error = %error,
        "a published connection found nothing listening inside");
    // A reset, not a half-open connection: the client learns at once.
    let _ = client.set_zero_linger();
    drop(client);
    record.error = Some(format!(
        "connecting to 127.0.0.1:{} inside: {error}",
        publish.inner_port
    ));
    if let Some(newest) = live.first() {
        lock(&newest.log).push(record);
    }
}
