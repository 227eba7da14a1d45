//! The child setup's vocabulary, shared by every spawn path and by the child prelude: the
//! [`ChildSetup`] hook, the [`SetupStep`]s of the work done between fork and exec, the
//! [`SetupFailure`] a step reports, and the numbers the child and its parent agree on.
//!
//! A leaf: it names nothing else of the crate, so the spawn paths, the prelude, the pid
//! namespace split, the cgroups and the errors all import it without importing each other.

use std::os::fd::RawFd;

use nix::errno::Errno;

/// Work done in the forked child right before `exec`: applying Landlock, seccomp and the like.
///
/// Everything that can allocate or fail for ordinary reasons must happen when the value is
/// built, in the parent. [`ChildSetup::apply_in_child`] runs between `fork` and `exec` of a
/// possibly multi-threaded parent, where only async-signal-safe calls are sound: no allocation,
/// no locks, no `tracing`.
pub trait ChildSetup: Send + Sync {
    /// Applies the setup to the calling (child) process. Returns the step that failed and
    /// its errno; the command is then not executed and the spawn fails with
    /// [`ExecError::Setup`](crate::ExecError::Setup), naming that step.
    fn apply_in_child(&self) -> Result<(), SetupFailure>;

    /// A short name for messages ("landlock+seccomp").
    fn name(&self) -> &str;

    /// The descriptors beyond stdio that the command inherits on purpose (a start marker on
    /// fd 3), as they are numbered once [`ChildSetup::apply_in_child`] has run. Every other
    /// descriptor is closed at exec ([`crate::prelude`]). Read in the child: return a slice
    /// held by `self`, never a fresh allocation.
    fn passed_fds(&self) -> &[RawFd] {
        &[]
    }

    /// What item `detail` of `step` was (a mount and its path), for the parent's message.
    fn describe(&self, _step: SetupStep, _detail: u32) -> Option<String> {
        None
    }

    /// Whether [`ChildSetup::apply_in_child`] moves the child into a user namespace of its
    /// own (Linux): only then may the prelude set the run's process limit as `RLIMIT_NPROC`,
    /// which the kernel counts per user namespace ([`crate::prelude`]).
    fn user_namespace(&self) -> bool {
        false
    }

    /// Whether [`ChildSetup::apply_in_child`] moves the command into a new pid namespace
    /// (it unshares `CLONE_NEWPID`; Linux). The prelude then starts the namespace's init
    /// and the command as processes of their own ([`crate::prelude`]), and runs
    /// [`ChildSetup::apply_in_namespace`] in the command's.
    fn pid_namespace(&self) -> bool {
        false
    }

    /// The rest of the setup, run in the command's own process inside the pid namespace
    /// (what needs to be a process of it: mounting its `/proc`; then Landlock and seccomp).
    /// Only called when [`ChildSetup::pid_namespace`] is true. Async-signal safe.
    fn apply_in_namespace(&self) -> Result<(), SetupFailure> {
        Ok(())
    }
}

/// A step of the work done between fork and exec, named so that a failure says which one
/// failed. Sent from the child to the parent as a number (the child cannot allocate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum SetupStep {
    /// `setsid(2)`: the child's own session and process group.
    NewSession = 1,
    /// `PR_SET_PDEATHSIG`, and the check that the parent still lives.
    ParentDeathSignal = 2,
    /// `TIOCSCTTY`: the pseudo-terminal as controlling terminal.
    ControllingTerminal = 3,
    /// Dropping every capability (as root).
    DropCapabilities = 4,
    /// `PR_SET_NO_NEW_PRIVS`.
    NoNewPrivs = 5,
    /// `landlock_restrict_self(2)`.
    LandlockRestrictSelf = 6,
    /// Loading a seccomp program.
    SeccompLoad = 7,
    /// Putting a backend's start-marker descriptor in place (nono).
    StartMarker = 8,
    /// `unshare(CLONE_NEWUSER | CLONE_NEWNS)` for the private view.
    UserNamespace = 10,
    /// Writing `/proc/self/{setgroups,uid_map,gid_map}`.
    IdMap = 11,
    /// Building the private view: a mount, a mount point, a link.
    ViewMount = 12,
    /// Entering the view's root (`chroot`).
    PivotRoot = 13,
    /// Returning to the working directory inside the view.
    WorkingDirectory = 14,
    /// `landlock_add_rule` for a path that exists only inside the view (the git store's
    /// overlay).
    LandlockAddRule = 15,
    /// Marking every descriptor not passed on purpose close-on-exec.
    CloseDescriptors = 16,
    /// Starting the pid namespace's init and the command inside it.
    PidNamespace = 17,
    /// Mounting the pid namespace's own `/proc` in the view.
    ProcMount = 18,
    /// Bringing up `lo` in the run's network namespace.
    NetLoopback = 19,
    /// Binding the network namespace's listeners on `127.0.0.1` and handing them to the
    /// supervisor (detail: the port).
    NetListeners = 20,
    /// Writing the child into the run's cgroups (`cgroup.procs`).
    JoinCgroup = 21,
    /// Setting the process limit as `RLIMIT_NPROC` in the child's own user namespace.
    ProcessRlimit = 22,
    /// A setup step of a caller's own.
    Other = 9,
}

