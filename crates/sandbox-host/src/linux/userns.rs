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

/// Everything the probe's answer depends on that a run can read without forking.
fn key() -> String {
    let ns = std::fs::read_link("/proc/self/ns/user")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    format!(
        "v1|{}|{}|{}|{}|{}|{}|{}|{}",
        read("/proc/sys/kernel/random/boot_id"),
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
    let key = key();
    let cache = cache_dir.map(|d| d.join(CACHE_FILE));
    if let Some(cache) = &cache {
        if let Ok(text) = std::fs::read_to_string(cache) {
            if let Some((k, v)) = text.split_once('\n') {
                if k == key {
                    return if v.is_empty() {
                        ViewSupport::Available
                    } else {
                        ViewSupport::Unavailable {
                            reason: v.to_string(),
                        }
                    };
                }
            }
        }
    }
    let answer = probe();
    if let Some(cache) = &cache {
        let value = match &answer {
            ViewSupport::Available => String::new(),
            ViewSupport::Unavailable { reason } => reason.replace('\n', " "),
        };
        let tmp = cache.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, format!("{key}\n{value}")).is_ok() {
            let _ = std::fs::rename(&tmp, cache);
        }
    }
    answer
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
    let uid_map = format!("{0} {0} 1\n", nix::unistd::geteuid()).into_bytes();
    let gid_map = format!("{0} {0} 1\n", nix::unistd::getegid()).into_bytes();
    // SAFETY: the child only makes system calls on data prepared above (unshare, open,
    // write, mount, _exit), all async-signal safe, so forking a multi-threaded process is
    // sound.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            use std::os::fd::AsRawFd;
            let report = |step: u8| -> ! {
                let errno = Errno::last() as i32;
                let mut bytes = [0u8; 5];
                bytes[0] = step;
                bytes[1..].copy_from_slice(&errno.to_ne_bytes());
                // SAFETY: write(2) of a stack buffer to the pipe, then _exit(2).
                unsafe {
                    libc::write(write_end.as_raw_fd(), bytes.as_ptr().cast(), bytes.len());
                    libc::_exit(1)
                }
            };
            // SAFETY: as above; every call takes flags or NUL-terminated constants.
            unsafe {
                if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
                    report(STEP_UNSHARE);
                }
                for (path, data) in [
                    (c"/proc/self/setgroups", &b"deny"[..]),
                    (c"/proc/self/uid_map", &uid_map[..]),
                    (c"/proc/self/gid_map", &gid_map[..]),
                ] {
                    if crate::linux::view::write_file(path, data).is_err() {
                        report(STEP_ID_MAP);
                    }
                }
                if libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
                    || libc::mount(
                        c"tmpfs".as_ptr(),
                        c"/tmp".as_ptr(),
                        c"tmpfs".as_ptr(),
                        0,
                        std::ptr::null(),
                    ) != 0
                {
                    report(STEP_MOUNT);
                }
                libc::_exit(0)
            }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
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

/// Whether an overlay with `userxattr` mounts in a new user namespace (Linux 5.11 and later):
/// the git store quarantine's layers are such an overlay. A real mount, in a forked child, on a
/// tmpfs of its own; `Err` says why not.
pub fn overlay_probe() -> Result<(), String> {
    let uid_map = format!("{0} {0} 1\n", nix::unistd::geteuid()).into_bytes();
    let gid_map = format!("{0} {0} 1\n", nix::unistd::getegid()).into_bytes();
    // SAFETY: the child makes only async-signal-safe system calls (unshare, open, write,
    // mount, mkdir, _exit) on data prepared before the fork.
    match unsafe { nix::unistd::fork() } {
        // SAFETY: as above; every pointer is a NUL-terminated constant or a prepared buffer.
        Ok(nix::unistd::ForkResult::Child) => unsafe {
            let ok = libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) == 0
                && crate::linux::view::write_file(c"/proc/self/setgroups", b"deny").is_ok()
                && crate::linux::view::write_file(c"/proc/self/uid_map", &uid_map).is_ok()
                && crate::linux::view::write_file(c"/proc/self/gid_map", &gid_map).is_ok()
                && libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) == 0
                && libc::mount(
                    c"tmpfs".as_ptr(),
                    c"/tmp".as_ptr(),
                    c"tmpfs".as_ptr(),
                    0,
                    std::ptr::null(),
                ) == 0
                && [c"/tmp/l", c"/tmp/u", c"/tmp/w", c"/tmp/m"]
                    .iter()
                    .all(|d| libc::mkdir(d.as_ptr(), 0o700) == 0)
                && libc::mount(
                    c"overlay".as_ptr(),
                    c"/tmp/m".as_ptr(),
                    c"overlay".as_ptr(),
                    0,
                    c"lowerdir=/tmp/l,upperdir=/tmp/u,workdir=/tmp/w,userxattr"
                        .as_ptr()
                        .cast(),
                ) == 0;
            libc::_exit(if ok { 0 } else { Errno::last() as i32 & 0x7f })
        },
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            match nix::sys::wait::waitpid(child, None) {
                Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
                Ok(nix::sys::wait::WaitStatus::Exited(_, code)) => Err(format!(
                    "this kernel cannot mount an overlay in a user namespace ({}; Linux 5.11 \
                     and later can), so the git store quarantine cannot be built",
                    Errno::from_raw(code)
                )),
                other => Err(format!("the overlay probe did not finish: {other:?}")),
            }
        }
        Err(e) => Err(format!("could not fork the overlay probe: {e}")),
    }
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
