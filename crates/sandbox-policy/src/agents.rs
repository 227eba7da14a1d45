//! Agent profiles: which of a coding agent's paths under the real home a sandboxed run of it
//! needs, and how it may touch each (docs/security.md, "Agent profiles").
//!
//! A profile is data, one YAML file per agent in `profiles/` (shipped in the binary, each
//! file saying where its paths come from), overridable by the `agents:` key of the
//! configuration. Each path is one of:
//!
//! - `read`: what the host's agent runs or obeys — settings with hooks, MCP server commands,
//!   permission lists, plugins, instructions — and its login. Read-only, so nothing the agent
//!   does inside can give it code execution the next time the user runs it on the host.
//! - `write`: the agent's own state — sessions, history, logs, caches — written on the host,
//!   so `--resume` works across sandboxed and host runs. Created (empty) when missing.
//! - `copy`: a file that mixes both (Claude Code's `~/.claude.json`: onboarding state beside
//!   MCP servers and allowed tools). The host's file stays untouched; the run gets a private
//!   copy, made at start in a per-project place of the user's state dir and bound at the real
//!   path where the backend has a private view (read-only elsewhere). The host never reads
//!   the copy back.
//!
//! [`compile`] turns a profile into grants — a pure function, so every backend with path
//! grants gets the same ones, and the private view puts them on top of the private home.
//! What the profile added, and why, stays in the policy ([`crate::model::AgentGrants`]) for
//! `policy show` and `sandbox why`.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// How the sandboxed agent may use one path: `read` (read-only: the host runs or obeys what
/// it says), `write` (read-write on the host: the agent's own state), `copy` (a private copy
/// at the real path; the host's file is never written).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AgentAccess {
    Read,
    Write,
    Copy,
}

impl AgentAccess {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentAccess::Read => "read-only",
            AgentAccess::Write => "writable",
            AgentAccess::Copy => "private copy",
        }
    }
}

/// What a path is, for creating it when missing (only `write` paths are created).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PathKind {
    #[default]
    Dir,
    File,
}

/// The configuration schema says the enums as strings with a pattern (whole-string, in the
/// language Rust's `regex` and Nix's `builtins.match` read alike): the form the Nix modules'
/// settings type turns into `strMatching` (nixos-modules/settings.nix).
fn string_pattern(pattern: &str, description: &str) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "pattern": pattern,
        "description": description,
    })
}

impl schemars::JsonSchema for AgentAccess {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "AgentAccess".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        string_pattern(
            "read|write|copy",
            "`read` (read-only: the host runs or obeys what it says), `write` (the agent's own \
             state, written on the host), `copy` (a private copy at the real path)",
        )
    }
}

impl schemars::JsonSchema for PathKind {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "PathKind".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        string_pattern(
            "dir|file",
            "`dir` (the default) or `file`: what a missing `write` path is created as",
        )
    }
}

/// What the host checks after every run in a writable path: `git` — the path holds git
/// repositories the host's agent runs git in (Gemini CLI's checkpoints, opencode's
/// snapshots), so each is audited like the worktree's own git dir (no hook, no code-running
/// config key, no link, no pointer out) and what fails is set aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AgentAudit {
    Git,
}

impl schemars::JsonSchema for AgentAudit {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "AgentAudit".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        string_pattern(
            "git",
            "`git`: the writable path holds git repositories the host's agent runs git in; \
             each is audited after every run and what could run code on the host is set aside",
        )
    }
}

/// One path of a profile, as written in its file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfilePath {
    /// Under the home directory: `~/.claude/projects`.
    #[schemars(extend("pattern" = "~/.+"))]
    pub path: String,
    pub access: AgentAccess,
    /// `dir` (the default) or `file`: what a missing `write` path is created as. A `copy` is
    /// always a file.
    #[serde(default)]
    pub kind: PathKind,
    /// Only for `write`: what the host checks in it after every run (`git`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<AgentAudit>,
    /// Why the agent needs it, and why this access (shown by `policy show`).
    pub why: String,
    /// Settings the agent needs under a `--credential` and reads only from this JSON file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_defaults: Option<CredentialDefaults>,
}

