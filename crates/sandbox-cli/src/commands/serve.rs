//! `sandbox serve`: the daemon (under its supervisor), and `--stdio`, the single-client bridge.
//!
//! The mechanism is in `sandbox_service`; this file only turns the configuration into
//! `DaemonOptions` and moves bytes for `--stdio`.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::context::Context;
use anyhow::{bail, Context as _};
use clap::Args;
use sandbox_protocol::{Incoming, PROTOCOL};
use sandbox_service::{DaemonOptions, RuntimePaths};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Speak the protocol on stdin/stdout: bridge them to the daemon's socket, starting the
    /// daemon first if none runs. Any number of `--stdio` sessions share one daemon.
    #[arg(long)]
    pub stdio: bool,

    /// Exit once the daemon has had no box, no running command and no client connection for
    /// this long (`30s`, `5m`; `0s`: never). Default: `service.idle_exit` in the
    /// configuration, else 5 minutes. With `--stdio`, for the daemon it starts.
    #[arg(long, value_name = "DURATION", value_parser = parse_idle_exit)]
    pub idle_exit: Option<Duration>,

    /// Internal: this process is the daemon itself, under the supervisor `sandbox serve`
    /// started (which kills everything the daemon leaves behind).
    #[arg(long, hide = true)]
    pub supervised: bool,

    /// Internal: where the daemon creates the boxes' private TMPDIRs. The supervisor owns
    /// this directory and removes it once the daemon and everything it started are gone,
    /// however the daemon ended.
    #[arg(long, hide = true, requires = "supervised")]
    pub tmp_root: Option<PathBuf>,
}

