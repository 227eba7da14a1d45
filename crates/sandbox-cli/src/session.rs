//! Turning `SandboxArgs` plus trusted configuration into a policy, a backend and a command
//! ready to spawn — and cleaning up after the run (pointer checks, the private TMPDIR).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use sandbox_exec::{CommandPolicy, CommandRequest, CommandSpec, WorkspaceGuard};
use sandbox_host::backend::{self, BackendKind, BackendOptions};
use sandbox_host::custom::LauncherConfig;
use sandbox_host::nono::NonoLocation;
use sandbox_host::{gitguard, HostError, Prepared};
use sandbox_policy::{EnvPolicy, GrantReason, Policy, PolicyRequest};

use crate::cli::SandboxArgs;
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
    /// Trusted backend settings (nono's path, the launcher) from the configuration.
    pub options: BackendOptions,
    /// The daemon's hook endpoint and this task's sandbox-scoped token, if a daemon runs.
    pub hook: Option<crate::commands::hook::HookLease>,
    tmpdir: Option<tempfile::TempDir>,
}

/// The backend settings that come from trusted places only: the user and system
/// configuration, the tool lookup (baked path, `SANDBOX_NONO`, `PATH`) and the user's private
/// runtime directory. `kind` limits the work to one backend (`None`: all, for `doctor`).
pub fn backend_options(ctx: &Context, kind: Option<BackendKind>) -> BackendOptions {
    let wants = |k: BackendKind| kind.is_none_or(|want| want == k);
    let config = ctx.config();
    BackendOptions {
        nono: wants(BackendKind::Nono).then(|| {
            let found = crate::tools::NONO.resolve(config.backends.nono.path.as_deref());
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
        ..BackendOptions::default()
    }
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

/// The worktree root that `sandbox use` keys on: the git worktree's top level, else the dir.
pub fn task_root(dir: &Path) -> PathBuf {
    match sandbox_policy::git::discover(dir) {
        Ok(Some(found)) => found.root,
        _ => dir.to_path_buf(),
    }
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
    let kind = BackendKind::parse(&name).map_err(|e| Failure::setup(e.to_string()))?;
    Ok((kind, source))
}

impl Session {
    /// Builds the policy for these arguments. `runs_command` is for sessions that run something:
    /// they get the private TMPDIR and, while a daemon runs, a status-hook token lease.
    pub fn open(args: &SandboxArgs, ctx: &Context, runs_command: bool) -> anyhow::Result<Self> {
        let config = ctx.config();
        let dir = workdir(args.workdir.as_deref())?;

        let cwd = match &args.cd {
            Some(cd) => Some(
                WorkspaceGuard::new(&dir)?
                    .check_args(false)
                    .check_path(&dir, cd)?,
            ),
            None => None,
        };

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

        let timeout = match (args.timeout, &config.timeout) {
            (Some(t), _) => Some(t),
            (None, Some(text)) => Some(crate::cli::parse_duration(text).map_err(Failure::setup)?),
            (None, None) => None,
        };

        let tmpdir = if runs_command {
            Some(
                tempfile::Builder::new()
                    .prefix("sandbox-run-")
                    // Private: other local users must not read what the agent leaves here.
                    .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
                    .tempdir()
                    .map_err(|e| Failure::setup(format!("creating the private TMPDIR: {e}")))?,
            )
        } else {
            None
        };

        let mut allow_read: Vec<(PathBuf, GrantReason)> = config
            .read_folders
            .iter()
            .map(|p| (expand_home(p), GrantReason::Config))
            .collect();
        allow_read.extend(
            args.allow_read
                .iter()
                .map(|p| (absolute(p), GrantReason::User)),
        );
        let mut allow_write: Vec<(PathBuf, GrantReason)> = config
            .additional_folders
            .iter()
            .map(|p| (expand_home(p), GrantReason::Config))
            .collect();
        allow_write.extend(
            args.allow_write
                .iter()
                .map(|p| (absolute(p), GrantReason::User)),
        );
        let mut allow_ports = config
            .network
            .allow_ports
            .iter()
            .map(|&p| p as u32)
            .collect::<Vec<_>>();
        allow_ports.extend(&args.allow_port);

        let mut policy = sandbox_policy::build(PolicyRequest {
            workdir: dir,
            cwd,
            allow_read,
            allow_write,
            block_net: args.block_net || config.network.block,
            allow_ports,
            hook_port: config.service.hook_port,
            allow_domains: {
                let mut domains = config.network.allow_domains.clone();
                for d in &args.allow_domain {
                    if !domains.contains(d) {
                        domains.push(d.clone());
                    }
                }
                domains
            },
            env,
            timeout,
            unprotected_git: args.unprotected_git,
            tmpdir: tmpdir.as_ref().map(|t| t.path().to_path_buf()),
            ..PolicyRequest::default()
        })
        .map_err(|e| Failure::setup(e.to_string()))?;
        let (kind, choice) = choose_backend(args.backend.as_deref(), ctx, &policy.workspace.root)?;
        if kind != BackendKind::Host {
            check_trusted_locations(&policy, &ctx.dirs)?;
        }
        let task = policy
            .workspace
            .root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "/".into());
        let options = backend_options(ctx, Some(kind));
        // While a daemon runs, the command gets a status-hook token scoped to this task. Only
        // a session that runs something leases one; showing a policy just needs the port.
        let hook = runs_command
            .then(|| crate::commands::hook::lease(ctx, &task))
            .flatten();
        let daemon_port = match &hook {
            Some(lease) => Some(lease.port),
            None if runs_command => None,
            None => crate::commands::hook::daemon_hook_port(ctx),
        };
        policy.hook_port = daemon_port.or(policy.hook_port);
        Ok(Session {
            policy,
            kind,
            choice,
            task,
            options,
            hook,
            tmpdir,
        })
    }

    /// The child's environment: the policy's pass/set lists applied to ours, plus what every
    /// sandboxed process sees (`SANDBOX_BACKEND`, `SANDBOX_TASK`, `TMPDIR`) and, in a git
    /// worktree, the user's commit identity (the sandbox cannot read `~/.gitconfig`).
    pub fn child_env(&self) -> Vec<(OsString, OsString)> {
        let mut env = self.policy.env.clone();
        env.set_var("SANDBOX_BACKEND", self.kind.as_str());
        env.set_var("SANDBOX_TASK", self.task.clone());
        if let Some(lease) = &self.hook {
            env.set_var("SANDBOX_API_URL", lease.url.clone());
            env.set_var("SANDBOX_API_TOKEN", lease.token.clone());
        }
        if self.policy.workspace.git.is_some() {
            // The global config is out of reach of a confined process; say so to git rather
            // than let it warn on every command.
            if self.kind != BackendKind::Host
                && !env.set.iter().any(|(n, _)| n == "GIT_CONFIG_GLOBAL")
            {
                env.set_var("GIT_CONFIG_GLOBAL", "/dev/null");
            }
        }
        env.resolve(std::env::vars_os())
    }

    /// The command, resolved and prepared for the chosen backend.
    pub fn prepare(&self, argv: Vec<OsString>, allow_degraded: bool) -> anyhow::Result<Prepared> {
        let mut spec = CommandSpec::new(CommandRequest::Argv(argv), &self.policy.workspace.cwd)?;
        spec.env = self.child_env();
        spec.timeout = self.policy.limits.timeout;
        let options = BackendOptions {
            allow_degraded,
            ..self.options.clone()
        };
        let prepared =
            backend::prepare(self.kind, &self.policy, spec, &options).map_err(|e| match e {
                // The command itself cannot run (127, 126): its own exit status.
                HostError::Command(exec) => anyhow::Error::from(exec),
                other => Failure::setup(other.to_string()),
            })?;
        if allow_degraded && !prepared.enforcement.gaps.is_empty() {
            eprintln!(
                "sandbox: warning: {} is running degraded; not enforced: {}",
                self.kind,
                prepared.enforcement.gaps.join("; ")
            );
        }
        Ok(prepared)
    }

    /// Applies `--guard-args` to the prepared command.
    pub fn guard_args(&self, spec: &CommandSpec) -> anyhow::Result<()> {
        let mut guard = WorkspaceGuard::new(&self.policy.workspace.root)?;
        for grant in self
            .policy
            .fs
            .write
            .iter()
            .chain(self.policy.fs.read.iter())
        {
            guard = guard.allow_root(&grant.path)?;
        }
        guard.admit(spec)?;
        Ok(())
    }

    /// After the run: restore tampered git pointers and warn on stderr. The exit status is
    /// the command's; this only reports.
    pub fn finish(&mut self) {
        if self.kind != BackendKind::Host {
            if let Some(git) = &self.policy.workspace.git {
                for t in gitguard::check_and_restore(git) {
                    eprintln!("sandbox: warning: {t}");
                }
                if gitguard::worktree_config_enabled_since(git) {
                    eprintln!(
                        "sandbox: warning: extensions.worktreeConfig was enabled in {} during the run; \
                         check {}/config.worktree before using git here",
                        git.common_dir.join("config").display(),
                        git.worktree_gitdir.display()
                    );
                }
            }
        }
        if let Some(tmp) = self.tmpdir.take() {
            let path = tmp.path().to_path_buf();
            if let Err(e) = tmp.close() {
                tracing::debug!(path = %path.display(), error = %e, "could not remove TMPDIR");
            }
        }
    }
}

/// The nearest existing ancestor of `path`, canonicalised (what a grant would have to cover
/// for `path` to become reachable once it is created).
fn existing_ancestor(path: &Path) -> Option<PathBuf> {
    path.ancestors().find_map(|p| std::fs::canonicalize(p).ok())
}

/// The places that decide the boundary — configuration, remembered backend choices, the
/// daemon's socket and host token — must stay out of the sandbox's reach, or an agent could
/// loosen its own next run. A grant that covers one of them is refused (exit 125).
fn check_trusted_locations(policy: &Policy, dirs: &crate::paths::Dirs) -> anyhow::Result<()> {
    let writable_checks = [
        (&dirs.user_config, "your sandbox configuration"),
        (&dirs.system_config, "the system sandbox configuration"),
        (&dirs.state, "the remembered backend choices"),
        (&dirs.runtime, "the daemon's socket and host token"),
    ];
    for (dir, what) in writable_checks {
        let Some(place) = existing_ancestor(dir) else {
            continue;
        };
        // A grant of an ancestor of the place (or of the place itself) covers it; the root
        // dir as nearest ancestor only matters if someone granted `/`.
        if let Some(grant) = policy.fs.write.iter().find(|g| place.starts_with(&g.path)) {
            return Err(Failure::setup(format!(
                "the writable grant {} covers {} ({}): a sandboxed agent could change its own \
                 boundary for the next run. Grant a narrower path.",
                grant.path.display(),
                dir.display(),
                what
            )));
        }
    }
    if let Some(place) = existing_ancestor(&dirs.runtime) {
        if let Some(grant) = policy
            .fs
            .read
            .iter()
            .chain(policy.fs.write.iter())
            .find(|g| place.starts_with(&g.path))
        {
            return Err(Failure::setup(format!(
                "the grant {} covers {}, where the daemon keeps its host token: a sandboxed \
                 agent could read it and control every sandbox. Grant a narrower path.",
                grant.path.display(),
                dirs.runtime.display()
            )));
        }
    }
    Ok(())
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
