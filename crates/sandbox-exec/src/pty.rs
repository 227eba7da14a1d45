//! Interactive runs: the child gets a fresh pseudo-terminal of its own, and this process
//! relays bytes between it and the user's terminal.
//!
//! The sandboxed shell never holds the user's real terminal, so it cannot push keystrokes
//! into it (TIOCSTI) or change its modes behind the user's back; at worst it writes to its
//! own pty. The user's terminal is put in raw mode for the relay (so Ctrl-C, arrows and the
//! like reach the child's line discipline) and restored afterwards, also on error.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::pty::{openpty, Winsize};
use nix::sys::signal::Signal;
use nix::sys::termios::{self, SetArg, Termios};

use crate::error::ExecError;
use crate::prelude::{ExecImage, Prelude};
use crate::process_group;
use crate::report::{reported_error, SetupReport};
use crate::resolve::resolve_program;
use crate::setup::ChildSetup;
use crate::spawn::{base_command, check_cwd, classify_spawn_error};
use crate::spec::CommandSpec;
use crate::status::ExitOutcome;
use crate::sys::{self, cloexec_pipe};

/// How long output is still relayed after the child exited (descendants may hold the pty).
const PTY_DRAIN: Duration = Duration::from_millis(200);

/// Options for an interactive run.
#[derive(Clone, Default)]
pub struct PtyOptions {
    pub setup: Option<Arc<dyn ChildSetup>>,
    pub kill_grace: Option<Duration>,
    /// Kill the shell (SIGKILL) if the spawning *thread* dies (`PR_SET_PDEATHSIG`), as
    /// [`crate::SpawnOptions::die_with_parent`]: the runtime driving [`run_interactive`] must
    /// run on a thread that lives as long as the session (the CLI's main thread).
    pub die_with_parent: bool,
    /// The run's cgroups, as [`crate::SpawnOptions::cgroups`].
    pub cgroups: Option<Arc<crate::cgroups::JoinCgroups>>,
    /// As [`crate::SpawnOptions::process_rlimit`].
    pub process_rlimit: Option<u64>,
}

/// Puts our stdin (a terminal) in raw mode and restores it when dropped.
struct RawModeGuard {
    stdin: std::io::Stdin,
    saved: Termios,
}

impl RawModeGuard {
    fn enter(stdin: std::io::Stdin) -> Option<Self> {
        let saved = termios::tcgetattr(stdin.as_fd()).ok()?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw).ok()?;
        Some(RawModeGuard { stdin, saved })
    }
}

impl Drop for RawModeGuard {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(self.stdin.as_fd(), SetArg::TCSAFLUSH, &self.saved);
    }
}

fn window_size(fd: RawFd) -> Option<Winsize> {
    let ws = sys::window_size(fd).ok()?;
    (ws.ws_row > 0).then_some(Winsize {
        ws_row: ws.ws_row,
        ws_col: ws.ws_col,
        ws_xpixel: ws.ws_xpixel,
        ws_ypixel: ws.ws_ypixel,
    })
}

fn set_window_size(fd: RawFd, ws: &Winsize) {
    let raw = libc::winsize {
        ws_row: ws.ws_row,
        ws_col: ws.ws_col,
        ws_xpixel: ws.ws_xpixel,
        ws_ypixel: ws.ws_ypixel,
    };
    let _ = sys::set_window_size(fd, &raw);
}

