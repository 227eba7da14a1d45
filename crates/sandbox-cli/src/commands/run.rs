//! `sandbox run` and `sandbox shell`: one command through the run sequence
//! (`sandbox_host::run`) — prepare, arm, spawn, wait, reap what is left of it, finish.

use std::path::PathBuf;

use anyhow::Context as _;
use sandbox_exec::{ExecError, ExitOutcome, SignalPipe, SpawnOptions};
use sandbox_host::{Finished, Reaper};

use crate::cli::{RunArgs, ShellArgs};
use crate::context::Context;
use crate::session::Session;

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// The exit status of a finished command, from the one exit rule: 125 when the backend failed
/// before the command started (its message is already on stderr), else the command's own. A
/// command that could not start at all is the error (126/127, its message printed by `main`).
pub fn conclude(
    finished: &Finished,
    waited: Result<ExitOutcome, ExecError>,
    program: &str,
) -> anyhow::Result<i32> {
    let outcome = finished.outcome(waited.as_ref().copied());
    if finished.setup_error().is_none() {
        let outcome = waited?;
        if let ExitOutcome::TimedOut(after) = outcome {
            eprintln!(
                "sandbox: {program}: timed out after {}; its process group was killed",
                humantime::format_duration(after)
            );
        }
    }
    Ok(outcome.status().code)
}

/// How `run` and `exec` start their command: inherited stdio, and the command dies with us.
pub fn direct_options() -> SpawnOptions {
    SpawnOptions {
        die_with_parent: true,
        ..SpawnOptions::default()
    }
}

pub fn run(args: RunArgs, ctx: &Context) -> anyhow::Result<i32> {
    let program = args.command.first().map(|c| c.as_os_str());
    let mut session = Session::open(&args.sandbox, ctx, true, program)?;
    let run = session.start(ctx, args.sandbox.allow_degraded)?;
    let command = session.arm(&run, args.command)?;
    if args.sandbox.guard_args {
        session.guard_args(command.spec())?;
    }
    let program = command.display_program();
    tracing::debug!(backend = %command.kind(), spec = ?command.spec(), "run");
    // Orphaned descendants (double fork + setsid) re-parent to us, so they can be killed.
    let reaper = Reaper::install();
    let relay = SignalPipe::install()?;
    // No async runtime and no fork of this process: start, wait, relay signals (the
    // per-command cost is the product's latency; BENCHMARKS.md).
    let (waited, finished) = command.run_direct(direct_options(), &reaper, |child| {
        child.wait_relaying(&relay)
    });
    crate::session::report(&finished);
    let recovered = run.recovered().to_vec();
    Session::close(run);
    let code = conclude(&finished, waited, &program)?;
    if let Some(path) = &args.report_json {
        write_report(path, code, &finished, &recovered)?;
    }
    Ok(code)
}

/// The `--report-json` document.
fn write_report(
    path: &std::path::Path,
    exit_code: i32,
    finished: &Finished,
    recovered: &[sandbox_host::run::Recovered],
) -> anyhow::Result<()> {
    let (git_store, git_store_error) = match &finished.git_store {
        Some(Ok(report)) => (Some(report), None),
        Some(Err(e)) => (None, Some(e.to_string())),
        None => (None, None),
    };
    let git_push: Vec<serde_json::Value> = finished
        .git_push
        .iter()
        .map(|(remote, report)| match report {
            Ok(report) => serde_json::json!({ "remote": remote, "report": report }),
            Err(e) => serde_json::json!({ "remote": remote, "error": e.to_string() }),
        })
        .collect();
    let report = serde_json::json!({
        "exitCode": exit_code,
        "setupError": finished.setup_error().map(ToString::to_string),
        "warnings": finished.warnings(),
        "gitStore": git_store,
        "gitStoreError": git_store_error,
        "gitDir": finished.git_dir,
        // Repositories the run created in the worktree (set aside unless
        // --allow-nested-git), and `.git` files it re-pointed (restored).
        "nestedGit": finished.nested_git,
        "gitPush": git_push,
        // Every connection the domain proxy answered (--allow-domain), allowed or refused.
        "connections": finished.connections,
        // The after-run checks of killed runs of this worktree, done before this run.
        "recovered": recovered,
        // Each resource limit with its mechanism, and what the run's cgroups counted (peak
        // memory, the most processes at once, OOM kills).
        "limits": finished.limits,
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
    let mut session = Session::open(&args.sandbox, ctx, true, None)?;
    if let Some(home) = &session.policy.fs.home {
        rc_notice_once(home);
    }
    let run = session.start(ctx, args.sandbox.allow_degraded)?;
    let command = session.arm(&run, vec![shell.into_os_string(), "-l".into()])?;
    let program = command.display_program();
    let reaper = Reaper::install();
    let (waited, live) = runtime()?.block_on(command.run_interactive(None));
    let finished = live.finish(waited.as_ref().ok().copied(), reaper.reap());
    crate::session::report(&finished);
    Session::close(run);
    conclude(&finished, waited, &program)
}

/// The first shell in a private home says, once, that none of the user's rc files is read
/// there (a marker beside the home, outside what the shell can write, remembers it).
fn rc_notice_once(home: &sandbox_policy::HomePolicy) {
    let (Some(parent), Some(name)) = (home.dir.parent(), home.dir.file_name()) else {
        return;
    };
    let marker = parent.join(format!("{}.rc-noticed", name.to_string_lossy()));
    if marker.exists() {
        return;
    }
    eprintln!(
        "sandbox: notice: this shell's HOME is the private home {} (`sandbox home`): none of \
         your rc files is read; it starts with a minimal .bashrc and .profile of ours. \
         (Said once.)",
        home.dir.display()
    );
    if let Err(e) = std::fs::write(&marker, b"") {
        tracing::debug!(path = %marker.display(), error = %e, "could not remember the rc notice");
    }
}
