//! Turning `SandboxArgs` plus trusted configuration into a policy (through the one assembly
//! the daemon uses too) and a [`Run`] — the one run sequence of `sandbox_host::run`, which
//! `run`, `shell` and `exec` follow: prepare, arm, spawn, reap, finish — and reporting how a
//! run finished on stderr, in one wording.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use sandbox_exec::{CommandPolicy, CommandSpec, WorkspaceGuard};
use sandbox_host::assembly::{
    self, Assembled, CommandIdentity, Defaults, Request, TmpdirRequest, TrustedPlace, TrustedPlaces,
};
use sandbox_host::backends::custom::LauncherConfig;
use sandbox_host::backends::nono::NonoLocation;
use sandbox_host::seam::{self, BackendKind, BackendOptions, LogProgress};
use sandbox_host::{Armed, Finished, HostError, Invocation, Run, RunEnd};
use sandbox_policy::{EnvPolicy, Policy};

use crate::cli::args::SandboxArgs;
use crate::config::expand_home;
use crate::context::Context;
use crate::exit::Failure;

/// Where the backend choice came from (shown by `policy show` and `use`).
#[derive(Debug, Clone, Copy, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChoiceSource {
    Flag,
    Use,
    Config,
    Default,
}

impl ChoiceSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ChoiceSource::Flag => "--backend",
            ChoiceSource::Use => "sandbox use",
            ChoiceSource::Config => "the configuration",
            ChoiceSource::Default => "default",
        }
    }
}

/// A resolved run: the policy, the backend, and the private temp dir (removed on drop).
pub struct Session {
    pub policy: Policy,
    pub kind: BackendKind,
    pub choice: ChoiceSource,
    pub task: String,
    /// Trusted backend settings (nono's path, the launcher, the trusted places) from the
    /// configuration.
    pub options: BackendOptions,
    /// The daemon's hook endpoint and this task's sandbox-scoped token, if a daemon runs.
    pub hook: Option<crate::commands::hook::HookLease>,
    /// `SANDBOX_BOX` for the commands (`sandbox exec --box NAME`); `None` for `run`.
    pub box_name: Option<String>,
    tmpdir: Option<sandbox_host::assembly::tmpdir::PrivateTmpdir>,
    home: Option<sandbox_host::assembly::home::HomeGuard>,
}

/// The places that decide the boundary — configuration, remembered backend choices, the
/// daemon's socket and host token — which no grant may put within the sandbox's reach.
pub fn trusted_places(dirs: &crate::paths::Dirs) -> TrustedPlaces {
    let place = |path: &Path, what: &str, secret: bool| TrustedPlace {
        path: path.to_path_buf(),
        what: what.to_string(),
        secret,
    };
    TrustedPlaces(vec![
        place(&dirs.user_config, "your sandbox configuration", false),
        place(
            &dirs.system_config,
            "the system sandbox configuration",
            false,
        ),
        place(&dirs.state, "the remembered backend choices", false),
        place(&dirs.runtime, "the daemon's socket and host token", true),
    ])
}

/// The settings every policy starts from, from the trusted configuration: the same for
/// `sandbox run` and the daemon's boxes.
pub fn defaults(ctx: &Context) -> anyhow::Result<Defaults> {
    let config = ctx.config();
    let mut env = EnvPolicy::default();
    for name in &config.env.pass {
        env.add_arg(name)
            .map_err(|e| Failure::setup(format!("env.pass {name}: {e}")))?;
    }
    for (name, value) in &config.env.set {
        env.set_var(name, value.clone());
    }
    let timeout = match &config.timeout {
        Some(text) => Some(crate::cli::args::parse_duration(text).map_err(Failure::setup)?),
        None => None,
    };
    Ok(Defaults {
        allow_read: config.read_folders.iter().map(|p| expand_home(p)).collect(),
        allow_write: config
            .additional_folders
            .iter()
            .map(|p| expand_home(p))
            .collect(),
        env,
        block_net: config.network.block,
        allow_ports: config.network.allow_ports.clone(),
        allow_domains: config.network.allow_domains.clone(),
        credentials: config.credentials.clone(),
        publish: config.network.publish.clone(),
        timeout,
        resources: config.limits.resources().map_err(Failure::setup)?,
        hook_port: config.service.hook_port,
        home: home_settings(ctx, &[], false),
    })
}

/// Whether the private home is keyed on the worktree (`home: per-task`, the default) rather
/// than shared by every worktree of the repository (`home: per-project`): a home holds start-up
/// code (rc files, Python `.pth` files, `~/.npmrc`, shell snapshots, cache sources with build
/// scripts) that one task's run could leave for another task's run with other grants.
pub fn home_per_task(ctx: &Context) -> bool {
    ctx.config().home.as_deref() != Some("per-project")
}

