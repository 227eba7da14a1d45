//! `sandbox exec`: one command in a box as a stdio proxy (docs/exec.md).
//!
//! The caller — an ACP host, an editor, a script — spawns `sandbox exec … -- AGENT` as if it
//! were AGENT and speaks to its stdio. So stdout is the command's and nobody else's: every
//! line of ours, of the backend's and of the probe and provisioning goes to stderr. The
//! command itself inherits our stdin and stdout (no copy loop, no pty): the bytes are the
//! caller's, unchanged, and EOF reaches the command when the caller closes its end.
//!
//! Everything runs through the one run sequence (`sandbox_host::run`), as `sandbox run` does:
//! one `Run` for the box, one armed command per probe, provisioning and the command, each
//! finished (judged, git pointers checked) with the token that reaping its orphans gives.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use nix::sys::signal::Signal;
use sandbox_exec::{
    process_group, OutputLimits, OutputMode, SignalPipe, SignalRelay, SpawnOptions, StdinMode,
};
use sandbox_host::run::NotStarted;
use sandbox_host::seam::BackendKind;
use sandbox_host::{ExitStatus, Reaper, Run};

use crate::cli::args::ExecArgs;
use crate::context::Context;
use crate::exit::Failure;
use crate::session::Session;

/// The shell that runs `--probe` and `--provision` (they are shell commands, docs/exec.md:
/// `--probe 'command -v pi-acp'`). An absolute path, so the child's `PATH` cannot pick another.
const SHELL: &str = "/bin/sh";

/// How long the output of a finished probe or provisioning step may still trickle in: a
/// descendant that left its process group can hold the pipe open forever.
const DRAIN: Duration = Duration::from_millis(500);

/// Why `sandbox exec` refused or could not get the box ready. Every one means the command did
/// not run: exit 125.
#[derive(Debug, thiserror::Error)]
pub enum BoxError {
    #[error("--mount {0:?}: expected HOST:GUEST")]
    MountSyntax(String),
    #[error(
        "--mount {spec}: the backends of this build cannot show {host} elsewhere — in place \
         (native, nono, custom, host) a path appears only at itself; use --mount {host}:{host} \
         (a read-write grant, like --allow-write)"
    )]
    MountElsewhere { spec: String, host: String },
    #[error(
        "--mount: the lima backend mounts only the task's sandbox view and cannot add {0}; use \
         an in-place backend (native, nono) for extra paths"
    )]
    MountUnsupported(String),
    #[error(
        "the {backend} backend takes no {flag}: {flag} chooses the root file system of an \
         image-based backend (boxlite); {backend} runs on this machine's own file system"
    )]
    TakesNoImage {
        backend: BackendKind,
        flag: &'static str,
    },
    #[error("the box is not ready: the probe {probe:?} {how}, and no --provision was given")]
    NotReady { probe: String, how: String },
    #[error("the box is not ready: provisioning {provision:?} {how}")]
    ProvisionFailed { provision: String, how: String },
    #[error(
        "the box is not ready: the probe {probe:?} still {how} after provisioning {provision:?} \
         succeeded"
    )]
    StillNotReady {
        probe: String,
        provision: String,
        how: String,
    },
}

/// The steps that get a box ready, in the order they may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Probe,
    Provision,
    Reprobe,
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Phase::Probe => "probe",
            Phase::Provision => "provision",
            Phase::Reprobe => "probe (after provisioning)",
        }
    }
}

/// How a probe or provisioning step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepEnd {
    /// It ran; its exit status, as the one exit rule gave it (`sandbox_host::Outcome::status`:
    /// the daemon's `exit` event carries the same fields).
    Exited(ExitStatus),
    /// We received this signal while it ran and passed it on: the user wants to stop, so
    /// nothing further runs.
    Interrupted(Signal),
}

/// What [`ensure_ready`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// No probe was given: the box is taken as it is.
    Unchecked,
    /// The probe succeeded at once.
    Ready,
    /// The probe failed, provisioning ran, and the probe then succeeded.
    Provisioned,
    /// A step was interrupted by this signal (forwarded to it); stop with 128+N.
    Interrupted(Signal),
}

