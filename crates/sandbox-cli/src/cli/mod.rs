//! The command-line surface (clap). Help text here is the user's manual: keep it teaching.

use clap::{Parser, Subcommand};

pub mod args;
pub mod intent;

pub use args::{
    missing_separator_hint, DoctorArgs, ExecArgs, HomeArgs, PolicyCommand, RunArgs, ShellArgs,
    UseArgs, WhyArgs,
};

#[derive(Debug, Parser)]
#[command(
    name = "sandbox",
    version,
    about = "Run an AI coding agent's commands and shells inside an isolation boundary",
    long_about = "Run an AI coding agent's commands, hooks and shells inside an isolation boundary \
chosen per task worktree, while its edits and commits still land on your real project.\n\n\
The default backend (native) gives the command a private view of the machine, built with \
namespaces, Landlock and seccomp on Linux (Seatbelt on macOS): it writes the worktree and the \
git data a commit needs, reads the system directories, and has a private home of the project's \
own in place of yours — your toolchains (rustup, pyenv, nvm…) read-only at their real paths, \
your package caches as layers it may add to but never change, your secrets absent. Commits \
land on the task branch; other branches, hooks and config stay as they were, and what the \
host does not take is said after the run. The network is open unless --block-net or \
--allow-domain. If the boundary cannot be set up, nothing runs (exit 125); `sandbox why PATH` \
and `sandbox doctor` explain what a run can reach.",
    after_help = "Examples:\n  sandbox run -- cargo test\n  sandbox run --block-net --allow-port 3000 -- npm run dev\n  sandbox shell -C ~/work/myproj-task1\n  sandbox policy show --json\n\n\
Exit codes: the command's own; 124 timed out; 125 the sandbox could not be set up; \
126 not executable; 127 not found; 128+N killed by signal N.\n\
Logs: SANDBOX_LOG=debug (to stderr)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

const RUN_ABOUT: &str =
    "Run a command inside the sandbox; its stdio passes through, its exit code is returned.";
const RUN_AFTER_HELP: &str = "Everything after `--` is the command, run as an argv (no shell). \
Use `sandbox run -- sh -c '…'` when you want a shell.\n\nExamples:\n  sandbox run -- make test\n  \
sandbox run --timeout 5m --env CARGO_HOME -- cargo build";

/// `sandbox run …` parsed on its own: the same `run` subcommand as [`Cli`]'s, without building
/// the arguments of every other subcommand first (most of clap's work at start-up, paid by
/// every agent command). `main` uses it when the first argument is `run`; a test keeps its
/// help and errors identical to the full parser's.
#[derive(Debug, Parser)]
#[command(name = "sandbox", version)]
pub struct RunCli {
    #[command(subcommand)]
    command: RunOnly,
}

#[derive(Debug, Subcommand)]
enum RunOnly {
    #[command(about = RUN_ABOUT, after_help = RUN_AFTER_HELP)]
    Run(RunArgs),
}

