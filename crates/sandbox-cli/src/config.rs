//! Configuration: YAML read only from the trusted locations — `/etc/sandbox/config.yaml`, then
//! `$XDG_CONFIG_HOME/sandbox/config.yaml` — and never from the working directory, since the
//! sandboxed process can write there and a boundary it can configure is one it can turn off.
//!
//! Unknown keys are errors. A bad file is reported with its path, line, column and the key.
//! Every key may be `null`, which means the same as leaving it out. (YAML reads an unquoted
//! `FOO: 1` as the text "1" where text is expected; the Nix modules always write strings.)
//!
//! These types are the one source of the schema: `sandbox config schema` prints it as JSON
//! Schema (`schema`), the committed copy `crates/sandbox-cli/config-schema.json` is checked
//! against it, and the NixOS and home-manager modules build their typed `settings` options
//! from that copy (nixos-modules/settings.nix).

pub mod formats;
pub mod schema;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use formats::{
    CpusFormat, CredentialFormat, DurationFormat, EnvMapFormat, EnvNameFormat, HomeScopeFormat,
    PathFormat, PortFormat, SizeFormat, ToolchainFormat,
};

/// The whole configuration schema. Every key is optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "sandbox configuration (config.yaml)")]
pub struct Config {
    /// Default backend when neither `--backend` nor `sandbox use` chose one (`native`, `nono`,
    /// `custom`, `host`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Extra folders granted read-write to every sandbox (a shared cache, a sibling repo).
    #[serde(
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(with = "Option<Vec<PathFormat>>")]
    pub additional_folders: Vec<PathBuf>,
    /// Extra folders granted read-only.
    #[serde(
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(with = "Option<Vec<PathFormat>>")]
    pub read_folders: Vec<PathBuf>,
    /// Network access.
    #[serde(
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "is_default"
    )]
    #[schemars(with = "Option<NetworkConfig>")]
    pub network: NetworkConfig,
    /// Environment variables.
    #[serde(
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "is_default"
    )]
    #[schemars(with = "Option<EnvConfig>")]
    pub env: EnvConfig,
    /// Default timeout for `sandbox run` (`30s`, `5m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<DurationFormat>")]
    pub timeout: Option<String>,
    /// Resource limits of every run on this machine's kernel (native, nono, custom; VM
    /// backends size their VM from `memory` and `cpus`): the `--memory`, `--pids` and
    /// `--cpus` flags override them.
    #[serde(
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "is_default"
    )]
    #[schemars(with = "Option<LimitsConfig>")]
    pub limits: LimitsConfig,
    /// Sandbox views (VM backends).
    #[serde(
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "is_default"
    )]
    #[schemars(with = "Option<ViewsConfig>")]
    pub views: ViewsConfig,
    /// The daemon (`sandbox serve`).
    #[serde(
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "is_default"
    )]
    #[schemars(with = "Option<ServiceConfig>")]
    pub service: ServiceConfig,
    /// Per-backend settings.
    #[serde(
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "is_default"
    )]
    #[schemars(with = "Option<BackendsConfig>")]
    pub backends: BackendsConfig,
    /// Agent profiles by name (`--agent NAME`, or chosen by the command's name): each replaces
    /// the shipped profile of that name, or adds one. A profile lists the agent's paths under
    /// the home and their access: `read` (what the host's agent runs or obeys), `write` (its
    /// sessions, history, logs), `copy` (a file mixing both: the run gets a private copy).
    #[serde(
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    #[schemars(with = "Option<BTreeMap<String, sandbox_policy::agents::AgentProfile>>")]
    pub agents: BTreeMap<String, sandbox_policy::agents::AgentProfile>,
    /// The run's private, persistent home (native, custom): `per-task` (the default: one
    /// per worktree, with its own cache layers), `per-project` (every worktree of a
    /// repository shares one, and its cache layers: start-up code one task's run leaves there,
    /// such as a `.bashrc` line or a Python `.pth`, runs in the other tasks' runs, with their
    /// grants), or `off` (the command gets your HOME string but not its content, no
    /// toolchains, no caches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<HomeScopeFormat>")]
    pub home: Option<String>,
    /// Your toolchains, mounted read-only at their real paths: `auto` (the default: every
    /// one found on PATH and in the well-known layouts), `none`, or a list of names (`rust`,
    /// `node`, `python`, `go`, ...; `sandbox home` lists them).
    #[serde(
        default,
        deserialize_with = "one_or_many",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<Vec<ToolchainFormat>>")]
    pub toolchains: Option<Vec<String>>,
    /// Layer your package caches (cargo, npm, pip, go, ...) copy-on-write into the private
    /// home (default true): a run reuses what you downloaded, keeps what it downloads, and
    /// never writes your caches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caches: Option<bool>,
    /// The bound of one project's cache layers, in MiB (default 10240), checked when a run
    /// starts: over it, the run is refused (`sandbox home reset --caches` frees them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16777216))]
    pub cache_size_mib: Option<u64>,
    /// API credentials every run gets without their secrets (`anthropic`, `openai`,
    /// `google`, `github`; as `--credential NAME`): the command holds a placeholder and a
    /// base URL pointing at the sandbox's proxy, which adds the real key (read on the host
    /// from its environment, `~/.config/sandbox/credentials/NAME` or the kernel keyring) on
    /// the way to the API host only.
    #[serde(
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(with = "Option<Vec<CredentialFormat>>")]
    pub credentials: Vec<String>,
}

