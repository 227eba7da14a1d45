//! Starting and stopping the daemon: one per user (a lock file decides), both listeners bound
//! before it says it is listening, and an orderly stop that ends every command first.

use crate::locks::Locked as _;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandbox_protocol::PROTOCOL;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::boxes::stop_everything;
use super::connection::connection;
use super::options::{io_err, DaemonError, DaemonOptions};
use super::spawner::Executor;
use super::state::{until_true, State};
use crate::registry::Registry;
use crate::runtime::RuntimePaths;
use crate::token::TokenStore;

/// Runs the daemon until `shutdown`, SIGTERM, SIGINT or SIGHUP. Blocking.
pub fn run(opts: DaemonOptions) -> Result<(), DaemonError> {
    let paths = opts.runtime.clone();
    paths.ensure_dir()?;
    let _lock = take_lock(&paths)?;

    // What a daemon that died mid-period left of a box's git writes: taken in (or reported)
    // and removed before any box is made again. One daemon per user, so no other holds them.
    for recovered in sandbox_git::quarantine::generation::recover(
        &opts
            .backend
            .state_dir()
            .join(sandbox_boxlite::request::BOX_GIT_DIR),
    ) {
        for line in recovered.lines() {
            eprintln!("sandbox: {line}");
        }
    }

    // Descendants that leave their group and lose their parent come back to us, so the
    // daemon can kill them; see `spawner::reap_orphans_if_idle`.
    if let Err(e) = sandbox_exec::process_group::become_subreaper() {
        tracing::warn!(error = %e, "could not become a child subreaper");
    }
    let tokens = TokenStore::new().map_err(io_err("generating the host token"))?;
    paths.write_host_token(tokens.host())?;
    let token_file = identity(&paths.host_token());
    let executor = Executor::start().map_err(io_err("starting the spawner thread"))?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sandbox-daemon")
        .enable_all()
        .build()
        .map_err(io_err("starting the async runtime"))?;
    let box_tmp_root = opts.box_tmp_root.clone();
    let result = rt.block_on(serve(opts, tokens, executor));
    // Only our own files: when the runtime directory was removed, a new daemon may already
    // have made its own at the same paths.
    remove_if_ours(&paths.host_token(), token_file);
    // Do not wait for stray blocking tasks (a hook connection mid-read).
    rt.shutdown_timeout(Duration::from_millis(200));
    // Every command is stopped by now. The supervisor removes this directory too, but it may
    // be the one that was killed (that is why this daemon is stopping), so do it here as well.
    if let Some(root) = box_tmp_root {
        let _ = std::fs::remove_dir_all(root);
    }
    result
}

fn take_lock(paths: &RuntimePaths) -> Result<nix::fcntl::Flock<std::fs::File>, DaemonError> {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let path = paths.lock();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(io_err(format!("opening {}", path.display())))?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(mut lock) => {
            let _ = lock.set_len(0);
            let _ = lock.rewind();
            let _ = writeln!(lock, "{}", std::process::id());
            Ok(lock)
        }
        Err((mut file, _)) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            Err(DaemonError::AlreadyRunning {
                pid: pid.trim().to_string(),
                socket: paths.socket(),
            })
        }
    }
}

