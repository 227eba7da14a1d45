//! An agent profile made real on the host before a run: its writable paths created when
//! missing, its mixed files copied into the run's private place, and the grants handed to the
//! policy ([`crate::assembly::assemble`]). The profile itself was compiled, without I/O, by
//! [`sandbox_policy::agents::compile`].

use std::path::{Path, PathBuf};

use sandbox_policy::agents::{copy_location, AgentAccess, CompiledProfile, PathKind};
use sandbox_policy::{AgentGrantPath, AgentGrants, GrantReason, PrivateCopy};

use crate::error::HostError;

/// A compiled profile for one run, and where its private copies go.
#[derive(Debug, Clone)]
pub struct AgentRequest {
    pub profile: CompiledProfile,
    /// The real home the profile was compiled against.
    pub home: PathBuf,
    /// `--agent` or `detected from the command name`.
    pub selected_by: String,
    /// The per-project place for private copies (under the user's state dir), created here.
    pub private_dir: PathBuf,
    /// Create the missing writable paths and make the copies (a run); `false` for a dry run
    /// (`policy show`, `sandbox why`), which changes nothing and reports what a run would do.
    pub prepare: bool,
}

/// The per-project directory name for `root` (a task worktree): its last component and a
/// hash of the whole path, so two projects of one name never share private copies.
pub fn project_key(root: &Path) -> String {
    crate::assembly::home::key_of(root)
}

/// What the profile gives the policy.
#[derive(Debug, Clone, Default)]
pub struct Materialized {
    pub read: Vec<(PathBuf, GrantReason)>,
    pub write: Vec<(PathBuf, GrantReason)>,
    pub copies: Vec<PrivateCopy>,
    pub record: Option<AgentGrants>,
}

fn io_error(path: &Path, what: &str, e: std::io::Error) -> HostError {
    HostError::Agent(format!("{what} {}: {e}", path.display()))
}

fn create_dir(path: &Path) -> Result<(), HostError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| io_error(path, "creating", e))
}

/// Creates what is missing, copies what is mixed, and lists the grants. A read-only or copied
/// path that does not exist on the host is granted nothing (there is nothing to protect; in
/// the private view the run may create it in its private home, which the host never reads).
/// `credentials` (the run's, as written) decide which `credential_defaults` apply: such a
/// settings file becomes a private copy with the profile's settings added.
pub fn materialize(
    request: &AgentRequest,
    credentials: &[String],
) -> Result<Materialized, HostError> {
    let mut out = Materialized::default();
    let mut record = Vec::new();
    for entry in &request.profile.paths {
        let exists = entry.path.symlink_metadata().is_ok();
        let defaults = entry.credential_defaults.as_ref().filter(|d| {
            credentials
                .iter()
                .any(|c| sandbox_net::upstream::spec_name(c) == d.when_credential)
        });
        if let Some(defaults) = defaults {
            if let Some(status) = with_defaults(request, entry, defaults, exists, &mut out)? {
                record.push(AgentGrantPath {
                    path: entry.path.clone(),
                    access: entry.access,
                    why: entry.why.clone(),
                    status,
                    audit: entry.audit,
                });
                continue;
            }
        }
        let status = match entry.access {
            AgentAccess::Read if exists => {
                out.read.push((entry.path.clone(), GrantReason::Agent));
                "granted"
            }
            AgentAccess::Read | AgentAccess::Copy if !exists => "missing",
            AgentAccess::Write if !exists && !request.prepare => "would be created",
            AgentAccess::Copy if !request.prepare => {
                // What a backend without a private view would show: the host's file, read-only.
                out.read.push((entry.path.clone(), GrantReason::Agent));
                "would be copied"
            }
            AgentAccess::Write => {
                let status = if exists {
                    "granted"
                } else {
                    match entry.kind {
                        PathKind::Dir => create_dir(&entry.path)?,
                        PathKind::File => {
                            if let Some(parent) = entry.path.parent() {
                                create_dir(parent)?;
                            }
                            create_file(&entry.path)?;
                        }
                    }
                    "created"
                };
                out.write.push((entry.path.clone(), GrantReason::Agent));
                status
            }
            _ => {
                let copy = copy_location(&request.private_dir, &request.home, &entry.path)
                    .ok_or_else(|| {
                        HostError::Agent(format!(
                            "{} is not under the home {}",
                            entry.path.display(),
                            request.home.display()
                        ))
                    })?;
                copy_private(&entry.path, &copy)?;
                out.copies.push(PrivateCopy {
                    path: entry.path.clone(),
                    copy,
                });
                "copied"
            }
        };
        record.push(AgentGrantPath {
            path: entry.path.clone(),
            access: entry.access,
            why: entry.why.clone(),
            status: status.to_string(),
            audit: entry.audit,
        });
    }
    out.record = Some(AgentGrants {
        agent: request.profile.agent.clone(),
        title: request.profile.title.clone(),
        selected_by: request.selected_by.clone(),
        paths: record,
        commands: request.profile.commands.clone(),
        env: request.profile.env.clone(),
        args: request.profile.args.clone(),
    });
    Ok(out)
}

