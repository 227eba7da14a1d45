//! Why a backend could not set up its boundary. Every one of these ends the run with exit 125
//! before the command starts (except [`HostError::Command`], the command's own 126/127). Each
//! names the step that failed, with its path or errno, and what to do.

use std::path::PathBuf;

use thiserror::Error;

use crate::kind::BackendKind;

#[derive(Debug, Error)]
pub enum HostError {
    #[error(transparent)]
    Policy(#[from] sandbox_policy::PolicyError),

    /// A resource limit that was asked for cannot be enforced on this machine (fail closed).
    #[error("{backend}: resource limits: {}", .missing.join("; "))]
    LimitsUnenforceable {
        backend: BackendKind,
        missing: Vec<String>,
    },

    /// The run's cgroup could not be created or set.
    #[error("resource limits: {what} {path}: {source}", path = .path.display())]
    Cgroup {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The private home (or its toolchains, cache layers) could not be set up.
    #[error("private home {path}: {cause}", path = .path.display())]
    Home { path: PathBuf, cause: String },

    /// The command itself cannot run (not found: 127, not executable: 126), found while a
    /// backend prepared it.
    #[error(transparent)]
    Command(#[from] sandbox_exec::ExecError),

    #[error(
        "unknown backend {name:?}; known: native ({native}), host, nono, custom, lima, boxlite"
    )]
    UnknownBackend { name: String, native: &'static str },

    #[error("native: {name} is not this platform's mechanism; use `native` (here: {here})")]
    WrongPlatform { name: String, here: &'static str },

    #[error(
        "{backend}: this build does not include the {backend} backend: build with the cargo \
         feature `{backend}` (`cargo build -p sandbox-cli --features {backend}`, see \
         docs/boxlite.md) or use the flake's package that has it; `sandbox doctor` lists the \
         backends this build has"
    )]
    NotInBuild { backend: BackendKind },

    /// The backend is in this build, but its commands run in the daemon, not in this
    /// process (BoxLite: one runtime per home, owned by the daemon).
    #[error(
        "{backend}: microVM boxes belong to the sandbox daemon (one BoxLite runtime per home): \
         use `sandbox exec --backend {backend}` or the protocol's box.create; `sandbox run` and \
         `sandbox shell` run in process and start no VM"
    )]
    RunsInDaemon { backend: BackendKind },

    /// A command was armed on the host for a box whose commands run in its guest.
    #[error("{backend}: commands of a box run in its VM, through box.exec")]
    RunsInGuest { backend: BackendKind },

    /// A command's guest lost it (the VM or its agent went away): the box failed.
    #[error("{backend}: the command was lost: {cause}")]
    GuestLost { backend: BackendKind, cause: String },

    /// A backend implemented in its own crate (Lima) failed; its error names the step and
    /// the log to read, and stays reachable as the source (`downcast_ref::<LimaError>()`).
    #[error("{source}")]
    Backend {
        backend: BackendKind,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    #[error(
        "{backend}: cannot enforce a domain allow-list ({}); the native backend (its network \
         namespace and proxy) and nono (its proxy) filter by domain (--backend native)",
        .domains.join(", ")
    )]
    DomainsNeedNono {
        backend: BackendKind,
        domains: Vec<String>,
    },

    #[error(
        "host: the host backend enforces nothing, so it cannot block the network; use \
         --backend native"
    )]
    HostCannotBlockNetwork,

    /// The run's network namespace, its relay or its proxy could not be set up.
    #[error("native: network namespace: {message}")]
    Network { message: String },

    #[error("native: no native sandbox on this operating system; use --backend nono or custom")]
    NoNativeSandbox,

    /// A backend's external program or configuration is missing or refused (nono not found or
    /// too old, a launcher in a writable place); the message says which and what to do.
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

    /// Building the Landlock ruleset failed (creating it, adding a path rule).
    #[error("native: building the Landlock ruleset: {step}: {cause}")]
    LandlockRuleset { step: String, cause: String },

    /// Compiling the seccomp program failed.
    #[error("native: compiling the seccomp filter: {0}")]
    SeccompCompile(String),

    /// The private directory for backend files could not be made or is not private.
    #[error(
        "{backend}: the private directory {}: {cause}; remove it or set XDG_RUNTIME_DIR to a \
         directory only you can write",
        path.display()
    )]
    PrivateDir {
        backend: &'static str,
        path: PathBuf,
        cause: String,
    },

    #[error(
        "the private directory {} is writable by the sandbox; the boundary's own files must \
         live where the sandboxed command cannot change them (set XDG_RUNTIME_DIR elsewhere, \
         or narrow the grant)",
        path.display()
    )]
    PrivateDirWritable { path: PathBuf },

    /// The run's git store quarantine could not be laid out (nothing ran).
    #[error("native: {0}")]
    GitQuarantine(#[source] sandbox_git::quarantine::QuarantineError),

    /// This machine has no place or no kernel support for the quarantine's private layers
    /// (nothing ran): the reason names what was tried and what to do.
    #[error("native: git store quarantine: {reason}")]
    QuarantineUnsupported { reason: String },

    /// A path of the private view cannot be used.
    #[error("native: private view: {}: {cause}", path.display())]
    ViewPath { path: PathBuf, cause: String },

    #[error("nono: writing the manifest {}: {source}", path.display())]
    ManifestWrite {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("nono: creating the start-marker pipe: {0}")]
    StartMarkerPipe(#[source] std::io::Error),

    #[error(
        "nono: a domain allow-list under nono needs the run's private TMPDIR (to tell nono's \
         own failures from the command's exit status); this caller built the policy without \
         one"
    )]
    NonoNeedsTmpdir,

    /// nono exited before the trampoline ran: it could not set the sandbox up.
    #[error(
        "nono: nono could not set up the sandbox (`nono {subcommand}` exited {status} before \
         starting the command; its message is above). Nothing ran. `sandbox policy show \
         --backend nono` prints the manifest it was given"
    )]
    NonoSetupFailed {
        subcommand: &'static str,
        status: i32,
    },

    /// An environment rule (`--env`, `env.pass`, a `box.exec` variable) is malformed.
    #[error("env {arg}: {cause}")]
    Env {
        arg: String,
        #[source]
        cause: sandbox_policy::EnvNameError,
    },

    /// A `--credential` that cannot be used: unknown, or no secret where it is read from.
    #[error("{0}")]
    Credential(#[from] sandbox_net::CredentialError),

    /// A credential's secret file lies inside a grant, where the sandbox could read it.
    #[error(
        "--credential {name}: its secret file {} lies inside the grant {}, so the sandbox \
         could read it; keep it outside every grant (the default place is \
         ~/.config/sandbox/credentials/{name}) or drop the grant",
        file.display(),
        grant.display()
    )]
    CredentialGranted {
        name: String,
        file: PathBuf,
        grant: PathBuf,
    },

    /// The private TMPDIR of a run or a box could not be created.
    #[error(
        "creating the private TMPDIR in {}: {source}; check that the directory exists and \
         is writable (TMPDIR)",
        root.display()
    )]
    Tmpdir {
        root: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A grant would put the boundary's own state within the sandbox's reach.
    #[error("{0}")]
    TrustedPlace(String),

    /// An agent profile's paths could not be prepared on the host (a writable path created,
    /// a private copy made).
    #[error("agent profile: {0}")]
    Agent(String),
}

impl HostError {
    /// The backend's own error, when a backend of another crate failed (`LimaError`, …).
    pub fn backend_source(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match self {
            HostError::Backend { source, .. } => Some(&**source),
            _ => None,
        }
    }
}