/// A list, or one value standing for a list of it (`toolchains: auto`).
fn one_or_many<'de, D>(de: D) -> Result<Option<Vec<String>>, D::Error>
where
    D: Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Option::<OneOrMany>::deserialize(de)? {
        None => None,
        Some(OneOrMany::One(v)) => Some(vec![v]),
        Some(OneOrMany::Many(v)) => Some(v),
    })
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Memory of all a run's processes together (`512M`, `2G`, `off`); default none. At the
    /// limit the kernel kills the command (exit 137).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<SizeFormat>")]
    pub memory: Option<String>,
    /// Processes and threads a run may have at once (0: no limit); default 4096, which
    /// stops a fork bomb.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 4194304))]
    pub pids: Option<u64>,
    /// CPUs' worth of time a run gets (`0.5`, `2`, `off`); default none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<CpusFormat>")]
    pub cpus: Option<String>,
}

impl LimitsConfig {
    /// The configured limits (memory bytes, pids, thousandths of a CPU); `Some(None)` is
    /// `off`, `None` not set.
    pub fn resources(&self) -> Result<[Option<Option<u64>>; 3], String> {
        use sandbox_policy::compile::limits::{parse_cpus, parse_memory};
        let memory = match &self.memory {
            Some(m) => Some(parse_memory(m).map_err(|e| format!("limits.memory: {e}"))?),
            None => None,
        };
        let cpus = match &self.cpus {
            Some(c) => Some(parse_cpus(c).map_err(|e| format!("limits.cpus: {e}"))?),
            None => None,
        };
        let pids = self.pids.map(|n| (n > 0).then_some(n));
        Ok([memory, pids, cpus])
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkConfig {
    /// Deny outbound network except the allowed ports (and the hook port).
    #[serde(
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "is_default"
    )]
    #[schemars(with = "Option<bool>")]
    pub block: bool,
    /// TCP ports that stay reachable when the network is blocked.
    #[serde(
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(with = "Option<Vec<PortFormat>>")]
    pub allow_ports: Vec<u16>,
    /// Domains reachable through the nono backend's proxy (nono only).
    #[serde(
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(with = "Option<Vec<String>>")]
    pub allow_domains: Vec<String>,
    /// Servers of the run published to the host (native backend, with its own network
    /// namespace): `[HOST_ADDR:]HOST_PORT[:INNER_PORT]`, as `--publish` takes them.
    #[serde(
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(with = "Option<Vec<formats::PublishFormat>>")]
    pub publish: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvConfig {
    /// Extra variable names passed from the terminal into the sandbox.
    #[serde(
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(with = "Option<Vec<EnvNameFormat>>")]
    pub pass: Vec<String>,
    /// Variables set in the sandbox.
    #[serde(
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    #[schemars(with = "Option<EnvMapFormat>")]
    pub set: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ViewsConfig {
    /// Where sandbox views are created (default `$XDG_DATA_HOME/sandbox/views`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<PathFormat>")]
    pub root: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    /// Loopback port of the status-hook endpoint; always reachable from sandboxes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook_port: Option<u16>,
    /// How long the daemon lives on with no box, no running command and no client connection
    /// before it exits (`5m` by default; `0s`: never). `sandbox serve --idle-exit` overrides
    /// it. A client that finds no daemon starts one again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<DurationFormat>")]
    pub idle_exit: Option<String>,
}