pub fn run(args: ServeArgs, ctx: &Context) -> anyhow::Result<i32> {
    let paths = RuntimePaths::new(&ctx.dirs.runtime);
    if args.stdio {
        return bridge(&paths, args.idle_exit);
    }
    if args.supervised {
        let mut options = options(ctx, paths, args.tmp_root)?;
        if let Some(after) = args.idle_exit {
            options.idle_exit = (!after.is_zero()).then_some(after);
        }
        sandbox_service::daemon::run(options)?;
        return Ok(0);
    }
    let exe = std::env::current_exe().context("locating the sandbox binary")?;
    let tmp_root = tempfile::Builder::new()
        .prefix("sandbox-serve-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir()
        .context("creating the daemon's temporary directory")?;
    let mut daemon = std::process::Command::new(exe);
    daemon
        .args(["serve", "--supervised", "--tmp-root"])
        .arg(tmp_root.path());
    if let Some(after) = args.idle_exit {
        daemon.arg(format!("--idle-exit={}s", after.as_secs()));
    }
    let code = sandbox_service::reaper::supervise(daemon).context("supervising the daemon")?;
    // Every process is reaped by now, so nothing writes here any more: a daemon that was
    // SIGKILLed leaves no box TMPDIR behind.
    drop(tmp_root);
    // Nor the binds of a box it was booting (`sandbox_boxlite::share`): nothing that removes
    // the state directory later may reach a worktree through them.
    #[cfg(target_os = "linux")]
    sandbox_boxlite::share::sweep(
        &crate::session::backend_options(ctx, None)
            .state_dir()
            .join(sandbox_boxlite::share::SHARE_DIR),
    );
    Ok(code)
}

fn options(
    ctx: &Context,
    runtime: RuntimePaths,
    box_tmp_root: Option<PathBuf>,
) -> anyhow::Result<DaemonOptions> {
    Ok(DaemonOptions {
        runtime,
        hook_port: ctx.config().service.hook_port,
        // The same defaults, environment rules and trusted places as `sandbox run`.
        defaults: crate::session::defaults(ctx)?,
        kill_grace: sandbox_exec::process_group::DEFAULT_KILL_GRACE,
        backend: crate::session::backend_options(ctx, None),
        backends: ctx.backends.clone(),
        box_tmp_root,
        boxlite_home: boxlite_home(ctx),
        boxlite_ready_timeout: None,
        idle_exit: ctx.config().service.idle_exit(),
    })
}

/// `--idle-exit`: a duration in whole seconds (the supervisor passes it on as seconds); zero
/// is "never".
fn parse_idle_exit(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration (try 30s, 5m; 0s: never): {e}"))?;
    if d.subsec_nanos() != 0 {
        return Err(format!("{s:?}: whole seconds only"));
    }
    Ok(d)
}

/// BoxLite's home for this user's daemon: `SANDBOX_BOXLITE_HOME`, else
/// `$XDG_DATA_HOME/sandbox/boxlite` (persistent: named boxes and the image cache live there).
pub fn boxlite_home(ctx: &Context) -> PathBuf {
    std::env::var_os("SANDBOX_BOXLITE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| ctx.dirs.data.join("boxlite"))
}

/// Authenticates a connection for the client on stdin/stdout, then copies bytes both ways
/// untouched: the client speaks the protocol exactly as on the socket, minus `host.hello`.
fn bridge(paths: &RuntimePaths, idle_exit: Option<Duration>) -> anyhow::Result<i32> {
    let mut stream = connect_or_start_with(paths, idle_exit)?;
    let token = paths.read_host_token()?;
    let hello = serde_json::json!({
        "id": "sandbox-stdio-bridge",
        "method": "host.hello",
        "params": { "token": token, "protocol": PROTOCOL, "client": "stdio" },
    });
    stream.write_all(format!("{hello}\n").as_bytes())?;
    // Read exactly the one reply line, so nothing meant for the client is consumed here.
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while byte[0] != b'\n' {
        if stream.read(&mut byte)? == 0 {
            bail!("the daemon closed the connection during host.hello");
        }
        line.push(byte[0]);
    }
    let reply: Incoming = serde_json::from_slice(&line).context("reading host.hello's reply")?;
    if let Some(e) = reply.error {
        bail!("the daemon refused this session: {e}");
    }

    let mut up = stream.try_clone()?;
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut up);
        // End of input: no more requests; the daemon finishes what is in flight, then closes.
        let _ = up.shutdown(std::net::Shutdown::Write);
    });
    let mut out = std::io::stdout().lock();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context("reading from the daemon"),
        };
        if out.write_all(&buf[..n]).and_then(|()| out.flush()).is_err() {
            // The client is gone; closing our socket tells the daemon to stop its commands.
            break;
        }
    }
    Ok(0)
}

/// Connects to the daemon, starting one (detached, logging to the runtime dir) if none runs.
pub(crate) fn connect_or_start(paths: &RuntimePaths) -> anyhow::Result<UnixStream> {
    connect_or_start_with(paths, None)
}

/// [`connect_or_start`], a daemon it starts given `--idle-exit` when `idle_exit` is set.
fn connect_or_start_with(
    paths: &RuntimePaths,
    idle_exit: Option<Duration>,
) -> anyhow::Result<UnixStream> {
    if let Ok(stream) = UnixStream::connect(paths.socket()) {
        return Ok(stream);
    }
    paths.ensure_dir()?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(paths.log())
        .with_context(|| format!("opening {}", paths.log().display()))?;
    let exe = std::env::current_exe().context("locating the sandbox binary")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("serve");
    if let Some(after) = idle_exit {
        cmd.arg(format!("--idle-exit={}s", after.as_secs()));
    }
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid(2) is async-signal-safe; the closure touches no memory. A new session
    // keeps the daemon alive when this terminal or client goes away.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the daemon")?;
    // Readiness is "the socket accepts": poll it. Bounded, and a daemon that lost a start
    // race to another client's exits while the winner's socket appears.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(stream) = UnixStream::connect(paths.socket()) {
            return Ok(stream);
        }
        let exited = child.try_wait().ok().flatten();
        if Instant::now() > deadline {
            bail!(
                "the daemon did not start within 15 s{}; see {}",
                exited
                    .map(|s| format!(" (it exited: {s})"))
                    .unwrap_or_default(),
                paths.log().display()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
