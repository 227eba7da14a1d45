//! What a run keeps between runs of a project instead of redoing it: the search of the
//! toolchains' trees for credential files, and the mount points of the private home. Each is
//! redone when what it summarises changes: a toolchain added to `PATH` is searched (its
//! credential file left out, with the host backend as the control that the file is there to
//! read), a credential file put into a searched tree is left out by the next run, a package
//! cache created is layered by the next run, and a mount point the next run does not need is
//! gone from its view. (The kernel's answers, keyed on the boot and the release: the unit
//! tests of `sandbox-host`'s `privdir` and `userns`.)

use std::path::Path;
use std::process::{Output, Stdio};

use crate::common::{self, skip, text, Env};
use crate::home::has_view;

/// `sandbox run [--backend backend] -- sh -c script` with `PATH` leading with `tools`.
fn run(env: &Env, backend: Option<&str>, tools: &[&Path], script: &str) -> Output {
    let mut path: Vec<String> = tools.iter().map(|t| t.display().to_string()).collect();
    path.push("/usr/local/bin:/usr/bin:/bin".into());
    let mut cmd = env.cmd();
    cmd.env("PATH", path.join(":")).arg("run");
    if let Some(backend) = backend {
        cmd.args(["--backend", backend]);
    }
    cmd.args(["--", "sh", "-c", script])
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn tool_dir(env: &Env, name: &str) -> std::path::PathBuf {
    let dir = env.path().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tool"), "tool\n").unwrap();
    dir
}

#[test]
fn a_toolchain_added_to_path_or_a_credential_file_added_to_one_is_left_out() {
    let env = Env::new();
    if !has_view(&env) {
        skip(
            "no-view",
            "no private view here: toolchains are not mounted",
        );
        return;
    }
    let first = tool_dir(&env, "tools-first");
    let out = run(
        &env,
        None,
        &[&first],
        &format!("cat {}/tool", first.display()),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // The search is kept in the state directory, the host's alone.
    let kept = env.home().join(".local/state/sandbox/toolchain-scan");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&kept).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "{}", kept.display());

    // A second toolchain on PATH, with a credential file.
    let second = tool_dir(&env, "tools-second");
    std::fs::write(
        second.join(".netrc"),
        "machine example.com password hunter2\n",
    )
    .unwrap();
    // And one put into the first, which an earlier run searched.
    std::fs::write(
        first.join(".npmrc"),
        "//registry.npmjs.org/:_authToken=npm_x\n",
    )
    .unwrap();
    let script = format!(
        "cat {0}/tool {1}/tool; cat {1}/.netrc {0}/.npmrc 2>/dev/null; echo done",
        first.display(),
        second.display()
    );
    let control = run(&env, Some("host"), &[&first, &second], &script);
    let control = String::from_utf8_lossy(&control.stdout).into_owned();
    assert!(
        control.contains("hunter2") && control.contains("npm_x"),
        "the host backend reads both: {control}"
    );
    let out = run(&env, None, &[&first, &second], &script);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let seen = String::from_utf8_lossy(&out.stdout);
    assert_eq!(seen, "tool\ntool\ndone\n", "{}", text(&out));
}

#[test]
fn a_cache_created_is_layered_and_a_mount_point_no_longer_needed_is_gone() {
    let env = Env::new();
    if !has_view(&env) {
        skip("no-view", "no private view here: no cache overlays");
        return;
    }
    let out = run(
        &env,
        None,
        &[],
        "test -e ~/.cache/uv && echo present; echo ok",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "ok\n",
        "{}",
        text(&out)
    );
    // The mount points stay for the next run, on the home's record.
    let state = env.home().join(".local/state/sandbox");
    let homes: Vec<_> = std::fs::read_dir(state.join("homes"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().unwrap().is_dir())
        .collect();
    assert_eq!(homes.len(), 1);
    let private = homes[0].path();
    assert!(private.join(".npm").is_dir(), "kept between runs");
    assert!(common::leftovers(&state).is_empty());

    // A cache the user starts using: the next run layers it.
    let uv = env.home().join(".cache/uv");
    std::fs::create_dir_all(&uv).unwrap();
    std::fs::write(uv.join("seen"), "from the host\n").unwrap();
    let out = run(
        &env,
        None,
        &[],
        "cat ~/.cache/uv/seen && echo run > ~/.cache/uv/made",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from the host\n");
    assert!(!uv.join("made").exists(), "the user's cache was written");

    // A run that layers no cache: none of the caches' mount points shows in its home.
    env.write_config("caches: false\n");
    let out = run(&env, None, &[], "ls -A ~");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let listed = String::from_utf8_lossy(&out.stdout);
    for name in [".npm", ".cargo", ".cache"] {
        assert!(
            !listed.lines().any(|l| l == name),
            "{name} in the home: {listed}"
        );
    }
    assert!(common::leftovers(&state).is_empty());
}