impl ServiceConfig {
    /// [`Self::idle_exit`] as the daemon takes it: `None` for never; the default when unset.
    pub fn idle_exit(&self) -> Option<std::time::Duration> {
        match self.idle_exit.as_deref().map(humantime::parse_duration) {
            None | Some(Err(_)) => Some(sandbox_service::daemon::DEFAULT_IDLE_EXIT),
            Some(Ok(d)) => (!d.is_zero()).then_some(d),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BackendsConfig {
    /// The native backend (Landlock and seccomp, or Seatbelt).
    #[serde(
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "is_default"
    )]
    #[schemars(with = "Option<NativeBackendConfig>")]
    pub native: NativeBackendConfig,
    /// The custom backend (your launcher).
    #[serde(
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "is_default"
    )]
    #[schemars(with = "Option<CustomBackendConfig>")]
    pub custom: CustomBackendConfig,
    /// The nono backend.
    #[serde(
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "is_default"
    )]
    #[schemars(with = "Option<NonoBackendConfig>")]
    pub nono: NonoBackendConfig,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NativeBackendConfig {
    /// Where user namespaces are unavailable (no private view), allow unix sockets anyway:
    /// a pathname socket outside the policy (tmux, D-Bus, docker) is then reachable.
    #[serde(
        default,
        deserialize_with = "or_default",
        skip_serializing_if = "is_default"
    )]
    #[schemars(with = "Option<bool>")]
    pub allow_unix_sockets: bool,
    /// The size of a run's git store layer (the tmpfs that takes the objects and refs a
    /// quarantined run writes), in MiB; default 1024. A run that fills it sees ENOSPC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1048576))]
    pub git_store_size_mib: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CustomBackendConfig {
    /// The launcher command line, split with shell-style quoting, nothing expanded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NonoBackendConfig {
    /// Path of the `nono` binary; overrides the package's and `PATH`, not `SANDBOX_NONO`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<PathFormat>")]
    pub path: Option<PathBuf>,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// `null` reads as the default, as a missing key does (the schema makes every key nullable).
fn or_default<'de, D, T>(de: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(de)?.unwrap_or_default())
}

/// A configuration file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}", path = .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}{location}: {key}{message}", path = .path.display())]
    Parse {
        path: PathBuf,
        /// `:LINE:COLUMN`, when known.
        location: String,
        /// "key `a.b`: ", when known.
        key: String,
        message: String,
    },
    #[error("{path}: {message}", path = .path.display())]
    Invalid { path: PathBuf, message: String },
}

/// The merged configuration plus where it came from.
#[derive(Debug, Clone, Default)]
pub struct LoadedConfig {
    pub config: Config,
    pub sources: Vec<PathBuf>,
    /// The file that set `backends.custom.command` (the launcher must come from a file the
    /// sandbox cannot write).
    pub custom_command_source: Option<PathBuf>,
}

/// Parses one file's text. `path` is only used in messages.
pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
    if text
        .lines()
        .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
    {
        return Ok(Config::default());
    }
    let de = serde_yaml::Deserializer::from_str(text);
    let config: Config = serde_path_to_error::deserialize(de).map_err(|err| {
        let key = err.path().to_string();
        let inner = err.into_inner();
        let location = inner
            .location()
            .map(|l| format!(":{}:{}", l.line(), l.column()))
            .unwrap_or_default();
        // serde_yaml appends " at line L column C"; the location is already in front.
        let mut message = inner.to_string();
        if let Some(i) = message.find(" at line ") {
            message.truncate(i);
        }
        ConfigError::Parse {
            path: path.to_path_buf(),
            location,
            key: if key.is_empty() || key == "." {
                String::new()
            } else {
                format!("key `{key}`: ")
            },
            message,
        }
    })?;
    validate(&config, path)?;
    Ok(config)
}

