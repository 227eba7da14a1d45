//! The private home between tasks, from the attacker's side: task A's run (one linked
//! worktree, no grant beyond its worktree) leaves start-up code in its home — a `.bashrc`
//! line, a Python `.pth` in the user site-packages — and task B's run (another worktree of the
//! same repository, with a writable grant A lacks) starts an interactive shell and Python.
//! Under the default (`home: per-task`) B's run does not execute it: a marker in B's grant
//! stays absent. Two controls show the attack works where the homes are one: the host
//! backend (both runs in the real home), and the native backend with `home: per-project`.
//! Through `sandbox run` and through the daemon (a box per run).

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use serde_json::json;

use crate::common::daemon::Daemon;
use crate::common::{self, text, Env};

const PYTHON: &str = "/usr/bin/python3";

/// What A's run leaves: a line of the shell rc and a `.pth` Python runs at start-up, each
/// creating a marker in `marks` (which A cannot write; B can).
fn plant(marks: &Path) -> String {
    let marks = marks.display();
    format!(
        "echo 'touch {marks}/bashrc-ran' >> ~/.bashrc && \
         d=$({PYTHON} -c 'import site; print(site.getusersitepackages())') && mkdir -p \"$d\" && \
         echo \"import os; open('{marks}/pth-ran', 'w')\" > \"$d/zz-planted.pth\" && \
         echo planted"
    )
}

/// What B's run does: what every agent's shell and every Python tool does at start.
fn victim() -> String {
    format!("bash -i -c true </dev/null 2>/dev/null; {PYTHON} -c 'print(\"python ran\")'")
}

/// Runs `script` in the worktree `dir`, with `grant` writable when given.
type Runner<'a> = &'a dyn Fn(&Path, Option<&Path>, &str) -> Output;

/// `sandbox run` with `backend`.
fn cli<'a>(env: &'a Env, backend: &'a str) -> impl Fn(&Path, Option<&Path>, &str) -> Output + 'a {
    move |dir, grant, script| {
        let mut cmd = env.cmd();
        cmd.current_dir(dir).args(["run", "--backend", backend]);
        if let Some(grant) = grant {
            cmd.arg(format!("--allow-write={}", grant.display()));
        }
        cmd.args(["--", "sh", "-c", script])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }
}

/// A box of the daemon per run (`box.create` with `allowWrite`), native.
fn daemon(d: &Daemon) -> impl Fn(&Path, Option<&Path>, &str) -> Output + '_ {
    move |dir, grant, script| {
        let grants: Vec<&Path> = grant.into_iter().collect();
        d.run_once(dir, json!({"allowWrite": grants}), &["sh", "-c", script])
    }
}

/// Task A plants, task B runs with `marks` writable: which markers B's run made.
fn attack(env: &Env, run: Runner) -> Vec<&'static str> {
    let trees = crate::home::worktrees(env, &["task-a", "task-b"]);
    let marks: PathBuf = env.path().join("granted-to-b");
    std::fs::create_dir_all(&marks).unwrap();
    attack_in(&trees, &marks, run)
}

/// [`attack`] in the worktrees `trees` (A's, B's), `marks` existing.
fn attack_in(trees: &[PathBuf], marks: &Path, run: Runner) -> Vec<&'static str> {
    let a = run(&trees[0], None, &plant(marks));
    assert!(a.status.success(), "A plants: {}", text(&a));
    assert!(
        String::from_utf8_lossy(&a.stdout).contains("planted"),
        "{}",
        text(&a)
    );
    let b = run(&trees[1], Some(marks), &victim());
    assert!(b.status.success(), "B runs: {}", text(&b));
    assert!(
        String::from_utf8_lossy(&b.stdout).contains("python ran"),
        "{}",
        text(&b)
    );
    ["bashrc-ran", "pth-ran"]
        .into_iter()
        .filter(|m| marks.join(m).exists())
        .collect()
}

