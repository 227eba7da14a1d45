//! The private filesystem view ([`sandbox_policy::compile::view`]), built in the child between
//! fork and exec: new user and mount namespaces (the caller's uid and gid mapped to
//! themselves), a tmpfs root holding only the policy's paths, `chroot` into it. Landlock and
//! seccomp are applied on top afterwards, as a second layer.
//!
//! Everything that allocates happens in [`PreparedView::prepare`], in the parent: the plan is
//! compiled, every path becomes a `CString` under the staging directory, and the mount points
//! the tmpfs needs are listed in order. [`PreparedView::apply_in_child`] only makes system calls
//! on that data, so it is async-signal safe. Nothing outlives the run: the namespaces die with
//! the command's last process, and the staging directory on the host stays an empty directory
//! (the tmpfs is mounted over it only inside the command's own mount namespace).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use sandbox_exec::{SetupFailure, SetupStep};
use sandbox_policy::compile::view::{self, EntryKind, GitStoreLayers, MountOp, ViewPlan};
use sandbox_policy::Policy;

use crate::error::HostError;
use crate::sys;

mod mounts;
mod overlay;
mod target;
pub(crate) use mounts::write_file;
use mounts::{enter, run, set_readonly, tmpfs, view_failure, write_proc};
use overlay::overlay_options;
use target::Target;

/// One system-call-level step of building the view. Paths are under the staging directory.
#[derive(Debug)]
enum Step {
    /// Create a directory mount point on a tmpfs of the view (one that exists is fine).
    Mkdir(CString),
    /// Create an empty file mount point on a tmpfs of the view.
    Touch(CString),
    Tmpfs {
        target: Target,
        data: CString,
    },
    Bind {
        source: Target,
        target: Target,
        readonly: bool,
    },
    Symlink {
        target: CString,
        link: CString,
    },
    /// An overlay; `data` holds its layers as mount options.
    Overlay {
        target: Target,
        data: CString,
    },
    /// A bind of a path of the view over itself, read-only.
    Pin(Target),
    /// A folder of the view bound over itself with every mount below it, then that mount
    /// alone made read-only: the mounts inside keep their own access.
    Seal(Target),
    /// Removes a file of the view's root tmpfs: the source of the empty files, once bound
    /// (each bind keeps the file it shows).
    Unlink(CString),
    /// A private devpts instance.
    Devpts(Target),
    /// A size-limited tmpfs of the git store's writable layer (`data`: its options).
    LayerTmpfs {
        target: CString,
        data: CString,
    },
    /// Sends a descriptor of `dir` to the host over the socket `fd` (one `SCM_RIGHTS`
    /// message), so the host holds the bounded layer beyond the namespace's life.
    SendLayer {
        dir: CString,
        fd: libc::c_int,
    },
}

/// A devpts of the view's own: a new instance (no host pty in it) whose `ptmx` anyone in the
/// view may open; new slaves get the opener's ids and mode 0620. No `gid=5`: the host's tty
/// group is not mapped in the user namespace.
const DEVPTS_OPTIONS: &std::ffi::CStr = c"newinstance,ptmxmode=0666,mode=0620";

/// The view of one policy, ready to be built in a child.
#[derive(Debug)]
pub struct PreparedView {
    plan: ViewPlan,
    staging: CString,
    steps: Vec<Step>,
    /// What each step is, for the parent's error message (index = `SetupFailure::detail`).
    labels: Vec<String>,
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
    /// The child's end of the bounded layer's socket, open until the command is spawned.
    _layer_socket: Option<std::os::fd::OwnedFd>,
    /// The command gets a pid namespace of its own (`CLONE_NEWPID` beside the user and mount
    /// namespaces), and the view's `/proc` is that namespace's, mounted by the command's
    /// process inside it ([`PreparedView::apply_in_namespace`]), never the host's.
    pid_namespace: bool,
    /// The view has a `/proc` (the policy grants it) to mount there.
    proc: bool,
    /// The command gets a network namespace of its own (`CLONE_NEWNET` beside the user and
    /// mount namespaces): only `lo`, brought up by the native child (`crate::backends::native::netns`).
    net_namespace: bool,
}