/// The profile's arguments, right after the program's name, when the command is one of the
/// profile's programs (by file name: `/usr/bin/codex` is `codex`): an entry for a credential
/// only in a run with it, `{proxy}` replaced by `proxy` (an entry that needs a proxy the run
/// does not have is left out).
pub fn insert_args(
    agent: &AgentGrants,
    credentials: &[String],
    proxy: Option<&str>,
    spec: &mut sandbox_exec::CommandSpec,
) {
    let name = Path::new(&spec.program)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    if !agent.commands.iter().any(|c| c == name) {
        return;
    }
    let mut added = Vec::new();
    for entry in &agent.args {
        if entry.when_credential.as_ref().is_some_and(|want| {
            !credentials
                .iter()
                .any(|c| sandbox_net::upstream::spec_name(c) == want)
        }) {
            continue;
        }
        let needs_proxy = entry.args.iter().any(|a| a.contains("{proxy}"));
        let Some(at) = proxy.or((!needs_proxy).then_some("")) else {
            continue;
        };
        added.extend(
            entry
                .args
                .iter()
                .map(|a| std::ffi::OsString::from(a.replace("{proxy}", at))),
        );
    }
    spec.args.splice(0..0, added);
}

fn create_file(path: &Path) -> Result<(), HostError> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io_error(path, "creating", e)),
    }
}

/// A settings file under `credential_defaults` that apply: a private copy of the host's file
/// (or of nothing, when it has none) with the profile's settings added where it sets none.
/// `None`: the host's file is not a JSON object (or not a file), so the entry is granted as
/// written and the agent sees the user's file unchanged.
fn with_defaults(
    request: &AgentRequest,
    entry: &sandbox_policy::agents::AgentPath,
    defaults: &sandbox_policy::agents::CredentialDefaults,
    exists: bool,
    out: &mut Materialized,
) -> Result<Option<String>, HostError> {
    let host = if exists {
        if !entry.path.is_file() {
            return Ok(None);
        }
        Some(std::fs::read(&entry.path).map_err(|e| io_error(&entry.path, "reading", e))?)
    } else {
        None
    };
    let Some(bytes) = crate::assembly::settings::with_defaults(host.as_deref(), &defaults.settings)
    else {
        return Ok(None);
    };
    let added = format!(
        "with the settings of --credential {} added where it sets none",
        defaults.when_credential
    );
    if !request.prepare {
        // A dry run: the host's file as it is, read-only, as a backend without a view shows.
        if exists {
            out.read.push((entry.path.clone(), GrantReason::Agent));
        }
        return Ok(Some(format!("would be copied privately, {added}")));
    }
    let copy =
        copy_location(&request.private_dir, &request.home, &entry.path).ok_or_else(|| {
            HostError::Agent(format!(
                "{} is not under the home {}",
                entry.path.display(),
                request.home.display()
            ))
        })?;
    write_private(&copy, &bytes)?;
    out.copies.push(PrivateCopy {
        path: entry.path.clone(),
        copy,
    });
    Ok(Some(format!(
        "{} privately, {added}",
        if exists { "copied" } else { "created" }
    )))
}

/// Copies the host's `from` to `to` afresh (a new file renamed into place, mode 0600): the
/// run starts from the host's current state, and whatever it wrote last time is dropped.
fn copy_private(from: &Path, to: &Path) -> Result<(), HostError> {
    let bytes = std::fs::read(from).map_err(|e| io_error(from, "reading", e))?;
    write_private(to, &bytes)
}