/// Settings a profile adds to a JSON settings file of the agent's in a run with one
/// `--credential`: the run gets a private copy of the host's file (as `copy`, the host's
/// untouched) holding them wherever the file sets nothing (the user's own choice wins), or
/// holding only them when the host has no such file. Gemini CLI under `--credential google`:
/// `{"security": {"auth": {"selectedType": "gemini-api-key"}}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CredentialDefaults {
    /// The `--credential` NAME.
    pub when_credential: String,
    /// A JSON object (a YAML mapping), merged under the file's own settings.
    #[schemars(with = "serde_json::Map<String, serde_json::Value>")]
    pub settings: serde_json::Value,
    /// Why (shown by `policy show`).
    pub why: String,
}

/// One agent's profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentProfile {
    /// The name `--agent` takes (`claude`); in the configuration, the key.
    #[serde(default)]
    pub name: String,
    /// The agent's own name (`Claude Code`).
    pub title: String,
    /// Program names that select this profile when the command is one of them (`claude`).
    #[serde(default)]
    pub commands: Vec<String>,
    /// The agent's paths under the home, each with its access and why.
    pub paths: Vec<ProfilePath>,
    /// Variables every command of the run gets (under `--env`, which may change them).
    #[serde(default)]
    pub env: Vec<ProfileEnv>,
    /// Arguments put right after the program's name when the command is one of `commands`
    /// (`codex` → `codex -c sandbox_mode=…`): settings the agent reads only from its
    /// configuration or command line.
    #[serde(default)]
    pub args: Vec<ProfileArgs>,
}

/// A variable a profile sets in the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfileEnv {
    /// The variable's name (`IS_SANDBOX`).
    pub name: String,
    /// Its value in the run; a variable the user passes with `--env` wins.
    pub value: String,
    /// Why the agent needs it (shown by `policy show`).
    pub why: String,
}

/// Arguments a profile puts after the agent's program name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfileArgs {
    /// As given to the program; `{proxy}` stands for the run's proxy (`127.0.0.1:PORT`
    /// inside), for arguments that apply `when_credential`.
    pub args: Vec<String>,
    /// Only in a run with this `--credential` (whose base URL the agent reads only here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_credential: Option<String>,
    /// Options of the agent that ask for what these arguments turn off: when the command
    /// holds one, the run says in one line why it cannot work inside.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<String>,
    /// Why (shown by `policy show`, and in that line).
    pub why: String,
}

/// The profiles shipped in the binary, each file as written (comments say where every path
/// comes from).
pub const BUILTIN: &[(&str, &str)] = &[
    ("claude", include_str!("../profiles/claude.yaml")),
    ("codex", include_str!("../profiles/codex.yaml")),
    ("gemini", include_str!("../profiles/gemini.yaml")),
    ("opencode", include_str!("../profiles/opencode.yaml")),
    ("aider", include_str!("../profiles/aider.yaml")),
    ("goose", include_str!("../profiles/goose.yaml")),
    ("pi", include_str!("../profiles/pi.yaml")),
];

/// A profile that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("agent profile {name}: cannot be parsed: {cause}")]
    Parse { name: String, cause: String },
    #[error(
        "no agent profile named {name:?} (known: {known}); add one under `agents:` in the \
         configuration"
    )]
    Unknown { name: String, known: String },
    #[error("agent profile {agent}: path {path:?}: {cause}")]
    Path {
        agent: String,
        path: String,
        cause: String,
    },
}

/// The shipped profiles with the configuration's on top (a configured profile replaces the
/// shipped one of the same name), by name.
#[derive(Debug, Clone, Default)]
pub struct Profiles(BTreeMap<String, AgentProfile>);

