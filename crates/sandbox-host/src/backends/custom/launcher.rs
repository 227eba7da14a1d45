//! The custom backend: `<launcher> [args] -- <command> [args]`, where the launcher — a
//! reviewed program of the user's — owns the boundary and this product grants nothing itself.
//!
//! * The launcher's argv is exactly the configured command (`backends.custom.command`, from
//!   the user or system configuration only), split with shell-style quoting: nothing is
//!   expanded and nothing is added except `--` and the command. The program that runs is the
//!   resolved, checked file (its absolute path is `argv[0]`).
//! * It runs in the task's working directory with the same terminal environment every backend
//!   passes, plus advisory `SANDBOX_HINT_*` variables computed from the policy
//!   ([`sandbox_policy::compile::hints`]).
//! * Where it may live: an absolute path, or a bare name found on an all-absolute `PATH`;
//!   never a relative path, and never anywhere the sandbox could write — the worktree, the
//!   spawn directory, any writable grant — checked after resolving every symlink
//!   ([`crate::backends::placement`]). The configuration file that names it must not be writable by the
//!   sandbox either, and neither may any file its arguments name (an interpreter's script).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use sandbox_exec::CommandSpec;
use sandbox_policy::compile::hints;
use sandbox_policy::Policy;

use crate::backends::placement::{self, PlacementError};
use crate::error::HostError;
use crate::report::Enforcement;
pub use crate::seam::LauncherConfig;

/// A launcher that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launcher {
    /// The file that will be executed (absolute, symlinks resolved).
    pub path: PathBuf,
    /// The configured arguments after the program name, exactly.
    pub args: Vec<String>,
    /// The configured program name (for messages).
    pub configured: String,
}

const WHAT_TO_DO: &str = "Install the launcher from a reviewed checkout to a place the \
     sandbox cannot write (e.g. ~/.local/bin) and point the setting at its absolute path: \
     `sandbox config set backends.custom.command '/home/you/.local/bin/launcher --its-args'`";

fn refuse(message: String) -> HostError {
    HostError::Unavailable {
        backend: "custom",
        message,
    }
}

/// Splits the configured command with shell-style quoting. Nothing is expanded.
pub fn split(command: &str) -> Result<Vec<String>, HostError> {
    let argv = shlex::split(command).ok_or_else(|| {
        refuse(format!(
            "backends.custom.command {command:?} cannot be split: unbalanced quotes or a \
             trailing backslash. Fix it with `sandbox config set backends.custom.command …`"
        ))
    })?;
    if argv.is_empty() || argv[0].is_empty() {
        return Err(refuse(
            "backends.custom.command is empty; set it to the launcher's absolute path and \
             arguments"
                .into(),
        ));
    }
    Ok(argv)
}

/// Finds the launcher file: an absolute path as is, a bare name on `path_var` (which must
/// hold only absolute directories). A relative path is refused.
fn find(program: &str, path_var: Option<&OsStr>) -> Result<PathBuf, HostError> {
    if program.contains('/') {
        if !program.starts_with('/') {
            return Err(refuse(format!(
                "the launcher {program:?} is a relative path, which would be looked up from \
                 the task's working directory — a place the sandboxed agent can write. {WHAT_TO_DO}"
            )));
        }
        return Ok(PathBuf::from(program));
    }
    let path_var = path_var.unwrap_or_default();
    if path_var.is_empty() {
        return Err(refuse(format!(
            "the launcher {program:?} is a bare name, but PATH is empty. Configure it by its \
             absolute path. {WHAT_TO_DO}"
        )));
    }
    let dirs: Vec<PathBuf> = std::env::split_paths(path_var).collect();
    if let Some(bad) = dirs.iter().find(|d| !d.is_absolute()) {
        return Err(refuse(format!(
            "the launcher {program:?} is a bare name, but PATH contains the relative entry \
             {:?}, which is resolved from the task's working directory (a place the sandboxed \
             agent can write). Remove relative entries from PATH, or configure the launcher \
             by its absolute path: `sandbox config set backends.custom.command \
             '/abs/path/{program} …'`",
            bad.display().to_string()
        )));
    }
    for dir in &dirs {
        let candidate = dir.join(program);
        if std::fs::metadata(&candidate).is_ok_and(|m| m.is_file()) {
            return Ok(candidate);
        }
    }
    Err(refuse(format!(
        "the launcher {program:?} was not found on PATH ({}). {WHAT_TO_DO}",
        path_var.to_string_lossy()
    )))
}

