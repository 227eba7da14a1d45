//! The arguments of the commands that run something, and their parsers: a leaf the
//! commands and the session read (`SandboxArgs`), importing nothing of the commands, so the
//! top-level parser ([`super::Cli`]) is the only one that names the commands' own arguments.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

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

    /// Grant read-write access to PATH (repeatable). Must exist, except a file host tools
    /// run: in the worktree, `.claude/settings.json`, `.claude/settings.local.json`,
    /// `.claude/{commands,agents,hooks,skills}`, `.mcp.json`, `.vscode`, `.idea`,
    /// `.devcontainer`, `.envrc`, `.gitmodules`, `.gitattributes` and
    /// `.pre-commit-config.yaml` are read-only by default (what a run creates there is set
    /// aside after it, what it changes put back); `--allow-write .vscode` opens one.
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
    /// refuses the placeholder anywhere else. With `github`, git inside also sends
    /// https://github.com/ remotes to the proxy (url.insteadOf and a credential helper that
    /// answers the placeholder, in GIT_CONFIG_COUNT…), which pushes and fetches to github.com
    /// with the token as HTTP Basic credentials. A missing secret stops the run (exit 125).
    /// It narrows an open network: the run's only way out is then that proxy, which reaches
    /// the credentials' hosts and nothing else (said at run start; `sandbox why --net HOST`
    /// answers as the run does); --allow-domain HOST widens it. NAME=URL sends it to another
    /// host: https://HOST[:PORT] (a gateway), or http://127.0.0.1:PORT for a plain-HTTP
    /// gateway on this host's loopback (plain HTTP elsewhere is refused). A host that fails
    /// (unreachable, TLS) is told on stderr once. SANDBOX_CREDENTIAL_<NAME>_HOST=HOST[:PORT]
    /// on the host also redirects it (SANDBOX_CREDENTIAL_GITHUB_GIT_HOST: github's git host),
    /// SANDBOX_CREDENTIAL_CA=FILE.pem trusts that CA too
    /// (docs/security.md). Adds to `credentials` in the config.
    #[arg(long = "credential", value_name = "NAME[=URL]")]
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
