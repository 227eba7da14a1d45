//! Can this process build a private view here? Asked of the kernel by a real probe — a forked
//! child that creates user and mount namespaces, maps its ids and mounts a tmpfs, exactly what
//! the view needs — because the answer depends on more than one switch: the
//! `user.max_user_namespaces` limit, Debian's `kernel.unprivileged_userns_clone`, Ubuntu's
//! AppArmor restriction (`kernel.apparmor_restrict_unprivileged_userns`, under which the
//! namespace is created but has no capabilities), a container's seccomp policy.
//!
//! The answer is cached in the private directory, keyed on everything it depends on that can
//! be read cheaply (the boot, the ids, those sysctls, this process's user namespace and
//! AppArmor label), so a run pays for a few small reads, not a fork.

use std::path::Path;

use nix::errno::Errno;
use nix::unistd::ForkResult;

use crate::sys;

/// Whether the private view can be built, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViewSupport {
    Available,
    Unavailable { reason: String },
}

const CACHE_FILE: &str = "userns-probe";

fn read(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "-".into())
}

/// Everything the probe's answer depends on that a run can read without forking: the
/// kernel (this boot, its release), the ids, the switches, this process's user namespace and
/// AppArmor label.
fn key() -> String {
    let ns = std::fs::read_link("/proc/self/ns/user")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    format!(
        "v2|{}|{}|{}|{}|{}|{}|{}|{}",
        crate::privdir::kernel_key(),
        nix::unistd::geteuid(),
        nix::unistd::getegid(),
        read("/proc/sys/user/max_user_namespaces"),
        read("/proc/sys/kernel/unprivileged_userns_clone"),
        read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"),
        read("/proc/self/attr/current"),
        ns
    )
}

/// The probe's answer, from the cache in `cache_dir` when it is still valid.
pub fn support(cache_dir: Option<&Path>) -> ViewSupport {
    let answer = cached(cache_dir, CACHE_FILE, "", || match probe() {
        ViewSupport::Available => Ok(()),
        ViewSupport::Unavailable { reason } => Err(reason),
    });
    match answer {
        Ok(()) => ViewSupport::Available,
        Err(reason) => ViewSupport::Unavailable { reason },
    }
}

const PID_CACHE_FILE: &str = "pidns-probe";
const NET_CACHE_FILE: &str = "netns-probe";
const OVERLAY_CACHE_FILE: &str = "overlay-probe";

/// A probe's answer from `file` in `cache_dir` while the [`key`] (and `extra`) still
/// matches, else `probe`'s (then cached). `Ok(())` is cached as an empty value, `Err(why)` as
/// the reason.
fn cached(
    cache_dir: Option<&Path>,
    file: &str,
    extra: &str,
    probe: impl FnOnce() -> Result<(), String>,
) -> Result<(), String> {
    let key = format!("{}|{extra}", key());
    if let Some(v) = cache_dir.and_then(|d| crate::privdir::recall(d, file, &key)) {
        return if v.is_empty() { Ok(()) } else { Err(v) };
    }
    let answer = probe();
    if let Some(dir) = cache_dir {
        let value = answer.as_ref().err().map(|e| e.replace('\n', " "));
        crate::privdir::remember(dir, file, &key, value.as_deref().unwrap_or_default());
    }
    answer
}

/// Whether a run with the private view also gets a pid namespace of its own, whose `/proc`
/// mounts in the view; `Err` says why not. A real probe (a forked child makes a user, mount
/// and pid namespace, and its child mounts that namespace's proc), cached like [`support`].
pub fn pid_namespace_support(cache_dir: Option<&Path>) -> Result<(), String> {
    if !sandbox_exec::pid_namespace_supported() {
        return Err(
            "this build has no pid namespace split for this architecture (x86_64 and \
                    aarch64 only)"
                .into(),
        );
    }
    cached(cache_dir, PID_CACHE_FILE, "", pid_probe)
}

