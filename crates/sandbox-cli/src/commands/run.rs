//! `sandbox run` and `sandbox shell`: one command through the run sequence
//! (`sandbox_host::run`) — prepare, arm, spawn, wait, reap what is left of it, finish.

use std::os::fd::AsRawFd as _;
use std::path::PathBuf;

use anyhow::Context as _;
use sandbox_exec::{ExecError, ExitOutcome, SignalPipe, SpawnOptions};
use sandbox_host::{Finished, Reaper};

use crate::cli::args::{RunArgs, ShellArgs};
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
    // The report's directory is opened now, before anything of the run exists: the run may
    // replace it with a link, and the report still lands where the user named it.
    let report_to = match &args.report_json {
        Some(path) if path.as_os_str() != "-" => Some(
            ReportFile::open(path)
                .map_err(|e| anyhow::anyhow!("--report-json {}: {e}", path.display()))?,
        ),
        _ => None,
    };
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
    if args.report_json.is_some() {
        write_report(report_to.as_ref(), code, &finished, &recovered)?;
    }
    Ok(code)
}

/// The `--report-json` document.
fn write_report(
    to: Option<&ReportFile>,
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
        // Files host tools run (`.claude/settings.json`, `.mcp.json`, `.vscode`…) the run
        // created (set aside) or changed (put back), each with the grant that allows it.
        "hostFiles": finished.host_files,
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
    match to {
        None => eprint!("{text}"),
        Some(file) => file
            .write_replacing(text.as_bytes())
            .map_err(|e| anyhow::anyhow!("writing the report {}: {e}", file.shown.display()))?,
    }
    Ok(())
}

/// Where `--report-json` goes: its directory, opened before the command starts, and the
/// file's name in it. The report often goes into the worktree, which the run can write: a
/// link it leaves at the file's name is replaced, never written through, and a link it puts
/// in place of the directory is never followed (the write goes through the descriptor).
struct ReportFile {
    dir: std::os::fd::OwnedFd,
    name: std::ffi::OsString,
    shown: PathBuf,
}

impl ReportFile {
    fn open(path: &std::path::Path) -> std::io::Result<ReportFile> {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => std::path::Path::new("."),
        };
        let name = path.file_name().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name")
        })?;
        let dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(dir)?;
        Ok(ReportFile {
            dir: dir.into(),
            name: name.to_os_string(),
            shown: path.to_path_buf(),
        })
    }

    /// Writes `bytes` as a new file in the directory (`O_EXCL`, a fresh name), renamed over
    /// the name.
    fn write_replacing(&self, bytes: &[u8]) -> std::io::Result<()> {
        use nix::fcntl::{openat, renameat, OFlag};
        use nix::sys::stat::Mode;
        use std::io::Write;
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let mode = Mode::from_bits_truncate(0o644);
        let mut attempt = 0u32;
        let (temp, fd) = loop {
            let temp = format!(
                ".{}.{}.{attempt}.tmp",
                self.name.to_string_lossy(),
                std::process::id()
            );
            match openat(Some(self.dir.as_raw_fd()), temp.as_str(), flags, mode) {
                Ok(fd) => break (temp, fd),
                Err(nix::errno::Errno::EEXIST) if attempt < 100 => attempt += 1,
                Err(e) => return Err(e.into()),
            }
        };
        // SAFETY: a descriptor openat just returned, owned by nothing else.
        let mut file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let written = file.write_all(bytes).and_then(|()| file.sync_data());
        drop(file);
        let dir = Some(self.dir.as_raw_fd());
        let renamed = written.and_then(|()| {
            renameat(dir, temp.as_str(), dir, self.name.as_os_str()).map_err(Into::into)
        });
        if renamed.is_err() {
            let _ =
                nix::unistd::unlinkat(dir, temp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
        }
        renamed
    }
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
