//! The native sandbox as a [`ChildSetup`]: everything is prepared in the parent (the Landlock
//! ruleset fd, the BPF programs); the child makes three kinds of syscalls and execs.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use nix::errno::Errno;
use sandbox_exec::{ChildSetup, SetupFailure, SetupStep};

use super::capabilities::drop_capabilities;
use super::sandbox::NativeSandbox;

use crate::backends::native::view::PreparedView;
use crate::error::HostError;
use crate::sys;

/// One command's setup: the session's sandbox, and the command's view.
pub struct NativeChild {
    pub(super) sandbox: Arc<NativeSandbox>,
    pub(super) view: Option<Arc<PreparedView>>,
    /// With mounts only the child's view has (the git store's overlay, the private devpts):
    /// the command's own ruleset, and the rules the child adds for them once they exist.
    pub(super) own_ruleset: Option<OwnedFd>,
    pub(super) child_rules: Vec<ChildRule>,
    /// The command's network namespace: its listeners, bound inside and handed over.
    pub(super) net: Option<crate::backends::native::netns::ChildNet>,
}

/// A Landlock rule added in the child after the view is built, for a directory mounted only
/// there: Landlock does not consult a rule on the mount point such a mount covers.
/// Its directory is opened beneath the view's root through no link: the path may cross a
/// tree the run writes (a cache overlay in the private home), where another run of the project
/// could have put a link that would carry the rule elsewhere.
pub(super) struct ChildRule {
    /// The path, relative to the view's root.
    pub(super) path: std::ffi::CString,
    pub(super) access: u64,
}

impl ChildRule {
    pub(super) fn new(path: &std::path::Path, access: u64) -> Result<Self, HostError> {
        let rel = path.strip_prefix("/").unwrap_or(path);
        let rel = if rel.as_os_str().is_empty() {
            std::path::Path::new(".")
        } else {
            rel
        };
        Ok(ChildRule {
            path: std::ffi::CString::new(rel.as_os_str().as_encoded_bytes()).map_err(|_| {
                HostError::ViewPath {
                    path: path.to_path_buf(),
                    cause: "contains a NUL byte".into(),
                }
            })?,
            access,
        })
    }

    pub(super) fn add(&self, ruleset: &OwnedFd) -> Result<(), SetupFailure> {
        let fail = SetupFailure::at(SetupStep::LandlockAddRule);
        // O_PATH: no access to the content.
        let fd = sys::open_beneath(c"/", &self.path).map_err(&fail)?;
        let result =
            sys::landlock_add_path_rule(ruleset.as_raw_fd(), fd, self.access).map_err(&fail);
        let _ = sys::close(fd);
        result
    }
}

impl ChildSetup for NativeChild {
    fn apply_in_child(&self) -> Result<(), SetupFailure> {
        // The view first: it needs the capabilities its new user namespace grants, which the
        // drop below and no_new_privs would otherwise limit.
        if let Some(view) = &self.view {
            view.apply_in_child()?;
            // In the namespace the view's unshare made, before Landlock and seccomp: `lo`
            // up, the listeners bound and handed to the supervisor.
            if let Some(net) = &self.net {
                net.apply_in_child()?;
            }
            if view.pid_namespace() {
                // The rest runs in the command's process inside the pid namespace.
                return Ok(());
            }
        }
        self.apply_limits()
    }

    fn pid_namespace(&self) -> bool {
        self.view.as_ref().is_some_and(|view| view.pid_namespace())
    }

    /// The view's unshare makes the user namespace.
    fn user_namespace(&self) -> bool {
        self.view.is_some()
    }

    fn apply_in_namespace(&self) -> Result<(), SetupFailure> {
        if let Some(view) = &self.view {
            view.apply_in_namespace()?;
        }
        self.apply_limits()
    }

    fn name(&self) -> &str {
        if self.net.is_some() {
            "view+netns+landlock+seccomp"
        } else if self.view.is_some() {
            "view+landlock+seccomp"
        } else {
            "landlock+seccomp"
        }
    }

    fn describe(&self, step: SetupStep, detail: u32) -> Option<String> {
        if step == SetupStep::NetListeners && detail != 0 {
            return Some(format!("127.0.0.1:{detail}"));
        }
        if step == SetupStep::LandlockAddRule {
            let rule = self.child_rules.get(detail as usize)?;
            return Some(format!("/{}", rule.path.to_string_lossy()));
        }
        self.view.as_ref()?.describe(step, detail)
    }
}

impl NativeChild {
    /// The rules for mounts only the child's view has, then the sandbox's limits.
    pub(super) fn apply_limits(&self) -> Result<(), SetupFailure> {
        let ruleset = self.own_ruleset.as_ref().or(self.sandbox.ruleset.as_ref());
        if let Some(ruleset) = &self.own_ruleset {
            for (i, rule) in self.child_rules.iter().enumerate() {
                rule.add(ruleset).map_err(|mut failure| {
                    failure.detail = i as u32;
                    failure
                })?;
            }
        }
        self.sandbox.apply_limits(ruleset)
    }
}

impl NativeSandbox {
    /// Capabilities, no_new_privs, Landlock and seccomp, in the child after its view.
    pub(super) fn apply_limits(&self, ruleset: Option<&OwnedFd>) -> Result<(), SetupFailure> {
        if let Some(last) = self.drop_caps_up_to {
            drop_capabilities(last).map_err(SetupFailure::at(SetupStep::DropCapabilities))?;
        }
        // The child of fork() has exactly one thread, so restricting "self" covers every
        // thread the command will ever have: they all descend from this one. no_new_privs is
        // required by both Landlock and seccomp for an unprivileged caller, and it keeps
        // setuid binaries from regaining privileges inside the sandbox.
        sys::set_no_new_privs().map_err(SetupFailure::at(SetupStep::NoNewPrivs))?;
        if let Some(fd) = ruleset {
            // The fd was created in the parent and is open in this child (it is closed only
            // at exec, where Landlock no longer needs it: the domain is attached to the
            // process).
            sys::landlock_restrict_self(fd.as_raw_fd())
                .map_err(SetupFailure::at(SetupStep::LandlockRestrictSelf))?;
        }
        // Seccomp must stay the last step: it denies mount, unshare, setns and namespace
        // clones, so any setup of that kind (a private mount namespace) has to happen above.
        for filter in &self.filters {
            // apply_filter builds a sock_fprog on the stack and calls seccomp(2); it does
            // not allocate on success, and on failure only wraps the errno.
            if seccompiler::apply_filter(filter).is_err() {
                let errno = Errno::last();
                return Err(SetupFailure {
                    step: SetupStep::SeccompLoad,
                    errno: if errno == Errno::UnknownErrno {
                        Errno::EINVAL
                    } else {
                        errno
                    },
                    detail: 0,
                });
            }
        }
        Ok(())
    }
}
