//! The `sandbox` binary: parse, dispatch, turn the outcome into an exit status. The
//! mechanism lives in the library crates; this stays thin.

mod cli;
mod commands;
mod config;
mod context;
mod exit;
mod paths;
mod registry;
mod session;
mod state;
mod text;
mod tools;

use clap::{CommandFactory, Parser};

use sandbox_host::assembly::home::bound;

use crate::cli::{Cli, Command};
use crate::context::Context;

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SANDBOX_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

fn main() {
    // The measure of a project's cache layers a command left, in a process of its own
    // (`sandbox_host::assembly::home::bound`): not a command of the CLI's.
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|a| a == bound::MEASURE_ARG) {
        if let (Some(layers), Some(token)) = (args.next(), args.next()) {
            bound::record(std::path::Path::new(&layers), &token.to_string_lossy());
        }
        return;
    }
    // `sandbox run` is what agents call thousands of times: parse it without building every
    // other subcommand's arguments.
    let parsed = if std::env::args_os().nth(1).is_some_and(|a| a == "run") {
        cli::RunCli::try_parse().map(Cli::from)
    } else {
        Cli::try_parse()
    };
    let cli = match parsed {
        Ok(cli) => cli,
        Err(mut err) => {
            if err.kind() == clap::error::ErrorKind::UnknownArgument {
                cli::intent::explain(&mut err);
            }
            // `run` and `shell` wrap a command: like env(1) and timeout(1), a usage error of
            // the wrapper itself is 125 ("nothing ran"), never a code the command could return.
            let wraps = matches!(
                std::env::args().nth(1).as_deref(),
                Some("run") | Some("shell") | Some("exec")
            );
            let code = match (err.use_stderr(), wraps) {
                (false, _) => 0,
                (true, true) => 125,
                (true, false) => err.exit_code(),
            };
            let _ = err.print();
            if wraps && err.kind() == clap::error::ErrorKind::UnknownArgument {
                let argv: Vec<String> = std::env::args().collect();
                let invalid = err
                    .get(clap::error::ContextKind::InvalidArg)
                    .and_then(|v| match v {
                        clap::error::ContextValue::String(s) => Some(s.clone()),
                        _ => None,
                    });
                if let Some(hint) = invalid.and_then(|arg| cli::missing_separator_hint(&argv, &arg))
                {
                    eprintln!("sandbox: {hint}");
                }
            }
            std::process::exit(code);
        }
    };
    init_logging();
    let runs_something = matches!(
        cli.command,
        Command::Run(_) | Command::Shell(_) | Command::Exec(_) | Command::Policy(_)
    );
    // These end with their command: what it left in the cache layers is measured after.
    if matches!(
        cli.command,
        Command::Run(_) | Command::Shell(_) | Command::Exec(_)
    ) {
        if let Ok(exe) = std::env::current_exe() {
            bound::measure_with(bound::Measurer::Process(exe));
        }
    }
    let result = dispatch(cli);
    let code = match result {
        Ok(code) => code,
        // `sandbox man | head`: the reader left; end quietly, as a tool killed by SIGPIPE.
        Err(err) if exit::is_broken_pipe(&err) => {
            sandbox_exec::Outcome::Signaled(libc::SIGPIPE).status().code
        }
        Err(err) => {
            exit::report(&err);
            exit::code_for(&err, if runs_something { 125 } else { 1 })
        }
    };
    std::process::exit(code);
}

fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Completions { shell } => {
            // Rendered to memory first: clap_complete panics on a failed write.
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "sandbox", &mut out);
            std::io::Write::write_all(&mut std::io::stdout().lock(), &out)?;
            Ok(0)
        }
        Command::Man => {
            let mut out = Vec::new();
            clap_mangen::Man::new(Cli::command()).render(&mut out)?;
            std::io::Write::write_all(&mut std::io::stdout().lock(), &out)?;
            Ok(0)
        }
        Command::Run(args) => {
            let ctx = Context::load()?;
            commands::run::run(args, &ctx)
        }
        Command::Shell(args) => {
            let ctx = Context::load()?;
            commands::run::shell(args, &ctx)
        }
        Command::Exec(args) => {
            let ctx = Context::load()?;
            commands::exec::run(args, &ctx)
        }
        Command::Use(args) => {
            let ctx = Context::load()?;
            commands::use_backend::run(args, &ctx)
        }
        Command::Policy(crate::cli::PolicyCommand::Show(args)) => {
            let ctx = Context::load()?;
            commands::policy::run(args, &ctx)
        }
        Command::Why(args) => {
            let ctx = Context::load()?;
            commands::why::run(args, &ctx)
        }
        Command::Doctor(args) => {
            let ctx = Context::load()?;
            commands::doctor::run(args, &ctx)
        }
        Command::Home(args) => {
            let ctx = Context::load()?;
            commands::home::run(args, &ctx)
        }
        Command::View(cmd) => {
            let ctx = Context::load()?;
            commands::view::run(cmd, &ctx)
        }
        // No Context: `config` must work to repair a configuration that does not parse.
        Command::Config(cmd) => commands::config::run(cmd),
        Command::Lima(cmd) => {
            let ctx = Context::load()?;
            commands::lima::run(cmd, &ctx)
        }
        Command::Serve(args) => {
            let ctx = Context::load()?;
            commands::serve::run(args, &ctx)
        }
        Command::Ps(args) => {
            let ctx = Context::load()?;
            commands::ps::run(args, &ctx)
        }
        // No Context: a sandboxed process cannot read the user's configuration, and needs none.
        Command::Hook(args) => commands::hook::run(args),
    }
}
