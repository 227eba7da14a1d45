//! `sandbox run` and `sandbox shell`.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::Context as _;
use sandbox_exec::{
    process_group, CommandPolicy, CommandRequest, CommandSpec, ExitOutcome, SignalRelay,
    SpawnOptions, WorkspaceGuard,
};
use sandbox_policy::EnvPolicy;

use crate::cli::{RunArgs, SandboxArgs, ShellArgs};
use crate::context::Context;
use crate::exit::Failure;

/// The resolved request: what runs where, under which backend.
struct Prepared {
    spec: CommandSpec,
    backend: String,
}

fn workdir(args: &SandboxArgs) -> anyhow::Result<PathBuf> {
    let dir = match &args.workdir {
        Some(d) => d.clone(),
        None => std::env::current_dir().context("the current directory is unusable")?,
    };
    std::fs::canonicalize(&dir)
        .map_err(|e| Failure::setup(format!("workdir {}: {e}", dir.display())))
}

fn prepare(args: &SandboxArgs, ctx: &Context, argv: Vec<OsString>) -> anyhow::Result<Prepared> {
    let config = ctx.config();
    let backend = args
        .backend
        .clone()
        .or_else(|| config.backend.clone())
        .unwrap_or_else(|| "host".to_string());
    if backend != "host" {
        return Err(Failure::setup(format!(
            "unknown backend {backend:?}; available: host"
        )));
    }
    let dir = workdir(args)?;

    let mut env = EnvPolicy::default();
    for name in &config.env.pass {
        env.add_arg(name).map_err(Failure::setup)?;
    }
    for (name, value) in &config.env.set {
        env.set_var(name, value.clone());
    }
    for arg in &args.env {
        env.add_arg(arg)
            .map_err(|e| Failure::setup(format!("--env {arg}: {e}")))?;
    }
    env.set_var("SANDBOX_BACKEND", backend.clone());

    let timeout = match (args.timeout, &config.timeout) {
        (Some(t), _) => Some(t),
        (None, Some(text)) => Some(crate::cli::parse_duration(text).map_err(Failure::setup)?),
        (None, None) => None,
    };

    let guard = WorkspaceGuard::new(&dir)?.check_args(args.guard_args);
    let cwd = match &args.cd {
        Some(cd) => guard.check_path(&dir, cd)?,
        None => dir.clone(),
    };
    let mut spec = CommandSpec::new(CommandRequest::Argv(argv), &cwd)?;
    spec.env = env.resolve(std::env::vars_os());
    spec.timeout = timeout;
    guard.admit(&spec)?;
    Ok(Prepared { spec, backend })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn finish(outcome: ExitOutcome, prepared: &Prepared) -> i32 {
    if let ExitOutcome::TimedOut(after) = outcome {
        eprintln!(
            "sandbox: {}: timed out after {}; its process group was killed",
            prepared.spec.display_program(),
            humantime::format_duration(after)
        );
    }
    outcome.code()
}

pub fn run(args: RunArgs, ctx: &Context) -> anyhow::Result<i32> {
    let prepared = prepare(&args.sandbox, ctx, args.command)?;
    tracing::debug!(backend = %prepared.backend, spec = ?prepared.spec, "run");
    // Orphaned descendants (double fork + setsid) re-parent to us, so they can be killed.
    if let Err(e) = process_group::become_subreaper() {
        tracing::debug!(error = %e, "could not become a child subreaper");
    }
    let outcome = runtime()?.block_on(async {
        let mut relay = SignalRelay::install()?;
        let options = SpawnOptions {
            die_with_parent: true,
            ..SpawnOptions::default()
        };
        let mut running = sandbox_exec::spawn(&prepared.spec, options)?;
        running.wait_relaying(&mut relay).await
    });
    process_group::kill_orphans(&[]);
    Ok(finish(outcome?, &prepared))
}

pub fn shell(args: ShellArgs, ctx: &Context) -> anyhow::Result<i32> {
    let shell = args
        .shell
        .clone()
        .or_else(|| std::env::var_os("SHELL").map(PathBuf::from))
        .filter(|s| !s.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("/bin/sh"));
    let argv = vec![shell.into_os_string(), "-l".into()];
    let prepared = prepare(&args.sandbox, ctx, argv)?;
    if let Err(e) = process_group::become_subreaper() {
        tracing::debug!(error = %e, "could not become a child subreaper");
    }
    let outcome = runtime()?.block_on(sandbox_exec::run_interactive(
        &prepared.spec,
        sandbox_exec::PtyOptions::default(),
    ));
    process_group::kill_orphans(&[]);
    Ok(finish(outcome?, &prepared))
}