/// The file of the view's root tmpfs that [`MountOp::Empty`] binds (removed once bound, so
/// the run never sees it at this name).
const EMPTY_SOURCE: &str = "/.sandbox-empty";

/// Where the pid namespace's proc is mounted in the view.
/// The view's proc: with a pid namespace, the namespace's own is mounted here in place of
/// the policy's bind of the host's.
pub(crate) const PROC: &str = "/proc";

/// Whether `op` binds the host's proc, which a pid namespace's own replaces.
pub(crate) fn binds_host_proc(op: &MountOp) -> bool {
    matches!(op, MountOp::Bind { target, .. } if target == Path::new(PROC))
}

fn cstring(path: &Path) -> Result<CString, HostError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| HostError::ViewPath {
        path: path.to_path_buf(),
        cause: "contains a NUL byte".into(),
    })
}

/// Mount options (`size=…,mode=…`) as the kernel reads them; `at` names the mount point in
/// the error.
fn mount_data(options: String, at: &Path) -> Result<CString, HostError> {
    CString::new(options).map_err(|_| HostError::ViewPath {
        path: at.to_path_buf(),
        cause: "the tmpfs options contain a NUL byte".into(),
    })
}

/// What a host path is, without following a final symlink.
fn classify(path: &Path) -> EntryKind {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => match std::fs::read_link(path) {
            Ok(target) => EntryKind::Symlink(target),
            Err(_) => EntryKind::Missing,
        },
        Ok(m) if m.is_dir() => EntryKind::Dir,
        Ok(_) => EntryKind::File,
        Err(_) => EntryKind::Missing,
    }
}

/// The view of `policy` as this machine's paths make it (what `policy show` prints), with the
/// git store quarantine's layers when the run has them.
pub fn plan(policy: &Policy, store: Option<&GitStoreLayers>) -> Result<ViewPlan, HostError> {
    Ok(view::compile(policy, &classify, store)?)
}

impl PreparedView {
    /// Compiles the view of `policy` and lays it out under `staging` (an empty directory of
    /// ours, outside everything the policy binds; created if missing).
    pub fn prepare(
        policy: &Policy,
        staging: &Path,
        store: Option<&GitStoreLayers>,
        pid_namespace: bool,
    ) -> Result<Self, HostError> {
        Self::prepare_with_layer(policy, staging, store, None, pid_namespace)
    }