/// Whether a run with the private view also gets a network namespace of its own (only `lo`,
/// brought up inside, a listener bound on `127.0.0.1` there); `Err` says why not. A real
/// probe, cached like [`support`].
pub fn net_namespace_support(cache_dir: Option<&Path>) -> Result<(), String> {
    cached(cache_dir, NET_CACHE_FILE, "", net_probe)
}

/// The forked probes' common start, in the calling (freshly forked, single-threaded) child:
/// `unshare(CLONE_NEWUSER | CLONE_NEWNS | extra)`, the id maps (this process's ids mapped to
/// themselves), `/` made private and a tmpfs on `/tmp`. `Err` names the first failing step
/// (`STEP_*`), with `errno` set.
///
/// Only for a child of `fork` that exits with `_exit` when done: it changes the process's
/// namespaces and mounts. Async-signal safe (system calls on the given buffers only).
fn enter_probe_namespaces(extra: libc::c_int, uid_map: &[u8], gid_map: &[u8]) -> Result<(), u8> {
    if sys::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS | extra).is_err() {
        return Err(STEP_UNSHARE);
    }
    for (path, data) in [
        (c"/proc/self/setgroups", &b"deny"[..]),
        (c"/proc/self/uid_map", uid_map),
        (c"/proc/self/gid_map", gid_map),
    ] {
        if crate::backends::native::view::write_file(path, data).is_err() {
            return Err(STEP_ID_MAP);
        }
    }
    if sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None).is_err()
        || sys::mount(Some(c"tmpfs"), c"/tmp", Some(c"tmpfs"), 0, None).is_err()
    {
        return Err(STEP_MOUNT);
    }
    Ok(())
}

/// This process's ids, mapped to themselves: what every probe writes.
fn id_maps() -> (Vec<u8>, Vec<u8>) {
    (
        format!("{0} {0} 1\n", nix::unistd::geteuid()).into_bytes(),
        format!("{0} {0} 1\n", nix::unistd::getegid()).into_bytes(),
    )
}

fn pid_probe() -> Result<(), String> {
    let (uid_map, gid_map) = id_maps();
    // SAFETY: the child and its child make only async-signal-safe system calls (unshare,
    // open, write, mount, mkdir, fork, waitpid, _exit: the wrappers of `crate::sys`) on data
    // prepared before the fork.
    match unsafe { sys::fork() } {
        Ok(ForkResult::Child) => {
            let ok = enter_probe_namespaces(libc::CLONE_NEWPID, &uid_map, &gid_map).is_ok()
                && sys::mkdir(c"/tmp/proc", 0o700).is_ok();
            if !ok {
                sys::exit(100 + (Errno::last() as i32 & 0x1f));
            }
            // The first child is the namespace's pid 1: it mounts the namespace's proc.
            // SAFETY: as above; this child is single-threaded.
            match unsafe { sys::fork() } {
                Ok(ForkResult::Child) => {
                    let mounted = sys::mount(
                        Some(c"proc"),
                        c"/tmp/proc",
                        Some(c"proc"),
                        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RDONLY,
                        None,
                    );
                    sys::exit(match mounted {
                        Ok(()) => 0,
                        Err(errno) => errno as i32 & 0x7f,
                    });
                }
                Ok(ForkResult::Parent { child }) => match sys::waitpid(child.as_raw(), 0) {
                    Ok((pid, status)) if pid == child.as_raw() && libc::WIFEXITED(status) => {
                        sys::exit(libc::WEXITSTATUS(status))
                    }
                    _ => sys::exit(99),
                },
                Err(_) => sys::exit(99),
            }
        }
        Ok(ForkResult::Parent { child }) => match nix::sys::wait::waitpid(child, None) {
            Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
            Ok(nix::sys::wait::WaitStatus::Exited(_, code)) if code >= 100 => Err(format!(
                "a pid namespace cannot be created beside the view's user and mount \
                 namespaces (errno {})",
                code - 100
            )),
            Ok(nix::sys::wait::WaitStatus::Exited(_, code)) => Err(format!(
                "the pid namespace's /proc cannot be mounted ({}): the host's /proc is \
                 not fully visible here (a container masking parts of it)",
                Errno::from_raw(code)
            )),
            other => Err(format!("the pid namespace probe did not finish: {other:?}")),
        },
        Err(e) => Err(format!("could not fork the pid namespace probe: {e}")),
    }
}