/// Checks the configuration and the launcher's location for this policy.
pub fn locate(
    config: Option<&LauncherConfig>,
    policy: &Policy,
    spawn_dir: &Path,
    path_var: Option<&OsStr>,
) -> Result<Launcher, HostError> {
    let Some(config) = config else {
        return Err(refuse(format!(
            "no launcher is configured. Set backends.custom.command in your configuration \
             (never in the worktree). {WHAT_TO_DO}"
        )));
    };
    if let Some(source) = &config.source {
        let source = std::fs::canonicalize(source).unwrap_or_else(|_| source.clone());
        if source.starts_with(&policy.workspace.root) || policy.is_writable(&source) {
            return Err(refuse(format!(
                "backends.custom.command comes from {}, a file the sandbox can write: a \
                 sandboxed agent could change the launcher of its next spawn. Keep the \
                 configuration in $XDG_CONFIG_HOME/sandbox or /etc/sandbox, outside every grant",
                source.display()
            )));
        }
    }
    let argv = split(&config.command)?;
    let found = find(&argv[0], path_var)?;
    let path = match placement::check(&found, policy, spawn_dir) {
        Ok(p) => p,
        Err(PlacementError::Refused(r)) => {
            let via = if r.place == found {
                String::new()
            } else {
                format!(" (through {})", r.place.display())
            };
            return Err(refuse(format!(
                "refusing the launcher {}{via}: it is {}, where the sandboxed agent can write, \
                 and a launcher it can edit is one it can turn off. {WHAT_TO_DO}",
                found.display(),
                r.why
            )));
        }
        Err(PlacementError::Unresolvable { path, cause }) => {
            return Err(refuse(format!(
                "the launcher {} cannot be used: {cause}. {WHAT_TO_DO}",
                path.display()
            )))
        }
    };
    if let Err(errno) = nix::unistd::access(&path, nix::unistd::AccessFlags::X_OK) {
        return Err(refuse(format!(
            "the launcher {} is not executable ({}); `chmod +x` it",
            path.display(),
            errno.desc()
        )));
    }
    let mut args = argv;
    let configured = args.remove(0);
    check_arguments(&args, policy, spawn_dir)?;
    Ok(Launcher {
        path,
        args,
        configured,
    })
}

/// Refuses launcher arguments that name a *file* the sandbox can write: the script an
/// interpreter launcher runs (`/bin/sh launch.sh`), a profile the launcher reads
/// (`--profile=./strict.toml`). Such a file gives the agent the same control as the launcher
/// program itself. Directories pass, so `bwrap --bind <worktree> <worktree>` still works.
/// A relative argument is judged from the spawn directory, where the launcher starts.
fn check_arguments(args: &[String], policy: &Policy, spawn_dir: &Path) -> Result<(), HostError> {
    for arg in args {
        // `--opt=VALUE` names VALUE.
        let value = arg
            .strip_prefix('-')
            .and_then(|rest| rest.split_once('='))
            .map(|(_, v)| v);
        for named in std::iter::once(arg.as_str()).chain(value) {
            if named.is_empty() {
                continue;
            }
            let path = spawn_dir.join(named);
            if !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                continue;
            }
            if let Err(PlacementError::Refused(r)) = placement::check(&path, policy, spawn_dir) {
                return Err(refuse(format!(
                    "refusing the launcher argument {arg:?}: it names the file {}, which is {}; a \
                     launcher that runs or reads a file the sandboxed agent can edit is one the \
                     agent controls. Keep the scripts and profiles it uses outside the worktree \
                     and every writable grant, and configure them by absolute path: `sandbox \
                     config set backends.custom.command '/bin/sh /opt/team/launch.sh'`",
                    path.display(),
                    r.why
                )));
            }
        }
    }
    Ok(())
}

/// What the custom backend enforces: whatever the launcher does.
pub fn enforcement(launcher: &Launcher) -> Enforcement {
    Enforcement {
        mechanism: "launcher".into(),
        enforced: vec![
            format!(
                "whatever {} enforces: the launcher owns the boundary; sandbox grants nothing \
                 itself and exports the policy as SANDBOX_HINT_* variables",
                launcher.path.display()
            ),
            "host side: the launcher's location is checked (outside the worktree, the spawn \
             directory and every writable grant), environment filtering, own session, \
             process-group cleanup, git pointer check after the run"
                .into(),
        ],
        notes: vec![format!(
            "runs `{} {}{}-- <command>`",
            launcher.path.display(),
            launcher.args.join(" "),
            if launcher.args.is_empty() { "" } else { " " }
        )],
        ..Enforcement::default()
    }
}

