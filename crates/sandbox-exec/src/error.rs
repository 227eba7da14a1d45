//! Typed errors of the exec layer. Every variant names the program (or path) and the cause,
//! because the CLI prints them as the one line a user sees.

use std::path::PathBuf;

use thiserror::Error;

/// Why a command could not be run, or how it ended abnormally.
#[derive(Debug, Error)]
pub enum ExecError {
    /// The request itself is malformed (empty argv, NUL byte, …). Never retried through a shell.
    #[error("invalid command request: {0}")]
    InvalidRequest(String),

    /// The admission policy refused the request before anything was spawned.
    #[error("refused by {policy}: {reason}")]
    Denied {
        policy: &'static str,
        reason: String,
    },

    /// No such program on the child's `PATH` (or at the given path).
    #[error("{program}: command not found{}", searched_hint(.searched))]
    NotFound {
        program: String,
        searched: Option<String>,
    },

    /// The program is on the host's `PATH` but not in the sandbox's view of it; `hint` says
    /// which toolchain or grant would make it visible.
    #[error("{program}: command not found in the sandbox: {hint}")]
    NotInSandbox { program: String, hint: String },

    /// The program exists but cannot be executed (mode bits, noexec mount, wrong format, or the
    /// sandbox denied execution).
    #[error("{program}: cannot execute: {cause}")]
    NotExecutable { program: String, cause: String },

    /// The working directory or another path could not be used.
    #[error("{path}: {cause}", path = .path.display())]
    Permission { path: PathBuf, cause: String },

    /// The child's pre-exec setup (Landlock, seccomp, session) failed: the command never ran.
    #[error(
        "sandbox setup failed in the child before exec of {program}: {setup}: {step}{}: {}",
        .what.as_ref().map(|w| format!(" ({w})")).unwrap_or_default(),
        std::io::Error::from_raw_os_error(*.errno)
    )]
    Setup {
        program: String,
        /// The [`crate::ChildSetup`] that ran ("landlock+seccomp").
        setup: String,
        step: crate::setup::SetupStep,
        /// Which item of the step failed, as the setup describes it (a mount of the view).
        what: Option<String>,
        errno: i32,
    },

    /// `fork`/`exec` failed for another reason.
    #[error("failed to spawn {program}: {cause}")]
    Spawn { program: String, cause: String },

    /// A PTY or pipe operation failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl ExecError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        ExecError::Io {
            context: context.into(),
            source,
        }
    }

    /// The conventional exit status for this error (docs/architecture.md, the exit rule).
    pub fn exit_code(&self) -> i32 {
        crate::status::Outcome::not_started(self).status().code
    }

    /// Why the command could not start, as the exit rule tells the cases apart.
    pub fn unstartable(&self) -> crate::status::Unstartable {
        use crate::status::Unstartable;
        match self {
            ExecError::NotFound { .. } | ExecError::NotInSandbox { .. } => Unstartable::NotFound,
            ExecError::NotExecutable { .. } => Unstartable::NotExecutable,
            ExecError::InvalidRequest(_)
            | ExecError::Denied { .. }
            | ExecError::Permission { .. }
            | ExecError::Setup { .. }
            | ExecError::Spawn { .. }
            | ExecError::Io { .. } => Unstartable::Failed,
        }
    }
}

fn searched_hint(searched: &Option<String>) -> String {
    match searched {
        Some(path) if !path.is_empty() => format!(" (searched PATH={path})"),
        Some(_) => " (PATH is empty)".to_string(),
        None => String::new(),
    }
}

/// The conventional name of a signal number, for messages.
pub fn signal_name(signal: i32) -> &'static str {
    nix::sys::signal::Signal::try_from(signal)
        .map(|s| s.as_str())
        .unwrap_or("unknown signal")
}