/// Runs `spec` on a fresh pty, relaying our stdin/stdout to it, until it exits (or times out).
/// Must be called inside a tokio runtime (signals and the child are watched there; the byte
/// relay runs on its own thread).
pub async fn run_interactive(
    spec: &CommandSpec,
    options: PtyOptions,
) -> Result<ExitOutcome, ExecError> {
    check_cwd(&spec.cwd)?;
    let resolved = resolve_program(&spec.program, spec.env_var("PATH"), &spec.cwd)?;
    let program = spec.display_program();
    let stdin = std::io::stdin();
    let stdin_fd = stdin.as_fd().as_raw_fd();
    let size = window_size(stdin_fd).unwrap_or(Winsize {
        ws_row: 24,
        ws_col: 80,
        ws_xpixel: 0,
        ws_ypixel: 0,
    });
    let pty = openpty(Some(&size), None).map_err(|e| ExecError::io("opening a pty", e.into()))?;
    let master: OwnedFd = pty.master;
    let slave: OwnedFd = pty.slave;
    nix::fcntl::fcntl(
        master.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map_err(|e| ExecError::io("configuring the pty", e.into()))?;

    let dup = |fd: &OwnedFd| {
        fd.try_clone()
            .map_err(|e| ExecError::io("duplicating the pty", e))
    };
    let mut cmd = base_command(spec, &resolved);
    cmd.stdin(dup(&slave)?)
        .stdout(dup(&slave)?)
        .stderr(dup(&slave)?);
    let report = SetupReport::new()?;
    let mut prelude = Prelude::new(
        &report,
        options.die_with_parent,
        options.setup.clone(),
        ExecImage::new(spec, &resolved)?,
    );
    prelude.cgroups = options.cgroups.clone();
    prelude.process_rlimit = options.process_rlimit;
    // stdin is the pty slave; the child makes it its controlling terminal.
    prelude.controlling_terminal = true;
    prelude.install(&mut cmd);
    let spawned = tokio::process::Command::from(cmd).spawn();
    let reported = report.finish_raw();
    let mut child = match (spawned, reported) {
        (Ok(child), None) => child,
        (spawned, reported) => {
            let (error, failure) = reported_error(reported);
            let error = match spawned {
                Err(e) => e,
                // The command's process in a pid namespace failed after the split.
                Ok(mut child) => {
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                    error
                }
            };
            return Err(classify_spawn_error(
                error,
                failure,
                &program,
                &resolved,
                options.setup.as_deref(),
            ));
        }
    };
    drop(slave);
    let pid = crate::spawn::child_pid(&child, &program)?;
    // The child is the proxy of a pid namespace: its init gets the lowest OOM score.
    #[cfg(target_os = "linux")]
    if options.setup.as_ref().is_some_and(|s| s.pid_namespace()) {
        crate::pidns::protect_init_of_proxy(pid.as_raw());
    }

    let raw_guard = if nix::unistd::isatty(stdin_fd).unwrap_or(false) {
        RawModeGuard::enter(std::io::stdin())
    } else {
        None
    };
    let (wake_read, wake_write) =
        cloexec_pipe(false).map_err(|e| ExecError::io("creating the relay wake pipe", e.into()))?;
    let master_fd = master.as_raw_fd();
    let relay = std::thread::Builder::new()
        .name("sandbox-pty-relay".into())
        .spawn(move || relay_loop(master, wake_read))
        .map_err(|e| ExecError::io("starting the pty relay", e))?;

    use tokio::signal::unix::{signal, SignalKind};
    let listen = |kind| signal(kind).map_err(|e| ExecError::io("installing the signal relay", e));
    let mut winch = listen(SignalKind::window_change())?;
    let mut term = listen(SignalKind::terminate())?;
    let mut hup = listen(SignalKind::hangup())?;
    let deadline = spec
        .timeout
        .map(|t| tokio::time::Instant::now() + t)
        .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86400 * 365));
    let grace = options
        .kill_grace
        .unwrap_or(process_group::DEFAULT_KILL_GRACE);

    let outcome = loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.map_err(|e| ExecError::io("waiting for the shell", e))?;
                break ExitOutcome::from_status(status);
            }
            _ = winch.recv() => {
                if let Some(ws) = window_size(stdin_fd) {
                    // Setting the size on the master makes the kernel send SIGWINCH to the
                    // child's foreground group.
                    set_window_size(master_fd, &ws);
                }
            }
            _ = term.recv() => process_group::signal_group(pid, Signal::SIGTERM),
            _ = hup.recv() => process_group::signal_group(pid, Signal::SIGHUP),
            _ = tokio::time::sleep_until(deadline) => {
                process_group::terminate_group(pid, grace).await;
                let _ = child.wait().await;
                break ExitOutcome::TimedOut(spec.timeout.unwrap_or_default());
            }
        }
    };
    process_group::terminate_group(pid, grace).await;
    // Let the relay flush what the child wrote last, then stop it.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let _ = nix::unistd::write(&wake_write, &[1]);
    let _ = tokio::task::spawn_blocking(move || relay.join()).await;
    drop(raw_guard);
    Ok(outcome)
}

