//! Mapping failures to exit statuses (README.md, "Exit codes"; the rule itself is
//! `sandbox_host::run::Outcome::status`) and printing them as one clear line.

use sandbox_exec::ExecError;
use sandbox_host::HostError;
use sandbox_host::Outcome;

/// An error that carries the exit status it must produce.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    pub code: i32,
    pub message: String,
}

impl Failure {
    /// The sandbox could not be set up: nothing ran (125).
    pub fn setup(message: impl Into<String>) -> anyhow::Error {
        Failure {
            code: 125,
            message: message.into(),
        }
        .into()
    }
}

/// The exit status for an error: the first typed error in the chain decides (a
/// [`Failure`]'s own code, a backend's [`HostError::exit_code`], a command's
/// [`ExecError`]); otherwise `default` (125 for commands that run something, 1 for the rest).
pub fn code_for(err: &anyhow::Error, default: i32) -> i32 {
    for cause in err.chain() {
        if let Some(f) = cause.downcast_ref::<Failure>() {
            return f.code;
        }
        if let Some(e) = cause.downcast_ref::<HostError>() {
            return e.exit_code();
        }
        if let Some(e) = cause.downcast_ref::<ExecError>() {
            return Outcome::not_started(e).status().code;
        }
    }
    default
}

/// True when the error is a write to a pipe whose reader has gone.
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Prints `sandbox: <error>: <cause>…` on one line.
pub fn report(err: &anyhow::Error) {
    let mut line = String::from("sandbox: ");
    let mut first = true;
    for cause in err.chain() {
        let text = cause.to_string();
        // Skip causes already contained in the previous message (thiserror's #[source]).
        if !first {
            if line.contains(&text) {
                continue;
            }
            line.push_str(": ");
        }
        line.push_str(&text);
        first = false;
    }
    eprintln!("{line}");
}

/// `text` in red when stderr is a terminal and `NO_COLOR` is not set (https://no-color.org).
pub fn red_on_terminal(text: &str) -> String {
    use std::io::IsTerminal as _;
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    if std::io::stderr().is_terminal() && !no_color {
        format!("\x1b[31m{text}\x1b[0m")
    } else {
        text.to_string()
    }
}
