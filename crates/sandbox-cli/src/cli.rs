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
    /// Show (or reset) the private home of this project: where it is, the disk it and its
    /// cache layers take, the toolchains found on this machine.
    #[command(
        after_help = "Each run of the native and custom backends gets HOME in a private, persistent directory under $XDG_STATE_HOME/sandbox/homes (per project; `home: per-task` in the configuration for one per worktree). Under the native view it is mounted at your real home's path, your toolchains read-only on top of it and your package caches copy-on-write.

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
found through SANDBOX_LIMACTL, the package's limactl, then PATH (`sandbox doctor` shows which)."
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

/// Options shared by every command that runs something in a sandbox.
#[derive(Debug, Clone, Args)]
pub struct SandboxArgs {
    /// The task's worktree (the sandbox's working directory). Default: the current directory.
    #[arg(short = 'C', long = "workdir", value_name = "DIR")]
    pub workdir: Option<PathBuf>,

    /// The isolation backend: native (Landlock+seccomp on Linux, Seatbelt on macOS; also
    /// `landlock`/`seatbelt`), nono (the nono CLI with a manifest of this policy), lima (the
    /// project's Lima VM, on a sandbox view of the task: `sandbox lima --help`), custom
    /// (your launcher, `backends.custom.command`), host (none: explicit opt-out). Default: what
    /// `sandbox use` chose for this worktree, else `backend` in the config, else native.
    #[arg(long, value_name = "NAME")]
    pub backend: Option<String>,

    /// Grant read access to PATH (repeatable). Must exist.
    #[arg(long = "allow-read", value_name = "PATH")]
    pub allow_read: Vec<PathBuf>,

    /// Grant read-write access to PATH (repeatable). Must exist.
    #[arg(long = "allow-write", value_name = "PATH")]
    pub allow_write: Vec<PathBuf>,

    /// Deny the network: the native backend gives the run a network namespace of its own
    /// with only loopback (no route out, no inbound connection from the host but the
    /// --publish ports); the host's
    /// --allow-port ports and the hook port are relayed in. No UDP, raw or packet sockets,
    /// no io_uring. Without user namespaces: TCP only to --allow-port ports (Landlock).
    #[arg(long)]
    pub block_net: bool,

    /// Keep the host's TCP port 127.0.0.1:PORT reachable under --block-net (repeatable;
    /// 1-65535). Without a network namespace (no user namespaces) port PORT of any address.
    #[arg(long = "allow-port", value_name = "PORT")]
    pub allow_port: Vec<u32>,

    /// Allow outbound network only to HOST (repeatable; `*.example.com` for subdomains,
    /// `@github`/`@npm`/`@agents`… for built-in groups, an address to allow that address)
    /// through a filtering proxy: the native backend's (the run's network namespace has no
    /// other way out; HTTP_PROXY/HTTPS_PROXY point at it) or nono's. Refusals name their
    /// rule; `sandbox why --net HOST` explains one. Other backends refuse to run. Adds to
    /// `network.allow_domains` in the config.
    #[arg(long = "allow-domain", value_name = "HOST")]
    pub allow_domain: Vec<String>,

    /// Publish a server of the run to the host (repeatable): `[HOST_ADDR:]HOST_PORT[:INNER_PORT]`,
    /// e.g. `3000`, `8080:3000`, `127.0.0.1:8080:3000`, `[::1]:8080`. The supervisor listens
    /// on HOST_ADDR:HOST_PORT (default address 127.0.0.1; 0.0.0.0 only when written out) and
    /// relays each connection to 127.0.0.1:INNER_PORT inside the run's network namespace
    /// (native backend, with --block-net or --allow-domain); the connections are in the
    /// connection log as `inbound`. With the open network a server already listens on the
    /// host's port (only `P` is accepted). Adds to `network.publish` in the config.
    #[arg(long = "publish", value_name = "[ADDR:]PORT[:INNER]")]
    pub publish: Vec<String>,