/// The exit code of an `exec` whose step was interrupted by `sig` (passed on to it): as if
/// `sig` had killed the command, by the one exit rule (`sandbox_host::Outcome::status`).
pub(super) fn interrupted(sig: Signal) -> i32 {
    sandbox_host::Outcome::Signaled(sig as i32).status().code
}

/// How a step ended, in words: from the status's own timeout flag and signal, never guessed
/// back from the code (a step may exit 130 by itself).
fn describe(status: ExitStatus) -> String {
    match status {
        ExitStatus {
            timed_out: true, ..
        } => "timed out".to_string(),
        ExitStatus {
            signal: Some(sig), ..
        } => format!("was killed by signal {sig}"),
        ExitStatus { code, .. } => format!("exited with status {code}"),
    }
}

/// Whether a step succeeded.
fn succeeded(status: ExitStatus) -> bool {
    status.code == 0
}

/// Probe, provision when the probe fails, probe again. `run` runs one step and says how it
/// ended; an error from it (the step could not run at all) ends the sequence.
pub fn ensure_ready(
    probe: Option<&str>,
    provision: Option<&str>,
    mut run: impl FnMut(Phase, &str) -> anyhow::Result<StepEnd>,
) -> anyhow::Result<Readiness> {
    let Some(probe) = probe else {
        return Ok(Readiness::Unchecked);
    };
    let code = match run(Phase::Probe, probe)? {
        StepEnd::Interrupted(sig) => return Ok(Readiness::Interrupted(sig)),
        StepEnd::Exited(status) if succeeded(status) => return Ok(Readiness::Ready),
        StepEnd::Exited(status) => status,
    };
    let Some(provision) = provision else {
        return Err(BoxError::NotReady {
            probe: probe.to_string(),
            how: describe(code),
        }
        .into());
    };
    eprintln!(
        "sandbox: exec: the probe {} ({probe:?}); provisioning",
        describe(code)
    );
    match run(Phase::Provision, provision)? {
        StepEnd::Interrupted(sig) => return Ok(Readiness::Interrupted(sig)),
        StepEnd::Exited(status) if succeeded(status) => {}
        StepEnd::Exited(code) => {
            return Err(BoxError::ProvisionFailed {
                provision: provision.to_string(),
                how: describe(code),
            }
            .into())
        }
    }
    match run(Phase::Reprobe, probe)? {
        StepEnd::Interrupted(sig) => Ok(Readiness::Interrupted(sig)),
        StepEnd::Exited(status) if succeeded(status) => Ok(Readiness::Provisioned),
        StepEnd::Exited(code) => Err(BoxError::StillNotReady {
            probe: probe.to_string(),
            provision: provision.to_string(),
            how: describe(code),
        }
        .into()),
    }
}

/// `--mount HOST:GUEST` for a backend that runs in place: HOST must be GUEST (compared as
/// paths, so `/a/:/a` passes). A path may itself hold a `:`, so every split is tried.
pub fn in_place_mount(spec: &str) -> Result<PathBuf, BoxError> {
    let same = spec.match_indices(':').find_map(|(i, _)| {
        let (host, guest) = (&spec[..i], &spec[i + 1..]);
        (!host.is_empty() && Path::new(host) == Path::new(guest)).then(|| PathBuf::from(host))
    });
    if let Some(path) = same {
        return Ok(path);
    }
    match spec.split_once(':') {
        Some((host, guest)) if !host.is_empty() && !guest.is_empty() => {
            Err(BoxError::MountElsewhere {
                spec: spec.to_string(),
                host: host.to_string(),
            })
        }
        _ => Err(BoxError::MountSyntax(spec.to_string())),
    }
}