fn validate(config: &Config, path: &Path) -> Result<(), ConfigError> {
    use formats::Format;
    let invalid = |message: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        message,
    };
    let check = |key: &str, value: &str, format: &Format| {
        if format.matches(value) {
            Ok(())
        } else {
            Err(invalid(format!(
                "key `{key}`: {value:?} is not {}",
                format.describe
            )))
        }
    };
    for (name, profile) in &config.agents {
        let profile = sandbox_policy::agents::AgentProfile {
            name: name.clone(),
            ..profile.clone()
        };
        if let Err(e) = sandbox_policy::agents::compile(&profile, Path::new("/home/user")) {
            return Err(invalid(format!("key `agents.{name}`: {e}")));
        }
    }
    let paths = [
        ("additional_folders", &config.additional_folders[..]),
        ("read_folders", &config.read_folders[..]),
        ("views.root", config.views.root.as_slice()),
        ("backends.nono.path", config.backends.nono.path.as_slice()),
    ];
    for (key, values) in paths {
        for value in values {
            check(key, &value.to_string_lossy(), &formats::PATH)?;
        }
    }
    if let Some(t) = &config.timeout {
        check("timeout", t, &formats::DURATION)?;
        humantime::parse_duration(t)
            .map_err(|e| invalid(format!("key `timeout`: {t:?} is not a duration: {e}")))?;
    }
    if let Some(t) = &config.service.idle_exit {
        check("service.idle_exit", t, &formats::DURATION)?;
        humantime::parse_duration(t).map_err(|e| {
            invalid(format!(
                "key `service.idle_exit`: {t:?} is not a duration: {e}"
            ))
        })?;
    }
    if let Some(m) = &config.limits.memory {
        check("limits.memory", m, &formats::SIZE)?;
    }
    if let Some(c) = &config.limits.cpus {
        check("limits.cpus", c, &formats::CPUS)?;
    }
    if config.limits.pids.is_some_and(|n| n > 4_194_304) {
        return Err(invalid(
            "key `limits.pids`: at most 4194304 (0: no limit)".into(),
        ));
    }
    config.limits.resources().map_err(invalid)?;
    if let Some(mib) = config.backends.native.git_store_size_mib {
        if !(1..=1 << 20).contains(&mib) {
            return Err(invalid(format!(
                "key `backends.native.git_store_size_mib`: {mib} is not between 1 and 1048576 \
                 (MiB)"
            )));
        }
    }
    for text in &config.network.publish {
        check("network.publish", text, &formats::PUBLISH)?;
        sandbox_policy::Publish::parse(text)
            .map_err(|e| invalid(format!("key `network.publish`: {e}")))?;
    }
    if config.network.allow_ports.contains(&0) {
        return Err(invalid(
            "key `network.allow_ports`: port 0 is not a port".into(),
        ));
    }
    for name in &config.env.pass {
        check("env.pass", name, &formats::ENV_NAME)?;
    }
    if let Some(scope) = &config.home {
        check("home", scope, &formats::HOME_SCOPE)?;
    }
    for name in config.toolchains.iter().flatten() {
        check("toolchains", name, &formats::TOOLCHAIN)?;
    }
    if let Some(list) = &config.toolchains {
        if list.len() > 1 && list.iter().any(|n| n == "auto" || n == "none") {
            return Err(invalid(
                "key `toolchains`: `auto` and `none` stand alone, not in a list of names".into(),
            ));
        }
    }
    if let Some(mib) = config.cache_size_mib {
        if !(1..=1 << 24).contains(&mib) {
            return Err(invalid(format!(
                "key `cache_size_mib`: {mib} is not between 1 and 16777216 (MiB)"
            )));
        }
    }
    for name in config.env.set.keys() {
        check("env.set", name, &formats::ENV_NAME)?;
    }
    for name in &config.credentials {
        check("credentials", name, &formats::CREDENTIAL)?;
    }
    Ok(())
}

fn read_one(path: &Path) -> Result<Option<Config>, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text, path).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ConfigError::Read {
            path: path.to_path_buf(),
            source: e,
        }),
    }
}