/// Rewrites `spec` to run through the launcher, with the hint variables added.
pub fn wrap(policy: &Policy, spec: &CommandSpec, launcher: &Launcher) -> CommandSpec {
    let mut wrapped = spec.clone();
    wrapped.program = launcher.path.clone().into_os_string();
    let mut args: Vec<OsString> = launcher.args.iter().map(OsString::from).collect();
    args.push("--".into());
    args.push(spec.program.clone());
    args.extend(spec.args.iter().cloned());
    wrapped.args = args;
    // Hints come from the policy only: any SANDBOX_HINT_* passed in from outside is dropped.
    wrapped.env.retain(|(name, _)| {
        !name
            .as_encoded_bytes()
            .starts_with(hints::PREFIX.as_bytes())
    });
    for (name, value) in hints::compile(policy) {
        wrapped.set_env(name, value);
    }
    wrapped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_quoting_and_expands_nothing() {
        assert_eq!(
            split("/usr/bin/bwrap --bind '/a b' \"$HOME\" ~ *").unwrap(),
            vec!["/usr/bin/bwrap", "--bind", "/a b", "$HOME", "~", "*"]
        );
        assert!(split("/x 'unbalanced").is_err());
        assert!(split("   ").is_err());
    }

    #[test]
    fn relative_paths_and_relative_path_entries_are_refused() {
        let err = find("bin/launch", None).unwrap_err().to_string();
        assert!(err.contains("relative path"), "{err}");
        let err = find("launch", Some(OsStr::new("/usr/bin:.")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("relative entry"), "{err}");
        let err = find("launch", Some(OsStr::new("/usr/bin::/bin")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("relative entry"), "{err}");
        assert_eq!(
            find("/abs/launch", Some(OsStr::new("."))).unwrap(),
            PathBuf::from("/abs/launch")
        );
    }

    #[test]
    fn arguments_naming_writable_files_are_refused_directories_pass() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let task = base.join("task");
        let safe = base.join("opt");
        std::fs::create_dir_all(task.join("scripts")).unwrap();
        std::fs::create_dir_all(&safe).unwrap();
        for f in [
            task.join("launch.sh"),
            task.join("scripts/p.toml"),
            safe.join("ok.sh"),
        ] {
            std::fs::write(f, "#!/bin/sh\n").unwrap();
        }
        std::os::unix::fs::symlink(task.join("launch.sh"), safe.join("alias.sh")).unwrap();
        let policy = sandbox_policy::build(sandbox_policy::PolicyRequest {
            workdir: task.clone(),
            ..Default::default()
        })
        .unwrap();
        let check = |args: &[&str]| {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            check_arguments(&args, &policy, &task)
        };
        // A script in the worktree, by relative name, relative path or absolute path; a
        // profile behind --opt=; a symlink outside that points in.
        for bad in [
            vec!["launch.sh"],
            vec!["./launch.sh"],
            vec![task.join("launch.sh").to_str().unwrap()],
            vec!["--profile=scripts/p.toml"],
            vec![safe.join("alias.sh").to_str().unwrap()],
        ] {
            let err = check(&bad).unwrap_err().to_string();
            assert!(
                err.contains("refusing the launcher argument"),
                "{bad:?}: {err}"
            );
        }
        // Directories (bind mounts), files outside, words that are not files.
        let t = task.to_str().unwrap();
        let ok = safe.join("ok.sh");
        check(&["--bind", t, t, "--ro-bind", "/usr", "/usr"]).unwrap();
        check(&[ok.to_str().unwrap(), "--profile", "strict", "--x=", "-"]).unwrap();
    }

    #[test]
    fn wrap_appends_only_the_separator_and_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let policy = sandbox_policy::build(sandbox_policy::PolicyRequest {
            workdir: dir.path().into(),
            ..Default::default()
        })
        .unwrap();
        let mut spec = CommandSpec::argv(["sh", "-c", "echo $HOME"], dir.path()).unwrap();
        spec.set_env("PATH", "/usr/bin");
        spec.set_env("SANDBOX_HINT_WORKTREE", "/forged");
        let launcher = Launcher {
            path: "/opt/l/launch".into(),
            args: vec!["--flag".into(), "a b".into()],
            configured: "launch".into(),
        };
        let w = wrap(&policy, &spec, &launcher);
        assert_eq!(w.program, "/opt/l/launch");
        assert_eq!(
            w.args,
            vec!["--flag", "a b", "--", "sh", "-c", "echo $HOME"]
        );
        assert_eq!(w.cwd, spec.cwd);
        assert_eq!(w.env_var("PATH").unwrap(), "/usr/bin");
        assert_eq!(
            w.env_var("SANDBOX_HINT_WORKTREE").unwrap(),
            policy.workspace.root.as_os_str()
        );
        assert!(w.env_var("SANDBOX_HINT_WRITE_PATHS").is_some());
    }
}