/// What the run's child does in its network namespace ([`crate::backends::native::netns`]): the
/// namespace beside the view's, `lo` up, a TCP listener on `127.0.0.1`, and a connection to it.
fn net_probe() -> Result<(), String> {
    let (uid_map, gid_map) = id_maps();
    // SAFETY: the child makes only async-signal-safe system calls (unshare, open, write,
    // mount, socket, ioctl, bind, listen, connect, _exit: the wrappers of `crate::sys`) on
    // data prepared before the fork.
    match unsafe { sys::fork() } {
        Ok(ForkResult::Child) => {
            if enter_probe_namespaces(libc::CLONE_NEWNET, &uid_map, &gid_map).is_err() {
                sys::exit(100 + (Errno::last() as i32 & 0x1f));
            }
            if crate::backends::native::netns::loopback_up().is_err() {
                sys::exit(Errno::last() as i32 & 0x3f);
            }
            let code = match crate::backends::native::netns::listen_loopback(0) {
                Err(errno) => 64 + (errno as i32 & 0x1f),
                Ok((fd, port)) => {
                    if crate::backends::native::netns::connect_loopback(port).is_ok() {
                        0
                    } else {
                        let _ = fd;
                        96
                    }
                }
            };
            sys::exit(code)
        }
        Ok(ForkResult::Parent { child }) => match nix::sys::wait::waitpid(child, None) {
            Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
            Ok(nix::sys::wait::WaitStatus::Exited(_, code)) if code >= 100 => Err(format!(
                "a network namespace cannot be created beside the view's user and mount \
                 namespaces ({})",
                Errno::from_raw(code - 100)
            )),
            Ok(nix::sys::wait::WaitStatus::Exited(_, 96)) => Err(
                "a connection to a listener on 127.0.0.1 inside a new network namespace \
                 failed"
                    .into(),
            ),
            Ok(nix::sys::wait::WaitStatus::Exited(_, code)) if code >= 64 => Err(format!(
                "a TCP listener cannot be bound on 127.0.0.1 inside a new network \
                 namespace ({})",
                Errno::from_raw(code - 64)
            )),
            Ok(nix::sys::wait::WaitStatus::Exited(_, code)) => Err(format!(
                "the loopback interface of a new network namespace cannot be brought up \
                 ({})",
                Errno::from_raw(code)
            )),
            other => Err(format!(
                "the network namespace probe did not finish: {other:?}"
            )),
        },
        Err(e) => Err(format!("could not fork the network namespace probe: {e}")),
    }
}

/// Which step of the probe failed.
const STEP_UNSHARE: u8 = 1;
const STEP_ID_MAP: u8 = 2;
const STEP_MOUNT: u8 = 3;

