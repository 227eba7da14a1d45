//! One BoxLite box behind the run seam: a [`BoxSession`] is the backend session of a box
//! (`sandbox_host::BackendSession`), its commands are armed by the run sequence like any
//! other and launched in the guest through BoxLite's agent
//! ([`sandbox_host::seam::GuestLaunch`]).
//!
//! What is BoxLite's own lives here: the boot and the probe for the byte-exact output relay,
//! a command's output decoded from the relay, its signals and timeout, and how the agent's
//! report becomes an exit outcome (a negative code is the signal that killed the command; a
//! code above 128 after a signal we sent is that signal's; a command the agent lost is the
//! box's failure). The daemon keeps its event loop: registries, replies and events.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use boxlite::{BoxCommand, LiteBox};
use futures_util::StreamExt as _;
use sandbox_exec::{CommandSpec, ExitOutcome, OutputChunk, StreamKind};
pub use sandbox_git::quarantine::generation::BoxGit;
use sandbox_git::quarantine::generation::Generation;
use sandbox_host::seam::{
    GuestEnd, GuestExit, GuestFuture, GuestGit, GuestInput, GuestLaunch, GuestProcess,
};
use sandbox_host::{BackendKind, BackendSession, Enforcement, HostError, PreparedCommand};
use tokio::sync::{mpsc, oneshot};

use crate::engine::Engine;
use crate::error::{BoxliteError, LogPaths};

/// Output chunks a command may have in flight before its relay waits for the reader.
const OUTPUT_QUEUE: usize = 64;

/// A box of the daemon's BoxLite runtime: the backend session its commands run in.
pub struct BoxSession {
    vm: Arc<Vm>,
    enforcement: Enforcement,
    /// BoxLite kept the box from an earlier daemon (with its disk) rather than creating it.
    kept: bool,
}

/// The engine's handle on one box, shared by the session and its launched commands.
struct Vm {
    engine: Arc<Engine>,
    name: String,
    litebox: LiteBox,
    /// BoxLite's id for the box (its directory under the home's `boxes/`).
    vm_id: String,
    first_exec: AtomicBool,
    /// Commands run under the byte-exact output relay ([`crate::relay`]): the box can run it
    /// (its image has Perl), found out once after each boot.
    byte_exact: AtomicBool,
    /// Serialises boots: a second start waits for the first.
    booting: tokio::sync::Mutex<()>,
    /// The box's busy periods, and where its commits come back.
    periods: Periods,
    /// The box's staging directory, when its view is composed on the host ([`crate::share`]).
    share: Option<BoxShare>,
}

/// A box whose view is composed on the host: its staging directory, laid out for each boot
/// and taken down once the shim runs (its mount namespace keeps its own copy of the binds:
/// they are private), so a daemon that dies leaves binds behind only when it dies booting;
/// and the entry that links the shared parts in place after each boot.
#[derive(Debug)]
pub struct BoxShare {
    pub dir: std::path::PathBuf,
    pub binds: Vec<crate::share::HostBind>,
    /// The entry's program and arguments ([`crate::share::entry`]); `None` when every mount
    /// is in the main share.
    pub entry: Option<(String, Vec<String>)>,
}

/// A box's busy periods: from the first command that starts while none runs to the last one
/// ending. Each has its own generation of the common dir when the box's commits come back.
#[derive(Debug)]
struct Periods {
    commits: Option<Commits>,
    busy: std::sync::Mutex<Busy>,
}

/// A box whose git writes come back to the repository (docs/boxlite.md, "Git from inside a
/// box"): per busy period a generation of the common dir, read back when it ends.
#[derive(Debug, Clone)]
pub struct Commits {
    /// The box's git directories (mounted: `git.writable()`, `git.pointer()`).
    pub git: BoxGit,
    /// Where the worktree's task record is kept (first) and may be found.
    pub records: Vec<std::path::PathBuf>,
    /// Private scratch space of the quarantine.
    pub scratch: std::path::PathBuf,
}

#[derive(Debug, Default)]
struct Busy {
    running: usize,
    generation: Option<Generation>,
}

impl Periods {
    fn new(commits: Option<Commits>) -> Periods {
        Periods {
            commits,
            busy: std::sync::Mutex::new(Busy::default()),
        }
    }

    /// A command starts: the first of a busy period lays out its generation.
    fn enter(&self) -> Result<(), HostError> {
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        if busy.running == 0 {
            if let Some(c) = &self.commits {
                let records: Vec<&std::path::Path> =
                    c.records.iter().map(|p| p.as_path()).collect();
                busy.generation = Some(
                    Generation::begin(&c.git, &records, &c.scratch)
                        .map_err(HostError::GitQuarantine)?,
                );
            }
        }
        busy.running += 1;
        Ok(())
    }