impl Profiles {
    /// The shipped profiles, then `configured` (the `agents:` key) replacing or adding.
    pub fn load(configured: &BTreeMap<String, AgentProfile>) -> Result<Self, AgentError> {
        let mut all = BTreeMap::new();
        for (name, text) in BUILTIN {
            let profile: AgentProfile =
                serde_yaml::from_str(text).map_err(|e| AgentError::Parse {
                    name: (*name).to_string(),
                    cause: e.to_string(),
                })?;
            all.insert((*name).to_string(), profile);
        }
        for (name, profile) in configured {
            let mut profile = profile.clone();
            profile.name = name.clone();
            all.insert(name.clone(), profile);
        }
        Ok(Profiles(all))
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// The profile `--agent NAME` asks for.
    pub fn get(&self, name: &str) -> Result<&AgentProfile, AgentError> {
        self.0.get(name).ok_or_else(|| AgentError::Unknown {
            name: name.to_string(),
            known: self.names().collect::<Vec<_>>().join(", "),
        })
    }

    /// The profile whose `commands` name the program `argv0` runs (its file name:
    /// `/usr/local/bin/claude` is `claude`).
    pub fn detect(&self, argv0: &Path) -> Option<&AgentProfile> {
        let name = argv0.file_name()?.to_str()?;
        self.0
            .values()
            .find(|p| p.commands.iter().any(|c| c == name))
    }
}

/// Whether the program `argv0` could select a profile, without parsing any: a scan of the
/// shipped files' `commands:` lines and the configured profiles. Most commands are not
/// agents, and `sandbox run` is on every one's path.
pub fn may_select(argv0: &Path, configured: &BTreeMap<String, AgentProfile>) -> bool {
    let Some(name) = argv0.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    let in_line = |line: &str| {
        line.strip_prefix("commands:").is_some_and(|list| {
            list.split(|c: char| c == '[' || c == ']' || c == ',' || c.is_whitespace())
                .any(|word| word == name)
        })
    };
    BUILTIN.iter().any(|(_, text)| text.lines().any(in_line))
        || configured
            .values()
            .any(|p| p.commands.iter().any(|c| c == name))
}

/// One grant a profile adds: an absolute path under the home.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentPath {
    pub path: PathBuf,
    pub access: AgentAccess,
    pub kind: PathKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<AgentAudit>,
    pub why: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_defaults: Option<CredentialDefaults>,
}

/// A profile compiled against one home: the grants, in the profile's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompiledProfile {
    pub agent: String,
    pub title: String,
    pub paths: Vec<AgentPath>,
    /// The program names whose commands get `args`.
    #[serde(default)]
    pub commands: Vec<String>,
    #[serde(default)]
    pub env: Vec<ProfileEnv>,
    #[serde(default)]
    pub args: Vec<ProfileArgs>,
}

/// `~/x/y` under `home`, refusing anything that could leave it or name it whole.
fn expand(agent: &str, path: &str, home: &Path) -> Result<PathBuf, AgentError> {
    let bad = |cause: &str| AgentError::Path {
        agent: agent.to_string(),
        path: path.to_string(),
        cause: cause.to_string(),
    };
    let rest = path
        .strip_prefix("~/")
        .ok_or_else(|| bad("must start with ~/ (a path under the home directory)"))?;
    let rest = Path::new(rest);
    if rest.as_os_str().is_empty() {
        return Err(bad("names the whole home directory"));
    }
    // `components()` would quietly drop an inner `.` or `//`: the text is checked as written.
    let text = rest.to_string_lossy();
    if !rest.components().all(|c| matches!(c, Component::Normal(_)))
        || text.split('/').any(|c| c.is_empty() || c == ".")
    {
        return Err(bad("may not contain `.`, `..` or `//`"));
    }
    Ok(home.join(rest))
}

/// Compiles `profile` against the real `home`: every path made absolute and checked. Pure.
///
/// Refused: a path outside the home or the home itself, a `copy` of a directory, and a
/// read-only path (or copy) inside a writable one — where only the kernel's path rules hold
/// (Landlock, Seatbelt), a writable directory covers everything below it, so the read-only
/// file could be replaced.
pub fn compile(profile: &AgentProfile, home: &Path) -> Result<CompiledProfile, AgentError> {
    let mut paths = Vec::new();
    for entry in &profile.paths {
        let path = expand(&profile.name, &entry.path, home)?;
        if entry.audit.is_some() && entry.access != AgentAccess::Write {
            return Err(AgentError::Path {
                agent: profile.name.clone(),
                path: path.display().to_string(),
                cause: "an `audit` is for a writable path only".into(),
            });
        }
        if let Some(defaults) = &entry.credential_defaults {
            let cause = if entry.access == AgentAccess::Write {
                Some("`credential_defaults` is for a file that is `read` or `copy`")
            } else if !defaults.settings.is_object() {
                Some("`credential_defaults.settings` is not a mapping")
            } else {
                None
            };
            if let Some(cause) = cause {
                return Err(AgentError::Path {
                    agent: profile.name.clone(),
                    path: path.display().to_string(),
                    cause: cause.into(),
                });
            }
        }
        paths.push(AgentPath {
            path,
            access: entry.access,
            // A copy is a file; `kind` defaults to dir only for `write`.
            kind: if entry.access == AgentAccess::Copy {
                PathKind::File
            } else {
                entry.kind
            },
            audit: entry.audit,
            why: entry.why.clone(),
            credential_defaults: entry.credential_defaults.clone(),
        });
    }
    for inner in paths.iter().filter(|p| p.access != AgentAccess::Write) {
        if let Some(outer) = paths
            .iter()
            .find(|p| p.access == AgentAccess::Write && inner.path.starts_with(&p.path))
        {
            return Err(AgentError::Path {
                agent: profile.name.clone(),
                path: inner.path.display().to_string(),
                cause: format!(
                    "is {} but lies inside the writable {}: list the writable paths beside it \
                     instead",
                    inner.access.as_str(),
                    outer.path.display()
                ),
            });
        }
    }
    for var in &profile.env {
        if var.name.is_empty() || var.name.contains('=') || var.name.contains('\0') {
            return Err(AgentError::Path {
                agent: profile.name.clone(),
                path: var.name.clone(),
                cause: "is not a variable name".into(),
            });
        }
    }
    Ok(CompiledProfile {
        agent: profile.name.clone(),
        title: profile.title.clone(),
        paths,
        commands: profile.commands.clone(),
        env: profile.env.clone(),
        args: profile.args.clone(),
    })
}

