//! One policy assembly for every runner: `sandbox run`, `sandbox shell`, `policy show` and the
//! daemon's `box.create` all turn trusted defaults plus a request into a [`Policy`] here, check
//! it against the places that decide the boundary, and give commands the same environment.

pub mod agent;
pub mod home;
pub mod notices;
mod settings;
pub mod tmpdir;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sandbox_policy::{EnvPolicy, GrantReason, Policy, PolicyRequest};

use crate::assembly::tmpdir::PrivateTmpdir;
use crate::error::HostError;
use crate::kind::BackendKind;
pub use crate::seam::trusted::{TrustedPlace, TrustedPlaces};

/// Settings from the trusted configuration (`/etc/sandbox`, `$XDG_CONFIG_HOME/sandbox`) that
/// every policy starts from.
#[derive(Debug, Clone, Default)]
pub struct Defaults {
    pub allow_read: Vec<PathBuf>,
    pub allow_write: Vec<PathBuf>,
    pub env: EnvPolicy,
    pub block_net: bool,
    pub allow_ports: Vec<u16>,
    pub allow_domains: Vec<String>,
    /// `credentials:` in the configuration (names).
    pub credentials: Vec<String>,
    /// `network.publish` in the configuration (`[HOST_ADDR:]HOST_PORT[:INNER_PORT]`).
    pub publish: Vec<String>,
    pub timeout: Option<Duration>,
    /// The configuration's resource limits (memory, pids, cpu): `Some(None)` is `off`.
    pub resources: [Option<Option<u64>>; 3],
    /// The hook endpoint's port: it stays reachable under a network block.
    pub hook_port: Option<u16>,
    /// The private home's settings (`home:`, `toolchains:`, `caches:`), for the backends that
    /// give one ([`BackendKind::gets_private_home`]).
    pub home: Option<crate::assembly::home::HomeSettings>,
}

/// What one caller asks for on top of the defaults (flags, `box.create` parameters).
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub workdir: PathBuf,
    /// Where commands start, already checked to lie inside the workspace.
    pub cwd: Option<PathBuf>,
    pub allow_read: Vec<PathBuf>,
    pub allow_write: Vec<PathBuf>,
    /// `NAME` (pass from the caller's environment) or `NAME=VALUE`.
    pub env: Vec<String>,
    pub block_net: bool,
    pub allow_ports: Vec<u32>,
    pub allow_domains: Vec<String>,
    /// `--credential NAME` (names), added to the configuration's.
    pub credentials: Vec<String>,
    /// `--publish` (as written), added to the configuration's.
    pub publish: Vec<String>,
    /// Overrides the default timeout.
    pub timeout: Option<Duration>,
    /// Resource limits over the configuration's (memory bytes, pids, thousandths of a CPU):
    /// `Some(None)` is `off`.
    pub resources: [Option<Option<u64>>; 3],
    pub unprotected_git: bool,
    /// `--allow-push`: local remotes (paths or names) a push from inside may reach.
    pub push_remotes: Vec<String>,
    /// `--allow-nested-git`: keep the repositories the run creates in the worktree.
    pub allow_nested_git: bool,
    /// Create a private TMPDIR for the commands (only callers that run something do).
    pub tmpdir: Option<TmpdirRequest>,
    /// An agent profile's paths (`--agent`, or detected from the command).
    pub agent: Option<crate::assembly::agent::AgentRequest>,
    /// Give the run its private home ([`BackendKind::gets_private_home`]: native, custom).
    pub home: Option<crate::assembly::home::HomeSettings>,
}

/// Where the private TMPDIR goes.
#[derive(Debug, Clone)]
pub struct TmpdirRequest {
    /// `sandbox-run-`, `sandbox-box-<name>-`.
    pub prefix: String,
    /// The directory to create it in; the system temp dir when `None`.
    pub root: Option<PathBuf>,
}

/// An assembled policy and the private TMPDIR it names (removed when dropped).
#[derive(Debug)]
pub struct Assembled {
    pub policy: Policy,
    pub tmpdir: Option<PrivateTmpdir>,
    /// The run's claim on its private home's cache layers.
    pub home: Option<crate::assembly::home::HomeGuard>,
    /// Why the run keeps the real `HOME`, when it asked for a private one and gets none.
    pub home_note: Option<String>,
}