    /// A command ended: the last of a busy period reads its generation back.
    async fn leave(&self) -> Option<GuestGit> {
        let generation = {
            let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
            busy.running = busy.running.saturating_sub(1);
            if busy.running > 0 {
                return None;
            }
            busy.generation.take()?
        };
        let ended = tokio::task::spawn_blocking(move || generation.end()).await;
        Some(match ended {
            Ok(end) => GuestGit {
                store: end.store,
                notes: end.notes,
            },
            Err(e) => GuestGit {
                store: Ok(Default::default()),
                notes: vec![format!(
                    "git: reading the box's git writes back failed ({e}); nothing was taken"
                )],
            },
        })
    }
}

/// What a boot gave.
#[derive(Debug, Clone, Copy)]
pub struct Booted {
    pub boot: Duration,
    /// Output is relayed byte for byte (else as BoxLite's text).
    pub byte_exact: bool,
}

impl BoxSession {
    /// The session of `litebox`, the box `name` of `engine`, enforcing `enforcement`; its
    /// git writes come back through `commits` when given. `kept`: BoxLite had the box from
    /// an earlier daemon.
    pub fn new(
        engine: Arc<Engine>,
        name: &str,
        litebox: LiteBox,
        enforcement: Enforcement,
        commits: Option<Commits>,
        share: Option<BoxShare>,
        kept: bool,
    ) -> BoxSession {
        let vm_id = litebox.id().as_str().to_string();
        BoxSession {
            vm: Arc::new(Vm {
                engine,
                name: name.to_string(),
                litebox,
                vm_id,
                first_exec: AtomicBool::new(false),
                byte_exact: AtomicBool::new(false),
                booting: tokio::sync::Mutex::new(()),
                periods: Periods::new(commits),
                share,
            }),
            enforcement,
            kept,
        }
    }

    /// Whether BoxLite kept the box from an earlier daemon (its disk, and what was installed
    /// on it) rather than creating it now.
    pub fn kept(&self) -> bool {
        self.kept
    }

    /// Where the box's logs are: the runtime's, the shim's, the guest console.
    pub fn logs(&self) -> LogPaths {
        self.vm.engine.log_paths(Some(&self.vm.vm_id))
    }

    /// BoxLite's id for the box.
    pub fn vm_id(&self) -> &str {
        &self.vm.vm_id
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.vm.engine
    }

    /// Holds off other boots until the guard is dropped (a second `box.start` waits for the
    /// first, then finds the box running).
    pub async fn boot_lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.vm.booting.lock().await
    }

    /// Boots the box (the caller holds [`Self::boot_lock`]), runs its entry where its view is
    /// composed on the host, then finds out whether it runs the byte-exact output relay.
    pub async fn boot(&self) -> Result<Booted, BoxliteError> {
        let vm = &self.vm;
        let staged = match &vm.share {
            Some(share) => Some(stage(vm, share)?),
            None => None,
        };
        let boot = vm.engine.start(&vm.name, &vm.litebox).await;
        drop(staged);
        let boot = boot?;
        if let Some(entry) = vm.share.as_ref().and_then(|s| s.entry.as_ref()) {
            run_entry(vm, entry).await?;
        }
        let byte_exact = relay_works(vm).await;
        vm.byte_exact.store(byte_exact, Ordering::SeqCst);
        Ok(Booted { boot, byte_exact })
    }

    /// True for the first command since the box was made (its launch time is a named step).
    pub fn first_exec(&self) -> bool {
        !self.vm.first_exec.swap(true, Ordering::SeqCst)
    }

    /// Stops the VM (its commands already ended).
    pub async fn stop(&self) -> Result<(), BoxliteError> {
        self.vm.engine.stop(&self.vm.name, &self.vm.litebox).await
    }

    /// Removes the VM and its disks.
    pub async fn remove(&self) -> Result<(), BoxliteError> {
        self.vm.engine.remove(&self.vm.name).await
    }
}

impl BackendSession for BoxSession {
    fn enforcement(&self) -> &Enforcement {
        &self.enforcement
    }

    fn command(&self, spec: CommandSpec) -> Result<PreparedCommand, HostError> {
        Ok(PreparedCommand::guest(
            BackendKind::Boxlite,
            spec,
            Arc::new(Launcher(self.vm.clone())),
        ))
    }