/// Writes `bytes` to `to` as a new file renamed into place, mode 0600.
fn write_private(to: &Path, bytes: &[u8]) -> Result<(), HostError> {
    use std::io::Write as _;
    use std::os::unix::fs::PermissionsExt;
    let dir = to
        .parent()
        .ok_or_else(|| HostError::Agent(format!("{} has no parent", to.display())))?;
    create_dir(dir)?;
    let mut file = tempfile::Builder::new()
        .prefix(".copy.")
        .permissions(std::fs::Permissions::from_mode(0o600))
        .tempfile_in(dir)
        .map_err(|e| io_error(dir, "creating a file in", e))?;
    file.write_all(bytes)
        .map_err(|e| io_error(to, "writing", e))?;
    file.persist(to)
        .map_err(|e| io_error(to, "replacing", e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_policy::agents::{compile, AgentProfile, ProfilePath};

    #[test]
    fn the_profiles_arguments_follow_its_programs_name_credential_ones_only_with_it() {
        use sandbox_policy::agents::ProfileArgs;
        let entry = |args: &[&str], when: Option<&str>| ProfileArgs {
            args: args.iter().map(|a| a.to_string()).collect(),
            when_credential: when.map(Into::into),
            refused: vec![],
            why: "test".into(),
        };
        let agent = AgentGrants {
            agent: "codex".into(),
            title: "Codex".into(),
            selected_by: "--agent".into(),
            paths: vec![],
            commands: vec!["codex".into()],
            env: vec![],
            args: vec![
                entry(&["-c", "a=1"], None),
                entry(&["-c", "url=http://{proxy}/x"], Some("openai")),
            ],
        };
        let armed = |argv: &[&str], credentials: &[String], proxy: Option<&str>| {
            let argv = argv.iter().map(std::ffi::OsString::from).collect();
            let mut spec =
                sandbox_exec::CommandSpec::new(sandbox_exec::CommandRequest::Argv(argv), "/")
                    .unwrap();
            insert_args(&agent, credentials, proxy, &mut spec);
            spec.args
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            armed(&["/opt/bin/codex", "exec", "hi"], &[], None),
            ["-c", "a=1", "exec", "hi"]
        );
        let openai = ["openai".to_string()];
        assert_eq!(
            armed(&["codex", "exec"], &openai, Some("127.0.0.1:61001")),
            ["-c", "a=1", "-c", "url=http://127.0.0.1:61001/x", "exec"]
        );
        // No proxy to name: the entry that needs one is left out.
        assert_eq!(armed(&["codex"], &openai, None), ["-c", "a=1"]);
        // Another program (a shell that runs codex): nothing added.
        assert_eq!(
            armed(&["sh", "-c", "codex"], &openai, None),
            ["-c", "codex"]
        );
    }

    #[test]
    fn writable_paths_are_created_mixed_files_copied_and_missing_ones_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let private = dir.path().join("state/agents/p/x");
        std::fs::create_dir_all(home.join(".x")).unwrap();
        std::fs::write(home.join(".x/settings.json"), "{\"hooks\":1}").unwrap();
        std::fs::write(home.join(".x.json"), "{\"mixed\":1}").unwrap();
        let path = |p: &str, access, kind| ProfilePath {
            path: p.into(),
            access,
            kind,
            audit: None,
            why: "test".into(),
            credential_defaults: None,
        };
        let profile = AgentProfile {
            name: "x".into(),
            title: "X".into(),
            commands: vec![],
            paths: vec![
                path("~/.x/settings.json", AgentAccess::Read, PathKind::File),
                path("~/.x/absent.json", AgentAccess::Read, PathKind::File),
                path("~/.x/sessions", AgentAccess::Write, PathKind::Dir),
                path("~/.x/history.jsonl", AgentAccess::Write, PathKind::File),
                path("~/.x.json", AgentAccess::Copy, PathKind::File),
                path("~/.absent.json", AgentAccess::Copy, PathKind::File),
            ],
            env: vec![],
            args: vec![],
        };
        let request = AgentRequest {
            profile: compile(&profile, &home).unwrap(),
            home: home.clone(),
            selected_by: "--agent".into(),
            private_dir: private.clone(),
            prepare: true,
        };
        // A dry run changes nothing.
        let dry = materialize(
            &AgentRequest {
                prepare: false,
                ..request.clone()
            },
            &[],
        )
        .unwrap();
        assert!(!home.join(".x/sessions").exists() && !private.exists());
        assert!(dry.write.is_empty());
        let out = materialize(&request, &[]).unwrap();
        assert_eq!(
            out.read,
            vec![(home.join(".x/settings.json"), GrantReason::Agent)]
        );
        assert!(home.join(".x/sessions").is_dir());
        assert!(home.join(".x/history.jsonl").is_file());
        assert_eq!(out.write.len(), 2);
        assert_eq!(
            out.copies,
            vec![PrivateCopy {
                path: home.join(".x.json"),
                copy: private.join(".x.json"),
            }]
        );
        assert_eq!(
            std::fs::read_to_string(private.join(".x.json")).unwrap(),
            "{\"mixed\":1}"
        );
        let statuses: Vec<&str> = out
            .record
            .as_ref()
            .unwrap()
            .paths
            .iter()
            .map(|p| p.status.as_str())
            .collect();
        assert_eq!(
            statuses,
            ["granted", "missing", "created", "created", "copied", "missing"]
        );
        // A second start copies the host's file afresh over what the run wrote.
        std::fs::write(private.join(".x.json"), "changed inside").unwrap();
        materialize(&request, &[]).unwrap();
        assert_eq!(
            std::fs::read_to_string(private.join(".x.json")).unwrap(),
            "{\"mixed\":1}"
        );
    }
}
