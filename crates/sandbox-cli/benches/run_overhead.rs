//! What does a boundary cost per command? `/bin/true` run directly, through `sandbox run` on
//! each backend (host, native, nono, custom with `/usr/bin/env` as an exec-through launcher),
//! through `bwrap` with an equivalent policy, and through the `nono` CLI — all in one run,
//! interleaved round by round so machine noise hits every variant alike.
//!
//!     cargo bench -p sandbox-cli --bench run_overhead
//!
//! Prints median / p90 per invocation, the ratio to the direct run and the time added.
//! `SANDBOX_BENCH_COMPARE=/path/to/sandbox` adds another build's run variants (before/after).
//! A variant whose tool is missing is reported as "skipped: <reason>".

// A panic is how a test or a benchmark reports failure; the workspace lints against
// unwrap/expect apply to shipped code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROUNDS: usize = 20;
const PER_ROUND: usize = 10;

struct Variant {
    name: String,
    argv: Vec<String>,
    samples: Vec<Duration>,
    /// The variant whose median this one's "added" time is measured against (0: direct).
    base: usize,
    /// Extra environment (the hook endpoint and token of `sandbox hook`).
    env: Vec<(String, String)>,
    /// The minimal supervisor this one is compared with (`None`: the plain one). A variant
    /// run inside a wrapper is compared with the supervisor in the same wrapper.
    floor: Option<usize>,
}

