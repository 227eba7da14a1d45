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

    /// `source` stopped a run before its command ran (125). The typed error stays in the
    /// chain as the source (`downcast_ref` finds it); its message is printed once.
    pub fn setup_caused(source: impl std::error::Error + Send + Sync + 'static) -> anyhow::Error {
        Failure::setup_chain(anyhow::Error::from(source))
    }

    /// [`Failure::setup_caused`] for an error chain that is already an [`anyhow::Error`].
    pub fn setup_chain(source: anyhow::Error) -> anyhow::Error {
        let message = source.to_string();
        source.context(Failure { code: 125, message })
    }
}

/// The exit status for an error: the first typed error in the chain decides (a
/// [`Failure`]'s own code, a backend's [`HostError::exit_code`], a command's
/// [`ExecError`]); otherwise `default` (125 for commands that run something, 1 for the rest).
pub fn code_for(err: &anyhow::Error, default: i32) -> i32 {
    // A `Failure` attached as context (`Failure::setup_chain`) is found on the error itself,
    // not among the chain's causes.
    if let Some(f) = err.downcast_ref::<Failure>() {
        return f.code;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_come_from_the_types_in_the_chain() {
        // A backend's failure: 125, with the backend's own error still reachable.
        let io = std::io::Error::other("no space");
        let host = HostError::ManifestWrite {
            path: "/x".into(),
            source: io,
        };
        let err = anyhow::Error::from(host).context("preparing");
        assert_eq!(code_for(&err, 1), 125);
        assert!(err
            .chain()
            .any(|c| c.downcast_ref::<std::io::Error>().is_some()));
        // The command itself cannot run: its own 127, through the backend's error.
        let missing = ExecError::NotFound {
            program: "nope".into(),
            searched: None,
        };
        let err = anyhow::Error::from(HostError::Command(missing));
        assert_eq!(code_for(&err, 1), 127);
        // A typed CLI error kept as the source of a setup failure.
        let err = Failure::setup_caused(std::io::Error::other("probe"));
        assert_eq!(code_for(&err, 0), 125);
        assert!(err
            .chain()
            .any(|c| c.downcast_ref::<std::io::Error>().is_some()));
        // Nothing typed: the caller's default.
        assert_eq!(code_for(&anyhow::anyhow!("plain"), 1), 1);
    }
}
