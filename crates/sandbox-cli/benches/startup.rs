//! Start-up of `sandbox run -- /bin/true` as an agent's commands pay it: in a real home
//! (toolchains and package caches), one feature added per row, each row against a C floor that
//! does the same kernel work (`benches/floor_run.c`, built here with the system's `cc`) and
//! against bubblewrap building an equal view, all in one interleaved series.
//!
//!     cargo bench -p sandbox-cli --bench startup
//!
//! Two series: commands ~150 ms apart (as an agent's tool calls come: costs that wait for an
//! RCU grace period or a journal commit show only then) and back to back.
//!
//! The home is `$HOME` with its real toolchains and caches (`SANDBOX_BENCH_HOME=lived-in`: a
//! fresh `sandbox_testkit::home::lived_in` instead, caches only). The runs get the user's
//! environment without what cargo adds to it (`CARGO_*`, `RUSTUP_TOOLCHAIN`, the toolchain's
//! directory on `PATH`), a fresh state directory, and a configuration per row.
//!
//! `SANDBOX_BENCH_COMPARE=/path/to/sandbox` adds another build to every row (before/after in
//! the same series); `SANDBOX_BENCH_ROUNDS=N` sets the rounds per series (default 20);
//! `SANDBOX_BENCH_ROWS=a,b` keeps only the rows whose names contain one of those words.

// A panic is how a benchmark reports failure; the workspace lints against unwrap/expect
// apply to shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How far apart an agent's commands come, at the closest.
const SPACING: Duration = Duration::from_millis(150);

/// One row: a feature added to the row above.
struct Row {
    name: &'static str,
    dir: PathBuf,
    /// `XDG_CONFIG_HOME` (its `sandbox/config.yaml` says `home:` and `caches:`).
    config: PathBuf,
    flags: Vec<String>,
    /// A command run once in the row's sandbox before the series (what earlier commands of
    /// the task left in its layers).
    setup: Option<&'static str>,
    variants: Vec<Variant>,
}

/// A layer as one `cargo build` inside leaves it: 30,000 small files (extracted crate
/// sources) in the cargo registry's.
const FILLED_LAYER: &str =
    "mkdir -p ~/.cargo/registry/src/bench && cd ~/.cargo/registry/src/bench \
    && for i in $(seq 300); do mkdir $i && (cd $i && seq 100 | sed 's/$/.rs/' | xargs touch); done";

