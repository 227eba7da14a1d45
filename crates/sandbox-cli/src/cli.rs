//! The command-line surface (clap). Help text here is the user's manual: keep it teaching.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "sandbox",
    version,
    about = "Run an AI coding agent's commands and shells inside an isolation boundary",
    long_about = "Run an AI coding agent's commands, hooks and shells inside an isolation boundary \
chosen per task worktree, while its edits and commits still land on your real project.\n\n\
The default backend confines the command with kernel limits (Landlock and seccomp on Linux, \
Seatbelt on macOS): it may write the worktree and the git data a commit needs, read system \
directories, and nothing else. If the boundary cannot be set up, nothing runs (exit 125).",
    after_help = "Examples:\n  sandbox run -- cargo test\n  sandbox run --block-net --allow-port 3000 -- npm run dev\n  sandbox shell -C ~/work/myproj-task1\n  sandbox policy show --json\n\n\
Exit codes: the command's own; 124 timed out; 125 the sandbox could not be set up; \
126 not executable; 127 not found; 128+N killed by signal N.\n\
Logs: SANDBOX_LOG=debug (to stderr)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command inside the sandbox; its stdio passes through, its exit code is returned.
    #[command(
        after_help = "Everything after `--` is the command, run as an argv (no shell). Use \
`sandbox run -- sh -c '…'` when you want a shell.\n\nExamples:\n  sandbox run -- make test\n  \
sandbox run --timeout 5m --env CARGO_HOME -- cargo build"
    )]
    Run(RunArgs),
    /// Start an interactive login shell inside the sandbox, on a fresh pseudo-terminal.
    Shell(ShellArgs),
    /// Manage sandbox views: tracked-files worktrees on `s/<branch>` for VM backends.
    #[command(subcommand)]
    View(crate::commands::view::ViewCommand),
    /// Print shell completions (bash, zsh, fish, elvish, powershell) to stdout.
    Completions {
        /// The shell to generate completions for.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) to stdout.
    Man,
}

/// Options shared by every command that runs something in a sandbox.
#[derive(Debug, Clone, Args)]
pub struct SandboxArgs {
    /// The task's worktree (the sandbox's working directory). Default: the current directory.
    #[arg(short = 'C', long = "workdir", value_name = "DIR")]
    pub workdir: Option<PathBuf>,

    /// The isolation backend: host (none, explicit opt-out).
    /// Default: what `sandbox use` chose for this worktree, else `backend` in the config.
    #[arg(long, value_name = "NAME")]
    pub backend: Option<String>,

    /// Pass NAME from this terminal into the sandbox, or set NAME=VALUE. Repeatable.
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    pub env: Vec<String>,

    /// Kill the command's whole process group after this long (e.g. 30s, 5m); exit 124.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,

    /// Start in this directory, which must resolve (symlinks and `..` followed on the real
    /// filesystem) inside the workdir; relative to the workdir.
    #[arg(long = "cd", value_name = "PATH")]
    pub cd: Option<PathBuf>,

    /// Also refuse path arguments of the command that resolve outside the workdir (an early,
    /// friendly check; the sandbox itself is the boundary).
    #[arg(long)]
    pub guard_args: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub sandbox: SandboxArgs,

    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(Debug, Args)]
pub struct ShellArgs {
    #[command(flatten)]
    pub sandbox: SandboxArgs,

    /// The shell to start (default: $SHELL, else /bin/sh). Run as a login shell (`-l`).
    #[arg(long, value_name = "PATH")]
    pub shell: Option<PathBuf>,
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration (try 30s, 5m, 1h): {e}"))?;
    if d.is_zero() {
        return Err("a timeout of zero would kill the command before it starts".into());
    }
    Ok(d)
}
