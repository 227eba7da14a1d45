//! The backends that hand the boundary to another program, through the real binary, with
//! real programs: the custom backend with `bwrap` (Debian's bubblewrap) and shell-script
//! launchers, and the nono backend with the pinned nono CLI. Every test judges from outside
//! (files that must or must not exist, exit statuses, what reached stderr).
//!
//! A missing tool is reported as "skipped: …", never a silent pass.

use crate::common;

use std::io::Read as _;
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::escape::Fixture;
use common::text;

const BWRAP: &str = "/usr/bin/bwrap";

fn write_exec(path: &Path, body: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, body).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Sets `backends.custom.command` the way a user does: `sandbox config set`.
fn set_launcher(f: &Fixture, command: &str) {
    let out = f
        .env
        .cmd()
        .args(["config", "set", "backends.custom.command", command])
        .output()
        .unwrap();
    assert!(out.status.success(), "config set: {}", text(&out));
}

/// A directory beside the worktree that nothing grants: where reviewed launchers live.
fn safe_dir(f: &Fixture) -> PathBuf {
    let dir = f.env.path().join("launchers");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A launcher that records that it ran (and its argv, cwd, environment) and then runs the
/// command after `--`, as the contract says.
fn recording_launcher(path: &Path, log_dir: &Path) {
    write_exec(
        path,
        &format!(
            "#!/bin/sh\nlog='{log}'\nmkdir -p \"$log\"\n: > \"$log/launcher-ran\"\n\
             for a in \"$@\"; do printf '%s\\n' \"$a\"; done > \"$log/argv\"\n\
             pwd > \"$log/cwd\"\nenv > \"$log/env\"\n\
             while [ \"$#\" -gt 0 ] && [ \"$1\" != -- ]; do shift; done\nshift\nexec \"$@\"\n",
            log = log_dir.display()
        ),
    );
}

/// `sandbox run --backend custom FLAGS -- sh -c SCRIPT` in the worktree.
fn run_custom(f: &Fixture, flags: &[&str], script: &str) -> Output {
    run_custom_with(f, flags, script, |_| {})
}

fn run_custom_with(
    f: &Fixture,
    flags: &[&str],
    script: &str,
    adjust: impl FnOnce(&mut Command),
) -> Output {
    run_backend_with(f, "custom", flags, script, adjust)
}

/// `sandbox run --backend B FLAGS -- sh -c SCRIPT` in the worktree, after `adjust`.
fn run_backend_with(
    f: &Fixture,
    backend: &str,
    flags: &[&str],
    script: &str,
    adjust: impl FnOnce(&mut Command),
) -> Output {
    let mut cmd = f.env.cmd();
    cmd.current_dir(&f.task)
        .args(["run", "--backend", backend])
        .args(flags)
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::null());
    adjust(&mut cmd);
    cmd.output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

// ---------------------------------------------------------------------------------------------
// custom: a real launcher

#[test]
fn bwrap_as_a_launcher_confines_writes() {
    if !Path::new(BWRAP).exists() {
        common::skip("bwrap", "bwrap not installed (apt-get install bubblewrap)");
        return;
    }
    let f = Fixture::new();
    let task = f.task.display();
    set_launcher(
        &f,
        &format!(
            "{BWRAP} --ro-bind / / --bind {task} {task} --dev /dev --proc /proc --die-with-parent"
        ),
    );
    let outside = f.outside.join("escaped.txt");
    let script = format!(
        "echo made > made-inside; echo \"hint=$SANDBOX_HINT_WORKTREE backend=$SANDBOX_BACKEND\"; \
         echo pwned > '{}' || echo write-refused",
        outside.display()
    );
    let out = run_custom(&f, &[], &script);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(f.task.join("made-inside").exists(), "{}", text(&out));
    assert!(!outside.exists(), "bwrap let the write out: {}", text(&out));
    assert!(stdout.contains("write-refused"), "{}", text(&out));
    assert!(
        stdout.contains(&format!("hint={task} backend=custom")),
        "{}",
        text(&out)
    );

    // The control: without a boundary the same write lands, so the check above can fail.
    let out = f.run("host", &[], &script);
    assert!(outside.exists(), "control did not write: {}", text(&out));
}

#[test]
fn launcher_argv_is_exactly_the_configured_command() {
    let f = Fixture::new();
    let dir = safe_dir(&f);
    let log = f.env.path().join("log");
    let launcher = dir.join("rec-launcher");
    recording_launcher(&launcher, &log);
    set_launcher(
        &f,
        &format!(
            "{} --flag 'two words' '$HOME' '*' ~ \"q'uote\"",
            launcher.display()
        ),
    );
    std::fs::create_dir_all(f.task.join("sub")).unwrap();
    let out = run_custom(&f, &["--cd", "sub"], "echo ran > ran-marker");
    assert!(out.status.success(), "{}", text(&out));
    let argv = std::fs::read_to_string(log.join("argv")).unwrap();
    assert_eq!(
        argv.lines().collect::<Vec<_>>(),
        vec![
            "--flag",
            "two words",
            "$HOME",
            "*",
            "~",
            "q'uote",
            "--",
            "sh",
            "-c",
            "echo ran > ran-marker"
        ],
        "nothing expanded, nothing added but `--` and the command"
    );
    assert_eq!(
        std::fs::read_to_string(log.join("cwd")).unwrap().trim(),
        f.task.join("sub").to_str().unwrap()
    );
    assert!(f.task.join("sub/ran-marker").exists());
    let env = std::fs::read_to_string(log.join("env")).unwrap();
    for want in [
        format!("SANDBOX_HINT_WORKTREE={}", f.task.display()),
        format!("SANDBOX_HINT_CWD={}", f.task.join("sub").display()),
        format!("SANDBOX_HINT_GIT_COMMON_DIR={}", f.common.display()),
        "SANDBOX_HINT_NETWORK=allow".to_string(),
        "SANDBOX_BACKEND=custom".to_string(),
        "PATH=/usr/local/bin:/usr/bin:/bin".to_string(),
    ] {
        assert!(
            env.lines().any(|l| l == want),
            "{want} missing from:\n{env}"
        );
    }
    // HOME is the private home's own path (a launcher has no view to mount it elsewhere),
    // and it is among the writable paths the launcher is told.
    let home = env
        .lines()
        .find_map(|l| l.strip_prefix("HOME="))
        .unwrap_or_else(|| panic!("no HOME in:\n{env}"));
    assert!(
        Path::new(home).starts_with(f.home.join(".local/state/sandbox/homes")),
        "{home}"
    );
    let writes = env
        .lines()
        .find_map(|l| l.strip_prefix("SANDBOX_HINT_WRITE_PATHS="))
        .unwrap();
    assert!(writes.split(':').any(|p| p == f.task.to_str().unwrap()));
    assert!(writes
        .split(':')
        .any(|p| p == f.common.join("objects").to_str().unwrap()));

    // A bare name is resolved on PATH (all absolute) and runs the same way.
    set_launcher(&f, "rec-launcher --bare");
    std::fs::remove_file(log.join("launcher-ran")).unwrap();
    let out = run_custom_with(&f, &[], "true", |c| {
        c.env("PATH", format!("{}:/usr/bin:/bin", dir.display()));
    });
    assert!(out.status.success(), "{}", text(&out));
    assert!(log.join("launcher-ran").exists());
    let argv = std::fs::read_to_string(log.join("argv")).unwrap();
    assert_eq!(argv.lines().next(), Some("--bare"));
}

#[test]
fn a_launcher_that_refuses_stops_the_run() {
    let f = Fixture::new();
    let launcher = safe_dir(&f).join("refuse");
    write_exec(
        &launcher,
        "#!/bin/sh\necho 'launcher: refused: the preflight check failed' >&2\nexit 3\n",
    );
    set_launcher(&f, launcher.to_str().unwrap());
    let out = run_custom(&f, &[], "echo ran > ran-marker");
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let err = stderr(&out);
    assert!(
        err.contains("launcher: refused: the preflight check failed"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "the launcher {} exited with status 3",
            launcher.display()
        )),
        "{err}"
    );
    assert!(
        !err.contains('\x1b'),
        "no colour when stderr is not a terminal: {err:?}"
    );
    assert!(!f.task.join("ran-marker").exists(), "the command ran");
}