    /// Give the command an API credential without its secret (repeatable): `anthropic`,
    /// `openai`, `google`, `github`. The host reads the secret (its own $ANTHROPIC_API_KEY,
    /// $OPENAI_API_KEY, $GEMINI_API_KEY or $GOOGLE_API_KEY, $GITHUB_TOKEN or $GH_TOKEN; else
    /// ~/.config/sandbox/credentials/NAME; else the kernel keyring's user key sandbox:NAME);
    /// the command gets a placeholder in that variable and a base URL pointing at the
    /// sandbox's proxy (ANTHROPIC_BASE_URL, OPENAI_BASE_URL, GOOGLE_GEMINI_BASE_URL,
    /// GITHUB_API_URL), which adds the real key on the way to the API host over TLS and
    /// refuses the placeholder anywhere else. A missing secret stops the run (exit 125).
    /// SANDBOX_CREDENTIAL_<NAME>_HOST=HOST[:PORT] on the host sends it to another host (a
    /// gateway), SANDBOX_CREDENTIAL_CA=FILE.pem trusts that CA too (docs/security.md).
    /// Adds to `credentials` in the config.
    #[arg(long = "credential", value_name = "NAME")]
    pub credential: Vec<String>,

    /// Accept that git hooks and config cannot be protected (a main worktree, where .git is
    /// inside the writable tree). Prefer a linked worktree: `git worktree add`.
    #[arg(long)]
    pub unprotected_git: bool,

    /// Let `git push` from inside reach the local repository REMOTE (repeatable): a path
    /// (absolute, `./` or `../` from the worktree) or the name of a remote whose push URL is
    /// one. The push goes through a quarantine like the worktree's own store: the host
    /// applies new branches and tags (and those earlier pushes of this task made) and takes
    /// the objects in by content after checking them; the remote's hooks and config stay
    /// read-only. Native backend with its private view only. Network remotes need no grant.
    #[arg(long = "allow-push", value_name = "REMOTE")]
    pub allow_push: Vec<String>,

    /// Keep the git repositories the command creates in the worktree (`git init sub/x`, a
    /// clone, a bare repository, a submodule's `.git` checked out inside). Without it each
    /// is reported after the run and set aside (its `.git`, or a bare repository's `HEAD`,
    /// renamed to `….sandbox-set-aside-<random>`, never deleted): git run later in that
    /// folder — yours, an editor's, a prompt's — would run its hooks and `core.fsmonitor`.
    #[arg(long)]
    pub allow_nested_git: bool,

    /// Run even if this kernel cannot enforce part of the policy (printed as a warning).
    #[arg(long)]
    pub allow_degraded: bool,

    /// Where the native backend cannot build its private view (no user namespaces), allow
    /// unix sockets anyway; a pathname socket outside the policy (tmux, D-Bus, docker) is
    /// then reachable. Without it, creating unix sockets is denied there (`socketpair`
    /// works). No effect where the view exists. Config: `backends.native.allow_unix_sockets`.
    #[arg(long)]
    pub allow_unix_sockets: bool,

    /// Use the agent profile NAME (claude, codex, gemini, opencode, aider, goose, pi, or one
    /// under `agents:` in the config): what the host's agent runs or obeys under your home
    /// (settings with hooks, MCP server commands, permission lists, plugins) stays read-only,
    /// its sessions, history and logs are writable, and a file mixing both (~/.claude.json) is
    /// a private copy. Default: chosen by the command's name (`claude`, `codex`, `pi-acp`…);
    /// `--agent none` for no profile. `sandbox policy show` lists what it adds, and why.
    #[arg(long, value_name = "NAME")]
    pub agent: Option<String>,
    /// Mount this toolchain of yours read-only at its real path (`rust`, `node`, `python`,
    /// `go`, ...; `sandbox home` lists those found), even where the configuration's
    /// `toolchains:` leaves it out. Repeatable.
    #[arg(long = "toolchain", value_name = "NAME")]
    pub toolchain: Vec<String>,

    /// Mount none of your toolchains (but those named with --toolchain).
    #[arg(long)]
    pub no_toolchains: bool,

    /// Pass NAME from this terminal into the sandbox, or set NAME=VALUE. Repeatable.
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    pub env: Vec<String>,

