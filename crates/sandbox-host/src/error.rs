//! Why a backend could not set up its boundary. Every one of these ends the run with exit 125
//! before the command starts.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum HostError {
    #[error(transparent)]
    Policy(#[from] sandbox_policy::PolicyError),

    /// The command itself cannot run (not found: 127, not executable: 126), found while a
    /// backend prepared it.
    #[error(transparent)]
    Command(#[from] sandbox_exec::ExecError),

    #[error("{backend}: {message}")]
    Unavailable {
        backend: &'static str,
        message: String,
    },

    /// The kernel cannot enforce part of the policy and the user did not accept that.
    #[error(
        "{backend}: this kernel cannot enforce: {}. Nothing was run. Pass --allow-degraded to \
         run with what it can enforce (see `sandbox doctor`).",
        .gaps.join("; ")
    )]
    Degraded {
        backend: &'static str,
        gaps: Vec<String>,
    },

    #[error("{backend}: {context}: {source}")]
    Io {
        backend: &'static str,
        context: String,
        #[source]
        source: std::io::Error,
    },

    #[error("{backend}: {0}", backend = "native")]
    Seccomp(String),
}
