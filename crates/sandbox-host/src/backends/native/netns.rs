//! The run's private network namespace (docs/security.md, "The network namespace"): the
//! child's side (bring `lo` up, bind the listeners inside, hand them to the supervisor over
//! `SCM_RIGHTS`) and the supervisor's (accept on them from outside the namespace: relay a
//! port listener to the host's `127.0.0.1:P`, serve the proxy listener with
//! [`sandbox_net::Proxy`]). When the run publishes ports the child also hands over one
//! unconnected socket, by which the supervisor finds the namespace for the published ports'
//! connector (`linux::publish`).
//!
//! The child's functions run between fork and exec: async-signal safe, no allocation (the
//! descriptors go out with `sendmsg(2)` and a control buffer on the stack; nix's `sendmsg`
//! allocates its buffer, so the child does not use it).

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandbox_exec::{SetupFailure, SetupStep};
use sandbox_net::{Connection, Proxy};

use crate::backends::native::net::NetPlan;
use crate::error::HostError;
use crate::sys;

mod sockets;
pub(crate) use sockets::{connect_loopback, listen_loopback, loopback_up};

/// The most listeners one command hands over (the proxy's and every `--allow-port`).
pub const MAX_LISTENERS: usize = 64;

/// How long the end of a command waits for the relays still open (a server that keeps a
/// connection open after the command's side closed) before it cuts them: the log then has
/// every connection that ended by then.
const DRAIN: Duration = Duration::from_secs(3);

/// One command's part of the namespace, in its child: the end of the pair the listeners go
/// out on, and the ports to bind (the proxy's first, when the run has one).
pub struct ChildNet {
    socket: OwnedFd,
    ports: [u16; MAX_LISTENERS],
    count: usize,
    /// Hand over one unconnected socket after the listeners: the supervisor finds the
    /// namespace by it, for the published ports' connector (`linux::publish`).
    anchor: bool,
}

impl ChildNet {
    /// In the child, after the view's `unshare` made the namespace: `lo` up, a listener on
    /// `127.0.0.1:P` for each port, every one sent to the supervisor, our copies closed
    /// (the command never holds one, and its port stays taken). Async-signal safe.
    pub fn apply_in_child(&self) -> Result<(), SetupFailure> {
        loopback_up().map_err(SetupFailure::at(SetupStep::NetLoopback))?;
        let mut fds = [-1 as RawFd; MAX_LISTENERS];
        let mut result = Ok(());
        for (i, port) in self.ports[..self.count].iter().enumerate() {
            match listen_loopback(*port) {
                Ok((fd, _)) => fds[i] = fd,
                Err(errno) => {
                    result = Err(SetupFailure {
                        step: SetupStep::NetListeners,
                        errno,
                        detail: u32::from(*port),
                    });
                    break;
                }
            }
        }
        let mut count = self.count;
        if result.is_ok() && self.anchor {
            match sys::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC) {
                Ok(fd) => {
                    fds[count] = fd;
                    count += 1;
                }
                Err(errno) => {
                    result = Err(SetupFailure {
                        step: SetupStep::NetListeners,
                        errno,
                        detail: 0,
                    })
                }
            }
        }
        if result.is_ok() {
            result = sys::send_fds(self.socket.as_raw_fd(), &fds[..count])
                .map_err(SetupFailure::at(SetupStep::NetListeners));
        }
        for fd in fds.iter().filter(|fd| **fd >= 0) {
            // A listener made above; the supervisor holds its own copy.
            let _ = sys::close(*fd);
        }
        // Our copy of the pair's child end: the command must not hold it. The OwnedFd in the
        // parent's memory keeps its number; the parent closes its own copy.
        let _ = sys::close(self.socket.as_raw_fd());
        result
    }
}

/// The supervisor's side of the namespaces of one run: a runtime on a thread of its own
/// that accepts on every command's listeners and relays.
pub struct NetRelay {
    plan: NetPlan,
    handle: tokio::runtime::Handle,
    /// Dropped with the relay: the thread's runtime then stops, and every listener with it.
    _shutdown: tokio::sync::oneshot::Sender<()>,
    allow: Option<sandbox_net::AllowList>,
    /// The credentials its proxy serves at `/cred/NAME`, read once when the relay starts.
    credentials: Option<sandbox_net::Credentials>,
    /// The live commands the published ports connect into.
    targets: crate::backends::native::publish::Targets,
}

impl std::fmt::Debug for NetRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetRelay")
            .field("plan", &self.plan)
            .finish()
    }
}

