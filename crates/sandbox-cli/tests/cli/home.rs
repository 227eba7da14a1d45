//! The private home with real tools and real registries (crates.io, npm, PyPI): in a fresh
//! linked worktree, with no flags, `cargo build`/`cargo test`, `npm install`/`npm test` and a
//! venv with `pip install`/`pytest` work, twice (the second run, in another worktree under
//! `home: per-project`, reuses the project's cache layer and downloads nothing), and the
//! user's caches and toolchains are byte-identical afterwards. The "user" is the test's own
//! home (`Env`), with caches of its own; the rust toolchain is the machine's rustup, put on
//! that user's `PATH` the way rustup does.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{skip, text, Env};

/// The machine's rustup: (`RUSTUP_HOME`, the dir holding the `cargo` proxy).
fn machine_rustup() -> Option<(PathBuf, PathBuf)> {
    let home = PathBuf::from(std::env::var_os("HOME")?);
    let rustup = std::env::var_os("RUSTUP_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".rustup"));
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".cargo"));
    let bin = cargo_home.join("bin");
    (rustup.join("toolchains").is_dir() && bin.join("cargo").is_file()).then_some((rustup, bin))
}

/// The test user's environment for a tool run on the host or through `sandbox`: their home,
/// the machine's rustup on their `PATH`.
fn user_env(cmd: &mut Command, env: &Env, rustup: &Path, bin: &Path) {
    cmd.env(
        "PATH",
        format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display()),
    )
    .env("RUSTUP_HOME", rustup)
    .env("HOME", env.home())
    .env("CARGO_TERM_COLOR", "never");
}

/// A repository with a linked worktree per name, under the test's work dir.
pub(crate) fn worktrees(env: &Env, names: &[&str]) -> Vec<PathBuf> {
    let main = env.work().join("main");
    let trees: Vec<PathBuf> = names.iter().map(|name| env.work().join(name)).collect();
    sandbox_testkit::linked_worktree_on(&main, &trees[0], "main", names[0]);
    for (name, tree) in names.iter().zip(&trees).skip(1) {
        sandbox_testkit::add_worktree(&main, tree, name);
    }
    trees
}

/// Every entry under `dir`, with its type, mode and content (files) or target (links): equal
/// maps mean byte-identical trees.
fn tree(dir: &Path) -> BTreeMap<PathBuf, String> {
    use sha2::Digest as _;
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.map(Result::unwrap) {
            let path = e.path();
            let m = std::fs::symlink_metadata(&path).unwrap();
            let mode = m.permissions().mode();
            let what = if m.file_type().is_symlink() {
                format!(
                    "link {:o} {}",
                    mode,
                    std::fs::read_link(&path).unwrap().display()
                )
            } else if m.is_dir() {
                stack.push(path.clone());
                format!("dir {mode:o}")
            } else {
                let bytes = std::fs::read(&path).unwrap();
                format!("file {mode:o} {:x}", sha2::Sha256::digest(&bytes))
            };
            out.insert(path.strip_prefix(dir).unwrap().to_path_buf(), what);
        }
    }
    out
}

/// The metadata of every entry under a large toolchain tree (rustup's), cheaper than its
/// content: size, mode and modification time each.
fn tree_stat(dir: &Path) -> BTreeMap<PathBuf, (u64, u32, i64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.map(Result::unwrap) {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                stack.push(e.path());
            }
            out.insert(
                e.path(),
                (
                    m.size(),
                    m.mode(),
                    m.mtime_nsec() + m.mtime() * 1_000_000_000,
                ),
            );
        }
    }
    out
}