/// Moves bytes stdin → master and master → stdout until the master reports EOF/EIO (every
/// slave closed) or the wake pipe says stop (then drains the master for a short while).
fn relay_loop(master: OwnedFd, wake: OwnedFd) {
    let _ = nix::fcntl::fcntl(
        master.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    );
    let mut stdin_open = true;
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let mut stopping: Option<std::time::Instant> = None;
    // Our stdin and stdout, open for the life of the process.
    let (stdin_handle, stdout_handle) = (std::io::stdin(), std::io::stdout());
    let (stdin, stdout) = (stdin_handle.as_fd(), stdout_handle.as_fd());
    let stdin_fd = stdin.as_raw_fd();
    loop {
        if let Some(since) = stopping {
            if since.elapsed() > PTY_DRAIN {
                return;
            }
        }
        let mut master_flags = PollFlags::POLLIN;
        if !pending.is_empty() {
            master_flags |= PollFlags::POLLOUT;
        }
        let mut fds = vec![
            PollFd::new(master.as_fd(), master_flags),
            PollFd::new(wake.as_fd(), PollFlags::POLLIN),
        ];
        let read_stdin = stdin_open && pending.len() < 64 * 1024 && stopping.is_none();
        if read_stdin {
            fds.push(PollFd::new(stdin, PollFlags::POLLIN));
        }
        let timeout = if stopping.is_some() {
            PollTimeout::from(20u16)
        } else {
            PollTimeout::NONE
        };
        match poll(&mut fds, timeout) {
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(_) => return,
        }
        let master_ev = fds[0].revents().unwrap_or(PollFlags::empty());
        let wake_ev = fds[1].revents().unwrap_or(PollFlags::empty());
        let stdin_ev = if read_stdin {
            fds[2].revents().unwrap_or(PollFlags::empty())
        } else {
            PollFlags::empty()
        };
        drop(fds);

        if wake_ev.contains(PollFlags::POLLIN) && stopping.is_none() {
            stopping = Some(std::time::Instant::now());
        }
        if master_ev.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
            match nix::unistd::read(master.as_raw_fd(), &mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    if write_all(stdout, &buf[..n]).is_err() {
                        return;
                    }
                }
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                // EIO: every slave fd is closed — the session is over.
                Err(_) => return,
            }
        }
        if master_ev.contains(PollFlags::POLLOUT) && !pending.is_empty() {
            match nix::unistd::write(&master, &pending) {
                Ok(n) => {
                    pending.drain(..n);
                }
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                Err(_) => return,
            }
        }
        if stdin_ev.intersects(PollFlags::POLLIN | PollFlags::POLLHUP) {
            match nix::unistd::read(stdin_fd, &mut buf) {
                Ok(0) => {
                    stdin_open = false;
                    // End of input: send the terminal's EOF character, as a user's Ctrl-D.
                    pending.push(0x04);
                }
                Ok(n) => pending.extend_from_slice(&buf[..n]),
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                Err(_) => stdin_open = false,
            }
        }
    }
}

fn write_all(fd: BorrowedFd<'_>, mut data: &[u8]) -> Result<(), Errno> {
    while !data.is_empty() {
        match nix::unistd::write(fd, data) {
            Ok(n) => data = &data[n..],
            Err(Errno::EINTR) | Err(Errno::EAGAIN) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