/// Refuses what the chosen backend cannot honour, rather than ignoring it.
fn check_backend(kind: BackendKind, args: &ExecArgs) -> Result<(), BoxError> {
    // Every backend of this build runs on the host's file system (lima too, on a view):
    // none has an image to boot.
    if kind != BackendKind::Boxlite {
        if args.image.is_some() {
            return Err(BoxError::TakesNoImage {
                backend: kind,
                flag: "--image",
            });
        }
        if args.rootfs.is_some() {
            return Err(BoxError::TakesNoImage {
                backend: kind,
                flag: "--rootfs",
            });
        }
    }
    if kind == BackendKind::Lima {
        if let Some(spec) = args.mount.first() {
            return Err(BoxError::MountUnsupported(spec.clone()));
        }
    }
    Ok(())
}

fn setup(e: BoxError) -> anyhow::Error {
    Failure::setup_caused(e)
}

pub fn run(mut args: ExecArgs, ctx: &Context) -> anyhow::Result<i32> {
    if let Some(name) = &args.box_name {
        // The daemon's rule for box names: safe in file names, log lines and URLs.
        sandbox_service::registry::validate_name("--box", name)
            .map_err(|e| Failure::setup(e.message))?;
    }
    // BoxLite boxes belong to the daemon: this command becomes its client.
    let root =
        crate::session::task_root(&crate::session::workdir(args.sandbox.workdir.as_deref())?);
    let (kind, _) = crate::session::choose_backend(args.sandbox.backend.as_deref(), ctx, &root)?;
    if kind == BackendKind::Boxlite {
        return super::exec_box::run(args, ctx);
    }
    // A mount is a grant, so it must be in the policy from the start; whether the chosen
    // backend can take mounts at all is judged once it is known (`check_backend`).
    let mut sandbox = args.sandbox.clone();
    sandbox.allow_domain.extend(args.allow_net.iter().cloned());
    for spec in &args.mount {
        sandbox
            .allow_write
            .push(in_place_mount(spec).map_err(setup)?);
    }
    let mut session = Session::open(
        &sandbox,
        ctx,
        true,
        args.command.first().map(|c| c.as_os_str()),
    )?;
    check_backend(session.kind, &args).map_err(setup)?;
    session.box_name = args.box_name.take();
    let run = session.start(ctx, args.sandbox.allow_degraded)?;
    // Orphaned descendants (double fork + setsid) re-parent to us, so they can be killed
    // before each step is judged.
    let reaper = Reaper::install();
    // Installed first: from here on a signal reaches the command's group (or ends a step)
    // instead of ending us.
    let signals = SignalPipe::install()?;
    // Probe and provisioning copy their output to stderr through an async runtime; a plain
    // `exec` without them never builds one (every invocation pays for what it starts).
    let mut steps: Option<(tokio::runtime::Runtime, SignalRelay)> = None;
    let ready = ensure_ready(
        args.probe.as_deref(),
        args.provision.as_deref(),
        |phase, script| {
            let (runtime, relay) = match &mut steps {
                Some(built) => built,
                slot @ None => {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .context("starting the async runtime")?;
                    let relay = runtime.block_on(async { SignalRelay::install() })?;
                    slot.insert((runtime, relay))
                }
            };
            step(&session, &run, &reaper, runtime, relay, phase, script)
        },
    );
    match ready {
        // Dropping the session removes its private TMPDIR.
        Ok(Readiness::Interrupted(sig)) => return Ok(interrupted(sig)),
        Ok(readiness) => tracing::debug!(?readiness, "box ready"),
        Err(e) => {
            // Whatever stopped a step (it could not start, its sandbox failed), the command
            // did not run: 125, never a code of the step's own such as 127.
            return Err(match e.downcast::<BoxError>() {
                Ok(e) => setup(e),
                Err(other) => Failure::setup_chain(other),
            });
        }
    }

    let command = session.arm(&run, args.command)?;
    if args.sandbox.guard_args {
        session.guard_args(command.spec())?;
    }
    let program = command.display_program();
    tracing::debug!(backend = %command.kind(), spec = ?command.spec(), "exec");
    // Inherited stdio: the caller's descriptors themselves, so every byte and the EOF reach
    // the command unchanged and nothing of ours can interleave with its stdout. Started and
    // waited for as `sandbox run` does (no runtime, no fork of this process).
    let (waited, finished) = command.run_direct(super::run::direct_options(), &reaper, |child| {
        child.wait_relaying(&signals)
    });
    crate::session::report(&finished);
    Session::close(run);
    super::run::conclude(&finished, waited, &program)
}