/// Builds the policy for `request`: the defaults first, the request on top, and the private
/// TMPDIR created. The backend seam checks the result against the trusted places
/// ([`crate::seam::check_policy`]) before anything is prepared.
pub fn assemble(defaults: &Defaults, request: Request) -> Result<Assembled, HostError> {
    let mut env = defaults.env.clone();
    for arg in &request.env {
        env.add_arg(arg).map_err(|cause| HostError::Env {
            arg: arg.clone(),
            cause,
        })?;
    }
    // The profile's variables, under the configuration's and `--env`'s (set or passed).
    for var in request.agent.iter().flat_map(|a| &a.profile.env) {
        if !env.pass.contains(&var.name) && !env.set.iter().any(|(n, _)| *n == var.name) {
            env.set_var(&var.name, var.value.clone());
        }
    }
    let tmpdir = match &request.tmpdir {
        Some(t) => Some(create_tmpdir(t, &request.workdir)?),
        None => None,
    };
    let mut credentials = defaults.credentials.clone();
    for c in &request.credentials {
        if !credentials.contains(c) {
            credentials.push(c.clone());
        }
    }
    let agent = match &request.agent {
        Some(a) => crate::assembly::agent::materialize(a, &credentials)?,
        None => crate::assembly::agent::Materialized::default(),
    };
    let grants = |defaults: &[PathBuf], extra: &[PathBuf]| -> Vec<(PathBuf, GrantReason)> {
        defaults
            .iter()
            .map(|p| (p.clone(), GrantReason::Config))
            .chain(extra.iter().map(|p| (p.clone(), GrantReason::User)))
            .collect()
    };
    let mut allow_ports: Vec<u32> = defaults.allow_ports.iter().map(|&p| p.into()).collect();
    allow_ports.extend(&request.allow_ports);
    let mut allow_domains = defaults.allow_domains.clone();
    for d in &request.allow_domains {
        if !allow_domains.contains(d) {
            allow_domains.push(d.clone());
        }
    }
    let mut policy = sandbox_policy::build(PolicyRequest {
        workdir: request.workdir,
        cwd: request.cwd,
        allow_read: [
            grants(&defaults.allow_read, &request.allow_read),
            agent.read,
        ]
        .concat(),
        allow_write: [
            grants(&defaults.allow_write, &request.allow_write),
            agent.write,
        ]
        .concat(),
        copies: agent.copies,
        agent: agent.record,
        block_net: request.block_net || defaults.block_net,
        allow_ports,
        hook_port: defaults.hook_port,
        allow_domains,
        credentials,
        publish: [defaults.publish.clone(), request.publish.clone()].concat(),
        env,
        timeout: request.timeout.or(defaults.timeout),
        resources: sandbox_policy::compile::limits::resolve(request.resources, defaults.resources),
        unprotected_git: request.unprotected_git,
        push_remotes: request.push_remotes.clone(),
        allow_nested_git: request.allow_nested_git,
        tmpdir: tmpdir.as_ref().map(|t| t.path().to_path_buf()),
        ..PolicyRequest::default()
    })?;
    let (home, home_note) = match &request.home {
        Some(settings) => {
            let (guard, note) = crate::assembly::home::attach(&mut policy, settings)?;
            (Some(guard), note)
        }
        None => (None, None),
    };
    if !policy.credentials.is_empty() {
        apply_credentials(&mut policy)?;
    }
    Ok(Assembled {
        policy,
        tmpdir,
        home,
        home_note,
    })
}

/// Checks the policy's credentials where a run will read them (each secret present, a
/// secret file outside every grant) and puts their placeholders in the environment, over
/// anything passed: the variable the host reads a key from never carries it inside. The
/// run's proxy reads the secrets again when it starts (`Credentials::for_run`); the base
/// URLs, which name the proxy's port, are set by the run.
pub fn apply_credentials(policy: &mut Policy) -> Result<(), HostError> {
    // macOS has no PR_SET_DUMPABLE: there another process reads this one's memory only
    // through task_for_pid, which needs root or the debugger entitlement.
    #[cfg(target_os = "linux")]
    if !policy.credentials.is_empty() {
        crate::sys::hold_secrets();
    }
    let credentials = sandbox_net::Credentials::for_run(&policy.credentials)?;
    for (name, file) in credentials.files() {
        let file = std::fs::canonicalize(&file).unwrap_or(file);
        let grants = policy
            .fs
            .read
            .iter()
            .chain(&policy.fs.write)
            .map(|g| &g.path)
            .chain(&policy.fs.system_read);
        for grant in grants {
            if file.starts_with(grant) {
                return Err(HostError::CredentialGranted {
                    name,
                    file,
                    grant: grant.clone(),
                });
            }
        }
    }
    for (name, value) in credentials.policy_env() {
        policy.env.set_var(&name, value);
    }
    Ok(())
}