/// Forks a child that does what the view needs and reports the first failing step.
pub fn probe() -> ViewSupport {
    let Ok((read_end, write_end)) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) else {
        return ViewSupport::Unavailable {
            reason: "could not create the probe's pipe".into(),
        };
    };
    let (uid_map, gid_map) = id_maps();
    // SAFETY: the child only makes system calls on data prepared above (unshare, open,
    // write, mount, _exit: the wrappers of `crate::sys`), all async-signal safe, so forking
    // a multi-threaded process is sound.
    match unsafe { sys::fork() } {
        Ok(ForkResult::Child) => {
            use std::os::fd::AsRawFd;
            if let Err(step) = enter_probe_namespaces(0, &uid_map, &gid_map) {
                let errno = Errno::last() as i32;
                let mut bytes = [0u8; 5];
                bytes[0] = step;
                bytes[1..].copy_from_slice(&errno.to_ne_bytes());
                let _ = sys::write(write_end.as_raw_fd(), &bytes);
                sys::exit(1)
            }
            sys::exit(0)
        }
        Ok(ForkResult::Parent { child }) => {
            drop(write_end);
            let mut bytes = [0u8; 5];
            let n = nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(&read_end), &mut bytes)
                .unwrap_or(0);
            let _ = nix::sys::wait::waitpid(child, None);
            if n != 5 {
                return ViewSupport::Available;
            }
            let errno =
                Errno::from_raw(i32::from_ne_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]));
            let restricted =
                std::fs::read_to_string(APPARMOR_RESTRICT).is_ok_and(|v| v.trim() == "1");
            ViewSupport::Unavailable {
                reason: explain(bytes[0], errno, restricted),
            }
        }
        Err(e) => ViewSupport::Unavailable {
            reason: format!("could not fork the probe: {e}"),
        },
    }
}

/// [`overlay_probe`]'s answer, cached like [`support`] (and keyed on whether the overlay
/// module is loaded: loading it after a refusal is asked anew).
pub fn overlay_support(cache_dir: Option<&Path>) -> Result<(), String> {
    let loaded = if filesystem_registered("overlay") {
        "overlay"
    } else {
        "no overlay"
    };
    cached(cache_dir, OVERLAY_CACHE_FILE, loaded, overlay_probe)
}

/// Whether an overlay with `userxattr` mounts in a new user namespace (Linux 5.11 and later):
/// the git store quarantine's layers are such an overlay. A real mount, in a forked child, on a
/// tmpfs of its own; `Err` says why not.
pub fn overlay_probe() -> Result<(), String> {
    let (uid_map, gid_map) = id_maps();
    // SAFETY: the child makes only async-signal-safe system calls (unshare, open, write,
    // mount, mkdir, _exit: the wrappers of `crate::sys`) on data prepared before the fork.
    match unsafe { sys::fork() } {
        Ok(ForkResult::Child) => {
            let ok = enter_probe_namespaces(0, &uid_map, &gid_map).is_ok()
                && [c"/tmp/l", c"/tmp/u", c"/tmp/w", c"/tmp/m"]
                    .iter()
                    .all(|d| sys::mkdir(d, 0o700).is_ok())
                && sys::mount(
                    Some(c"overlay"),
                    c"/tmp/m",
                    Some(c"overlay"),
                    0,
                    Some(c"lowerdir=/tmp/l,upperdir=/tmp/u,workdir=/tmp/w,userxattr"),
                )
                .is_ok();
            sys::exit(if ok { 0 } else { Errno::last() as i32 & 0x7f })
        }
        Ok(ForkResult::Parent { child }) => match nix::sys::wait::waitpid(child, None) {
            Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
            Ok(nix::sys::wait::WaitStatus::Exited(_, code)) => {
                Err(overlay_refusal(Errno::from_raw(code)))
            }
            other => Err(format!("the overlay probe did not finish: {other:?}")),
        },
        Err(e) => Err(format!("could not fork the overlay probe: {e}")),
    }
}

/// Why the overlay probe's mount failed, and what fixes it: the overlay module not loaded (the
/// kernel does not load it for a mount in a user namespace), a kernel before 5.11, or the
/// error as it is.
fn overlay_refusal(errno: Errno) -> String {
    let remedy = if !filesystem_registered("overlay") {
        "the overlay filesystem is not available: its module is not loaded (`sudo modprobe \
         overlay`, and `echo overlay | sudo tee /etc/modules-load.d/overlay.conf` to keep it \
         after a reboot)"
            .to_string()
    } else if !super::plans::kernel_at_least(5, 11) {
        "Linux 5.11 and later can; use a newer kernel".to_string()
    } else {
        "the kernel refused it".to_string()
    };
    format!(
        "this kernel cannot mount an overlay in a user namespace ({errno}; {remedy}), so the \
         git store quarantine cannot be built"
    )
}

