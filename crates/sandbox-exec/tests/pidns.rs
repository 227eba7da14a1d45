//! The pid namespace's init from the command's side, with no Landlock (the kernels without it,
//! where init's own protections are all there is): the command cannot read init's memory or
//! environment through its `/proc/1`. When init shared the caller's memory (`CLONE_VM`), the
//! command — the same user, with the same capabilities in the run's user namespace — read the
//! caller's environment there; now init's memory is its own copy, non-dumpable and owned by
//! the host's user namespace, where the command has no `CAP_SYS_PTRACE`.

// A panic is how a test reports failure; the workspace lints against unwrap/expect apply to
// shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use sandbox_exec::{
    spawn_direct, ChildSetup, CommandSpec, ExitOutcome, SetupFailure, SetupStep, SignalPipe,
    SpawnOptions,
};

/// A user, mount and pid namespace, the namespace's own `/proc`, and nothing else: no
/// Landlock, no seccomp, no capability dropped.
struct BareNamespaces {
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
}

fn write_file(path: &std::ffi::CStr, data: &[u8]) -> Result<(), SetupFailure> {
    // SAFETY: open(2) of a NUL-terminated path; write(2) and close(2) of the descriptor it
    // returned, reading `data`. Async-signal safe.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(SetupFailure::last(SetupStep::IdMap));
        }
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        libc::close(fd);
        if n != data.len() as isize {
            return Err(SetupFailure::last(SetupStep::IdMap));
        }
    }
    Ok(())
}

impl ChildSetup for BareNamespaces {
    fn apply_in_child(&self) -> Result<(), SetupFailure> {
        // SAFETY: unshare(2) and mount(2) with constant flags and NUL-terminated strings.
        unsafe {
            if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID) != 0 {
                return Err(SetupFailure::last(SetupStep::UserNamespace));
            }
            write_file(c"/proc/self/setgroups", b"deny")?;
            write_file(c"/proc/self/uid_map", &self.uid_map)?;
            write_file(c"/proc/self/gid_map", &self.gid_map)?;
            let private = libc::MS_REC | libc::MS_PRIVATE;
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                private,
                std::ptr::null(),
            ) != 0
            {
                return Err(SetupFailure::last(SetupStep::ViewMount));
            }
        }
        Ok(())
    }

    fn apply_in_namespace(&self) -> Result<(), SetupFailure> {
        // SAFETY: mount(2) of a new proc instance on /proc, NUL-terminated strings.
        let rc = unsafe {
            libc::mount(
                c"proc".as_ptr(),
                c"/proc".as_ptr(),
                c"proc".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(SetupFailure::last(SetupStep::ProcMount));
        }
        Ok(())
    }

    fn name(&self) -> &str {
        "bare namespaces"
    }

    fn user_namespace(&self) -> bool {
        true
    }

    fn pid_namespace(&self) -> bool {
        true
    }
}

/// Reads init's environment and memory, and its own environment as the control that `/proc`
/// is there and readable where the kernel allows.
const PEEK: &str = r#"
cat /proc/self/environ > self-environ; echo $? > self-rc
cat /proc/1/environ > init-environ; echo $? > environ-rc
head -c 1 /proc/1/mem > /dev/null; echo $? > mem-rc
cat /proc/1/status | grep -E '^(Name|Pid):' > init-status
"#;

#[test]
fn the_command_cannot_read_inits_memory_or_environment_without_landlock() {
    if !sandbox_exec::pid_namespace_supported() {
        return sandbox_testkit::skip("userns", "no pid namespace split on this platform");
    }
    let dir = tempfile::tempdir().unwrap();
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    let setup = BareNamespaces {
        uid_map: format!("{uid} {uid} 1\n").into_bytes(),
        gid_map: format!("{gid} {gid} 1\n").into_bytes(),
    };
    let mut spec = CommandSpec::argv(["/bin/sh", "-c", PEEK], dir.path()).unwrap();
    spec.set_env("PATH", "/usr/bin:/bin");
    spec.set_env("SANDBOX_TEST_MARK", "in-the-command");
    let options = SpawnOptions {
        setup: Some(Arc::new(setup)),
        ..SpawnOptions::default()
    };
    let relay = SignalPipe::install().unwrap();
    let mut child = match spawn_direct(&spec, options) {
        Ok(child) => child,
        Err(e) if e.to_string().contains("unshare") => {
            return sandbox_testkit::skip("userns", format_args!("no user namespace: {e}"));
        }
        Err(e) => panic!("{e}"),
    };
    assert_eq!(child.wait_relaying(&relay).unwrap(), ExitOutcome::Exited(0));
    let read = |name: &str| std::fs::read_to_string(Path::new(dir.path()).join(name)).unwrap();
    // The control: the command reads its own environment through the namespace's /proc, and
    // pid 1 there is init (not a host process).
    assert_eq!(read("self-rc").trim(), "0");
    assert!(read("self-environ").contains("SANDBOX_TEST_MARK=in-the-command"));
    assert!(
        read("init-status").contains("Pid:\t1"),
        "{}",
        read("init-status")
    );
    // Init's environment (a copy of its caller's: this test's) and memory stay closed.
    assert_ne!(read("environ-rc").trim(), "0", "{}", read("init-environ"));
    assert_eq!(read("init-environ"), "");
    assert_ne!(read("mem-rc").trim(), "0");
}