async fn serve(
    opts: DaemonOptions,
    tokens: TokenStore,
    executor: Executor,
) -> Result<(), DaemonError> {
    let socket = opts.runtime.socket();
    // We hold the lock, so a socket file here is a dead daemon's.
    let _ = std::fs::remove_file(&socket);
    let listener =
        UnixListener::bind(&socket).map_err(io_err(format!("binding {}", socket.display())))?;
    crate::runtime::set_mode(&socket, 0o600)?;
    let bound = identity(&socket);
    let hook_listener = tokio::net::TcpListener::bind(("127.0.0.1", opts.hook_port.unwrap_or(0)))
        .await
        .map_err(io_err(format!(
            "binding the hook endpoint on 127.0.0.1:{} (service.hook_port)",
            opts.hook_port.unwrap_or(0)
        )))?;
    let hook_port = hook_listener
        .local_addr()
        .map_err(io_err("reading the hook port"))?
        .port();

    // BoxLite's daemon form in the registry, over the daemon's one runtime.
    #[cfg(feature = "boxlite")]
    let (opts, boxlite) = super::microvm::with_engines(opts);
    let (shutdown, mut shutdown_rx) = watch::channel(false);
    let state = Arc::new(State {
        tokens,
        boxes: Mutex::new(Registry::default()),
        execs: Mutex::new(HashMap::new()),
        tasks: Mutex::new(HashMap::new()),
        conns: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(1),
        executor,
        shutdown,
        shutting_down: AtomicBool::new(false),
        hook_port,
        opts,
        #[cfg(feature = "boxlite")]
        boxlite,
    });
    tokio::spawn(crate::hooks::serve(hook_listener, state.clone()));
    eprintln!(
        "sandbox: daemon {} listening on {} (protocol {PROTOCOL}); status hooks on {}",
        std::process::id(),
        socket.display(),
        state.hook_url()
    );

    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(io_err("installing SIGTERM"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(io_err("installing SIGINT"))?;
    let mut hup = signal(SignalKind::hangup()).map_err(io_err("installing SIGHUP"))?;
    let mut connections = JoinSet::new();
    let gone = runtime_gone(state.opts.runtime.dir.clone(), socket.clone(), bound);
    tokio::pin!(gone);
    let idle_exit = state.opts.idle_exit;
    let mut idle_since: Option<tokio::time::Instant> = None;
    loop {
        // Re-judged after every event that can change it: a connection accepted or ended (a
        // box or a command is only made or removed through a connection, and one of a box
        // does not make the daemon idle).
        let deadline = match idle_exit.filter(|_| idle(&state, connections.len())) {
            Some(after) => Some(*idle_since.get_or_insert_with(tokio::time::Instant::now) + after),
            None => {
                idle_since = None;
                None
            }
        };
        tokio::select! {
            _ = sleep_until(deadline) => {
                if idle(&state, connections.len()) {
                    eprintln!(
                        "sandbox: daemon {}: no box, no command and no client for {}: exiting \
                         (service.idle_exit in the configuration, or sandbox serve --idle-exit)",
                        std::process::id(),
                        seconds(idle_exit.unwrap_or_default())
                    );
                    break;
                }
            }
            why = &mut gone => {
                eprintln!(
                    "sandbox: daemon {}: {why}; stopping every command and exiting (no client \
                     can reach this daemon any more)",
                    std::process::id()
                );
                stop_everything(&state).await;
                break;
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(connection(state.clone(), stream));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = until_true(&mut shutdown_rx) => break,
            _ = term.recv() => { stop_everything(&state).await; break }
            _ = int.recv() => { stop_everything(&state).await; break }
            _ = hup.recv() => { stop_everything(&state).await; break }
        }
    }
    drop(listener);
    remove_if_ours(&socket, bound);
    let _ = state.shutdown.send(true);
    // Let connections flush what is queued (the shutdown reply, last events); bounded so a
    // client that stopped reading cannot keep the daemon alive.
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    Ok(())
}

/// Whether the daemon has nothing to serve: no box, no command, no client connection.
fn idle(state: &State, connections: usize) -> bool {
    connections == 0 && state.boxes.locked().names().is_empty() && state.execs.locked().is_empty()
}

fn seconds(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A file's identity (device, inode), to tell ours from one made later at the same path.
type Identity = Option<(u64, u64)>;

fn identity(path: &Path) -> Identity {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

fn remove_if_ours(path: &Path, ours: Identity) {
    if ours.is_some() && identity(path) == ours {
        let _ = std::fs::remove_file(path);
    }
}

/// Resolves, saying why, once the socket this daemon listens on is no longer at its path:
/// the runtime directory removed or renamed, the socket deleted or replaced. Clients find the
/// daemon only there, so such a daemon serves nobody again (and a client would start a second
/// one beside it). Woken by inotify on the directory (`notify`), each event checked against
/// the socket's identity; never resolves when the watch cannot be set up (said in the log).
async fn runtime_gone(dir: PathBuf, socket: PathBuf, bound: Identity) -> String {
    use notify::Watcher as _;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let _ = tx.send(event.is_ok());
    })
    .and_then(|mut w| {
        w.watch(&dir, notify::RecursiveMode::NonRecursive)
            .map(|()| w)
    });
    let _watcher = match watcher {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the runtime directory; a daemon whose directory is removed keeps running until it is idle");
            return std::future::pending().await;
        }
    };
    loop {
        // Checked once the watch is set, so a removal before it is not missed.
        if identity(&socket) != bound {
            return format!(
                "its socket {} is gone (its runtime directory {} was removed or moved, or the \
                 socket replaced)",
                socket.display(),
                dir.display()
            );
        }
        if rx.recv().await.is_none() {
            return std::future::pending().await;
        }
    }
}