fn create_tmpdir(request: &TmpdirRequest, task: &Path) -> Result<PrivateTmpdir, HostError> {
    let root = request.root.clone().unwrap_or_else(std::env::temp_dir);
    PrivateTmpdir::create(&request.prefix, &root, task)
        .map_err(|source| HostError::Tmpdir { root, source })
}

/// Who a command runs as, for the variables every sandboxed process sees.
#[derive(Debug, Clone, Default)]
pub struct CommandIdentity {
    /// `SANDBOX_TASK`.
    pub task: String,
    /// `SANDBOX_BOX`, for commands in a daemon's box.
    pub box_name: Option<String>,
    /// `SANDBOX_API_URL` and the sandbox-scoped `SANDBOX_API_TOKEN`, while a daemon runs.
    pub hook: Option<(String, String)>,
}

/// The child's environment: the policy's pass/set lists applied to `from`, then `extra`
/// (`NAME=VALUE`, a `box.exec`'s own variables), then what every sandboxed process sees
/// (`SANDBOX_BACKEND`, `SANDBOX_TASK`, the hook endpoint) and, in a git worktree, a global
/// git config it can read (the real `~/.gitconfig` is out of a confined process's reach, so
/// git is told instead of warning on every command).
pub fn command_env(
    policy: &Policy,
    kind: BackendKind,
    who: &CommandIdentity,
    extra: &[(String, String)],
    from: impl IntoIterator<Item = (OsString, OsString)>,
) -> Result<Vec<(OsString, OsString)>, HostError> {
    let mut env = policy.env.clone();
    for (name, value) in extra {
        env.add_arg(&format!("{name}={value}"))
            .map_err(|cause| HostError::Env {
                arg: name.clone(),
                cause,
            })?;
    }
    if let Some(home) = &policy.fs.home {
        // Under the native view the private home is at the real home's path; a backend
        // without a view (custom; native without user namespaces, see `home_without_view`)
        // reaches it at its own.
        let at = match kind {
            BackendKind::Native => Some(&home.path),
            BackendKind::Custom => Some(&home.dir),
            _ => None,
        };
        for (name, value) in at.map(|at| home.env(at)).unwrap_or_default() {
            env.set_var(name, value.to_string_lossy());
        }
    }
    env.set_var("SANDBOX_BACKEND", kind.as_str());
    env.set_var("SANDBOX_TASK", who.task.clone());
    if let Some(name) = &who.box_name {
        env.set_var("SANDBOX_BOX", name.clone());
    }
    if let Some((url, token)) = &who.hook {
        env.set_var("SANDBOX_API_URL", url.clone());
        env.set_var("SANDBOX_API_TOKEN", token.clone());
    }
    if policy.workspace.git.is_some()
        && kind != BackendKind::Host
        && !env.set.iter().any(|(n, _)| n == "GIT_CONFIG_GLOBAL")
    {
        env.set_var("GIT_CONFIG_GLOBAL", "/dev/null");
    }
    let mut resolved = env.resolve(from);
    if policy.workspace.git.is_some() && kind != BackendKind::Host {
        wait_longer_for_ref_locks(&mut resolved);
    }
    // A login shell inside (`bash -l`, an agent's `bash -lc`, `sandbox shell`) reads
    // /etc/profile, which resets PATH: the private home's `.profile` puts the run's back
    // ([`crate::assembly::home::PROFILE`]).
    if policy.fs.home.is_some() {
        if let Some((_, path)) = resolved.iter().find(|(name, _)| name == "PATH") {
            let path = path.clone();
            resolved.retain(|(name, _)| name != crate::assembly::home::RUN_PATH);
            resolved.push((crate::assembly::home::RUN_PATH.into(), path));
        }
    }
    Ok(resolved)
}

/// The environment of a command that runs in a guest (a VM box): only its own variables (a
/// `box.exec`'s `env`). A guest has an environment of its own — its image's, and the box's
/// `env` set when it was created — and nothing of this host's (its `PATH`, `HOME`, `TMPDIR`
/// name places that are not in the guest) enters it.
pub fn guest_env(extra: &[(String, String)]) -> Vec<(OsString, OsString)> {
    extra
        .iter()
        .map(|(name, value)| (OsString::from(name), OsString::from(value)))
        .collect()
}

/// Points `HOME` and the XDG directories of a command's environment at the private home's
/// own path: for the native backend when this machine gives it no view (the real home's path
/// then is the host's real home, which the run cannot reach).
pub fn home_without_view(policy: &Policy, env: &mut [(OsString, OsString)]) {
    let Some(home) = &policy.fs.home else {
        return;
    };
    for (name, value) in home.env(&home.dir) {
        for (n, v) in env.iter_mut() {
            if n == name {
                *v = value.clone().into_os_string();
            }
        }
    }
}

