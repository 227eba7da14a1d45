//! `sandbox run` and `sandbox shell`: one command through the backend seam — prepare, spawn,
//! wait, kill what is left of it, finish.

use std::path::PathBuf;

use anyhow::Context as _;
use sandbox_exec::{process_group, ExitOutcome, SignalPipe, SpawnOptions};
use sandbox_host::Finished;

use crate::cli::{RunArgs, ShellArgs};
use crate::context::Context;
use crate::session::Session;

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// The exit status of a finished run: 125 when the backend failed before the command started
/// (its message is already on stderr), else the command's own.
fn conclude(finished: &Finished, outcome: ExitOutcome, program: &str) -> i32 {
    if let (None, ExitOutcome::TimedOut(after)) = (finished.setup_error(), outcome) {
        eprintln!(
            "sandbox: {program}: timed out after {}; its process group was killed",
            humantime::format_duration(after)
        );
    }
    finished.exit_code(outcome)
}

pub fn run(args: RunArgs, ctx: &Context) -> anyhow::Result<i32> {
    let mut session = Session::open(&args.sandbox, ctx, true)?;
    let backend = session.start(args.sandbox.allow_degraded)?;
    let command = session.command(&*backend, args.command)?;
    if args.sandbox.guard_args {
        session.guard_args(&command.spec)?;
    }
    let program = command.display_program();
    tracing::debug!(backend = %command.kind, spec = ?command.spec, "run");
    // Orphaned descendants (double fork + setsid) re-parent to us, so they can be killed.
    if let Err(e) = process_group::become_subreaper() {
        tracing::debug!(error = %e, "could not become a child subreaper");
    }
    // No async runtime and no fork of this process: start, wait, relay signals (the
    // per-command cost is the product's latency; BENCHMARKS.md).
    let outcome = (|| {
        let relay = SignalPipe::install()?;
        let options = SpawnOptions {
            die_with_parent: true,
            ..SpawnOptions::default()
        };
        let mut child = command.spawn_direct(options)?;
        child.wait_relaying(&relay)
    })();
    // Every process of the run is gone before the seam judges it and checks the pointers.
    process_group::kill_orphans(&[]);
    let finished = session.finish(command, outcome.as_ref().ok().copied());
    let outcome = outcome?;
    let code = conclude(&finished, outcome, &program);
    if let Some(path) = &args.report_json {
        write_report(path, code, &finished)?;
    }
    Ok(code)
}

/// The `--report-json` document.
fn write_report(path: &std::path::Path, exit_code: i32, finished: &Finished) -> anyhow::Result<()> {
    let (git_store, git_store_error) = match &finished.git_store {
        Some(Ok(report)) => (Some(report), None),
        Some(Err(e)) => (None, Some(e.as_str())),
        None => (None, None),
    };
    let report = serde_json::json!({
        "exitCode": exit_code,
        "setupError": finished.setup_error().map(ToString::to_string),
        "warnings": finished.warnings(),
        "gitStore": git_store,
        "gitStoreError": git_store_error,
        "gitDir": finished.git_dir,
    });
    let text = serde_json::to_string_pretty(&report)? + "\n";
    if path.as_os_str() == "-" {
        eprint!("{text}");
    } else {
        write_replacing(path, text.as_bytes())
            .map_err(|e| anyhow::anyhow!("writing the report {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Writes `bytes` to `path` as a new file renamed into place. The report often goes into the
/// worktree, where an earlier sandboxed run may have left a link at that name (to
/// `~/.bashrc`, say): the link is replaced, never written through. Nothing of the run is
/// alive by now to swap anything between the two steps.
fn write_replacing(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"))?;
    let mut file = tempfile::Builder::new()
        .prefix(&format!(".{}.", name.to_string_lossy()))
        .suffix(".tmp")
        .permissions(std::fs::Permissions::from_mode(0o644))
        .tempfile_in(dir)?;
    file.write_all(bytes)?;
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}

pub fn shell(args: ShellArgs, ctx: &Context) -> anyhow::Result<i32> {
    let shell = args
        .shell
        .clone()
        .or_else(|| std::env::var_os("SHELL").map(PathBuf::from))
        .filter(|s| !s.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("/bin/sh"));
    let mut session = Session::open(&args.sandbox, ctx, true)?;
    let backend = session.start(args.sandbox.allow_degraded)?;
    let command = session.command(&*backend, vec![shell.into_os_string(), "-l".into()])?;
    let program = command.display_program();
    if let Err(e) = process_group::become_subreaper() {
        tracing::debug!(error = %e, "could not become a child subreaper");
    }
    let outcome = runtime()?.block_on(command.run_interactive(None));
    process_group::kill_orphans(&[]);
    let finished = session.finish(command, outcome.as_ref().ok().copied());
    Ok(conclude(&finished, outcome?, &program))
}