/// One line for each of the profile's settings that `argv` asks to undo (Codex's `--sandbox
/// workspace-write`, which cannot start inside): the option, why it cannot work, and the
/// profile setting that stands instead. Nothing unless `argv[0]` is one of `commands`. An
/// option's value equal to what the profile sets (`--sandbox danger-full-access`) is no
/// conflict.
pub fn refused_options(
    agent: &str,
    commands: &[String],
    args: &[ProfileArgs],
    argv: &[std::ffi::OsString],
) -> Vec<String> {
    let Some((program, rest)) = argv.split_first() else {
        return Vec::new();
    };
    let name = Path::new(program).file_name().and_then(|n| n.to_str());
    if !name.is_some_and(|n| commands.iter().any(|c| c == n)) {
        return Vec::new();
    }
    let mut lines = Vec::new();
    for entry in args {
        let setting = entry.args.join(" ");
        for (i, arg) in rest.iter().enumerate() {
            let arg = arg.to_string_lossy();
            let Some(option) = entry.refused.iter().find(|o| {
                *arg == **o
                    || arg
                        .strip_prefix(o.as_str())
                        .is_some_and(|v| v.starts_with('='))
            }) else {
                continue;
            };
            let value = match arg.split_once('=') {
                Some((_, v)) => Some(v.to_string()),
                None => rest.get(i + 1).map(|v| v.to_string_lossy().into_owned()),
            };
            if value.is_some_and(|v| !v.starts_with('-') && setting.contains(&v)) {
                continue;
            }
            lines.push(format!(
                "{option} cannot work inside: {}; the profile {agent} sets `{setting}` instead",
                entry.why
            ));
        }
    }
    lines
}