    /// As [`PreparedView::prepare`], with the git store's writable layer on a tmpfs of its
    /// own (`layer`), mounted first.
    ///
    /// One function on purpose: one pass over the plan's operations in order, carrying what
    /// is mounted where so far — each operation's mount points depend on every one before it
    /// (a bind of the host's tree has its ancestors, the view's tmpfs does not), and that
    /// state would otherwise travel through every piece.
    pub fn prepare_with_layer(
        policy: &Policy,
        staging: &Path,
        store: Option<&GitStoreLayers>,
        layer: Option<sandbox_git::quarantine::LayerMount>,
        pid_namespace: bool,
    ) -> Result<Self, HostError> {
        let plan = view::compile(policy, &classify, store)?;
        let mut proc = false;
        if !staging.is_dir() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(staging)
                .map_err(|e| HostError::ViewPath {
                    path: staging.to_path_buf(),
                    cause: format!("creating the staging directory: {e}"),
                })?;
        }
        let inside = |path: &Path| -> Result<CString, HostError> {
            let relative = path.strip_prefix("/").unwrap_or(path);
            cstring(&staging.join(relative))
        };
        let mut steps = Vec::new();
        let mut labels = Vec::new();
        let mut made: std::collections::BTreeSet<PathBuf> = Default::default();
        let mut empty_source: Option<CString> = None;
        // Where a tree the run can write is mounted: a target inside one is opened beneath.
        let mut writable: std::collections::BTreeSet<PathBuf> = Default::default();
        // The same on the host's side: where those trees are (a bind's source inside one).
        let mut writable_sources: std::collections::BTreeSet<PathBuf> = Default::default();
        // What is mounted where so far (`true`: a bind of the host's tree, in which every
        // ancestor of a granted path already exists; `false`: a tmpfs of the view, where
        // mount points must be made). The root is the view's own tmpfs.
        let mut mounted: std::collections::HashMap<PathBuf, bool> =
            [(PathBuf::from("/"), false)].into();
        // The innermost mount at or above `path` decides.
        let on_host = |mounted: &std::collections::HashMap<PathBuf, bool>, path: &Path| -> bool {
            path.ancestors()
                .find_map(|at| mounted.get(at))
                .is_some_and(|bind| *bind)
        };
        // A mount point for `target`, unless the mount it lands in is a bind of the host's
        // tree (where it exists already).
        let mount_point = |mounted: &std::collections::HashMap<PathBuf, bool>,
                           target: &Path,
                           dir: bool|
         -> Result<Option<(Step, String)>, HostError> {
            if on_host(mounted, target) {
                return Ok(None);
            }
            let at = inside(target)?;
            let step = if dir {
                Step::Mkdir(at)
            } else {
                Step::Touch(at)
            };
            Ok(Some((step, format!("mount point {}", target.display()))))
        };
        let mut push = |steps: &mut Vec<Step>, step: Step, label: String| {
            steps.push(step);
            labels.push(label);
        };
        // The bounded layer first: the overlay below stacks it.
        let layer_socket = match layer {
            None => None,
            Some(layer) => {
                use std::os::fd::AsRawFd;
                let dir = cstring(&layer.dir)?;
                push(
                    &mut steps,
                    Step::LayerTmpfs {
                        target: dir.clone(),
                        data: mount_data(format!("size={},mode=0700", layer.bytes), &layer.dir)?,
                    },
                    format!(
                        "tmpfs of {} bytes for the git store's writable layer at {}",
                        layer.bytes,
                        layer.dir.display()
                    ),
                );
                for sub in &layer.subdirs {
                    push(
                        &mut steps,
                        Step::Mkdir(cstring(&layer.dir.join(sub))?),
                        format!("{} in the git store's layer", sub.display()),
                    );
                }
                push(
                    &mut steps,
                    Step::SendLayer {
                        dir,
                        fd: layer.socket.as_raw_fd(),
                    },
                    "handing the git store's layer to the host".into(),
                );
                Some(layer.socket)
            }
        };
        for op in &plan.ops {
            let target = op.target();
            // Every ancestor as a directory, where no bind provides it already.
            let mut ancestors: Vec<&Path> = target.ancestors().skip(1).collect();
            ancestors.reverse();
            for dir in ancestors {
                if dir == Path::new("/")
                    || on_host(&mounted, dir)
                    || !made.insert(dir.to_path_buf())
                {
                    continue;
                }
                push(
                    &mut steps,
                    Step::Mkdir(inside(dir)?),
                    format!("mount point {}", dir.display()),
                );
            }
            match op {
                MountOp::Tmpfs { target, mode } => {
                    made.insert(target.clone());
                    if let Some((step, label)) = mount_point(&mounted, target, true)? {
                        push(&mut steps, step, label);
                    }
                    mounted.insert(target.clone(), false);
                    push(
                        &mut steps,
                        Step::Tmpfs {
                            target: target::target(staging, &writable, target)?,
                            data: mount_data(format!("mode={mode:o}"), target)?,
                        },
                        format!("tmpfs on {}", target.display()),
                    );
                }
                // The host's /proc would show every host process: with a pid namespace the
                // view gets a mount point, and the namespace's own proc is mounted there.
                MountOp::Bind { target, .. } if pid_namespace && binds_host_proc(op) => {
                    made.insert(target.clone());
                    if let Some((step, label)) = mount_point(&mounted, target, true)? {
                        push(&mut steps, step, label);
                    }
                    mounted.insert(target.clone(), false);
                    proc = true;
                }
                MountOp::Bind {
                    source,
                    target,
                    dir,
                    readonly,
                    why,
                } => {
                    made.insert(target.clone());
                    if let Some((step, label)) = mount_point(&mounted, target, *dir)? {
                        push(&mut steps, step, label);
                    }
                    mounted.insert(target.clone(), true);
                    let at = target::target(staging, &writable, target)?;
                    let from = target::target(Path::new("/"), &writable_sources, source)?;
                    if !*readonly {
                        writable.insert(target.clone());
                        writable_sources.insert(source.clone());
                    }
                    push(
                        &mut steps,
                        Step::Bind {
                            source: from,
                            target: at,
                            readonly: *readonly,
                        },
                        format!(
                            "{} bind of {} ({why})",
                            if *readonly { "read-only" } else { "writable" },
                            source.display()
                        ),
                    );
                }
                MountOp::Overlay {
                    target,
                    lower,
                    upper,
                    work,
                    why,
                } => {
                    made.insert(target.clone());
                    // A cache outside the home (`CARGO_HOME=/opt/cargo`) lands on the view's
                    // own tmpfs, where its directory must be made first.
                    if let Some((step, label)) = mount_point(&mounted, target, true)? {
                        push(&mut steps, step, label);
                    }
                    mounted.insert(target.clone(), true);
                    let at = target::target(staging, &writable, target)?;
                    writable.insert(target.clone());
                    push(
                        &mut steps,
                        Step::Overlay {
                            target: at,
                            data: overlay_options(lower, upper, work)?,
                        },
                        format!(
                            "overlay on {} ({why}; private layer {})",
                            target.display(),
                            upper.display()
                        ),
                    );
                }
                MountOp::Pin { target, why, .. } => {
                    made.insert(target.clone());
                    mounted.insert(target.clone(), true);
                    push(
                        &mut steps,
                        Step::Pin(target::target(staging, &writable, target)?),
                        format!("read-only pin of {} ({why})", target.display()),
                    );
                }
                // The host's file stays under the bind of its directory; an empty file of the
                // root tmpfs is bound read-only over it (made once, removed after the loop).
                MountOp::Empty { target, why } => {
                    let source = inside(Path::new(EMPTY_SOURCE))?;
                    if empty_source.is_none() {
                        push(
                            &mut steps,
                            Step::Touch(source.clone()),
                            "the empty file of the view's own".into(),
                        );
                        empty_source = Some(source.clone());
                    }
                    made.insert(target.clone());
                    mounted.insert(target.clone(), true);
                    push(
                        &mut steps,
                        Step::Bind {
                            source: Target::plain(source),
                            target: target::target(staging, &writable, target)?,
                            readonly: true,
                        },
                        format!("an empty file over {} ({why})", target.display()),
                    );
                }
                MountOp::Seal { target, why } => {
                    mounted.insert(target.clone(), true);
                    push(
                        &mut steps,
                        Step::Seal(target::target(staging, &writable, target)?),
                        format!("read-only seal of {} ({why})", target.display()),
                    );
                }
                MountOp::Devpts { target } => {
                    made.insert(target.clone());
                    if let Some((step, label)) = mount_point(&mounted, target, true)? {
                        push(&mut steps, step, label);
                    }
                    mounted.insert(target.clone(), false);
                    push(
                        &mut steps,
                        Step::Devpts(target::target(staging, &writable, target)?),
                        format!("private devpts on {}", target.display()),
                    );
                }
                MountOp::Symlink { link, target } => {
                    made.insert(link.clone());
                    push(
                        &mut steps,
                        Step::Symlink {
                            target: cstring(target)?,
                            link: inside(link)?,
                        },
                        format!("link {} -> {}", link.display(), target.display()),
                    );
                }
            }
        }
        if let Some(source) = empty_source {
            push(
                &mut steps,
                Step::Unlink(source),
                "removing the empty file's source from the view's root".into(),
            );
        }
        let uid = nix::unistd::geteuid().as_raw();
        let gid = nix::unistd::getegid().as_raw();
        Ok(PreparedView {
            plan,
            staging: cstring(staging)?,
            steps,
            labels,
            uid_map: format!("{uid} {uid} 1\n").into_bytes(),
            gid_map: format!("{gid} {gid} 1\n").into_bytes(),
            _layer_socket: layer_socket,
            pid_namespace,
            proc,
            net_namespace: false,
        })
    }

    /// The same view, with (or without) a network namespace of its own for the command.
    pub fn with_net_namespace(mut self, net_namespace: bool) -> Self {
        self.net_namespace = net_namespace;
        self
    }

    /// Whether the command runs in a pid namespace of its own.
    pub fn pid_namespace(&self) -> bool {
        self.pid_namespace
    }

    /// Where the pid namespace's proc is mounted, if the view has one: a mount made only in
    /// the command's process, so its Landlock rule is added there too.
    pub fn proc_dir(&self) -> Option<&Path> {
        self.proc.then(|| Path::new(PROC))
    }

    /// In the command's process inside the pid namespace, after [`Self::apply_in_child`]
    /// (in the view's root): mounts the namespace's own proc on the view's `/proc`,
    /// read-only as the host's was bound. Async-signal safe.
    pub fn apply_in_namespace(&self) -> Result<(), SetupFailure> {
        if !self.proc {
            return Ok(());
        }
        sys::mount(
            Some(c"proc"),
            c"/proc",
            Some(c"proc"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RDONLY,
            None,
        )
        .map_err(SetupFailure::at(SetupStep::ProcMount))?;
        Ok(())
    }

    /// Where the view mounts its private devpts, if it has one: a mount made only in the
    /// child, so the Landlock rule that lets the command open new ptys there is added in the
    /// child too.
    pub fn devpts(&self) -> Option<&Path> {
        self.plan.ops.iter().find_map(|op| match op {
            MountOp::Devpts { target } => Some(target.as_path()),
            _ => None,
        })
    }

    /// What step `detail` of the view was, for an error message.
    pub fn describe(&self, step: SetupStep, detail: u32) -> Option<String> {
        match step {
            SetupStep::ViewMount => self.labels.get(detail as usize).cloned(),
            _ => None,
        }
    }

    /// Builds the view and enters it. Async-signal safe: system calls on prepared data and
    /// a stack buffer only. The working directory (set before this runs) is re-entered
    /// inside the view.
    pub fn apply_in_child(&self) -> Result<(), SetupFailure> {
        let mut cwd = [0u8; libc::PATH_MAX as usize];
        let cwd = sys::getcwd(&mut cwd).map_err(SetupFailure::at(SetupStep::WorkingDirectory))?;
        let pid = if self.pid_namespace {
            libc::CLONE_NEWPID
        } else {
            0
        };
        let net = if self.net_namespace {
            libc::CLONE_NEWNET
        } else {
            0
        };
        // The child is single-threaded (fresh from fork), as CLONE_NEWUSER requires.
        // CLONE_NEWPID moves only the children made from here on (the prelude starts them:
        // sandbox_exec's pid namespace split). CLONE_NEWNET: the new network namespace is
        // owned by the new user namespace, so its `lo` can be brought up with the
        // capabilities that namespace grants.
        sys::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS | pid | net)
            .map_err(SetupFailure::at(SetupStep::UserNamespace))?;
        // A supervisor holding a credential is not dumpable (sys::hold_secrets), and on the
        // direct path this child shares its memory: its /proc files are then root's, closed
        // to a user writing its own id maps. Dumpable for these writes only: nothing of the
        // run exists yet.
        let hidden = !sys::dumpable();
        if hidden {
            let _ = sys::set_dumpable(true);
        }
        let maps = write_proc(c"/proc/self/setgroups", b"deny")
            .and_then(|()| write_proc(c"/proc/self/uid_map", &self.uid_map))
            .and_then(|()| write_proc(c"/proc/self/gid_map", &self.gid_map));
        if hidden {
            let _ = sys::set_dumpable(false);
        }
        maps?;
        // Nothing done from here on propagates back to the host's mount namespace.
        sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
            .map_err(SetupFailure::at(SetupStep::ViewMount))?;
        tmpfs(&self.staging, c"mode=0755").map_err(|errno| view_failure(errno, u32::MAX))?;
        for (i, step) in self.steps.iter().enumerate() {
            run(step).map_err(|errno| view_failure(errno, i as u32))?;
        }
        // The root itself is read-only: nothing can be created beside the policy's paths.
        set_readonly(&self.staging, false).map_err(|errno| view_failure(errno, u32::MAX))?;
        enter(&self.staging)?;
        sys::chdir(cwd).map_err(SetupFailure::at(SetupStep::WorkingDirectory))?;
        Ok(())
    }
}