/// How long git inside waits for a ref lock (`core.filesRefLockTimeout`) or for
/// `packed-refs.lock` (`core.packedRefsTimeout`), in milliseconds.
const REF_LOCK_WAIT_MS: &str = "5000";

/// Lets git inside wait for a lock the host holds instead of failing after git's default
/// 100 ms: without the quarantine the host's git and the sandbox's share the refs, and under it
/// `packed-refs.lock` in the common dir still shows through the overlay (the quarantine hides
/// the host's `refs/`, see `sandbox_git::quarantine`). On a busy machine 100 ms is short for a
/// lock the quarantine's own sync holds.
fn wait_longer_for_ref_locks(env: &mut Vec<(OsString, OsString)>) {
    add_git_config(
        env,
        &[
            ("core.filesRefLockTimeout", REF_LOCK_WAIT_MS),
            ("core.packedRefsTimeout", REF_LOCK_WAIT_MS),
        ],
    );
}

/// Adds git configuration to a command's environment through `GIT_CONFIG_COUNT` and
/// `GIT_CONFIG_KEY_n`/`GIT_CONFIG_VALUE_n`, after any the environment already holds (the
/// caller's own, the run's ref-lock waits): the one place a run's git settings are put
/// together, so one list never overwrites another. git reads these after every config file,
/// so they win over the user's, and a multi-valued key (`credential.*.helper`) is appended
/// to in order.
pub fn add_git_config<K: AsRef<str>, V: AsRef<str>>(
    env: &mut Vec<(OsString, OsString)>,
    settings: &[(K, V)],
) {
    if settings.is_empty() {
        return;
    }
    let count_at = env.iter().position(|(n, _)| n == "GIT_CONFIG_COUNT");
    let count: usize = match count_at {
        None => 0,
        Some(i) => match env[i].1.to_str().and_then(|c| c.parse().ok()) {
            Some(count) => count,
            // git refuses a count it cannot read; adding to it would only change the error.
            None => return,
        },
    };
    for (i, (key, value)) in settings
        .iter()
        .map(|(k, v)| (k.as_ref(), v.as_ref()))
        .enumerate()
    {
        let (k, v) = (
            format!("GIT_CONFIG_KEY_{}", count + i),
            format!("GIT_CONFIG_VALUE_{}", count + i),
        );
        // A stale entry past the old count would otherwise stand beside the new one.
        env.retain(|(n, _)| n.to_str() != Some(k.as_str()) && n.to_str() != Some(v.as_str()));
        env.push((k.into(), key.into()));
        env.push((v.into(), value.into()));
    }
    let total = OsString::from((count + settings.len()).to_string());
    // Found again: removing stale entries may have moved it.
    env.retain(|(n, _)| n != "GIT_CONFIG_COUNT");
    env.push(("GIT_CONFIG_COUNT".into(), total));
    env.sort();
}