/// Where the private copy of `path` (under `home`) goes in the per-project place `dir`:
/// the same path below it (`~/.claude.json` → `<dir>/.claude.json`).
pub fn copy_location(dir: &Path, home: &Path, path: &Path) -> Option<PathBuf> {
    Some(dir.join(path.strip_prefix(home).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profiles() -> Profiles {
        Profiles::load(&BTreeMap::new()).unwrap()
    }

    #[test]
    fn an_option_that_undoes_a_profile_setting_is_named_once_with_the_setting() {
        let all = profiles();
        let codex = compile(all.get("codex").unwrap(), Path::new("/home/u")).unwrap();
        let lines = |argv: &[&str]| {
            let argv: Vec<std::ffi::OsString> = argv.iter().map(Into::into).collect();
            refused_options("codex", &codex.commands, &codex.args, &argv)
        };
        let line = lines(&[
            "/usr/bin/codex",
            "exec",
            "--sandbox",
            "workspace-write",
            "hi",
        ]);
        assert_eq!(line.len(), 1, "{line:?}");
        assert!(
            line[0].starts_with("--sandbox cannot work inside: Codex's own sandbox")
                && line[0].ends_with(
                    "the profile codex sets `-c sandbox_mode=\"danger-full-access\"` instead"
                ),
            "{line:?}"
        );
        assert_eq!(lines(&["codex", "--full-auto", "exec"]).len(), 1);
        assert_eq!(lines(&["codex", "-s=read-only"]).len(), 1);
        // What the profile sets anyway, an unrelated option, another program: no line.
        assert!(lines(&["codex", "-s", "danger-full-access"]).is_empty());
        assert!(lines(&["codex", "exec", "--skip-git-repo-check"]).is_empty());
        assert!(lines(&["sh", "-c", "codex --sandbox workspace-write"]).is_empty());
    }

    #[test]
    fn every_shipped_profile_parses_and_compiles() {
        let all = profiles();
        let names: Vec<&str> = all.names().collect();
        for want in [
            "aider", "claude", "codex", "gemini", "goose", "opencode", "pi",
        ] {
            assert!(names.contains(&want), "{names:?}");
        }
        for name in names {
            let profile = all.get(name).unwrap();
            assert_eq!(profile.name, name);
            let compiled = compile(profile, Path::new("/home/u")).unwrap();
            assert!(!compiled.paths.is_empty(), "{name}");
            for p in &compiled.paths {
                assert!(
                    p.path.starts_with("/home/u/"),
                    "{name}: {}",
                    p.path.display()
                );
                assert!(!p.why.is_empty(), "{name}: {}", p.path.display());
            }
            // Each profile says where its paths come from.
            let text = BUILTIN.iter().find(|(n, _)| *n == name).unwrap().1;
            assert!(text.contains("Where each path comes from"), "{name}");
        }
    }

    #[test]
    fn what_the_host_runs_stays_read_only_and_mixed_files_are_copied() {
        let all = profiles();
        let home = Path::new("/home/u");
        let access = |agent: &str, path: &str| {
            compile(all.get(agent).unwrap(), home)
                .unwrap()
                .paths
                .into_iter()
                .find(|p| p.path == home.join(path))
                .map(|p| p.access)
        };
        assert_eq!(
            access("claude", ".claude/settings.json"),
            Some(AgentAccess::Read)
        );
        assert_eq!(access("claude", ".claude/plugins"), Some(AgentAccess::Read));
        assert_eq!(access("claude", ".claude.json"), Some(AgentAccess::Copy));
        assert_eq!(
            access("claude", ".claude/projects"),
            Some(AgentAccess::Write)
        );
        assert_eq!(
            access("codex", ".codex/config.toml"),
            Some(AgentAccess::Read)
        );
        assert_eq!(access("codex", ".codex/sessions"), Some(AgentAccess::Write));
        assert_eq!(
            access("gemini", ".gemini/settings.json"),
            Some(AgentAccess::Read)
        );
        assert_eq!(
            access("pi", ".pi/agent/extensions"),
            Some(AgentAccess::Read)
        );
        assert_eq!(access("pi", ".pi/agent/sessions"), Some(AgentAccess::Write));
        // Scripts a host session sources are not granted at all (the private home has them).
        assert_eq!(access("claude", ".claude/shell-snapshots"), None);
        assert_eq!(access("codex", ".codex/shell_snapshots"), None);
    }

    /// The repositories the host's agent runs git in stay writable (checkpoints made inside
    /// restore on the host) and are audited after every run; an audit on a path that is
    /// not writable means nothing and is refused.
    #[test]
    fn the_agents_git_repositories_are_audited() {
        let all = profiles();
        let home = Path::new("/home/u");
        let audited: Vec<(String, PathBuf)> = BUILTIN
            .iter()
            .flat_map(|(name, _)| {
                compile(all.get(name).unwrap(), home)
                    .unwrap()
                    .paths
                    .into_iter()
                    .filter(|p| p.audit == Some(AgentAudit::Git))
                    .map(move |p| {
                        assert_eq!(p.access, AgentAccess::Write, "{}", p.path.display());
                        (name.to_string(), p.path)
                    })
            })
            .collect();
        assert_eq!(
            audited,
            [
                ("gemini".into(), home.join(".gemini/history")),
                (
                    "opencode".into(),
                    home.join(".local/share/opencode/snapshot")
                ),
            ]
        );
        let mut bad = profile(&[("~/.x", AgentAccess::Read)]);
        bad.paths[0].audit = Some(AgentAudit::Git);
        let err = compile(&bad, home).unwrap_err().to_string();
        assert!(err.contains("writable path only"), "{err}");
        // Every writable path of a shipped profile says what the host's agent does with it,
        // in a comment right above its entry.
        for (name, text) in BUILTIN {
            let lines: Vec<&str> = text.lines().map(str::trim).collect();
            for (i, line) in lines.iter().enumerate() {
                if *line == "access: write" {
                    assert!(
                        i >= 2 && lines[i - 2].starts_with('#'),
                        "{name}: {} has no finding above it",
                        lines[i - 1]
                    );
                }
            }
        }
    }

    #[test]
    fn the_command_name_selects_the_profile() {
        let all = profiles();
        let name = |argv0: &str| all.detect(Path::new(argv0)).map(|p| p.name.clone());
        assert_eq!(name("claude").as_deref(), Some("claude"));
        assert_eq!(name("/opt/x/bin/codex").as_deref(), Some("codex"));
        assert_eq!(name("pi-acp").as_deref(), Some("pi"));
        assert_eq!(name("gemini").as_deref(), Some("gemini"));
        assert_eq!(name("cargo"), None);
        // The scan without parsing agrees.
        for argv0 in [
            "claude", "/x/codex", "pi-acp", "gemini", "opencode", "aider", "goose", "pi",
        ] {
            assert!(may_select(Path::new(argv0), &BTreeMap::new()), "{argv0}");
            assert!(all.detect(Path::new(argv0)).is_some(), "{argv0}");
        }
        for argv0 in ["cargo", "claude-helper", "p", "commands", "sh"] {
            assert!(!may_select(Path::new(argv0), &BTreeMap::new()), "{argv0}");
        }
        assert_eq!(name("claude-helper"), None);
        let err = all.get("nope").unwrap_err().to_string();
        assert!(err.contains("claude") && err.contains("agents:"), "{err}");
    }

    fn profile(paths: &[(&str, AgentAccess)]) -> AgentProfile {
        AgentProfile {
            name: "x".into(),
            title: "X".into(),
            commands: vec![],
            paths: paths
                .iter()
                .map(|(p, a)| ProfilePath {
                    path: p.to_string(),
                    access: *a,
                    kind: PathKind::Dir,
                    audit: None,
                    why: "test".into(),
                    credential_defaults: None,
                })
                .collect(),
            env: vec![],
            args: vec![],
        }
    }

    #[test]
    fn paths_that_leave_the_home_or_hide_under_a_writable_one_are_refused() {
        let home = Path::new("/home/u");
        for bad in [
            "/etc/passwd",
            "~",
            "~/",
            "~/../other",
            "~/a/./b",
            "relative",
            "~/a//b",
        ] {
            let err = compile(&profile(&[(bad, AgentAccess::Read)]), home);
            assert!(err.is_err(), "{bad}");
        }
        let err = compile(
            &profile(&[
                ("~/.x", AgentAccess::Write),
                ("~/.x/settings.json", AgentAccess::Read),
            ]),
            home,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("inside the writable"), "{err}");
        let err = compile(
            &profile(&[
                ("~/.x", AgentAccess::Write),
                ("~/.x/y.json", AgentAccess::Copy),
            ]),
            home,
        );
        assert!(err.is_err());
        // Writable inside read-only is fine (a rule for the deeper path adds writing).
        let ok = compile(
            &profile(&[
                ("~/.x", AgentAccess::Read),
                ("~/.x/log", AgentAccess::Write),
            ]),
            home,
        )
        .unwrap();
        assert_eq!(ok.paths[1].path, Path::new("/home/u/.x/log"));
        // A copy is always a file.
        let copy = compile(&profile(&[("~/.x.json", AgentAccess::Copy)]), home).unwrap();
        assert_eq!(copy.paths[0].kind, PathKind::File);
    }

    #[test]
    fn a_configured_profile_replaces_the_shipped_one() {
        let mut configured = BTreeMap::new();
        configured.insert(
            "claude".to_string(),
            AgentProfile {
                name: "ignored".into(),
                ..profile(&[("~/.mine", AgentAccess::Write)])
            },
        );
        configured.insert(
            "mytool".to_string(),
            profile(&[("~/.t", AgentAccess::Read)]),
        );
        let all = Profiles::load(&configured).unwrap();
        let claude = all.get("claude").unwrap();
        assert_eq!(claude.name, "claude");
        assert_eq!(claude.paths.len(), 1);
        assert!(all.get("mytool").is_ok());
        assert!(all.get("codex").is_ok());
    }

    #[test]
    fn a_copy_lands_at_the_same_path_below_the_private_place() {
        assert_eq!(
            copy_location(
                Path::new("/state/agents/p/claude"),
                Path::new("/home/u"),
                Path::new("/home/u/.claude.json")
            ),
            Some(PathBuf::from("/state/agents/p/claude/.claude.json"))
        );
        assert_eq!(
            copy_location(Path::new("/s"), Path::new("/home/u"), Path::new("/etc/x")),
            None
        );
    }
}