    fn runs_in_guest(&self) -> bool {
        true
    }
}

/// Lays the box's staging directory out for a boot.
#[cfg(target_os = "linux")]
fn stage(vm: &Vm, share: &BoxShare) -> Result<crate::share::Staging, BoxliteError> {
    crate::share::Staging::new(&share.dir, &share.binds).map_err(|e| BoxliteError::Engine {
        name: vm.name.clone(),
        what: "composing the box's view on the host",
        detail: e.to_string(),
        logs: Box::new(vm.engine.log_paths(Some(&vm.vm_id))),
    })
}

#[cfg(not(target_os = "linux"))]
fn stage(_: &Vm, _: &BoxShare) -> Result<(), BoxliteError> {
    Ok(())
}

/// Runs the box's entry as root (whatever the image's user): a link at each guest path to its
/// part of the share. A box whose entry fails runs nothing: its mounts would not be where the
/// policy put them.
async fn run_entry(vm: &Vm, (program, args): &(String, Vec<String>)) -> Result<(), BoxliteError> {
    let failed = |detail: String| BoxliteError::Engine {
        name: vm.name.clone(),
        what: "placing the box's mounts in the guest (its entry)",
        detail,
        logs: Box::new(vm.engine.log_paths(Some(&vm.vm_id))),
    };
    let command = BoxCommand::new(program.clone())
        .args(args.clone())
        .user("0:0");
    let mut execution = vm.engine.exec(&vm.name, &vm.litebox, command).await?;
    let mut said = String::new();
    if let Some(mut stderr) = execution.stderr() {
        while let Some(piece) = stderr.next().await {
            said.push_str(&piece);
        }
    }
    match execution.wait().await {
        Ok(r) if r.exit_code == 0 => Ok(()),
        Ok(r) => Err(failed(format!("exit {}: {}", r.exit_code, said.trim()))),
        Err(e) => Err(failed(e.to_string())),
    }
}

/// Whether the booted box runs the output relay's interpreter.
async fn relay_works(vm: &Vm) -> bool {
    let (program, args) = crate::relay::probe();
    let command = BoxCommand::new(program).args(args);
    match vm.engine.exec(&vm.name, &vm.litebox, command).await {
        Ok(execution) => {
            let works = matches!(execution.wait().await, Ok(r) if r.exit_code == 0);
            if !works {
                tracing::warn!(
                    "box {}: no perl in the image: its output is relayed as text (bytes that \
                     are not UTF-8 arrive as U+FFFD)",
                    vm.name
                );
            }
            works
        }
        Err(e) => {
            tracing::warn!("box {}: probing for the output relay: {e}", vm.name);
            false
        }
    }
}

/// Launches a box's commands in its guest.
struct Launcher(Arc<Vm>);

impl GuestLaunch for Launcher {
    fn launch(
        &self,
        spec: CommandSpec,
        stdin: bool,
    ) -> GuestFuture<Result<GuestProcess, HostError>> {
        let vm = self.0.clone();
        Box::pin(async move {
            let byte_exact = vm.byte_exact.load(Ordering::SeqCst);
            let command = box_command(&spec, byte_exact);
            vm.periods.enter()?;
            let execution = match vm.engine.exec(&vm.name, &vm.litebox, command).await {
                Ok(execution) => execution,
                Err(e) => {
                    if let Some(git) = vm.periods.leave().await {
                        for line in git.notes {
                            tracing::warn!("{line}");
                        }
                    }
                    return Err(HostError::Backend {
                        backend: BackendKind::Boxlite,
                        source: Box::new(e),
                    });
                }
            };
            Ok(relay(execution, stdin, spec.timeout, byte_exact, vm))
        })
    }
}

/// The command BoxLite runs for `spec`: under the relay where the box runs it.
fn box_command(spec: &CommandSpec, byte_exact: bool) -> BoxCommand {
    let program = spec.program.to_string_lossy().into_owned();
    let args: Vec<String> = spec
        .args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let (program, args) = if byte_exact {
        crate::relay::wrap(&program, &args)
    } else {
        (program, args)
    };
    let mut command = BoxCommand::new(program)
        .args(args)
        .working_dir(spec.cwd.display().to_string());
    for (k, v) in &spec.env {
        command = command.env(
            k.to_string_lossy().into_owned(),
            v.to_string_lossy().into_owned(),
        );
    }
    command
}