/// The private home's settings from the configuration (`home:`, `toolchains:`, `caches:`,
/// `cache_size_mib`) and the flags; `None` with `home: off`.
pub fn home_settings(
    ctx: &Context,
    add_toolchains: &[String],
    no_toolchains: bool,
) -> Option<sandbox_host::assembly::home::HomeSettings> {
    use sandbox_policy::toolchains::Selection;
    let config = ctx.config();
    if config.home.as_deref() == Some("off") {
        return None;
    }
    let toolchains = match config.toolchains.as_deref() {
        None => Selection::Auto,
        Some([one]) if one == "auto" => Selection::Auto,
        Some([one]) if one == "none" => Selection::None,
        Some(names) => Selection::Only(names.to_vec()),
    };
    Some(sandbox_host::assembly::home::HomeSettings {
        state_dir: ctx.dirs.state.clone(),
        per_task: home_per_task(ctx),
        toolchains,
        add_toolchains: add_toolchains.to_vec(),
        no_toolchains,
        caches: config.caches.unwrap_or(true),
        cache_cap_bytes: Some(config.cache_size_mib.map_or(
            sandbox_host::assembly::home::DEFAULT_CACHE_CAP_BYTES,
            |mib| mib.saturating_mul(1 << 20),
        )),
    })
}

/// The backend settings that come from trusted places only: the user and system
/// configuration, the tool lookup (baked path, `SANDBOX_NONO`, `PATH`) and the user's private
/// runtime directory. `kind` limits the work to one backend (`None`: all, for `doctor`).
pub fn backend_options(ctx: &Context, kind: Option<BackendKind>) -> BackendOptions {
    let wants = |k: BackendKind| kind.is_none_or(|want| want == k);
    let config = ctx.config();
    BackendOptions {
        nono: wants(BackendKind::Nono).then(|| {
            let configured = config.backends.nono.path.as_deref().map(expand_home);
            let found = crate::tools::NONO.resolve(configured.as_deref());
            NonoLocation {
                path: found.path,
                source: found.source.as_str().to_string(),
            }
        }),
        custom: config
            .backends
            .custom
            .command
            .clone()
            .filter(|_| wants(BackendKind::Custom))
            .map(|command| LauncherConfig {
                command,
                source: ctx.loaded.custom_command_source.clone(),
            }),
        private_dir: Some(ctx.dirs.runtime.clone()),
        state_dir: Some(ctx.dirs.state.clone()),
        trusted: trusted_places(&ctx.dirs),
        allow_unix_sockets: config.backends.native.allow_unix_sockets,
        git_store_bytes: config
            .backends
            .native
            .git_store_size_mib
            .map(|mib| mib.max(1).saturating_mul(1 << 20)),
        ..BackendOptions::default()
    }
}

/// The Lima backend's trusted settings: `limactl` (`SANDBOX_LIMACTL`, the package's, `PATH`),
/// the private `LIMA_HOME` (`SANDBOX_LIMA_HOME`, else `~/.sandbox-lima`: short, for Lima's
/// socket paths), the views root, the flake's NixOS image, the per-project overrides.
pub fn lima_settings(ctx: &Context) -> sandbox_lima::LimaSettings {
    crate::registry::lima_settings_in(&ctx.dirs, &crate::commands::view::views_root(ctx))
}

/// The canonical workdir given by `-C` (or the current directory).
pub fn workdir(dir: Option<&Path>) -> anyhow::Result<PathBuf> {
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => std::env::current_dir().context("the current directory is unusable")?,
    };
    std::fs::canonicalize(&dir)
        .map_err(|e| Failure::setup(format!("workdir {}: {e}", dir.display())))
}

/// The worktree root that `sandbox use` keys on: the nearest directory at or above `dir` that
/// holds a `.git` (a main worktree's directory or a linked worktree's pointer file) — where
/// the policy's git discovery puts the workspace root — else the dir. Read directly, without
/// opening the repository: `sandbox exec` asks before the policy's own discovery runs.
pub fn task_root(dir: &Path) -> PathBuf {
    dir.ancestors()
        .find(|d| d.join(".git").symlink_metadata().is_ok())
        .unwrap_or(dir)
        .to_path_buf()
}