impl NetRelay {
    /// The relay of a run whose network plan is `plan`.
    pub fn start(plan: NetPlan) -> Result<NetRelay, HostError> {
        if plan.listeners().len() + 1 > MAX_LISTENERS {
            return Err(HostError::Network {
                message: format!(
                    "{} ports to forward into the network namespace; at most {MAX_LISTENERS}",
                    plan.listeners().len()
                ),
            });
        }
        let allow = plan
            .proxy
            .as_ref()
            .map(|p| sandbox_net::AllowList::parse(&p.allow))
            .transpose()
            .map_err(|e| HostError::Network {
                message: format!("--allow-domain: {e}"),
            })?;
        // The secrets are read here, on the host, and held only by the proxy.
        let credentials = match &plan.proxy {
            Some(p) if !p.credentials.is_empty() => {
                crate::sys::hold_secrets();
                // A host that cannot be used is told on the run's stderr, once per
                // credential: a program that retries would otherwise fail in silence.
                Some(
                    sandbox_net::Credentials::for_run(&p.credentials)?
                        .report_to(|message| eprintln!("{message}")),
                )
            }
            _ => None,
        };
        let fail = |e: std::io::Error| HostError::Network {
            message: format!("starting the network relay: {e}"),
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(fail)?;
        let handle = runtime.handle().clone();
        // The host side of the published ports, before anything runs: a port another
        // program holds fails the run here.
        let published = crate::backends::native::publish::bind(&plan.publish)?;
        let targets = crate::backends::native::publish::Targets::default();
        {
            let _guard = handle.enter();
            for (publish, listener) in published {
                handle.spawn(crate::backends::native::publish::serve(
                    publish,
                    listener,
                    targets.clone(),
                ));
            }
        }
        let (shutdown, until) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("sandbox-net".into())
            .spawn(move || {
                let _ = runtime.block_on(until);
                // Tasks still running (a command's listeners) are dropped here.
                runtime.shutdown_background();
            })
            .map_err(fail)?;
        Ok(NetRelay {
            plan,
            handle,
            _shutdown: shutdown,
            allow,
            credentials,
            targets,
        })
    }

    pub fn plan(&self) -> &NetPlan {
        &self.plan
    }

    /// One command's namespace: the child's part, and the supervisor's (which serves its
    /// listeners from the moment the child sends them until [`CommandNet::finish`]).
    pub fn command(&self) -> Result<(ChildNet, CommandNet), HostError> {
        let fail = |e: std::io::Error| HostError::Network {
            message: format!("creating the socket pair the listeners are handed over on: {e}"),
        };
        let (parent, child) = std::os::unix::net::UnixDatagram::pair().map_err(fail)?;
        parent.set_nonblocking(true).map_err(fail)?;
        let listeners = self.plan.listeners();
        let count = listeners.len();
        let mut ports = [0u16; MAX_LISTENERS];
        for (slot, port) in ports.iter_mut().zip(&listeners) {
            *slot = *port;
        }
        let proxy = self.allow.as_ref().map(|allow| {
            let resolver = self
                .plan
                .proxy
                .as_ref()
                .map(|p| p.resolver.clone())
                .unwrap_or(sandbox_net::Resolver::System);
            let proxy = Proxy::new(allow.clone(), resolver);
            match &self.credentials {
                Some(credentials) => proxy.with_credentials(credentials.clone()),
                None => proxy,
            }
        });
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let (done_tx, done) = std::sync::mpsc::channel();
        let forwarded: Vec<u16> = self.plan.ports.clone();
        let anchor = !self.plan.publish.is_empty();
        let targets = anchor.then(|| self.targets.clone());
        let socket = {
            let _guard = self.handle.enter();
            tokio::net::UnixDatagram::from_std(parent).map_err(fail)?
        };
        self.handle.spawn(async move {
            let log = serve(socket, proxy, forwarded, count, targets, stopped).await;
            let _ = done_tx.send(log);
        });
        Ok((
            ChildNet {
                socket: OwnedFd::from(child),
                ports,
                count,
                anchor,
            },
            CommandNet {
                stop: Mutex::new(Some(stop)),
                done: Mutex::new(Some(done)),
            },
        ))
    }
}

/// The supervisor's handle on one command's namespace, kept with the command until it
/// finished.
#[derive(Debug)]
pub struct CommandNet {
    stop: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    done: Mutex<Option<std::sync::mpsc::Receiver<Vec<Connection>>>>,
}

impl CommandNet {
    /// Once the command's processes are gone: stops accepting, waits (a bounded time) for the
    /// relays still open, closes the listeners (the namespace goes with them), and gives the
    /// proxy's log of every connection. A second call gives nothing.
    pub fn finish(&self) -> Vec<Connection> {
        drop(take(&self.stop));
        take(&self.done)
            .and_then(|done| done.recv_timeout(DRAIN * 2).ok())
            .unwrap_or_default()
    }
}

impl crate::seam::CommandNetwork for CommandNet {
    fn finish(&self) -> Vec<Connection> {
        CommandNet::finish(self)
    }
}

fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
}