struct Variant {
    name: &'static str,
    argv: Vec<String>,
    spaced: Vec<Duration>,
    back_to_back: Vec<Duration>,
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The environment of every run: the user's, without what cargo added.
fn user_env(home: &Path, state: &Path) -> Vec<(String, String)> {
    let rustup = std::env::var("RUSTUP_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| home.join(".rustup"));
    let path = std::env::var("SANDBOX_BENCH_PATH").unwrap_or_else(|_| {
        let kept: Vec<PathBuf> = std::env::split_paths(&std::env::var_os("PATH").unwrap())
            .filter(|d| !d.starts_with(rustup.join("toolchains")) && !d.ends_with("deps"))
            .collect();
        std::env::join_paths(kept)
            .unwrap()
            .to_string_lossy()
            .into_owned()
    });
    let mut env = vec![
        ("HOME".into(), home.to_string_lossy().into_owned()),
        ("PATH".into(), path),
        (
            "XDG_STATE_HOME".into(),
            state.to_string_lossy().into_owned(),
        ),
    ];
    for name in [
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "LANG",
        "XDG_RUNTIME_DIR",
        "PYENV_ROOT",
    ] {
        if let Ok(v) = std::env::var(name) {
            env.push((name.into(), v));
        }
    }
    env
}

/// One invocation's wall time (a failure is printed and ends the benchmark: its numbers
/// would be of something else).
fn run_once(argv: &[String], dir: &Path, env: &[(String, String)]) -> Duration {
    let start = Instant::now();
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let elapsed = start.elapsed();
    assert!(
        out.status.success(),
        "{argv:?} in {}: {}\n{}",
        dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    elapsed
}

/// `sandbox policy show --json` of the row's run.
fn shown(sandbox: &str, row: &Row, env: &[(String, String)]) -> Value {
    let mut argv = vec![sandbox.to_string(), "policy".into(), "show".into()];
    argv.extend(row.flags.iter().cloned());
    argv.push("--json".into());
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("XDG_CONFIG_HOME", &row.config)
        .current_dir(&row.dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{argv:?}: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// The git store's per-run directory in a shown path (`…/git-store/<run>/…`) as the floor's
/// own per-run directory.
fn per_run(path: &str) -> String {
    match path.find("<run>") {
        Some(at) => format!("@RUN@{}", &path[at + "<run>".len()..]),
        None => path.to_string(),
    }
}

/// The floor's plan (see `floor_run.c`) for the run `shown` describes.
fn floor_plan(shown: &Value, work: &Path, name: &str) -> String {
    let mut lines: Vec<String> = Vec::new();
    let staging = work.join(format!("floor-view-{name}"));
    lines.push(format!("staging\t{}", staging.display()));
    let compiled = &shown["compiled"];
    let own_proc = compiled["own_proc"].as_str().is_some();
    let ops = compiled["view"]["Ok"]["ops"]
        .as_array()
        .expect("a private view");
    let mut quarantined = false;
    let mut child_rules = vec!["crule\tw\t/tmp".to_string(), "crule\tl\t/".to_string()];
    for op in ops {
        let target = s(&op["target"]);
        let line = match op["op"].as_str().unwrap() {
            "tmpfs" => format!("tmpfs\t{target}\t{:o}", op["mode"].as_u64().unwrap()),
            "symlink" => format!("symlink\t{target}\t{}", s(&op["link"])),
            "bind" if own_proc && target == "/proc" => {
                child_rules.push("crule\tr\t/proc".into());
                "procdir".to_string()
            }
            "bind" => format!(
                "bind\t{}\t{target}\t{}\t{}",
                s(&op["source"]),
                u8::from(op["readonly"].as_bool().unwrap()),
                u8::from(op["dir"].as_bool().unwrap())
            ),
            "overlay" => {
                let lower: Vec<String> = op["lower"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|l| per_run(&s(l)))
                    .collect();
                let (upper, workdir) = (per_run(&s(&op["upper"])), per_run(&s(&op["work"])));
                if upper.starts_with("@RUN@") {
                    quarantined = true;
                } else {
                    lines.push(format!("marker\t{workdir}"));
                }
                child_rules.push(format!("crule\tw\t{target}"));
                format!(
                    "overlay\t{target}\tlowerdir={},upperdir={upper},workdir={workdir},userxattr,volatile",
                    lower.join(":")
                )
            }
            "pin" => format!("pin\t{target}"),
            "empty" => format!("empty\t{target}"),
            "seal" => format!("seal\t{target}"),
            "devpts" => {
                child_rules.push(format!("crule\td\t{target}"));
                format!("devpts\t{target}")
            }
            other => panic!("a view op the floor does not know: {other}"),
        };
        lines.push(line);
    }
    if quarantined {
        let scratch =
            Path::new("/dev/shm").join(format!("sandbox-bench-floor-{}", std::process::id()));
        std::fs::create_dir_all(&scratch).unwrap();
        lines.insert(0, format!("scratch\t{}", scratch.display()));
        lines.insert(
            1,
            format!("layer\t@RUN@/layer\t{}\tupper\twork", 1u64 << 30),
        );
    }
    lines.extend(child_rules);
    if shown["network"]["namespace"].as_bool() == Some(true) {
        lines.push("netns".into());
    }
    for rule in compiled["landlock"]["paths"].as_array().unwrap() {
        let class = match rule["access"].as_str().unwrap() {
            "read-exec" => "r",
            "read-write" => "w",
            _ => "d",
        };
        lines.push(format!("rule\t{class}\t{}", s(&rule["path"])));
    }
    for group in shown["limits"]["enforced"].as_array().unwrap() {
        let parent = s(&group["parent"]);
        let value = group["limit"]["value"].as_u64().unwrap();
        let files = match (
            group["mechanism"].as_str().unwrap(),
            s(&group["controller"]).as_str(),
        ) {
            ("cgroup-v1", "pids") => format!("pids.max\t{value}"),
            ("cgroup-v1", "memory") => {
                let mut f = format!("memory.limit_in_bytes\t{value}");
                if Path::new(&parent)
                    .join("memory.memsw.limit_in_bytes")
                    .exists()
                {
                    f.push_str(&format!("\tmemory.memsw.limit_in_bytes\t{value}"));
                }
                f
            }
            (mechanism, controller) => panic!("the floor has no {mechanism} {controller} group"),
        };
        lines.push(format!("cgroup\t{parent}\t{files}"));
    }
    // The capabilities `sandbox` drops as root (every one up to the last).
    if nix::unistd::geteuid().is_root() {
        let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap").unwrap();
        lines.push(format!("capdrop\t{}", last.trim()));
    }
    // The very filter the run loads: its policy, compiled as the native backend does.
    let policy: sandbox_policy::Policy =
        serde_json::from_value(shown["policy"].clone()).expect("the policy as shown");
    let mut plan = sandbox_policy::compile::seccomp::compile(&policy);
    plan.rules
        .extend(sandbox_policy::compile::seccomp::chown_rules(
            nix::unistd::geteuid().as_raw(),
        ));
    let programs = sandbox_host::backends::native::seccomp::compile(&plan).unwrap();
    for (i, program) in programs.iter().enumerate() {
        let file = work.join(format!("floor-{name}-{i}.bpf"));
        let mut bytes = Vec::new();
        for insn in program {
            bytes.extend(insn.code.to_ne_bytes());
            bytes.push(insn.jt);
            bytes.push(insn.jf);
            bytes.extend(insn.k.to_ne_bytes());
        }
        std::fs::write(&file, bytes).unwrap();
        lines.push(format!("bpf\t{}", file.display()));
    }
    lines.join("\n") + "\n"
}

/// bubblewrap building the same paths (0.8 has no overlays: a cache is its lower bound
/// read-only, the git store's overlay is left out; no cgroup, no Landlock, no filter).
fn bwrap_argv(bwrap: &Path, shown: &Value, dir: &Path, empty: &Path) -> Vec<String> {
    let mut args = vec![
        bwrap.to_string_lossy().into_owned(),
        "--unshare-user".into(),
        "--new-session".into(),
        "--die-with-parent".into(),
    ];
    let compiled = &shown["compiled"];
    let own_proc = compiled["own_proc"].as_str().is_some();
    if own_proc {
        args.push("--unshare-pid".into());
    }
    if shown["network"]["namespace"].as_bool() == Some(true) {
        args.push("--unshare-net".into());
    }
    for op in compiled["view"]["Ok"]["ops"].as_array().unwrap() {
        let target = s(&op["target"]);
        match op["op"].as_str().unwrap() {
            "tmpfs" => args.extend(["--tmpfs".into(), target]),
            "symlink" => args.extend(["--symlink".into(), target, s(&op["link"])]),
            "bind" if own_proc && target == "/proc" => {
                args.extend(["--proc".into(), "/proc".into()])
            }
            "bind" => {
                let flag = match (op["why"].as_str(), op["readonly"].as_bool()) {
                    (Some(why), _) if why.starts_with("device") => "--dev-bind",
                    (_, Some(true)) => "--ro-bind",
                    _ => "--bind",
                };
                args.extend([flag.into(), s(&op["source"]), target]);
            }
            "overlay" if !s(&op["upper"]).contains("<run>") => {
                let lower = s(&op["lower"][0]);
                args.extend(["--ro-bind".into(), lower, target]);
            }
            "pin" => args.extend(["--ro-bind".into(), target.clone(), target]),
            "empty" => args.extend(["--ro-bind".into(), empty.to_string_lossy().into(), target]),
            _ => {}
        }
    }
    args.extend([
        "--remount-ro".into(),
        "/".into(),
        "--chdir".into(),
        dir.to_string_lossy().into_owned(),
        "/bin/true".into(),
    ]);
    args
}

fn median(v: &[Duration]) -> f64 {
    let mut v: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn p90(v: &[Duration]) -> f64 {
    let mut v: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() - 1) as f64 * 0.9).round() as usize]
}

/// The median of the round-by-round ratios of `a` over `b` (paired: the same round's load).
fn paired(a: &[Duration], b: &[Duration]) -> f64 {
    let mut r: Vec<f64> = a
        .iter()
        .zip(b)
        .map(|(a, b)| a.as_secs_f64() / b.as_secs_f64())
        .collect();
    r.sort_by(f64::total_cmp);
    if r.is_empty() {
        return f64::NAN;
    }
    r[r.len() / 2]
}

fn write_config(dir: &Path, body: &str) -> PathBuf {
    std::fs::create_dir_all(dir.join("sandbox")).unwrap();
    std::fs::write(dir.join("sandbox/config.yaml"), body).unwrap();
    dir.to_path_buf()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // Beside the home (same filesystem as a real task's worktree), not in a tmpfs /tmp.
    let work = tempfile::Builder::new()
        .disable_cleanup(std::env::var_os("SANDBOX_BENCH_KEEP").is_some())
        .tempdir_in(std::env::var_os("SANDBOX_BENCH_DIR").unwrap_or("/tmp".into()))
        .unwrap();
    let work_dir = std::fs::canonicalize(work.path()).unwrap();
    let home = match std::env::var("SANDBOX_BENCH_HOME").as_deref() {
        Ok("lived-in") => {
            let h = work_dir.join("home");
            std::fs::create_dir_all(&h).unwrap();
            sandbox_testkit::home::lived_in(&h);
            h
        }
        _ => PathBuf::from(std::env::var_os("HOME").expect("HOME")),
    };
    let state = work_dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let env = user_env(&home, &state);
    let plain = work_dir.join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    let main_repo = work_dir.join("repo");
    let task = work_dir.join("task");
    sandbox_testkit::linked_worktree(&main_repo, &task);
    let empty = work_dir.join("empty");
    std::fs::write(&empty, "").unwrap();

    let no_home = write_config(&work_dir.join("config-no-home"), "home: off\n");
    let no_caches = write_config(&work_dir.join("config-no-caches"), "caches: false\n");
    let defaults = write_config(&work_dir.join("config-defaults"), "{}\n");
    let row = |name, dir: &Path, config: &Path, flags: &[&str]| Row {
        name,
        dir: dir.to_path_buf(),
        config: config.to_path_buf(),
        flags: flags.iter().map(|f| f.to_string()).collect(),
        setup: None,
        variants: Vec::new(),
    };
    // A worktree per row with a home: each has a private home of its own (per task), as a
    // task keeps one configuration (two rows alternating in one home would make each remove
    // the other's mount points).
    let worktree = |name: &str| {
        let dir = work_dir.join(name);
        sandbox_testkit::git(
            &main_repo,
            &["worktree", "add", "-q", "-b", name, dir.to_str().unwrap()],
        );
        dir
    };
    let (home_task, caches_task, filled_task, net_task, memory_task) = (
        worktree("task-home"),
        worktree("task-caches"),
        worktree("task-filled"),
        worktree("task-net"),
        worktree("task-memory"),
    );
    let mut rows = vec![
        row("plain dir, no home", &plain, &no_home, &[]),
        row("worktree + quarantine, no home", &task, &no_home, &[]),
        row("… + home (toolchains)", &home_task, &no_caches, &[]),
        row("… + caches (the default run)", &caches_task, &defaults, &[]),
        Row {
            setup: Some(FILLED_LAYER),
            ..row(
                "… + caches, 30,000 files in a layer",
                &filled_task,
                &defaults,
                &[],
            )
        },
        row("… + --block-net", &net_task, &defaults, &["--block-net"]),
        row(
            "… + --memory 1G",
            &memory_task,
            &defaults,
            &["--memory", "1G"],
        ),
    ];
    if let Ok(keep) = std::env::var("SANDBOX_BENCH_ROWS") {
        let words: Vec<&str> = keep.split(',').collect();
        rows.retain(|r| words.iter().any(|w| r.name.contains(w)));
    }

    let sandbox = env!("CARGO_BIN_EXE_sandbox").to_string();
    let compare = std::env::var("SANDBOX_BENCH_COMPARE").ok();
    let floor = work_dir.join("floor_run");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/floor_run.c");
    let built = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&floor)
        .arg(&source)
        .status()
        .expect("cc");
    assert!(built.success(), "building the floor");
    let bwrap = which("bwrap");
    for (i, row) in rows.iter_mut().enumerate() {
        let run = |exe: &str| {
            let mut argv = vec![exe.to_string(), "run".into()];
            argv.extend(row.flags.iter().cloned());
            argv.extend(["--".into(), "/bin/true".into()]);
            argv
        };
        let mut variants = vec![("sandbox", run(&sandbox))];
        if let Some(other) = &compare {
            variants.push(("compared build", run(other)));
        }
        // One run first: the private home and the layers exist, as for every later command.
        let row_env: Vec<(String, String)> = env
            .iter()
            .cloned()
            .chain([(
                "XDG_CONFIG_HOME".into(),
                row.config.to_string_lossy().into(),
            )])
            .collect();
        run_once(&variants[0].1, &row.dir, &row_env);
        if let Some(script) = row.setup {
            let setup = [
                sandbox.clone(),
                "run".into(),
                "--".into(),
                "sh".into(),
                "-c".into(),
            ]
            .into_iter()
            .chain([script.to_string()])
            .collect::<Vec<_>>();
            run_once(&setup, &row.dir, &row_env);
        }
        let shown = shown(&sandbox, row, &env);
        let plan = work_dir.join(format!("floor-{i}.plan"));
        std::fs::write(&plan, floor_plan(&shown, &work_dir, &i.to_string())).unwrap();
        variants.push((
            "C floor",
            vec![
                floor.to_string_lossy().into_owned(),
                plan.to_string_lossy().into_owned(),
                "/bin/true".into(),
            ],
        ));
        if let Some(bwrap) = &bwrap {
            variants.push((
                "bwrap, equal view",
                bwrap_argv(bwrap, &shown, &row.dir, &empty),
            ));
        }
        row.variants = variants
            .into_iter()
            .map(|(name, argv)| Variant {
                name,
                argv,
                spaced: Vec::new(),
                back_to_back: Vec::new(),
            })
            .collect();
    }
    if bwrap.is_none() {
        println!("skipped: bwrap: not installed (apt-get install bubblewrap)");
    }
    let rounds: usize = std::env::var("SANDBOX_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20);
    let loadavg = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load before: {}", loadavg().trim());
    // Warm-up: page cache, the layers' first mounts.
    for row in &rows {
        let row_env: Vec<(String, String)> = env
            .iter()
            .cloned()
            .chain([(
                "XDG_CONFIG_HOME".into(),
                row.config.to_string_lossy().into(),
            )])
            .collect();
        for v in &row.variants {
            for _ in 0..3 {
                run_once(&v.argv, &row.dir, &row_env);
            }
        }
    }
    for spaced in [true, false] {
        for round in 0..rounds {
            for row in rows.iter_mut() {
                let row_env: Vec<(String, String)> = env
                    .iter()
                    .cloned()
                    .chain([(
                        "XDG_CONFIG_HOME".into(),
                        row.config.to_string_lossy().into(),
                    )])
                    .collect();
                let n = row.variants.len();
                // ABAB…, then BABA…: who goes first alternates.
                for k in 0..n {
                    let v = &mut row.variants[if round % 2 == 0 { k } else { n - 1 - k }];
                    if spaced {
                        std::thread::sleep(SPACING);
                    }
                    let d = run_once(&v.argv, &row.dir, &row_env);
                    if spaced {
                        v.spaced.push(d);
                    } else {
                        v.back_to_back.push(d);
                    }
                }
            }
        }
        println!(
            "load after the {} series: {}",
            if spaced { "spaced" } else { "back-to-back" },
            loadavg().trim()
        );
    }
    for (title, pick) in [
        (
            "spaced 150 ms apart",
            (|v: &Variant| &v.spaced) as fn(&Variant) -> &Vec<Duration>,
        ),
        ("back to back", |v: &Variant| &v.back_to_back),
    ] {
        println!("\n{title}: {rounds} rounds, median / p90 ms, ratios paired round by round");
        println!(
            "{:<34} {:>15} {:>15} {:>15} {:>9} {:>9} {:>9}",
            "row", "sandbox", "C floor", "bwrap", "x floor", "x bwrap", "x before"
        );
        for row in &rows {
            let get = |name: &str| row.variants.iter().find(|v| v.name == name).map(pick);
            let sb = get("sandbox").unwrap();
            let cell = |v: Option<&Vec<Duration>>| {
                v.map(|v| format!("{:.1} / {:.1}", median(v), p90(v)))
                    .unwrap_or_else(|| "-".into())
            };
            let ratio = |v: Option<&Vec<Duration>>| {
                v.map(|v| format!("{:.2}x", paired(sb, v)))
                    .unwrap_or_else(|| "-".into())
            };
            println!(
                "{:<34} {:>15} {:>15} {:>15} {:>9} {:>9} {:>9}",
                row.name,
                cell(Some(sb)),
                cell(get("C floor")),
                cell(get("bwrap, equal view")),
                ratio(get("C floor")),
                ratio(get("bwrap, equal view")),
                ratio(get("compared build")),
            );
            if let Some(before) = get("compared build") {
                println!(
                    "{:<34} {:>15} {:>15} {:>15} {:>9} {:>9}",
                    "  compared build",
                    cell(Some(before)),
                    "",
                    "",
                    format!("{:.2}x", paired(before, get("C floor").unwrap())),
                    get("bwrap, equal view")
                        .map(|b| format!("{:.2}x", paired(before, b)))
                        .unwrap_or_else(|| "-".into()),
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(
        Path::new("/dev/shm").join(format!("sandbox-bench-floor-{}", std::process::id())),
    );
}