#[test]
fn a_tasks_start_up_code_does_not_run_in_another_tasks_run() {
    if !Path::new(PYTHON).exists() {
        return common::skip("python3", "python3 is missing");
    }
    let env = Env::new();
    if !crate::home::has_view(&env) {
        return common::skip(
            "userns",
            "no private view here (user namespaces): the home is not mounted at HOME",
        );
    }
    // The controls: one home for both tasks, and the attack works.
    let control = Env::new();
    let host = attack(&control, &cli(&control, "host"));
    assert_eq!(host, ["bashrc-ran", "pth-ran"], "the host backend");
    let shared = Env::new();
    shared.write_config("home: per-project\n");
    assert_eq!(
        attack(&shared, &cli(&shared, "native")),
        ["bashrc-ran", "pth-ran"],
        "home: per-project shares it, as documented"
    );

    // The default: each task its own home.
    assert_eq!(
        attack(&env, &cli(&env, "native")),
        Vec::<&str>::new(),
        "home: per-task"
    );
    // A's home holds what it planted (A's own next run gets it); `sandbox home` in each
    // worktree names its own.
    let trees = [env.work().join("task-a"), env.work().join("task-b")];
    let shown: Vec<String> = trees
        .iter()
        .map(|t| {
            let out = env
                .cmd()
                .current_dir(t)
                .args(["home", "--json"])
                .output()
                .unwrap();
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(v["scope"], "per-task", "{v}");
            v["home"].as_str().unwrap().to_string()
        })
        .collect();
    assert_ne!(shown[0], shown[1]);
    let rc = std::fs::read_to_string(Path::new(&shown[0]).join(".bashrc")).unwrap();
    assert!(rc.contains("bashrc-ran"), "{rc}");
    let rc = std::fs::read_to_string(Path::new(&shown[1]).join(".bashrc")).unwrap();
    assert!(!rc.contains("bashrc-ran"), "{rc}");
}

/// The same through the daemon: each run a box of its own over its worktree.
#[test]
fn a_tasks_start_up_code_does_not_run_in_another_tasks_box() {
    if !Path::new(PYTHON).exists() {
        return common::skip("python3", "python3 is missing");
    }
    let env = Env::new();
    if !crate::home::has_view(&env) {
        return common::skip(
            "userns",
            "no private view here (user namespaces): the home is not mounted at HOME",
        );
    }
    let shared = Env::new();
    shared.write_config("home: per-project\n");
    let d = Daemon::start(&shared);
    assert_eq!(
        attack(&shared, &daemon(&d)),
        ["bashrc-ran", "pth-ran"],
        "home: per-project shares it, as documented"
    );
    let d = Daemon::start(&env);
    assert_eq!(
        attack(&env, &daemon(&d)),
        Vec::<&str>::new(),
        "home: per-task"
    );
}

/// As an unprivileged user (`nobody` when the suite runs as root): the same attack through
/// `sandbox run`, `home: per-project` the control.
#[test]
fn a_tasks_start_up_code_does_not_run_in_another_tasks_run_as_an_unprivileged_user() {
    let is_root = nix::unistd::geteuid().is_root();
    if !Path::new(PYTHON).exists()
        || (is_root && !Path::new(sandbox_testkit::nobody::SETPRIV).exists())
    {
        return common::skip("python3", "python3 or setpriv is missing");
    }
    let made = |shared: bool| -> Option<Vec<&'static str>> {
        let env = Env::new();
        let user = common::UserDirs::new(env.path(), "u", common::BIN, true);
        let sh = |script: &str| {
            let out = user.command(&["sh", "-c", script]).output().unwrap();
            assert!(out.status.success(), "{script}: {}", text(&out));
        };
        let doctor = user
            .command(&[user.bin_str(), "doctor", "--json"])
            .output()
            .unwrap();
        let report: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
        if report["private_view"]["available"] != json!(true) {
            common::skip(
                "unprivileged-private-view",
                format_args!(
                    "no private view for an unprivileged user here: {}",
                    report["private_view"]["reason"]
                ),
            );
            return None;
        }
        // The user's own repository, worktrees and granted directory.
        // By hand, not with the test kit's `add_worktree`: made as the user (nobody), so theirs.
        sh(
            "git init -q -b main main && git -C main commit -q --allow-empty -m init && \
            git -C main worktree add -q -b task-a ../task-a && \
            git -C main worktree add -q -b task-b ../task-b && mkdir granted-to-b",
        );
        if shared {
            sh("mkdir -p ~/.config/sandbox && echo 'home: per-project' > ~/.config/sandbox/config.yaml");
        }
        let run = |dir: &Path, grant: Option<&Path>, script: &str| {
            let mut args = vec![user.bin_str().to_string(), "run".into()];
            if let Some(grant) = grant {
                args.push(format!("--allow-write={}", grant.display()));
            }
            args.extend(["--", "sh", "-c", script].map(String::from));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            user.command(&args)
                .current_dir(dir)
                .stdin(Stdio::null())
                .output()
                .unwrap()
        };
        let trees = [user.work.join("task-a"), user.work.join("task-b")];
        Some(attack_in(&trees, &user.work.join("granted-to-b"), &run))
    };
    let Some(shared) = made(true) else {
        return;
    };
    assert_eq!(
        shared,
        ["bashrc-ran", "pth-ran"],
        "home: per-project shares it"
    );
    assert_eq!(made(false).unwrap(), Vec::<&str>::new(), "home: per-task");
}