/// Merges `over` onto `base`: scalars in `over` win, lists are concatenated (system grants
/// plus user grants), maps are merged key by key.
pub fn merge(mut base: Config, over: Config) -> Config {
    fn opt<T>(b: &mut Option<T>, o: Option<T>) {
        if o.is_some() {
            *b = o;
        }
    }
    opt(&mut base.backend, over.backend);
    base.additional_folders.extend(over.additional_folders);
    base.read_folders.extend(over.read_folders);
    base.network.block |= over.network.block;
    base.network.allow_ports.extend(over.network.allow_ports);
    base.network.publish.extend(over.network.publish);
    base.network
        .allow_domains
        .extend(over.network.allow_domains);
    base.env.pass.extend(over.env.pass);
    base.env.set.extend(over.env.set);
    opt(&mut base.timeout, over.timeout);
    opt(&mut base.limits.memory, over.limits.memory);
    opt(&mut base.limits.pids, over.limits.pids);
    opt(&mut base.limits.cpus, over.limits.cpus);
    opt(&mut base.views.root, over.views.root);
    opt(&mut base.service.hook_port, over.service.hook_port);
    opt(&mut base.service.idle_exit, over.service.idle_exit);
    opt(
        &mut base.backends.custom.command,
        over.backends.custom.command,
    );
    opt(&mut base.backends.nono.path, over.backends.nono.path);
    base.backends.native.allow_unix_sockets |= over.backends.native.allow_unix_sockets;
    base.agents.extend(over.agents);
    opt(&mut base.home, over.home);
    opt(&mut base.toolchains, over.toolchains);
    opt(&mut base.caches, over.caches);
    opt(&mut base.cache_size_mib, over.cache_size_mib);
    for name in over.credentials {
        if !base.credentials.contains(&name) {
            base.credentials.push(name);
        }
    }
    opt(
        &mut base.backends.native.git_store_size_mib,
        over.backends.native.git_store_size_mib,
    );
    base
}

/// Loads the system file, then the user file over it.
pub fn load(system: &Path, user: &Path) -> Result<LoadedConfig, ConfigError> {
    let mut loaded = LoadedConfig::default();
    for path in [system, user] {
        if let Some(cfg) = read_one(path)? {
            if cfg.backends.custom.command.is_some() {
                loaded.custom_command_source = Some(path.to_path_buf());
            }
            loaded.config = merge(loaded.config, cfg);
            loaded.sources.push(path.to_path_buf());
        }
    }
    Ok(loaded)
}

/// Expands a leading `~/` against `$HOME` (config values only; nothing else is expanded).
pub fn expand_home(path: &Path) -> PathBuf {
    match path.strip_prefix("~") {
        Ok(rest) => std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/"))
            .join(rest),
        Err(_) => path.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_key_names_file_line_and_key() {
        let text = "backend: native\nnetwork:\n  block: true\n  alow_ports: [3000]\n";
        let err = parse(text, Path::new("/x/config.yaml")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("/x/config.yaml:4:"), "{msg}");
        assert!(msg.contains("network"), "{msg}");
        assert!(msg.contains("alow_ports"), "{msg}");
    }

    #[test]
    fn wrong_type_names_the_key() {
        let text = "network:\n  allow_ports: [http]\n";
        let msg = parse(text, Path::new("c.yaml")).unwrap_err().to_string();
        assert!(msg.contains("c.yaml:2:"), "{msg}");
        assert!(msg.contains("network.allow_ports"), "{msg}");
    }

    #[test]
    fn empty_and_comment_only_files_are_defaults() {
        assert_eq!(parse("", Path::new("c")).unwrap(), Config::default());
        assert_eq!(
            parse("# nothing\n\n", Path::new("c")).unwrap(),
            Config::default()
        );
    }

    #[test]
    fn merge_user_over_system() {
        let sys = parse(
            "backend: host\nadditional_folders: [/srv/cache]\nnetwork: {allow_ports: [80]}\n",
            Path::new("s"),
        )
        .unwrap();
        let user = parse(
            "backend: native\nadditional_folders: [/data]\nnetwork: {allow_ports: [3000]}\n",
            Path::new("u"),
        )
        .unwrap();
        let m = merge(sys, user);
        assert_eq!(m.backend.as_deref(), Some("native"));
        assert_eq!(m.additional_folders.len(), 2);
        assert_eq!(m.network.allow_ports, vec![80, 3000]);
    }

    #[test]
    fn invalid_values_are_refused() {
        assert!(parse("timeout: soon\n", Path::new("c")).is_err());
        assert!(parse("additional_folders: [relative/dir]\n", Path::new("c")).is_err());
        assert!(parse("network: {allow_ports: [70000]}\n", Path::new("c")).is_err());
    }
}