impl SetupStep {
    pub fn as_str(self) -> &'static str {
        match self {
            SetupStep::NewSession => "setsid (a new session)",
            SetupStep::ParentDeathSignal => "PR_SET_PDEATHSIG",
            SetupStep::ControllingTerminal => "TIOCSCTTY (the pty as controlling terminal)",
            SetupStep::DropCapabilities => "dropping capabilities",
            SetupStep::NoNewPrivs => "PR_SET_NO_NEW_PRIVS",
            SetupStep::LandlockRestrictSelf => "landlock_restrict_self",
            SetupStep::SeccompLoad => "loading the seccomp filter",
            SetupStep::StartMarker => "the start-marker descriptor",
            SetupStep::UserNamespace => "unshare (user and mount namespaces)",
            SetupStep::IdMap => "writing the uid/gid maps",
            SetupStep::ViewMount => "building the private view",
            SetupStep::PivotRoot => "entering the private view's root",
            SetupStep::WorkingDirectory => "entering the working directory in the view",
            SetupStep::LandlockAddRule => "landlock_add_rule (for a mount only the view has)",
            SetupStep::CloseDescriptors => "closing the inherited descriptors",
            SetupStep::PidNamespace => "starting the pid namespace's init",
            SetupStep::ProcMount => "mounting the pid namespace's /proc",
            SetupStep::NetLoopback => "bringing up lo in the network namespace",
            SetupStep::NetListeners => {
                "binding the network namespace's listeners and handing them over"
            }
            SetupStep::JoinCgroup => "joining the run's cgroup (the resource limits)",
            SetupStep::ProcessRlimit => {
                "setting RLIMIT_NPROC in the run's user namespace (the process limit)"
            }
            SetupStep::Other => "child setup",
        }
    }

    fn from_u32(n: u32) -> SetupStep {
        [
            SetupStep::NewSession,
            SetupStep::ParentDeathSignal,
            SetupStep::ControllingTerminal,
            SetupStep::DropCapabilities,
            SetupStep::NoNewPrivs,
            SetupStep::LandlockRestrictSelf,
            SetupStep::SeccompLoad,
            SetupStep::StartMarker,
            SetupStep::UserNamespace,
            SetupStep::IdMap,
            SetupStep::ViewMount,
            SetupStep::PivotRoot,
            SetupStep::WorkingDirectory,
            SetupStep::LandlockAddRule,
            SetupStep::CloseDescriptors,
            SetupStep::PidNamespace,
            SetupStep::ProcMount,
            SetupStep::NetLoopback,
            SetupStep::NetListeners,
            SetupStep::JoinCgroup,
            SetupStep::ProcessRlimit,
        ]
        .into_iter()
        .find(|s| *s as u32 == n)
        .unwrap_or(SetupStep::Other)
    }
}

impl std::fmt::Display for SetupStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which step of a [`ChildSetup`] failed, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetupFailure {
    pub step: SetupStep,
    pub errno: Errno,
    /// Which item of the step (a mount's index in the setup's own list), for
    /// [`ChildSetup::describe`]; 0 when the step has one item.
    pub detail: u32,
}

impl SetupFailure {
    /// Async-signal safe: reads `errno` only.
    pub fn last(step: SetupStep) -> Self {
        SetupFailure {
            step,
            errno: Errno::last(),
            detail: 0,
        }
    }

    /// A report as read from the pipe.
    pub(crate) fn from_raw(step: u32, errno: i32, detail: u32) -> Self {
        SetupFailure {
            step: SetupStep::from_u32(step),
            errno: Errno::from_raw(errno),
            detail,
        }
    }

    /// For `map_err`: tags an errno with its step.
    pub fn at(step: SetupStep) -> impl Fn(Errno) -> SetupFailure {
        move |errno| SetupFailure {
            step,
            errno,
            detail: 0,
        }
    }
}

/// The step number sent through the report pipe when `execve` itself failed: the errno is
/// then the exec's, classified as the command's own (126/127), not the sandbox's.
pub(crate) const EXEC_FAILED: u32 = u32::MAX;