/// Whether `/proc/filesystems` lists `name` (a module not loaded is not listed).
fn filesystem_registered(name: &str) -> bool {
    std::fs::read_to_string("/proc/filesystems").map_or(true, |list| {
        list.lines()
            .any(|line| line.split_whitespace().last() == Some(name))
    })
}

/// Ubuntu's switch (23.10 and later): unprivileged user namespaces get no capabilities unless
/// the program has an AppArmor profile that allows `userns`.
const APPARMOR_RESTRICT: &str = "/proc/sys/kernel/apparmor_restrict_unprivileged_userns";

/// The fix for Ubuntu's restriction, named in every explanation it can cause.
const APPARMOR_FIX: &str = "Ubuntu's AppArmor restriction is on \
     (kernel.apparmor_restrict_unprivileged_userns=1): install the AppArmor profile shipped \
     with sandbox (packaging/apparmor/sandbox, into /etc/apparmor.d/sandbox, then \
     `sudo apparmor_parser -r /etc/apparmor.d/sandbox`; the NixOS module does this), or turn \
     the restriction off for every program with \
     `sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0` (docs/backends.md)";

/// Why the view is unavailable, in terms of the switch to turn. `apparmor_restricted`: the
/// sysctl above reads 1.
fn explain(step: u8, errno: Errno, apparmor_restricted: bool) -> String {
    let denied = matches!(errno, Errno::EPERM | Errno::EACCES);
    if apparmor_restricted && (denied || step == STEP_ID_MAP) {
        return format!("step {} failed ({errno}): {APPARMOR_FIX}", step_name(step));
    }
    match (step, errno) {
        (STEP_UNSHARE, Errno::ENOSPC) => format!(
            "user namespaces are limited to 0 here (user.max_user_namespaces; {errno}); raise \
             it with `sysctl user.max_user_namespaces=15000`"
        ),
        (STEP_UNSHARE, Errno::EPERM) => format!(
            "creating a user namespace is not permitted ({errno}): unprivileged user \
             namespaces are switched off (kernel.unprivileged_userns_clone=0) or refused by \
             a container's policy"
        ),
        (STEP_UNSHARE, _) => format!("unshare(CLONE_NEWUSER | CLONE_NEWNS) failed: {errno}"),
        (STEP_ID_MAP, _) => format!("the new user namespace refused an id map ({errno})"),
        (_, Errno::EPERM) | (_, Errno::EACCES) => format!(
            "a user namespace can be created but has no capabilities to mount ({errno}): \
             an AppArmor or SELinux policy may confine user namespaces here"
        ),
        _ => format!("mounting in a new user namespace failed: {errno}"),
    }
}

fn step_name(step: u8) -> &'static str {
    match step {
        STEP_UNSHARE => "unshare(CLONE_NEWUSER | CLONE_NEWNS)",
        STEP_ID_MAP => "writing the uid/gid map",
        _ => "mounting in the new user namespace",
    }
}

#[cfg(test)]
mod explain_tests {
    use super::*;

    /// The real probe on this machine: where the view is available on Linux 5.11 or later, an
    /// overlay mounts. (In Debian 11's 5.10 guest it fails, and the quarantine is refused
    /// clearly: `cargo xtask guest-test`.)
    #[test]
    fn the_overlay_probe_mounts_where_the_view_is_available() {
        match probe() {
            ViewSupport::Available => {
                let release = nix::sys::utsname::uname().unwrap();
                let release = release.release().to_string_lossy().into_owned();
                let mut v = release
                    .split(['.', '-'])
                    .map(|p| p.parse::<u32>().unwrap_or(0));
                let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
                if (major, minor) >= (5, 11) {
                    assert_eq!(overlay_probe(), Ok(()), "on {release}");
                }
            }
            ViewSupport::Unavailable { reason } => eprintln!("skipped: {reason}"),
        }
    }

