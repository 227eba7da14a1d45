//! `sandbox run` and `sandbox shell`.

use std::path::PathBuf;

use anyhow::Context as _;
use sandbox_exec::{process_group, ExitOutcome, PtyOptions, SignalRelay, SpawnOptions};

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
    process_group::kill_orphans(&[]);
    session.finish();
    Ok(report_outcome(outcome?, &program))
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
    process_group::kill_orphans(&[]);
    session.finish();
    Ok(report_outcome(outcome?, &program))
}
