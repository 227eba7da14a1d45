//! `sandbox run` and `sandbox shell`.

use std::path::PathBuf;

use anyhow::Context as _;
use sandbox_exec::{process_group, ExitOutcome, PtyOptions, SignalRelay, SpawnOptions};
use sandbox_host::{Prepared, RunEnd};

use crate::cli::{RunArgs, ShellArgs};
use crate::context::Context;
use crate::session::Session;

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn report_outcome(outcome: ExitOutcome, program: &str) -> i32 {
    if let ExitOutcome::TimedOut(after) = outcome {
        eprintln!(
            "sandbox: {program}: timed out after {}; its process group was killed",
            humantime::format_duration(after)
        );
    }
    outcome.code()
}

/// Asks the backend whether the command started (before `Session::finish` removes the
/// private TMPDIR, where the nono backend's start marker lives).
fn judge<E>(prepared: &Prepared, outcome: &Result<ExitOutcome, E>) -> Option<RunEnd> {
    outcome.as_ref().ok().map(|o| prepared.judge(*o))
}

/// The exit status of a finished run: a backend that failed before the command started
/// (nono) ends the run with 125; a custom launcher's unsuccessful exit is reported (red on a
/// terminal) with its status.
fn conclude(end: Option<RunEnd>, outcome: ExitOutcome, program: &str) -> i32 {
    match end.unwrap_or(RunEnd::Command) {
        RunEnd::Command => report_outcome(outcome, program),
        RunEnd::SetupFailed(e) => {
            eprintln!("{}", crate::exit::red_on_terminal(&format!("sandbox: {e}")));
            125
        }
        RunEnd::Launcher { launcher, outcome } => {
            let how = match outcome {
                ExitOutcome::Signaled(sig) => format!("was killed by signal {sig}"),
                other => format!("exited with status {}", other.code()),
            };
            eprintln!(
                "{}",
                crate::exit::red_on_terminal(&format!(
                    "sandbox: custom: the launcher {} {how} (a launcher exits non-zero to \
                     refuse; either way nothing ran outside it)",
                    launcher.display()
                ))
            );
            report_outcome(outcome, program)
        }
    }
}

pub fn run(args: RunArgs, ctx: &Context) -> anyhow::Result<i32> {
    let mut session = Session::open(&args.sandbox, ctx, true)?;
    let prepared = session.prepare(args.command, args.sandbox.allow_degraded)?;
    if args.sandbox.guard_args {
        session.guard_args(&prepared.spec)?;
    }
    let program = prepared.spec.display_program();
    tracing::debug!(backend = %prepared.kind, spec = ?prepared.spec, "run");
    // Orphaned descendants (double fork + setsid) re-parent to us, so they can be killed.
    if let Err(e) = process_group::become_subreaper() {
        tracing::debug!(error = %e, "could not become a child subreaper");
    }
    let outcome = runtime()?.block_on(async {
        let mut relay = SignalRelay::install()?;
        let options = SpawnOptions {
            setup: prepared.setup.clone(),
            die_with_parent: true,
            ..SpawnOptions::default()
        };
        let mut running = sandbox_exec::spawn(&prepared.spec, options)?;
        running.wait_relaying(&mut relay).await
    });
    let end = judge(&prepared, &outcome);
    process_group::kill_orphans(&[]);
    session.finish();
    Ok(conclude(end, outcome?, &program))
}

pub fn shell(args: ShellArgs, ctx: &Context) -> anyhow::Result<i32> {
    let shell = args
        .shell
        .clone()
        .or_else(|| std::env::var_os("SHELL").map(PathBuf::from))
        .filter(|s| !s.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("/bin/sh"));
    let mut session = Session::open(&args.sandbox, ctx, true)?;
    let prepared = session.prepare(
        vec![shell.into_os_string(), "-l".into()],
        args.sandbox.allow_degraded,
    )?;
    let program = prepared.spec.display_program();
    if let Err(e) = process_group::become_subreaper() {
        tracing::debug!(error = %e, "could not become a child subreaper");
    }
    let outcome = runtime()?.block_on(sandbox_exec::run_interactive(
        &prepared.spec,
        PtyOptions {
            setup: prepared.setup.clone(),
            kill_grace: None,
        },
    ));
    let end = judge(&prepared, &outcome);
    process_group::kill_orphans(&[]);
    session.finish();
    Ok(conclude(end, outcome?, &program))
}