    /// The real network namespace probe: where the view is available here, a network
    /// namespace with a loopback listener is too (kernels since 3.8 give one to an
    /// unprivileged user namespace).
    #[test]
    fn the_net_probe_agrees_with_the_view_probe() {
        match probe() {
            ViewSupport::Available => assert_eq!(net_probe(), Ok(())),
            ViewSupport::Unavailable { reason } => eprintln!("skipped: {reason}"),
        }
    }

    #[test]
    fn ubuntus_restriction_is_named_with_its_sysctl_and_fix() {
        for step in [STEP_UNSHARE, STEP_ID_MAP, STEP_MOUNT] {
            let why = explain(step, Errno::EPERM, true);
            assert!(
                why.contains("kernel.apparmor_restrict_unprivileged_userns=1")
                    && why.contains("apparmor_parser -r")
                    && why.contains("packaging/apparmor/sandbox"),
                "{why}"
            );
        }
        // Without the sysctl, the other causes are named instead.
        let why = explain(STEP_UNSHARE, Errno::EPERM, false);
        assert!(why.contains("unprivileged_userns_clone"), "{why}");
        assert!(!why.contains("apparmor_restrict"), "{why}");
        assert!(explain(STEP_UNSHARE, Errno::ENOSPC, true).contains("max_user_namespaces"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A probe's answer is kept while the kernel and the switches are the same, and asked
    /// anew after a reboot or another kernel (the kept key names another boot and release),
    /// or when its extra key differs (the overlay module loaded since).
    #[test]
    fn a_kept_answer_is_asked_anew_when_the_kernel_differs() {
        let t = tempfile::tempdir().unwrap();
        let dir = crate::privdir::ensure("native", &t.path().join("private")).unwrap();
        let calls = std::cell::Cell::new(0);
        let probe = || {
            calls.set(calls.get() + 1);
            Err("refused".to_string())
        };
        assert_eq!(cached(Some(&dir), "t", "", probe), Err("refused".into()));
        assert_eq!(cached(Some(&dir), "t", "", probe), Err("refused".into()));
        assert_eq!(calls.get(), 1, "kept");
        // The same file as another kernel left it.
        let file = dir.join("t");
        let text = std::fs::read_to_string(&file).unwrap();
        let other = text.replace(&crate::privdir::kernel_key(), "another-boot|9.9.9");
        assert_ne!(text, other, "the key names the kernel");
        let (key, value) = other.split_once('\n').unwrap();
        crate::privdir::remember(&dir, "t", key, value);
        assert_eq!(cached(Some(&dir), "t", "", probe), Err("refused".into()));
        assert_eq!(calls.get(), 2, "another kernel: probed again");
        assert_eq!(
            cached(Some(&dir), "t", "overlay", probe),
            Err("refused".into())
        );
        assert_eq!(calls.get(), 3, "another extra key: probed again");
        assert_eq!(
            cached(Some(&dir), "t", "overlay", || Ok(())),
            Err("refused".into())
        );
    }

    #[test]
    fn the_overlay_refusal_names_the_missing_module_or_the_kernel() {
        assert!(filesystem_registered("proc"));
        assert!(!filesystem_registered("no-such-filesystem"));
        let said = overlay_refusal(Errno::ENODEV);
        if filesystem_registered("overlay") {
            assert!(!said.contains("modprobe"), "{said}");
        } else {
            assert!(said.contains("sudo modprobe overlay"), "{said}");
        }
        assert!(
            said.contains("git store quarantine cannot be built"),
            "{said}"
        );
    }
}