/// Runs the refusing launcher with stderr on a pseudo-terminal; returns what it printed.
fn stderr_on_a_terminal(f: &Fixture, no_color: bool) -> String {
    let pty = nix::pty::openpty(None, None).unwrap();
    let mut cmd = f.env.cmd();
    cmd.current_dir(&f.task)
        .args(["run", "--backend", "custom", "--", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(pty.slave.try_clone().unwrap()));
    if no_color {
        cmd.env("NO_COLOR", "1");
    }
    let status = cmd.status().unwrap();
    assert_eq!(status.code(), Some(3));
    drop(pty.slave);
    nix::fcntl::fcntl(
        pty.master.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .unwrap();
    let mut buf = Vec::new();
    let _ = std::fs::File::from(pty.master).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

#[test]
fn a_refusal_is_red_on_a_terminal_unless_no_color() {
    let f = Fixture::new();
    let launcher = safe_dir(&f).join("refuse");
    write_exec(&launcher, "#!/bin/sh\necho 'no.' >&2\nexit 3\n");
    set_launcher(&f, launcher.to_str().unwrap());
    let coloured = stderr_on_a_terminal(&f, false);
    assert!(
        coloured.contains("\x1b[31msandbox: custom: the launcher"),
        "{coloured:?}"
    );
    let plain = stderr_on_a_terminal(&f, true);
    assert!(plain.contains("sandbox: custom: the launcher"), "{plain:?}");
    assert!(!plain.contains('\x1b'), "{plain:?}");
}

// ---------------------------------------------------------------------------------------------
// custom: where the launcher may live

/// Configures `command`, runs, and checks: exit 125, a message containing `why` and saying
/// what to do, and neither the launcher nor the command ran.
fn assert_refused(f: &Fixture, command: &str, flags: &[&str], path: Option<&str>, why: &str) {
    set_launcher(f, command);
    let out = run_custom_with(f, flags, "echo ran > ran-marker", |c| {
        if let Some(path) = path {
            c.env("PATH", path);
        }
    });
    assert_eq!(out.status.code(), Some(125), "{command}: {}", text(&out));
    let err = stderr(&out);
    assert!(err.contains(why), "{command}: expected {why:?} in: {err}");
    assert!(
        err.contains("absolute path") || err.contains("sandbox config set"),
        "{command}: the message must say what to do: {err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one clear line: {err}");
    assert!(
        !f.env.path().join("log/launcher-ran").exists(),
        "{command}: the launcher ran"
    );
    assert!(
        !f.task.join("ran-marker").exists() && !f.task.join("sub/ran-marker").exists(),
        "{command}: the command ran"
    );
}

#[test]
fn a_relative_launcher_path_is_refused() {
    let f = Fixture::new();
    recording_launcher(&f.task.join("bin/launcher"), &f.env.path().join("log"));
    assert_refused(&f, "bin/launcher --x", &[], None, "is a relative path");
    assert_refused(&f, "./bin/launcher", &[], None, "is a relative path");
}

#[test]
fn a_launcher_inside_the_worktree_is_refused() {
    let f = Fixture::new();
    let launcher = f.task.join("tools/launcher");
    recording_launcher(&launcher, &f.env.path().join("log"));
    assert_refused(
        &f,
        launcher.to_str().unwrap(),
        &[],
        None,
        &format!("inside the task worktree {}", f.task.display()),
    );
}

#[test]
fn an_interpreter_running_a_script_from_the_worktree_is_refused() {
    let f = Fixture::new();
    // The program (/bin/sh) is fine; the script it would run is the agent's to edit.
    recording_launcher(&f.task.join("launch.sh"), &f.env.path().join("log"));
    assert_refused(
        &f,
        "/bin/sh launch.sh",
        &[],
        None,
        &format!("which is inside the task worktree {}", f.task.display()),
    );
    let absolute = format!("/bin/sh {}", f.task.join("launch.sh").display());
    assert_refused(&f, &absolute, &[], None, "refusing the launcher argument");
    // The same script from a reviewed place outside runs, with the worktree named as a
    // directory argument (as bwrap's binds do).
    let reviewed = safe_dir(&f).join("launch.sh");
    recording_launcher(&reviewed, &f.env.path().join("log"));
    set_launcher(
        &f,
        &format!("/bin/sh {} {}", reviewed.display(), f.task.display()),
    );
    let out = run_custom(&f, &[], "echo ran > ran-marker");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(f.task.join("ran-marker").exists());
}

#[test]
fn a_launcher_inside_the_spawn_directory_is_refused() {
    let f = Fixture::new();
    let launcher = f.task.join("sub/launcher");
    recording_launcher(&launcher, &f.env.path().join("log"));
    assert_refused(
        &f,
        launcher.to_str().unwrap(),
        &["--cd", "sub"],
        None,
        &format!(
            "inside the spawn directory {}",
            f.task.join("sub").display()
        ),
    );
}

#[test]
fn a_launcher_inside_a_writable_grant_is_refused() {
    let f = Fixture::new();
    let grant = f.env.path().join("shared-cache");
    let launcher = grant.join("launcher");
    recording_launcher(&launcher, &f.env.path().join("log"));
    assert_refused(
        &f,
        launcher.to_str().unwrap(),
        &["--allow-write", grant.to_str().unwrap()],
        None,
        &format!("inside {}, which the sandbox may write", grant.display()),
    );
    // The same launcher is fine when the folder is not granted: the refusal is the grant's.
    set_launcher(&f, launcher.to_str().unwrap());
    let out = run_custom(&f, &[], "true");
    assert!(out.status.success(), "{}", text(&out));
    assert!(f.env.path().join("log/launcher-ran").exists());
}

#[test]
fn a_symlink_into_the_worktree_is_refused() {
    let f = Fixture::new();
    let real = f.task.join("launcher");
    recording_launcher(&real, &f.env.path().join("log"));
    let link = safe_dir(&f).join("launcher");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    assert_refused(
        &f,
        link.to_str().unwrap(),
        &[],
        None,
        &format!("inside the task worktree {}", f.task.display()),
    );
}

#[test]
fn a_bare_name_resolving_into_the_worktree_is_refused() {
    let f = Fixture::new();
    let bin = f.task.join("bin");
    recording_launcher(&bin.join("my-launcher"), &f.env.path().join("log"));
    let path = format!("{}:/usr/bin:/bin", bin.display());
    assert_refused(
        &f,
        "my-launcher --strict",
        &[],
        Some(&path),
        &format!("inside the task worktree {}", f.task.display()),
    );
}

#[test]
fn a_bare_name_with_a_relative_path_entry_is_refused() {
    let f = Fixture::new();
    recording_launcher(&safe_dir(&f).join("my-launcher"), &f.env.path().join("log"));
    let path = format!("bin:{}:/usr/bin:/bin", safe_dir(&f).display());
    assert_refused(&f, "my-launcher", &[], Some(&path), "relative entry");
}

#[test]
fn no_launcher_configured_is_refused() {
    let f = Fixture::new();
    let out = run_custom(&f, &[], "echo ran > ran-marker");
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        stderr(&out).contains("no launcher is configured"),
        "{}",
        text(&out)
    );
    assert!(!f.task.join("ran-marker").exists());
}

// ---------------------------------------------------------------------------------------------
// custom: the sandbox cannot change its own launcher

#[test]
fn a_sandboxed_command_cannot_change_the_launcher() {
    let f = Fixture::new();
    let log = f.env.path().join("log");
    let launcher = safe_dir(&f).join("reviewed-launcher");
    recording_launcher(&launcher, &log);
    set_launcher(&f, launcher.to_str().unwrap());
    let config = f.env.config_file();
    let before = std::fs::read_to_string(&config).unwrap();
    let profile = f.home.join(".profile");
    let profile_before = std::fs::read(&profile).ok();

    let bin = std::fs::canonicalize(common::BIN).unwrap();
    let bin_dir = bin.parent().unwrap();
    let evil = f.task.join("evil-launcher");
    write_exec(
        &evil,
        "#!/bin/sh\n: > \"$(dirname \"$0\")/EVIL-RAN\"\nshift\nexec \"$@\"\n",
    );
    let script = format!(
        "sb='{bin}'\n\
         \"$sb\" config set backends.custom.command '{evil}' && echo CONFIG-SET\n\
         printf 'backends: {{custom: {{command: {evil}}}}}\\n' > \"$HOME/.config/sandbox/config.yaml\" && echo FILE-WRITTEN\n\
         printf 'export SANDBOX_NONO={evil}\\nexport XDG_CONFIG_HOME={task}/cfg\\n' >> \"$HOME/.profile\" && echo PROFILE-WRITTEN\n\
         mkdir -p cfg/sandbox && printf 'backends: {{custom: {{command: {evil}}}}}\\n' > cfg/sandbox/config.yaml\n\
         XDG_CONFIG_HOME=\"$PWD/cfg\" \"$sb\" run --backend custom -- true; echo nested-status=$?\n\
         echo attempted",
        bin = bin.display(),
        evil = evil.display(),
        task = f.task.display(),
    );
    let out = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args([
            "run",
            "--backend",
            "native",
            "--allow-read",
            bin_dir.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("attempted"), "{}", text(&out));
    // `sandbox config set` and the writes to `$HOME` land in the run's private home (its
    // `.config`, its `.profile`), never in the user's: judged on the host, below.
    // The nested run with a configuration the sandbox wrote is refused, and says why.
    assert!(stdout.contains("nested-status=125"), "{}", text(&out));
    // Refused either because the configuration lies where the sandbox can write, or because
    // the launcher it names does.
    assert!(
        stderr(&out).contains("your sandbox configuration")
            || stderr(&out).contains("a file the sandbox can write"),
        "{}",
        text(&out)
    );
    assert!(!f.task.join("EVIL-RAN").exists());
    assert_eq!(std::fs::read_to_string(&config).unwrap(), before);
    assert_eq!(
        std::fs::read(&profile).ok(),
        profile_before,
        "the user's .profile changed"
    );

    // On the host, the next spawn still uses the reviewed launcher.
    let out = f
        .env
        .cmd()
        .args(["config", "get", "backends.custom.command"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        launcher.to_str().unwrap()
    );
    let out = run_custom(&f, &[], "true");
    assert!(out.status.success(), "{}", text(&out));
    assert!(log.join("launcher-ran").exists());
    assert!(!f.task.join("EVIL-RAN").exists());
}

// ---------------------------------------------------------------------------------------------
// nono

fn nono_or_skip() -> Option<PathBuf> {
    let found = common::nono_path();
    if found.is_none() {
        common::skip("nono", common::NONO_MISSING);
    }
    found
}

fn run_nono(f: &Fixture, flags: &[&str], script: &str) -> Output {
    run_nono_with(f, flags, script, |_| {})
}

fn run_nono_with(
    f: &Fixture,
    flags: &[&str],
    script: &str,
    adjust: impl FnOnce(&mut Command),
) -> Output {
    run_backend_with(f, "nono", flags, script, adjust)
}

#[test]
fn nono_runs_the_command_in_place_with_its_own_exit_status() {
    if nono_or_skip().is_none() {
        return;
    }
    let f = Fixture::new();
    let outside = f.outside.join("nono-escape.txt");
    let out = run_nono(
        &f,
        &[],
        &format!(
            "echo made > made-inside && git add made-inside && git commit -qm nono && \
             echo \"backend=$SANDBOX_BACKEND\"; echo pwned > '{}'; exit 3",
            outside.display()
        ),
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(f.task.join("made-inside").exists(), "{}", text(&out));
    assert!(!outside.exists(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("backend=nono"));
    // The commit landed on the task branch.
    let log = Command::new("git")
        .args(["log", "-1", "--format=%s", "feature"])
        .current_dir(&f.main)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&log.stdout).trim(), "nono");
    // The command's own 1 and 126 are its own, not nono's failure.
    for code in [1, 126] {
        let out = run_nono(&f, &[], &format!("exit {code}"));
        assert_eq!(out.status.code(), Some(code), "{}", text(&out));
        assert!(!stderr(&out).contains("nono could not"), "{}", text(&out));
    }
    // Not found is 127, before anything starts.
    let out = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args(["run", "--backend", "nono", "--", "no-such-command-here"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127), "{}", text(&out));
}

#[test]
fn a_nono_setup_failure_is_125_with_its_message() {
    if nono_or_skip().is_none() {
        return;
    }
    let f = Fixture::new();
    // nono itself refuses to grant its own state directory: a real setup failure.
    let state = f.home.join(".nono");
    std::fs::create_dir_all(&state).unwrap();
    let out = run_nono(
        &f,
        &["--allow-read", state.to_str().unwrap()],
        "echo ran > ran-marker; exit 1",
    );
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("nono: "), "nono's own message: {err}");
    assert!(err.contains("protected nono state root"), "{err}");
    assert!(
        err.contains("sandbox: nono: nono could not set up the sandbox"),
        "{err}"
    );
    assert!(!f.task.join("ran-marker").exists());

    // The same under `nono run` (a domain allow-list keeps nono as the proxy's parent), where
    // the start mark is a file rather than a descriptor.
    let out = run_nono(
        &f,
        &[
            "--allow-read",
            state.to_str().unwrap(),
            "--allow-domain",
            "localhost",
        ],
        "echo ran > ran-marker; exit 1",
    );
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(stderr(&out).contains("`nono run` exited"), "{}", text(&out));
    assert!(!f.task.join("ran-marker").exists());
    // …and there, too, the command's own status is its own.
    for code in [0, 1, 126] {
        let out = run_nono(
            &f,
            &["--allow-domain", "localhost"],
            &format!("exit {code}"),
        );
        assert_eq!(out.status.code(), Some(code), "{}", text(&out));
    }
}

#[test]
fn a_missing_or_too_old_nono_is_125_with_install_instructions() {
    if nono_or_skip().is_none() {
        return;
    }
    let f = Fixture::new();
    let missing = f.env.path().join("no-nono-here");
    let out = run_nono_with(&f, &[], "echo ran > ran-marker", |c| {
        c.env("SANDBOX_NONO", &missing);
    });
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        stderr(&out).contains("cargo install nono-cli --no-default-features"),
        "{}",
        text(&out)
    );
    // An older nono: a program that answers --version like nono 0.80.0 and would otherwise
    // run the command unconfined — it must never be started for a run.
    let old = safe_dir(&f).join("nono");
    write_exec(
        &old,
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'nono 0.80.0'; exit 0; fi\n\
         while [ \"$1\" != -- ]; do shift; done; shift; exec \"$@\"\n",
    );
    let out = run_nono_with(&f, &[], "echo ran > ran-marker", |c| {
        c.env("SANDBOX_NONO", &old);
    });
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    let err = stderr(&out);
    assert!(
        err.contains("nono 0.80.0") && err.contains("0.81.0"),
        "{err}"
    );
    assert!(
        err.contains("cargo install nono-cli --no-default-features"),
        "{err}"
    );
    assert!(!f.task.join("ran-marker").exists());
}

#[test]
fn a_nono_the_sandbox_could_replace_is_refused() {
    let Some(nono) = nono_or_skip() else {
        return;
    };
    let f = Fixture::new();
    let planted = f.task.join("bin/nono");
    std::fs::create_dir_all(planted.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(std::fs::canonicalize(nono).unwrap(), &planted).unwrap();
    let out = run_nono_with(&f, &[], "echo ran > ran-marker", |c| {
        c.env("SANDBOX_NONO", &planted);
    });
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        stderr(&out).contains("refusing to run nono"),
        "{}",
        text(&out)
    );
    assert!(!f.task.join("ran-marker").exists());
}

#[test]
fn nono_variables_cannot_widen_the_boundary() {
    if nono_or_skip().is_none() {
        return;
    }
    let f = Fixture::new();
    let outside = f.outside.join("via-nono-env.txt");
    let out = run_nono(
        &f,
        &["--env", "NONO_ALLOW=/", "--env", "NONO_PROFILE=default"],
        &format!("echo pwned > '{}'; echo attempted", outside.display()),
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("attempted"),
        "{}",
        text(&out)
    );
    assert!(!outside.exists(), "{}", text(&out));
}

/// A one-request-at-a-time HTTP server on loopback answering `hello from <port>`.
fn http_server() -> (u16, std::thread::JoinHandle<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let handle = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            match listener.accept() {
                Ok((mut s, _)) => {
                    use std::io::Write as _;
                    s.set_nonblocking(false).unwrap();
                    let mut buf = [0u8; 4096];
                    let _ = std::io::Read::read(&mut s, &mut buf);
                    let body = format!("hello from {port}");
                    let _ = write!(
                        s,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        }
    });
    (port, handle)
}

#[test]
fn nono_domain_allow_list_goes_through_its_proxy() {
    if nono_or_skip().is_none() {
        return;
    }
    if !Path::new("/usr/bin/python3").exists() {
        common::skip("python3", "/usr/bin/python3 missing");
        return;
    }
    let f = Fixture::new();
    let (port, _server) = http_server();
    // Through the proxy (nono sets HTTP_PROXY; its NO_PROXY would send localhost around it,
    // so it is dropped here): the allowed host answers, another is refused. Directly, the
    // port is closed: only the proxy leads out.
    let py = format!(
        "import os, urllib.request as u\n\
         for v in ('no_proxy', 'NO_PROXY'): os.environ.pop(v, None)\n\
         p = u.build_opener(u.ProxyHandler({{'http': os.environ['HTTP_PROXY']}}))\n\
         d = u.build_opener(u.ProxyHandler({{}}))\n\
         def get(o, url):\n\
         \x20   try: return o.open(url, timeout=5).read().decode()\n\
         \x20   except Exception as e: return 'refused: %s' % e\n\
         print('allowed:', get(p, 'http://localhost:{port}/'))\n\
         print('other:', get(p, 'http://not-allowed.invalid:{port}/'))\n\
         print('direct:', get(d, 'http://127.0.0.1:{port}/'))\n"
    );
    let out = run_nono_with(
        &f,
        &["--allow-domain", "localhost", "--env", "PY"],
        "/usr/bin/python3 -c \"$PY\"",
        |c| {
            c.env("PY", &py);
        },
    );
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("allowed: hello from {port}")),
        "{}",
        text(&out)
    );
    assert!(stdout.contains("other: refused"), "{}", text(&out));
    assert!(stdout.contains("direct: refused"), "{}", text(&out));
}

#[test]
fn domain_allow_lists_are_refused_where_they_cannot_be_enforced() {
    let f = Fixture::new();
    let launcher = safe_dir(&f).join("launcher");
    recording_launcher(&launcher, &f.env.path().join("log"));
    set_launcher(&f, launcher.to_str().unwrap());
    // (The native backend enforces one through its network namespace: tests/cli/net.rs.)
    for backend in ["custom", "host"] {
        let out = f
            .env
            .cmd()
            .current_dir(&f.task)
            .args([
                "run",
                "--backend",
                backend,
                "--allow-domain",
                "crates.io",
                "--",
                "sh",
                "-c",
                "echo ran > ran-marker",
            ])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(125), "{backend}: {}", text(&out));
        assert!(
            stderr(&out).contains("cannot enforce a domain allow-list"),
            "{backend}: {}",
            text(&out)
        );
        assert!(!f.task.join("ran-marker").exists(), "{backend}");
    }
    assert!(!f.env.path().join("log/launcher-ran").exists());
    // The configuration's allow-list counts too.
    f.env
        .write_config("network:\n  allow_domains: [crates.io]\n");
    let out = f
        .env
        .cmd()
        .current_dir(&f.task)
        .args(["run", "--backend", "custom", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
}