/// Relays one execution: its streams decoded into chunks, stdin written in order, signals
/// delivered, the timeout enforced, and its end judged once both streams ended.
fn relay(
    mut execution: boxlite::Execution,
    with_stdin: bool,
    timeout: Option<Duration>,
    byte_exact: bool,
    vm: Arc<Vm>,
) -> GuestProcess {
    let (out_tx, out_rx) = mpsc::channel(OUTPUT_QUEUE);
    let (signal_tx, mut signal_rx) = mpsc::unbounded_channel::<i32>();
    let (exit_tx, exit_rx) = oneshot::channel();
    let stdin = match (with_stdin, execution.stdin()) {
        (true, Some(mut writer)) => {
            let (tx, mut rx) = mpsc::channel::<GuestInput>(16);
            tokio::spawn(async move {
                while let Some(GuestInput { data, close, reply }) = rx.recv().await {
                    let res = if data.is_empty() {
                        Ok(())
                    } else {
                        writer
                            .write_all(&data)
                            .await
                            .map_err(|e| std::io::Error::other(e.to_string()))
                    };
                    if close {
                        writer.close();
                    }
                    let _ = reply.send(res);
                    if close {
                        break;
                    }
                }
            });
            Some(tx)
        }
        _ => None,
    };
    let mut stdout = execution.stdout();
    let mut stderr = execution.stderr();
    tokio::spawn(async move {
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut timed_out = false;
        let mut signalled = false;
        let mut signals_open = true;
        let (mut out_open, mut err_open) = (stdout.is_some(), stderr.is_some());
        let mut out_decoder = Relayed::new(byte_exact);
        let mut err_decoder = Relayed::new(byte_exact);
        let wait = execution.wait();
        tokio::pin!(wait);
        let result = loop {
            tokio::select! {
                biased;
                sig = signal_rx.recv(), if signals_open => match sig {
                    Some(sig) => {
                        signalled = true;
                        let _ = if sig == libc::SIGKILL {
                            execution.kill().await
                        } else {
                            execution.signal(sig).await
                        };
                    }
                    None => signals_open = false,
                },
                _ = sleep_until(deadline), if deadline.is_some() && !timed_out => {
                    timed_out = true;
                    let _ = execution.kill().await;
                }
                line = next(&mut stdout), if out_open => match line {
                    Some(s) => {
                        let data = out_decoder.bytes(s);
                        if !data.is_empty() {
                            let _ = out_tx.send(OutputChunk { stream: StreamKind::Stdout, data: data.into() }).await;
                        }
                    }
                    None => out_open = false,
                },
                line = next(&mut stderr), if err_open => match line {
                    Some(s) => {
                        let data = err_decoder.bytes(s);
                        if !data.is_empty() {
                            let _ = out_tx.send(OutputChunk { stream: StreamKind::Stderr, data: data.into() }).await;
                        }
                    }
                    None => err_open = false,
                },
                res = &mut wait, if !out_open && !err_open => break res,
            }
        };
        // Every chunk is queued before the end is known.
        drop(out_tx);
        let exit = judge(
            result.map(|r| (r.exit_code, r.error_message)),
            timed_out.then(|| timeout.unwrap_or_default()),
            signalled,
        );
        // The last command of a busy period takes the box's git writes back.
        let git = vm.periods.leave().await;
        let _ = exit_tx.send(GuestEnd { exit, git });
    });
    GuestProcess {
        output: out_rx,
        stdin,
        signals: signal_tx,
        exit: Box::pin(async move {
            exit_rx.await.unwrap_or_else(|_| GuestEnd {
                exit: GuestExit::Lost("the relay of the command's streams ended early".into()),
                git: None,
            })
        }),
    }
}

/// The guest agent's report as an exit: a negative code is the signal that killed the
/// command; a code above 128 after a signal we sent is that signal's; the timeout's kill is a
/// timeout; a command the agent lost is the box's failure.
fn judge<E: std::fmt::Display>(
    result: Result<(i32, Option<String>), E>,
    timed_out: Option<Duration>,
    signalled: bool,
) -> GuestExit {
    match result {
        Ok((_, message)) if timed_out.is_some() => {
            let after = timed_out.unwrap_or_default();
            GuestExit::Ended {
                outcome: ExitOutcome::TimedOut(after),
                note: Some(format!(
                    "timed out after {} ms; the command was killed in the box",
                    after.as_millis()
                ))
                .or(message),
            }
        }
        Ok((code, note)) if code < 0 => GuestExit::Ended {
            outcome: ExitOutcome::Signaled(-code),
            note,
        },
        Ok((code, note)) if code > 128 && signalled => GuestExit::Ended {
            outcome: ExitOutcome::Signaled(code - 128),
            note,
        },
        Ok((code, note)) => GuestExit::Ended {
            outcome: ExitOutcome::Exited(code),
            note,
        },
        Err(e) => GuestExit::Lost(e.to_string()),
    }
}