/// The admission guard of a policy's commands: paths inside the workspace or a grant (read
/// or write) are admitted, nothing else. One guard for the CLI's `--guard-args` and the
/// daemon's `box.exec` (which also checks its working directory with it).
pub fn admission_guard(
    policy: &Policy,
) -> Result<sandbox_exec::WorkspaceGuard, sandbox_exec::ExecError> {
    let mut guard = sandbox_exec::WorkspaceGuard::new(&policy.workspace.root)?;
    for grant in policy.fs.write.iter().chain(policy.fs.read.iter()) {
        guard = guard.allow_root(&grant.path)?;
    }
    Ok(guard)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy_with(write: &[&Path], read: &[&Path], root: &Path) -> Policy {
        sandbox_policy::build(PolicyRequest {
            workdir: root.to_path_buf(),
            allow_write: write
                .iter()
                .map(|p| (p.to_path_buf(), GrantReason::User))
                .collect(),
            allow_read: read
                .iter()
                .map(|p| (p.to_path_buf(), GrantReason::User))
                .collect(),
            ..PolicyRequest::default()
        })
        .unwrap()
    }

    fn places(config: &Path, runtime: &Path) -> TrustedPlaces {
        TrustedPlaces(vec![
            TrustedPlace {
                path: config.to_path_buf(),
                what: "your sandbox configuration".into(),
                secret: false,
            },
            TrustedPlace {
                path: runtime.to_path_buf(),
                what: "the daemon's socket and host token".into(),
                secret: true,
            },
        ])
    }

    #[test]
    fn grants_covering_or_inside_a_trusted_place_are_refused() {
        let home = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(home.path()).unwrap();
        let work = home.join("work");
        let config = home.join("config/sandbox");
        let runtime = home.join("run/sandbox");
        for d in [&work, &config, &runtime] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(config.join("config.yaml"), "").unwrap();
        std::fs::write(runtime.join("host-token"), "secret").unwrap();
        let trusted = places(&config, &runtime);

        // Covering: a write grant of an ancestor.
        let err = trusted
            .check(&policy_with(&[&home.join("config")], &[], &work))
            .unwrap_err()
            .to_string();
        assert!(err.contains("covers"), "{err}");
        // Inside: a write grant on the configuration file itself.
        let err = trusted
            .check(&policy_with(&[&config.join("config.yaml")], &[], &work))
            .unwrap_err()
            .to_string();
        assert!(err.contains("lies inside"), "{err}");
        // Inside a secret place: even a read grant of the token file.
        let err = trusted
            .check(&policy_with(&[], &[&runtime.join("host-token")], &work))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("lies inside") && err.contains("control every sandbox"),
            "{err}"
        );
        // Reading the configuration is fine; so are unrelated grants.
        trusted
            .check(&policy_with(&[], &[&config.join("config.yaml")], &work))
            .unwrap();
        std::fs::create_dir_all(home.join("config/other")).unwrap();
        trusted
            .check(&policy_with(&[&home.join("config/other")], &[], &work))
            .unwrap();
    }

    #[test]
    fn a_place_that_does_not_exist_yet_is_judged_where_it_will_be() {
        let home = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(home.path()).unwrap();
        let work = home.join("work");
        let sibling = home.join("config/other");
        std::fs::create_dir_all(&work).unwrap();
        std::fs::create_dir_all(&sibling).unwrap();
        // `config/sandbox` does not exist: a sibling grant is not "inside" it...
        let trusted = places(&home.join("config/sandbox"), &home.join("run/sandbox"));
        trusted
            .check(&policy_with(&[&sibling], &[], &work))
            .unwrap();
        // ...but a grant of its parent covers where it will be created.
        let err = trusted
            .check(&policy_with(&[&home.join("config")], &[], &work))
            .unwrap_err()
            .to_string();
        assert!(err.contains("covers"), "{err}");
    }

    #[test]
    fn ref_lock_waits_are_added_after_the_callers_own_git_config() {
        let var = |env: &[(OsString, OsString)], name: &str| {
            env.iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.to_string_lossy().into_owned())
        };
        let mut env = vec![("PATH".into(), "/usr/bin".into())];
        wait_longer_for_ref_locks(&mut env);
        assert_eq!(var(&env, "GIT_CONFIG_COUNT").as_deref(), Some("2"));
        assert_eq!(
            var(&env, "GIT_CONFIG_KEY_0").as_deref(),
            Some("core.filesRefLockTimeout")
        );
        assert_eq!(var(&env, "GIT_CONFIG_VALUE_1").as_deref(), Some("5000"));

        let mut env: Vec<(OsString, OsString)> = vec![
            ("GIT_CONFIG_COUNT".into(), "1".into()),
            ("GIT_CONFIG_KEY_0".into(), "user.name".into()),
            ("GIT_CONFIG_VALUE_0".into(), "Mine".into()),
        ];
        wait_longer_for_ref_locks(&mut env);
        assert_eq!(var(&env, "GIT_CONFIG_COUNT").as_deref(), Some("3"));
        assert_eq!(var(&env, "GIT_CONFIG_VALUE_0").as_deref(), Some("Mine"));
        assert_eq!(
            var(&env, "GIT_CONFIG_KEY_2").as_deref(),
            Some("core.packedRefsTimeout")
        );

        // A second list (a credential's git route) goes after both, one count for all; a
        // stale entry past the old count is replaced, not doubled.
        env.push(("GIT_CONFIG_KEY_3".into(), "stale.key".into()));
        add_git_config(&mut env, &[("url.http://p/.insteadOf", "https://h/")]);
        assert_eq!(var(&env, "GIT_CONFIG_COUNT").as_deref(), Some("4"));
        assert_eq!(
            var(&env, "GIT_CONFIG_KEY_3").as_deref(),
            Some("url.http://p/.insteadOf")
        );
        assert_eq!(
            env.iter().filter(|(n, _)| n == "GIT_CONFIG_KEY_3").count(),
            1
        );
        assert_eq!(var(&env, "GIT_CONFIG_VALUE_0").as_deref(), Some("Mine"));

        let mut env: Vec<(OsString, OsString)> = vec![("GIT_CONFIG_COUNT".into(), "x".into())];
        wait_longer_for_ref_locks(&mut env);
        assert_eq!(
            env.len(),
            1,
            "an unreadable count is left for git to refuse"
        );
    }
}