    /// Kill the command's whole process group after this long (e.g. 30s, 5m); exit 124.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,

    /// Memory of all the command's processes together (e.g. 512M, 2G; `off`), enforced by
    /// the kernel (cgroups): at the limit the kernel kills the command, which exits 137 and
    /// sandbox says it hit the memory limit. Default: `limits.memory` in the config, else
    /// none. Refused (125) where it cannot be enforced, unless --allow-degraded; `sandbox
    /// doctor` says what this machine can enforce, `sandbox policy show` what a run gets.
    #[arg(long, value_name = "SIZE", value_parser = parse_memory_arg)]
    pub memory: Option<LimitArg>,

    /// Processes and threads the command may have at once (`off` for no limit); a fork past
    /// it fails (EAGAIN). Default: `limits.pids` in the config, else 4096, which stops a
    /// fork bomb (enforced where the machine can: see `sandbox doctor`).
    #[arg(long, value_name = "N", value_parser = parse_pids_arg)]
    pub pids: Option<LimitArg>,

    /// CPU time the command gets per second of wall time, in CPUs (0.5: half a core; `off`).
    /// Default: `limits.cpus` in the config, else none.
    #[arg(long, value_name = "F", value_parser = parse_cpus_arg)]
    pub cpus: Option<LimitArg>,

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

    /// After the run, write what the sandbox did as JSON to PATH ('-': stderr): the exit
    /// code, and the git store updates applied to the repository and refused (`gitStore`;
    /// `gitPush`: the same for each --allow-push remote), the resource limits with their
    /// mechanism and what the run's cgroups counted (`limits.usage`: `peakMemoryBytes`,
    /// `peakProcesses`, `oomKills`). PATH is
    /// replaced by a new file, never written through a link left there.
    #[arg(long, value_name = "PATH")]
    pub report_json: Option<PathBuf>,

    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub sandbox: SandboxArgs,

    /// The box's name: 1-64 letters, digits, '.', '_' or '-'. Commands see it as SANDBOX_BOX.
    /// With boxlite, the daemon's named box: created on first use, reused (with what was
    /// installed in it) by every later exec of the same name; default `exec-<task dir>`.
    #[arg(long = "box", value_name = "NAME")]
    pub box_name: Option<String>,

    /// The OCI image of the box, a registry reference (boxlite only; refused by the others).
    #[arg(long, value_name = "REF", conflicts_with = "rootfs")]
    pub image: Option<String>,

    /// An OCI image layout directory for the box, no registry needed (boxlite only, e.g. the
    /// output of `cargo xtask box-image`; refused by the others).
    #[arg(long, value_name = "DIR")]
    pub rootfs: Option<PathBuf>,

    /// Make HOST visible at GUEST, read-write (repeatable). In place (native, nono, custom,
    /// host) GUEST must be HOST itself: the grant is --allow-write HOST. With boxlite, a mount
    /// into the VM at GUEST (the task worktree is always mounted at its own path).
    #[arg(long = "mount", value_name = "HOST:GUEST")]
    pub mount: Vec<String>,

    /// Allow outbound network only to HOST (repeatable): the same as --allow-domain HOST, which
    /// native (its network namespace and proxy) and nono (its proxy) enforce; with boxlite,
    /// the box's allow-list (names or CIDRs).
    #[arg(long = "allow-net", value_name = "HOST")]
    pub allow_net: Vec<String>,

    /// A shell command that succeeds when the box is ready (`command -v pi-acp`). Run before
    /// CMD; its output goes to stderr.
    #[arg(long, value_name = "CMD")]
    pub probe: Option<String>,

    /// A shell command that makes the box ready, run when --probe fails; the probe is then
    /// asked again. Its output goes to stderr. Needs --probe (which decides whether to
    /// provision at all).
    #[arg(long, value_name = "CMD", requires = "probe")]
    pub provision: Option<String>,

    /// The command and its arguments (an argv, not re-parsed by a shell).
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

#[derive(Debug, Args)]
pub struct UseArgs {
    /// The backend to remember for this worktree; omit to show the current choice.
    pub backend: Option<String>,