/// Picks the backend: `--backend`, then `sandbox use`, then the config, then native.
pub fn choose_backend(
    flag: Option<&str>,
    ctx: &Context,
    root: &Path,
) -> anyhow::Result<(BackendKind, ChoiceSource)> {
    let (name, source) = if let Some(b) = flag {
        (b.to_string(), ChoiceSource::Flag)
    } else if let Some(b) = crate::state::backend_for(&ctx.dirs.state, root)? {
        (b, ChoiceSource::Use)
    } else if let Some(b) = &ctx.config().backend {
        (b.clone(), ChoiceSource::Config)
    } else {
        ("native".to_string(), ChoiceSource::Default)
    };
    let kind = ctx.backends.parse(&name)?;
    Ok((kind, source))
}

impl Session {
    /// Builds the policy for these arguments. `runs_command` is for sessions that run something:
    /// they get the private TMPDIR and, while a daemon runs, a status-hook token lease.
    /// `command` is the program to run, if known: its name can choose the agent profile.
    pub fn open(
        args: &SandboxArgs,
        ctx: &Context,
        runs_command: bool,
        command: Option<&std::ffi::OsStr>,
    ) -> anyhow::Result<Self> {
        let dir = workdir(args.workdir.as_deref())?;
        let agent = agent_request(args, ctx, command, &task_root(&dir), runs_command)?;
        let cwd = match &args.cd {
            Some(cd) => Some(
                WorkspaceGuard::new(&dir)?
                    .check_args(false)
                    .check_path(&dir, cd)?,
            ),
            None => None,
        };
        let defaults = defaults(ctx)?;
        // The backend first (keyed on the worktree root, where the policy's discovery puts
        // the workspace): the private home is for the backends on the host's filesystem.
        let (kind, choice) = choose_backend(args.backend.as_deref(), ctx, &task_root(&dir))?;
        let home = home_settings(ctx, &args.toolchain, args.no_toolchains)
            .filter(|_| kind.gets_private_home());
        let request = Request {
            workdir: dir,
            cwd,
            allow_read: args.allow_read.iter().map(|p| absolute(p)).collect(),
            allow_write: args.allow_write.iter().map(|p| absolute(p)).collect(),
            env: args.env.clone(),
            block_net: args.block_net,
            allow_ports: args.allow_port.clone(),
            allow_domains: args.allow_domain.clone(),
            credentials: args.credential.clone(),
            publish: args.publish.clone(),
            timeout: args.timeout,
            resources: args.resources(),
            unprotected_git: args.unprotected_git,
            push_remotes: args.allow_push.clone(),
            allow_nested_git: args.allow_nested_git,
            tmpdir: runs_command.then(|| TmpdirRequest {
                prefix: "sandbox-run-".into(),
                root: None,
            }),
            agent,
            home,
        };
        let Assembled {
            mut policy,
            tmpdir,
            home,
            home_note,
        } = assembly::assemble(&defaults, request).map_err(|e| match e {
            HostError::Env { arg, cause } => Failure::setup(format!("--env {arg}: {cause}")),
            other => anyhow::Error::from(other),
        })?;
        if let Some(note) = &home_note {
            if runs_command {
                eprintln!("sandbox: notice: {note}");
            }
        }
        // What the user needs to know before anything runs (stderr: `exec`'s stdout is the
        // command's alone).
        let real_home = expand_home(Path::new("~"));
        for exposure in sandbox_host::assembly::notices::exposed_secrets(&policy, &real_home) {
            eprintln!("sandbox: warning: {}", exposure.message(&real_home));
        }
        if runs_command {
            if let Some(notice) = sandbox_host::assembly::notices::credential_narrowing(&policy) {
                eprintln!("sandbox: notice: {notice}");
            }
        }
        for name in sandbox_host::assembly::notices::unset_passed_vars(&args.env, |n| {
            std::env::var_os(n).is_some()
        }) {
            eprintln!(
                "sandbox: warning: --env {name}: {name} is not set here, so the command does not \
                 get it (--env {name}=VALUE sets it)"
            );
        }
        let mut options = backend_options(ctx, Some(kind));
        options.allow_unix_sockets |= args.allow_unix_sockets;
        // A run gets this check from the seam when it prepares the backend; showing a policy
        // prepares nothing, so it checks here (refusing with 125, as a run would).
        if !runs_command {
            seam::check_trusted_places(kind, &policy, &options)?;
        }
        let task = policy
            .workspace
            .root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "/".into());
        // While a daemon runs, the command gets a status-hook token scoped to this task. Only
        // a session that runs something leases one; showing a policy just needs the port.
        let hook = runs_command
            .then(|| crate::commands::hook::lease(ctx, &task))
            .flatten();
        // The hook port is relayed in (under a block or a proxy) only where a hook server
        // listens on it: the daemon whose token this run holds (its connection keeps that
        // daemon alive for the run). Without one, whatever else listens on the configured
        // port of the host's loopback would be reachable from a run that blocks the network.
        policy.hook_port = match &hook {
            Some(lease) => Some(lease.port),
            None if runs_command => None,
            None => crate::commands::hook::daemon_hook_port(ctx),
        };
        Ok(Session {
            policy,
            kind,
            choice,
            task,
            options,
            hook,
            box_name: None,
            tmpdir,
            home,
        })
    }

    /// Who the command runs as, for its environment.
    fn identity(&self) -> CommandIdentity {
        CommandIdentity {
            task: self.task.clone(),
            box_name: self.box_name.clone(),
            hook: self
                .hook
                .as_ref()
                .map(|lease| (lease.url.clone(), lease.token.clone())),
        }
    }

    /// The child's environment (the one assembly the daemon uses too), for `policy show`.
    pub fn child_env(&self) -> anyhow::Result<Vec<(OsString, OsString)>> {
        Ok(assembly::command_env(
            &self.policy,
            self.kind,
            &self.identity(),
            &[],
            std::env::vars_os(),
        )?)
    }

    /// Prepares the chosen backend for this policy: the run sequence's `prepare` (exit 125
    /// when the boundary cannot be set up), warning when it runs degraded. The run owns the
    /// private TMPDIR from here on.
    pub fn start(&mut self, ctx: &Context, allow_degraded: bool) -> anyhow::Result<Run> {
        // A choice made once and forgotten: said on every run and shell.
        if self.kind == BackendKind::Host && !matches!(self.choice, ChoiceSource::Flag) {
            eprintln!(
                "sandbox: warning: no isolation: {} runs on the host backend (chosen by {}); \
                 `sandbox use native` turns isolation back on",
                self.policy.workspace.root.display(),
                self.choice.as_str()
            );
        }
        let options = BackendOptions {
            allow_degraded,
            ..self.options.clone()
        };
        let assembled = Assembled {
            policy: self.policy.clone(),
            tmpdir: self.tmpdir.take(),
            home: self.home.take(),
            home_note: None,
        };
        let run = if self.kind == BackendKind::Lima {
            // A VM's first spawn takes minutes: each step is shown as it happens.
            let progress = crate::commands::lima::TermProgress::new(false);
            Run::prepare(&ctx.backends, self.kind, assembled, &options, &progress)
        } else {
            Run::prepare(&ctx.backends, self.kind, assembled, &options, &LogProgress)
        }?;
        // The checks of a killed run of this worktree, done before this one.
        for recovered in run.recovered() {
            for line in recovered.lines() {
                eprintln!("sandbox: warning: {line}");
            }
        }
        // A layer this machine cannot give is never dropped silently.
        for downgrade in &run.enforcement().downgrades {
            eprintln!("sandbox: notice: {}: {downgrade}", self.kind);
        }
        // A resource limit this machine cannot enforce: the default one is said (never
        // dropped silently); one asked for only runs degraded (else `prepare` refused).
        for missing in &run.limits().unenforced {
            if missing.limit.source.requested() {
                eprintln!(
                    "sandbox: warning: {} is running degraded: {}",
                    self.kind,
                    missing.message()
                );
            } else {
                eprintln!(
                    "sandbox: notice: {}: the default process limit ({}) is not enforced \
                     here: {} (`sandbox doctor`; `limits.pids: 0` silences this)",
                    self.kind, missing.limit.value, missing.why
                );
            }
        }
        let gaps = &run.enforcement().gaps;
        if allow_degraded && !gaps.is_empty() {
            eprintln!(
                "sandbox: warning: {} is running degraded; not enforced: {}",
                self.kind,
                gaps.join("; ")
            );
        }
        Ok(run)
    }

    /// `argv` armed to run in `run`: resolved, with the child's environment and timeout.
    pub fn arm(&self, run: &Run, argv: Vec<OsString>) -> anyhow::Result<Armed> {
        // An option of the agent that undoes what its profile sets (Codex's own sandbox):
        // said in one line, before the agent fails on it.
        if let Some(agent) = &self.policy.agent {
            for line in sandbox_policy::agents::refused_options(
                &agent.agent,
                &agent.commands,
                &agent.args,
                &argv,
            ) {
                eprintln!("sandbox: warning: {line}");
            }
        }
        Ok(run.arm(Invocation {
            argv,
            cwd: None,
            who: &self.identity(),
            extra_env: &[],
            timeout: None,
        })?)
    }

    /// Applies `--guard-args` to the prepared command.
    pub fn guard_args(&self, spec: &CommandSpec) -> anyhow::Result<()> {
        assembly::admission_guard(&self.policy)?.admit(spec)?;
        Ok(())
    }

    /// Removes the run's private TMPDIR once its last command finished.
    pub fn close(run: Run) {
        if let Err(e) = run.close() {
            tracing::debug!(error = %e, "could not remove TMPDIR");
        }
    }
}