fn sandbox(
    env: &Env,
    dir: &Path,
    rustup: &Path,
    bin: &Path,
    args: &[&str],
) -> std::process::Output {
    let mut cmd = env.cmd();
    user_env(&mut cmd, env, rustup, bin);
    cmd.current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Whether the native backend has its private view here (`policy show` says).
pub(crate) fn has_view(env: &Env) -> bool {
    let out = env
        .cmd()
        .args(["policy", "show"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).contains("view+landlock+seccomp")
}

const MANIFEST: &str = r#"[package]
name = "demo"
version = "0.1.0"
edition = "2021"

[dependencies]
itoa = "=1.0.11"
ryu = "=1.0.18"
"#;

const LIB: &str = r#"
pub fn both(n: u64, f: f64) -> String {
    format!("{} {}", itoa::Buffer::new().format(n), ryu::Buffer::new().format(f))
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats() {
        assert_eq!(super::both(42, 1.5), "42 1.5");
    }
}
"#;

#[test]
fn cargo_builds_and_tests_twice_from_the_layer_and_never_writes_the_users_cache() {
    let Some((rustup, bin)) = machine_rustup() else {
        return skip(
            "rustup",
            "no rustup toolchain on this machine (RUSTUP_HOME, ~/.cargo/bin)",
        );
    };
    let env = Env::new();
    if !has_view(&env) {
        return skip(
            "userns",
            "no private view here (user namespaces): caches are not layered",
        );
    }
    // The user's cache holds itoa already (a build of theirs on the host); ryu is new.
    let seed = env.path().join("seed");
    std::fs::create_dir_all(seed.join("src")).unwrap();
    std::fs::write(
        seed.join("Cargo.toml"),
        "[package]\nname = \"seed\"\nversion = \"0.1.0\"\nedition = \"2021\"\n[dependencies]\nitoa = \"=1.0.11\"\n",
    )
    .unwrap();
    std::fs::write(seed.join("src/lib.rs"), "").unwrap();
    let mut fetch = Command::new(bin.join("cargo"));
    fetch.env_clear();
    user_env(&mut fetch, &env, &rustup, &bin);
    let out = fetch.arg("fetch").current_dir(&seed).output().unwrap();
    assert!(out.status.success(), "host cargo fetch: {}", text(&out));
    let registry = env.home().join(".cargo/registry");
    assert!(registry.is_dir());

    // Two worktrees sharing the project's layers: `home: per-project`, the opt-in (by
    // default each task has its own home and layers: `home_tasks.rs`).
    env.write_config("home: per-project\n");
    let trees = worktrees(&env, &["task1", "task2"]);
    for t in &trees {
        std::fs::create_dir_all(t.join("src")).unwrap();
        std::fs::write(t.join("Cargo.toml"), MANIFEST).unwrap();
        std::fs::write(t.join("src/lib.rs"), LIB).unwrap();
    }
    let user_cache = tree(&env.home().join(".cargo"));
    let toolchain = tree(&bin);
    let rustup_before = tree_stat(&rustup);

    // First run: itoa from the user's cache, ryu downloaded into the project's layer.
    let out = sandbox(
        &env,
        &trees[0],
        &rustup,
        &bin,
        &["run", "--", "cargo", "test"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Downloaded ryu"), "{err}");
    assert!(
        !err.contains("Downloaded itoa"),
        "itoa came from the user's cache: {err}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("test tests::formats ... ok"));
    assert_eq!(
        tree(&env.home().join(".cargo")),
        user_cache,
        "the user's cache changed"
    );

    // Second run, another worktree of the project, offline: everything from the layer.
    let out = sandbox(
        &env,
        &trees[1],
        &rustup,
        &bin,
        &["run", "--", "cargo", "build", "--offline"],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("Downloaded"),
        "{}",
        text(&out)
    );
    let out = sandbox(
        &env,
        &trees[1],
        &rustup,
        &bin,
        &["run", "--", "cargo", "test", "--offline"],
    );
    assert!(out.status.success(), "{}", text(&out));

    // A planted change to an extracted crate source lands in the layer, never in the
    // user's cache (which the user's next host build would compile).
    let plant = "f=$(ls -d ~/.cargo/registry/src/*/itoa-1.0.11)/src/lib.rs && \
                 echo '// planted by the sandbox' >> \"$f\" && grep -c planted \"$f\"";
    let out = sandbox(
        &env,
        &trees[1],
        &rustup,
        &bin,
        &["run", "--", "sh", "-c", plant],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
    // The toolchain is read-only inside.
    let out = sandbox(
        &env,
        &trees[1],
        &rustup,
        &bin,
        &[
            "run",
            "--",
            "sh",
            "-c",
            &format!("touch {}/planted", bin.display()),
        ],
    );
    assert!(!out.status.success(), "{}", text(&out));

    assert_eq!(
        tree(&env.home().join(".cargo")),
        user_cache,
        "the user's cache changed"
    );
    assert_eq!(tree(&bin), toolchain, "the toolchain's bin changed");
    assert_eq!(tree_stat(&rustup), rustup_before, "rustup's tree changed");
    let layers = env.home().join(".local/state/sandbox/caches");
    let planted = Command::new("grep")
        .args(["-rl", "planted by the sandbox"])
        .arg(&layers)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&planted.stdout).contains("cargo-registry/upper"),
        "the planted change is in the layer: {}",
        text(&planted)
    );
    // `sandbox home` shows the layer and what it takes.
    let out = sandbox(&env, &trees[0], &rustup, &bin, &["home"]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("cargo-registry") && shown.contains("rust"),
        "{shown}"
    );
}

#[test]
fn commands_resolve_in_the_view_and_a_host_only_program_gets_the_hint() {
    let Some((rustup, bin)) = machine_rustup() else {
        return skip(
            "rustup",
            "no rustup toolchain on this machine (RUSTUP_HOME, ~/.cargo/bin)",
        );
    };
    let env = Env::new();
    if !has_view(&env) {
        return skip("userns", "no private view here (user namespaces)");
    }
    let dir = worktrees(&env, &["task"]).remove(0);
    // A program only the host has: in a directory no grant covers.
    let hostbin = env.path().join("hostbin");
    std::fs::create_dir_all(&hostbin).unwrap();
    let hello = hostbin.join("hello-host");
    std::fs::write(&hello, "#!/bin/sh\necho hello\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&hello, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A link in it that leads outside everything the run sees.
    let elsewhere = env.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::copy(&hello, elsewhere.join("real")).unwrap();
    std::os::unix::fs::symlink(elsewhere.join("real"), hostbin.join("linked-out")).unwrap();
    let path = format!("{}:{}:/usr/bin:/bin", hostbin.display(), bin.display());
    let run = |args: &[&str]| {
        let mut cmd = env.cmd();
        user_env(&mut cmd, &env, &rustup, &bin);
        cmd.env("PATH", &path)
            .current_dir(&dir)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    // Every directory of the user's PATH is a toolchain: there by default.
    let out = run(&["run", "--", "hello-host"]);
    assert!(out.status.success(), "{}", text(&out));
    // Left out, it names itself and the flag that brings it back.
    let out = run(&["run", "--no-toolchains", "--", "hello-host"]);
    assert_eq!(out.status.code(), Some(127), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "hello-host is {}, outside the sandbox",
            hello.display()
        )) && err.contains("add --toolchain "),
        "{err}"
    );
    // A link out of the view's trees: the hint names the grant.
    let out = run(&["run", "--", "linked-out"]);
    assert_eq!(out.status.code(), Some(127), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("leads outside it") && err.contains("--allow-read"),
        "{err}"
    );
    let out = run(&[
        "run",
        "--allow-read",
        elsewhere.to_str().unwrap(),
        "--",
        "linked-out",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    // A toolchain left out names itself.
    let out = sandbox(
        &env,
        &dir,
        &rustup,
        &bin,
        &["run", "--no-toolchains", "--", "cargo", "--version"],
    );
    assert_eq!(out.status.code(), Some(127), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("outside the sandbox: it is the rust toolchain")
            && err.contains("add --toolchain rust"),
        "{err}"
    );
    let out = sandbox(
        &env,
        &dir,
        &rustup,
        &bin,
        &[
            "run",
            "--no-toolchains",
            "--toolchain",
            "rust",
            "--",
            "cargo",
            "--version",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    // A program named by its path, in a folder of the home no grant shows: the same hint.
    let mytools = env.home().join("mytools");
    std::fs::create_dir_all(&mytools).unwrap();
    let mytool = mytools.join("mytool");
    std::fs::copy(&hello, &mytool).unwrap();
    let out = run(&["run", "--", mytool.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(127), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("mytool is ~/mytools/mytool, outside the sandbox")
            && err.contains(&format!("--allow-read {}", mytools.display())),
        "{err}"
    );
    let out = run(&[
        "run",
        "--allow-read",
        mytools.to_str().unwrap(),
        "--",
        mytool.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn python3_is_the_views_interpreter() {
    let env = Env::new();
    if !has_view(&env) {
        return skip("userns", "no private view here (user namespaces)");
    }
    let dir = worktrees(&env, &["task"]).remove(0);
    // The user's python3: pyenv's when the machine has one, else the system's.
    let real_home = PathBuf::from(std::env::var_os("HOME").unwrap());
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| real_home.join(".pyenv"));
    let mut cmd = env.cmd();
    let want = if pyenv.join("shims/python3").is_file() {
        cmd.env("PYENV_ROOT", &pyenv).env(
            "PATH",
            format!(
                "{}:{}:/usr/bin:/bin",
                pyenv.join("shims").display(),
                pyenv.join("bin").display()
            ),
        );
        pyenv.join("versions")
    } else {
        PathBuf::from("/usr")
    };
    let out = cmd
        .current_dir(&dir)
        .args([
            "run",
            "--",
            "python3",
            "-c",
            "import sys; print(sys.prefix)",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let prefix = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        Path::new(&prefix).starts_with(&want),
        "{prefix} not under {}",
        want.display()
    );
}

#[test]
fn tmp_is_writable_and_private_root_is_listable_and_home_is_private() {
    let env = Env::new();
    if !has_view(&env) {
        return skip("userns", "no private view here (user namespaces)");
    }
    let dir = worktrees(&env, &["task"]).remove(0);
    // The host's /tmp holds a file the run must not see.
    let marker = tempfile::Builder::new()
        .prefix("sandbox-host-only-")
        .tempfile_in("/tmp")
        .unwrap();
    let script = format!(
        "echo x > /tmp/hard-coded && cat /tmp/hard-coded && ls / >/dev/null && echo listed && \
         test ! -e {} && echo private && echo \"$HOME\" && test -w \"$HOME\" && \
         echo $XDG_CACHE_HOME && touch ~/kept",
        marker.path().display()
    );
    let out = env
        .cmd()
        .current_dir(&dir)
        .args(["run", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let home = env.home().display().to_string();
    assert_eq!(
        lines,
        vec![
            "x".to_string(),
            "listed".into(),
            "private".into(),
            home.clone(),
            format!("{home}/.cache"),
        ]
    );
    // Written to the private home, not to the user's.
    assert!(!env.home().join("kept").exists());
    let out = env
        .cmd()
        .current_dir(&dir)
        .args(["run", "--", "sh", "-c", "test -e ~/kept"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the private home persists: {}",
        text(&out)
    );
    assert!(
        !Path::new("/tmp/hard-coded").exists() || {
            // Another process may own a /tmp/hard-coded on the host; it is not ours to judge.
            true
        }
    );
    // `sandbox home reset` starts over.
    let out = env
        .cmd()
        .current_dir(&dir)
        .args(["home", "reset", "--yes"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let out = env
        .cmd()
        .current_dir(&dir)
        .args(["run", "--", "sh", "-c", "test ! -e ~/kept"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
}

/// npm from the machine (`.ci/run` installs Debian's `nodejs npm`).
fn npm() -> Option<PathBuf> {
    ["/usr/bin/npm", "/usr/local/bin/npm"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

#[test]
fn npm_installs_and_tests_twice_the_second_time_offline() {
    let Some(_) = npm() else {
        return skip("npm", "no npm here (apt-get install nodejs npm)");
    };
    let env = Env::new();
    if !has_view(&env) {
        return skip("userns", "no private view here (user namespaces)");
    }
    // The user has an npm cache (empty): it is layered.
    std::fs::create_dir_all(env.home().join(".npm")).unwrap();
    let user_cache = tree(&env.home().join(".npm"));
    // Two worktrees sharing the project's layers: `home: per-project`, the opt-in (by
    // default each task has its own home and layers: `home_tasks.rs`).
    env.write_config("home: per-project\n");
    let trees = worktrees(&env, &["task1", "task2"]);
    for t in &trees {
        std::fs::write(
            t.join("package.json"),
            r#"{"name":"demo","version":"1.0.0","private":true,
                "dependencies":{"is-number":"7.0.0"},
                "scripts":{"test":"node -e \"if(!require('is-number')(5)) process.exit(1); console.log('npm-test-ok')\""}}"#,
        )
        .unwrap();
    }
    let npm_run = |dir: &Path, script: &str| {
        env.cmd()
            .current_dir(dir)
            .args(["run", "--", "sh", "-c", script])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = npm_run(&trees[0], "npm install --no-audit --no-fund && npm test");
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("npm-test-ok"),
        "{}",
        text(&out)
    );
    // The second worktree, offline: from the layer only.
    let out = npm_run(
        &trees[1],
        "npm install --offline --no-audit --no-fund && npm test",
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("npm-test-ok"),
        "{}",
        text(&out)
    );
    assert_eq!(
        tree(&env.home().join(".npm")),
        user_cache,
        "the user's npm cache changed"
    );
}

#[test]
fn a_venv_with_pip_and_pytest_twice_the_second_time_without_the_index() {
    let env = Env::new();
    if !has_view(&env) {
        return skip("userns", "no private view here (user namespaces)");
    }
    let real_home = PathBuf::from(std::env::var_os("HOME").unwrap());
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| real_home.join(".pyenv"));
    let mut path = "/usr/local/bin:/usr/bin:/bin".to_string();
    if pyenv.join("shims/python3").is_file() {
        path = format!(
            "{}:{}:{path}",
            pyenv.join("shims").display(),
            pyenv.join("bin").display()
        );
    } else if Command::new("python3")
        .args(["-c", "import ensurepip"])
        .status()
        .map_or(true, |s| !s.success())
    {
        return skip(
            "python3-venv",
            "no python3 with venv/ensurepip (apt-get install python3-venv)",
        );
    }
    // The user's pip cache exists (empty): it is layered.
    std::fs::create_dir_all(env.home().join(".cache/pip")).unwrap();
    let user_cache = tree(&env.home().join(".cache"));
    // Two worktrees sharing the project's layers: `home: per-project`, the opt-in (by
    // default each task has its own home and layers: `home_tasks.rs`).
    env.write_config("home: per-project\n");
    let trees = worktrees(&env, &["task1", "task2"]);
    for t in &trees {
        std::fs::write(
            t.join("test_demo.py"),
            "def test_one():\n    assert 1 + 1 == 2\n",
        )
        .unwrap();
    }
    let py = |dir: &Path, script: &str| {
        let mut cmd = env.cmd();
        cmd.env("PATH", &path).env("PYENV_ROOT", &pyenv);
        cmd.current_dir(dir)
            .args(["run", "--", "sh", "-c", script])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    // The wheels pip fetched stay in the project's layer of the pip cache...
    let out = py(
        &trees[0],
        "python3 -m venv .venv && .venv/bin/pip download -q -d ~/.cache/pip/wheels pytest && \
         .venv/bin/pip install -q --no-index --find-links ~/.cache/pip/wheels pytest && \
         .venv/bin/pytest -q",
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "{}",
        text(&out)
    );
    // ...so the second worktree installs without the index.
    let out = py(
        &trees[1],
        "python3 -m venv .venv && \
         .venv/bin/pip install -q --no-index --find-links ~/.cache/pip/wheels pytest && \
         .venv/bin/pytest -q",
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "{}",
        text(&out)
    );
    assert_eq!(
        tree(&env.home().join(".cache")),
        user_cache,
        "the user's pip cache changed"
    );
}

#[test]
fn without_user_namespaces_home_is_the_private_homes_own_path() {
    use common::escape::{nouserns_unavailable, NOUSERNS_WRAPPER};
    if let Some(why) = nouserns_unavailable() {
        return skip("nouserns-harness", why);
    }
    let Some((rustup, bin)) = machine_rustup() else {
        return skip(
            "rustup",
            "no rustup toolchain on this machine (RUSTUP_HOME, ~/.cargo/bin)",
        );
    };
    let env = Env::new();
    let dir = worktrees(&env, &["task"]).remove(0);
    let mut cmd = env.cmd_under(&NOUSERNS_WRAPPER);
    user_env(&mut cmd, &env, &rustup, &bin);
    let out = cmd
        .current_dir(&dir)
        .args([
            "run",
            "--",
            "sh",
            "-c",
            "echo $HOME && touch $HOME/kept && cargo --version >/dev/null && echo toolchain-ok",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.lines();
    let home = PathBuf::from(lines.next().unwrap());
    assert!(
        home.starts_with(env.home().join(".local/state/sandbox/homes")),
        "{}",
        text(&out)
    );
    assert_eq!(lines.next(), Some("toolchain-ok"));
    assert!(home.join("kept").exists());
    assert!(!env.home().join("kept").exists());
    // Every run says what the missing view costs.
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("HOME is the private home's own path"),
        "{}",
        text(&out)
    );
}

/// A package cache outside the home (`CARGO_HOME=/opt/cargo`, as CI images and `cargo bench`
/// set it) is layered where the view has no directory of its own: its mount point must be
/// made on the view's tmpfs. Before, every such run exited 125 ("building the private view:
/// No such file or directory").
#[test]
fn a_cache_outside_the_home_is_layered_at_its_own_path() {
    let env = Env::new();
    if !has_view(&env) {
        return skip("no-view", "the native backend has no private view here");
    }
    let dir = worktrees(&env, &["task"]).remove(0);
    let cargo_home = env.path().join("elsewhere/cargo");
    std::fs::create_dir_all(cargo_home.join("registry/cache")).unwrap();
    std::fs::write(cargo_home.join("registry/cache/kept.crate"), "users").unwrap();
    let out = env
        .cmd()
        .current_dir(&dir)
        .env("CARGO_HOME", &cargo_home)
        .args([
            "run",
            "--env",
            "CARGO_HOME",
            "--",
            "sh",
            "-c",
            "cat \"$CARGO_HOME/registry/cache/kept.crate\" && \
             echo new > \"$CARGO_HOME/registry/cache/new.crate\" && echo written",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "userswritten\n");
    // Copy-on-write: the user's cache is as it was.
    assert!(!cargo_home.join("registry/cache/new.crate").exists());
}

/// Runs of one project started together (boxes created at once, say) each find its private
/// home whole: the first makes it, the others wait and use it. Once, two raced, and the one
/// that lost refused to run ("creating the private home: File exists").
#[test]
fn runs_started_together_share_one_whole_home() {
    let env = Env::new();
    let dir = worktrees(&env, &["task"]).remove(0);
    let runs: Vec<_> = (0..16)
        .map(|_| {
            env.cmd()
                .current_dir(&dir)
                .args(["run", "--", "sh", "-c", "cat \"$HOME/.bashrc\""])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for run in runs {
        let out = run.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            sandbox_host::assembly::home::SHELL_RC
        );
    }
}

/// A run that is SIGKILLed while its command writes to a package cache leaves its overlay's
/// work directory (with the volatile marker that refuses the next mount) and the mount points
/// of the private home; the next run of the project mounts the layer all the same, finds what
/// the killed one wrote, and once it ends nothing of either is left.
#[test]
fn a_run_killed_mid_write_leaves_nothing_the_next_run_does_not_clear() {
    use std::io::BufRead;
    let env = Env::new();
    if !has_view(&env) {
        skip(
            "no-view",
            "no private view here: no cache overlays to leave behind",
        );
        return;
    }
    let mut killed = env
        .cmd()
        .args([
            "run",
            "--",
            "sh",
            "-c",
            "echo killed >> ~/.npm/written; echo ready; exec sleep 1000",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(killed.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    let state = env.home().join(".local/state/sandbox");
    assert!(
        !common::leftovers(&state).is_empty(),
        "a live run has its work directory and mount points"
    );
    killed.kill().unwrap();
    killed.wait().unwrap();

    let out = env
        .cmd()
        .args([
            "run",
            "--",
            "sh",
            "-c",
            "echo next >> ~/.npm/written; cat ~/.npm/written",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(out.stdout, b"killed\nnext\n", "{}", text(&out));
    let left = common::leftovers(&state);
    assert!(left.is_empty(), "left behind: {left:#?}");
    assert!(
        !env.home().join(".npm/written").exists(),
        "the user's cache was written"
    );
}

/// A login shell inside (`bash -lc`, as Codex runs every command; `sh -l`; `sandbox shell`,
/// which starts `$SHELL -l`) has the run's `PATH`, which the system's /etc/profile resets:
/// the user's toolchain is found as on the host. A home made before that (its `.profile` the
/// old shell rc) gets the new profile; one the user edited is left as it is.
#[test]
fn a_login_shell_finds_the_runs_toolchains() {
    let Some((rustup, bin)) = machine_rustup() else {
        skip(
            "rustup",
            "no rustup toolchain on this machine (RUSTUP_HOME, ~/.cargo/bin)",
        );
        return;
    };
    let env = Env::new();
    if !has_view(&env) {
        skip(
            "no-view",
            "no private view here: the home is not at HOME's path",
        );
        return;
    }
    let dir = env.work();
    let want = format!("{}\n", bin.join("cargo").display());
    let login = |shell: &str| {
        let out = sandbox(
            &env,
            &dir,
            &rustup,
            &bin,
            &["run", "--", shell, "-lc", "command -v cargo"],
        );
        assert_eq!(out.status.code(), Some(0), "{shell} -l: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for shell in ["bash", "sh"] {
        assert_eq!(login(shell), want, "{shell} -l");
    }
    // An older home's `.profile`: upgraded at the next run.
    let homes = env.home().join(".local/state/sandbox/homes");
    let home = std::fs::read_dir(&homes)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.is_dir())
        .unwrap();
    std::fs::write(
        home.join(".profile"),
        sandbox_host::assembly::home::SHELL_RC,
    )
    .unwrap();
    assert_eq!(login("bash"), want, "an older home");
    assert_eq!(
        std::fs::read_to_string(home.join(".profile")).unwrap(),
        sandbox_host::assembly::home::PROFILE
    );
    // The user's own `.profile` is theirs.
    std::fs::write(home.join(".profile"), "# mine\n").unwrap();
    let out = sandbox(&env, &dir, &rustup, &bin, &["run", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(home.join(".profile")).unwrap(),
        "# mine\n"
    );
}

/// The escape suite's `home` row as an unprivileged user (`nobody` when the tests run as
/// root): a run of the project swaps `~/.cache` of the private home for a link to a directory
/// of that user outside every grant, over and over, while the next runs of the project
/// prepare and mount the pip cache's mount point in it. No run creates anything there; each
/// runs or fails closed (125) saying where.
#[test]
fn a_run_swapping_the_private_home_for_links_makes_the_next_touch_nothing_outside_as_nobody() {
    use common::escape::{race, Verdict, ATTACKER};
    let is_root = nix::unistd::geteuid().is_root();
    if is_root && !Path::new(sandbox_testkit::nobody::SETPRIV).exists() {
        skip("setpriv", "as nobody: /usr/bin/setpriv is missing");
        return;
    }
    if !Path::new("/usr/bin/python3").exists() {
        skip("python3", "python3 is missing");
        return;
    }
    let env = Env::new();
    let user = common::UserDirs::new(env.path(), "nobody", common::BIN, true);
    // The user's own directory, which the runs could write if they reached it.
    let target = env.path().join("nobody-outside");
    std::fs::create_dir(&target).unwrap();
    if is_root {
        let nobody = sandbox_testkit::nobody::NOBODY;
        nix::unistd::chown(
            &target,
            Some(nix::unistd::Uid::from_raw(nobody)),
            Some(nix::unistd::Gid::from_raw(nobody)),
        )
        .unwrap();
    }
    let target_arg = target.to_str().unwrap();
    let verdict = race(
        &user.work,
        &target,
        |dir| {
            user.command(&[
                user.bin_str(),
                "run",
                "--backend",
                "native",
                "--",
                "python3",
                "-c",
                ATTACKER,
                target_arg,
            ])
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        },
        || {
            user.command(&[user.bin_str(), "run", "--", "sh", "-c", "echo ATTEMPTED"])
                .stdin(Stdio::null())
                .output()
                .unwrap()
        },
    );
    assert_eq!(
        verdict,
        Verdict::Blocked,
        "{}",
        common::escape::SWAP_HOME_DIR
    );
}

/// The bound on a project's cache layers (`cache_size_mib`): a command that writes past it
/// through a cache overlay runs (a command's writes are not cut short), the next run is
/// refused with 125 naming the bound and the way out, `sandbox home reset --caches` frees the
/// layers, and the run after works. The user's cache is never written. The size the check
/// reads is measured after each command in a process of its own, so the refusal right after
/// the writing run also proves the next run waits for that measure or sums the layers itself.
#[test]
fn a_command_past_the_cache_bound_refuses_the_next_run_until_the_layers_are_reset() {
    let env = Env::new();
    if !has_view(&env) {
        return skip("no-view", "no private view here: no cache layers to bound");
    }
    env.write_config("cache_size_mib: 1\n");
    let dir = worktrees(&env, &["task"]).remove(0);
    let run = |script: &str| {
        env.cmd()
            .current_dir(&dir)
            .args(["run", "--", "sh", "-c", script])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = run("head -c 3000000 /dev/zero > ~/.npm/filled && echo filled");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(out.stdout, b"filled\n");

    let out = run("echo ran");
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(out.stdout.is_empty(), "the command ran: {}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bound: 1.0 MiB"), "{err}");
    assert!(err.contains("cache_size_mib"), "{err}");
    assert!(err.contains("sandbox home reset --caches"), "{err}");

    let reset = env
        .cmd()
        .current_dir(&dir)
        .args(["home", "reset", "--caches", "--yes"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(reset.status.code(), Some(0), "{}", text(&reset));
    let out = run("test ! -e ~/.npm/filled && echo ran");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(out.stdout, b"ran\n");
    assert!(
        !env.home().join(".npm/filled").exists(),
        "the user's cache was written"
    );
}

/// As a user (`nobody` when the suite is root), `sandbox home reset` removes what the runs
/// left in the cache layers, the work directories overlayfs made without permissions
/// included: a plain recursive removal stopped at them with "Permission denied" and the
/// layers could not be freed.
#[test]
fn home_reset_as_a_user_removes_the_layers_overlayfs_left() {
    let is_root = nix::unistd::geteuid().is_root();
    if is_root && !Path::new(sandbox_testkit::nobody::SETPRIV).exists() {
        return skip("setpriv", "as nobody: /usr/bin/setpriv is missing");
    }
    let env = Env::new();
    let user = common::UserDirs::new(env.path(), "nobody", common::BIN, true);
    let out = user
        .command(&[
            user.bin_str(),
            "run",
            "--",
            "sh",
            "-c",
            "echo x > ~/.npm/written",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let caches = user.home.join(".state/sandbox/caches");
    let layers: Vec<_> = std::fs::read_dir(&caches)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    if layers.is_empty() {
        return skip(
            "no-view",
            "as a user: no cache layers here (no private view)",
        );
    }
    let reset = user
        .command(&[user.bin_str(), "home", "reset", "--caches", "--yes"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(reset.status.code(), Some(0), "{}", text(&reset));
    for dir in layers {
        assert!(!dir.exists(), "{} is left", dir.display());
    }
}