/// Receives the command's listeners and serves them until `stopped`; the connection log
/// (the proxy's, then the published ports' inbound connections). With `targets` (the run
/// publishes ports) the child also sent an anchor socket: the command's namespace is a
/// target of the published ports from then until `stopped`.
async fn serve(
    socket: tokio::net::UnixDatagram,
    proxy: Option<Proxy>,
    forwarded: Vec<u16>,
    count: usize,
    targets: Option<crate::backends::native::publish::Targets>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) -> Vec<Connection> {
    let inbound = Arc::new(Mutex::new(Vec::new()));
    let log = |proxy: &Option<Proxy>, inbound: &Mutex<Vec<Connection>>| {
        let mut log = proxy.as_ref().map(Proxy::log).unwrap_or_default();
        log.extend(
            inbound
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .drain(..),
        );
        log
    };
    let expected = count + usize::from(targets.is_some());
    let fds = tokio::select! {
        _ = &mut stopped => return log(&proxy, &inbound),
        fds = receive(&socket, expected) => fds,
    };
    let fds = match fds {
        Ok(fds) => fds,
        Err(e) => {
            tracing::warn!(error = %e, "the command's listeners were not handed over");
            return log(&proxy, &inbound);
        }
    };
    let mut fds = fds;
    let anchor = targets.as_ref().and_then(|_| fds.pop());
    let mut fds = fds.into_iter();
    let mut accepting = tokio::task::JoinSet::new();
    let relays = Arc::new(tokio::sync::Mutex::new(tokio::task::JoinSet::new()));
    // The published ports' way into this namespace.
    let mut target = None;
    if let (Some(targets), Some(anchor)) = (&targets, &anchor) {
        match crate::backends::native::publish::Connector::start(anchor) {
            Ok(connector) => {
                let t = Arc::new(crate::backends::native::publish::Target::new(
                    connector,
                    inbound.clone(),
                    relays.clone(),
                ));
                targets
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(t.clone());
                target = Some(t);
            }
            Err(e) => tracing::warn!(
                error = %e,
                "the published ports' connector did not start: no connection from the host \
                 reaches this command"
            ),
        }
    }
    drop(anchor);
    if let Some(proxy) = &proxy {
        if let Some(fd) = fds.next() {
            let proxy = proxy.clone();
            let relays = relays.clone();
            if let Some(listener) = listener(fd) {
                accepting.spawn(async move {
                    loop {
                        let stream = match listener.accept().await {
                            Ok((stream, _)) => stream,
                            Err(e) if transient(&e) => continue,
                            Err(e) => {
                                tracing::warn!(error = %e, "the proxy's listener failed");
                                break;
                            }
                        };
                        let proxy = proxy.clone();
                        relays.lock().await.spawn(async move {
                            proxy.serve_connection(stream).await;
                        });
                    }
                });
            }
        }
    }
    for (fd, port) in fds.zip(forwarded) {
        let relays = relays.clone();
        if let Some(listener) = listener(fd) {
            accepting.spawn(async move {
                loop {
                    let inside = match listener.accept().await {
                        Ok((stream, _)) => stream,
                        Err(e) if transient(&e) => continue,
                        Err(e) => {
                            tracing::warn!(error = %e, port, "a relayed port's listener failed");
                            break;
                        }
                    };
                    relays.lock().await.spawn(async move {
                        let host = (std::net::Ipv4Addr::LOCALHOST, port);
                        // Refused on the host: the command's connection is closed at once.
                        if let Ok(outside) = tokio::net::TcpStream::connect(host).await {
                            let _ = sandbox_net::relay_tcp(inside, outside).await;
                        }
                    });
                }
            });
        }
    }
    let _ = stopped.await;
    // No new connections; the listeners close with their tasks.
    accepting.shutdown().await;
    if let (Some(targets), Some(t)) = (&targets, &target) {
        targets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|other| !Arc::ptr_eq(other, t));
    }
    let mut relays = relays.lock().await;
    let drained =
        tokio::time::timeout(DRAIN, async { while relays.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::debug!("relays still open at the command's end were cut");
        relays.shutdown().await;
    }
    drop(relays);
    // The connector goes with the last handle on the target (a connection being made may
    // still hold one): its pair closes, it exits, and a thread reaps it.
    drop(target);
    log(&proxy, &inbound)
}

/// An accept error that concerns one connection (the client gave up before accept), not the
/// listener: the loop goes on.
pub(crate) fn transient(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::Interrupted
    )
}

fn listener(fd: OwnedFd) -> Option<tokio::net::TcpListener> {
    let std = std::net::TcpListener::from(fd);
    std.set_nonblocking(true).ok()?;
    tokio::net::TcpListener::from_std(std).ok()
}

/// The one message of the child: `count` listeners.
pub(crate) async fn receive(
    socket: &tokio::net::UnixDatagram,
    count: usize,
) -> std::io::Result<Vec<OwnedFd>> {
    loop {
        socket.readable().await?;
        let got = socket.try_io(tokio::io::Interest::READABLE, || {
            sys::recv_fds::<MAX_LISTENERS>(socket.as_raw_fd())
        });
        match got {
            Ok(fds) if fds.len() == count => return Ok(fds),
            Ok(fds) => {
                return Err(std::io::Error::other(format!(
                    "{} listeners handed over, {count} expected",
                    fds.len()
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}