/// Reports how a command finished on stderr, in one wording for every CLI path: the
/// backend's failure (red on a terminal), the launcher's failure, each pointer repair, the
/// git store's report.
pub fn report(finished: &Finished) {
    if let Some(e) = finished.setup_error() {
        eprintln!("{}", crate::exit::red_on_terminal(&format!("sandbox: {e}")));
    }
    // From the run's cgroup counters: the kernel's count of OOM kills, of refused forks.
    if let Some(limits) = &finished.limits {
        if let Some(line) = limits.memory_limit_message() {
            eprintln!(
                "{}",
                crate::exit::red_on_terminal(&format!("sandbox: {line}"))
            );
        }
        if let Some(line) = limits.pids_limit_message() {
            eprintln!("sandbox: notice: {line}");
        }
    }
    let launcher_failed = matches!(finished.end, RunEnd::Launcher { .. });
    for (i, line) in finished.warnings().into_iter().enumerate() {
        // The launcher's failure comes first and is red on a terminal, like an error.
        if launcher_failed && i == 0 {
            eprintln!(
                "{}",
                crate::exit::red_on_terminal(&format!("sandbox: {line}"))
            );
        } else {
            eprintln!("sandbox: warning: {line}");
        }
    }
}

/// The agent profile for this run: `--agent NAME`, else the one whose commands name the
/// program (`claude`), else none (`--agent none` turns the choice by name off).
fn agent_request(
    args: &SandboxArgs,
    ctx: &Context,
    command: Option<&std::ffi::OsStr>,
    root: &Path,
    prepare: bool,
) -> anyhow::Result<Option<sandbox_host::assembly::agent::AgentRequest>> {
    use sandbox_policy::agents::{compile, Profiles};
    if args.agent.as_deref() == Some("none") {
        return Ok(None);
    }
    // Most commands are no agent: tell so without parsing a profile.
    let configured = &ctx.config().agents;
    if args.agent.is_none()
        && !command.is_some_and(|c| sandbox_policy::agents::may_select(Path::new(c), configured))
    {
        return Ok(None);
    }
    let profiles = Profiles::load(configured).map_err(|e| Failure::setup(e.to_string()))?;
    let (profile, selected_by) = match args.agent.as_deref() {
        Some(name) => (
            profiles
                .get(name)
                .map_err(|e| Failure::setup(format!("--agent {name}: {e}")))?,
            "--agent",
        ),
        None => match command.and_then(|c| profiles.detect(Path::new(c))) {
            Some(profile) => (profile, "the command's name"),
            None => return Ok(None),
        },
    };
    let home = expand_home(Path::new("~"));
    if home == Path::new("/") {
        tracing::debug!("no HOME: the agent profile {} adds nothing", profile.name);
        return Ok(None);
    }
    let compiled = compile(profile, &home).map_err(|e| Failure::setup(e.to_string()))?;
    Ok(Some(sandbox_host::assembly::agent::AgentRequest {
        private_dir: ctx
            .dirs
            .state
            .join("agents")
            .join(sandbox_host::assembly::agent::project_key(root))
            .join(&profile.name),
        profile: compiled,
        home,
        selected_by: selected_by.to_string(),
        prepare,
    }))
}

fn absolute(path: &Path) -> PathBuf {
    let path = expand_home(path);
    if path.is_absolute() {
        path
    } else {
        std::env::current_dir()
            .map(|cwd| cwd.join(&path))
            .unwrap_or(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_task_root_is_where_the_policys_discovery_puts_the_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let main = base.join("main");
        std::fs::create_dir_all(main.join("src/deep")).unwrap();
        sandbox_testkit::linked_worktree(&main, &base.join("task"));
        std::fs::create_dir_all(base.join("task/sub")).unwrap();
        std::fs::create_dir_all(base.join("plain/x")).unwrap();
        for dir in [
            main.clone(),
            main.join("src/deep"),
            base.join("task"),
            base.join("task/sub"),
        ] {
            let discovered = sandbox_policy::git::discover(&dir).unwrap().unwrap().root;
            assert_eq!(task_root(&dir), discovered, "{}", dir.display());
        }
        let plain = base.join("plain/x");
        assert!(sandbox_policy::git::discover(&plain).unwrap().is_none());
        assert_eq!(task_root(&plain), plain);
    }
}
