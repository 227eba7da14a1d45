//! The environment a sandboxed process gets: what a terminal needs, nothing secret by default.
//!
//! Names are passed from the invoking terminal only when listed (exactly, or by a `PREFIX_*`
//! pattern); everything else — API keys, cloud credentials, `SSH_AUTH_SOCK`, `DISPLAY` — stays
//! out unless the user passes it by name.

use std::ffi::{OsStr, OsString};

use serde::{Deserialize, Serialize};

/// Passed by default: enough for shells, compilers and terminal programs to behave.
pub const DEFAULT_PASS: &[&str] = &[
    "PATH",
    "HOME",
    "SHELL",
    "USER",
    "LOGNAME",
    "TERM",
    "COLORTERM",
    "TERM_PROGRAM",
    "TERM_PROGRAM_VERSION",
    "NO_COLOR",
    "FORCE_COLOR",
    "CLICOLOR",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "EDITOR",
    "VISUAL",
    "PAGER",
    // A commit identity is not a secret, and git run inside reads nothing else to get one.
    "GIT_AUTHOR_NAME",
    "GIT_AUTHOR_EMAIL",
    "GIT_COMMITTER_NAME",
    "GIT_COMMITTER_EMAIL",
];

/// Never passed, even when a pattern would match: they hand out host access.
pub const NEVER_PASS: &[&str] = &["SANDBOX_HOST_TOKEN"];

/// Which variables enter the sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvPolicy {
    /// Names (or `PREFIX_*` patterns) passed from the invoking environment, in addition to
    /// [`DEFAULT_PASS`].
    pub pass: Vec<String>,
    /// Variables set explicitly; they win over passed ones.
    pub set: Vec<(String, String)>,
}

fn matches(pattern: &str, name: &OsStr) -> bool {
    let name = name.as_encoded_bytes();
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix.as_bytes()),
        None => name == pattern.as_bytes(),
    }
}

impl EnvPolicy {
    /// Adds a `--env NAME` (pass) or `--env NAME=VALUE` (set) argument.
    pub fn add_arg(&mut self, arg: &str) -> Result<(), EnvNameError> {
        match arg.split_once('=') {
            Some((name, value)) => {
                check_name(name)?;
                self.set.retain(|(n, _)| n != name);
                self.set.push((name.to_string(), value.to_string()));
            }
            None => {
                check_name(arg)?;
                self.pass.push(arg.to_string());
            }
        }
        Ok(())
    }

    /// Sets a variable, replacing an earlier value.
    pub fn set_var(&mut self, name: &str, value: impl Into<String>) {
        self.set.retain(|(n, _)| n != name);
        self.set.push((name.to_string(), value.into()));
    }

    /// Computes the child's environment from the invoking one. Pure: the caller passes in
    /// `std::env::vars_os()` (or a test's map).
    pub fn resolve<I>(&self, parent: I) -> Vec<(OsString, OsString)>
    where
        I: IntoIterator<Item = (OsString, OsString)>,
    {
        let mut out: Vec<(OsString, OsString)> = parent
            .into_iter()
            .filter(|(name, _)| {
                !NEVER_PASS.iter().any(|p| matches(p, name))
                    && DEFAULT_PASS
                        .iter()
                        .copied()
                        .chain(self.pass.iter().map(String::as_str))
                        .any(|p| matches(p, name))
            })
            .collect();
        for (name, value) in &self.set {
            out.retain(|(n, _)| n != name.as_str());
            out.push((name.into(), value.into()));
        }
        out.sort();
        out
    }
}

/// A name that cannot be an environment variable (or a pass pattern).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{name:?} is not an environment variable name (letters, digits, _; a trailing * passes \
     every name with that prefix)"
)]
pub struct EnvNameError {
    pub name: String,
}

fn check_name(name: &str) -> Result<(), EnvNameError> {
    let valid = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().enumerate().all(|(i, c)| {
            c.is_ascii_alphanumeric() || c == '_' || (c == '*' && i == name.len() - 1)
        });
    if valid {
        Ok(())
    } else {
        Err(EnvNameError {
            name: name.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parent() -> Vec<(OsString, OsString)> {
        [
            ("PATH", "/usr/bin"),
            ("HOME", "/home/u"),
            ("LC_ALL", "C.UTF-8"),
            ("ANTHROPIC_API_KEY", "sk-secret"),
            ("AWS_SECRET_ACCESS_KEY", "aws"),
            ("SSH_AUTH_SOCK", "/run/ssh"),
            ("DISPLAY", ":0"),
            ("CARGO_HOME", "/home/u/.cargo"),
            ("SANDBOX_HOST_TOKEN", "host"),
        ]
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect()
    }

    fn names(env: &[(OsString, OsString)]) -> Vec<String> {
        env.iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn secrets_stay_out_by_default() {
        let env = EnvPolicy::default().resolve(parent());
        assert_eq!(names(&env), vec!["HOME", "LC_ALL", "PATH"]);
    }

    #[test]
    fn pass_set_and_patterns() {
        let mut p = EnvPolicy::default();
        p.add_arg("CARGO_*").unwrap();
        p.add_arg("ANTHROPIC_API_KEY").unwrap();
        p.add_arg("FOO=bar=baz").unwrap();
        p.add_arg("PATH=/only").unwrap();
        p.add_arg("SANDBOX_*").unwrap();
        let env = p.resolve(parent());
        assert_eq!(
            names(&env),
            vec![
                "ANTHROPIC_API_KEY",
                "CARGO_HOME",
                "FOO",
                "HOME",
                "LC_ALL",
                "PATH"
            ]
        );
        let get = |n: &str| env.iter().find(|(k, _)| k == n).unwrap().1.clone();
        assert_eq!(get("FOO"), "bar=baz");
        assert_eq!(get("PATH"), "/only");
    }

    #[test]
    fn bad_names_are_refused() {
        let mut p = EnvPolicy::default();
        assert!(p.add_arg("").is_err());
        assert!(p.add_arg("1ABC").is_err());
        assert!(p.add_arg("A-B").is_err());
        assert!(p.add_arg("A*B").is_err());
        assert!(p.add_arg("=x").is_err());
    }
}