/// Runs one probe or provisioning step as `/bin/sh -c SCRIPT` in the box: no stdin (the
/// caller's bytes are the command's), stdout and stderr copied to our stderr as they come.
fn step(
    session: &Session,
    run: &Run,
    reaper: &Reaper,
    runtime: &tokio::runtime::Runtime,
    relay: &mut SignalRelay,
    phase: Phase,
    script: &str,
) -> anyhow::Result<StepEnd> {
    let argv: Vec<OsString> = vec![SHELL.into(), "-c".into(), script.into()];
    let command = session
        .arm(run, argv)
        .with_context(|| format!("the {}", phase.as_str()))?;
    tracing::debug!(?phase, spec = ?command.spec(), "exec step");
    let options = SpawnOptions {
        stdin: StdinMode::Null,
        output: OutputMode::Capture(OutputLimits::default()),
        die_with_parent: true,
        ..SpawnOptions::default()
    };
    // Spawned inside the runtime (its pipes are the runtime's).
    let (mut running, live) = match runtime.block_on(async { command.spawn(options) }) {
        Ok(started) => started,
        Err(NotStarted { error, finished }) => {
            crate::session::report(&finished);
            return Err(anyhow::Error::from(error).context(format!("the {}", phase.as_str())));
        }
    };
    let mut output = running
        .take_output()
        .with_context(|| format!("the {}'s output was not captured", phase.as_str()))?;
    let waited = runtime.block_on(async {
        let forward = tokio::spawn(async move {
            while let Some(chunk) = output.recv().await {
                // Written synchronously: stderr is ours alone, and a step's output is small
                // beside the command's. A closed stderr must not stop the step: its output
                // just has nowhere to go.
                let mut stderr = std::io::stderr().lock();
                let _ = stderr.write_all(&chunk.data).and_then(|()| stderr.flush());
            }
        });
        let pid = running.pid();
        let mut interrupted = None;
        let outcome = {
            let wait = running.wait();
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    outcome = &mut wait => break outcome,
                    signal = relay.next() => {
                        interrupted = Some(signal);
                        process_group::signal_group(pid, signal);
                    }
                }
            }
        };
        // The group is gone; what it wrote is in the pipe or on its way.
        if tokio::time::timeout(DRAIN, forward).await.is_err() {
            tracing::debug!(
                ?phase,
                "a descendant kept the output open; stopped copying it"
            );
        }
        outcome.map(|o| (o, interrupted))
    });
    drop(running);
    let finished = live.finish(waited.as_ref().ok().map(|(o, _)| *o), reaper.reap());
    crate::session::report(&finished);
    let (outcome, interrupted) = waited.with_context(|| format!("the {}", phase.as_str()))?;
    if let Some(e) = finished.setup_error() {
        return Err(Failure::setup(format!("the {}: {e}", phase.as_str())));
    }
    Ok(match interrupted {
        Some(signal) => StepEnd::Interrupted(signal),
        None => StepEnd::Exited(finished.outcome(Ok(outcome)).status()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use sandbox_host::Outcome;

    #[allow(non_snake_case)]
    fn Exited(code: i32) -> StepEnd {
        StepEnd::Exited(Outcome::Exited(code).status())
    }

    /// Runs `ensure_ready` against scripted step results, returning the steps it ran.
    fn sequence(
        probe: Option<&str>,
        provision: Option<&str>,
        ends: &[StepEnd],
    ) -> (anyhow::Result<Readiness>, Vec<Phase>) {
        let mut ran = Vec::new();
        let mut ends = ends.iter().copied();
        let result = ensure_ready(probe, provision, |phase, _| {
            ran.push(phase);
            Ok(ends.next().expect("a step beyond the script"))
        });
        (result, ran)
    }

    #[test]
    fn the_probe_decides_whether_to_provision() {
        use Phase::*;
        let (r, ran) = sequence(None, None, &[]);
        assert_eq!((r.unwrap(), ran), (Readiness::Unchecked, vec![]));
        let (r, ran) = sequence(Some("p"), Some("i"), &[Exited(0)]);
        assert_eq!((r.unwrap(), ran), (Readiness::Ready, vec![Probe]));
        let (r, ran) = sequence(Some("p"), Some("i"), &[Exited(1), Exited(0), Exited(0)]);
        assert_eq!(
            (r.unwrap(), ran),
            (Readiness::Provisioned, vec![Probe, Provision, Reprobe])
        );
    }

    #[test]
    fn a_box_that_stays_unready_is_an_error_naming_the_step() {
        let (r, ran) = sequence(Some("p"), None, &[Exited(3)]);
        assert_eq!(ran.len(), 1);
        let e = r.unwrap_err().downcast::<BoxError>().unwrap();
        assert!(matches!(e, BoxError::NotReady { ref how, .. } if how.contains("status 3")));
        let (r, ran) = sequence(Some("p"), Some("i"), &[Exited(1), Exited(9)]);
        assert_eq!(ran.len(), 2, "no second probe after a failed provisioning");
        let e = r.unwrap_err().downcast::<BoxError>().unwrap();
        assert!(matches!(e, BoxError::ProvisionFailed { ref how, .. } if how.contains("9")));
        let timed_out = StepEnd::Exited(Outcome::TimedOut(Duration::from_secs(1)).status());
        let (r, _) = sequence(Some("p"), Some("i"), &[Exited(1), Exited(0), timed_out]);
        let e = r.unwrap_err().downcast::<BoxError>().unwrap();
        assert!(matches!(e, BoxError::StillNotReady { ref how, .. } if how == "timed out"));
    }

    /// A step's end is told from its status's own fields: a probe that exits 130 by itself
    /// exited with 130; one killed by SIGINT was killed.
    #[test]
    fn a_steps_end_is_described_from_its_status_not_guessed_from_the_code() {
        let (r, _) = sequence(Some("p"), None, &[Exited(130)]);
        let e = r.unwrap_err().downcast::<BoxError>().unwrap();
        assert!(
            matches!(e, BoxError::NotReady { ref how, .. } if how == "exited with status 130"),
            "{e}"
        );
        let killed = StepEnd::Exited(Outcome::Signaled(2).status());
        let (r, _) = sequence(Some("p"), None, &[killed]);
        let e = r.unwrap_err().downcast::<BoxError>().unwrap();
        assert!(
            matches!(e, BoxError::NotReady { ref how, .. } if how == "was killed by signal 2"),
            "{e}"
        );
    }

    #[test]
    fn an_interrupt_stops_the_sequence() {
        let (r, ran) = sequence(
            Some("p"),
            Some("i"),
            &[Exited(1), StepEnd::Interrupted(Signal::SIGINT)],
        );
        assert_eq!(r.unwrap(), Readiness::Interrupted(Signal::SIGINT));
        assert_eq!(ran, vec![Phase::Probe, Phase::Provision]);
        // `exec` then ends as a command SIGINT killed would.
        assert_eq!(super::interrupted(Signal::SIGINT), 130);
    }

    #[test]
    fn in_place_mounts_must_name_the_same_path() {
        assert_eq!(in_place_mount("/w/p:/w/p").unwrap(), Path::new("/w/p"));
        assert_eq!(in_place_mount("/w/p/:/w/p").unwrap(), Path::new("/w/p/"));
        // A path with a colon in it still pairs with itself.
        assert_eq!(
            in_place_mount("/w/a:b:/w/a:b").unwrap(),
            Path::new("/w/a:b")
        );
        assert!(matches!(
            in_place_mount("/work/project:/workspace"),
            Err(BoxError::MountElsewhere { ref host, .. }) if host == "/work/project"
        ));
        for bad in ["/w/p", ":/w/p", "/w/p:", ""] {
            assert!(
                matches!(in_place_mount(bad), Err(BoxError::MountSyntax(_))),
                "{bad:?}"
            );
        }
    }
}
