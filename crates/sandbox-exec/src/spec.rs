//! What to run: an argv kept as an argv, a working directory, an exact environment.
//!
//! There is no shell reconstruction anywhere in this crate. A shell runs only when the caller
//! builds the request with [`CommandRequest::Shell`], which becomes `/bin/sh -c SCRIPT`; a
//! malformed argv is an error, never a reason to try a shell instead.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::ExecError;

/// The two shapes a caller may ask for. Keeping them apart is the point: an argv with spaces
/// or quotes in it is run exactly as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandRequest {
    /// Run `argv[0]` with `argv[1..]`, byte for byte.
    Argv(Vec<OsString>),
    /// Run `script` with `/bin/sh -c`, explicitly.
    Shell { script: String },
}

impl CommandRequest {
    /// Turns the request into the argv that will be executed, validating it.
    pub fn into_argv(self) -> Result<Vec<OsString>, ExecError> {
        let argv = match self {
            CommandRequest::Argv(argv) => argv,
            CommandRequest::Shell { script } => {
                if script.trim().is_empty() {
                    return Err(ExecError::InvalidRequest(
                        "a shell request needs a non-empty script".into(),
                    ));
                }
                vec!["/bin/sh".into(), "-c".into(), script.into()]
            }
        };
        validate_argv(&argv)?;
        Ok(argv)
    }
}

fn validate_argv(argv: &[OsString]) -> Result<(), ExecError> {
    let Some(program) = argv.first() else {
        return Err(ExecError::InvalidRequest(
            "empty argv: nothing to run".into(),
        ));
    };
    if program.is_empty() {
        return Err(ExecError::InvalidRequest(
            "the program name is empty".into(),
        ));
    }
    if let Some(i) = argv.iter().position(|a| a.as_bytes().contains(&0)) {
        return Err(ExecError::InvalidRequest(format!(
            "argument {i} contains a NUL byte, which no program can receive"
        )));
    }
    Ok(())
}

/// A fully resolved request: what runs, where, with which environment and deadline.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    /// `argv[0]` as the caller gave it (a bare name is looked up on the child's `PATH`).
    pub program: OsString,
    pub args: Vec<OsString>,
    pub cwd: PathBuf,
    /// The child's whole environment. Nothing is inherited implicitly.
    pub env: Vec<(OsString, OsString)>,
    /// Wall-clock limit for the whole run, output draining included.
    pub timeout: Option<Duration>,
}

impl CommandSpec {
    /// Builds a spec from a request; the environment starts empty.
    pub fn new(request: CommandRequest, cwd: impl Into<PathBuf>) -> Result<Self, ExecError> {
        let mut argv = request.into_argv()?.into_iter();
        let program = argv
            .next()
            .ok_or_else(|| ExecError::InvalidRequest("empty argv: nothing to run".into()))?;
        Ok(CommandSpec {
            program,
            args: argv.collect(),
            cwd: cwd.into(),
            env: Vec::new(),
            timeout: None,
        })
    }

    /// Shorthand for an argv request.
    pub fn argv<I, S>(argv: I, cwd: impl Into<PathBuf>) -> Result<Self, ExecError>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        Self::new(
            CommandRequest::Argv(argv.into_iter().map(Into::into).collect()),
            cwd,
        )
    }

    /// Sets (or replaces) one environment variable.
    pub fn set_env(&mut self, name: impl Into<OsString>, value: impl Into<OsString>) {
        let name = name.into();
        let value = value.into();
        match self.env.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => self.env.push((name, value)),
        }
    }

    /// Looks up a variable in the child's environment.
    pub fn env_var(&self, name: &str) -> Option<&OsStr> {
        self.env
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_os_str())
    }

    /// The program name for messages.
    pub fn display_program(&self) -> String {
        self.program.to_string_lossy().into_owned()
    }

    pub fn with_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_is_kept_verbatim() {
        let spec = CommandSpec::argv(["echo", "a b", "'c'", "$HOME", ";rm"], "/").unwrap();
        assert_eq!(spec.program, "echo");
        assert_eq!(spec.args, vec!["a b", "'c'", "$HOME", ";rm"]);
    }

    #[test]
    fn empty_argv_is_refused_not_shelled() {
        let err = CommandRequest::Argv(vec![]).into_argv().unwrap_err();
        assert!(matches!(err, ExecError::InvalidRequest(_)), "{err}");
        let err = CommandRequest::Argv(vec!["".into()])
            .into_argv()
            .unwrap_err();
        assert!(matches!(err, ExecError::InvalidRequest(_)), "{err}");
    }

    #[test]
    fn nul_bytes_are_refused() {
        let arg = OsString::from_vec(b"a\0b".to_vec());
        let err = CommandRequest::Argv(vec!["echo".into(), arg])
            .into_argv()
            .unwrap_err();
        assert!(err.to_string().contains("argument 1"), "{err}");
    }

    #[test]
    fn shell_is_explicit() {
        let argv = CommandRequest::Shell {
            script: "echo hi | wc -c".into(),
        }
        .into_argv()
        .unwrap();
        assert_eq!(argv, vec!["/bin/sh", "-c", "echo hi | wc -c"]);
        assert!(CommandRequest::Shell {
            script: "  ".into()
        }
        .into_argv()
        .is_err());
    }

    #[test]
    fn set_env_replaces() {
        let mut spec = CommandSpec::argv(["true"], "/").unwrap();
        spec.set_env("A", "1");
        spec.set_env("A", "2");
        assert_eq!(spec.env.len(), 1);
        assert_eq!(spec.env_var("A").unwrap(), "2");
    }

    use std::os::unix::ffi::OsStringExt;
}