/// One output stream of a command: the relay's lines decoded, or BoxLite's text as is.
struct Relayed {
    decoder: Option<crate::relay::Decoder>,
}

impl Relayed {
    fn new(byte_exact: bool) -> Self {
        Relayed {
            decoder: byte_exact.then(crate::relay::Decoder::default),
        }
    }

    fn bytes(&mut self, text: String) -> Vec<u8> {
        match &mut self.decoder {
            None => text.into_bytes(),
            Some(d) => match d.push(&text) {
                Ok(bytes) => bytes,
                // Not the relay's (BoxLite's own words on a broken stream): as text.
                Err(e) => {
                    tracing::warn!("{e}");
                    self.decoder = None;
                    text.into_bytes()
                }
            },
        }
    }
}

async fn next<S: futures_util::Stream<Item = String> + Unpin>(s: &mut Option<S>) -> Option<String> {
    match s {
        Some(s) => s.next().await,
        None => None,
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commands that overlap share one generation, read back once the last one ends: the
    /// task branch moves then, not before.
    #[tokio::test]
    async fn a_busy_period_ends_with_its_last_command() {
        use sandbox_testkit::git;
        let t = tempfile::tempdir().unwrap();
        let main = t.path().join("main");
        let task = t.path().join("task");
        sandbox_testkit::linked_worktree(&main, &task);
        let common = main.join(".git").canonicalize().unwrap();
        let box_git = BoxGit::new(
            &common,
            &common.join("worktrees/task"),
            &t.path().join("box"),
        )
        .unwrap();
        let periods = Periods::new(Some(Commits {
            git: box_git.clone(),
            records: vec![t.path().join("records")],
            scratch: t.path().join("scratch"),
        }));
        let before = git(&main, &["rev-parse", "task"]);
        periods.enter().unwrap();
        periods.enter().unwrap();
        // "The box" commits through its `.git`: the generation's admin dir of the worktree.
        let gitdir = box_git.writable().join("current/worktrees/task");
        sandbox_testkit::git_command(&task)
            .env("GIT_DIR", &gitdir)
            .env("GIT_WORK_TREE", &task)
            .args(["commit", "-q", "--allow-empty", "-m", "in the box"])
            .status()
            .unwrap();
        assert!(periods.leave().await.is_none(), "one command still runs");
        assert_eq!(git(&main, &["rev-parse", "task"]), before);
        let report = periods.leave().await.unwrap().store.unwrap();
        let after = git(&main, &["rev-parse", "task"]);
        assert_ne!(after, before);
        assert_eq!(report.applied.len(), 1, "{report:?}");
        // The next period starts afresh, from the moved branch.
        periods.enter().unwrap();
        assert!(periods
            .leave()
            .await
            .unwrap()
            .store
            .unwrap()
            .applied
            .is_empty());
    }

    /// The agent's report, judged: the one place BoxLite's codes become exit outcomes.
    #[test]
    fn the_agents_report_is_judged_into_one_outcome() {
        let ended = |r: Result<(i32, Option<String>), &str>, t, s| match judge(r, t, s) {
            GuestExit::Ended { outcome, note } => (Some(outcome), note),
            GuestExit::Lost(cause) => (None, Some(cause)),
        };
        assert_eq!(
            ended(Ok((3, None)), None, false),
            (Some(ExitOutcome::Exited(3)), None)
        );
        assert_eq!(
            ended(Ok((-9, None)), None, false),
            (Some(ExitOutcome::Signaled(9)), None)
        );
        // Above 128 is a signal only when we sent one; else it is the command's own code.
        assert_eq!(
            ended(Ok((143, None)), None, true),
            (Some(ExitOutcome::Signaled(15)), None)
        );
        assert_eq!(
            ended(Ok((143, None)), None, false),
            (Some(ExitOutcome::Exited(143)), None)
        );
        let (outcome, note) = ended(
            Ok((137, Some("killed".into()))),
            Some(Duration::from_millis(50)),
            false,
        );
        assert_eq!(
            outcome,
            Some(ExitOutcome::TimedOut(Duration::from_millis(50)))
        );
        assert_eq!(
            note.as_deref(),
            Some("timed out after 50 ms; the command was killed in the box")
        );
        assert_eq!(
            ended(Err("the VM is gone"), None, false),
            (None, Some("the VM is gone".into()))
        );
    }
}