impl Variant {
    /// A variant measured against the direct run, in the benchmark's environment.
    fn new(name: String, argv: Vec<String>) -> Self {
        Variant {
            name,
            argv,
            samples: Vec::new(),
            base: 0,
            env: Vec::new(),
            floor: None,
        }
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The private view of a `sandbox run` in `task`, as bwrap arguments (`None` without a view).
fn view_as_bwrap(sandbox: &str, task: &Path, home: &Path, runtime: &Path) -> Option<Vec<String>> {
    let out = Command::new(sandbox)
        .args(["policy", "show", "--json"])
        .current_dir(task)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_STATE_HOME", home.join(".state"))
        .env("XDG_RUNTIME_DIR", runtime)
        .output()
        .ok()?;
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let ops = shown["compiled"]["view"]["Ok"]["ops"].as_array()?;
    let mut args = Vec::new();
    for op in ops {
        let s = |k: &str| op[k].as_str().unwrap_or_default().to_string();
        match op["op"].as_str()? {
            "tmpfs" => args.extend(["--tmpfs".into(), s("target")]),
            "symlink" => args.extend(["--symlink".into(), s("target"), s("link")]),
            "bind" => {
                let flag = match (op["why"].as_str(), op["readonly"].as_bool()) {
                    (Some(why), _) if why.starts_with("device") => "--dev-bind",
                    (_, Some(true)) => "--ro-bind",
                    _ => "--bind",
                };
                args.extend([flag.into(), s("source"), s("target")]);
            }
            // The git store quarantine has no bwrap form: compared without it.
            "overlay" | "pin" => {}
            // bwrap has a private devpts only as part of `--dev` (a whole new /dev).
            "devpts" => {}
            _ => return None,
        }
    }
    Some(args)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    // A variant whose every run failed has no samples (its failures are listed).
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let main_repo = dir.path().join("repo");
    let task = dir.path().join("task");
    sandbox_testkit::linked_worktree(&main_repo, &task);
    let task = std::fs::canonicalize(task).unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    // The custom backend's launcher: `/usr/bin/env -- /bin/true` execs straight through.
    std::fs::create_dir_all(home.join(".config/sandbox")).unwrap();
    std::fs::write(
        home.join(".config/sandbox/config.yaml"),
        "backends:\n  custom:\n    command: /usr/bin/env\n",
    )
    .unwrap();
    let runtime = dir.path().join("run");
    // nono leaves a state file in TMPDIR per run; keep them inside the benchmark's directory.
    let tmp = dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();

    let sandbox = env!("CARGO_BIN_EXE_sandbox").to_string();
    let t = task.to_str().unwrap().to_string();
    let mut variants = vec![
        Variant::new("direct /bin/true".into(), vec!["/bin/true".into()]),
        // The process start of the binary alone: the first step of the accounting.
        Variant::new(
            "sandbox --version".into(),
            vec![sandbox.clone(), "--version".into()],
        ),
        Variant::new(
            "sandbox run (host)".into(),
            vec![
                sandbox.clone(),
                "run".into(),
                "--backend".into(),
                "host".into(),
                "--".into(),
                "/bin/true".into(),
            ],
        ),
        Variant::new(
            "sandbox run (native)".into(),
            vec![
                sandbox.clone(),
                "run".into(),
                "--".into(),
                "/bin/true".into(),
            ],
        ),
        // The same without the git store quarantine (its overlay, pins and sync): what the
        // quarantine costs per run, in the same run.
        Variant::new(
            "sandbox run (native, no quarantine)".into(),
            vec![
                sandbox.clone(),
                "run".into(),
                "--unprotected-git".into(),
                "--".into(),
                "/bin/true".into(),
            ],
        ),
    ];
    // The resource limits: a run with no cgroup at all (`--pids off` turns the default
    // process limit off) as the base of one with all three limits (three v1 groups, or one
    // v2 group): the difference is what creating, joining and removing the groups costs.
    let no_limits = variants.len();
    variants.push(Variant::new(
        "sandbox run (native, no limits)".into(),
        vec![
            sandbox.clone(),
            "run".into(),
            "--pids".into(),
            "off".into(),
            "--".into(),
            "/bin/true".into(),
        ],
    ));
    let limits_enforced = sandbox_host::limits::describe_machine(&sandbox_host::limits::probe())
        .iter()
        .all(|l| !l.contains("cannot be enforced"));
    if limits_enforced {
        variants.push(Variant {
            base: no_limits,
            ..Variant::new(
                "sandbox run (native, memory+pids+cpus)".into(),
                vec![
                    sandbox.clone(),
                    "run".into(),
                    "--memory".into(),
                    "1G".into(),
                    "--pids".into(),
                    "512".into(),
                    "--cpus".into(),
                    "1".into(),
                    "--".into(),
                    "/bin/true".into(),
                ],
            )
        });
    }
    // The network namespace per run (`--block-net`: lo up, the hook port's listener handed
    // over) and with the domain proxy's relay (a listener more, the relay thread), each
    // measured against the same run without them.
    let no_quarantine = variants
        .iter()
        .position(|v| v.name == "sandbox run (native, no quarantine)");
    for (name, flags) in [
        (
            "sandbox run (native, no quarantine, --block-net)",
            &["--block-net"][..],
        ),
        (
            "sandbox run (native, no quarantine, --allow-domain)",
            &["--allow-domain", "example.com"][..],
        ),
    ] {
        let mut argv = vec![sandbox.clone(), "run".into(), "--unprotected-git".into()];
        argv.extend(flags.iter().map(|f| f.to_string()));
        argv.extend(["--".into(), "/bin/true".into()]);
        variants.push(Variant {
            base: no_quarantine.unwrap_or(0),
            ..Variant::new(name.into(), argv)
        });
    }
    // `sandbox exec` with the in-place backend: the stdio proxy's own cost per invocation.
    variants.push(Variant::new(
        "sandbox exec (native)".into(),
        vec![
            sandbox.clone(),
            "exec".into(),
            "--".into(),
            "/bin/true".into(),
        ],
    ));
    // Another build of the CLI, for a before/after comparison in the same interleaved run:
    // SANDBOX_BENCH_COMPARE=/path/to/an/older/sandbox.
    if let Some(other) = std::env::var_os("SANDBOX_BENCH_COMPARE") {
        let other = other.to_string_lossy().into_owned();
        for (name, args) in [
            ("host", &["run", "--backend", "host"][..]),
            ("native", &["run"][..]),
            ("native, no quarantine", &["run", "--unprotected-git"][..]),
        ] {
            let mut argv = vec![other.clone()];
            argv.extend(args.iter().map(|a| a.to_string()));
            argv.extend(["--".into(), "/bin/true".into()]);
            variants.push(Variant::new(format!("compared build: {name}"), argv));
        }
    }
    let mut skipped = Vec::new();
    // The floor: a minimal supervisor in C (fork, setsid, a two-rule Landlock ruleset, a
    // one-rule seccomp filter, exec, wait), built here with the system's C compiler.
    let floor = dir.path().join("min_supervisor");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/min_supervisor.c");
    let built = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&floor)
        .arg(&source)
        .status();
    let floor_index = match built {
        Ok(status) if status.success() => {
            variants.push(Variant::new(
                "minimal C supervisor".into(),
                vec![
                    floor.to_string_lossy().into_owned(),
                    "/usr".into(),
                    t.clone(),
                    "/bin/true".into(),
                ],
            ));
            Some(variants.len() - 1)
        }
        other => {
            skipped.push(format!("minimal C supervisor: cc failed ({other:?})"));
            None
        }
    };
    match which("bwrap") {
        Some(bwrap) => {
            // The same shape of policy: system directories read-only, the worktree and its git
            // data writable, a private /tmp, a new session, die with the parent.
            let mut argv = vec![
                bwrap.to_string_lossy().into_owned(),
                "--tmpfs".into(),
                "/tmp".into(),
            ];
            for sys in ["/usr", "/etc", "/bin", "/lib", "/lib64", "/sbin"] {
                if Path::new(sys).exists() {
                    argv.extend(["--ro-bind".into(), sys.into(), sys.into()]);
                }
            }
            let common = main_repo.join(".git");
            argv.extend([
                "--ro-bind".into(),
                common.to_string_lossy().into_owned(),
                common.to_string_lossy().into_owned(),
                "--bind".into(),
                t.clone(),
                t.clone(),
                "--dev".into(),
                "/dev".into(),
                "--proc".into(),
                "/proc".into(),
                "--new-session".into(),
                "--die-with-parent".into(),
                "--chdir".into(),
                t.clone(),
                "/bin/true".into(),
            ]);
            variants.push(Variant::new("bwrap (equivalent)".into(), argv));
        }
        None => skipped.push("bwrap: not installed (apt-get install bubblewrap)".to_string()),
    }
    // bwrap building exactly the private view `sandbox run` builds (the mounts of `sandbox
    // policy show --json`), in a user namespace, with a read-only root: the same kernel work
    // for the filesystem, without Landlock and seccomp.
    if let Some(bwrap) = which("bwrap") {
        match view_as_bwrap(&sandbox, &task, &home, &runtime) {
            Some(args) => {
                let mut argv = vec![
                    bwrap.to_string_lossy().into_owned(),
                    "--unshare-user".into(),
                ];
                argv.extend(args);
                argv.extend([
                    "--remount-ro".into(),
                    "/".into(),
                    "--new-session".into(),
                    "--die-with-parent".into(),
                    "--chdir".into(),
                    t.clone(),
                    "/bin/true".into(),
                ]);
                variants.push(Variant::new(
                    "bwrap (the view's mounts, no git overlay)".into(),
                    argv,
                ));
            }
            None => skipped.push("bwrap (the view's mounts): no private view here".into()),
        }
    }
    let nono = which("nono");
    match &nono {
        Some(nono) => {
            variants.push(Variant::new(
                "sandbox run (nono)".into(),
                vec![
                    sandbox.clone(),
                    "run".into(),
                    "--backend".into(),
                    "nono".into(),
                    "--".into(),
                    "/bin/true".into(),
                ],
            ));
            variants.push(Variant::new(
                "nono wrap".into(),
                vec![
                    nono.to_string_lossy().into_owned(),
                    "wrap".into(),
                    "-s".into(),
                    "--allow".into(),
                    t.clone(),
                    "--".into(),
                    "/bin/true".into(),
                ],
            ));
        }
        None => skipped
            .push("nono: not installed (cargo install nono-cli --no-default-features)".to_string()),
    }
    variants.push(Variant::new(
        "sandbox run (custom)".into(),
        vec![
            sandbox.clone(),
            "run".into(),
            "--backend".into(),
            "custom".into(),
            "--".into(),
            "/bin/true".into(),
        ],
    ));
    // The native backend without its private view, as on a host without user namespaces:
    // run inside one long-lived user namespace that may create none (entered with nsenter, so
    // that its probe result is cached as on a real host), against the same wrapper around
    // `/bin/true` as its own baseline (the wrapper's cost is not the sandbox's).
    let mut holder = Command::new("unshare")
        .args(["--user", "--map-root-user", "sh", "-c"])
        .arg("echo 0 > /proc/sys/user/max_user_namespaces && echo ready && exec sleep infinity")
        .stdout(Stdio::piped())
        .spawn()
        .expect("unshare (util-linux)");
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().unwrap()),
        &mut ready,
    )
    .unwrap();
    assert_eq!(
        ready.trim(),
        "ready",
        "the namespace without user namespaces"
    );
    let target = holder.id().to_string();
    let nouserns = ["nsenter", "--target", target.as_str(), "--user", "--"];
    let wrapped = |rest: &[&str]| -> Vec<String> {
        nouserns.iter().chain(rest).map(|s| s.to_string()).collect()
    };
    let wrapper_base = variants.len();
    variants.push(Variant::new(
        "no-userns namespace (nsenter) + /bin/true".into(),
        wrapped(&["/bin/true"]),
    ));
    // The supervisor in the same wrapper: the floor of the variant below (Landlock only).
    let wrapped_floor = floor_index.map(|i| {
        let argv: Vec<&str> = variants[i].argv.iter().map(String::as_str).collect();
        variants.push(Variant {
            base: wrapper_base,
            ..Variant::new(
                "minimal C supervisor (no-userns namespace)".into(),
                wrapped(&argv),
            )
        });
        variants.len() - 1
    });
    variants.push(Variant {
        base: wrapper_base,
        floor: wrapped_floor,
        ..Variant::new(
            "sandbox run (native, no view)".into(),
            wrapped(&[&sandbox, "run", "--", "/bin/true"]),
        )
    });
    // A short-lived client: `sandbox hook` posting a status to a running daemon, with a
    // task token the benchmark holds a lease on (as `sandbox run` does for its command).
    let daemon = Command::new(&sandbox)
        .arg("serve")
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_STATE_HOME", home.join(".state"))
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn();
    let mut lease = None;
    match daemon {
        Ok(mut child) => {
            // Ready once it says so (after both listeners are bound).
            let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
            let mut line = String::new();
            while std::io::BufRead::read_line(&mut err, &mut line).unwrap_or(0) > 0
                && !line.contains("listening on")
            {
                line.clear();
            }
            // Keep draining its log, so it never blocks on a full pipe.
            std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
            let paths = sandbox_service::RuntimePaths::new(runtime.join("sandbox"));
            match sandbox_service::Client::connect_authenticated(&paths, "bench") {
                Ok(mut client) => {
                    let issued = client.call(&sandbox_protocol::Request::TokenIssue(
                        sandbox_protocol::TokenIssueParams {
                            task: "bench".into(),
                        },
                    ));
                    if let Ok(reply) = issued {
                        variants.push(Variant {
                            env: vec![
                                (
                                    "SANDBOX_API_URL".into(),
                                    reply["url"].as_str().unwrap_or_default().into(),
                                ),
                                (
                                    "SANDBOX_API_TOKEN".into(),
                                    reply["token"].as_str().unwrap_or_default().into(),
                                ),
                            ],
                            ..Variant::new(
                                "sandbox hook idle".into(),
                                vec![sandbox.clone(), "hook".into(), "idle".into()],
                            )
                        });
                    }
                    lease = Some((child, client));
                }
                Err(e) => skipped.push(format!("sandbox hook: no daemon client: {e}")),
            }
        }
        Err(e) => skipped.push(format!("sandbox hook: cannot start the daemon: {e}")),
    }

    let run_once = |argv: &[String], env: &[(String, String)]| -> Option<Duration> {
        let start = Instant::now();
        let out = Command::new(&argv[0])
            .args(&argv[1..])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(&task)
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("XDG_STATE_HOME", home.join(".state"))
            .env("XDG_RUNTIME_DIR", &runtime)
            .env("TMPDIR", &tmp)
            .envs(nono.as_ref().map(|n| ("SANDBOX_NONO", n)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Kept: a failing run says why (an intermittent 125 of `sandbox run` was once
            // seen here with its stderr thrown away).
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let elapsed = start.elapsed();
        if out.status.success() {
            Some(elapsed)
        } else {
            // Printed at once and counted; the bench goes on, so an intermittent failure is
            // explained and its rate measured instead of ending the run.
            eprintln!(
                "FAILED RUN: {argv:?}: {}\nstderr:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            None
        }
    };
    let mut failures: Vec<String> = Vec::new();
    // Warm-up: page cache, dynamic linker caches.
    for v in &variants {
        for _ in 0..5 {
            if run_once(&v.argv, &v.env).is_none() {
                failures.push(v.name.clone());
            }
        }
    }
    for _ in 0..ROUNDS {
        for v in variants.iter_mut() {
            for _ in 0..PER_ROUND {
                match run_once(&v.argv, &v.env) {
                    Some(d) => v.samples.push(d),
                    None => failures.push(v.name.clone()),
                }
            }
        }
    }
    for name in &failures {
        println!("FAILED RUN (stderr above): {name}");
    }
    let mut medians = Vec::new();
    for v in variants.iter_mut() {
        v.samples.sort();
        medians.push(percentile(&v.samples, 0.5));
    }
    let base = medians[0];
    println!(
        "run overhead: {} invocations per variant ({ROUNDS} interleaved rounds of {PER_ROUND})",
        ROUNDS * PER_ROUND
    );
    // Each variant's whole time as a multiple of its C supervisor's (the issue's measure),
    // and its added time as a multiple of that supervisor's added time.
    println!(
        "{:<40} {:>10} {:>10} {:>9} {:>12} {:>9} {:>10}  over",
        "variant", "median", "p90", "ratio", "added", "x floor", "x added"
    );
    for (v, median) in variants.iter().zip(&medians) {
        let over = medians[v.base];
        let added = median.as_secs_f64() - over.as_secs_f64();
        let (x_floor, x_added) = match v.floor.or(floor_index) {
            Some(i) => {
                let f = medians[i].as_secs_f64();
                let f_added = f - medians[variants[i].base].as_secs_f64();
                (
                    format!("{:.2}x", median.as_secs_f64() / f),
                    format!("{:.2}x", added / f_added.max(f64::EPSILON)),
                )
            }
            None => ("-".into(), "-".into()),
        };
        println!(
            "{:<40} {:>8.3}ms {:>8.3}ms {:>8.2}x {:>10.3}ms {:>9} {:>10}  {}",
            v.name,
            median.as_secs_f64() * 1e3,
            percentile(&v.samples, 0.9).as_secs_f64() * 1e3,
            median.as_secs_f64() / base.as_secs_f64(),
            added * 1e3,
            x_floor,
            x_added,
            variants[v.base].name
        );
    }
    // Creating and removing one command's groups, in process (what `Run::arm` and
    // `Live::finish` add): memory, pids and cpu, each a v1 group here or one v2 group.
    if limits_enforced {
        use sandbox_policy::{Limit, LimitSource, Limits};
        let limit = |value| {
            Some(Limit {
                value,
                source: LimitSource::Flag,
            })
        };
        let limits = Limits {
            memory: limit(1 << 30),
            pids: limit(512),
            cpu_millis: limit(1000),
            ..Limits::default()
        };
        let machine = sandbox_host::limits::probe();
        let plan = sandbox_policy::compile::limits::plan(&limits, &machine);
        let journal = dir.path().join("journal");
        let mut samples: Vec<Duration> = (0..ROUNDS * PER_ROUND * 4)
            .map(|_| {
                let start = Instant::now();
                let groups = sandbox_host::limits::Groups::create(&plan, &machine, Some(&journal))
                    .unwrap()
                    .unwrap();
                drop(groups);
                start.elapsed()
            })
            .collect();
        samples.sort();
        println!(
            "cgroups: create + remove ({} groups, journal record included): median {:.3}ms, \
             p90 {:.3}ms ({} samples)",
            plan.groups(&machine).len(),
            percentile(&samples, 0.5).as_secs_f64() * 1e3,
            percentile(&samples, 0.9).as_secs_f64() * 1e3,
            samples.len()
        );
    } else {
        skipped.push("resource limits: this machine enforces none for this user".into());
    }
    for s in skipped {
        println!("skipped: {s}");
    }
    let _ = holder.kill();
    let _ = holder.wait();
    if let Some((mut daemon, client)) = lease {
        drop(client);
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(daemon.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = daemon.wait();
    }
}