impl From<RunCli> for Cli {
    fn from(run: RunCli) -> Self {
        let RunOnly::Run(args) = run.command;
        Cli {
            command: Command::Run(args),
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    #[command(about = RUN_ABOUT, after_help = RUN_AFTER_HELP)]
    Run(RunArgs),
    /// Start an interactive login shell inside the sandbox, on a fresh pseudo-terminal.
    Shell(ShellArgs),
    /// Run a command in a box as a stdio proxy: prepare the box (probe, provision), then relay
    /// stdin and stdout byte for byte. For an ACP host or any tool that speaks to a command's
    /// stdio.
    ///
    /// To its caller `sandbox exec … -- AGENT` looks like AGENT itself: stdout carries only the
    /// command's bytes (every diagnostic, notice and provisioning line goes to stderr), stdin
    /// reaches it unchanged up to and including EOF, and the exit code is the command's own.
    /// There is no pseudo-terminal.
    ///
    /// The box: with the in-place backends (native, nono, custom, host) it is the sandbox of the
    /// task worktree (--workdir, default the current directory) with this command's policy.
    /// --probe runs first, as `/bin/sh -c PROBE` in that sandbox; if it fails, --provision runs
    /// the same way and the probe is asked again; only then does CMD start. Probe and
    /// provisioning read no stdin and write to stderr only. --box NAME labels the box
    /// (SANDBOX_BOX); these backends keep nothing between runs, so the probe decides every
    /// time whether to provision. (The daemon's named boxes and BoxLite images are not used
    /// by this command yet.)
    #[command(after_help = "Examples:\n  \
# an ACP agent, installed into the task worktree on first use\n  \
sandbox exec --workdir ~/work/proj-task1 --probe 'test -x .tools/bin/pi-acp' \\\n      \
--provision 'npm install --prefix .tools pi-acp' -- .tools/bin/pi-acp\n  \
# one JSON-RPC line in, the agent's answer out, nothing else on stdout\n  \
echo '{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\"}' | sandbox exec -- python3 agent.py\n  \
# the nono backend, with a domain allow-list\n  \
sandbox exec --backend nono --allow-net registry.npmjs.org --probe 'test -d node_modules' \\\n      \
--provision 'npm ci' -- node server.js\n\n\
# a BoxLite microVM (builds with the `boxlite` feature), through the daemon, reused by name\n  \
sandbox exec --backend boxlite --box agent --rootfs target/box-image \\\n      \
--mount ~/work/proj:/work/proj --allow-net registry.npmjs.org -- pi-acp\n\n\
Flags for image-based backends: --image REF and --rootfs DIR choose the box's root file system: \
boxlite boots it; the backends that run on this machine's file system refuse them (exit 125), \
never ignore them. --mount HOST:GUEST: with boxlite, HOST appears at GUEST in the VM; in place, \
a path can only appear at itself, so GUEST must be HOST, and the mount is a read-write grant (as \
--allow-write HOST); lima refuses mounts. --allow-net HOST: boxlite's allow-list (names, \
CIDRs); otherwise --allow-domain HOST, which only nono can enforce; the others refuse to run. \
With boxlite the daemon owns the box (started if none runs); its steps and failures, with the \
box's log paths, go to stderr (docs/boxlite.md).\n\n\
Exit codes: the command's own; 125 when nothing ran: the sandbox could not be set up, a flag \
this backend cannot honour, or the box is not ready (the probe failed without --provision, \
provisioning failed, or the probe still fails after it); 126/127 the command cannot run; \
128+N killed by signal N.")]
    Exec(ExecArgs),
    /// Remember the backend for this task worktree (or show the current choice).
    #[command(
        name = "use",
        after_help = "The choice is stored in your state directory ($XDG_STATE_HOME/sandbox), \
never in the worktree. Every later `run`, `shell` and hook for this worktree uses it until \
changed.\n\nExamples:\n  sandbox use native\n  sandbox use            # show\n  sandbox use --clear"
    )]
    Use(UseArgs),
    /// Show the resolved policy and its compiled form for a backend (the dry run).
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Show (or reset) the private home of this task (or project): where it is, the disk it
    /// and its cache layers take, the toolchains found on this machine.
    #[command(
        after_help = "Each run of the native and custom backends gets HOME in a private, persistent directory under $XDG_STATE_HOME/sandbox/homes, one per task (worktree), with its own cache layers: one task's run cannot leave start-up code (a .bashrc line, a Python .pth) that another task's run executes. `home: per-project` in the configuration shares one between the worktrees of a repository. Under the native view it is mounted at your real home's path, your toolchains read-only on top of it and your package caches copy-on-write.

Examples:
  sandbox home
  sandbox home reset --yes
  sandbox home reset --caches --yes"
    )]
    Home(HomeArgs),
    /// Report, for each backend, whether it is available here and what it enforces.
    Doctor(DoctorArgs),
    /// Explain whether PATH is visible and writable in the next run with these options, and
    /// what decides it: a grant, a toolchain, a cache layer, the private home, an agent profile.
    #[command(
        after_help = "Nothing is run or created: the answer comes from the same policy \
(and private view) a run with these options would get.\n\nExamples:\n  sandbox why ~/.ssh\n  \
sandbox why ~/.claude/settings.json --agent claude\n  sandbox why ~/.cargo/registry --json"
    )]
    Why(WhyArgs),
    /// Manage sandbox views: tracked-files worktrees on `s/<branch>` for VM backends.
    ///
    /// A sandbox view is a second linked worktree of your task's repository, on the child
    /// branch `s/<branch>`, holding only tracked files (no .env, node_modules or build
    /// caches). VM backends mount the view instead of your worktree; `sandbox view watch`
    /// fast-forwards `<branch>` (and your worktree, when clean) to every commit made there, and
    /// reports divergence instead of overwriting anything. See docs/views.md.
    #[command(subcommand)]
    View(crate::commands::view::ViewCommand),
    /// Manage the project's Lima VM: status, create, start, stop, recreate, delete, console,
    /// and its configuration.
    ///
    /// The Lima backend (`--backend lima`) runs each task's commands in one VM per project,
    /// in the task's sandbox view, through `limactl shell`. The VM is created on the first
    /// sandboxed spawn; these commands manage it by hand. They act on the project of the
    /// current directory (or -C DIR).
    #[command(
        subcommand,
        after_help = "Examples:\n  sandbox lima status\n  sandbox lima config\n  \
sandbox lima config --edit        # cpus, memory, disk, image; validated before saving\n  \
sandbox lima recreate --yes\n  sandbox lima console\n\n\
The VM's LIMA_HOME is private (SANDBOX_LIMA_HOME, default ~/.sandbox-lima); limactl is \
found through SANDBOX_LIMACTL, the package's limactl, then PATH (`sandbox doctor` shows which). \
SANDBOX_LIMA_START_TIMEOUT (90s, 30m, 1h) is how long a start waits for the VM (Lima's \
default: 10 minutes), for hosts where QEMU has no KVM."
    )]
    Lima(crate::commands::lima::LimaCommand),
    /// Read and change your configuration ($XDG_CONFIG_HOME/sandbox/config.yaml).
    #[command(
        subcommand,
        after_help = "Only your user file is ever written; /etc/sandbox/config.yaml (the system \
file) is read-only here, and nothing is read from or written to the worktree.\n\nExamples:\n  \
sandbox config set backends.custom.command '/home/me/.local/bin/launcher --strict'\n  \
sandbox config set network.allow_domains '[crates.io, github.com]'\n  \
sandbox config get backends.custom.command\n  sandbox config show --json\n  \
sandbox config unset backends.custom.command"
    )]
    Config(crate::commands::config::ConfigCommand),
    /// Run the sandbox daemon: one per user, owning every box and backend runtime, driven
    /// over a JSONL control protocol (docs/protocol.md).
    #[command(
        after_help = "The daemon listens on $XDG_RUNTIME_DIR/sandbox/sandbox.sock (authenticated \
with the host token in host.token beside it) and serves agent status hooks on \
http://127.0.0.1:<service.hook_port>. It exits after --idle-exit (service.idle_exit, default 5m) \
with no box, no command and no client, and at once when its socket or runtime directory is \
removed.\n\nExamples:\n  sandbox serve            # in the foreground\n  \
sandbox serve --stdio    # a JSONL session on stdin/stdout; starts the daemon if needed\n  \
sandbox serve --idle-exit 0s   # never exit for idleness"
    )]
    Serve(crate::commands::serve::ServeArgs),
    /// List the daemon's boxes: backend, state, running commands, last agent status.
    Ps(crate::commands::ps::PsArgs),
    /// Post an agent status event (from inside a sandbox) to the daemon's hook endpoint.
    #[command(
        after_help = "Uses SANDBOX_API_URL and SANDBOX_API_TOKEN, which every sandboxed process \
gets while a daemon runs.\n\nExamples:\n  sandbox hook working\n  sandbox hook needs-input 'approve the migration?'"
    )]
    Hook(crate::commands::hook::HookArgs),
    /// Print shell completions (bash, zsh, fish, elvish, powershell) to stdout.
    Completions {
        /// The shell to generate completions for.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) to stdout.
    Man,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What clap prints for `argv`: the parsed value's debug form, or the rendered error
    /// (help, usage errors).
    fn outcome<P: Parser + std::fmt::Debug>(argv: &[&str]) -> String {
        match P::try_parse_from(argv) {
            Ok(parsed) => format!("{parsed:?}"),
            Err(err) => format!("{:?}: {}", err.kind(), err.render()),
        }
    }

    #[test]
    fn a_missing_separator_is_pointed_out_where_the_command_starts() {
        let argv = |line: &str| -> Vec<String> { line.split(' ').map(String::from).collect() };
        assert_eq!(
            missing_separator_hint(&argv("sandbox run cargo build --release"), "cargo").as_deref(),
            Some("put `--` before the command: sandbox run -- cargo build --release")
        );
        assert_eq!(
            missing_separator_hint(&argv("/x/sandbox run -C /w --block-net npm test"), "npm")
                .as_deref(),
            Some("put `--` before the command: sandbox run -C /w --block-net -- npm test")
        );
        assert_eq!(
            missing_separator_hint(&argv("sandbox exec pi-acp --verbose"), "pi-acp").as_deref(),
            Some("put `--` before the command: sandbox exec -- pi-acp --verbose")
        );
        // With a `--` the unknown flag is ours, mistyped: no hint.
        assert_eq!(
            missing_separator_hint(&argv("sandbox run --bogus -- true"), "--bogus"),
            None
        );
        // What clap names must be in the line.
        assert_eq!(missing_separator_hint(&argv("sandbox run x"), "y"), None);
    }

    #[test]
    fn the_run_only_parser_answers_as_the_full_one() {
        let cases: &[&[&str]] = &[
            &["sandbox", "run", "--help"],
            &["sandbox", "run", "-h"],
            &["sandbox", "run"],
            &["sandbox", "run", "--bogus", "--", "true"],
            &["sandbox", "run", "--timeout", "soon", "--", "true"],
            &["sandbox", "run", "--version"],
        ];
        for argv in cases {
            assert_eq!(outcome::<RunCli>(argv), outcome::<Cli>(argv), "{argv:?}");
        }
        let argv = [
            "sandbox",
            "run",
            "-C",
            "/tmp",
            "--env",
            "A=1",
            "--block-net",
            "--",
            "sh",
            "-c",
            "x",
        ];
        let fast = Cli::from(RunCli::try_parse_from(argv).unwrap());
        let full = Cli::try_parse_from(argv).unwrap();
        assert_eq!(format!("{fast:?}"), format!("{full:?}"));
        assert!(matches!(fast.command, Command::Run(_)));
    }
}