    /// The task worktree. Default: the current directory.
    #[arg(short = 'C', long = "workdir", value_name = "DIR")]
    pub workdir: Option<PathBuf>,

    /// Forget the choice for this worktree.
    #[arg(long, conflicts_with = "backend")]
    pub clear: bool,

    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct HomeArgs {
    #[command(subcommand)]
    pub action: Option<HomeAction>,

    /// The task worktree. Default: the current directory.
    #[arg(short = 'C', long = "workdir", value_name = "DIR", global = true)]
    pub workdir: Option<PathBuf>,

    /// Machine-readable output.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum HomeAction {
    /// Show the private home (the default).
    Show,
    /// Delete the private home and its cache layers; the next run starts from an empty one.
    Reset {
        /// Only the cache layers (what runs downloaded), not the home.
        #[arg(long)]
        caches: bool,
        /// Do not ask.
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Print the policy for a run with these options, and what the backend compiles it to
    /// (Landlock rules and ports, the seccomp program, the SBPL profile). Nothing is run.
    Show(PolicyShowArgs),
}

#[derive(Debug, Args)]
pub struct PolicyShowArgs {
    #[command(flatten)]
    pub sandbox: SandboxArgs,

    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct WhyArgs {
    /// The path to explain (`~` is your home; relative to the current directory).
    #[arg(value_name = "PATH", required_unless_present = "net")]
    pub path: Option<PathBuf>,

    /// Explain instead whether a network host (`HOST` or `HOST:PORT`) is reachable in the
    /// next run, and by which rule (`--block-net`, `--allow-port`, `--allow-domain`).
    #[arg(long, value_name = "HOST", conflicts_with = "path")]
    pub net: Option<String>,

    #[command(flatten)]
    pub sandbox: SandboxArgs,

    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The worktree to check git protection for. Default: the current directory.
    #[arg(short = 'C', long = "workdir", value_name = "DIR")]
    pub workdir: Option<PathBuf>,

    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

/// For `sandbox run cargo build --release` (no `--`, so clap took `cargo` for an argument of
/// ours and would take `--release` for a flag): the same line with `--` where the command
/// starts, at the first argument clap could not place. `None` when the line has a `--`
/// already (then the unknown flag really is a typo of ours) or `invalid` is not in it.
pub fn missing_separator_hint(argv: &[String], invalid: &str) -> Option<String> {
    if argv.iter().skip(1).any(|a| a == "--") {
        return None;
    }
    // The subcommand is argv[1]; the command starts at the first unplaceable argument.
    let at = argv.iter().skip(2).position(|a| a == invalid)? + 2;
    let quoted: Vec<String> = argv
        .iter()
        .map(|a| shlex::try_quote(a).map_or_else(|_| a.clone(), |q| q.into_owned()))
        .collect();
    let program = std::path::Path::new(&argv[0]).file_name().map_or_else(
        || "sandbox".to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    Some(format!(
        "put `--` before the command: {program} {} -- {}",
        quoted[1..at].join(" "),
        quoted[at..].join(" ")
    ))
}

/// A resource limit's value from a flag: `None` is `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitArg(pub Option<u64>);

fn parse_memory_arg(s: &str) -> Result<LimitArg, String> {
    sandbox_policy::compile::limits::parse_memory(s).map(LimitArg)
}

fn parse_pids_arg(s: &str) -> Result<LimitArg, String> {
    sandbox_policy::compile::limits::parse_pids(s).map(LimitArg)
}

fn parse_cpus_arg(s: &str) -> Result<LimitArg, String> {
    sandbox_policy::compile::limits::parse_cpus(s).map(LimitArg)
}

impl SandboxArgs {
    /// The resource limit flags (memory, pids, cpus), as the assembly takes them.
    pub fn resources(&self) -> [Option<Option<u64>>; 3] {
        [self.memory, self.pids, self.cpus].map(|l| l.map(|l| l.0))
    }
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration (try 30s, 5m, 1h): {e}"))?;
    if d.is_zero() {
        return Err("a timeout of zero would kill the command before it starts".into());
    }
    Ok(d)
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
